//! `all_gather` (list form, blocks may differ in size) and `all_gather_into_tensor`: every rank gets every rank's block (ring or direct).

use super::{fill, list_len, same_dtype, Assembly, Checked, Plan, Planner, Share, TensorSpec};
use crate::algorithm::{direct, ring};
use crate::error::{Error, Result};
use crate::op::{Algorithm, OpKind};
use crate::schedule::Schedule;
use crate::tensor::dtype::DType;
use crate::tensor::Tensor;
use bytes::Bytes;

// The spec: checks, sizes, fingerprint fields, output shape, busbw factor (the expected
// results for tests and benchmarks are in `case`, at the end).

impl Planner<'_> {
    /// Checks `all_gather`; also gives every rank's block size (elements) and this rank's
    /// input.
    pub(super) fn check_all_gather(
        &self,
        input: Tensor,
        outputs: Vec<TensorSpec>,
    ) -> Result<(Checked, Vec<usize>, Bytes)> {
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
        let checked = Checked {
            kind: OpKind::AllGather,
            dtype: dt,
            count: Some(total as u64),
            root: None,
            op: None,
            // The mean block, which every rank computes alike from the output list: blocks may
            // differ in size, and ranks choosing the algorithm by their own would disagree.
            bytes: (total / w.max(1)).saturating_mul(dt.size()),
            assembly: Assembly::Blocks(0..w, outputs.into_iter().map(|o| o.shape).collect()),
        };
        Ok((checked, blocks, input.into_bytes()))
    }

    /// Checks `all_gather_into_tensor`; also gives the block size (elements) and this rank's
    /// input.
    pub(super) fn check_all_gather_into_tensor(
        &self,
        input: Tensor,
        output: TensorSpec,
    ) -> Result<(Checked, usize, Bytes)> {
        let w = self.w();
        let dt = input.dtype();
        same_dtype("output", dt, output.dtype)?;
        let n = input.numel();
        if Some(output.numel()?) != n.checked_mul(w) {
            return Err(Error::invalid(format!(
                "output holds {} elements; {w} ranks × {n} were expected",
                output.numel()?
            )));
        }
        let checked = Checked {
            kind: OpKind::AllGatherIntoTensor,
            dtype: dt,
            count: Some((n * w) as u64),
            root: None,
            op: None,
            bytes: input.nbytes(),
            assembly: Assembly::Whole(output.shape),
        };
        Ok((checked, n, input.into_bytes()))
    }
}

/// nccl-tests' bus-bandwidth factor for a group of `n` ranks.
pub(super) fn busbw_factor(n: f64) -> f64 {
    (n - 1.0) / n
}

// Planning: the algorithm, its schedule and the initial chunks.

impl Planner<'_> {
    /// Plans `all_gather`.
    pub(super) fn all_gather(&self, input: Tensor, outputs: Vec<TensorSpec>) -> Result<Plan> {
        let me = self.g.rank;
        let (checked, blocks, data) = self.check_all_gather(input, outputs)?;
        let dt = checked.dtype;
        let alg = self.algorithm(checked.kind, checked.bytes)?;
        let s = self.all_gather_schedule(alg, &blocks, dt);
        let mut init = vec![None; s.layout.chunk_elems.len()];
        fill(&mut init, &s.layout, me..me + 1, &data, dt.size())?;
        Ok(self.collective(checked, alg, s, init))
    }

    /// Plans `all_gather_into_tensor`.
    pub(super) fn all_gather_into_tensor(&self, input: Tensor, output: TensorSpec) -> Result<Plan> {
        let (w, me) = (self.w(), self.g.rank);
        let (checked, n, data) = self.check_all_gather_into_tensor(input, output)?;
        let dt = checked.dtype;
        let alg = self.algorithm(checked.kind, checked.bytes)?;
        let blocks = vec![n; w];
        let s = self.all_gather_schedule(alg, &blocks, dt);
        let mut init = vec![None; s.layout.chunk_elems.len()];
        fill(&mut init, &s.layout, me..me + 1, &data, dt.size())?;
        let share = if alg == Algorithm::Direct {
            Share::Own(s.layout.chunks_of(me..me + 1))
        } else {
            Share::Nothing
        };
        Ok(self.collective(checked, alg, s, init).sharing(share))
    }

    /// The all_gather schedule of `alg` over blocks of `blocks` elements.
    fn all_gather_schedule(&self, alg: Algorithm, blocks: &[usize], dt: DType) -> Schedule {
        let (w, me) = (self.w(), self.g.rank);
        match alg {
            Algorithm::Direct => direct::all_gather(me, w, blocks),
            _ => ring::all_gather(me, w, blocks, self.seg_elems(dt)),
        }
    }
}

/// The test and benchmark case of this collective: the request each rank makes and the
/// result it must get (inputs from [`input`](crate::collective::case::input), exact in every reduction order).
#[cfg(any(test, feature = "testing"))]
mod case {
    use crate::collective::case::concat;
    use crate::collective::case::Case;
    use crate::collective::{Output, Request, TensorSpec};
    use crate::tensor::Tensor;

    impl Case {
        /// The all_gather case (list form): rank `r` contributes a block of `block(r)` elements
        /// (uneven on purpose).
        pub(crate) fn all_gather_request(&self, r: usize) -> Request {
            Request::AllGather {
                input: self.inp(r, 0, self.block(r)),
                outputs: (0..self.size)
                    .map(|j| TensorSpec::new(&[self.block(j)], self.dtype))
                    .collect(),
            }
        }

        /// What every rank of the all_gather case gets: every rank's block.
        pub(crate) fn all_gather_expected(&self) -> Output {
            Output::Tensors(
                (0..self.size)
                    .map(|j| self.inp(j, 0, self.block(j)))
                    .collect(),
            )
        }

        /// The all_gather_into_tensor case: `count` elements per rank, gathered into `[size,
        /// count]`.
        pub(crate) fn all_gather_into_tensor_request(&self, r: usize) -> Request {
            Request::AllGatherIntoTensor {
                input: self.inp(r, 0, self.count),
                output: TensorSpec::new(&[self.size, self.count], self.dtype),
            }
        }

        /// What every rank of the all_gather_into_tensor case gets.
        pub(crate) fn all_gather_into_tensor_expected(&self) -> Output {
            let (w, n) = (self.size, self.count);
            let all = concat(&(0..w).map(|j| self.inp(j, 0, n)).collect::<Vec<_>>());
            Output::Tensor(
                all.reshape(&[w, n])
                    .unwrap_or_else(|_| Tensor::empty(self.dtype)),
            )
        }
    }
}
