//! Test cases shared by the simulator matrix, the actor tests and the benchmarks: for a
//! collective, a group size, a count, a dtype and an op, the request each rank makes and the
//! result each rank must get.
//!
//! Inputs depend on the rank and the element index and are chosen so that every reduction
//! order is exact in every dtype (small integers; 1s and 2s for products), so results can be
//! compared bit for bit with a sequential reference, f16 and bf16 included.

pub mod sim;

use crate::collective::{Output, Request, TensorSpec};
use crate::op::{Algorithm, OpKind};
use crate::tensor::dtype::DType;
use crate::tensor::reduce::{reference, ReduceOp};
use crate::tensor::Tensor;

/// One cell of the test matrix.
#[derive(Clone, Debug, PartialEq)]
pub struct Case {
    /// The collective.
    pub kind: OpKind,
    /// Group size.
    pub size: usize,
    /// Elements per rank (per block for list forms).
    pub count: usize,
    /// Element type.
    pub dtype: DType,
    /// Reduction (ignored by collectives that do not reduce).
    pub op: ReduceOp,
    /// Root (rooted collectives).
    pub root: usize,
    /// Algorithm to force, if any.
    pub algorithm: Option<Algorithm>,
}

/// The collectives the matrix covers.
pub const COLLECTIVES: [OpKind; 12] = [
    OpKind::AllReduce,
    OpKind::Reduce,
    OpKind::Broadcast,
    OpKind::AllGather,
    OpKind::AllGatherIntoTensor,
    OpKind::Gather,
    OpKind::Scatter,
    OpKind::ReduceScatter,
    OpKind::ReduceScatterTensor,
    OpKind::AllToAll,
    OpKind::AllToAllSingle,
    OpKind::Barrier,
];

/// Whether the collective reduces.
pub fn reduces(kind: OpKind) -> bool {
    matches!(
        kind,
        OpKind::AllReduce | OpKind::Reduce | OpKind::ReduceScatter | OpKind::ReduceScatterTensor
    )
}

/// Whether the collective has a root.
pub fn rooted(kind: OpKind) -> bool {
    matches!(
        kind,
        OpKind::Reduce | OpKind::Broadcast | OpKind::Gather | OpKind::Scatter
    )
}

/// A rank- and index-dependent input of `n` elements, exact under `op` in any order.
pub fn input(dtype: DType, op: ReduceOp, rank: usize, salt: usize, n: usize) -> Tensor {
    let v = |i: usize| -> f64 {
        let k = rank * 7 + salt * 13 + i * 3;
        match op {
            ReduceOp::Product => 1.0 + (k % 2) as f64,
            _ if dtype == DType::Bool => u8::from(k.is_multiple_of(3)) as f64,
            _ if matches!(dtype, DType::U8 | DType::U16 | DType::U32 | DType::U64) => {
                (k % 5) as f64
            }
            _ => (k % 5) as f64 - 2.0,
        }
    };
    macro_rules! make {
        ($t:ty) => {
            Tensor::from_vec(
                (0..n)
                    .map(|i| <$t as crate::Element>::from_f64(v(i)))
                    .collect::<Vec<$t>>(),
            )
        };
    }
    match dtype {
        DType::F16 => make!(crate::tensor::dtype::f16),
        DType::BF16 => make!(crate::tensor::dtype::bf16),
        DType::F32 => make!(f32),
        DType::F64 => make!(f64),
        DType::I8 => make!(i8),
        DType::U8 => make!(u8),
        DType::I32 => make!(i32),
        DType::I64 => make!(i64),
        DType::Bool => make!(bool),
        DType::I16 => make!(i16),
        DType::U16 => make!(u16),
        DType::U32 => make!(u32),
        DType::U64 => make!(u64),
    }
}

fn concat(ts: &[Tensor]) -> Tensor {
    let dtype = ts.first().map_or(DType::U8, Tensor::dtype);
    let mut v = Vec::new();
    for t in ts {
        v.extend_from_slice(t.bytes());
    }
    let n = v.len() / dtype.size();
    Tensor::from_bytes(bytes::Bytes::from(v), dtype, &[n]).unwrap_or_else(|_| Tensor::empty(dtype))
}

fn slice(t: &Tensor, from: usize, n: usize) -> Tensor {
    let s = t.dtype().size();
    Tensor::from_bytes(t.bytes().slice(from * s..(from + n) * s), t.dtype(), &[n])
        .unwrap_or_else(|_| Tensor::empty(t.dtype()))
}

impl Case {
    /// Elements rank `r` sends to rank `j` in the all-to-all cases (uneven on purpose).
    pub fn a2a(&self, r: usize, j: usize) -> usize {
        self.count + (r + 2 * j) % 3
    }

    /// Elements of block `j` in the list-form cases (uneven on purpose).
    pub fn block(&self, j: usize) -> usize {
        self.count + j % 2
    }

    fn inp(&self, r: usize, salt: usize, n: usize) -> Tensor {
        input(self.dtype, self.op, r, salt, n)
    }

    /// The request rank `r` makes.
    pub fn request(&self, r: usize) -> Request {
        let (w, n, dt, op, root) = (self.size, self.count, self.dtype, self.op, self.root);
        match self.kind {
            OpKind::AllReduce => Request::AllReduce {
                tensor: self.inp(r, 0, n),
                op,
            },
            OpKind::Reduce => Request::Reduce {
                tensor: self.inp(r, 0, n),
                root,
                op,
            },
            OpKind::Broadcast => Request::Broadcast {
                tensor: if r == root {
                    self.inp(r, 0, n)
                } else {
                    Tensor::zeros(&[n], dt).unwrap_or_else(|_| Tensor::empty(dt))
                },
                root,
            },
            OpKind::AllGather => Request::AllGather {
                input: self.inp(r, 0, self.block(r)),
                outputs: (0..w)
                    .map(|j| TensorSpec::new(&[self.block(j)], dt))
                    .collect(),
            },
            OpKind::AllGatherIntoTensor => Request::AllGatherIntoTensor {
                input: self.inp(r, 0, n),
                output: TensorSpec::new(&[w, n], dt),
            },
            OpKind::Gather => Request::Gather {
                input: self.inp(r, 0, n),
                root,
            },
            OpKind::Scatter => Request::Scatter {
                output: TensorSpec::new(&[n], dt),
                inputs: (r == root).then(|| (0..w).map(|j| self.inp(r, j, n)).collect()),
                root,
            },
            OpKind::ReduceScatter => Request::ReduceScatter {
                inputs: (0..w).map(|j| self.inp(r, j, self.block(j))).collect(),
                op,
            },
            OpKind::ReduceScatterTensor => Request::ReduceScatterTensor {
                input: self.inp(r, 0, n * w),
                output: TensorSpec::new(&[n], dt),
                op,
            },
            OpKind::AllToAll => Request::AllToAll {
                inputs: (0..w).map(|j| self.inp(r, j, self.a2a(r, j))).collect(),
                outputs: (0..w)
                    .map(|j| TensorSpec::new(&[self.a2a(j, r)], dt))
                    .collect(),
            },
            OpKind::AllToAllSingle => {
                let input_splits: Vec<usize> = (0..w).map(|j| self.a2a(r, j)).collect();
                let output_splits: Vec<usize> = (0..w).map(|j| self.a2a(j, r)).collect();
                Request::AllToAllSingle {
                    input: self.inp(r, 0, input_splits.iter().sum()),
                    output: TensorSpec::new(&[output_splits.iter().sum()], dt),
                    output_splits: Some(output_splits),
                    input_splits: Some(input_splits),
                }
            }
            _ => Request::Barrier,
        }
    }

    /// The result rank `r` must get.
    pub fn expected(&self, r: usize) -> Output {
        let (w, n, root) = (self.size, self.count, self.root);
        let red =
            |ts: Vec<Tensor>| reference(self.op, &ts).unwrap_or_else(|_| Tensor::empty(self.dtype));
        match self.kind {
            OpKind::AllReduce => Output::Tensor(red((0..w).map(|k| self.inp(k, 0, n)).collect())),
            OpKind::Reduce if r == root => {
                Output::Tensor(red((0..w).map(|k| self.inp(k, 0, n)).collect()))
            }
            OpKind::Reduce => Output::Tensor(self.inp(r, 0, n)),
            OpKind::Broadcast => Output::Tensor(self.inp(root, 0, n)),
            OpKind::AllGather => {
                Output::Tensors((0..w).map(|j| self.inp(j, 0, self.block(j))).collect())
            }
            OpKind::AllGatherIntoTensor => {
                let all = concat(&(0..w).map(|j| self.inp(j, 0, n)).collect::<Vec<_>>());
                Output::Tensor(
                    all.reshape(&[w, n])
                        .unwrap_or_else(|_| Tensor::empty(self.dtype)),
                )
            }
            OpKind::Gather if r == root => {
                Output::Tensors((0..w).map(|j| self.inp(j, 0, n)).collect())
            }
            OpKind::Gather => Output::None,
            OpKind::Scatter => Output::Tensor(self.inp(root, r, n)),
            OpKind::ReduceScatter => {
                Output::Tensor(red((0..w).map(|k| self.inp(k, r, self.block(r))).collect()))
            }
            OpKind::ReduceScatterTensor => Output::Tensor(slice(
                &red((0..w).map(|k| self.inp(k, 0, n * w)).collect()),
                r * n,
                n,
            )),
            OpKind::AllToAll => {
                Output::Tensors((0..w).map(|j| self.inp(j, r, self.a2a(j, r))).collect())
            }
            OpKind::AllToAllSingle => {
                let parts: Vec<Tensor> = (0..w)
                    .map(|j| {
                        let off: usize = (0..r).map(|k| self.a2a(j, k)).sum();
                        let total: usize = (0..w).map(|k| self.a2a(j, k)).sum();
                        slice(&self.inp(j, 0, total), off, self.a2a(j, r))
                    })
                    .collect();
                Output::Tensor(concat(&parts))
            }
            _ => Output::None,
        }
    }
}

/// The `k`-th call of rank `r` in the liveness tests' sequences, and its expected result:
/// collective `kind` (root 0, i32 sum), or send/recv from rank 0 to rank 1 for `None` (`None`
/// back for ranks that take no part). Sizes change from call to call (1, 2, 3 elements), so a
/// call matched with the wrong peer call shows as a mismatch.
pub fn sequence_call(
    kind: Option<OpKind>,
    size: usize,
    r: usize,
    k: u64,
) -> Option<(Request, Output)> {
    let count = 1 + (k % 3) as usize;
    match kind {
        Some(kind) => {
            let case = Case {
                kind,
                size,
                count,
                dtype: DType::I32,
                op: ReduceOp::Sum,
                root: 0,
                algorithm: None,
            };
            Some((case.request(r), case.expected(r)))
        }
        None => {
            let data = Tensor::from_vec(vec![k as i32; count]);
            match r {
                0 => Some((
                    Request::Send {
                        tensor: data,
                        dst: 1,
                        tag: 3,
                    },
                    Output::None,
                )),
                1 => Some((
                    Request::Recv {
                        spec: TensorSpec::new(&[count], DType::I32),
                        src: Some(0),
                        tag: 3,
                    },
                    Output::Received {
                        tensor: data,
                        src: 0,
                    },
                )),
                _ => None,
            }
        }
    }
}
