//! Caller-owned outputs: a [`Destination`] holds the [`Buffer`]s a call writes its result
//! into, and [`Plan::writing_into`] checks them against the call before anything is sent.
//!
//! The destination is shared by the caller's handle and the engine: the engine writes the
//! call's chunks into it as they become final and hands the buffers back in
//! [`Output::Buffers`](super::Output::Buffers); when the call fails, the caller's handle
//! takes them back from the destination ([`Destination::take`]). A lock guards the slot, so
//! whichever side holds it, nothing else can touch the buffers.

use super::{Assembly, Body, Plan, Share};
use crate::error::{Error, Result};
use crate::tensor::buffer::Buffer;
use crate::tensor::numel_of;
use std::fmt;
// Plain std locks: like the payload pools, caller buffers stay outside the loom model.
use std::sync::{Arc, Mutex, MutexGuard};

/// The buffers a call writes its result into (see the module doc). Cheap to clone: clones
/// share the slot.
#[derive(Clone)]
pub struct Destination(Arc<Mutex<Option<Vec<Buffer>>>>);

impl Destination {
    /// A destination holding `buffers`, in the order of the call's outputs.
    pub fn new(buffers: Vec<Buffer>) -> Destination {
        Destination(Arc::new(Mutex::new(Some(buffers))))
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

    pub(crate) fn lock(&self) -> MutexGuard<'_, Option<Vec<Buffer>>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl fmt::Debug for Destination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.try_lock().as_deref() {
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
        {
            let held = dest.lock();
            let bufs = held
                .as_deref()
                .ok_or_else(|| Error::internal("a destination without its buffers"))?;
            if bufs.len() != want.len() {
                return Err(Error::invalid(format!(
                    "this call writes {} output{} on this rank; {} buffer{} given",
                    want.len(),
                    if want.len() == 1 { "" } else { "s" },
                    bufs.len(),
                    if bufs.len() == 1 { " was" } else { "s were" },
                )));
            }
            for (i, (b, &n)) in bufs.iter().zip(&want).enumerate() {
                if b.dtype() != dtype {
                    return Err(Error::invalid(format!(
                        "output buffer {i} holds {}; this call's dtype is {dtype}",
                        b.dtype()
                    )));
                }
                if b.numel() != n {
                    return Err(Error::invalid(format!(
                        "output buffer {i} holds {} {dtype} elements; this call writes {n} there",
                        b.numel()
                    )));
                }
            }
        }
        *share = Share::Nothing;
        *slot = Some(dest.clone());
        Ok(self)
    }
}
