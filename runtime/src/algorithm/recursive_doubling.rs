//! Recursive doubling all-reduce, for small messages: ⌈log2 W⌉ steps (plus two for a world
//! that is not a power of two), each exchanging the whole buffer.
//!
//! ```text
//!   W = 6, p = 4, rem = 2: ranks 0..4 fold pairwise (0→1, 2→3), then new ranks
//!   {1,3,4,5} = 0..4 exchange with partner new^1, then new^2; finally 1→0, 3→2.
//! ```
//! At every exchange both partners combine (lower block) op (higher block), so they hold the
//! same bits at every step. Source: Thakur, Rabenseifner & Gropp, "Optimization of collective
//! communication operations in MPICH" (IJHPCA 2005), §4.

use super::pow2_floor;
use crate::schedule::{partition, recv_copy, recv_reduce, send, Layout, Schedule};
use std::ops::Range;

/// Tag of the folding step.
pub(crate) const TAG_FOLD: u32 = 0;
/// First tag of the power-of-two phase.
pub(crate) const TAG_MAIN: u32 = 1;
/// Tag of the unfolding step.
pub(crate) const TAG_UNFOLD: u32 = 1 << 20;

/// How a world of `w` ranks folds onto a power of two.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Fold {
    /// The power of two.
    pub(crate) p: usize,
    /// Ranks beyond it (`w - p`).
    pub(crate) rem: usize,
}

impl Fold {
    pub(crate) fn new(w: usize) -> Fold {
        let p = pow2_floor(w);
        Fold { p, rem: w - p }
    }

    /// The rank's index among the `p` that take part, if it does.
    pub(crate) fn new_rank(self, rank: usize) -> Option<usize> {
        if rank < 2 * self.rem {
            (rank % 2 == 1).then_some(rank / 2)
        } else {
            Some(rank - self.rem)
        }
    }

    /// The real rank of new rank `nr`.
    pub(crate) fn real(self, nr: usize) -> usize {
        if nr < self.rem {
            nr * 2 + 1
        } else {
            nr + self.rem
        }
    }

    /// Folding step: even ranks below `2 rem` hand their chunks to the next odd rank.
    pub(crate) fn fold(self, s: &mut Schedule, rank: usize, all: Range<usize>) {
        if rank < 2 * self.rem {
            if rank.is_multiple_of(2) {
                s.step(vec![send(rank + 1, TAG_FOLD, all)], vec![]);
            } else {
                s.step(vec![], vec![recv_reduce(rank - 1, TAG_FOLD, all, true)]);
            }
        }
    }

    /// Unfolding step: the odd ranks hand the result back.
    pub(crate) fn unfold(self, s: &mut Schedule, rank: usize, all: Range<usize>) {
        if rank < 2 * self.rem {
            if rank % 2 == 1 {
                s.step(vec![send(rank - 1, TAG_UNFOLD, all)], vec![]);
            } else {
                s.step(vec![], vec![recv_copy(rank + 1, TAG_UNFOLD, all)]);
            }
        }
    }
}

/// Recursive-doubling all-reduce of `count` elements (one chunk).
pub fn all_reduce(rank: usize, w: usize, count: usize) -> Schedule {
    let mut s = Schedule::new(Layout::blocks(&partition(count, 1)));
    let all = 0..1;
    let f = Fold::new(w);
    f.fold(&mut s, rank, all.clone());
    if let Some(nr) = f.new_rank(rank) {
        let mut mask = 1;
        let mut tag = TAG_MAIN;
        while mask < f.p {
            let pnr = nr ^ mask;
            let peer = f.real(pnr);
            s.step(
                vec![send(peer, tag, all.clone())],
                vec![recv_reduce(peer, tag, all.clone(), pnr < nr)],
            );
            mask <<= 1;
            tag += 1;
        }
    }
    f.unfold(&mut s, rank, all);
    s
}
