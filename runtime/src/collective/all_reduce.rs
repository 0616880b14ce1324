//! `all_reduce`: every rank gets the reduction of every rank's tensor (ring, halving-doubling or recursive doubling).

use super::{fill, Finish, Plan, Planner};
use crate::algorithm::{halving_doubling, recursive_doubling, ring};
use crate::error::Result;
use crate::op::{Algorithm, OpKind};
use crate::tensor::reduce::ReduceOp;
use crate::tensor::Tensor;

impl Planner<'_> {
    /// Plans `all_reduce`.
    pub(super) fn all_reduce(&self, tensor: Tensor, op: ReduceOp) -> Result<Plan> {
        let (w, me) = (self.w(), self.g.rank);
        let data = self.prepare(&tensor, op)?;
        let (n, dt) = (tensor.numel(), tensor.dtype());
        let alg = self.algorithm(OpKind::AllReduce, tensor.nbytes())?;
        let s = match alg {
            Algorithm::Ring => ring::all_reduce(me, w, n, self.seg_elems(dt)),
            Algorithm::HalvingDoubling => halving_doubling::all_reduce(me, w, n),
            _ => recursive_doubling::all_reduce(me, w, n),
        };
        let mut init = vec![None; s.layout.chunk_elems.len()];
        fill(
            &mut init,
            &s.layout,
            0..s.layout.blocks.len(),
            &data,
            dt.size(),
        )?;
        let fin = Finish::Whole(tensor.shape().to_vec());
        Ok(self.collective(
            OpKind::AllReduce,
            dt,
            Some(n as u64),
            None,
            Some(op),
            alg,
            s,
            init,
            fin,
        ))
    }
}

/// nccl-tests' bus-bandwidth factor for a group of `n` ranks.
pub(super) fn busbw_factor(n: f64) -> f64 {
    2.0 * (n - 1.0) / n
}

/// The test and benchmark case of this collective: the request each rank makes and the
/// result it must get (inputs from [`crate::testing::input`], exact in every reduction order).
#[cfg(any(test, feature = "testing"))]
mod case {
    use crate::collective::{Output, Request};
    use crate::testing::Case;

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
