//! CUDA memory and the NCCL path (the `cuda` feature).
//!
//! - [`CudaStorage`]: a tensor's bytes in device memory (a cudarc `CudaSlice<u8>`, shared,
//!   with an offset so that a gathered buffer can be handed back as per-rank views).
//! - `plan.rs`: each collective as NCCL runs it (checks, fingerprint, `NcclOp`);
//!   `local.rs`: the same operations run by the ranks of one process on one GPU, with device
//!   copies and a reduction kernel (`kernels/fold.cu`), without NCCL;
//!   `launch.rs`: enqueueing an operation, one function per kind; `pool.rs`: where outputs
//!   come from (collectix's own memory pool, and a bin of outputs given back for reuse);
//!   `worker`: the device worker thread, which owns a group's (or a lane's) NCCL
//!   communicator and completes a call when its CUDA event fires. The NCCL backend (`backend/nccl.rs`) drives them.
//! - `ffi/`: the audited FFI (libnccl, and the CUDA driver calls cudarc marks unsafe): the
//!   only code of the crate allowed `unsafe`.
//! - [`nccl`]: the library, loaded with a search of our own (see `docs/gpu.md`).

/// cudarc, the CUDA driver binding collectix uses (for [`wrap`] and [`CudaStorage::slice`]).
pub use cudarc;

mod ffi;
mod launch;
pub(crate) mod local;
mod plan;
mod pool;
pub(crate) mod worker;

pub use ffi::nccl;
pub(crate) use local::LocalHub;
pub(crate) use plan::{plan, Exchange, NcclOp, OutputLayout, Runner};

use collectix_runtime::{DType, Device, DeviceError, DeviceStorage, Error, Result, Tensor};
use cudarc::driver::{CudaContext, CudaSlice, DriverError};
use std::sync::Arc;

/// A driver error as collectix's.
pub(crate) fn cuda_err(call: &str) -> impl FnOnce(DriverError) -> Error + '_ {
    move |e| {
        DeviceError::Cuda {
            call: call.into(),
            detail: format!("{e:?}"),
        }
        .into()
    }
}

/// The number of CUDA devices, or why none can be used (never panics: the driver library's
/// presence is checked before cudarc touches it).
pub fn device_count() -> Result<u32> {
    if !ffi::driver::culib_present() {
        return Err(DeviceError::LibraryMissing {
            library: "cuda".into(),
            tried: cudarc::get_lib_name_candidates("cuda"),
            hint:
                "install the NVIDIA driver (libcuda.so.1) or put its directory on LD_LIBRARY_PATH"
                    .into(),
        }
        .into());
    }
    let n = CudaContext::device_count().map_err(cuda_err("cuDeviceGetCount"))?;
    Ok(n.max(0) as u32)
}

/// The primary context of device `ordinal`, bound to the calling thread.
pub(crate) fn context(ordinal: u32) -> Result<Arc<CudaContext>> {
    let count = device_count()?;
    if ordinal >= count {
        return Err(DeviceError::NoDevice { ordinal, count }.into());
    }
    CudaContext::new(ordinal as usize).map_err(cuda_err("cuDevicePrimaryCtxRetain"))
}

/// Keeps memory freed by device tensors in device `ordinal`'s default memory pool instead of
/// handing it back to the driver at every synchronisation (sets the pool's release threshold
/// to the maximum, as CuPy and JAX do). Collectives return new tensors, so a loop of
/// out-of-place calls frees and allocates an output each time; with the default threshold
/// (0) each allocation maps fresh memory. This is a setting of the device for the whole
/// process, so collectix never makes it on its own.
pub fn retain_freed_memory(ordinal: u32) -> Result<()> {
    let ctx = context(ordinal)?;
    ffi::driver::retain_pool_memory(&ctx)
}

/// A tensor's bytes in CUDA memory: `len` bytes at `offset` of a shared allocation (none for
/// an empty tensor).
pub struct CudaStorage {
    buf: Option<Arc<CudaSlice<u8>>>,
    offset: usize,
    len: usize,
    ordinal: u32,
    /// For a call's output: the bin of the pool it came from, where the buffer goes back when
    /// its last handle goes (see `pool.rs`).
    home: Option<Arc<pool::Bin>>,
}

impl CudaStorage {
    /// Storage over all of `buf`.
    pub fn new(buf: CudaSlice<u8>) -> CudaStorage {
        let (len, ordinal) = (buf.len(), buf.ordinal() as u32);
        CudaStorage {
            buf: Some(Arc::new(buf)),
            offset: 0,
            len,
            ordinal,
            home: None,
        }
    }

    /// `len` bytes at `offset` of `buf` (checked), an output whose buffer goes back to `home`
    /// when its last handle goes.
    pub(crate) fn view(
        buf: &Arc<CudaSlice<u8>>,
        offset: usize,
        len: usize,
        home: Option<&Arc<pool::Bin>>,
    ) -> Result<CudaStorage> {
        if offset.checked_add(len).is_none_or(|end| end > buf.len()) {
            return Err(Error::internal("device view out of bounds"));
        }
        Ok(CudaStorage {
            buf: Some(buf.clone()),
            offset,
            len,
            ordinal: buf.ordinal() as u32,
            home: home.cloned(),
        })
    }

    /// Empty storage on `ordinal`.
    pub(crate) fn empty(ordinal: u32) -> CudaStorage {
        CudaStorage {
            buf: None,
            offset: 0,
            len: 0,
            ordinal,
            home: None,
        }
    }

    /// The allocation and the byte range of this tensor in it (`None` when empty). For
    /// interoperation: launch kernels on the bytes, hand them to other libraries.
    pub fn slice(&self) -> Option<(&Arc<CudaSlice<u8>>, std::ops::Range<usize>)> {
        self.buf
            .as_ref()
            .map(|b| (b, self.offset..self.offset + self.len))
    }

    /// A copy of the bytes in host memory (waits for the work that writes them).
    pub(crate) fn download(&self) -> Result<bytes::Bytes> {
        let Some((buf, range)) = self.slice() else {
            return Ok(bytes::Bytes::new());
        };
        let stream = buf.stream();
        let v = stream
            .clone_dtoh(&buf.slice(range))
            .map_err(cuda_err("cuMemcpyDtoH"))?;
        stream
            .synchronize()
            .map_err(cuda_err("cuStreamSynchronize"))?;
        Ok(bytes::Bytes::from(v))
    }
}

impl Drop for CudaStorage {
    fn drop(&mut self) {
        // The last handle on an output's buffer puts it back in its pool's bin (whoever
        // holds a clone of the `Arc` from `slice()` keeps it, and the driver frees it then).
        if let (Some(home), Some(buf)) = (self.home.take(), self.buf.take()) {
            if let Some(buf) = Arc::into_inner(buf) {
                home.give(buf);
            }
        }
    }
}

impl DeviceStorage for CudaStorage {
    fn device(&self) -> Device {
        Device::Cuda(self.ordinal)
    }
    fn nbytes(&self) -> usize {
        self.len
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// Wraps a CUDA allocation (for example one a kernel of yours wrote) as a tensor, without
/// copying it. Fails when its size does not match `dtype` and `shape`.
pub fn wrap(buf: CudaSlice<u8>, dtype: DType, shape: &[usize]) -> Result<Tensor> {
    Tensor::from_device_storage(Arc::new(CudaStorage::new(buf)), dtype, shape)
}

/// The CUDA storage of `t`, or an error naming what it is instead.
pub(crate) fn storage_of(t: &Tensor) -> Result<&CudaStorage> {
    t.device_storage()
        .and_then(|s| s.as_any().downcast_ref::<CudaStorage>())
        .ok_or_else(|| {
            Error::invalid(format!(
                "the NCCL path needs CUDA memory; this tensor is on {} in storage of another kind",
                t.device()
            ))
        })
}

/// `host` copied to CUDA device `ordinal`.
pub(crate) fn upload(host: &Tensor, ordinal: u32) -> Result<Tensor> {
    let storage = if host.nbytes() == 0 {
        CudaStorage::empty(ordinal)
    } else {
        let ctx = context(ordinal)?;
        let stream = ctx.default_stream();
        let buf = stream
            .clone_htod(host.bytes().as_ref())
            .map_err(cuda_err("cuMemcpyHtoD"))?;
        stream
            .synchronize()
            .map_err(cuda_err("cuStreamSynchronize"))?;
        CudaStorage::new(buf)
    };
    Tensor::from_device_storage(Arc::new(storage), host.dtype(), host.shape())
}
