//! Writing a call's result into the caller's buffers ([`Destination`]) as it becomes final.
//!
//! A chunk's value is final once the last step that uses it (sends it, or receives into it)
//! is done: nothing writes it after that. Then it is copied to its place in the caller's
//! buffer and dropped. A chunk whose next use overwrites it (a receive that copies, as a
//! ring's all-gather phase does over the partial sums of its reduce-scatter phase) is dead
//! until then, and dropped too. So a call holds only the chunks still in use, not a second
//! copy of its output: with caller buffers a call's memory is its inputs, its outputs and the
//! chunks in flight. Chunks no step uses (a rank's own block that nothing reads) are written when the
//! call finishes, and so is the output transform (`Avg`'s division), over each whole buffer.
//!
//! The engine writes the buffers only here, under the destination's lock (a receive into a
//! buffer, `recv` in `collectix-actors`, copies the message in after the engine is done);
//! nothing the engine sends is ever memory of the caller's buffers.

use crate::collective::{Assembly, Destination, Output, Run};
use crate::error::{Error, Result};
use crate::schedule::{Action, Schedule};
use crate::tensor::buffer::Buffer;
use crate::tensor::dtype::DType;
use crate::tensor::reduce::{self, ReduceOp};
use bytes::Bytes;

/// Where one chunk goes in the call's output (the destination's runs say which buffers that
/// is).
#[derive(Clone, Copy)]
struct Place {
    /// The byte offset in the output ([`NOWHERE`]: the chunk is not part of it).
    at: usize,
    /// Whether it was written out already.
    written: bool,
}

/// What becomes of a chunk after a step that uses it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum After {
    /// No later step uses it: it is final (written out if it is part of the output).
    Final,
    /// Its next use overwrites it: dropped until then.
    Dead,
}

const NOWHERE: usize = usize::MAX;

/// A call's caller-owned output, as the engine fills it (see the module doc).
pub(super) struct Sink {
    dest: Destination,
    /// The element size.
    size: usize,
    places: Vec<Place>,
    /// `(step, chunk, what)`, in step order: the chunks each step leaves final or dead.
    drops: Vec<(usize, usize, After)>,
    /// The next entry of `drops`.
    next: usize,
}

impl Sink {
    /// The sink of a call with `schedule` and `assembly`, writing into `dest` (checked against
    /// them when the plan was made: `Plan::writing_into`).
    pub(super) fn new(
        dest: Destination,
        schedule: &Schedule,
        assembly: &Assembly,
        size: usize,
    ) -> Sink {
        let layout = &schedule.layout;
        let mut places = vec![
            Place {
                at: NOWHERE,
                written: false,
            };
            layout.chunk_elems.len()
        ];
        // The output: every chunk (Whole), or the chunks of its blocks, in order (Concat, and
        // Blocks: one tensor per block, one after another).
        let chunks = match assembly {
            Assembly::Whole(_) => 0..layout.chunk_elems.len(),
            Assembly::Concat(blocks, _) | Assembly::Blocks(blocks, _) => {
                layout.chunks_of(blocks.clone())
            }
            Assembly::Return(_) | Assembly::Nothing => 0..0,
        };
        let mut at = 0usize;
        for ch in chunks {
            if let (Some(p), Some(&n)) = (places.get_mut(ch), layout.chunk_elems.get(ch)) {
                p.at = at;
                at = at.saturating_add(n.saturating_mul(size));
            }
        }
        // Backwards over the steps: each chunk's next use decides what it is after a step.
        #[derive(Clone, Copy, PartialEq)]
        enum Use {
            None,
            Reads,
            Overwrites,
        }
        let mut next = vec![Use::None; layout.chunk_elems.len()];
        let mut seen = vec![usize::MAX; layout.chunk_elems.len()];
        let mut drops = Vec::new();
        for (k, step) in schedule.steps.iter().enumerate().rev() {
            let reads =
                step.sends
                    .iter()
                    .map(|s| s.chunks.clone())
                    .chain(step.recvs.iter().filter_map(|r| match r.action {
                        Action::Reduce { .. } => Some(r.chunks.clone()),
                        Action::Copy => None,
                    }));
            let copies = step
                .recvs
                .iter()
                .filter(|r| r.action == Action::Copy)
                .map(|r| r.chunks.clone());
            // Decide from the next use (once per chunk and step), then record this step's
            // use: a read wins over an overwrite in the same step (sends go first).
            for ch in copies.clone().chain(reads.clone()).flatten() {
                if seen.get(ch) == Some(&k) {
                    continue;
                }
                if let Some(s) = seen.get_mut(ch) {
                    *s = k;
                }
                match next.get(ch) {
                    Some(Use::None) => drops.push((k, ch, After::Final)),
                    Some(Use::Overwrites) => drops.push((k, ch, After::Dead)),
                    _ => {}
                }
            }
            for ch in copies.flatten() {
                if let Some(u) = next.get_mut(ch) {
                    *u = Use::Overwrites;
                }
            }
            for ch in reads.flatten() {
                if let Some(u) = next.get_mut(ch) {
                    *u = Use::Reads;
                }
            }
        }
        drops.reverse();
        Sink {
            dest,
            size,
            places,
            drops,
            next: 0,
        }
    }

    /// After step `k` of the call: writes out (and drops) the chunks step `k` left final,
    /// and drops those it left dead.
    pub(super) fn after_step(&mut self, k: usize, chunks: &mut [Option<Bytes>]) -> Result<()> {
        if self
            .drops
            .get(self.next)
            .is_none_or(|&(step, _, _)| step > k)
        {
            return Ok(());
        }
        let mut held = self.dest.lock();
        // Without its buffers (taken by a holder of the destination: the caller left), the
        // call still runs its part for the others; its chunks are dropped unwritten and it
        // fails when it finishes (`finish`), alone.
        let mut bufs = held.as_deref_mut();
        while let Some(&(step, ch, after)) = self.drops.get(self.next) {
            if step > k {
                break;
            }
            self.next += 1;
            let data = chunks.get_mut(ch).and_then(Option::take);
            let (Some(p), Some(bufs)) = (self.places.get_mut(ch), bufs.as_deref_mut()) else {
                continue;
            };
            if after == After::Final && p.at != NOWHERE && !p.written {
                write(
                    bufs,
                    self.dest.runs(),
                    self.size,
                    p.at,
                    &data.ok_or_else(unfilled)?,
                )?;
                p.written = true;
            }
        }
        Ok(())
    }

    /// The call's output: the chunks not written yet written, the output transform of `op`
    /// applied, and the buffers handed over.
    pub(super) fn finish(
        mut self,
        chunks: &[Option<Bytes>],
        dtype: DType,
        op: Option<ReduceOp>,
        group_size: usize,
    ) -> Result<Output> {
        let mut held = self.dest.lock();
        let bufs = held.as_deref_mut().ok_or_else(taken)?;
        let mut writes = false;
        for (ch, p) in self.places.iter_mut().enumerate() {
            if p.at == NOWHERE {
                continue;
            }
            writes = true;
            if !p.written {
                let data = chunks
                    .get(ch)
                    .and_then(Option::as_ref)
                    .ok_or_else(unfilled)?;
                write(bufs, self.dest.runs(), self.size, p.at, data)?;
                p.written = true;
            }
        }
        if let (Some(op), true) = (op, writes) {
            let runs = self.dest.runs();
            for (i, b) in bufs.iter_mut().enumerate() {
                if runs.iter().any(|r| r.buffer == i) {
                    reduce::post_in_place(dtype, op, b.bytes_mut(), group_size)?;
                }
            }
        }
        drop(held);
        let bufs = self.dest.take().ok_or_else(taken)?;
        Ok(Output::Buffers(bufs))
    }
}

/// Copies `data`, the output's bytes from `at`, to where `runs` put them (elements of
/// `size` bytes).
fn write(bufs: &mut [Buffer], runs: &[Run], size: usize, at: usize, data: &[u8]) -> Result<()> {
    let outside = || Error::internal("a chunk outside the caller's buffers");
    let end_of = |r: &Run| r.at.saturating_add(r.len).saturating_mul(size);
    let (mut at, mut data) = (at, data);
    let mut k = runs.partition_point(|r| end_of(r) <= at);
    while !data.is_empty() {
        let r = runs.get(k).ok_or_else(outside)?;
        let start = r.at.saturating_mul(size);
        if at < start {
            return Err(outside());
        }
        let n = (end_of(r) - at).min(data.len());
        let off = r.offset.saturating_mul(size) + (at - start);
        let dst = bufs
            .get_mut(r.buffer)
            .and_then(|b| b.bytes_mut().get_mut(off..off.checked_add(n)?))
            .ok_or_else(outside)?;
        dst.copy_from_slice(&data[..n]);
        data = &data[n..];
        at += n;
        k += 1;
    }
    Ok(())
}

fn taken() -> Error {
    Error::internal("the caller's buffers were taken while the call ran")
}

fn unfilled() -> Error {
    Error::internal("result chunk never filled")
}
