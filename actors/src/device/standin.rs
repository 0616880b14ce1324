//! [`StandIn`]: device storage kept in host memory, so that the device paths can be tested
//! on machines without a GPU.

use bytes::Bytes;
use collectix_runtime::{Device, DeviceStorage, Error, Result, Tensor};
use std::sync::Arc;

/// Device storage whose bytes live in host memory while the tensor says it is on a device.
///
/// It exists for tests: a tensor made with [`StandIn::tensor`] behaves like a device tensor
/// everywhere (host accessors refuse it, `to_host` copies it back, calls route through the
/// device layer), and the host-staged path produces its outputs as stand-ins too. The NCCL
/// path refuses it.
pub struct StandIn {
    device: Device,
    bytes: Bytes,
}

impl StandIn {
    /// A copy of host tensor `t` that claims to be on `device` (not the host).
    pub fn tensor(t: &Tensor, device: Device) -> Result<Tensor> {
        if device.is_host() {
            return Err(Error::invalid("a stand-in must name a device"));
        }
        let host = if t.device().is_host() {
            t.clone()
        } else {
            crate::device::TensorDeviceExt::to_host(t)?
        };
        let storage = Arc::new(StandIn {
            device,
            bytes: Bytes::copy_from_slice(host.bytes()),
        });
        Tensor::from_device_storage(storage, t.dtype(), t.shape())
    }

    /// The bytes.
    pub(crate) fn bytes(&self) -> Bytes {
        self.bytes.clone()
    }
}

impl DeviceStorage for StandIn {
    fn device(&self) -> Device {
        self.device
    }
    fn nbytes(&self) -> usize {
        self.bytes.len()
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}
