//! One collective as the bench drives it: nccl-tests' byte conventions, the request each rank
//! makes, and the expected output computed here with plain arithmetic (not with collectix's
//! kernels), so that `#wrong` checks the library independently.
//!
//! Inputs are small integers, unique per rank and element (`value`), so every sum, min, max
//! and product is exact in every dtype for worlds of up to 8 ranks (bf16 holds integers up to
//! 256 exactly); averages are compared with a tolerance of the dtype's precision.

use collectix::runtime::collective::{Output, Request};
use collectix::runtime::tensor::dtype::{bf16, f16};
use collectix::runtime::tensor::pages;
use collectix::{DType, Device, OpKind, ReduceOp, Result, Tensor, TensorDeviceExt, TensorSpec};

/// The collectives `collectix bench` measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub(crate) enum Collective {
    AllReduce,
    Broadcast,
    Reduce,
    AllGather,
    ReduceScatter,
    Gather,
    Scatter,
    AllToAll,
    SendRecv,
    Barrier,
}

impl Collective {
    /// nccl-tests' bus-bandwidth factor for a world of `w` (the runtime's, per collective).
    pub(crate) fn busbw_factor(self, w: usize) -> f64 {
        let kind = match self {
            Collective::AllReduce => OpKind::AllReduce,
            Collective::Broadcast => OpKind::Broadcast,
            Collective::Reduce => OpKind::Reduce,
            Collective::AllGather => OpKind::AllGather,
            Collective::ReduceScatter => OpKind::ReduceScatter,
            Collective::Gather => OpKind::Gather,
            Collective::Scatter => OpKind::Scatter,
            Collective::AllToAll => OpKind::AllToAll,
            Collective::SendRecv => OpKind::Send,
            Collective::Barrier => OpKind::Barrier,
        };
        collectix::runtime::collective::busbw_factor(kind, w)
    }

    /// The name, as `--collective` takes it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Collective::AllReduce => "all_reduce",
            Collective::Broadcast => "broadcast",
            Collective::Reduce => "reduce",
            Collective::AllGather => "all_gather",
            Collective::ReduceScatter => "reduce_scatter",
            Collective::Gather => "gather",
            Collective::Scatter => "scatter",
            Collective::AllToAll => "all_to_all",
            Collective::SendRecv => "send_recv",
            Collective::Barrier => "barrier",
        }
    }

    /// Whether the collective reduces (and so has an op).
    pub(crate) fn reduces(self) -> bool {
        matches!(
            self,
            Collective::AllReduce | Collective::Reduce | Collective::ReduceScatter
        )
    }

    /// Whether the size is split into one block per rank (it must divide).
    fn blocked(self) -> bool {
        matches!(
            self,
            Collective::AllGather
                | Collective::ReduceScatter
                | Collective::Gather
                | Collective::Scatter
                | Collective::AllToAll
        )
    }
}

/// A rank- and element-unique small integer, exact in every dtype once reduced over ≤ 8 ranks.
pub(crate) fn value(op: ReduceOp, rank: usize, i: usize) -> f64 {
    match op {
        // Products stay ≤ 2^8.
        ReduceOp::Product => (1 + (rank + i) % 2) as f64,
        _ => ((rank * 13 + i * 7) % 31) as f64,
    }
}

/// `vals` as a host tensor of `dtype`.
pub(crate) fn make(dtype: DType, vals: &[f64]) -> Tensor {
    match dtype {
        DType::F32 => filled(vals, |x| x as f32),
        DType::F64 => filled(vals, |x| x),
        DType::F16 => filled(vals, f16::from_f64),
        DType::BF16 => filled(vals, bf16::from_f64),
        DType::I32 => filled(vals, |x| x as i32),
        DType::I64 => filled(vals, |x| x as i64),
        DType::I8 => filled(vals, |x| x as i8),
        DType::U8 => filled(vals, |x| x as u8),
        DType::I16 => filled(vals, |x| x as i16),
        DType::U16 => filled(vals, |x| x as u16),
        DType::U32 => filled(vals, |x| x as u32),
        DType::U64 => filled(vals, |x| x as u64),
        _ => filled(vals, |x| x != 0.0),
    }
}

/// `vals` converted, in a vector on huge pages where it is large (as numpy's arrays are, which
/// the peers' benchmarks use: `collectix_runtime::tensor::pages`).
fn filled<T: collectix::Element>(vals: &[f64], f: impl Fn(f64) -> T) -> Tensor {
    let mut v = pages::filled(vals.len(), f(0.0));
    for (d, &x) in v.iter_mut().zip(vals) {
        *d = f(x);
    }
    Tensor::from_vec(v)
}

/// `op` over the ranks' values, in plain f64 arithmetic.
fn fold(op: ReduceOp, w: usize, f: impl Fn(usize) -> f64) -> f64 {
    let xs = (0..w).map(f);
    match op {
        ReduceOp::Sum => xs.sum(),
        ReduceOp::Product => xs.product(),
        ReduceOp::Min => xs.fold(f64::INFINITY, f64::min),
        ReduceOp::Max => xs.fold(f64::NEG_INFINITY, f64::max),
        ReduceOp::Avg => xs.sum::<f64>() / w as f64,
        ReduceOp::PremulSum(s) => xs.map(|x| x * s).sum(),
        _ => f64::NAN,
    }
}

/// One cell of a sweep: what every rank calls, and what it must get back.
pub(crate) struct Cell {
    pub(crate) coll: Collective,
    pub(crate) w: usize,
    /// Elements per rank as nccl-tests counts them (the full size for blocked collectives).
    pub(crate) count: usize,
    pub(crate) dtype: DType,
    pub(crate) op: ReduceOp,
    pub(crate) root: usize,
    pub(crate) device: Device,
    /// Device tensors are stand-ins (host memory posing as `device`).
    pub(crate) stand_in: bool,
}

impl Cell {
    /// The cell for `bytes`, or why that size is skipped.
    pub(crate) fn new(
        coll: Collective,
        w: usize,
        bytes: usize,
        dtype: DType,
        op: ReduceOp,
        root: usize,
        device: Device,
    ) -> std::result::Result<Cell, String> {
        let count = bytes / dtype.size();
        if count * dtype.size() != bytes {
            return Err(format!(
                "{bytes} B is not a whole number of {dtype} elements"
            ));
        }
        if coll.blocked() && !count.is_multiple_of(w) {
            return Err(format!(
                "{count} elements do not split into {w} equal blocks"
            ));
        }
        if coll == Collective::SendRecv && w < 2 {
            return Err("send_recv needs at least 2 ranks".into());
        }
        Ok(Cell {
            coll,
            w,
            count,
            dtype,
            op,
            root: root % w,
            device,
            stand_in: false,
        })
    }

    /// The same cell with its device tensors made as stand-ins (`--device standin`).
    pub(crate) fn with_stand_in(mut self, yes: bool) -> Cell {
        self.stand_in = yes;
        self
    }

    fn per(&self) -> usize {
        self.count / self.w
    }

    fn input(&self, r: usize, n: usize, offset: usize) -> Result<Tensor> {
        let vals: Vec<f64> = (0..n).map(|i| value(self.op, r, offset + i)).collect();
        let host = make(self.dtype, &vals);
        if self.stand_in {
            collectix::device::StandIn::tensor(&host, self.device)
        } else {
            host.to_device(self.device)
        }
    }

    fn spec(&self, n: usize) -> TensorSpec {
        TensorSpec::new(&[n], self.dtype).on(self.device)
    }

    /// The requests rank `r` makes for one call (send_recv makes two).
    pub(crate) fn requests(&self, r: usize) -> Result<Vec<Request>> {
        let (w, n, per, op, root) = (self.w, self.count, self.per(), self.op, self.root);
        Ok(vec![match self.coll {
            Collective::AllReduce => Request::AllReduce {
                tensor: self.input(r, n, 0)?,
                op,
            },
            Collective::Reduce => Request::Reduce {
                tensor: self.input(r, n, 0)?,
                root,
                op,
            },
            Collective::Broadcast => Request::Broadcast {
                tensor: self.input(r, n, 0)?,
                root,
            },
            Collective::AllGather => Request::AllGatherIntoTensor {
                input: self.input(r, per, 0)?,
                output: self.spec(n),
            },
            Collective::ReduceScatter => Request::ReduceScatterTensor {
                input: self.input(r, n, 0)?,
                output: self.spec(per),
                op,
            },
            Collective::Gather => Request::Gather {
                input: self.input(r, per, 0)?,
                root,
            },
            Collective::Scatter => Request::Scatter {
                output: self.spec(per),
                inputs: if r == root {
                    Some(
                        (0..w)
                            .map(|j| self.input(r, per, j * per))
                            .collect::<Result<_>>()?,
                    )
                } else {
                    None
                },
                root,
            },
            Collective::AllToAll => Request::AllToAllSingle {
                input: self.input(r, n, 0)?,
                output: self.spec(n),
                output_splits: None,
                input_splits: None,
            },
            Collective::SendRecv => {
                return Ok(vec![
                    Request::Send {
                        tensor: self.input(r, n, 0)?,
                        dst: (r + 1) % w,
                        tag: 0,
                    },
                    Request::Recv {
                        spec: self.spec(n),
                        src: Some((r + w - 1) % w),
                        tag: 0,
                    },
                ])
            }
            Collective::Barrier => Request::Barrier,
        }])
    }

    /// The values rank `r` must get, flattened (`None`: no output is checked).
    pub(crate) fn expected(&self, r: usize) -> Option<Vec<f64>> {
        let (w, n, per, op, root) = (self.w, self.count, self.per(), self.op, self.root);
        let red = |i: usize| fold(op, w, |q| value(op, q, i));
        Some(match self.coll {
            Collective::AllReduce => (0..n).map(red).collect(),
            Collective::Reduce if r == root => (0..n).map(red).collect(),
            Collective::Reduce => (0..n).map(|i| value(op, r, i)).collect(),
            Collective::Broadcast => (0..n).map(|i| value(op, root, i)).collect(),
            Collective::AllGather => (0..n).map(|k| value(op, k / per, k % per)).collect(),
            Collective::ReduceScatter => (0..per).map(|i| red(r * per + i)).collect(),
            Collective::Gather if r == root => {
                (0..n).map(|k| value(op, k / per, k % per)).collect()
            }
            Collective::Gather => Vec::new(),
            Collective::Scatter => (0..per).map(|i| value(op, root, r * per + i)).collect(),
            Collective::AllToAll => (0..n)
                .map(|k| value(op, k / per, r * per + k % per))
                .collect(),
            Collective::SendRecv => (0..n).map(|i| value(op, (r + w - 1) % w, i)).collect(),
            Collective::Barrier => return None,
        })
    }
}

/// Every value of an output, on the host, flattened.
pub(crate) fn flatten(outs: &[Output]) -> Result<Vec<f64>> {
    let mut v = Vec::new();
    let mut push = |t: &Tensor| -> Result<()> {
        v.extend(t.to_host()?.to_f64_vec());
        Ok(())
    };
    for o in outs {
        match o {
            Output::Tensor(t) | Output::Received { tensor: t, .. } => push(t)?,
            Output::Tensors(ts) => ts.iter().try_for_each(&mut push)?,
            _ => {}
        }
    }
    Ok(v)
}

/// How many elements of `got` differ from `want` (a missing or extra element counts as one).
/// Averages may round: they are compared within the dtype's precision.
pub(crate) fn count_wrong(got: &[f64], want: &[f64], op: ReduceOp, dtype: DType) -> usize {
    let tol = match (op, dtype) {
        (ReduceOp::Avg | ReduceOp::PremulSum(_), DType::F16 | DType::BF16) => 1.0 / 64.0,
        (ReduceOp::Avg | ReduceOp::PremulSum(_), DType::F32) => 1e-6,
        (ReduceOp::Avg | ReduceOp::PremulSum(_), DType::F64) => 1e-12,
        // Integer averages truncate or round, as torch's do: within one.
        (ReduceOp::Avg, _) => 1.0,
        _ => 0.0,
    };
    let off = got
        .iter()
        .zip(want)
        .filter(|(g, w)| (*g - *w).abs() > tol * w.abs().max(1.0))
        .count();
    off + got.len().abs_diff(want.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_planted_wrong_element_is_counted() {
        let cell = Cell::new(
            Collective::AllReduce,
            3,
            64,
            DType::F32,
            ReduceOp::Sum,
            0,
            Device::Host,
        );
        let cell = cell.unwrap_or_else(|e| panic!("{e}"));
        let want = cell.expected(1).unwrap_or_default();
        assert_eq!(count_wrong(&want, &want, ReduceOp::Sum, DType::F32), 0);
        let mut got = want.clone();
        got[5] += 1.0;
        assert_eq!(count_wrong(&got, &want, ReduceOp::Sum, DType::F32), 1);
        got.pop();
        assert_eq!(count_wrong(&got, &want, ReduceOp::Sum, DType::F32), 2);
    }

    #[test]
    fn sizes_that_do_not_divide_are_skipped_with_a_reason() {
        let c = Cell::new(
            Collective::AllGather,
            3,
            64,
            DType::F32,
            ReduceOp::Sum,
            0,
            Device::Host,
        );
        assert!(c.is_err_and(|e| e.contains("3 equal blocks")));
        let c = Cell::new(
            Collective::AllReduce,
            2,
            6,
            DType::F32,
            ReduceOp::Sum,
            0,
            Device::Host,
        );
        assert!(c.is_err());
    }

    #[test]
    fn the_expected_values_are_those_of_a_hand_computed_case() {
        // Two ranks, all_reduce sum of 2 elements: value(r, i) = (13r + 7i) % 31.
        let c = Cell::new(
            Collective::AllReduce,
            2,
            8,
            DType::F32,
            ReduceOp::Sum,
            0,
            Device::Host,
        );
        let want = c.ok().and_then(|c| c.expected(0));
        assert_eq!(want, Some(vec![13.0, 7.0 + 20.0]));
    }
}
