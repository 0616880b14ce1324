//! CUDA memory and the NCCL path (the `cuda` feature).
//!
//! - [`CudaStorage`]: a tensor's bytes in device memory (a cudarc `CudaSlice<u8>`, shared,
//!   with an offset so that a gathered buffer can be handed back as per-rank views).
//! - `call`: validates a call for NCCL, runs the agreement step on the engine, and hands
//!   the operation to the rank's device worker (`worker`), which owns the group's NCCL
//!   communicator and completes the call's `Work` when its CUDA event fires.
//! - [`nccl`]: the library, loaded with a search of our own (see `docs/gpu.md`).

/// cudarc, the CUDA driver binding collectix uses (for [`wrap`] and [`CudaStorage::slice`]).
pub use cudarc;

pub mod nccl;
pub(crate) mod ops;
pub(crate) mod worker;

use crate::comm::Communicator;
use crate::work::Work;
use collectix_runtime::error::CallDesc;
use collectix_runtime::ids::FINGERPRINT_BYTES;
use collectix_runtime::{
    CallOptions, DType, Device, DeviceError, DeviceStorage, Error, Output, Plan, Request, Result,
    Tensor, TensorSpec,
};
use collectix_runtime::{DataPath, Fingerprint};
use cudarc::driver::{CudaContext, CudaSlice, DriverError};
use std::sync::Arc;
use worker::{Call, Init, Job};

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
    // SAFETY: only tries to open the driver library by name; no function of it is called.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
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
    use cudarc::driver::sys;
    let ctx = context(ordinal)?;
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: `pool` is a valid out-pointer and `ctx.cu_device()` a device the driver
    // reported; the context above initialised the driver and is bound to this thread.
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

/// A tensor's bytes in CUDA memory: `len` bytes at `offset` of a shared allocation (none for
/// an empty tensor).
pub struct CudaStorage {
    buf: Option<Arc<CudaSlice<u8>>>,
    offset: usize,
    len: usize,
    ordinal: u32,
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
        }
    }

    /// `len` bytes at `offset` of `buf` (checked).
    pub(crate) fn view(buf: &Arc<CudaSlice<u8>>, offset: usize, len: usize) -> Result<CudaStorage> {
        if offset.checked_add(len).is_none_or(|end| end > buf.len()) {
            return Err(Error::internal("device view out of bounds"));
        }
        Ok(CudaStorage {
            buf: Some(buf.clone()),
            offset,
            len,
            ordinal: buf.ordinal() as u32,
        })
    }

    /// Empty storage on `ordinal`.
    pub(crate) fn empty(ordinal: u32) -> CudaStorage {
        CudaStorage {
            buf: None,
            offset: 0,
            len: 0,
            ordinal,
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

/// Words of the agreement step per rank: the fingerprint (its wire encoding, zero-padded),
/// the call's NCCL ordinal, a status, and rank 0's NCCL id on the group's first NCCL call.
const FP_BYTES: usize = 64;
const HANDSHAKE_BYTES: usize = FP_BYTES + 8 + 8 + 128;

fn encode_fp(fp: &Fingerprint) -> Result<[u8; FP_BYTES]> {
    let mut out = [0u8; FP_BYTES];
    out[..FINGERPRINT_BYTES].copy_from_slice(&fp.to_bytes());
    Ok(out)
}

fn decode_fp(b: &[u8]) -> Option<Fingerprint> {
    let bytes: &[u8; FINGERPRINT_BYTES] = b.get(..FINGERPRINT_BYTES)?.try_into().ok()?;
    Fingerprint::from_bytes(bytes).ok()
}

/// One rank's part of the agreement step, as it arrived.
struct Agreement {
    fp_bytes: Vec<u8>,
    k: u64,
    status: u64,
    id: [u8; 128],
}

fn parse(block: &[u8]) -> Option<Agreement> {
    let fp_bytes = block.get(..FP_BYTES)?.to_vec();
    let k = u64::from_le_bytes(block.get(FP_BYTES..FP_BYTES + 8)?.try_into().ok()?);
    let status = u64::from_le_bytes(block.get(FP_BYTES + 8..FP_BYTES + 16)?.try_into().ok()?);
    let id: [u8; 128] = block.get(FP_BYTES + 16..HANDSHAKE_BYTES)?.try_into().ok()?;
    Some(Agreement {
        fp_bytes,
        k,
        status,
        id,
    })
}

/// The group's worker on this rank, started on first use.
fn worker(comm: &Communicator) -> Result<crossbeam_channel::Sender<Job>> {
    let mut slot = crate::sync::lock(&comm.group.nccl_worker);
    if let Some(w) = slot.as_ref() {
        return Ok(w.sender());
    }
    let w = worker::WorkerHandle::spawn_named(format!(
        "cx-nccl-{}-{:x}",
        comm.global_rank(),
        comm.group.info.id.0 & 0xffff
    ))?;
    let tx = w.sender();
    *slot = Some(w);
    Ok(tx)
}

/// Issues a call on CUDA tensors through NCCL.
pub(crate) fn call<T: Send + 'static>(
    comm: &Communicator,
    device: Device,
    req: Request,
    opts: &CallOptions,
    map: fn(Output) -> Result<T>,
) -> Work<T> {
    let Device::Cuda(ordinal) = device else {
        return comm.ready(Err(Error::invalid(format!("no NCCL path for {device}"))));
    };
    let info = &comm.group.info;
    let (op, fp) = match ops::plan(req, info.rank, info.size(), ordinal) {
        Ok(x) => x,
        Err(e) => return comm.ready(Err(e)),
    };
    let tx = match worker(comm) {
        Ok(t) => t,
        Err(e) => return comm.ready(Err(e)),
    };
    let fp_bytes = match encode_fp(&fp) {
        Ok(b) => b,
        Err(e) => return comm.ready(Err(e)),
    };
    // The sequence number and the NCCL ordinal are taken together, so both orders agree.
    let (seq, k) = {
        let mut n = match comm.group.nccl_calls.lock() {
            Ok(n) => n,
            Err(_) => return comm.ready(Err(Error::internal("lock poisoned"))),
        };
        let k = *n;
        *n += 1;
        (comm.reserve(1), k)
    };
    // Rank 0 makes the group's NCCL id for its first NCCL call; a failure is reported in
    // the agreement step, so every rank fails together.
    let mut status = 0u64;
    let mut id = [0u8; 128];
    if k == 0 && info.rank == 0 {
        match nccl::Nccl::load().and_then(|n| n.unique_id()) {
            Ok(i) => id = i,
            Err(_) => status = 1,
        }
    }
    let mut block = Vec::with_capacity(HANDSHAKE_BYTES);
    block.extend_from_slice(&fp_bytes);
    block.extend_from_slice(&k.to_le_bytes());
    block.extend_from_slice(&status.to_le_bytes());
    block.extend_from_slice(&id);
    let size = info.size();
    let req = Request::AllGatherIntoTensor {
        input: Tensor::from_vec(block),
        output: TensorSpec::new(&[size * HANDSHAKE_BYTES], DType::U8),
    };
    let plan = match Plan::new(req, info, opts) {
        Ok(p) => p.with_path(DataPath::Nccl),
        Err(e) => return comm.ready(Err(e)),
    };
    let (done, work) = Work::pair(comm.rank.rank_threads.clone(), map);
    let timeout = opts.timeout.unwrap_or(info.options.timeout);
    let (group, me, members) = (info.id, info.rank, info.members.clone());
    let (kind, dtype) = (fp.kind, fp.dtype);
    comm.issue_raw(
        seq,
        plan,
        Box::new(move |agreed: Result<Output>| {
            let checked = agreed.and_then(|out| {
                let all = match out {
                    Output::Tensor(t) => t.to_vec::<u8>()?,
                    other => return Err(Error::internal(format!("agreement step gave {other:?}"))),
                };
                let mut init_id = None;
                for (r, block) in all.chunks(HANDSHAKE_BYTES).enumerate() {
                    let theirs =
                        parse(block).ok_or_else(|| Error::internal("short agreement block"))?;
                    let rank = members.get(r).copied().unwrap_or(r);
                    if theirs.fp_bytes != fp_bytes || theirs.k != k {
                        let their_fp = decode_fp(&theirs.fp_bytes).unwrap_or(fp);
                        return Err(Error::Mismatch {
                            group,
                            seq: Some(seq),
                            ours: CallDesc {
                                rank: members.get(me).copied().unwrap_or(me),
                                call: fp,
                            },
                            theirs: CallDesc {
                                rank,
                                call: their_fp,
                            },
                            report: Vec::new(),
                        });
                    }
                    if theirs.status != 0 {
                        return Err(DeviceError::Nccl {
                            call: format!("ncclGetUniqueId on rank {rank}"),
                            code: 0,
                            detail: "rank 0 could not make the group's NCCL id".into(),
                        }
                        .into());
                    }
                    if r == 0 && k == 0 {
                        init_id = Some(theirs.id);
                    }
                }
                Ok(init_id.map(|id| Init { id, rank: me, size }))
            });
            let job = match checked {
                Ok(init) => Job::Call(Box::new(Call {
                    group,
                    k,
                    init,
                    device: ordinal,
                    kind,
                    dtype,
                    rank: me,
                    op,
                    timeout,
                    done,
                })),
                Err(e) => {
                    done(Err(e));
                    Job::Skip { group, k }
                }
            };
            // A worker that is gone has failed every call it held; this one's `done` was
            // moved into the job, and dropping it completes the Work with `Shutdown`.
            let _ = tx.send(job);
        }),
    );
    work
}
