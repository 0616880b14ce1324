//! Coalesced calls: many tensors moved as **one** call (torch's `all_reduce_coalesced`,
//! `_coalescing_manager`, FSDP's flat parameters), so one schedule moves them all and each
//! step sends one message per peer, not one per tensor.
//!
//! [`coalesce`] lays the tensors out in one flat input (a copy, into recycled memory) and
//! returns the one [`Request`] that moves it, with the [`Run`]s that put each tensor's part of
//! the flat output into its own buffer ([`Destination::with_runs`](super::Destination::with_runs)):
//!
//! - all_reduce: inputs end to end; output i is input i's span.
//! - all_gather_into_tensor: inputs end to end (N elements); the gathered output is W blocks
//!   of N, rank by rank, and output i (W × nᵢ) takes input i's span of every block.
//! - reduce_scatter_tensor: each input (W × mᵢ) is cut into W blocks; block r of the flat input
//!   holds block r of every input, end to end, so rank r's output (Σ mᵢ) holds every input's
//!   block r, and output i is its span.
//!
//! The ranks' calls agree when their flat calls do: the fingerprint carries the total, not the
//! list (as torch checks neither).

use super::{Request, Run, TensorSpec};
use crate::error::{Error, Result};
use crate::tensor::dtype::DType;
use crate::tensor::pool::Pool;
use crate::tensor::reduce::ReduceOp;
use crate::tensor::Tensor;

/// Which collective a coalesced call is.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Coalescing {
    /// `all_reduce` of each tensor.
    AllReduce(ReduceOp),
    /// `all_gather_into_tensor` of each tensor (output i: W × input i).
    AllGatherIntoTensor,
    /// `reduce_scatter_tensor` of each tensor (input i: W × output i).
    ReduceScatterTensor(ReduceOp),
}

/// A coalesced call, ready to issue.
#[derive(Debug)]
pub struct Coalesced {
    /// The one call.
    pub request: Request,
    /// Where each output's elements go (buffer i: output i).
    pub runs: Vec<Run>,
    /// The elements of each output.
    pub outputs: Vec<usize>,
}

/// The one call that moves `inputs` (the bytes of host tensors of `dtype`, at least one) as
/// `kind` over a group of `w` ranks; its flat input is written into memory from `pool`.
pub fn coalesce(
    kind: Coalescing,
    dtype: DType,
    inputs: &[&[u8]],
    w: usize,
    pool: &Pool,
) -> Result<Coalesced> {
    let size = dtype.size();
    if inputs.is_empty() {
        return Err(Error::invalid("a coalesced call of no tensors"));
    }
    if let Some(i) = inputs.iter().position(|b| b.len() % size != 0) {
        return Err(Error::invalid(format!(
            "tensor {i} of a coalesced call is not a whole number of {dtype} elements"
        )));
    }
    let counts: Vec<usize> = inputs.iter().map(|b| b.len() / size).collect();
    let total: usize = counts.iter().sum();
    let w = w.max(1);
    let mut flat = pool.take(total * size);
    let mut runs = Vec::with_capacity(inputs.len() * w);
    let (request, outputs) = match kind {
        Coalescing::AllReduce(_) | Coalescing::AllGatherIntoTensor => {
            let mut at = 0;
            let dst = flat.bytes_mut();
            for b in inputs {
                dst[at..at + b.len()].copy_from_slice(b);
                at += b.len();
            }
            let tensor = Tensor::from_bytes(flat.freeze(), dtype, &[total])?;
            match kind {
                Coalescing::AllReduce(op) => {
                    let mut at = 0;
                    for (i, &n) in counts.iter().enumerate() {
                        runs.push(Run {
                            at,
                            len: n,
                            buffer: i,
                            offset: 0,
                        });
                        at += n;
                    }
                    (Request::AllReduce { tensor, op }, counts.clone())
                }
                _ => {
                    for r in 0..w {
                        let mut at = r * total;
                        for (i, &n) in counts.iter().enumerate() {
                            runs.push(Run {
                                at,
                                len: n,
                                buffer: i,
                                offset: r * n,
                            });
                            at += n;
                        }
                    }
                    let request = Request::AllGatherIntoTensor {
                        input: tensor,
                        output: TensorSpec::new(&[w * total], dtype),
                    };
                    (request, counts.iter().map(|n| n * w).collect())
                }
            }
        }
        Coalescing::ReduceScatterTensor(op) => {
            if let Some(i) = counts.iter().position(|n| n % w != 0) {
                return Err(Error::invalid(format!(
                    "tensor {i} of a coalesced reduce_scatter_tensor has {} elements, which do not split into {w} blocks",
                    counts[i]
                )));
            }
            let blocks: Vec<usize> = counts.iter().map(|n| n / w).collect();
            let per_rank: usize = blocks.iter().sum();
            let dst = flat.bytes_mut();
            let mut at = 0;
            for r in 0..w {
                for (b, &m) in inputs.iter().zip(&blocks) {
                    let src = &b[r * m * size..(r + 1) * m * size];
                    dst[at..at + src.len()].copy_from_slice(src);
                    at += src.len();
                }
            }
            let mut at = 0;
            for (i, &m) in blocks.iter().enumerate() {
                runs.push(Run {
                    at,
                    len: m,
                    buffer: i,
                    offset: 0,
                });
                at += m;
            }
            let request = Request::ReduceScatterTensor {
                input: Tensor::from_bytes(flat.freeze(), dtype, &[total])?,
                output: TensorSpec::new(&[per_rank], dtype),
                op,
            };
            (request, blocks)
        }
    };
    Ok(Coalesced {
        request,
        runs,
        outputs,
    })
}
