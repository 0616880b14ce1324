//! `reduce`: the root gets the reduction of every rank's tensor, the others their input back (binomial tree or direct).

use super::{fill, Assembly, Checked, Plan, Planner, Share};
use crate::algorithm::{direct, tree};
use crate::error::Result;
use crate::op::{Algorithm, OpKind};
use crate::schedule::partition;
use crate::tensor::reduce::ReduceOp;
use crate::tensor::Tensor;
use bytes::Bytes;

// The spec: checks, sizes, fingerprint fields, output shape, busbw factor (the expected
// results for tests and benchmarks are in `case`, at the end).

impl Planner<'_> {
    /// Checks `reduce`; also gives the element count and the input after the op's
    /// pre-transform.
    pub(super) fn check_reduce(
        &self,
        tensor: Tensor,
        root: usize,
        op: ReduceOp,
    ) -> Result<(Checked, usize, Bytes)> {
        self.g.check_rank(root, "root")?;
        let data = self.prepare(&tensor, op)?;
        let (n, dt) = (tensor.numel(), tensor.dtype());
        let bytes = tensor.nbytes();
        let assembly = if self.g.rank == root {
            Assembly::Whole(tensor.shape().to_vec())
        } else {
            Assembly::Return(tensor)
        };
        let checked = Checked {
            kind: OpKind::Reduce,
            dtype: dt,
            count: Some(n as u64),
            root: Some(root),
            op: Some(op),
            bytes,
            assembly,
        };
        Ok((checked, n, data))
    }
}

/// nccl-tests' bus-bandwidth factor for a group of `n` ranks.
pub(super) fn busbw_factor(_n: f64) -> f64 {
    1.0
}

// Planning: the algorithm, its schedule and the initial chunks.

impl Planner<'_> {
    /// Plans `reduce`.
    pub(super) fn reduce(&self, tensor: Tensor, root: usize, op: ReduceOp) -> Result<Plan> {
        let (w, me) = (self.w(), self.g.rank);
        let (checked, n, data) = self.check_reduce(tensor, root, op)?;
        let dt = checked.dtype;
        let alg = self.algorithm(checked.kind, checked.bytes)?;
        let seg = self.seg_if(alg == Algorithm::BinomialTree, dt);
        let s = self.memo((checked.kind, alg, n, seg, root), || match alg {
            Algorithm::Direct => direct::reduce(me, w, root, n),
            Algorithm::ReduceScatterGather => {
                direct::reduce_scatter_gather(me, w, root, &partition(n, w))
            }
            _ => tree::reduce(me, w, root, n, seg),
        });
        let mut init = vec![None; s.layout.chunk_elems.len()];
        let blocks = s.layout.blocks.len();
        fill(&mut init, &s.layout, 0..blocks, &data, dt.size())?;
        // Each rank's reduced block goes straight into the root's output, which the ranks of
        // one process share (the non-roots only write their block into it).
        let share = if alg == Algorithm::ReduceScatterGather {
            Share::Folds
        } else {
            Share::Nothing
        };
        Ok(self.collective(checked, alg, s, init).sharing(share))
    }
}

/// The test and benchmark case of this collective: the request each rank makes and the
/// result it must get (inputs from [`input`](crate::collective::case::input), exact in every reduction order).
#[cfg(any(test, feature = "testing"))]
mod case {
    use crate::collective::case::Case;
    use crate::collective::{Output, Request};

    impl Case {
        /// The reduce case: every rank reduces its input to the root.
        pub(crate) fn reduce_request(&self, r: usize) -> Request {
            Request::Reduce {
                tensor: self.inp(r, 0, self.count),
                root: self.root,
                op: self.op,
            }
        }

        /// What rank `r` of the reduce case gets: the reduction on the root, its input elsewhere.
        pub(crate) fn reduce_expected(&self, r: usize) -> Output {
            if r == self.root {
                Output::Tensor(self.reduced((0..self.size).map(|k| self.inp(k, 0, self.count))))
            } else {
                Output::Tensor(self.inp(r, 0, self.count))
            }
        }
    }
}
