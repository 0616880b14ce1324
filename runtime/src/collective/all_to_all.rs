//! `all_to_all` (lists) and `all_to_all_single` (splits along dimension 0): rank r's block j goes to rank j (pairwise exchange).

use super::{fill, list_len, same_dtype, Assembly, Checked, Plan, Planner, TensorSpec};
use crate::algorithm::pairwise;
use crate::error::{Error, Result};
use crate::op::OpKind;
use crate::tensor::{numel_of, Tensor};
use bytes::Bytes;

/// A checked all_to_all call, the elements this rank sends to and receives from each rank,
/// and its input data.
type CheckedAllToAll<D> = (Checked, Vec<usize>, Vec<usize>, D);

// The spec: checks, sizes, fingerprint fields, output shape, busbw factor (the expected
// results for tests and benchmarks are in `case`, at the end).

impl Planner<'_> {
    /// Checks `all_to_all`; also gives the elements sent to and received from each rank, and
    /// the input list's data.
    pub(super) fn check_all_to_all(
        &self,
        inputs: Vec<Tensor>,
        outputs: Vec<TensorSpec>,
    ) -> Result<CheckedAllToAll<Vec<Bytes>>> {
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
        let checked = Checked {
            kind: OpKind::AllToAll,
            dtype: dt,
            count: None,
            root: None,
            op: None,
            bytes: 0,
            assembly: Assembly::Blocks(w..2 * w, outputs.into_iter().map(|o| o.shape).collect()),
        };
        let datas = inputs.into_iter().map(Tensor::into_bytes).collect();
        Ok((checked, send, recv, datas))
    }

    /// Checks `all_to_all_single`; also gives the elements sent to and received from each
    /// rank, and the input's data.
    pub(super) fn check_all_to_all_single(
        &self,
        input: Tensor,
        output: TensorSpec,
        output_splits: Option<Vec<usize>>,
        input_splits: Option<Vec<usize>>,
    ) -> Result<CheckedAllToAll<Bytes>> {
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
        let checked = Checked {
            kind: OpKind::AllToAllSingle,
            dtype: dt,
            count: None,
            root: None,
            op: None,
            bytes: 0,
            assembly: Assembly::Concat(w..2 * w, output.shape),
        };
        Ok((checked, send, recv, input.into_bytes()))
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

// Planning: the algorithm, its schedule and the initial chunks.

impl Planner<'_> {
    /// Plans `all_to_all`.
    pub(super) fn all_to_all(&self, inputs: Vec<Tensor>, outputs: Vec<TensorSpec>) -> Result<Plan> {
        let (w, me) = (self.w(), self.g.rank);
        let (checked, send, recv, datas) = self.check_all_to_all(inputs, outputs)?;
        let dt = checked.dtype;
        let alg = self.algorithm(checked.kind, checked.bytes)?;
        let s = pairwise::all_to_all(me, w, &send, &recv);
        let mut init = vec![None; s.layout.chunk_elems.len()];
        for (r, d) in datas.iter().enumerate() {
            fill(&mut init, &s.layout, r..r + 1, d, dt.size())?;
        }
        fill(
            &mut init,
            &s.layout,
            w + me..w + me + 1,
            &datas[me],
            dt.size(),
        )?;
        Ok(self.collective(checked, alg, s, init))
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
        let (checked, send, recv, data) =
            self.check_all_to_all_single(input, output, output_splits, input_splits)?;
        let dt = checked.dtype;
        let alg = self.algorithm(checked.kind, checked.bytes)?;
        let s = pairwise::all_to_all(me, w, &send, &recv);
        let mut init = vec![None; s.layout.chunk_elems.len()];
        fill(&mut init, &s.layout, 0..w, &data, dt.size())?;
        init[w + me] = init[me].clone();
        Ok(self.collective(checked, alg, s, init))
    }
}

/// The test and benchmark case of this collective: the request each rank makes and the
/// result it must get (inputs from [`input`](crate::collective::case::input), exact in every reduction order).
#[cfg(any(test, feature = "testing"))]
mod case {
    use crate::collective::case::Case;
    use crate::collective::case::{concat, slice};
    use crate::collective::{Output, Request, TensorSpec};
    use crate::tensor::Tensor;

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
