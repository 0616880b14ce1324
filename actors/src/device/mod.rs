//! Device tensors: where a call on CUDA memory goes, and how tensors move between devices.
//!
//! A tensor's [`Device`] is part of its value. A call whose tensors are on a device takes
//! one of two paths, chosen per communicator handle with
//! [`Communicator::with_device_backend`]:
//!
//! - [`DeviceBackend::Nccl`] (the default): an agreement step on the engine — a small
//!   all_gather of every rank's call fingerprint, marked [`DataPath::Nccl`](collectix_runtime::DataPath::Nccl) —
//!   then the NCCL operation on the rank's device worker thread, which owns the group's
//!   NCCL communicator. Mismatched calls fail on every rank in the agreement step, before
//!   NCCL is called; an NCCL operation that does not finish within the group's timeout
//!   aborts the communicator. Needs the `cuda` feature.
//! - [`DeviceBackend::HostStaged`]: the inputs are copied to the host, the ordinary engine
//!   runs the call, and the outputs are copied back to the call's device. It works without
//!   NCCL and in groups that mix ranks with and without GPUs (their fingerprints agree: both
//!   take the engine's path).
//!
//! Send and receive of device tensors on the NCCL backend take a path of their own
//! (`device/p2p.rs`): a rendezvous on the engine (a ticket matched by source and tag), then
//! the data on NCCL, on a communicator per direction between the two ranks. [`StandIn`]
//! tensors take the same protocol with the host carrying the data, so tests drive it
//! without a GPU.
//!
//! Without the `cuda` feature every device operation returns
//! [`DeviceError::FeatureDisabled`]; the host-staged path still runs for device storage
//! that can copy itself ([`StandIn`], which keeps its bytes in host memory, lets tests drive
//! the device paths on machines with no GPU).

use crate::comm::Communicator;
use crate::work::Work;
use collectix_runtime::{CallOptions, Device, DeviceError, Error, Output, Request, Result, Tensor};

#[cfg(feature = "cuda")]
pub mod cuda;
pub(crate) mod p2p;
mod staged;
mod standin;

pub use standin::StandIn;

/// How calls on device tensors run (torch's choice of backend for CUDA tensors).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum DeviceBackend {
    /// NCCL, on the rank's device worker (needs the `cuda` feature and libnccl).
    #[default]
    Nccl,
    /// Copy to the host, run on the engine, copy back.
    HostStaged,
}

/// Moving tensors between the host and devices.
pub trait TensorDeviceExt: Sized {
    /// A copy on `device` (the same tensor, cheaply cloned, if it is already there).
    fn to_device(&self, device: Device) -> Result<Tensor>;
    /// A copy in host memory (the same tensor if it is already there).
    fn to_host(&self) -> Result<Tensor>;
}

impl TensorDeviceExt for Tensor {
    fn to_device(&self, device: Device) -> Result<Tensor> {
        if self.device() == device {
            return Ok(self.clone());
        }
        let host = self.to_host()?;
        match device {
            Device::Host => Ok(host),
            other => upload(&host, other, None),
        }
    }

    fn to_host(&self) -> Result<Tensor> {
        match self.device_storage() {
            None => Ok(self.clone()),
            Some(storage) => {
                let bytes = download(storage.as_ref())?;
                Tensor::from_bytes(bytes, self.dtype(), self.shape())
            }
        }
    }
}

/// The bytes of device storage, copied to the host.
fn download(storage: &dyn collectix_runtime::DeviceStorage) -> Result<bytes::Bytes> {
    if let Some(s) = storage.as_any().downcast_ref::<StandIn>() {
        return Ok(s.bytes());
    }
    #[cfg(feature = "cuda")]
    if let Some(s) = storage.as_any().downcast_ref::<cuda::CudaStorage>() {
        return s.download();
    }
    Err(Error::invalid(format!(
        "device storage on {} of a kind this build cannot read",
        storage.device()
    )))
}

/// `host` copied to `device`, into storage of the same kind as `like` (when given).
fn upload(
    host: &Tensor,
    device: Device,
    like: Option<&dyn collectix_runtime::DeviceStorage>,
) -> Result<Tensor> {
    if like.is_some_and(|l| l.as_any().is::<StandIn>()) {
        return StandIn::tensor(host, device);
    }
    match device {
        Device::Host => Ok(host.clone()),
        #[cfg(feature = "cuda")]
        Device::Cuda(n) => cuda::upload(host, n),
        #[allow(unreachable_patterns)]
        _ => Err(DeviceError::FeatureDisabled.into()),
    }
}

/// Runs a call whose tensors are on `device` through the communicator's device backend.
pub(crate) fn call<T: Send + 'static>(
    comm: &Communicator,
    device: Device,
    req: Request,
    opts: &CallOptions,
    map: fn(Output) -> Result<T>,
) -> Work<T> {
    let limit = comm.group.info.options.max_call_bytes;
    match req.declared_bytes() {
        Err(e) => return comm.ready(Err(e)),
        Ok(b) if b > limit => {
            return comm.ready(Err(Error::invalid(format!(
                "the call declares {b} bytes of inputs and outputs, above the group's max_call_bytes ({limit})"
            ))))
        }
        Ok(_) => {}
    }
    // Point-to-point calls on the NCCL backend: a rendezvous on the engine, then the data
    // on a lane of their own (`p2p.rs`).
    match (comm.device_backend, req) {
        (DeviceBackend::Nccl, Request::Send { tensor, dst, tag }) => {
            p2p::send(comm, (tensor, dst, tag), opts, map)
        }
        (DeviceBackend::Nccl, Request::Recv { spec, src, tag }) => {
            p2p::recv(comm, spec, src, tag, opts, map)
        }
        (DeviceBackend::HostStaged, req) => staged::call(comm, device, req, opts, map),
        #[cfg(feature = "cuda")]
        (DeviceBackend::Nccl, req) => cuda::call(comm, device, req, opts, map),
        #[cfg(not(feature = "cuda"))]
        (DeviceBackend::Nccl, req) => {
            let _ = (device, req);
            comm.ready(Err(DeviceError::FeatureDisabled.into()))
        }
    }
}

/// Whether a CUDA device and the libraries the NCCL path needs can be used here: the
/// number of CUDA devices, or the typed reason why not (a missing library names the files
/// it tried). Never panics.
pub fn cuda_devices() -> Result<u32> {
    #[cfg(feature = "cuda")]
    {
        cuda::device_count()
    }
    #[cfg(not(feature = "cuda"))]
    {
        Err(DeviceError::FeatureDisabled.into())
    }
}

/// Whether libnccl can be loaded here (`Ok` with its version, e.g. 22704 for 2.27.4), or
/// the typed reason why not. See `docs/gpu.md` for where it is looked for.
pub fn nccl_version() -> Result<u32> {
    #[cfg(feature = "cuda")]
    {
        cuda::nccl::Nccl::load().and_then(|n| n.version())
    }
    #[cfg(not(feature = "cuda"))]
    {
        Err(DeviceError::FeatureDisabled.into())
    }
}
