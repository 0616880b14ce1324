//! `all_gather` (list form, blocks may differ in size) and `all_gather_into_tensor`: every rank gets every rank's block (ring or direct).

use super::{fill, list_len, same_dtype, Finish, Plan, Planner, TensorSpec};
use crate::algorithm::{direct, ring};
use crate::error::{Error, Result};
use crate::op::{Algorithm, OpKind};
use crate::schedule::Schedule;
use crate::tensor::dtype::DType;
use crate::tensor::Tensor;

impl Planner<'_> {
    /// Plans `all_gather`.
    pub(super) fn all_gather(&self, input: Tensor, outputs: Vec<TensorSpec>) -> Result<Plan> {
        let (w, me) = (self.w(), self.g.rank);
        list_len("all_gather's output list", outputs.len(), w)?;
        let dt = input.dtype();
        let mut blocks = Vec::with_capacity(w);
        for (r, o) in outputs.iter().enumerate() {
            same_dtype(&format!("output {r}"), dt, o.dtype)?;
            blocks.push(o.numel()?);
        }
        if blocks[me] != input.numel() {
            return Err(Error::invalid(format!(
                "output {me} (this rank's) holds {} elements but the input has {}",
                blocks[me],
                input.numel()
            )));
        }
        let total = blocks
            .iter()
            .try_fold(0usize, |a, &b| a.checked_add(b))
            .ok_or_else(|| Error::invalid("output sizes overflow"))?;
        let alg = self.algorithm(OpKind::AllGather, input.nbytes())?;
        let s = self.all_gather_schedule(alg, &blocks, dt);
        let mut init = vec![None; s.layout.chunk_elems.len()];
        fill(&mut init, &s.layout, me..me + 1, input.bytes(), dt.size())?;
        let fin = Finish::Blocks(0..w, outputs.into_iter().map(|o| o.shape).collect());
        Ok(self.collective(
            OpKind::AllGather,
            dt,
            Some(total as u64),
            None,
            None,
            alg,
            s,
            init,
            fin,
        ))
    }

    /// Plans `all_gather_into_tensor`.
    pub(super) fn all_gather_into_tensor(&self, input: Tensor, output: TensorSpec) -> Result<Plan> {
        let (w, me) = (self.w(), self.g.rank);
        let dt = input.dtype();
        same_dtype("output", dt, output.dtype)?;
        let n = input.numel();
        if Some(output.numel()?) != n.checked_mul(w) {
            return Err(Error::invalid(format!(
                "output holds {} elements; {w} ranks × {n} were expected",
                output.numel()?
            )));
        }
        let alg = self.algorithm(OpKind::AllGatherIntoTensor, input.nbytes())?;
        let blocks = vec![n; w];
        let s = self.all_gather_schedule(alg, &blocks, dt);
        let mut init = vec![None; s.layout.chunk_elems.len()];
        fill(&mut init, &s.layout, me..me + 1, input.bytes(), dt.size())?;
        let fin = Finish::Whole(output.shape);
        Ok(self.collective(
            OpKind::AllGatherIntoTensor,
            dt,
            Some((n * w) as u64),
            None,
            None,
            alg,
            s,
            init,
            fin,
        ))
    }

    pub(super) fn all_gather_schedule(
        &self,
        alg: Algorithm,
        blocks: &[usize],
        dt: DType,
    ) -> Schedule {
        let (w, me) = (self.w(), self.g.rank);
        match alg {
            Algorithm::Direct => direct::all_gather(me, w, blocks),
            _ => ring::all_gather(me, w, blocks, self.seg_elems(dt)),
        }
    }
}
