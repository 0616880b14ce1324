//! `reduce_scatter` (list form) and `reduce_scatter_tensor`: rank r gets the reduction of every rank's block r (ring or direct).

use super::{fill, list_len, same_dtype, Assembly, Checked, Plan, Planner, TensorSpec};
use crate::algorithm::{direct, ring};
use crate::error::{Error, Result};
use crate::op::{Algorithm, OpKind};
use crate::schedule::Schedule;
use crate::tensor::dtype::DType;
use crate::tensor::reduce::ReduceOp;
use crate::tensor::Tensor;
use bytes::Bytes;

// The spec: checks, sizes, fingerprint fields, output shape, busbw factor (the expected
// results for tests and benchmarks are in `case`, at the end).

impl Planner<'_> {
    /// Checks `reduce_scatter`; also gives every block's size (elements) and every input after
    /// the op's pre-transform.
    pub(super) fn check_reduce_scatter(
        &self,
        inputs: Vec<Tensor>,
        op: ReduceOp,
    ) -> Result<(Checked, Vec<usize>, Vec<Bytes>)> {
        let (w, me) = (self.w(), self.g.rank);
        list_len("reduce_scatter's input list", inputs.len(), w)?;
        let dt = inputs[0].dtype();
        let mut blocks = Vec::with_capacity(w);
        let mut datas = Vec::with_capacity(w);
        for (r, t) in inputs.iter().enumerate() {
            same_dtype(&format!("input {r}"), dt, t.dtype())?;
            blocks.push(t.numel());
            datas.push(self.prepare(t, op)?);
        }
        let total: usize = blocks
            .iter()
            .try_fold(0usize, |a, &b| a.checked_add(b))
            .ok_or_else(|| Error::invalid("input sizes overflow"))?;
        let checked = Checked {
            kind: OpKind::ReduceScatter,
            dtype: dt,
            count: Some(total as u64),
            root: None,
            op: Some(op),
            bytes: total * dt.size(),
            assembly: Assembly::Concat(me..me + 1, inputs[me].shape().to_vec()),
        };
        Ok((checked, blocks, datas))
    }

    /// Checks `reduce_scatter_tensor`; also gives the block size (elements) and the input
    /// after the op's pre-transform.
    pub(super) fn check_reduce_scatter_tensor(
        &self,
        input: Tensor,
        output: TensorSpec,
        op: ReduceOp,
    ) -> Result<(Checked, usize, Bytes)> {
        let (w, me) = (self.w(), self.g.rank);
        let dt = input.dtype();
        same_dtype("output", dt, output.dtype)?;
        let n = output.numel()?;
        if Some(input.numel()) != n.checked_mul(w) {
            return Err(Error::invalid(format!(
                "input holds {} elements; {w} ranks × {n} were expected",
                input.numel()
            )));
        }
        let data = self.prepare(&input, op)?;
        let checked = Checked {
            kind: OpKind::ReduceScatterTensor,
            dtype: dt,
            count: Some(input.numel() as u64),
            root: None,
            op: Some(op),
            bytes: input.nbytes(),
            assembly: Assembly::Concat(me..me + 1, output.shape),
        };
        Ok((checked, n, data))
    }
}

/// nccl-tests' bus-bandwidth factor for a group of `n` ranks.
pub(super) fn busbw_factor(n: f64) -> f64 {
    (n - 1.0) / n
}

// Planning: the algorithm, its schedule and the initial chunks.

impl Planner<'_> {
    /// Plans `reduce_scatter`.
    pub(super) fn reduce_scatter(&self, inputs: Vec<Tensor>, op: ReduceOp) -> Result<Plan> {
        let (checked, blocks, datas) = self.check_reduce_scatter(inputs, op)?;
        let dt = checked.dtype;
        let alg = self.algorithm(checked.kind, checked.bytes)?;
        let s = self.reduce_scatter_schedule(alg, &blocks, dt);
        let mut init = vec![None; s.layout.chunk_elems.len()];
        for (r, d) in datas.iter().enumerate() {
            fill(&mut init, &s.layout, r..r + 1, d, dt.size())?;
        }
        Ok(self.collective(checked, alg, s, init))
    }

    /// Plans `reduce_scatter_tensor`.
    pub(super) fn reduce_scatter_tensor(
        &self,
        input: Tensor,
        output: TensorSpec,
        op: ReduceOp,
    ) -> Result<Plan> {
        let w = self.w();
        let (checked, n, data) = self.check_reduce_scatter_tensor(input, output, op)?;
        let dt = checked.dtype;
        let alg = self.algorithm(checked.kind, checked.bytes)?;
        let blocks = vec![n; w];
        let s = self.reduce_scatter_schedule(alg, &blocks, dt);
        let mut init = vec![None; s.layout.chunk_elems.len()];
        fill(&mut init, &s.layout, 0..w, &data, dt.size())?;
        Ok(self.collective(checked, alg, s, init))
    }

    /// The reduce_scatter schedule of `alg` over blocks of `blocks` elements.
    fn reduce_scatter_schedule(&self, alg: Algorithm, blocks: &[usize], dt: DType) -> Schedule {
        let (w, me) = (self.w(), self.g.rank);
        match alg {
            Algorithm::Direct => direct::reduce_scatter(me, w, blocks),
            _ => ring::reduce_scatter(me, w, blocks, self.seg_elems(dt)),
        }
    }
}

/// The test and benchmark case of this collective: the request each rank makes and the
/// result it must get (inputs from [`input`](crate::collective::case::input), exact in every reduction order).
#[cfg(any(test, feature = "testing"))]
mod case {
    use crate::collective::case::slice;
    use crate::collective::case::Case;
    use crate::collective::{Output, Request, TensorSpec};

    impl Case {
        /// The reduce_scatter case (list form): block `j` of every rank has `block(j)` elements.
        pub(crate) fn reduce_scatter_request(&self, r: usize) -> Request {
            Request::ReduceScatter {
                inputs: (0..self.size)
                    .map(|j| self.inp(r, j, self.block(j)))
                    .collect(),
                op: self.op,
            }
        }

        /// What rank `r` of the reduce_scatter case gets: the reduction of every rank's block r.
        pub(crate) fn reduce_scatter_expected(&self, r: usize) -> Output {
            Output::Tensor(self.reduced((0..self.size).map(|k| self.inp(k, r, self.block(r)))))
        }

        /// The reduce_scatter_tensor case: `size × count` elements in, `count` out.
        pub(crate) fn reduce_scatter_tensor_request(&self, r: usize) -> Request {
            let (w, n) = (self.size, self.count);
            Request::ReduceScatterTensor {
                input: self.inp(r, 0, n * w),
                output: TensorSpec::new(&[n], self.dtype),
                op: self.op,
            }
        }

        /// What rank `r` of the reduce_scatter_tensor case gets: its slice of the reduction.
        pub(crate) fn reduce_scatter_tensor_expected(&self, r: usize) -> Output {
            let (w, n) = (self.size, self.count);
            let all = self.reduced((0..w).map(|k| self.inp(k, 0, n * w)));
            Output::Tensor(slice(&all, r * n, n))
        }
    }
}
