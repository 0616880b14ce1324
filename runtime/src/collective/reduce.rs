//! `reduce`: the root gets the reduction of every rank's tensor, the others their input back (binomial tree or direct).

use super::{fill, Finish, Plan, Planner};
use crate::algorithm::{direct, tree};
use crate::error::Result;
use crate::op::{Algorithm, OpKind};
use crate::tensor::reduce::ReduceOp;
use crate::tensor::Tensor;

impl Planner<'_> {
    /// Plans `reduce`.
    pub(super) fn reduce(&self, tensor: Tensor, root: usize, op: ReduceOp) -> Result<Plan> {
        let (w, me) = (self.w(), self.g.rank);
        self.g.check_rank(root, "root")?;
        let data = self.prepare(&tensor, op)?;
        let (n, dt) = (tensor.numel(), tensor.dtype());
        let alg = self.algorithm(OpKind::Reduce, tensor.nbytes())?;
        let s = match alg {
            Algorithm::Direct => direct::reduce(me, w, root, n),
            _ => tree::reduce(me, w, root, n, self.seg_elems(dt)),
        };
        let mut init = vec![None; s.layout.chunk_elems.len()];
        fill(&mut init, &s.layout, 0..1, &data, dt.size())?;
        let fin = if me == root {
            Finish::Whole(tensor.shape().to_vec())
        } else {
            Finish::Return(tensor)
        };
        Ok(self.collective(
            OpKind::Reduce,
            dt,
            Some(n as u64),
            Some(root),
            Some(op),
            alg,
            s,
            init,
            fin,
        ))
    }
}

/// nccl-tests' bus-bandwidth factor for a group of `n` ranks.
pub(super) fn busbw_factor(_n: f64) -> f64 {
    1.0
}

/// The test and benchmark case of this collective: the request each rank makes and the
/// result it must get (inputs from [`crate::testing::input`], exact in every reduction order).
#[cfg(any(test, feature = "testing"))]
mod case {
    use crate::collective::{Output, Request};
    use crate::testing::Case;

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
