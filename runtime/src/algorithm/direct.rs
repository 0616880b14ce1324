//! Direct (linear) algorithms: one step in which the root talks to every rank, or every rank
//! to every other. Few messages' latency, no forwarding; the root's link carries everything.
//! Source: gloo `gather.cc`, `scatter.cc`; MPICH's linear algorithms.
//!
//! ```text
//!   gather to r0:  r1 ─┐   scatter from r0:  ┌─▶ r1
//!                  r2 ─┼─▶ r0            r0 ─┼─▶ r2
//!                  r3 ─┘                     └─▶ r3
//! ```
//! Where the root reduces (reduce, reduce_scatter), it applies contributions in rank order,
//! whatever order they arrive in.

use crate::schedule::{partition, recv_copy, recv_reduce, send, Layout, Schedule};

fn others(rank: usize, w: usize) -> impl Iterator<Item = usize> {
    (0..w).filter(move |&p| p != rank)
}

/// `monitored_barrier`, in three steps. 1: every rank sends a marker to every other (tag 0)
/// and waits for theirs: on links that keep their order (TCP, in-process channels) a rank
/// then has received, and checked, every message its peers sent it in the group's earlier
/// calls, so a mismatch an early-finished call left behind is found here (and aborts the
/// group) rather than after the barrier. 2: every rank reports to rank 0 (tag 1). 3: rank 0
/// releases them (tag 2). No payload; W(W−1) markers, so it is a check, not a fast barrier.
/// Rank 0 waits for every rank in step 2, which is what lets it name each one missing.
pub fn monitored_barrier(rank: usize, w: usize) -> Schedule {
    let mut s = Schedule::new(Layout::default());
    if w < 2 {
        return s;
    }
    s.step(
        others(rank, w).map(|p| send(p, 0, 0..0)).collect(),
        others(rank, w).map(|p| recv_copy(p, 0, 0..0)).collect(),
    );
    gather_release(&mut s, rank, w, 1);
    s
}

/// Two steps without data: every rank tells rank 0 (tag `tag`), then rank 0, having heard
/// from all, releases them (tag `tag + 1`).
fn gather_release(s: &mut Schedule, rank: usize, w: usize, tag: u32) {
    if rank == 0 {
        s.step(
            vec![],
            others(0, w).map(|p| recv_copy(p, tag, 0..0)).collect(),
        );
        s.step(
            others(0, w).map(|p| send(p, tag + 1, 0..0)).collect(),
            vec![],
        );
    } else {
        s.step(vec![send(0, tag, 0..0)], vec![]);
        s.step(vec![], vec![recv_copy(0, tag + 1, 0..0)]);
    }
}

/// A linear barrier: every rank tells rank 0 (tag 0), which releases them (tag 1): two
/// steps, 2(W − 1) messages in all, where dissemination sends W·⌈log2 W⌉.
pub fn barrier(rank: usize, w: usize) -> Schedule {
    let mut s = Schedule::new(Layout::default());
    if w >= 2 {
        gather_release(&mut s, rank, w, 0);
    }
    s
}

/// The root sends the whole tensor to every rank.
pub fn broadcast(rank: usize, w: usize, root: usize, count: usize) -> Schedule {
    let mut s = Schedule::new(Layout::blocks(&partition(count, 1)));
    if rank == root {
        s.step(others(rank, w).map(|p| send(p, 0, 0..1)).collect(), vec![]);
    } else {
        s.step(vec![], vec![recv_copy(root, 0, 0..1)]);
    }
    s
}

/// Every rank sends its tensor to the root, which reduces them in rank order.
pub fn reduce(rank: usize, w: usize, root: usize, count: usize) -> Schedule {
    let mut s = Schedule::new(Layout::blocks(&partition(count, 1)));
    if rank == root {
        s.step(
            vec![],
            others(rank, w)
                .map(|p| recv_reduce(p, 0, 0..1, p < rank))
                .collect(),
        );
    } else {
        s.step(vec![send(root, 0, 0..1)], vec![]);
    }
    s
}

/// Every rank sends block b to rank b, which reduces them in rank order (as in
/// [`reduce_scatter`]), then sends its reduced block to the root: two steps, each rank
/// reducing 1/W of the tensor where [`reduce`] has the root reduce all of it alone. In one
/// process the reduced blocks are written straight into the root's output (`tensor::arena`).
/// Source: MPICH's `MPIR_Reduce_intra_reduce_scatter_gather` (with direct steps).
pub fn reduce_scatter_gather(rank: usize, w: usize, root: usize, blocks: &[usize]) -> Schedule {
    gather_step(reduce_scatter(rank, w, blocks), rank, w, root, 1)
}

/// Rank b sends block b to the root.
pub fn gather(rank: usize, w: usize, root: usize, blocks: &[usize]) -> Schedule {
    gather_step(Schedule::new(Layout::blocks(blocks)), rank, w, root, 0)
}

/// `s` with one more step, `step`: rank b sends block b to the root, which copies each into
/// place.
fn gather_step(mut s: Schedule, rank: usize, w: usize, root: usize, step: u32) -> Schedule {
    if rank == root {
        s.step(
            vec![],
            others(rank, w)
                .map(|p| recv_copy(p, step, p..p + 1))
                .collect(),
        );
    } else {
        s.step(vec![send(root, step, rank..rank + 1)], vec![]);
    }
    s
}

/// The root sends block b to rank b.
pub fn scatter(rank: usize, w: usize, root: usize, blocks: &[usize]) -> Schedule {
    let mut s = Schedule::new(Layout::blocks(blocks));
    if rank == root {
        s.step(
            others(rank, w).map(|p| send(p, 0, p..p + 1)).collect(),
            vec![],
        );
    } else {
        s.step(vec![], vec![recv_copy(root, 0, rank..rank + 1)]);
    }
    s
}

/// Every rank sends its block to every other.
pub fn all_gather(rank: usize, w: usize, blocks: &[usize]) -> Schedule {
    let mut s = Schedule::new(Layout::blocks(blocks));
    s.step(
        others(rank, w)
            .map(|p| send(p, 0, rank..rank + 1))
            .collect(),
        others(rank, w).map(|p| recv_copy(p, 0, p..p + 1)).collect(),
    );
    s
}

/// Every rank sends block b to rank b, which reduces them (one pass over the W operands,
/// its own value first, then the others' in rank order), then sends its reduced block to every
/// rank. Every block moves once per peer, which on a network costs the same as a ring's
/// traffic in 2 latencies instead of 2(W−1); in one process the blocks are shared, not
/// copied, and the reduced blocks are written straight into the output the ranks share
/// (`tensor::arena`). Blocks larger than `seg` elements move in segments, pipelined: segment j
/// is reduced (step RS j), then sent to every rank in the step after the next segment's
/// reduction (AG j), so a rank holds a segment of its reduced block until its peers have it,
/// not the whole block (which a call writing into caller buffers would otherwise hold on every
/// rank at once, `engine/sink.rs`). With one segment it is the two-step schedule.
pub fn all_reduce(rank: usize, w: usize, blocks: &[usize], seg: usize) -> Schedule {
    let mut s = Schedule::new(Layout::segmented(blocks, seg));
    let segs = s.layout.segments();
    let rs = |s: &mut Schedule, j: usize| {
        let tag = 2 * j as u32;
        let sends = others(rank, w)
            .map(|p| send(p, tag, s.layout.chunk(p, j)))
            .collect();
        let mine = s.layout.chunk(rank, j);
        let recvs = others(rank, w)
            .map(|p| recv_reduce(p, tag, mine.clone(), p < rank))
            .collect();
        s.step(sends, recvs);
    };
    let ag = |s: &mut Schedule, j: usize| {
        let tag = 2 * j as u32 + 1;
        let mine = s.layout.chunk(rank, j);
        let sends = others(rank, w)
            .map(|p| send(p, tag, mine.clone()))
            .collect();
        let recvs = others(rank, w)
            .map(|p| recv_copy(p, tag, s.layout.chunk(p, j)))
            .collect();
        s.step(sends, recvs);
    };
    for j in 0..segs {
        rs(&mut s, j);
        if j > 0 {
            ag(&mut s, j - 1);
        }
    }
    if segs > 0 {
        ag(&mut s, segs - 1);
    }
    s
}

/// Rank 0 reduces every rank's tensor, in rank order ([`reduce`] to root 0), then sends the
/// result to every rank: two steps, 2(W − 1) messages, every rank's output the same bytes.
/// Few messages for small tensors; rank 0 carries all the data.
pub fn reduce_broadcast(rank: usize, w: usize, count: usize) -> Schedule {
    let mut s = reduce(rank, w, 0, count);
    if w < 2 {
        return s;
    }
    if rank == 0 {
        s.step(others(0, w).map(|p| send(p, 1, 0..1)).collect(), vec![]);
    } else {
        s.step(vec![], vec![recv_copy(0, 1, 0..1)]);
    }
    s
}

/// Every rank sends block b to rank b, which reduces them in rank order.
pub fn reduce_scatter(rank: usize, w: usize, blocks: &[usize]) -> Schedule {
    let mut s = Schedule::new(Layout::blocks(blocks));
    s.step(
        others(rank, w).map(|p| send(p, 0, p..p + 1)).collect(),
        others(rank, w)
            .map(|p| recv_reduce(p, 0, rank..rank + 1, p < rank))
            .collect(),
    );
    s
}
