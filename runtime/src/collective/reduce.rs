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
