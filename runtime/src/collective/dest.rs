//! Caller-owned outputs: a [`Destination`] holds the [`Buffer`]s a call writes its result
//! into, and [`Plan::writing_into`] checks them against the call before anything is sent.
//!
//! The destination is shared by the caller's handle and the engine: the engine writes the
//! call's chunks into it as they become final and hands the buffers back in
//! [`Output::Buffers`](super::Output::Buffers); when the call fails, the caller's handle
//! takes them back from the destination ([`Destination::take`]). A lock guards the slot, so
//! whichever side holds it, nothing else can touch the buffers.
//!
//! Where each part of the output goes is a list of [`Run`]s: by default output tensor i goes
//! whole into buffer i; a coalesced call (`collective::coalesce`) maps its one flat output
//! onto many buffers, in any order, with runs of its own.

use super::{Assembly, Body, Output, Plan, Share};
use crate::error::{Error, Result};
use crate::tensor::buffer::Buffer;
use crate::tensor::numel_of;
use std::fmt;
// Plain std locks: like the payload pools, caller buffers stay outside the loom model.
use crate::sync::unmodelled::{Mutex, MutexGuard};
use std::sync::Arc;

/// Where a span of a call's output goes: `len` elements from element `at` of the output (its
/// tensors one after another, for a call that returns a list) into buffer `buffer`, from its
/// element `offset`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run {
    /// The first element, in the output.
    pub at: usize,
    /// Elements.
    pub len: usize,
    /// Which buffer of the destination.
    pub buffer: usize,
    /// The first element, in that buffer.
    pub offset: usize,
}

/// The buffers a call writes its result into (see the module doc). Cheap to clone: clones
/// share the slot.
#[derive(Clone)]
pub struct Destination {
    slot: Arc<Mutex<Option<Vec<Buffer>>>>,
    /// Where the output goes; `None` until a plan resolves the default (tensor i into buffer
    /// i), or as given ([`with_runs`](Self::with_runs)).
    runs: Option<Arc<[Run]>>,
}

impl Destination {
    /// A destination holding `buffers`, in the order of the call's outputs.
    pub fn new(buffers: Vec<Buffer>) -> Destination {
        Destination {
            slot: Arc::new(Mutex::new(Some(buffers))),
            runs: None,
        }
    }

    /// A destination holding `buffers` that the call's output is spread over by `runs`
    /// (checked when a plan is made: they must cover the output once, and every buffer once).
    pub fn with_runs(buffers: Vec<Buffer>, runs: Vec<Run>) -> Destination {
        Destination {
            slot: Arc::new(Mutex::new(Some(buffers))),
            runs: Some(runs.into()),
        }
    }

    /// Where the output goes (the runs the plan checked).
    pub(crate) fn runs(&self) -> &[Run] {
        self.runs.as_deref().unwrap_or(&[])
    }

    /// The buffers, if they are still here (a call hands them back in its output when it
    /// succeeds; after a failure they stay here).
    pub fn take(&self) -> Option<Vec<Buffer>> {
        self.lock().take()
    }

    /// `f` applied to the buffers, if they are still here.
    pub fn with<R>(&self, f: impl FnOnce(&mut [Buffer]) -> R) -> Option<R> {
        self.lock().as_deref_mut().map(f)
    }

    /// Checks that a call whose outputs are tensors of `want` elements of `dtype` (one, or
    /// none for a barrier) can write them into these buffers (as [`Plan::writing_into`]
    /// checks a plan's outputs): the runs it will write, for [`write_one`](Self::write_one).
    pub fn check_outputs(&self, want: &[usize], dtype: crate::DType) -> Result<Arc<[Run]>> {
        let held = self.lock();
        let bufs = held
            .as_deref()
            .ok_or_else(|| Error::internal("a destination without its buffers"))?;
        for (i, b) in bufs.iter().enumerate() {
            if b.dtype() != dtype {
                return Err(Error::invalid(format!(
                    "output buffer {i} holds {}; this call's dtype is {dtype}",
                    b.dtype()
                )));
            }
        }
        match &self.runs {
            Some(runs) => {
                check_runs(runs, want.iter().sum(), bufs)?;
                Ok(runs.clone())
            }
            None => default_runs(want, bufs, dtype),
        }
    }

    /// Writes `t`, a call's one output, into the buffers along `runs` (from
    /// [`check_outputs`](Self::check_outputs)) and hands them back as the call's output.
    pub fn write_one(&self, runs: &[Run], t: &crate::Tensor) -> Result<Output> {
        let mut held = self.lock();
        let bufs = held
            .as_deref_mut()
            .ok_or_else(|| Error::internal("a destination without its buffers"))?;
        let es = t.dtype().size();
        let src = t.bytes();
        for r in runs {
            let from = src
                .get(r.at * es..(r.at + r.len) * es)
                .ok_or_else(|| Error::internal("a run beyond the output"))?;
            let b = bufs
                .get_mut(r.buffer)
                .ok_or_else(|| Error::internal("a run into no buffer"))?;
            let to = b.byte_range(r.offset..r.offset + r.len)?;
            b.bytes_mut()[to].copy_from_slice(from);
        }
        Ok(Output::Buffers(held.take().unwrap_or_default()))
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Option<Vec<Buffer>>> {
        self.slot.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl fmt::Debug for Destination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.slot.try_lock().as_deref() {
            Ok(Some(b)) => write!(f, "Destination({b:?})"),
            Ok(None) => f.write_str("Destination(taken)"),
            Err(_) => f.write_str("Destination(in use)"),
        }
    }
}

impl Plan {
    /// Buffers for this call's outputs on this rank, as [`writing_into`](Self::writing_into)
    /// wants them: zeros of each output's shape and dtype, or a copy of the input where the
    /// output is the input (a reduce's non-root, a broadcast's root).
    pub fn output_buffers(&self) -> Result<Vec<Buffer>> {
        let dtype = self.fp.dtype;
        let Body::Collective { assembly, .. } = &self.body else {
            return Err(Error::invalid("only collectives write into caller buffers"));
        };
        match assembly {
            Assembly::Whole(shape) | Assembly::Concat(_, shape) => {
                Ok(vec![Buffer::zeros(shape, dtype)?])
            }
            Assembly::Blocks(_, shapes) => shapes.iter().map(|s| Buffer::zeros(s, dtype)).collect(),
            Assembly::Return(t) => Ok(vec![Buffer::from_tensor(t)?]),
            Assembly::Nothing => Ok(Vec::new()),
        }
    }

    /// The same call, writing its result into `dest`'s buffers instead of new tensors: one
    /// buffer per output tensor the call would return (none where it returns nothing, as a
    /// gather's non-root), each of the output's dtype and number of elements (its shape is
    /// the buffer's own). Anything else is an [`Error::InvalidArgument`], before anything is
    /// sent. Outputs are never shared with the other ranks of the process (no arena).
    ///
    /// A call whose output is its input (a reduce's non-root, a broadcast's root) leaves its
    /// buffer as it is: in the in-place forms the input was read from it.
    pub fn writing_into(mut self, dest: &Destination) -> Result<Plan> {
        let dtype = self.fp.dtype;
        let Body::Collective {
            assembly,
            share,
            dest: slot,
            ..
        } = &mut self.body
        else {
            return Err(Error::invalid(
                "only collectives write into caller buffers (receive with recv_into)",
            ));
        };
        let want: Vec<usize> = match assembly {
            Assembly::Whole(shape) | Assembly::Concat(_, shape) => vec![numel_of(shape)?],
            Assembly::Blocks(_, shapes) => {
                shapes.iter().map(|s| numel_of(s)).collect::<Result<_>>()?
            }
            Assembly::Return(t) => vec![t.numel()],
            Assembly::Nothing => Vec::new(),
        };
        let runs = dest.check_outputs(&want, dtype)?;
        *share = Share::Nothing;
        *slot = Some(Destination {
            slot: dest.slot.clone(),
            runs: Some(runs),
        });
        Ok(self)
    }
}

/// Output tensor i (of `want[i]` elements) whole into buffer i.
fn default_runs(want: &[usize], bufs: &[Buffer], dtype: crate::DType) -> Result<Arc<[Run]>> {
    if bufs.len() != want.len() {
        return Err(Error::invalid(format!(
            "this call writes {} output{} on this rank; {} buffer{} given",
            want.len(),
            if want.len() == 1 { "" } else { "s" },
            bufs.len(),
            if bufs.len() == 1 { " was" } else { "s were" },
        )));
    }
    let mut at = 0;
    let mut runs = Vec::with_capacity(want.len());
    for (i, (b, &n)) in bufs.iter().zip(want).enumerate() {
        if b.numel() != n {
            return Err(Error::invalid(format!(
                "output buffer {i} holds {} {dtype} elements; this call writes {n} there",
                b.numel()
            )));
        }
        runs.push(Run {
            at,
            len: n,
            buffer: i,
            offset: 0,
        });
        at += n;
    }
    Ok(runs.into())
}

/// Checks that `runs` cover an output of `total` elements once, in order, and every element
/// of every buffer once.
fn check_runs(runs: &[Run], total: usize, bufs: &[Buffer]) -> Result<()> {
    let bad = |why: String| Err(Error::invalid(format!("the destination's runs {why}")));
    let mut at = 0usize;
    let mut per_buffer: Vec<Vec<(usize, usize)>> = vec![Vec::new(); bufs.len()];
    for (k, r) in runs.iter().enumerate() {
        if r.at != at {
            return bad(format!(
                "leave a gap or overlap at element {at} of the output (run {k})"
            ));
        }
        let Some(b) = bufs.get(r.buffer) else {
            return bad(format!(
                "name buffer {} of {} (run {k})",
                r.buffer,
                bufs.len()
            ));
        };
        match r.offset.checked_add(r.len) {
            Some(end) if end <= b.numel() => per_buffer[r.buffer].push((r.offset, end)),
            _ => return bad(format!("go past the end of buffer {} (run {k})", r.buffer)),
        }
        at = at.saturating_add(r.len);
    }
    if at != total {
        return bad(format!("cover {at} elements; this call writes {total}"));
    }
    for (i, mut spans) in per_buffer.into_iter().enumerate() {
        spans.sort_unstable();
        let mut end = 0;
        for (s, e) in spans {
            if s != end {
                return bad(format!(
                    "cover buffer {i} with a gap or twice at element {end}"
                ));
            }
            end = e;
        }
        if end != bufs[i].numel() {
            return bad(format!(
                "cover {end} of buffer {i}'s {} elements",
                bufs[i].numel()
            ));
        }
    }
    Ok(())
}
