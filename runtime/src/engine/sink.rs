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
//! The buffers are written only here, under the destination's lock; nothing the engine
//! sends is ever memory of the caller's buffers.

use crate::collective::{Assembly, Destination, Output};
use crate::error::{Error, Result};
use crate::schedule::{Action, Schedule};
use crate::tensor::dtype::DType;
use crate::tensor::reduce::{self, ReduceOp};
use bytes::Bytes;

/// Where one chunk goes in the caller's buffers.
#[derive(Clone, Copy)]
struct Place {
    /// The buffer (`u32::MAX`: the chunk is not part of the output).
    buf: u32,
    /// The byte offset in it.
    offset: usize,
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

const NOWHERE: u32 = u32::MAX;

/// A call's caller-owned output, as the engine fills it (see the module doc).
pub(super) struct Sink {
    dest: Destination,
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
                buf: NOWHERE,
                offset: 0,
                written: false,
            };
            layout.chunk_elems.len()
        ];
        let mut place = |buf: u32, chunks: std::ops::Range<usize>| {
            let mut at = 0usize;
            for ch in chunks {
                if let (Some(p), Some(&n)) = (places.get_mut(ch), layout.chunk_elems.get(ch)) {
                    p.buf = buf;
                    p.offset = at;
                    at = at.saturating_add(n.saturating_mul(size));
                }
            }
        };
        match assembly {
            Assembly::Whole(_) => place(0, 0..layout.chunk_elems.len()),
            Assembly::Concat(blocks, _) => place(0, layout.chunks_of(blocks.clone())),
            Assembly::Blocks(blocks, _) => {
                for (i, b) in blocks.clone().enumerate() {
                    place(i as u32, layout.chunks_of(b..b + 1));
                }
            }
            Assembly::Return(_) | Assembly::Nothing => {}
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
            places,
            drops,
            next: 0,
        }
    }

    /// After step `k` of the call: writes out (and drops) the chunks step `k` left final,
    /// and drops those it left dead.
    pub(super) fn after_step(&mut self, k: usize, chunks: &mut [Option<Bytes>]) -> Result<()> {
        let mut held = self.dest.lock();
        let bufs = held.as_deref_mut().ok_or_else(taken)?;
        while let Some(&(step, ch, after)) = self.drops.get(self.next) {
            if step > k {
                break;
            }
            self.next += 1;
            let data = chunks.get_mut(ch).and_then(Option::take);
            let Some(p) = self.places.get_mut(ch) else {
                continue;
            };
            if after == After::Final && p.buf != NOWHERE && !p.written {
                write(bufs, p, &data.ok_or_else(unfilled)?)?;
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
        let mut targets = 0u64;
        for (ch, p) in self.places.iter_mut().enumerate() {
            if p.buf == NOWHERE {
                continue;
            }
            if p.buf < 64 {
                targets |= 1 << p.buf;
            }
            if !p.written {
                let data = chunks
                    .get(ch)
                    .and_then(Option::as_ref)
                    .ok_or_else(unfilled)?;
                write(bufs, p, data)?;
            }
        }
        if let Some(op) = op {
            // Only single-output calls reduce (Whole and Concat: buffer 0).
            for (i, b) in bufs.iter_mut().enumerate() {
                if i < 64 && targets & (1 << i) != 0 {
                    reduce::post_in_place(dtype, op, b.bytes_mut(), group_size)?;
                }
            }
        }
        drop(held);
        let bufs = self.dest.take().ok_or_else(taken)?;
        Ok(Output::Buffers(bufs))
    }
}

/// Copies `data` to its place; marks it written.
fn write(bufs: &mut [crate::tensor::buffer::Buffer], p: &mut Place, data: &[u8]) -> Result<()> {
    let dst = bufs
        .get_mut(p.buf as usize)
        .map(|b| b.bytes_mut())
        .and_then(|b| b.get_mut(p.offset..p.offset.checked_add(data.len())?))
        .ok_or_else(|| Error::internal("a chunk outside the caller's buffer"))?;
    dst.copy_from_slice(data);
    p.written = true;
    Ok(())
}

fn taken() -> Error {
    Error::internal("the caller's buffers were taken while the call ran")
}

fn unfilled() -> Error {
    Error::internal("result chunk never filled")
}
