//! `all_to_all` (lists) and `all_to_all_single` (splits along dimension 0): rank r's block j goes to rank j (pairwise exchange).

use super::{fill, list_len, same_dtype, Finish, Plan, Planner, TensorSpec};
use crate::algorithm::pairwise;
use crate::error::{Error, Result};
use crate::op::OpKind;
use crate::tensor::{numel_of, Tensor};

impl Planner<'_> {
    /// Plans `all_to_all`.
    pub(super) fn all_to_all(&self, inputs: Vec<Tensor>, outputs: Vec<TensorSpec>) -> Result<Plan> {
        let (w, me) = (self.w(), self.g.rank);
        list_len("all_to_all's input list", inputs.len(), w)?;
        list_len("all_to_all's output list", outputs.len(), w)?;
        let dt = inputs[0].dtype();
        let mut send = Vec::with_capacity(w);
        let mut recv = Vec::with_capacity(w);
        for r in 0..w {
            same_dtype(&format!("input {r}"), dt, inputs[r].dtype())?;
            same_dtype(&format!("output {r}"), dt, outputs[r].dtype)?;
            send.push(inputs[r].numel());
            recv.push(outputs[r].numel()?);
        }
        if send[me] != recv[me] {
            return Err(Error::invalid(format!(
                "input {me} has {} elements but output {me} {} (this rank sends to itself)",
                send[me], recv[me]
            )));
        }
        let alg = self.algorithm(OpKind::AllToAll, 0)?;
        let s = pairwise::all_to_all(me, w, &send, &recv);
        let mut init = vec![None; s.layout.chunk_elems.len()];
        for (r, t) in inputs.iter().enumerate() {
            fill(&mut init, &s.layout, r..r + 1, t.bytes(), dt.size())?;
        }
        fill(
            &mut init,
            &s.layout,
            w + me..w + me + 1,
            inputs[me].bytes(),
            dt.size(),
        )?;
        let fin = Finish::Blocks(w..2 * w, outputs.into_iter().map(|o| o.shape).collect());
        Ok(self.collective(OpKind::AllToAll, dt, None, None, None, alg, s, init, fin))
    }

    /// Plans `all_to_all_single`.
    pub(super) fn all_to_all_single(
        &self,
        input: Tensor,
        output: TensorSpec,
        output_splits: Option<Vec<usize>>,
        input_splits: Option<Vec<usize>>,
    ) -> Result<Plan> {
        let (w, me) = (self.w(), self.g.rank);
        let dt = input.dtype();
        same_dtype("output", dt, output.dtype)?;
        let send = splits("input", input.shape(), input_splits, w)?;
        let recv = splits("output", &output.shape, output_splits, w)?;
        if send[me] != recv[me] {
            return Err(Error::invalid(format!(
                "this rank sends itself {} elements but expects {} from itself",
                send[me], recv[me]
            )));
        }
        let alg = self.algorithm(OpKind::AllToAllSingle, 0)?;
        let s = pairwise::all_to_all(me, w, &send, &recv);
        let mut init = vec![None; s.layout.chunk_elems.len()];
        fill(&mut init, &s.layout, 0..w, input.bytes(), dt.size())?;
        init[w + me] = init[me].clone();
        let fin = Finish::Concat(w..2 * w, output.shape);
        Ok(self.collective(
            OpKind::AllToAllSingle,
            dt,
            None,
            None,
            None,
            alg,
            s,
            init,
            fin,
        ))
    }
}

/// Element counts per rank of an all_to_all_single split along dimension 0.
fn splits(what: &str, shape: &[usize], given: Option<Vec<usize>>, w: usize) -> Result<Vec<usize>> {
    let (&rows, rest) = shape.split_first().ok_or_else(|| {
        Error::invalid(format!(
            "all_to_all_single's {what} needs at least one dimension"
        ))
    })?;
    let row = numel_of(rest)?;
    let rows_per = match given {
        None => {
            if !rows.is_multiple_of(w) {
                return Err(Error::invalid(format!(
                    "{what} dimension 0 ({rows}) is not divisible by the group size {w}"
                )));
            }
            vec![rows / w; w]
        }
        Some(v) => {
            list_len(&format!("{what} split sizes"), v.len(), w)?;
            let sum = v.iter().try_fold(0usize, |a, &b| a.checked_add(b));
            if sum != Some(rows) {
                return Err(Error::invalid(format!(
                    "{what} split sizes {v:?} do not add up to dimension 0 ({rows})"
                )));
            }
            v
        }
    };
    rows_per
        .into_iter()
        .map(|r| {
            r.checked_mul(row)
                .ok_or_else(|| Error::invalid("split size overflows"))
        })
        .collect()
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
    use crate::tensor::Tensor;
    use crate::testing::Case;
    use crate::testing::{concat, slice};

    impl Case {
        /// The all_to_all case (lists): rank `r` sends `a2a(r, j)` elements to rank `j` (uneven
        /// on purpose).
        pub(crate) fn all_to_all_request(&self, r: usize) -> Request {
            let w = self.size;
            Request::AllToAll {
                inputs: (0..w).map(|j| self.inp(r, j, self.a2a(r, j))).collect(),
                outputs: (0..w)
                    .map(|j| TensorSpec::new(&[self.a2a(j, r)], self.dtype))
                    .collect(),
            }
        }

        /// What rank `r` of the all_to_all case gets: entry `r` of every rank's list.
        pub(crate) fn all_to_all_expected(&self, r: usize) -> Output {
            Output::Tensors(
                (0..self.size)
                    .map(|j| self.inp(j, r, self.a2a(j, r)))
                    .collect(),
            )
        }

        /// The all_to_all_single case: the same sizes as the list form, as explicit splits.
        pub(crate) fn all_to_all_single_request(&self, r: usize) -> Request {
            let w = self.size;
            let input_splits: Vec<usize> = (0..w).map(|j| self.a2a(r, j)).collect();
            let output_splits: Vec<usize> = (0..w).map(|j| self.a2a(j, r)).collect();
            Request::AllToAllSingle {
                input: self.inp(r, 0, input_splits.iter().sum()),
                output: TensorSpec::new(&[output_splits.iter().sum()], self.dtype),
                output_splits: Some(output_splits),
                input_splits: Some(input_splits),
            }
        }

        /// What rank `r` of the all_to_all_single case gets: its split of every rank's input.
        pub(crate) fn all_to_all_single_expected(&self, r: usize) -> Output {
            let w = self.size;
            let parts: Vec<Tensor> = (0..w)
                .map(|j| {
                    let off: usize = (0..r).map(|k| self.a2a(j, k)).sum();
                    let total: usize = (0..w).map(|k| self.a2a(j, k)).sum();
                    slice(&self.inp(j, 0, total), off, self.a2a(j, r))
                })
                .collect();
            Output::Tensor(concat(&parts))
        }
    }
}
