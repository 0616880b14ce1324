//! `gather` (the root gets every rank's tensor) and `scatter` (each rank gets its part of the root's list), both direct.

use super::{fill, list_len, same_dtype, Assembly, Checked, Plan, Planner, TensorSpec};
use crate::algorithm::direct;
use crate::error::{Error, Result};
use crate::op::OpKind;
use crate::tensor::Tensor;
use bytes::Bytes;

// The spec: checks, sizes, fingerprint fields, output shape, busbw factor (the expected
// results for tests and benchmarks are in `case`, at the end).

impl Planner<'_> {
    /// Checks `gather`; also gives the block size (elements) and this rank's input.
    pub(super) fn check_gather(
        &self,
        input: Tensor,
        root: usize,
    ) -> Result<(Checked, usize, Bytes)> {
        let (w, me) = (self.w(), self.g.rank);
        self.g.check_rank(root, "root")?;
        let (n, dt) = (input.numel(), input.dtype());
        let assembly = if me == root {
            Assembly::Blocks(0..w, vec![input.shape().to_vec(); w])
        } else {
            Assembly::Nothing
        };
        let checked = Checked {
            kind: OpKind::Gather,
            dtype: dt,
            count: Some(n as u64),
            root: Some(root),
            op: None,
            bytes: input.nbytes(),
            assembly,
        };
        Ok((checked, n, input.into_bytes()))
    }

    /// Checks `scatter`; also gives the block size (elements) and, on the root, the scatter
    /// list's data (empty elsewhere).
    pub(super) fn check_scatter(
        &self,
        output: TensorSpec,
        inputs: Option<Vec<Tensor>>,
        root: usize,
    ) -> Result<(Checked, usize, Vec<Bytes>)> {
        let (w, me) = (self.w(), self.g.rank);
        self.g.check_rank(root, "root")?;
        let (n, dt) = (output.numel()?, output.dtype);
        let bytes = n * dt.size();
        let mut datas = Vec::new();
        if me == root {
            let inputs = inputs
                .ok_or_else(|| Error::invalid("the scatter root must pass a scatter list"))?;
            list_len("scatter list", inputs.len(), w)?;
            for (r, t) in inputs.into_iter().enumerate() {
                same_dtype(&format!("scatter list entry {r}"), dt, t.dtype())?;
                if t.numel() != n {
                    return Err(Error::invalid(format!(
                        "scatter list entry {r} has {} elements, the output {n}",
                        t.numel()
                    )));
                }
                datas.push(t.into_bytes());
            }
        }
        let checked = Checked {
            kind: OpKind::Scatter,
            dtype: dt,
            count: Some(n as u64),
            root: Some(root),
            op: None,
            bytes,
            assembly: Assembly::Concat(me..me + 1, output.shape),
        };
        Ok((checked, n, datas))
    }
}

/// nccl-tests' bus-bandwidth factor for a group of `n` ranks.
pub(super) fn busbw_factor(n: f64) -> f64 {
    (n - 1.0) / n
}

// Planning: the algorithm, its schedule and the initial chunks.

impl Planner<'_> {
    /// Plans `gather`.
    pub(super) fn gather(&self, input: Tensor, root: usize) -> Result<Plan> {
        let (w, me) = (self.w(), self.g.rank);
        let (checked, n, data) = self.check_gather(input, root)?;
        let dt = checked.dtype;
        let alg = self.algorithm(checked.kind, checked.bytes)?;
        let s = direct::gather(me, w, root, &vec![n; w]);
        let mut init = vec![None; s.layout.chunk_elems.len()];
        fill(&mut init, &s.layout, me..me + 1, &data, dt.size())?;
        Ok(self.collective(checked, alg, s, init))
    }

    /// Plans `scatter`.
    pub(super) fn scatter(
        &self,
        output: TensorSpec,
        inputs: Option<Vec<Tensor>>,
        root: usize,
    ) -> Result<Plan> {
        let (w, me) = (self.w(), self.g.rank);
        let (checked, n, datas) = self.check_scatter(output, inputs, root)?;
        let dt = checked.dtype;
        let alg = self.algorithm(checked.kind, checked.bytes)?;
        let s = direct::scatter(me, w, root, &vec![n; w]);
        let mut init = vec![None; s.layout.chunk_elems.len()];
        for (r, d) in datas.iter().enumerate() {
            fill(&mut init, &s.layout, r..r + 1, d, dt.size())?;
        }
        Ok(self.collective(checked, alg, s, init))
    }
}

/// The test and benchmark case of this collective: the request each rank makes and the
/// result it must get (inputs from [`input`](crate::collective::case::input), exact in every reduction order).
#[cfg(any(test, feature = "testing"))]
mod case {
    use crate::collective::case::Case;
    use crate::collective::{Output, Request, TensorSpec};

    impl Case {
        /// The gather case: every rank sends its input to the root.
        pub(crate) fn gather_request(&self, r: usize) -> Request {
            Request::Gather {
                input: self.inp(r, 0, self.count),
                root: self.root,
            }
        }

        /// What rank `r` of the gather case gets: every input on the root, nothing elsewhere.
        pub(crate) fn gather_expected(&self, r: usize) -> Output {
            if r == self.root {
                Output::Tensors((0..self.size).map(|j| self.inp(j, 0, self.count)).collect())
            } else {
                Output::None
            }
        }

        /// The scatter case: the root's list holds one input per rank.
        pub(crate) fn scatter_request(&self, r: usize) -> Request {
            let (w, n) = (self.size, self.count);
            Request::Scatter {
                output: TensorSpec::new(&[n], self.dtype),
                inputs: (r == self.root).then(|| (0..w).map(|j| self.inp(r, j, n)).collect()),
                root: self.root,
            }
        }

        /// What rank `r` of the scatter case gets: entry `r` of the root's list.
        pub(crate) fn scatter_expected(&self, r: usize) -> Output {
            Output::Tensor(self.inp(self.root, r, self.count))
        }
    }
}
