//! Each collective as NCCL runs it: [`plan`] checks a call (torch's argument rules, plus
//! what NCCL cannot do) and gives its fingerprint; [`Op::launch`] enqueues it on the
//! communicator's stream and says what the output is.
//!
//! all_reduce, broadcast, reduce, all_gather (equal sizes), all_gather_into_tensor,
//! reduce_scatter and reduce_scatter_tensor map to their NCCL primitives; gather, scatter,
//! all_to_all, all_to_all_single and all_gather with unequal sizes are grouped
//! `ncclSend`/`ncclRecv`, as PyTorch builds them.

use super::nccl::{Comm, RawStream, RedOp};
use super::{cuda_err, storage_of, CudaStorage};
use collectix_runtime::{
    DType, DeviceError, Error, OpKind, Output, ReduceOp, Request, Result, Tensor, TensorSpec,
};
use collectix_runtime::{DataPath, Fingerprint};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, SyncOnDrop};
use std::ffi::c_int;
use std::ops::Range;
use std::sync::Arc;

/// `ncclDataType_t` for a dtype; bool travels as `ncclUint8` where nothing is reduced.
fn nccl_dtype(d: DType) -> Result<c_int> {
    Ok(match d {
        DType::I8 => 0,
        DType::U8 | DType::Bool => 1,
        DType::I32 => 2,
        DType::U32 => 3,
        DType::I64 => 4,
        DType::U64 => 5,
        DType::F16 => 6,
        DType::F32 => 7,
        DType::F64 => 8,
        DType::BF16 => 9,
        other => return Err(DeviceError::Unsupported(format!("NCCL has no {other}")).into()),
    })
}

/// The NCCL reduction for `op` on `dtype`, or why NCCL cannot do it.
fn red_op(op: ReduceOp, dtype: DType) -> Result<RedOp> {
    let unsupported = |why: String| Err(DeviceError::Unsupported(why).into());
    if dtype == DType::Bool {
        return unsupported(format!("NCCL has no bool reductions ({op} on bool)"));
    }
    Ok(match op {
        ReduceOp::Sum => RedOp::BuiltIn(0),
        ReduceOp::Product => RedOp::BuiltIn(1),
        ReduceOp::Max => RedOp::BuiltIn(2),
        ReduceOp::Min => RedOp::BuiltIn(3),
        ReduceOp::Avg if dtype.is_float() => RedOp::BuiltIn(4),
        ReduceOp::PremulSum(s) if dtype.is_float() => RedOp::PreMulSum(s),
        ReduceOp::Avg | ReduceOp::PremulSum(_) => {
            return unsupported(format!("{op} on {dtype} (NCCL averages floats only)"))
        }
        ReduceOp::BAnd | ReduceOp::BOr | ReduceOp::BXor => {
            return unsupported(format!("NCCL has no bitwise reductions ({op})"))
        }
        other => return unsupported(format!("{other}")),
    })
}

/// A pre-multiplied sum's scalar in the element type, as NCCL reads it.
fn scalar_bytes(op: &RedOp, dtype: DType) -> [u8; 8] {
    let mut out = [0u8; 8];
    if let RedOp::PreMulSum(s) = op {
        let b: Vec<u8> = match dtype {
            DType::F16 => collectix_runtime::tensor::dtype::f16::from_f64(*s)
                .to_le_bytes()
                .to_vec(),
            DType::BF16 => collectix_runtime::tensor::dtype::bf16::from_f64(*s)
                .to_le_bytes()
                .to_vec(),
            DType::F32 => (*s as f32).to_le_bytes().to_vec(),
            _ => s.to_le_bytes().to_vec(),
        };
        out[..b.len()].copy_from_slice(&b);
    }
    out
}

/// Where the received bytes of an exchange go and what the output is.
pub(crate) enum Finish {
    /// Nothing (gather on a non-root).
    Nothing,
    /// The whole buffer as one tensor of this shape.
    Whole(Vec<usize>),
    /// Views of the buffer: `(offset, shape)` each.
    Split(Vec<(usize, Vec<usize>)>),
}

/// A call as NCCL runs it.
pub(crate) enum Op {
    AllReduce {
        input: Tensor,
        op: RedOp,
    },
    Reduce {
        input: Tensor,
        root: usize,
        op: RedOp,
    },
    Broadcast {
        input: Tensor,
        root: usize,
    },
    /// `ncclAllGather` into one buffer, handed back whole or split per rank.
    AllGather {
        input: Tensor,
        finish: Finish,
    },
    /// `ncclReduceScatter`; a list of inputs is first copied into one buffer.
    ReduceScatter {
        inputs: Vec<Tensor>,
        shape: Vec<usize>,
        op: RedOp,
    },
    /// Grouped sends and receives into one output buffer.
    Exchange {
        /// `(peer, tensor, byte range of it)`.
        sends: Vec<(usize, Tensor, Range<usize>)>,
        /// `(peer, byte range of the output)`.
        recvs: Vec<(usize, Range<usize>)>,
        /// `(tensor, byte range of it, offset in the output)`: this rank's own part.
        local: Vec<(Tensor, Range<usize>, usize)>,
        out_bytes: usize,
        finish: Finish,
    },
}

/// The fingerprint of a call on the NCCL path (`count`: `None` where ranks' sizes may
/// differ; NCCL picks its own algorithm).
fn fingerprint(
    kind: OpKind,
    dtype: DType,
    count: impl Into<Option<u64>>,
    root: Option<usize>,
    op: Option<ReduceOp>,
) -> Fingerprint {
    Fingerprint {
        count: count.into(),
        root: root.map(|r| r as u32),
        op: op.map(ReduceOp::kind),
        scalar: op.map_or(0, ReduceOp::scalar_bits),
        path: DataPath::Nccl,
        ..Fingerprint::new(kind, dtype)
    }
}

fn check_root(root: usize, size: usize) -> Result<()> {
    if root >= size {
        return Err(Error::invalid(format!(
            "root {root} is not a rank of a group of {size}"
        )));
    }
    Ok(())
}

fn same(t: &Tensor, spec: &TensorSpec, what: &str) -> Result<()> {
    if t.dtype() != spec.dtype {
        return Err(Error::invalid(format!(
            "{what}: dtype {} where {} was given",
            spec.dtype,
            t.dtype()
        )));
    }
    Ok(())
}

fn spec_bytes(s: &TensorSpec) -> Result<usize> {
    s.numel()?
        .checked_mul(s.dtype.size())
        .ok_or_else(|| Error::invalid("output size overflows usize"))
}

/// Consecutive byte ranges of the given sizes, from 0.
fn ranges(sizes: &[usize]) -> Result<Vec<Range<usize>>> {
    let mut at = 0usize;
    sizes
        .iter()
        .map(|&n| {
            let r = at..at
                .checked_add(n)
                .ok_or_else(|| Error::invalid("sizes overflow"))?;
            at = r.end;
            Ok(r)
        })
        .collect()
}

/// An all-to-all shaped exchange: `pieces[p]` (a tensor and a byte range of it) goes to rank
/// `p`, and what rank `p` sends lands at `into[p]` of one output buffer of `out_bytes`; this
/// rank's own piece is copied locally (it must fit its slot).
fn exchange(
    what: &str,
    me: usize,
    pieces: Vec<(Tensor, Range<usize>)>,
    into: &[Range<usize>],
    out_bytes: usize,
    finish: Finish,
) -> Result<Op> {
    let mut sends = Vec::new();
    let mut recvs = Vec::new();
    let mut local = Vec::new();
    for (peer, (t, piece)) in pieces.into_iter().enumerate() {
        let slot = into.get(peer).cloned().unwrap_or(0..0);
        if peer == me {
            if piece.len() != slot.len() {
                return Err(Error::invalid(format!(
                    "{what}: this rank's own part and its output slot differ in size"
                )));
            }
            local.push((t, piece, slot.start));
        } else {
            sends.push((peer, t, piece));
            recvs.push((peer, slot));
        }
    }
    Ok(Op::Exchange {
        sends,
        recvs,
        local,
        out_bytes,
        finish,
    })
}

/// Checks `req` for NCCL on a group of `size` as rank `me`, and plans it.
pub(crate) fn plan(
    req: Request,
    me: usize,
    size: usize,
    _ordinal: u32,
) -> Result<(Op, Fingerprint)> {
    match req {
        Request::AllReduce { tensor, op } => {
            let fp = fingerprint(
                OpKind::AllReduce,
                tensor.dtype(),
                tensor.numel() as u64,
                None,
                Some(op),
            );
            let op = red_op(op, tensor.dtype())?;
            Ok((Op::AllReduce { input: tensor, op }, fp))
        }
        Request::Reduce { tensor, root, op } => {
            check_root(root, size)?;
            let fp = fingerprint(
                OpKind::Reduce,
                tensor.dtype(),
                tensor.numel() as u64,
                Some(root),
                Some(op),
            );
            let op = red_op(op, tensor.dtype())?;
            Ok((
                Op::Reduce {
                    input: tensor,
                    root,
                    op,
                },
                fp,
            ))
        }
        Request::Broadcast { tensor, root } => {
            check_root(root, size)?;
            let fp = fingerprint(
                OpKind::Broadcast,
                tensor.dtype(),
                tensor.numel() as u64,
                Some(root),
                None,
            );
            Ok((
                Op::Broadcast {
                    input: tensor,
                    root,
                },
                fp,
            ))
        }
        Request::AllGatherIntoTensor { input, output } => {
            same(&input, &output, "all_gather_into_tensor")?;
            if output.numel()? != input.numel().saturating_mul(size) {
                return Err(Error::invalid(format!(
                    "all_gather_into_tensor: output of {} elements for {size} inputs of {}",
                    output.numel()?,
                    input.numel()
                )));
            }
            let fp = fingerprint(
                OpKind::AllGatherIntoTensor,
                input.dtype(),
                input.numel() as u64,
                None,
                None,
            );
            Ok((
                Op::AllGather {
                    input,
                    finish: Finish::Whole(output.shape),
                },
                fp,
            ))
        }
        Request::AllGather { input, outputs } => {
            if outputs.len() != size {
                return Err(Error::invalid(format!(
                    "all_gather: {} output specs for a group of {size}",
                    outputs.len()
                )));
            }
            for o in &outputs {
                same(&input, o, "all_gather")?;
            }
            let own = outputs.get(me).map(TensorSpec::numel).transpose()?;
            if own != Some(input.numel()) {
                return Err(Error::invalid(
                    "all_gather: this rank's output spec does not match its input",
                ));
            }
            let bytes: Vec<usize> = outputs.iter().map(spec_bytes).collect::<Result<_>>()?;
            let fp = fingerprint(OpKind::AllGather, input.dtype(), None, None, None);
            let equal = bytes.iter().all(|&b| b == input.nbytes());
            let rs = ranges(&bytes)?;
            let finish = Finish::Split(
                rs.iter()
                    .zip(&outputs)
                    .map(|(r, o)| (r.start, o.shape.clone()))
                    .collect(),
            );
            if equal {
                return Ok((Op::AllGather { input, finish }, fp));
            }
            let whole = 0..input.nbytes();
            let pieces = vec![(input, whole); size];
            let out_bytes = rs.last().map_or(0, |r| r.end);
            Ok((
                exchange("all_gather", me, pieces, &rs, out_bytes, finish)?,
                fp,
            ))
        }
        Request::Gather { input, root } => {
            check_root(root, size)?;
            let fp = fingerprint(
                OpKind::Gather,
                input.dtype(),
                input.numel() as u64,
                Some(root),
                None,
            );
            let n = input.nbytes();
            let whole = 0..n;
            if me != root {
                let sends = vec![(root, input, whole)];
                return Ok((
                    Op::Exchange {
                        sends,
                        recvs: vec![],
                        local: vec![],
                        out_bytes: 0,
                        finish: Finish::Nothing,
                    },
                    fp,
                ));
            }
            let rs = ranges(&vec![n; size])?;
            let recvs = rs
                .iter()
                .enumerate()
                .filter(|(p, _)| *p != me)
                .map(|(p, r)| (p, r.clone()))
                .collect();
            let finish = Finish::Split(
                rs.iter()
                    .map(|r| (r.start, input.shape().to_vec()))
                    .collect(),
            );
            let local = vec![(input, whole, rs.get(me).map_or(0, |r| r.start))];
            Ok((
                Op::Exchange {
                    sends: vec![],
                    recvs,
                    local,
                    out_bytes: n.saturating_mul(size),
                    finish,
                },
                fp,
            ))
        }
        Request::Scatter {
            output,
            inputs,
            root,
        } => {
            check_root(root, size)?;
            let n = spec_bytes(&output)?;
            let fp = fingerprint(
                OpKind::Scatter,
                output.dtype,
                output.numel()? as u64,
                Some(root),
                None,
            );
            if me != root {
                let recvs = vec![(root, 0..n)];
                return Ok((
                    Op::Exchange {
                        sends: vec![],
                        recvs,
                        local: vec![],
                        out_bytes: n,
                        finish: Finish::Whole(output.shape),
                    },
                    fp,
                ));
            }
            let inputs = inputs
                .ok_or_else(|| Error::invalid("scatter: the root must pass a list of inputs"))?;
            if inputs.len() != size {
                return Err(Error::invalid(format!(
                    "scatter: {} inputs for a group of {size}",
                    inputs.len()
                )));
            }
            let mut sends = Vec::new();
            let mut local = Vec::new();
            for (peer, t) in inputs.into_iter().enumerate() {
                same(&t, &output, "scatter")?;
                if t.nbytes() != n {
                    return Err(Error::invalid(
                        "scatter: every input must have the output's size",
                    ));
                }
                if peer == me {
                    local.push((t, 0..n, 0));
                } else {
                    sends.push((peer, t, 0..n));
                }
            }
            Ok((
                Op::Exchange {
                    sends,
                    recvs: vec![],
                    local,
                    out_bytes: n,
                    finish: Finish::Whole(output.shape),
                },
                fp,
            ))
        }
        Request::ReduceScatter { inputs, op } => {
            if inputs.len() != size {
                return Err(Error::invalid(format!(
                    "reduce_scatter: {} inputs for a group of {size}",
                    inputs.len()
                )));
            }
            let first = inputs
                .first()
                .ok_or_else(|| Error::invalid("reduce_scatter: no inputs"))?;
            let (dtype, numel, shape) = (first.dtype(), first.numel(), first.shape().to_vec());
            if inputs
                .iter()
                .any(|t| t.dtype() != dtype || t.numel() != numel)
            {
                return Err(DeviceError::Unsupported(
                    "reduce_scatter with inputs of different sizes or dtypes".into(),
                )
                .into());
            }
            let fp = fingerprint(OpKind::ReduceScatter, dtype, numel as u64, None, Some(op));
            let op = red_op(op, dtype)?;
            Ok((Op::ReduceScatter { inputs, shape, op }, fp))
        }
        Request::ReduceScatterTensor { input, output, op } => {
            same(&input, &output, "reduce_scatter_tensor")?;
            if input.numel() != output.numel()?.saturating_mul(size) {
                return Err(Error::invalid(format!(
                    "reduce_scatter_tensor: input of {} elements for {size} outputs of {}",
                    input.numel(),
                    output.numel()?
                )));
            }
            let fp = fingerprint(
                OpKind::ReduceScatterTensor,
                input.dtype(),
                output.numel()? as u64,
                None,
                Some(op),
            );
            let op = red_op(op, input.dtype())?;
            Ok((
                Op::ReduceScatter {
                    inputs: vec![input],
                    shape: output.shape,
                    op,
                },
                fp,
            ))
        }
        Request::AllToAll { inputs, outputs } => {
            if inputs.len() != size || outputs.len() != size {
                return Err(Error::invalid(format!(
                    "all_to_all: {} inputs and {} outputs for a group of {size}",
                    inputs.len(),
                    outputs.len()
                )));
            }
            let dtype = inputs.first().map_or(DType::U8, Tensor::dtype);
            for (t, o) in inputs.iter().zip(&outputs) {
                same(t, o, "all_to_all")?;
                if t.dtype() != dtype {
                    return Err(Error::invalid("all_to_all: inputs of different dtypes"));
                }
            }
            let fp = fingerprint(OpKind::AllToAll, dtype, None, None, None);
            let bytes: Vec<usize> = outputs.iter().map(spec_bytes).collect::<Result<_>>()?;
            let rs = ranges(&bytes)?;
            let finish = Finish::Split(
                rs.iter()
                    .zip(&outputs)
                    .map(|(r, o)| (r.start, o.shape.clone()))
                    .collect(),
            );
            let out_bytes = rs.last().map_or(0, |r| r.end);
            let pieces = inputs
                .into_iter()
                .map(|t| {
                    let n = t.nbytes();
                    (t, 0..n)
                })
                .collect();
            Ok((
                exchange("all_to_all", me, pieces, &rs, out_bytes, finish)?,
                fp,
            ))
        }
        Request::AllToAllSingle {
            input,
            output,
            output_splits,
            input_splits,
        } => {
            same(&input, &output, "all_to_all_single")?;
            let row = |shape: &[usize]| -> Result<usize> {
                let inner: usize = shape
                    .iter()
                    .skip(1)
                    .try_fold(1usize, |a, &d| a.checked_mul(d))
                    .ok_or_else(|| Error::invalid("shape overflows"))?;
                inner
                    .checked_mul(input.dtype().size())
                    .ok_or_else(|| Error::invalid("shape overflows"))
            };
            let split = |shape: &[usize],
                         given: Option<Vec<usize>>,
                         what: &str|
             -> Result<Vec<usize>> {
                let rows = shape.first().copied().unwrap_or(1);
                let per = match given {
                    Some(s) => {
                        if s.len() != size
                            || s.iter().try_fold(0usize, |a, &x| a.checked_add(x)) != Some(rows)
                        {
                            return Err(Error::invalid(format!("all_to_all_single: {what} splits {s:?} do not cover {rows} rows in {size} parts")));
                        }
                        s
                    }
                    None => {
                        if rows % size != 0 {
                            return Err(Error::invalid(format!("all_to_all_single: {rows} {what} rows do not split evenly {size} ways")));
                        }
                        vec![rows / size; size]
                    }
                };
                let rb = row(shape)?;
                per.iter()
                    .map(|&r| {
                        r.checked_mul(rb)
                            .ok_or_else(|| Error::invalid("size overflows"))
                    })
                    .collect()
            };
            let ins = ranges(&split(input.shape(), input_splits, "input")?)?;
            let outs = ranges(&split(&output.shape, output_splits, "output")?)?;
            let fp = fingerprint(OpKind::AllToAllSingle, input.dtype(), None, None, None);
            let pieces = ins.into_iter().map(|i| (input.clone(), i)).collect();
            let out_bytes = spec_bytes(&output)?;
            let finish = Finish::Whole(output.shape);
            let op = exchange("all_to_all_single", me, pieces, &outs, out_bytes, finish)?;
            Ok((op, fp))
        }
        Request::Barrier | Request::NewGroup { .. } => {
            Err(Error::internal("a call without tensors on the NCCL path"))
        }
        Request::Send { .. } | Request::Recv { .. } => Err(Error::internal(
            "point-to-point device calls go through backend/p2p.rs",
        )),
        _ => Err(DeviceError::Unsupported("this call".into()).into()),
    }
}

/// Device pointers of the call's buffers, and the guards that record on `stream` when the
/// call has been enqueued (so later users of the memory wait for it).
struct Ptrs<'a> {
    guards: Vec<SyncOnDrop<'a>>,
}

impl<'a> Ptrs<'a> {
    fn read(&mut self, t: &'a Tensor, stream: &'a CudaStream) -> Result<u64> {
        let s = storage_of(t)?;
        match s.slice() {
            None => Ok(0),
            Some((buf, range)) => {
                let (p, g) = buf.device_ptr(stream);
                self.guards.push(g);
                Ok(p + range.start as u64)
            }
        }
    }
}

/// Whether the call holds the only handle on all of `t`'s CUDA allocation: then its result
/// may be written over it (NCCL in place, as torch always does) without anyone seeing the
/// change — the caller moved the tensor in and kept no clone. Saves a buffer and, on a
/// world of one, a full copy.
fn sole_owner(t: &Tensor) -> bool {
    let Some(arc) = t.device_storage() else {
        return false;
    };
    if Arc::strong_count(arc) != 1 || Arc::weak_count(arc) != 0 {
        return false;
    }
    match storage_of(t)
        .ok()
        .and_then(|s| s.buf.as_ref().map(|b| (b, s.offset, s.len)))
    {
        Some((b, 0, len)) => {
            Arc::strong_count(b) == 1 && Arc::weak_count(b) == 0 && len == b.len() && len > 0
        }
        _ => false,
    }
}

/// A fresh device buffer of `bytes` bytes (none for 0).
fn alloc(stream: &Arc<CudaStream>, bytes: usize) -> Result<Option<CudaSlice<u8>>> {
    if bytes == 0 {
        return Ok(None);
    }
    // SAFETY: the memory is uninitialised; every byte of it is written by the NCCL
    // operation (or copy) enqueued next on `stream` before anything can read it: readers
    // get it only as the output of a call whose completion event follows those writes.
    let b = unsafe { stream.alloc::<u8>(bytes) }.map_err(cuda_err("cuMemAlloc"))?;
    Ok(Some(b))
}

fn as_output(
    buf: Option<CudaSlice<u8>>,
    ordinal: u32,
    dtype: DType,
    finish: Finish,
) -> Result<Output> {
    let buf = buf.map(Arc::new);
    let tensor = |offset: usize, shape: &[usize]| -> Result<Tensor> {
        let bytes = collectix_runtime::collective::TensorSpec::new(shape, dtype)
            .numel()?
            .saturating_mul(dtype.size());
        let storage = match &buf {
            Some(b) if bytes > 0 => CudaStorage::view(b, offset, bytes)?,
            _ => CudaStorage::empty(ordinal),
        };
        Tensor::from_device_storage(Arc::new(storage), dtype, shape)
    };
    Ok(match finish {
        Finish::Nothing => Output::None,
        Finish::Whole(shape) => Output::Tensor(tensor(0, &shape)?),
        Finish::Split(parts) => Output::Tensors(
            parts
                .iter()
                .map(|(o, s)| tensor(*o, s))
                .collect::<Result<_>>()?,
        ),
    })
}

impl Op {
    /// Enqueues the operation on `stream` through `comm` (on the worker thread, with the
    /// device's context bound). Returns the output (valid once `stream` reaches the event
    /// recorded next) and the inputs, which must live until then.
    pub(crate) fn launch(
        self,
        comm: &Comm,
        stream: &Arc<CudaStream>,
        ordinal: u32,
        dtype: DType,
        rank: usize,
    ) -> Result<(Output, Vec<Tensor>)> {
        let raw: RawStream = stream.cu_stream() as RawStream;
        let dt = nccl_dtype(dtype)?;
        match self {
            Op::AllReduce { input, op } if sole_owner(&input) => {
                let mut ptrs = Ptrs { guards: Vec::new() };
                let p = ptrs.read(&input, stream)?;
                let mut sc = scalar_bytes(&op, dtype);
                // SAFETY: `p` holds `numel` elements on this device, kept alive until the
                // call's event fires; nobody else holds the memory (`sole_owner`), and the
                // result is handed out only after that event, so writing in place is unseen.
                unsafe { comm.all_reduce(p, p, input.numel(), dt, &op, &mut sc, raw, false) }?;
                drop(ptrs);
                Ok((Output::Tensor(input.clone()), vec![input]))
            }
            Op::AllReduce { input, op } if comm.size() == 1 => {
                // One rank: the result is the input (scaled, for premul_sum). The copy engine
                // copies twice as fast as NCCL's one-rank kernel (docs/gpu.md), so copy, then
                // let NCCL apply the op in place.
                let mut out = alloc(stream, input.nbytes())?;
                if let (Some(o), Some((buf, range))) = (out.as_mut(), storage_of(&input)?.slice()) {
                    stream
                        .memcpy_dtod(&buf.slice(range), o)
                        .map_err(cuda_err("cuMemcpyDtoD"))?;
                    let (p, g) = o.device_ptr_mut(stream);
                    let mut sc = scalar_bytes(&op, dtype);
                    // SAFETY: `p` holds `numel` elements on this device, returned as the
                    // output (alive until the event fires); in place is allowed by NCCL.
                    unsafe { comm.all_reduce(p, p, input.numel(), dt, &op, &mut sc, raw, false) }?;
                    drop(g);
                }
                let shape = input.shape().to_vec();
                Ok((
                    as_output(out, ordinal, dtype, Finish::Whole(shape))?,
                    vec![input],
                ))
            }
            Op::AllReduce { input, op } => {
                let mut ptrs = Ptrs { guards: Vec::new() };
                let mut out = alloc(stream, input.nbytes())?;
                let src = ptrs.read(&input, stream)?;
                if let Some(o) = out.as_mut() {
                    let (dst, g) = o.device_ptr_mut(stream);
                    let mut sc = scalar_bytes(&op, dtype);
                    // SAFETY: `src` and `dst` hold `numel` elements on this device and stay
                    // alive (inputs kept, output returned) until the call's event fires.
                    unsafe {
                        comm.all_reduce(src, dst, input.numel(), dt, &op, &mut sc, raw, false)
                    }?;
                    drop(g);
                }
                drop(ptrs);
                let shape = input.shape().to_vec();
                Ok((
                    as_output(out, ordinal, dtype, Finish::Whole(shape))?,
                    vec![input],
                ))
            }
            Op::Reduce { input, root, op } => {
                let mut ptrs = Ptrs { guards: Vec::new() };
                let src = ptrs.read(&input, stream)?;
                let mut out = if rank == root {
                    alloc(stream, input.nbytes())?
                } else {
                    None
                };
                let mut sc = scalar_bytes(&op, dtype);
                if input.nbytes() > 0 {
                    match out.as_mut() {
                        Some(o) => {
                            let (dst, g) = o.device_ptr_mut(stream);
                            // SAFETY: as for all_reduce; the root's output holds `numel` elements.
                            unsafe {
                                comm.reduce(
                                    src,
                                    dst,
                                    input.numel(),
                                    dt,
                                    &op,
                                    &mut sc,
                                    root as c_int,
                                    raw,
                                )
                            }?;
                            drop(g);
                        }
                        // SAFETY: as for all_reduce; non-roots pass no output (NCCL writes none).
                        None => unsafe {
                            comm.reduce(src, 0, input.numel(), dt, &op, &mut sc, root as c_int, raw)
                        }?,
                    }
                }
                drop(ptrs);
                if rank == root {
                    let shape = input.shape().to_vec();
                    Ok((
                        as_output(out, ordinal, dtype, Finish::Whole(shape))?,
                        vec![input],
                    ))
                } else {
                    // Like the host path: a non-root gets its input back unchanged.
                    Ok((Output::Tensor(input.clone()), vec![input]))
                }
            }
            Op::Broadcast { input, root } if sole_owner(&input) => {
                let mut ptrs = Ptrs { guards: Vec::new() };
                let p = ptrs.read(&input, stream)?;
                // SAFETY: as for the in-place all_reduce.
                unsafe { comm.broadcast(p, p, input.numel(), dt, root as c_int, raw) }?;
                drop(ptrs);
                Ok((Output::Tensor(input.clone()), vec![input]))
            }
            Op::Broadcast { input, root } => {
                let mut ptrs = Ptrs { guards: Vec::new() };
                let mut out = alloc(stream, input.nbytes())?;
                let src = ptrs.read(&input, stream)?;
                if let Some(o) = out.as_mut() {
                    let (dst, g) = o.device_ptr_mut(stream);
                    // SAFETY: as for all_reduce (`src` is read on the root only).
                    unsafe { comm.broadcast(src, dst, input.numel(), dt, root as c_int, raw) }?;
                    drop(g);
                }
                drop(ptrs);
                let shape = input.shape().to_vec();
                Ok((
                    as_output(out, ordinal, dtype, Finish::Whole(shape))?,
                    vec![input],
                ))
            }
            Op::AllGather { input, finish } => {
                let mut ptrs = Ptrs { guards: Vec::new() };
                let total = match &finish {
                    Finish::Whole(s) => TensorSpec::new(s, dtype)
                        .numel()?
                        .saturating_mul(dtype.size()),
                    Finish::Split(parts) => parts.len().saturating_mul(input.nbytes()),
                    Finish::Nothing => 0,
                };
                let mut out = alloc(stream, total)?;
                let src = ptrs.read(&input, stream)?;
                if let (Some(o), true) = (out.as_mut(), input.nbytes() > 0) {
                    let (dst, g) = o.device_ptr_mut(stream);
                    // SAFETY: `dst` holds size × numel elements (checked in `plan`).
                    unsafe { comm.all_gather(src, dst, input.numel(), dt, raw) }?;
                    drop(g);
                }
                drop(ptrs);
                Ok((as_output(out, ordinal, dtype, finish)?, vec![input]))
            }
            Op::ReduceScatter { inputs, shape, op } => {
                let mut ptrs = Ptrs { guards: Vec::new() };
                let n_out = TensorSpec::new(&shape, dtype).numel()?;
                let in_bytes: usize = inputs.iter().map(Tensor::nbytes).sum();
                // A list of inputs is copied into one buffer first (NCCL reads one).
                let staged = if inputs.len() > 1 {
                    alloc(stream, in_bytes)?
                } else {
                    None
                };
                let mut out = alloc(stream, n_out * dtype.size())?;
                if let Some(mut st) = staged {
                    let mut at = 0usize;
                    for t in &inputs {
                        if let Some((buf, range)) = storage_of(t)?.slice() {
                            let len = range.len();
                            let mut dst = st.slice_mut(at..at + len);
                            stream
                                .memcpy_dtod(&buf.slice(range), &mut dst)
                                .map_err(cuda_err("cuMemcpyDtoD"))?;
                            at += len;
                        }
                    }
                    if let Some(o) = out.as_mut() {
                        let (src, gs) = st.device_ptr(stream);
                        let (dst, g) = o.device_ptr_mut(stream);
                        let mut sc = scalar_bytes(&op, dtype);
                        // SAFETY: `src` holds size × n_out elements, `dst` n_out.
                        unsafe { comm.all_reduce(src, dst, n_out, dt, &op, &mut sc, raw, true) }?;
                        drop((g, gs));
                    }
                    // `st` is freed in stream order, after the reduce-scatter read it.
                    drop(st);
                } else if let (Some(o), Some(t)) = (out.as_mut(), inputs.first()) {
                    let src = ptrs.read(t, stream)?;
                    let (dst, g) = o.device_ptr_mut(stream);
                    let mut sc = scalar_bytes(&op, dtype);
                    // SAFETY: `src` holds size × n_out elements (checked in `plan`), `dst` n_out.
                    unsafe { comm.all_reduce(src, dst, n_out, dt, &op, &mut sc, raw, true) }?;
                    drop(g);
                }
                drop(ptrs);
                Ok((
                    as_output(out, ordinal, dtype, Finish::Whole(shape))?,
                    inputs,
                ))
            }
            Op::Exchange {
                sends,
                recvs,
                local,
                out_bytes,
                finish,
            } => {
                let mut ptrs = Ptrs { guards: Vec::new() };
                let mut out = alloc(stream, out_bytes)?;
                let mut keep = Vec::new();
                if let Some(o) = out.as_mut() {
                    for (t, range, at) in &local {
                        if let Some((buf, r)) = storage_of(t)?.slice() {
                            let src = buf.slice(r.start + range.start..r.start + range.end);
                            let mut dst = o.slice_mut(*at..*at + range.len());
                            stream
                                .memcpy_dtod(&src, &mut dst)
                                .map_err(cuda_err("cuMemcpyDtoD"))?;
                        }
                    }
                }
                let mut send_ptrs = Vec::new();
                for (peer, t, range) in &sends {
                    let p = ptrs.read(t, stream)?;
                    send_ptrs.push((*peer, p + range.start as u64, range.len()));
                }
                let base = match out.as_mut() {
                    Some(o) => {
                        let (p, g) = o.device_ptr_mut(stream);
                        Some((p, g))
                    }
                    None => None,
                };
                let dst0 = base.as_ref().map_or(0, |(p, _)| *p);
                comm.grouped(|| {
                    for (peer, p, len) in &send_ptrs {
                        if *len > 0 {
                            // SAFETY: `p` points at `len` bytes of a kept input tensor.
                            unsafe { comm.send(*p, *len, *peer as c_int, raw) }?;
                        }
                    }
                    for (peer, r) in &recvs {
                        if !r.is_empty() {
                            // SAFETY: the range lies inside the output buffer (from `plan`).
                            unsafe {
                                comm.recv(dst0 + r.start as u64, r.len(), *peer as c_int, raw)
                            }?;
                        }
                    }
                    Ok(())
                })?;
                drop(base);
                drop(ptrs);
                keep.extend(sends.into_iter().map(|(_, t, _)| t));
                keep.extend(local.into_iter().map(|(t, _, _)| t));
                Ok((as_output(out, ordinal, dtype, finish)?, keep))
            }
        }
    }
}
