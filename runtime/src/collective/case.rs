//! The test and benchmark case of a collective ([`Case`]): for a collective, a group size, a
//! count, a dtype and an op, the request each rank makes and the result each rank must get.
//! Each collective's own part (its request and expected result) is in its file beside this
//! one; [`crate::testing`] builds matrices of cases and re-exports these.
//!
//! Inputs depend on the rank and the element index and are chosen so that every reduction
//! order is exact in every dtype (small integers; 1s and 2s for products), so results can be
//! compared bit for bit with a sequential reference, f16 and bf16 included.

use crate::collective::{Output, Request};
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

/// The tensors' elements, one after another, as a 1-D tensor.
pub(crate) fn concat(ts: &[Tensor]) -> Tensor {
    let dtype = ts.first().map_or(DType::U8, Tensor::dtype);
    let mut v = Vec::new();
    for t in ts {
        v.extend_from_slice(t.bytes());
    }
    let n = v.len() / dtype.size();
    Tensor::from_bytes(bytes::Bytes::from(v), dtype, &[n]).unwrap_or_else(|_| Tensor::empty(dtype))
}

/// Elements `from..from + n` of `t`, as a 1-D tensor.
pub(crate) fn slice(t: &Tensor, from: usize, n: usize) -> Tensor {
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

    /// Rank `r`'s input number `salt` of `n` elements.
    pub(crate) fn inp(&self, r: usize, salt: usize, n: usize) -> Tensor {
        input(self.dtype, self.op, r, salt, n)
    }

    /// The request rank `r` makes (each collective's case is in its file in
    /// `collective/`).
    pub fn request(&self, r: usize) -> Request {
        match self.kind {
            OpKind::AllReduce => self.all_reduce_request(r),
            OpKind::Reduce => self.reduce_request(r),
            OpKind::Broadcast => self.broadcast_request(r),
            OpKind::AllGather => self.all_gather_request(r),
            OpKind::AllGatherIntoTensor => self.all_gather_into_tensor_request(r),
            OpKind::Gather => self.gather_request(r),
            OpKind::Scatter => self.scatter_request(r),
            OpKind::ReduceScatter => self.reduce_scatter_request(r),
            OpKind::ReduceScatterTensor => self.reduce_scatter_tensor_request(r),
            OpKind::AllToAll => self.all_to_all_request(r),
            OpKind::AllToAllSingle => self.all_to_all_single_request(r),
            _ => Request::Barrier,
        }
    }

    /// The result rank `r` must get.
    pub fn expected(&self, r: usize) -> Output {
        match self.kind {
            OpKind::AllReduce => self.all_reduce_expected(),
            OpKind::Reduce => self.reduce_expected(r),
            OpKind::Broadcast => self.broadcast_expected(),
            OpKind::AllGather => self.all_gather_expected(),
            OpKind::AllGatherIntoTensor => self.all_gather_into_tensor_expected(),
            OpKind::Gather => self.gather_expected(r),
            OpKind::Scatter => self.scatter_expected(r),
            OpKind::ReduceScatter => self.reduce_scatter_expected(r),
            OpKind::ReduceScatterTensor => self.reduce_scatter_tensor_expected(r),
            OpKind::AllToAll => self.all_to_all_expected(r),
            OpKind::AllToAllSingle => self.all_to_all_single_expected(r),
            _ => Output::None,
        }
    }

    /// The sequential reference reduction of `inputs` under the case's op.
    pub(crate) fn reduced(&self, inputs: impl Iterator<Item = Tensor>) -> Tensor {
        let ts: Vec<Tensor> = inputs.collect();
        reference(self.op, &ts).unwrap_or_else(|_| Tensor::empty(self.dtype))
    }
}
