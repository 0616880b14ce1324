//! `all_reduce`: every rank gets the reduction of every rank's tensor (ring, halving-doubling or recursive doubling).

use super::{fill, Assembly, Checked, Plan, Planner, Share};
use crate::algorithm::{direct, halving_doubling, hierarchical, recursive_doubling, ring};
use crate::error::Result;
use crate::op::{Algorithm, OpKind};
use crate::schedule::partition;
use crate::tensor::reduce::ReduceOp;
use crate::tensor::Tensor;
use bytes::Bytes;

// The spec: checks, sizes, fingerprint fields, output shape, busbw factor (the expected
// results for tests and benchmarks are in `case`, at the end).

impl Planner<'_> {
    /// Checks `all_reduce`; also gives the element count and the input after the op's
    /// pre-transform.
    pub(super) fn check_all_reduce(
        &self,
        tensor: Tensor,
        op: ReduceOp,
    ) -> Result<(Checked, usize, Bytes)> {
        let data = self.prepare(&tensor, op)?;
        let (n, dt) = (tensor.numel(), tensor.dtype());
        let checked = Checked {
            kind: OpKind::AllReduce,
            dtype: dt,
            count: Some(n as u64),
            root: None,
            op: Some(op),
            bytes: tensor.nbytes(),
            assembly: Assembly::Whole(tensor.shape().to_vec()),
        };
        Ok((checked, n, data))
    }
}

/// nccl-tests' bus-bandwidth factor for a group of `n` ranks.
pub(super) fn busbw_factor(n: f64) -> f64 {
    2.0 * (n - 1.0) / n
}

// Planning: the algorithm, its schedule and the initial chunks.

impl Planner<'_> {
    /// Plans `all_reduce`.
    pub(super) fn all_reduce(&self, tensor: Tensor, op: ReduceOp) -> Result<Plan> {
        let (w, me) = (self.w(), self.g.rank);
        let (checked, n, data) = self.check_all_reduce(tensor, op)?;
        let dt = checked.dtype;
        let alg = self.algorithm(checked.kind, checked.bytes)?;
        let seg = self.seg_if(
            matches!(
                alg,
                Algorithm::Ring | Algorithm::Direct | Algorithm::Hierarchical
            ),
            dt,
        );
        let s = self.memo((checked.kind, alg, n, seg, 0), || match alg {
            Algorithm::Ring => ring::all_reduce(me, w, n, seg),
            Algorithm::Hierarchical => hierarchical::all_reduce(me, &self.g.member_hosts(), n, seg),
            Algorithm::HalvingDoubling => halving_doubling::all_reduce(me, w, n),
            Algorithm::Direct => direct::all_reduce(me, w, &partition(n, w), seg),
            Algorithm::ReduceBroadcast => direct::reduce_broadcast(me, w, n),
            _ => recursive_doubling::all_reduce(me, w, n),
        });
        let mut init = vec![None; s.layout.chunk_elems.len()];
        fill(
            &mut init,
            &s.layout,
            0..s.layout.blocks.len(),
            &data,
            dt.size(),
        )?;
        let share = if alg == Algorithm::Direct {
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
        /// The all_reduce case: every rank reduces its input; every rank gets the reduction.
        pub(crate) fn all_reduce_request(&self, r: usize) -> Request {
            Request::AllReduce {
                tensor: self.inp(r, 0, self.count),
                op: self.op,
            }
        }

        /// What every rank of the all_reduce case gets.
        pub(crate) fn all_reduce_expected(&self) -> Output {
            Output::Tensor(self.reduced((0..self.size).map(|k| self.inp(k, 0, self.count))))
        }
    }
}
