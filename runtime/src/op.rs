//! The kinds of call ([`OpKind`]), the algorithms ([`Algorithm`]) that can run them, and the
//! kinds of reduction ([`ReduceKind`]). Each has an explicit one-byte code (its `repr(u8)`
//! discriminant, written out, never derived from declaration order) with a checked
//! `TryFrom<u8>`, because the codes travel in fingerprints and frames.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A byte that is not the code of any value of a coded enum (from a peer or a file).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{code} is not a valid {what} code")]
pub struct CodeError {
    /// What the code should have named (`"op kind"`, `"dtype"`, ...).
    pub what: &'static str,
    /// The byte.
    pub code: u8,
}

/// Implements `code()` and `TryFrom<u8>` for a `repr(u8)` enum with explicit discriminants,
/// over the list of its variants.
macro_rules! coded {
    ($t:ident, $what:literal, [$($v:ident),* $(,)?]) => {
        impl $t {
            /// Its code on the wire (the explicit `repr(u8)` discriminant).
            pub const fn code(self) -> u8 {
                self as u8
            }
        }

        impl TryFrom<u8> for $t {
            type Error = CodeError;
            fn try_from(code: u8) -> Result<Self, CodeError> {
                $(
                    if code == $t::$v as u8 {
                        return Ok($t::$v);
                    }
                )*
                Err(CodeError { what: $what, code })
            }
        }
    };
}
pub(crate) use coded;

/// What a call is, as torch.distributed names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
#[repr(u8)]
pub enum OpKind {
    /// `all_reduce`.
    AllReduce = 1,
    /// `reduce`.
    Reduce = 2,
    /// `broadcast`.
    Broadcast = 3,
    /// `all_gather` (list form).
    AllGather = 4,
    /// `all_gather_into_tensor`.
    AllGatherIntoTensor = 5,
    /// `gather`.
    Gather = 6,
    /// `scatter`.
    Scatter = 7,
    /// `reduce_scatter` (list form).
    ReduceScatter = 8,
    /// `reduce_scatter_tensor`.
    ReduceScatterTensor = 9,
    /// `all_to_all` (list form).
    AllToAll = 10,
    /// `all_to_all_single`.
    AllToAllSingle = 11,
    /// `barrier`.
    Barrier = 12,
    /// `send` / `isend`.
    Send = 13,
    /// `recv` / `irecv`.
    Recv = 14,
    /// The agreement step of `new_group` (a barrier whose fingerprint carries the members).
    NewGroup = 15,
    /// `monitored_barrier`: rank 0 collects every rank's arrival and names each one that
    /// did not come in time.
    MonitoredBarrier = 16,
}

coded!(
    OpKind,
    "op kind",
    [
        AllReduce,
        Reduce,
        Broadcast,
        AllGather,
        AllGatherIntoTensor,
        Gather,
        Scatter,
        ReduceScatter,
        ReduceScatterTensor,
        AllToAll,
        AllToAllSingle,
        Barrier,
        Send,
        Recv,
        NewGroup,
        MonitoredBarrier
    ]
);

impl OpKind {
    /// The torch name.
    pub fn name(self) -> &'static str {
        match self {
            OpKind::AllReduce => "all_reduce",
            OpKind::Reduce => "reduce",
            OpKind::Broadcast => "broadcast",
            OpKind::AllGather => "all_gather",
            OpKind::AllGatherIntoTensor => "all_gather_into_tensor",
            OpKind::Gather => "gather",
            OpKind::Scatter => "scatter",
            OpKind::ReduceScatter => "reduce_scatter",
            OpKind::ReduceScatterTensor => "reduce_scatter_tensor",
            OpKind::AllToAll => "all_to_all",
            OpKind::AllToAllSingle => "all_to_all_single",
            OpKind::Barrier => "barrier",
            OpKind::Send => "send",
            OpKind::Recv => "recv",
            OpKind::NewGroup => "new_group",
            OpKind::MonitoredBarrier => "monitored_barrier",
        }
    }

    /// The algorithms that can run this kind of call; the first is the fallback.
    pub fn algorithms(self) -> &'static [Algorithm] {
        use Algorithm::*;
        match self {
            OpKind::AllReduce => &[
                Ring,
                HalvingDoubling,
                RecursiveDoubling,
                Direct,
                ReduceBroadcast,
                Hierarchical,
            ],
            OpKind::Reduce => &[BinomialTree, Direct, ReduceScatterGather],
            OpKind::Broadcast => &[BinomialTree, Direct],
            OpKind::AllGather | OpKind::AllGatherIntoTensor => &[Ring, Direct],
            OpKind::ReduceScatter | OpKind::ReduceScatterTensor => &[Ring, Direct],
            OpKind::Gather | OpKind::Scatter => &[Direct],
            OpKind::AllToAll | OpKind::AllToAllSingle => &[Pairwise],
            OpKind::Barrier | OpKind::NewGroup => &[Dissemination, Direct],
            OpKind::Send | OpKind::Recv | OpKind::MonitoredBarrier => &[Direct],
        }
    }
}

impl fmt::Display for OpKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A schedule family. See `docs/algorithms` in each `algorithm/*.rs` file for its diagram and
/// source.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
#[repr(u8)]
pub enum Algorithm {
    /// Ring reduce-scatter then all-gather, segmented so large tensors pipeline.
    Ring = 1,
    /// Rabenseifner: recursive-halving reduce-scatter then recursive-doubling all-gather.
    HalvingDoubling = 2,
    /// Recursive doubling on whole buffers: fewest steps, for small messages.
    RecursiveDoubling = 3,
    /// Binomial tree, segmented.
    BinomialTree = 4,
    /// Every rank talks to the root (or to every peer) directly, in one step.
    Direct = 5,
    /// Dissemination (Hensgen, Finkel, Manber) barrier.
    Dissemination = 6,
    /// Pairwise exchange, one peer per step.
    Pairwise = 7,
    /// Direct reduce-scatter, then every rank sends its reduced block to the root (MPICH's
    /// `reduce_scatter_gather`): each rank reduces 1/W of the tensor, not the root all of it.
    ReduceScatterGather = 8,
    /// Rank 0 reduces every rank's tensor and sends each the result: two steps, 2(W − 1)
    /// messages, for small all_reduces (MPICH's reduce + broadcast, both linear).
    ReduceBroadcast = 9,
    /// Reduce inside each host to its leader, a ring among the leaders, broadcast inside each
    /// host: for groups on several hosts (only the leaders talk across hosts).
    Hierarchical = 10,
}

coded!(
    Algorithm,
    "algorithm",
    [
        Ring,
        HalvingDoubling,
        RecursiveDoubling,
        BinomialTree,
        Direct,
        Dissemination,
        Pairwise,
        ReduceScatterGather,
        ReduceBroadcast,
        Hierarchical
    ]
);

impl Algorithm {
    /// Every algorithm.
    pub const ALL: [Algorithm; 10] = [
        Algorithm::Ring,
        Algorithm::HalvingDoubling,
        Algorithm::RecursiveDoubling,
        Algorithm::BinomialTree,
        Algorithm::Direct,
        Algorithm::Dissemination,
        Algorithm::Pairwise,
        Algorithm::ReduceScatterGather,
        Algorithm::ReduceBroadcast,
        Algorithm::Hierarchical,
    ];

    /// The algorithm with this [`name`](Algorithm::name).
    pub fn from_name(name: &str) -> Option<Algorithm> {
        Algorithm::ALL.into_iter().find(|a| a.name() == name)
    }

    /// Short name.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Ring => "ring",
            Algorithm::HalvingDoubling => "halving_doubling",
            Algorithm::RecursiveDoubling => "recursive_doubling",
            Algorithm::BinomialTree => "binomial_tree",
            Algorithm::Direct => "direct",
            Algorithm::Dissemination => "dissemination",
            Algorithm::Pairwise => "pairwise",
            Algorithm::ReduceScatterGather => "reduce_scatter_gather",
            Algorithm::ReduceBroadcast => "reduce_broadcast",
            Algorithm::Hierarchical => "hierarchical",
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The kind of a reduction ([`ReduceOp`](crate::ReduceOp) without its scalar), as it travels
/// in fingerprints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
#[repr(u8)]
pub enum ReduceKind {
    /// Sum.
    Sum = 1,
    /// Product.
    Product = 2,
    /// Minimum.
    Min = 3,
    /// Maximum.
    Max = 4,
    /// Mean.
    Avg = 5,
    /// Sum of each input times a scalar.
    PremulSum = 6,
    /// Bitwise AND.
    BAnd = 7,
    /// Bitwise OR.
    BOr = 8,
    /// Bitwise XOR.
    BXor = 9,
}

coded!(
    ReduceKind,
    "reduce op",
    [Sum, Product, Min, Max, Avg, PremulSum, BAnd, BOr, BXor]
);

impl ReduceKind {
    /// The torch name.
    pub fn name(self) -> &'static str {
        match self {
            ReduceKind::Sum => "sum",
            ReduceKind::Product => "product",
            ReduceKind::Min => "min",
            ReduceKind::Max => "max",
            ReduceKind::Avg => "avg",
            ReduceKind::PremulSum => "premul_sum",
            ReduceKind::BAnd => "band",
            ReduceKind::BOr => "bor",
            ReduceKind::BXor => "bxor",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The codes are part of the wire format: pinned here, so that reordering or inserting a
    /// variant cannot change them silently.
    #[test]
    fn codes_are_pinned_and_round_trip() {
        assert_eq!(
            [
                OpKind::AllReduce,
                OpKind::Barrier,
                OpKind::NewGroup,
                OpKind::MonitoredBarrier
            ]
            .map(OpKind::code),
            [1, 12, 15, 16]
        );
        assert_eq!(
            [
                Algorithm::Ring,
                Algorithm::Pairwise,
                Algorithm::ReduceScatterGather
            ]
            .map(Algorithm::code),
            [1, 7, 8]
        );
        assert_eq!(
            [ReduceKind::Sum, ReduceKind::BXor].map(ReduceKind::code),
            [1, 9]
        );
        for c in 0..=u8::MAX {
            if let Ok(k) = OpKind::try_from(c) {
                assert_eq!(k.code(), c);
            }
            if let Ok(a) = Algorithm::try_from(c) {
                assert_eq!(a.code(), c);
            }
            if let Ok(r) = ReduceKind::try_from(c) {
                assert_eq!(r.code(), c);
            }
        }
        assert_eq!(
            (1..=15).filter(|&c| OpKind::try_from(c).is_ok()).count(),
            15
        );
        assert_eq!(
            OpKind::try_from(0),
            Err(CodeError {
                what: "op kind",
                code: 0
            })
        );
        for a in Algorithm::ALL {
            assert_eq!(Algorithm::try_from(a.code()), Ok(a));
        }
    }
}
