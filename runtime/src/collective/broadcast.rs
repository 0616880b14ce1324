//! `broadcast`: every rank gets the root's tensor (binomial tree or direct).

use super::{fill, Finish, Plan, Planner};
use crate::algorithm::{direct, tree};
use crate::error::Result;
use crate::op::{Algorithm, OpKind};
use crate::tensor::Tensor;

impl Planner<'_> {
    /// Plans `broadcast`.
    pub(super) fn broadcast(&self, tensor: Tensor, root: usize) -> Result<Plan> {
        let (w, me) = (self.w(), self.g.rank);
        self.g.check_rank(root, "root")?;
        let (n, dt) = (tensor.numel(), tensor.dtype());
        let alg = self.algorithm(OpKind::Broadcast, tensor.nbytes())?;
        let s = match alg {
            Algorithm::Direct => direct::broadcast(me, w, root, n),
            _ => tree::broadcast(me, w, root, n, self.seg_elems(dt)),
        };
        let mut init = vec![None; s.layout.chunk_elems.len()];
        let fin = if me == root {
            fill(&mut init, &s.layout, 0..1, tensor.bytes(), dt.size())?;
            Finish::Return(tensor)
        } else {
            Finish::Whole(tensor.shape().to_vec())
        };
        Ok(self.collective(
            OpKind::Broadcast,
            dt,
            Some(n as u64),
            Some(root),
            None,
            alg,
            s,
            init,
            fin,
        ))
    }
}
