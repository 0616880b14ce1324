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

/// A memory pool of collectix's own on one device, from which call outputs are allocated
/// (through `pool::Pool`, which reuses outputs given back before it asks this pool):
/// it keeps the memory its allocations free (release threshold: the maximum), as a caching
/// allocator does, so a loop of out-of-place calls reuses the same memory instead of mapping
/// fresh memory at every synchronisation (what the device's default pool does with its
/// default threshold of 0). Its own, so the default pool's settings — the process's — are
/// left alone. Memory it holds goes back to the driver when it is dropped and its last
/// allocation has been freed.
pub(crate) struct OwnedPool {
    raw: sys::CUmemoryPool,
    ordinal: u32,
}

// SAFETY: a CUDA memory pool handle may be used from any thread (the driver synchronises
// its use); `OwnedPool` only allocates from it and destroys it once.
unsafe impl Send for OwnedPool {}
// SAFETY: as above: every use through `&OwnedPool` is a thread-safe driver call.
unsafe impl Sync for OwnedPool {}

impl OwnedPool {
    /// A pool of device memory on `ctx`'s device.
    pub(crate) fn new(ctx: &CudaContext) -> Result<OwnedPool> {
        ctx.bind_to_thread().map_err(cuda_err("cuCtxSetCurrent"))?;
        let ordinal = ctx.ordinal() as u32;
        // SAFETY: an all-zero `CUmemPoolProps` is its documented default (every field a
        // zero enum value, null pointer or zero size); the three fields that matter are set
        // below.
        let mut props: sys::CUmemPoolProps = unsafe { std::mem::zeroed() };
        props.allocType = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        props.handleTypes = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE;
        props.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        props.location.id = ordinal as std::ffi::c_int;
        let mut raw: sys::CUmemoryPool = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer and `props` a valid, initialised
        // `CUmemPoolProps` read during the call only.
        let r = unsafe { sys::cuMemPoolCreate(&mut raw, &props) };
        if r != sys::CUresult::CUDA_SUCCESS {
            return Err(cuda_err("cuMemPoolCreate")(DriverError(r)));
        }
        let pool = OwnedPool { raw, ordinal };
        let mut threshold: u64 = u64::MAX;
        // SAFETY: as in `retain_pool_memory`: a `cuuint64_t` attribute read through the
        // pointer during the call; `raw` was created just above.
        let r = unsafe {
            sys::cuMemPoolSetAttribute(
                pool.raw,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&mut threshold as *mut u64).cast(),
            )
        };
        if r != sys::CUresult::CUDA_SUCCESS {
            return Err(cuda_err("cuMemPoolSetAttribute")(DriverError(r)));
        }
        Ok(pool)
    }

    /// A buffer of `bytes` bytes from the pool, in `stream`'s order (none for 0), to be
    /// written by the operation enqueued next. Its bytes are not initialised: every caller
    /// hands it out only as the output of a call that writes all of it first. Freed (back to
    /// the pool) in the stream's order when the last handle on it goes.
    pub(crate) fn alloc(
        &self,
        stream: &Arc<CudaStream>,
        bytes: usize,
    ) -> Result<Option<CudaSlice<u8>>> {
        if bytes == 0 {
            return Ok(None);
        }
        if stream.context().ordinal() as u32 != self.ordinal {
            return Err(collectix_runtime::Error::internal(
                "a pool allocation on another device's stream",
            ));
        }
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: `ptr` is a valid out-pointer; `self.raw` is a live pool on the stream's
        // device (checked above); `stream` is live for the call.
        let r =
            unsafe { sys::cuMemAllocFromPoolAsync(&mut ptr, bytes, self.raw, stream.cu_stream()) };
        if r != sys::CUresult::CUDA_SUCCESS {
            return Err(cuda_err("cuMemAllocFromPoolAsync")(DriverError(r)));
        }
        // SAFETY: `ptr` is a fresh allocation of `bytes` bytes made in `stream`'s order;
        // the slice frees it with cuMemFreeAsync on the same stream when dropped, which
        // returns it to this pool. `u8` has no invalid bit patterns, and device memory
        // reaches Rust only through copies into host memory that the copy itself
        // initialises, so an unwritten byte could be stale but never undefined behaviour;
        // every caller writes the whole buffer before anything reads it.
        Ok(Some(unsafe { stream.upgrade_device_ptr::<u8>(ptr, bytes) }))
    }
}

impl Drop for OwnedPool {
    fn drop(&mut self) {
        // SAFETY: `raw` is this pool's live handle, destroyed once. With allocations still
        // out, the driver releases the pool once the last one is freed.
        let _ = unsafe { sys::cuMemPoolDestroy(self.raw) };
    }
}
