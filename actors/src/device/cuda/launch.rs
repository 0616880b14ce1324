//! Enqueueing an [`NcclOp`] on the communicator's stream, one function per kind of
//! operation, through the safe NCCL calls of [`Enqueue`]: each returns the call's output
//! (valid once the stream reaches the event the worker records next) and the inputs, which
//! the worker keeps until then.

use super::nccl::{Comm, DevMem, Enqueue, RedOp};
use super::plan::{red_op, Exchange, NcclOp, OutputLayout};
use super::pool::{Bin, Pool};
use super::{cuda_err, storage_of, CudaStorage};
use collectix_runtime::{DType, Output, Result, Tensor, TensorSpec};
use cudarc::driver::{CudaSlice, CudaStream};
use std::ops::Range;
use std::sync::Arc;

/// What a launch gives back: the output, and the tensors to keep until the call completes.
type Launched = Result<(Output, Vec<Tensor>)>;

impl NcclOp {
    /// Enqueues the operation on `stream` through `comm` (on the worker thread, with the
    /// device's context bound) as rank `rank` of the communicator.
    pub(crate) fn launch(
        self,
        comm: &Comm,
        stream: &Arc<CudaStream>,
        pool: &Pool,
        ordinal: u32,
        dtype: DType,
        rank: usize,
    ) -> Launched {
        let l = Launch {
            q: Enqueue::new(comm, stream, dtype)?,
            stream,
            pool,
            ordinal,
        };
        match self {
            NcclOp::AllReduce { input, op } => {
                let op = red_op(op, dtype)?;
                if sole_owner(&input) {
                    l.all_reduce_in_place(input, &op)
                } else if comm.size() == 1 {
                    l.all_reduce_alone(input, &op)
                } else {
                    l.all_reduce(input, &op)
                }
            }
            NcclOp::Reduce { input, root, op } => {
                l.reduce(input, root, &red_op(op, dtype)?, rank == root)
            }
            NcclOp::Broadcast { input, root } if sole_owner(&input) => {
                l.broadcast_in_place(input, root)
            }
            NcclOp::Broadcast { input, root } => l.broadcast(input, root),
            NcclOp::AllGather { input, layout } => l.all_gather(input, layout),
            NcclOp::ReduceScatter { inputs, shape, op } => {
                l.reduce_scatter(inputs, shape, &red_op(op, dtype)?)
            }
            NcclOp::Exchange(x) => l.exchange(x),
        }
    }
}

/// One launch: the safe NCCL calls, and where outputs are allocated.
struct Launch<'c> {
    q: Enqueue<'c>,
    stream: &'c Arc<CudaStream>,
    /// Where outputs (and staging buffers) come from.
    pool: &'c Pool,
    ordinal: u32,
}

impl Launch<'_> {
    /// The device memory of `t` (none for an empty tensor), read or written by the call.
    fn mem<'t>(&'t self, t: &'t Tensor) -> Result<DevMem<'t>> {
        match storage_of(t)?.slice() {
            None => Ok(DevMem::empty()),
            Some((buf, range)) => DevMem::of(buf, range, self.stream),
        }
    }

    /// A fresh output buffer of `bytes` bytes (none for 0), from the group's pool.
    fn alloc(&self, bytes: usize) -> Result<Option<CudaSlice<u8>>> {
        self.pool.alloc(self.stream, bytes)
    }

    /// `buf` as the call's output, laid out as `layout`.
    fn output(&self, buf: Option<CudaSlice<u8>>, layout: OutputLayout) -> Result<Output> {
        as_output(buf, self.ordinal, self.q.dtype, layout, self.pool.bin())
    }

    /// all_reduce written over its input, which nobody else holds (`sole_owner`): the result
    /// is handed out only after the call's event, so writing in place is unseen.
    fn all_reduce_in_place(&self, input: Tensor, op: &RedOp) -> Launched {
        let m = self.mem(&input)?;
        self.q.all_reduce(&m, &m, input.numel(), op)?;
        drop(m);
        Ok((Output::Tensor(input.clone()), vec![input]))
    }

    /// all_reduce on one rank: the result is the input (scaled, for premul_sum). The copy
    /// engine copies twice as fast as NCCL's one-rank kernel (docs/gpu.md), so copy, then
    /// let NCCL apply the op in place.
    fn all_reduce_alone(&self, input: Tensor, op: &RedOp) -> Launched {
        let mut out = self.alloc(input.nbytes())?;
        if let (Some(o), Some((buf, range))) = (out.as_mut(), storage_of(&input)?.slice()) {
            self.stream
                .memcpy_dtod(&buf.slice(range), o)
                .map_err(cuda_err("cuMemcpyDtoD"))?;
            let m = DevMem::of_mut(o, self.stream)?;
            self.q.all_reduce(&m, &m, input.numel(), op)?;
        }
        let shape = input.shape().to_vec();
        Ok((self.output(out, OutputLayout::Whole(shape))?, vec![input]))
    }

    /// all_reduce into a new buffer.
    fn all_reduce(&self, input: Tensor, op: &RedOp) -> Launched {
        let mut out = self.alloc(input.nbytes())?;
        {
            let src = self.mem(&input)?;
            if let Some(o) = out.as_mut() {
                let dst = DevMem::of_mut(o, self.stream)?;
                self.q.all_reduce(&src, &dst, input.numel(), op)?;
            }
        }
        let shape = input.shape().to_vec();
        Ok((self.output(out, OutputLayout::Whole(shape))?, vec![input]))
    }

    /// reduce: the root gets the reduction in a new buffer; every other rank gets its input
    /// back unchanged, as on the host path.
    fn reduce(&self, input: Tensor, root: usize, op: &RedOp, is_root: bool) -> Launched {
        let mut out = if is_root {
            self.alloc(input.nbytes())?
        } else {
            None
        };
        {
            let src = self.mem(&input)?;
            if input.nbytes() > 0 {
                let dst = out
                    .as_mut()
                    .map(|o| DevMem::of_mut(o, self.stream))
                    .transpose()?;
                self.q.reduce(&src, dst.as_ref(), input.numel(), op, root)?;
            }
        }
        if is_root {
            let shape = input.shape().to_vec();
            Ok((self.output(out, OutputLayout::Whole(shape))?, vec![input]))
        } else {
            Ok((Output::Tensor(input.clone()), vec![input]))
        }
    }

    /// broadcast written over its input, which nobody else holds (as the in-place
    /// all_reduce).
    fn broadcast_in_place(&self, input: Tensor, root: usize) -> Launched {
        let m = self.mem(&input)?;
        self.q.broadcast(&m, &m, input.numel(), root)?;
        drop(m);
        Ok((Output::Tensor(input.clone()), vec![input]))
    }

    /// broadcast into a new buffer (the input is read on the root only).
    fn broadcast(&self, input: Tensor, root: usize) -> Launched {
        let mut out = self.alloc(input.nbytes())?;
        {
            let src = self.mem(&input)?;
            if let Some(o) = out.as_mut() {
                let dst = DevMem::of_mut(o, self.stream)?;
                self.q.broadcast(&src, &dst, input.numel(), root)?;
            }
        }
        let shape = input.shape().to_vec();
        Ok((self.output(out, OutputLayout::Whole(shape))?, vec![input]))
    }

    /// all_gather of equal blocks into one buffer, handed back whole or split per rank.
    fn all_gather(&self, input: Tensor, layout: OutputLayout) -> Launched {
        let dtype = self.q.dtype;
        let total = match &layout {
            OutputLayout::Whole(s) => TensorSpec::new(s, dtype)
                .numel()?
                .saturating_mul(dtype.size()),
            OutputLayout::Split(parts) => parts.len().saturating_mul(input.nbytes()),
            OutputLayout::Nothing => 0,
        };
        let mut out = self.alloc(total)?;
        {
            let src = self.mem(&input)?;
            if let (Some(o), true) = (out.as_mut(), input.nbytes() > 0) {
                let dst = DevMem::of_mut(o, self.stream)?;
                self.q.all_gather(&src, &dst, input.numel())?;
            }
        }
        Ok((self.output(out, layout)?, vec![input]))
    }

    /// reduce_scatter: a list of inputs is copied into one buffer first (NCCL reads one).
    fn reduce_scatter(&self, inputs: Vec<Tensor>, shape: Vec<usize>, op: &RedOp) -> Launched {
        let dtype = self.q.dtype;
        let n_out = TensorSpec::new(&shape, dtype).numel()?;
        let block = n_out * dtype.size();
        if inputs.len() > 1 && inputs.iter().any(|t| t.nbytes() != block) {
            return Err(collectix_runtime::DeviceError::Unsupported(
                "reduce_scatter with inputs of different sizes".into(),
            )
            .into());
        }
        let mut out = self.alloc(block)?;
        if inputs.len() > 1 {
            let in_bytes: usize = inputs.iter().map(Tensor::nbytes).sum();
            if let Some(mut staged) = self.alloc(in_bytes)? {
                self.stage(&inputs, &mut staged)?;
                if let Some(o) = out.as_mut() {
                    let src = DevMem::of(&staged, 0..staged.len(), self.stream)?;
                    let dst = DevMem::of_mut(o, self.stream)?;
                    self.q.reduce_scatter(&src, &dst, n_out, op)?;
                }
                // `staged` is freed in stream order, after the reduce-scatter read it.
            }
        } else if let (Some(o), Some(t)) = (out.as_mut(), inputs.first()) {
            let src = self.mem(t)?;
            let dst = DevMem::of_mut(o, self.stream)?;
            self.q.reduce_scatter(&src, &dst, n_out, op)?;
        }
        Ok((self.output(out, OutputLayout::Whole(shape))?, inputs))
    }

    /// Copies `inputs`, one after another, into `staged`.
    fn stage(&self, inputs: &[Tensor], staged: &mut CudaSlice<u8>) -> Result<()> {
        let mut at = 0usize;
        for t in inputs {
            if let Some((buf, range)) = storage_of(t)?.slice() {
                let len = range.len();
                let mut dst = staged.slice_mut(at..at + len);
                self.stream
                    .memcpy_dtod(&buf.slice(range), &mut dst)
                    .map_err(cuda_err("cuMemcpyDtoD"))?;
                at += len;
            }
        }
        Ok(())
    }

    /// Grouped sends and receives into one output buffer, this rank's own parts copied in.
    fn exchange(&self, x: Exchange) -> Launched {
        let Exchange {
            sends,
            recvs,
            local,
            out_bytes,
            layout,
        } = x;
        let mut out = self.alloc(out_bytes)?;
        if let Some(o) = out.as_mut() {
            self.copy_local(&local, o)?;
        }
        {
            let sending: Vec<(usize, DevMem<'_>, &Range<usize>)> = sends
                .iter()
                .map(|(peer, t, range)| Ok((*peer, self.mem(t)?, range)))
                .collect::<Result<_>>()?;
            let into = match out.as_mut() {
                Some(o) => DevMem::of_mut(o, self.stream)?,
                None => DevMem::empty(),
            };
            self.q.comm.grouped(|| {
                for (peer, m, range) in &sending {
                    if !range.is_empty() {
                        self.q.send(m, (*range).clone(), *peer)?;
                    }
                }
                for (peer, r) in &recvs {
                    if !r.is_empty() {
                        self.q.recv(&into, r.clone(), *peer)?;
                    }
                }
                Ok(())
            })?;
        }
        let mut keep: Vec<Tensor> = sends.into_iter().map(|(_, t, _)| t).collect();
        keep.extend(local.into_iter().map(|(t, _, _)| t));
        Ok((self.output(out, layout)?, keep))
    }

    /// Copies this rank's own parts into the output: bytes `range` of each tensor, at its
    /// offset.
    fn copy_local(
        &self,
        local: &[(Tensor, Range<usize>, usize)],
        out: &mut CudaSlice<u8>,
    ) -> Result<()> {
        for (t, range, at) in local {
            if let Some((buf, r)) = storage_of(t)?.slice() {
                let src = buf.slice(r.start + range.start..r.start + range.end);
                let mut dst = out.slice_mut(*at..*at + range.len());
                self.stream
                    .memcpy_dtod(&src, &mut dst)
                    .map_err(cuda_err("cuMemcpyDtoD"))?;
            }
        }
        Ok(())
    }
}

/// The output of a call: `buf` viewed as `layout` says, going back to `home` when its last
/// handle goes.
pub(crate) fn as_output(
    buf: Option<CudaSlice<u8>>,
    ordinal: u32,
    dtype: DType,
    layout: OutputLayout,
    home: &Arc<Bin>,
) -> Result<Output> {
    let buf = buf.map(Arc::new);
    let tensor = |offset: usize, shape: &[usize]| -> Result<Tensor> {
        let bytes = TensorSpec::new(shape, dtype)
            .numel()?
            .saturating_mul(dtype.size());
        let storage = match &buf {
            Some(b) if bytes > 0 => CudaStorage::view(b, offset, bytes, Some(home))?,
            _ => CudaStorage::empty(ordinal),
        };
        Tensor::from_device_storage(Arc::new(storage), dtype, shape)
    };
    Ok(match layout {
        OutputLayout::Nothing => Output::None,
        OutputLayout::Whole(shape) => Output::Tensor(tensor(0, &shape)?),
        OutputLayout::Split(parts) => Output::Tensors(
            parts
                .iter()
                .map(|(o, s)| tensor(*o, s))
                .collect::<Result<_>>()?,
        ),
    })
}

/// Whether the call holds the only handle on all of `t`'s CUDA allocation: then its result
/// may be written over it (NCCL in place, as torch always does) without anyone seeing the
/// change — the caller moved the tensor in and kept no clone. Saves a buffer and, on a
/// world of one, a full copy.
pub(crate) fn sole_owner(t: &Tensor) -> bool {
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
