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
