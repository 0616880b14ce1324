//! The kinds of call ([`OpKind`]) and the algorithms ([`Algorithm`]) that can run them.

use serde::{Deserialize, Serialize};
use std::fmt;

/// What a call is, as torch.distributed names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub enum OpKind {
    /// `all_reduce`.
    AllReduce,
    /// `reduce`.
    Reduce,
    /// `broadcast`.
    Broadcast,
    /// `all_gather` (list form).
    AllGather,
    /// `all_gather_into_tensor`.
    AllGatherIntoTensor,
    /// `gather`.
    Gather,
    /// `scatter`.
    Scatter,
    /// `reduce_scatter` (list form).
    ReduceScatter,
    /// `reduce_scatter_tensor`.
    ReduceScatterTensor,
    /// `all_to_all` (list form).
    AllToAll,
    /// `all_to_all_single`.
    AllToAllSingle,
    /// `barrier`.
    Barrier,
    /// `send` / `isend`.
    Send,
    /// `recv` / `irecv`.
    Recv,
    /// The agreement step of `new_group` (a barrier whose fingerprint carries the members).
    NewGroup,
}

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
        }
    }

    /// The algorithms that can run this kind of call; the first is the fallback.
    pub fn algorithms(self) -> &'static [Algorithm] {
        use Algorithm::*;
        match self {
            OpKind::AllReduce => &[Ring, HalvingDoubling, RecursiveDoubling],
            OpKind::Reduce | OpKind::Broadcast => &[BinomialTree, Direct],
            OpKind::AllGather | OpKind::AllGatherIntoTensor => &[Ring, Direct],
            OpKind::ReduceScatter | OpKind::ReduceScatterTensor => &[Ring, Direct],
            OpKind::Gather | OpKind::Scatter => &[Direct],
            OpKind::AllToAll | OpKind::AllToAllSingle => &[Pairwise],
            OpKind::Barrier | OpKind::NewGroup => &[Dissemination],
            OpKind::Send | OpKind::Recv => &[Direct],
        }
    }

    /// The bus-bandwidth factor of nccl-tests for a group of `n` ranks.
    pub fn busbw_factor(self, n: usize) -> f64 {
        let n = n.max(1) as f64;
        match self {
            OpKind::AllReduce => 2.0 * (n - 1.0) / n,
            OpKind::AllGather
            | OpKind::AllGatherIntoTensor
            | OpKind::ReduceScatter
            | OpKind::ReduceScatterTensor
            | OpKind::AllToAll
            | OpKind::AllToAllSingle
            | OpKind::Gather
            | OpKind::Scatter => (n - 1.0) / n,
            _ => 1.0,
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
pub enum Algorithm {
    /// Ring reduce-scatter then all-gather, segmented so large tensors pipeline.
    Ring,
    /// Rabenseifner: recursive-halving reduce-scatter then recursive-doubling all-gather.
    HalvingDoubling,
    /// Recursive doubling on whole buffers: fewest steps, for small messages.
    RecursiveDoubling,
    /// Binomial tree, segmented.
    BinomialTree,
    /// Every rank talks to the root (or to every peer) directly, in one step.
    Direct,
    /// Dissemination (Hensgen, Finkel, Manber) barrier.
    Dissemination,
    /// Pairwise exchange, one peer per step.
    Pairwise,
}

impl Algorithm {
    /// Every algorithm.
    pub const ALL: [Algorithm; 7] = [
        Algorithm::Ring,
        Algorithm::HalvingDoubling,
        Algorithm::RecursiveDoubling,
        Algorithm::BinomialTree,
        Algorithm::Direct,
        Algorithm::Dissemination,
        Algorithm::Pairwise,
    ];

    /// The algorithm with this [`name`](Algorithm::name).
    pub fn from_name(name: &str) -> Option<Algorithm> {
        Algorithm::ALL.into_iter().find(|a| a.name() == name)
    }

    /// Stable code for fingerprints.
    pub fn code(self) -> u8 {
        self as u8 + 1
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
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
