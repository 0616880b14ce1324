//! The safe face of NCCL's collectives: [`Enqueue`] takes checked spans of device memory
//! ([`DevMem`]) and never a raw pointer.

use super::comm::{nccl_dtype, Comm, RedOp};
use super::{AllReduce, RawStream};
use collectix_runtime::{DType, Error, Result};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, SyncOnDrop};
use std::ffi::c_int;
use std::ops::Range;

/// Calls enqueued on one stream through one communicator, on elements of one dtype: the safe
/// face of NCCL's collectives. Every address passed to NCCL is a checked span of a
/// [`DevMem`]; a span too short for the call is an error, never an out-of-bounds access.
///
/// Soundness rests on three things: the bounds (every span lies inside its allocation, and
/// holds what the call reads or writes), the device (every allocation is on the stream's
/// device, checked by [`DevMem`]), and lifetimes: the worker keeps a call's inputs and its
/// output until the call's completion event fires, and the buffers a launch allocates for
/// itself are allocated and freed in order on this stream, after the calls that use them.
pub(crate) struct Enqueue<'c> {
    /// The communicator.
    pub(crate) comm: &'c Comm,
    /// The stream the calls run on.
    pub(crate) stream: &'c CudaStream,
    /// The element type of the call's buffers.
    pub(crate) dtype: DType,
    /// `dtype` as NCCL names it.
    dt: c_int,
}

impl<'c> Enqueue<'c> {
    /// Calls on `stream` through `comm` on elements of `dtype`; fails at once for a dtype
    /// NCCL does not have, before anything is allocated or enqueued.
    pub(crate) fn new(comm: &'c Comm, stream: &'c CudaStream, dtype: DType) -> Result<Self> {
        Ok(Enqueue {
            comm,
            stream,
            dtype,
            dt: nccl_dtype(dtype)?,
        })
    }
}

impl Enqueue<'_> {
    /// `ncclAllReduce` of `count` elements from `send` into `recv` (the same memory for in
    /// place).
    pub(crate) fn all_reduce(
        &self,
        send: &DevMem<'_>,
        recv: &DevMem<'_>,
        count: usize,
        op: &RedOp,
    ) -> Result<()> {
        let need = self.bytes(count)?;
        let spans = Spans {
            send: send.span(0..need)?,
            recv: recv.span(0..need)?,
        };
        self.reduction(self.comm.nccl.all_reduce, spans, count, op, "ncclAllReduce")
    }

    /// `ncclReduceScatter`: `send` holds one block of `count` elements per rank; `recv` gets
    /// this rank's block reduced.
    pub(crate) fn reduce_scatter(
        &self,
        send: &DevMem<'_>,
        recv: &DevMem<'_>,
        count: usize,
        op: &RedOp,
    ) -> Result<()> {
        let need = self.bytes(count)?;
        let all = self.per_rank(need)?;
        let spans = Spans {
            send: send.span(0..all)?,
            recv: recv.span(0..need)?,
        };
        let f = self.comm.nccl.reduce_scatter;
        self.reduction(f, spans, count, op, "ncclReduceScatter")
    }

    /// An all_reduce-shaped call `f` (`ncclAllReduce`, `ncclReduceScatter`) on spans checked
    /// by the caller.
    fn reduction(
        &self,
        f: AllReduce,
        Spans { send, recv }: Spans,
        count: usize,
        op: &RedOp,
        call: &str,
    ) -> Result<()> {
        let c = self.comm;
        let dt = self.dt;
        let (o, made) = c.op(op, self.dtype)?;
        // SAFETY: `send` and `recv` are spans of device allocations on this stream's device
        // (checked by `DevMem`), checked above to hold what the call reads and writes
        // (`count` elements; one block per rank for a reduce-scatter's input), and alive
        // until the call completes (see the type's doc); `o` is a live op.
        let r = unsafe { f(send as _, recv as _, count, dt, o, c.raw, self.raw()) };
        c.drop_op(o, made);
        c.done(r, call)
    }

    /// `ncclReduce` of `count` elements to `root`; `recv` (the output) is written on the root
    /// only, and a rank that is not the root passes none.
    pub(crate) fn reduce(
        &self,
        send: &DevMem<'_>,
        recv: Option<&DevMem<'_>>,
        count: usize,
        op: &RedOp,
        root: usize,
    ) -> Result<()> {
        let c = self.comm;
        let need = self.bytes(count)?;
        let s = send.span(0..need)?;
        let r = match recv {
            Some(m) => m.span(0..need)?,
            None if root == c.rank => {
                return Err(Error::internal("ncclReduce: the root passed no output"))
            }
            None => 0,
        };
        let (dt, root) = (self.dt, c_rank(root, c.size)?);
        let (o, made) = c.op(op, self.dtype)?;
        // SAFETY: as for `reduction`; a non-root's output pointer is null, which NCCL never
        // writes (it writes the output on the root only).
        let r = unsafe { (c.nccl.reduce)(s as _, r as _, count, dt, o, root, c.raw, self.raw()) };
        c.drop_op(o, made);
        c.done(r, "ncclReduce")
    }

    /// `ncclBroadcast` of `count` elements from `root`'s `send` into every rank's `recv`.
    pub(crate) fn broadcast(
        &self,
        send: &DevMem<'_>,
        recv: &DevMem<'_>,
        count: usize,
        root: usize,
    ) -> Result<()> {
        let c = self.comm;
        let need = self.bytes(count)?;
        let (s, r) = (send.span(0..need)?, recv.span(0..need)?);
        let (dt, root) = (self.dt, c_rank(root, c.size)?);
        // SAFETY: as for `reduction` (`send` is read on the root only).
        let r = unsafe { (c.nccl.broadcast)(s as _, r as _, count, dt, root, c.raw, self.raw()) };
        c.done(r, "ncclBroadcast")
    }

    /// `ncclAllGather` of `count` elements per rank: `recv` gets every rank's, in rank order.
    pub(crate) fn all_gather(
        &self,
        send: &DevMem<'_>,
        recv: &DevMem<'_>,
        count: usize,
    ) -> Result<()> {
        let c = self.comm;
        let need = self.bytes(count)?;
        let all = self.per_rank(need)?;
        let (s, r) = (send.span(0..need)?, recv.span(0..all)?);
        let dt = self.dt;
        // SAFETY: as for `reduction`; `recv` holds one block per rank (checked above).
        let r = unsafe { (c.nccl.all_gather)(s as _, r as _, count, dt, c.raw, self.raw()) };
        c.done(r, "ncclAllGather")
    }

    /// `ncclSend` of bytes `range` of `mem` to `peer` (inside a
    /// [`grouped`](Comm::grouped) block, or alone).
    pub(crate) fn send(&self, mem: &DevMem<'_>, range: Range<usize>, peer: usize) -> Result<()> {
        self.point_to_point(true, mem, range, peer)
    }

    /// `ncclRecv` of `range.len()` bytes from `peer` into bytes `range` of `mem`.
    pub(crate) fn recv(&self, mem: &DevMem<'_>, range: Range<usize>, peer: usize) -> Result<()> {
        self.point_to_point(false, mem, range, peer)
    }

    /// `ncclSend` (`send`) or `ncclRecv` of bytes `range` of `mem`, with `peer`.
    fn point_to_point(
        &self,
        send: bool,
        mem: &DevMem<'_>,
        range: Range<usize>,
        peer: usize,
    ) -> Result<()> {
        let c = self.comm;
        let (bytes, p) = (range.len(), mem.span(range)?);
        let peer = c_rank(peer, c.size)?;
        // SAFETY: `p` spans `bytes` bytes of an allocation on this stream's device (checked
        // above and by `DevMem`), read by a send and written by a receive, alive until the
        // call completes (see the type's doc); `1` is ncclUint8.
        let r = unsafe {
            if send {
                (c.nccl.send)(p as _, bytes, 1, peer, c.raw, self.raw())
            } else {
                (c.nccl.recv)(p as _, bytes, 1, peer, c.raw, self.raw())
            }
        };
        c.done(r, if send { "ncclSend" } else { "ncclRecv" })
    }

    /// Bytes of `count` elements.
    fn bytes(&self, count: usize) -> Result<usize> {
        count
            .checked_mul(self.dtype.size())
            .ok_or_else(|| Error::invalid("element count overflows"))
    }

    /// `bytes` once per rank of the communicator.
    fn per_rank(&self, bytes: usize) -> Result<usize> {
        bytes
            .checked_mul(self.comm.size)
            .ok_or_else(|| Error::invalid("buffer size overflows"))
    }

    /// The raw stream NCCL enqueues on.
    fn raw(&self) -> RawStream {
        self.stream.cu_stream() as RawStream
    }
}

/// The device addresses of a call's input and output, checked against their buffers.
struct Spans {
    send: u64,
    recv: u64,
}

/// Device memory an NCCL call reads or writes: a span of a cudarc allocation, borrowed for as
/// long as this lives. Its guard records the call's use on the stream when it is dropped
/// (after the call is enqueued), so cudarc orders later users of the memory, and its free,
/// after the call. Every address handed to NCCL is a checked span of one of these.
pub(crate) struct DevMem<'a> {
    ptr: u64,
    len: usize,
    _guard: Option<SyncOnDrop<'a>>,
}

impl<'a> DevMem<'a> {
    /// Bytes `range` of `buf`, used by a call on `stream` (checked against its length).
    pub(crate) fn of(
        buf: &'a CudaSlice<u8>,
        range: Range<usize>,
        stream: &'a CudaStream,
    ) -> Result<DevMem<'a>> {
        if range.start > range.end || range.end > buf.len() {
            return Err(Error::internal("device range out of bounds"));
        }
        same_device(buf, stream)?;
        let (p, g) = buf.device_ptr(stream);
        Ok(DevMem {
            ptr: p + range.start as u64,
            len: range.len(),
            _guard: Some(g),
        })
    }

    /// All of `buf`, written by a call on `stream`.
    pub(crate) fn of_mut(buf: &'a mut CudaSlice<u8>, stream: &'a CudaStream) -> Result<DevMem<'a>> {
        same_device(buf, stream)?;
        let len = buf.len();
        let (p, g) = buf.device_ptr_mut(stream);
        Ok(DevMem {
            ptr: p,
            len,
            _guard: Some(g),
        })
    }

    /// No memory: an empty tensor's (only spans of no bytes can be taken of it).
    pub(crate) fn empty() -> DevMem<'static> {
        DevMem {
            ptr: 0,
            len: 0,
            _guard: None,
        }
    }

    /// The address of bytes `range`, checked to lie inside; an empty span is null.
    fn span(&self, range: Range<usize>) -> Result<u64> {
        if range.start > range.end || range.end > self.len {
            return Err(Error::internal(format!(
                "an NCCL call on bytes {range:?} of a buffer of {}",
                self.len
            )));
        }
        Ok(if range.is_empty() {
            0
        } else {
            self.ptr + range.start as u64
        })
    }
}

/// Checks that `buf` lives on `stream`'s device.
fn same_device(buf: &CudaSlice<u8>, stream: &CudaStream) -> Result<()> {
    let (theirs, ours) = (buf.ordinal(), stream.context().ordinal());
    if theirs != ours {
        return Err(Error::invalid(format!(
            "an NCCL call on cuda:{ours} with memory on cuda:{theirs}"
        )));
    }
    Ok(())
}

/// A rank as NCCL takes it, checked against the communicator's size.
fn c_rank(rank: usize, size: usize) -> Result<c_int> {
    if rank >= size {
        return Err(Error::invalid(format!(
            "rank {rank} is not in a communicator of {size}"
        )));
    }
    c_int::try_from(rank).map_err(|_| Error::invalid("rank too large for NCCL"))
}
