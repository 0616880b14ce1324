//! Binomial-tree broadcast and reduce, segmented so a long tensor pipelines down (or up) the
//! tree.
//!
//! ```text
//!   relative ranks (v = rank - root mod W), W = 8:
//!              0
//!        ┌─────┼─────┐
//!        4     2     1
//!      ┌─┴┐    │
//!      6  5    3
//!      │
//!      7
//!   parent(v) = v with its lowest set bit cleared; children v + 2^k for 2^k below it.
//! ```
//! Broadcast sends each segment to the larger subtrees first. Reduce combines a node's own
//! value with its children's partials in a fixed order (child v+1, then v+2, v+4, …), so the
//! root's result never depends on arrival order. Source: MPICH `MPIR_Bcast_intra_binomial`,
//! `MPIR_Reduce_intra_binomial`.

use crate::schedule::{partition, recv_copy, recv_reduce, send, Layout, Schedule, SendOp};

struct Node {
    parent: Option<usize>,
    /// Children, largest subtree first.
    children: Vec<usize>,
}

fn node(rank: usize, w: usize, root: usize) -> Node {
    let v = (rank + w - root) % w;
    let abs = |x: usize| (x + root) % w;
    let low = if v == 0 {
        w.next_power_of_two()
    } else {
        v & v.wrapping_neg()
    };
    let parent = (v != 0).then(|| abs(v - low));
    let mut children = Vec::new();
    let mut m = low >> 1;
    while m >= 1 {
        if v + m < w {
            children.push(abs(v + m));
        }
        m >>= 1;
    }
    Node { parent, children }
}

/// Binomial broadcast of `count` elements from `root`, in segments of at most `seg`.
pub fn broadcast(rank: usize, w: usize, root: usize, count: usize, seg: usize) -> Schedule {
    let mut s = Schedule::new(Layout::segmented(&partition(count, 1), seg));
    let n = node(rank, w, root);
    let segs = s.layout.segments();
    let fwd = |j: usize| -> Vec<SendOp> {
        n.children
            .iter()
            .map(|&c| send(c, j as u32, j..j + 1))
            .collect()
    };
    match n.parent {
        None => s.step((0..segs).flat_map(fwd).collect(), vec![]),
        Some(p) => {
            for j in 0..segs {
                let sends = if j > 0 { fwd(j - 1) } else { vec![] };
                s.step(sends, vec![recv_copy(p, j as u32, j..j + 1)]);
            }
            s.step(fwd(segs - 1), vec![]);
        }
    }
    s
}

/// Binomial reduce of `count` elements to `root`, in segments of at most `seg`.
pub fn reduce(rank: usize, w: usize, root: usize, count: usize, seg: usize) -> Schedule {
    let mut s = Schedule::new(Layout::segmented(&partition(count, 1), seg));
    let n = node(rank, w, root);
    let segs = s.layout.segments();
    let gather = |j: usize| {
        n.children
            .iter()
            .rev()
            .map(|&c| recv_reduce(c, j as u32, j..j + 1, false))
            .collect()
    };
    let up = |j: usize| {
        n.parent
            .map(|p| send(p, j as u32, j..j + 1))
            .into_iter()
            .collect()
    };
    for j in 0..segs {
        let sends = if j > 0 { up(j - 1) } else { vec![] };
        s.step(sends, gather(j));
    }
    s.step(up(segs - 1), vec![]);
    s
}
