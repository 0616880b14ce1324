//! Where call outputs come from: collectix's own memory pool ([`OwnedPool`]) with a bin in
//! front of it, as torch's caching allocator keeps blocks: an output whose last handle goes
//! is put in the bin by whichever thread dropped it (a lock and a push, no driver call), and
//! the next output of the same size on the same stream takes it from there (no driver call
//! either, when collectix alone used it).
//!
//! Freeing a buffer through the driver (`cuMemFreeAsync`, and cudarc's two event waits and
//! two event destroys) from a user's thread while the group's worker drives the same stream
//! cost about 20 µs per output on an H200 (docs/gpu.md, 2026-11-28): a loop that drops each
//! result paid it on every call. Through the bin a buffer is reused in the order the driver
//! would have given: it was written and read only on its stream, or on other streams whose
//! uses cudarc recorded as events (a call's inputs are kept until the call ends), and taking
//! it from the bin makes the stream wait for those events, as the free did.
//!
//! The bin holds only buffers that were outputs alive at once, so it holds no more memory
//! than the pool's peak; an allocation that finds no buffer of its size first hands buffers
//! of other sizes back to the pool, which can then reuse their memory instead of growing.

use super::ffi::driver::OwnedPool;
use crate::sync::lock;
use collectix_runtime::Result;
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtrMut};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// A device's (or a group's) output memory: the pool, and the bin of buffers given back.
pub(crate) struct Pool {
    bin: Arc<Bin>,
    raw: OwnedPool,
}

impl Pool {
    /// A pool of device memory on `ctx`'s device, with an empty bin.
    pub(crate) fn new(ctx: &CudaContext) -> Result<Pool> {
        Ok(Pool {
            bin: Arc::new(Bin::default()),
            raw: OwnedPool::new(ctx)?,
        })
    }

    /// Where outputs of this pool go back when their last handle goes.
    pub(crate) fn bin(&self) -> &Arc<Bin> {
        &self.bin
    }

    /// A buffer of `bytes` bytes for `stream`'s next operation to write (none for 0): one from
    /// the bin of that size and stream, ordered after its earlier uses, or a fresh one from the
    /// pool (see [`OwnedPool::alloc`]). Its bytes are not initialised.
    pub(crate) fn alloc(
        &self,
        stream: &Arc<CudaStream>,
        bytes: usize,
    ) -> Result<Option<CudaSlice<u8>>> {
        if bytes == 0 {
            return Ok(None);
        }
        if let Some(mut buf) = self.bin.take(stream, bytes) {
            // The stream waits for the buffer's recorded reads and writes (on any stream), as
            // cudarc's free would have made it wait; the guard records this write to come.
            drop(buf.device_ptr_mut(stream));
            return Ok(Some(buf));
        }
        // Buffers of other sizes go back to the pool first (their frees are in their
        // streams' order), so that it can reuse their memory instead of growing.
        drop(self.bin.evict(bytes));
        self.raw.alloc(stream, bytes)
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        // What the bin holds is freed into the pool before the pool goes; outputs still alive
        // are freed by the driver when they go.
        drop(self.bin.close());
    }
}

/// The buffers given back to a [`Pool`], by stream and size; shared with every output the
/// pool made.
#[derive(Default)]
pub(crate) struct Bin {
    held: Mutex<Held>,
}

#[derive(Default)]
struct Held {
    /// By (stream, bytes).
    buffers: HashMap<(usize, usize), Vec<CudaSlice<u8>>>,
    /// Once the pool is gone, buffers given back are freed at once.
    closed: bool,
}

/// A stream's identity, for the bin's key.
fn stream_key(stream: &CudaStream) -> usize {
    stream.cu_stream() as usize
}

impl Bin {
    /// Takes `buf` back (from any thread), or frees it when the pool is gone.
    pub(crate) fn give(&self, buf: CudaSlice<u8>) {
        let mut held = lock(&self.held);
        if held.closed {
            drop(held);
            drop(buf);
            return;
        }
        let key = (stream_key(buf.stream()), buf.len());
        held.buffers.entry(key).or_default().push(buf);
    }

    /// A buffer of `bytes` bytes made on `stream`, if one was given back.
    fn take(&self, stream: &CudaStream, bytes: usize) -> Option<CudaSlice<u8>> {
        let mut held = lock(&self.held);
        let key = (stream_key(stream), bytes);
        let v = held.buffers.get_mut(&key)?;
        let buf = v.pop();
        if v.is_empty() {
            held.buffers.remove(&key);
        }
        buf
    }

    /// Buffers taken out of the bin, of at least `bytes` bytes in all (or all it holds), to
    /// be freed by the caller outside the lock.
    fn evict(&self, bytes: usize) -> Vec<CudaSlice<u8>> {
        let mut held = lock(&self.held);
        let mut out = Vec::new();
        let mut freed = 0usize;
        while freed < bytes {
            let Some(key) = held.buffers.keys().next().copied() else {
                break;
            };
            if let Some(v) = held.buffers.remove(&key) {
                freed = freed.saturating_add(v.iter().map(CudaSlice::len).sum());
                out.extend(v);
            }
        }
        out
    }

    /// Everything the bin holds, to be freed; later buffers given back are freed at once.
    fn close(&self) -> Vec<CudaSlice<u8>> {
        let mut held = lock(&self.held);
        held.closed = true;
        held.buffers.drain().flat_map(|(_, v)| v).collect()
    }
}
