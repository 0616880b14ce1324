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
//! Each block is cut into segments; every step moves one segment, so a rank forwards segment
//! j while segment j+1 is still on its way (pipelining). Block b is reduced in the fixed order
//! b+1, b+2, …, b (the received partial is the left operand), on one rank, and then copied,
//! so every rank ends with the same bits. Sources: Patarasuk & Yuan, "Bandwidth optimal
//! all-reduce algorithms for clusters of workstations" (JPDC 2009); gloo `allreduce_ring.h`;
//! NCCL's ring primitives.

use super::back;
use crate::schedule::{partition, recv_copy, recv_reduce, send, Layout, Schedule};

/// Appends ring reduce-scatter steps over the layout's `w` blocks, tags from `tag0`.
/// Returns the next free tag.
fn reduce_scatter_steps(s: &mut Schedule, rank: usize, w: usize, tag0: u32) -> u32 {
    let segs = s.layout.segments();
    let mut tag = tag0;
    for step in 0..w.saturating_sub(1) {
        for j in 0..segs {
            let out = s.layout.chunk(back(rank, step + 1, w), j);
            let inn = s.layout.chunk(back(rank, step + 2, w), j);
            s.step(
                vec![send((rank + 1) % w, tag, out)],
                vec![recv_reduce(back(rank, 1, w), tag, inn, true)],
            );
            tag += 1;
        }
    }
    tag
}

/// Appends ring all-gather steps (rank r starts with block r), tags from `tag0`.
fn all_gather_steps(s: &mut Schedule, rank: usize, w: usize, tag0: u32) {
    let segs = s.layout.segments();
    let mut tag = tag0;
    for step in 0..w.saturating_sub(1) {
        for j in 0..segs {
            let out = s.layout.chunk(back(rank, step, w), j);
            let inn = s.layout.chunk(back(rank, step + 1, w), j);
            s.step(
                vec![send((rank + 1) % w, tag, out)],
                vec![recv_copy(back(rank, 1, w), tag, inn)],
            );
            tag += 1;
        }
    }
}

/// Ring all-reduce of `count` elements in segments of at most `seg` elements.
pub fn all_reduce(rank: usize, w: usize, count: usize, seg: usize) -> Schedule {
    let mut s = Schedule::new(Layout::segmented(&partition(count, w), seg));
    let tag = reduce_scatter_steps(&mut s, rank, w, 0);
    all_gather_steps(&mut s, rank, w, tag);
    s
}

/// Ring reduce-scatter: block b (of `blocks[b]` elements) ends reduced on rank b.
pub fn reduce_scatter(rank: usize, w: usize, blocks: &[usize], seg: usize) -> Schedule {
    let mut s = Schedule::new(Layout::segmented(blocks, seg));
    reduce_scatter_steps(&mut s, rank, w, 0);
    s
}

/// Ring all-gather: rank b contributes block b (of `blocks[b]` elements).
pub fn all_gather(rank: usize, w: usize, blocks: &[usize], seg: usize) -> Schedule {
    let mut s = Schedule::new(Layout::segmented(blocks, seg));
    all_gather_steps(&mut s, rank, w, 0);
    s
}
