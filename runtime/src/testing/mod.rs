//! What the tests and benchmarks share: the test [`Case`] of each collective (the request each
//! rank makes and the result it must get, defined beside the collectives), the matrices of
//! cases the multi-rank tests run, the deterministic simulator ([`sim`]) and its fault
//! scenarios ([`faults`]).

pub mod faults;
pub mod sim;

pub use crate::collective::case::{input, reduces, rooted, Case, COLLECTIVES};
use crate::collective::{Output, Request, TensorSpec};
use crate::op::{Algorithm, OpKind};
use crate::tensor::dtype::DType;
use crate::tensor::reduce::ReduceOp;
use crate::tensor::Tensor;

/// Where the large cells of [`matrix`] start counting: they have `LARGE` more elements.
const LARGE: usize = 40_000;

/// The matrix the multi-rank tests run over a real transport, for a world of `w` ranks:
/// every collective × every algorithm, with dtypes and ops that change from cell to cell
/// (f32 sum, i64 max, bf16 sum, i32 product), roots that move, each once small and once large
/// enough for received chunks to land in place ([`crate::landing`], outputs of 80 KiB and
/// more), and a last all_reduce of 4 MiB (with 1 KiB segments, thousands of messages: enough
/// to fill a link's queue).
pub fn matrix(w: usize) -> Vec<Case> {
    let mut out = Vec::new();
    for (i, kind) in COLLECTIVES.into_iter().enumerate().chain(
        COLLECTIVES
            .into_iter()
            .enumerate()
            .map(|(i, k)| (i + LARGE, k)),
    ) {
        for (j, &alg) in kind.algorithms().iter().enumerate() {
            let (dtype, op) = match (i + j) % 4 {
                0 => (DType::F32, ReduceOp::Sum),
                1 => (DType::I64, ReduceOp::Max),
                2 => (DType::BF16, ReduceOp::Sum),
                _ => (DType::I32, ReduceOp::Product),
            };
            out.push(Case {
                kind,
                size: w,
                count: 1000 + i,
                dtype,
                op: if reduces(kind) { op } else { ReduceOp::Sum },
                root: if rooted(kind) { (i + j) % w } else { 0 },
                algorithm: Some(alg),
            });
        }
    }
    out.push(Case {
        kind: OpKind::AllReduce,
        size: w,
        count: 1 << 20,
        dtype: DType::F32,
        op: ReduceOp::Sum,
        root: 0,
        algorithm: Some(Algorithm::Ring),
    });
    out
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
