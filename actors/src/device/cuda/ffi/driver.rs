//! The CUDA driver calls cudarc marks unsafe, each behind a safe function.

use super::super::cuda_err;
use collectix_runtime::Result;
use cudarc::driver::{sys, CudaContext, CudaSlice, CudaStream, DriverError};
use std::sync::Arc;

/// Whether the CUDA driver library can be opened (cudarc panics on first use when it
/// cannot, so this is asked before anything else).
pub(crate) fn culib_present() -> bool {
    // SAFETY: only tries to open the driver library by name; no function of it is called.
    unsafe { sys::is_culib_present() }
}

/// Sets the release threshold of `ctx`'s device's default memory pool to the maximum, so
/// that freed memory stays in the pool.
pub(crate) fn retain_pool_memory(ctx: &CudaContext) -> Result<()> {
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: `pool` is a valid out-pointer and `ctx.cu_device()` a device the driver
    // reported; making `ctx` initialised the driver (the call needs no current context).
    let r = unsafe { sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device()) };
    if r != sys::CUresult::CUDA_SUCCESS {
        return Err(cuda_err("cuDeviceGetDefaultMemPool")(DriverError(r)));
    }
    let mut threshold: u64 = u64::MAX;
    // SAFETY: the release threshold is a `cuuint64_t` attribute, read through the pointer
    // during the call only; `pool` was returned just above.
    let r = unsafe {
        sys::cuMemPoolSetAttribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&mut threshold as *mut u64).cast(),
        )
    };
    if r != sys::CUresult::CUDA_SUCCESS {
        return Err(cuda_err("cuMemPoolSetAttribute")(DriverError(r)));
    }
    Ok(())
}

/// A fresh device buffer of `bytes` bytes on `stream` (none for 0), to be written by the
/// operation enqueued next. Its bytes are not initialised: every caller hands it out only as
/// the output of a call that writes all of it first.
pub(crate) fn alloc(stream: &Arc<CudaStream>, bytes: usize) -> Result<Option<CudaSlice<u8>>> {
    if bytes == 0 {
        return Ok(None);
    }
    // SAFETY: `u8` has no invalid bit patterns, and device memory reaches Rust only through
    // copies into host memory that the copy itself initialises, so an unwritten byte could
    // be stale but never undefined behaviour; every caller writes the whole buffer (the NCCL
    // operation or copy enqueued next on `stream`) before anything reads it.
    let b = unsafe { stream.alloc::<u8>(bytes) }.map_err(cuda_err("cuMemAlloc"))?;
    Ok(Some(b))
}
