//! Rabenseifner's all-reduce: recursive-halving reduce-scatter, then recursive-doubling
//! all-gather, over the largest power of two `p ≤ W` (the others fold in first and get the
//! result last, as in [`recursive_doubling`](super::recursive_doubling)).
//!
//! ```text
//!   p = 4, blocks 0..4 (block i ends on new rank i):
//!   halving  mask 2: {0,1} keep blocks 0..2, send 2..4 to partner ^2; {2,3} the reverse
//!            mask 1: each keeps its own block, sends the other
//!   doubling mask 1, then 2: send what you hold, copy what the partner holds
//! ```
//! Bandwidth-optimal like the ring, in 2 log2 p steps. Each block is reduced on one rank and
//! then copied, so all ranks hold the same bits. Source: Rabenseifner, "Optimization of
//! collective reduction operations" (ICCS 2004); Thakur, Rabenseifner & Gropp (IJHPCA 2005).

use super::recursive_doubling::{Fold, TAG_MAIN};
use crate::schedule::{partition, recv_copy, recv_reduce, send, Layout, Schedule};

/// Halving-doubling all-reduce of `count` elements.
pub fn all_reduce(rank: usize, w: usize, count: usize) -> Schedule {
    let f = Fold::new(w);
    let mut s = Schedule::new(Layout::blocks(&partition(count, f.p)));
    let all = 0..f.p;
    f.fold(&mut s, rank, all.clone());
    if let Some(nr) = f.new_rank(rank) {
        let mut tag = TAG_MAIN;
        // Halving: the kept range shrinks around nr.
        let (mut lo, mut hi) = (0, f.p);
        let mut mask = f.p / 2;
        while mask >= 1 {
            let pnr = nr ^ mask;
            let peer = f.real(pnr);
            let mid = lo + mask;
            let (keep, give) = if nr & mask == 0 {
                (lo..mid, mid..hi)
            } else {
                (mid..hi, lo..mid)
            };
            s.step(
                vec![send(peer, tag, give)],
                vec![recv_reduce(peer, tag, keep.clone(), pnr < nr)],
            );
            (lo, hi) = (keep.start, keep.end);
            mask /= 2;
            tag += 1;
        }
        // Doubling: the held range grows back.
        let mut mask = 1;
        while mask < f.p {
            let pnr = nr ^ mask;
            let peer = f.real(pnr);
            let lo = nr & !(2 * mask - 1);
            let (mine, theirs) = if nr & mask == 0 {
                (lo..lo + mask, lo + mask..lo + 2 * mask)
            } else {
                (lo + mask..lo + 2 * mask, lo..lo + mask)
            };
            s.step(
                vec![send(peer, tag, mine)],
                vec![recv_copy(peer, tag, theirs)],
            );
            mask <<= 1;
            tag += 1;
        }
    }
    f.unfold(&mut s, rank, all);
    s
}
