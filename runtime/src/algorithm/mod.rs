//! The algorithms, one file each. Each builds a [`Schedule`](crate::schedule::Schedule) for one
//! rank from the group size, its rank, the root where there is one, and the element counts;
//! none touches a transport or the data. Ranks here are group-local.

pub mod direct;
pub mod dissemination;
pub mod halving_doubling;
pub mod hierarchical;
pub mod pairwise;
pub mod recursive_doubling;
pub mod ring;
pub mod tree;

/// `(rank + w - d) mod w` for `d <= 2w`, without going negative.
pub(crate) fn back(rank: usize, d: usize, w: usize) -> usize {
    (rank + 2 * w - d) % w
}

/// The largest power of two not above `w` (`w >= 1`).
pub(crate) fn pow2_floor(w: usize) -> usize {
    if w == 0 {
        return 0;
    }
    1 << (usize::BITS - 1 - w.leading_zeros())
}
