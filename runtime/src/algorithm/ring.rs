//! Ring algorithms: reduce-scatter, all-gather, and all-reduce as the two in sequence.
//!
//! ```text
//!   reduce-scatter, step s: rank r sends block r-s-1 to r+1 and reduces block r-s-2 from r-1
//!   after W-1 steps rank r holds block r fully reduced
//!
//!        r0 ──▶ r1 ──▶ r2 ──▶ r3
//!        ▲                     │
//!        └─────────────────────┘
//!
//!   all-gather, step s: rank r sends block r-s to r+1 and copies block r-s-1 from r-1
//! ```
//! Each block is cut into segments; every step moves one segment, and the steps run
//! diagonally (segment j of step t at position t + j), so a rank forwards segment j as soon
//! as it has it, while later segments are still on their way (pipelining), and holds about
//! W − 1 segments at a time rather than a block. Block b is reduced in the fixed order
//! b+1, b+2, …, b (the received partial is the left operand), on one rank, and then copied,
//! so every rank ends with the same bits. Sources: Patarasuk & Yuan, "Bandwidth optimal
//! all-reduce algorithms for clusters of workstations" (JPDC 2009); gloo `allreduce_ring.h`;
//! NCCL's ring primitives.

use super::back;
use crate::schedule::{partition, recv_copy, recv_reduce, send, Layout, Schedule};

/// A phase of a ring: W − 1 steps of reduce-scatter or of all-gather.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Step s: send block r−s−1 to r+1, reduce block r−s−2 from r−1 into this rank's.
    ReduceScatter,
    /// Step s: send block r−s to r+1, copy block r−s−1 from r−1 (rank r starts with block r).
    AllGather,
}

/// Appends the steps of `phases` (each W − 1 steps over every segment), tags from `tag0`,
/// pipelined: segment j of global step t runs at position t + j, so segment 0 of step t + 1
/// starts as soon as segment 0 of step t is done, not after every segment of step t. Then a
/// segment is forwarded one position after it arrives (W − 1 positions at most), and a rank
/// holds about W − 1 segments in flight instead of a whole block (`engine/sink.rs` drops the
/// rest). Every rank runs the same order, so step k's receive is its peer's step k send.
fn ring_steps(s: &mut Schedule, rank: usize, w: usize, phases: &[Phase], tag0: u32) {
    let segs = s.layout.segments();
    let per = w.saturating_sub(1);
    let total = per * phases.len();
    if total == 0 || segs == 0 {
        return;
    }
    let (next, prev) = ((rank + 1) % w, back(rank, 1, w));
    for d in 0..total + segs - 1 {
        for t in d.saturating_sub(segs - 1)..=d.min(total - 1) {
            let j = d - t;
            let step = t % per;
            let tag = tag0 + (t * segs + j) as u32;
            match phases[t / per] {
                Phase::ReduceScatter => {
                    let out = s.layout.chunk(back(rank, step + 1, w), j);
                    let inn = s.layout.chunk(back(rank, step + 2, w), j);
                    s.step(
                        vec![send(next, tag, out)],
                        vec![recv_reduce(prev, tag, inn, true)],
                    );
                }
                Phase::AllGather => {
                    let out = s.layout.chunk(back(rank, step, w), j);
                    let inn = s.layout.chunk(back(rank, step + 1, w), j);
                    s.step(vec![send(next, tag, out)], vec![recv_copy(prev, tag, inn)]);
                }
            }
        }
    }
}

/// The steps of a ring all-reduce over `s`'s layout (one block per rank), tags from `tag0`
/// (fewer than `2 · w · segments` of them): for a ring among some of a group's members
/// (`hierarchical`, whose ranks here are the ring's).
pub(crate) fn all_reduce_steps(s: &mut Schedule, rank: usize, w: usize, tag0: u32) {
    ring_steps(s, rank, w, &[Phase::ReduceScatter, Phase::AllGather], tag0);
}

/// Ring all-reduce of `count` elements in segments of at most `seg` elements.
pub fn all_reduce(rank: usize, w: usize, count: usize, seg: usize) -> Schedule {
    let mut s = Schedule::new(Layout::segmented(&partition(count, w), seg));
    ring_steps(
        &mut s,
        rank,
        w,
        &[Phase::ReduceScatter, Phase::AllGather],
        0,
    );
    s
}

/// Ring reduce-scatter: block b (of `blocks[b]` elements) ends reduced on rank b.
pub fn reduce_scatter(rank: usize, w: usize, blocks: &[usize], seg: usize) -> Schedule {
    let mut s = Schedule::new(Layout::segmented(blocks, seg));
    ring_steps(&mut s, rank, w, &[Phase::ReduceScatter], 0);
    s
}

/// Ring all-gather: rank b contributes block b (of `blocks[b]` elements).
pub fn all_gather(rank: usize, w: usize, blocks: &[usize], seg: usize) -> Schedule {
    let mut s = Schedule::new(Layout::segmented(blocks, seg));
    ring_steps(&mut s, rank, w, &[Phase::AllGather], 0);
    s
}
