//! `gather` (the root gets every rank's tensor) and `scatter` (each rank gets its part of the root's list), both direct.

use super::{fill, list_len, same_dtype, Finish, Plan, Planner, TensorSpec};
use crate::algorithm::direct;
use crate::error::{Error, Result};
use crate::op::OpKind;
use crate::tensor::Tensor;

impl Planner<'_> {
    /// Plans `gather`.
    pub(super) fn gather(&self, input: Tensor, root: usize) -> Result<Plan> {
        let (w, me) = (self.w(), self.g.rank);
        self.g.check_rank(root, "root")?;
        let (n, dt) = (input.numel(), input.dtype());
        let alg = self.algorithm(OpKind::Gather, input.nbytes())?;
        let s = direct::gather(me, w, root, &vec![n; w]);
        let mut init = vec![None; s.layout.chunk_elems.len()];
        fill(&mut init, &s.layout, me..me + 1, input.bytes(), dt.size())?;
        let fin = if me == root {
            Finish::Blocks(0..w, vec![input.shape().to_vec(); w])
        } else {
            Finish::Nothing
        };
        Ok(self.collective(
            OpKind::Gather,
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

    /// Plans `scatter`.
    pub(super) fn scatter(
        &self,
        output: TensorSpec,
        inputs: Option<Vec<Tensor>>,
        root: usize,
    ) -> Result<Plan> {
        let (w, me) = (self.w(), self.g.rank);
        self.g.check_rank(root, "root")?;
        let (n, dt) = (output.numel()?, output.dtype);
        let alg = self.algorithm(OpKind::Scatter, n * dt.size())?;
        let s = direct::scatter(me, w, root, &vec![n; w]);
        let mut init = vec![None; s.layout.chunk_elems.len()];
        if me == root {
            let inputs = inputs
                .ok_or_else(|| Error::invalid("the scatter root must pass a scatter list"))?;
            list_len("scatter list", inputs.len(), w)?;
            for (r, t) in inputs.iter().enumerate() {
                same_dtype(&format!("scatter list entry {r}"), dt, t.dtype())?;
                if t.numel() != n {
                    return Err(Error::invalid(format!(
                        "scatter list entry {r} has {} elements, the output {n}",
                        t.numel()
                    )));
                }
                fill(&mut init, &s.layout, r..r + 1, t.bytes(), dt.size())?;
            }
        }
        let fin = Finish::Concat(me..me + 1, output.shape);
        Ok(self.collective(
            OpKind::Scatter,
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

/// nccl-tests' bus-bandwidth factor for a group of `n` ranks.
pub(super) fn busbw_factor(n: f64) -> f64 {
    (n - 1.0) / n
}

/// The test and benchmark case of this collective: the request each rank makes and the
/// result it must get (inputs from [`crate::testing::input`], exact in every reduction order).
#[cfg(any(test, feature = "testing"))]
mod case {
    use crate::collective::{Output, Request, TensorSpec};
    use crate::testing::Case;

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
