//! Device tensors and the resources behind them: moving tensors between the host and
//! devices ([`TensorDeviceExt`]), host memory posing as a device for tests ([`StandIn`]),
//! CUDA memory and the NCCL library (`cuda`, with the `cuda` feature), device workers, and
//! the lanes of device point-to-point (`lanes.rs`). Nothing here knows of ranks or groups:
//! how a call on device tensors runs is the backends' business (`backend/`).
//!
//! A tensor's [`Device`] is part of its value. Without the `cuda` feature every device
//! operation returns [`DeviceError::FeatureDisabled`]; device storage that can copy itself
//! ([`StandIn`], which keeps its bytes in host memory) still moves, so tests drive the
//! device paths on machines with no GPU.

use collectix_runtime::{Device, DeviceError, Error, Result, Tensor};

#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(not(feature = "cuda"))]
#[path = "no_cuda.rs"]
pub(crate) mod cuda;
pub(crate) mod lanes;
mod standin;

pub use standin::StandIn;

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
    if let Some(s) = storage.as_any().downcast_ref::<cuda::CudaStorage>() {
        return s.download();
    }
    Err(Error::invalid(format!(
        "device storage on {} of a kind this build cannot read",
        storage.device()
    )))
}

/// `host` copied to `device`, into storage of the same kind as `like` (when given).
pub(crate) fn upload(
    host: &Tensor,
    device: Device,
    like: Option<&dyn collectix_runtime::DeviceStorage>,
) -> Result<Tensor> {
    if like.is_some_and(|l| l.as_any().is::<StandIn>()) {
        return StandIn::tensor(host, device);
    }
    match device {
        Device::Host => Ok(host.clone()),
        Device::Cuda(n) => cuda::upload(host, n),
        #[allow(unreachable_patterns)]
        _ => Err(DeviceError::FeatureDisabled.into()),
    }
}

/// Whether a CUDA device and the libraries the NCCL path needs can be used here: the
/// number of CUDA devices, or the typed reason why not (a missing library names the files
/// it tried). Never panics.
pub fn cuda_devices() -> Result<u32> {
    cuda::device_count()
}

/// Whether libnccl can be loaded here (`Ok` with its version, e.g. 22704 for 2.27.4), or
/// the typed reason why not. See `docs/gpu.md` for where it is looked for.
pub fn nccl_version() -> Result<u32> {
    cuda::nccl::Nccl::load().and_then(|n| n.version())
}
