//! The executor of a device-local call: what each operation becomes on the GPU, enqueued
//! on the group's stream by the rank whose part completed the call's slot (`local.rs`).

use super::super::ffi::fold::{Fold, FoldKernels, Span, MAX_PTRS};
use super::super::launch::{as_output, sole_owner};
use super::super::plan::{Exchange, NcclOp, OutputLayout};
use super::super::pool::Pool;
use super::super::{cuda_err, storage_of};
use collectix_runtime::{DType, Error, OpKind, Output, ReduceOp, Result, Tensor, TensorSpec};
use cudarc::driver::{CudaSlice, CudaStream};
use std::ops::Range;
use std::sync::Arc;

/// Enqueues one call's work on the group's stream.
pub(super) struct Executor<'a> {
    pub(super) stream: &'a Arc<CudaStream>,
    pub(super) kernels: &'a FoldKernels,
    pub(super) pool: &'a Pool,
    pub(super) ordinal: u32,
    pub(super) dtype: DType,
    pub(super) size: usize,
}

/// Every rank's output, and the tensors to keep until the call completes.
pub(super) type Ran = Result<(Vec<Output>, Vec<Tensor>)>;

/// A tensor's bytes: its buffer and range (`None` when empty).
fn bytes_of(t: &Tensor) -> Result<Option<Span<'_>>> {
    Ok(storage_of(t)?
        .slice()
        .map(|(buf, range)| Span { buf, range }))
}

/// The bytes of every non-empty tensor of `ts`, in order.
fn spans(ts: &[Tensor]) -> Result<Vec<Span<'_>>> {
    ts.iter().filter_map(|t| bytes_of(t).transpose()).collect()
}

/// Every rank's operation, unpacked by `part`; an operation of another kind (which the
/// agreement step rules out) is an internal error naming `what`.
fn unpack<T>(ops: Vec<NcclOp>, what: &str, part: impl Fn(NcclOp) -> Option<T>) -> Result<Vec<T>> {
    ops.into_iter()
        .map(|o| {
            part(o).ok_or_else(|| Error::internal(format!("mixed operations in a local {what}")))
        })
        .collect()
}

/// Where an output goes: a buffer of the executor's, or an input written over.
enum Dest {
    Fresh(Option<CudaSlice<u8>>),
    Over(Tensor),
}

impl Executor<'_> {
    pub(super) fn run(&self, ops: Vec<NcclOp>) -> Ran {
        let mut it = ops.into_iter().peekable();
        let kind = match it.peek() {
            Some(NcclOp::AllReduce { .. }) => OpKind::AllReduce,
            Some(NcclOp::Reduce { .. }) => OpKind::Reduce,
            Some(NcclOp::Broadcast { .. }) => OpKind::Broadcast,
            Some(NcclOp::AllGather { .. }) => OpKind::AllGather,
            Some(NcclOp::ReduceScatter { .. }) => OpKind::ReduceScatter,
            Some(NcclOp::Exchange(_)) => OpKind::AllToAll,
            None => return Err(Error::internal("a local call with no parts")),
        };
        let ops: Vec<NcclOp> = it.collect();
        match kind {
            OpKind::AllReduce => self.all_reduce(ops),
            OpKind::Reduce => self.reduce(ops),
            OpKind::Broadcast => self.broadcast(ops),
            OpKind::AllGather => self.all_gather(ops),
            OpKind::ReduceScatter => self.reduce_scatter(ops),
            _ => self.exchange(ops),
        }
    }

    fn alloc(&self, bytes: usize) -> Result<Option<CudaSlice<u8>>> {
        self.pool.alloc(self.stream, bytes)
    }

    fn output(&self, buf: Option<CudaSlice<u8>>, layout: OutputLayout) -> Result<Output> {
        as_output(buf, self.ordinal, self.dtype, layout, self.pool.bin())
    }

    /// Copies bytes `from` of `src` to bytes `at..` of `dst`.
    fn copy(
        &self,
        src: &CudaSlice<u8>,
        from: Range<usize>,
        dst: &mut CudaSlice<u8>,
        at: usize,
    ) -> Result<()> {
        if from.is_empty() {
            return Ok(());
        }
        let len = from.len();
        if from.end > src.len() || at.checked_add(len).is_none_or(|e| e > dst.len()) {
            return Err(Error::internal("a local copy out of bounds"));
        }
        let mut d = dst.slice_mut(at..at + len);
        self.stream
            .memcpy_dtod(&src.slice(from), &mut d)
            .map_err(cuda_err("cuMemcpyDtoD"))
    }

    /// Folds `srcs` into `outs`, [`MAX_PTRS`] outputs a launch (a later launch reads the
    /// sources again, so outputs written over inputs must fit in one).
    fn fold(&self, op: ReduceOp, count: usize, srcs: &[Span<'_>], outs: &[Span<'_>]) -> Result<()> {
        for chunk in outs.chunks(MAX_PTRS) {
            let f = Fold {
                dtype: self.dtype,
                op,
                count,
                group_size: self.size,
                srcs,
                outs: chunk,
            };
            self.kernels.fold(self.stream, &f)?;
        }
        Ok(())
    }

    /// all_reduce: every input folded, in rank order, into every output (written over an
    /// input that only the call holds).
    fn all_reduce(&self, ops: Vec<NcclOp>) -> Ran {
        let parts = unpack(ops, "all_reduce", |o| match o {
            NcclOp::AllReduce { input, op } => Some((input, op)),
            _ => None,
        })?;
        let op = parts.first().map_or(ReduceOp::Sum, |p| p.1);
        let inputs: Vec<Tensor> = parts.into_iter().map(|p| p.0).collect();
        let count = inputs.first().map_or(0, Tensor::numel);
        let dests: Vec<Dest> = inputs
            .iter()
            .map(|t| {
                // Written over only when one launch writes every output (see `fold`).
                Ok(if sole_owner(t) && inputs.len() <= MAX_PTRS {
                    Dest::Over(t.clone())
                } else {
                    Dest::Fresh(self.alloc(t.nbytes())?)
                })
            })
            .collect::<Result<_>>()?;
        {
            let srcs = spans(&inputs)?;
            let outs = dests
                .iter()
                .filter_map(|d| match d {
                    Dest::Fresh(b) => b.as_ref().map(|buf| {
                        Ok(Span {
                            buf,
                            range: 0..buf.len(),
                        })
                    }),
                    Dest::Over(t) => bytes_of(t).transpose(),
                })
                .collect::<Result<Vec<_>>>()?;
            if count > 0 {
                self.fold(op, count, &srcs, &outs)?;
            }
        }
        let outputs = dests
            .into_iter()
            .zip(&inputs)
            .map(|(d, t)| match d {
                Dest::Over(t) => Ok(Output::Tensor(t)),
                Dest::Fresh(b) => self.output(b, OutputLayout::Whole(t.shape().to_vec())),
            })
            .collect::<Result<_>>()?;
        Ok((outputs, inputs))
    }

    /// reduce: the root's output is every input folded; the others get their input back.
    fn reduce(&self, ops: Vec<NcclOp>) -> Ran {
        let parts = unpack(ops, "reduce", |o| match o {
            NcclOp::Reduce { input, root, op } => Some((input, root, op)),
            _ => None,
        })?;
        let (root, op) = parts.first().map_or((0, ReduceOp::Sum), |p| (p.1, p.2));
        let inputs: Vec<Tensor> = parts.into_iter().map(|p| p.0).collect();
        let at_root = inputs
            .get(root)
            .ok_or_else(|| Error::internal("reduce root out of range"))?;
        let mut out = self.alloc(at_root.nbytes())?;
        if let Some(buf) = out.as_mut() {
            let srcs = spans(&inputs)?;
            let outs = vec![Span {
                range: 0..buf.len(),
                buf,
            }];
            self.fold(op, at_root.numel(), &srcs, &outs)?;
        }
        let shape = at_root.shape().to_vec();
        let mut root_out = Some(self.output(out, OutputLayout::Whole(shape))?);
        let outputs = inputs
            .iter()
            .enumerate()
            .map(|(r, t)| {
                if r == root {
                    root_out.take().unwrap_or(Output::None)
                } else {
                    Output::Tensor(t.clone())
                }
            })
            .collect();
        Ok((outputs, inputs))
    }

    /// broadcast: the root's input copied into a new buffer for every other rank; the root
    /// gets its input back.
    fn broadcast(&self, ops: Vec<NcclOp>) -> Ran {
        let parts = unpack(ops, "broadcast", |o| match o {
            NcclOp::Broadcast { input, root } => Some((input, root)),
            _ => None,
        })?;
        let root = parts.first().map_or(0, |p| p.1);
        let inputs: Vec<Tensor> = parts.into_iter().map(|p| p.0).collect();
        let src = inputs
            .get(root)
            .ok_or_else(|| Error::internal("broadcast root out of range"))?
            .clone();
        let from = bytes_of(&src)?;
        let mut outputs = Vec::with_capacity(inputs.len());
        for (r, t) in inputs.iter().enumerate() {
            if r == root {
                outputs.push(Output::Tensor(src.clone()));
                continue;
            }
            // A copy needs a buffer it may write: a fresh one (an input written over is
            // reached only through shared handles here, so it is copied into a new buffer).
            let mut out = self.alloc(t.nbytes())?;
            if let (Some(o), Some(Span { buf, range })) = (out.as_mut(), from.as_ref()) {
                if range.len() != o.len() {
                    return Err(Error::internal("broadcast sizes differ across ranks"));
                }
                self.copy(buf, range.clone(), o, 0)?;
            }
            outputs.push(self.output(out, OutputLayout::Whole(t.shape().to_vec()))?);
        }
        Ok((outputs, inputs))
    }

    /// all_gather of equal blocks: every rank's input copied into every rank's output at its
    /// offset.
    fn all_gather(&self, ops: Vec<NcclOp>) -> Ran {
        let parts = unpack(ops, "all_gather", |o| match o {
            NcclOp::AllGather { input, layout } => Some((input, layout)),
            _ => None,
        })?;
        let (inputs, layouts): (Vec<Tensor>, Vec<OutputLayout>) = parts.into_iter().unzip();
        let block = inputs.first().map_or(0, Tensor::nbytes);
        if inputs.iter().any(|t| t.nbytes() != block) {
            return Err(Error::internal("all_gather blocks differ across ranks"));
        }
        let total = block
            .checked_mul(inputs.len())
            .ok_or_else(|| Error::invalid("all_gather size overflows"))?;
        let mut outputs = Vec::with_capacity(inputs.len());
        for layout in layouts {
            let mut out = self.alloc(total)?;
            if let Some(o) = out.as_mut() {
                for (j, t) in inputs.iter().enumerate() {
                    if let Some(Span { buf, range }) = bytes_of(t)? {
                        self.copy(buf, range, o, j * block)?;
                    }
                }
            }
            outputs.push(self.output(out, layout)?);
        }
        Ok((outputs, inputs))
    }

    /// reduce_scatter: rank r's output is block r of every rank's input, folded in rank
    /// order. A list input's blocks are its tensors; one tensor's are equal slices of it.
    fn reduce_scatter(&self, ops: Vec<NcclOp>) -> Ran {
        let parts = unpack(ops, "reduce_scatter", |o| match o {
            NcclOp::ReduceScatter { inputs, shape, op } => Some((inputs, shape, op)),
            _ => None,
        })?;
        let op = parts.first().map_or(ReduceOp::Sum, |p| p.2);
        let (all, shapes): (Vec<Vec<Tensor>>, Vec<Vec<usize>>) =
            parts.into_iter().map(|p| (p.0, p.1)).unzip();
        let n = all.len();
        let esize = self.dtype.size();
        // A list's blocks may differ in size: rank r's output has the shape of block r (the
        // plan gives the first block's, which NCCL, refusing unequal blocks, relies on).
        let list = n > 1 && all.iter().all(|inputs| inputs.len() == n);
        let shapes: Vec<Vec<usize>> = if list {
            (0..n).map(|r| all[r][r].shape().to_vec()).collect()
        } else {
            shapes
        };
        let mut outputs = Vec::with_capacity(n);
        for (r, shape) in shapes.into_iter().enumerate() {
            let count = TensorSpec::new(&shape, self.dtype).numel()?;
            let bytes = count
                .checked_mul(esize)
                .ok_or_else(|| Error::invalid("reduce_scatter size overflows"))?;
            let mut out = self.alloc(bytes)?;
            if let Some(o) = out.as_mut() {
                let mut srcs = Vec::with_capacity(n);
                for inputs in &all {
                    let (t, range) = if list {
                        let t = &inputs[r];
                        (t, 0..t.nbytes())
                    } else {
                        let t = inputs
                            .first()
                            .ok_or_else(|| Error::internal("reduce_scatter without input"))?;
                        (t, r * bytes..(r + 1) * bytes)
                    };
                    let Span { buf, range: whole } = bytes_of(t)?
                        .ok_or_else(|| Error::internal("reduce_scatter block out of range"))?;
                    if range.end > whole.len() || range.len() != bytes {
                        return Err(Error::internal("reduce_scatter blocks differ across ranks"));
                    }
                    srcs.push(Span {
                        buf,
                        range: whole.start + range.start..whole.start + range.end,
                    });
                }
                let outs = vec![Span {
                    range: 0..o.len(),
                    buf: &*o,
                }];
                self.fold(op, count, &srcs, &outs)?;
            }
            outputs.push(self.output(out, OutputLayout::Whole(shape))?);
        }
        Ok((outputs, all.into_iter().flatten().collect()))
    }

    /// The exchanges: each rank's receives filled from the matching send of the peer (one
    /// per pair and call), its own parts copied locally.
    fn exchange(&self, ops: Vec<NcclOp>) -> Ran {
        let xs: Vec<Exchange> = unpack(ops, "exchange", |o| match o {
            NcclOp::Exchange(x) => Some(x),
            _ => None,
        })?;
        let mut outs = Vec::with_capacity(xs.len());
        for (r, x) in xs.iter().enumerate() {
            let mut out = self.alloc(x.out_bytes)?;
            if let Some(o) = out.as_mut() {
                for (t, range, at) in &x.local {
                    if let Some(Span { buf, range: whole }) = bytes_of(t)? {
                        let from = whole.start + range.start..whole.start + range.end;
                        self.copy(buf, from, o, *at)?;
                    }
                }
                for (peer, into) in &x.recvs {
                    let theirs = xs
                        .get(*peer)
                        .and_then(|p| p.sends.iter().find(|(to, _, _)| *to == r))
                        .ok_or_else(|| {
                            Error::internal(format!(
                                "rank {r} receives from {peer}, which sends nothing to it"
                            ))
                        })?;
                    let (_, t, range) = theirs;
                    if range.len() != into.len() {
                        return Err(Error::internal(
                            "an exchange's send and receive differ in size",
                        ));
                    }
                    if let Some(Span { buf, range: whole }) = bytes_of(t)? {
                        let from = whole.start + range.start..whole.start + range.end;
                        self.copy(buf, from, o, into.start)?;
                    }
                }
            }
            outs.push(out);
        }
        let mut keep = Vec::new();
        let mut outputs = Vec::with_capacity(xs.len());
        for (x, out) in xs.into_iter().zip(outs) {
            outputs.push(self.output(out, x.layout)?);
            keep.extend(x.sends.into_iter().map(|(_, t, _)| t));
            keep.extend(x.local.into_iter().map(|(t, _, _)| t));
        }
        Ok((outputs, keep))
    }
}
