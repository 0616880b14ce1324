//! The `cuda` module of a build without the `cuda` feature: the crate-internal surface of
//! the real one, where no value of a CUDA type can exist and every operation is
//! [`DeviceError::FeatureDisabled`]. Code that uses CUDA resources then needs no `cfg` of its
//! own; the feature is chosen once, where this module is.

use collectix_runtime::{DeviceError, Result, Tensor};

/// Every operation's answer in this build.
fn disabled<T>() -> Result<T> {
    Err(DeviceError::FeatureDisabled.into())
}

/// CUDA memory: none can exist in this build.
pub(crate) enum CudaStorage {}

impl CudaStorage {
    /// Unreachable: no `CudaStorage` exists.
    pub(crate) fn download(&self) -> Result<bytes::Bytes> {
        match *self {}
    }
}

/// [`DeviceError::FeatureDisabled`].
pub(crate) fn upload(_: &Tensor, _: u32) -> Result<Tensor> {
    disabled()
}

/// [`DeviceError::FeatureDisabled`].
pub(crate) fn device_count() -> Result<u32> {
    disabled()
}

/// [`DeviceError::FeatureDisabled`]: no tensor has CUDA storage in this build.
pub(crate) fn storage_of(_: &Tensor) -> Result<&CudaStorage> {
    disabled()
}

/// What the ranks of one process share for the device-local path: nothing in this build.
#[derive(Default)]
pub(crate) struct LocalHub;

impl LocalHub {
    /// A hub with nothing in it.
    pub(crate) fn new() -> LocalHub {
        LocalHub
    }

    /// Nothing to release.
    pub(crate) fn release(&self, _: collectix_runtime::GroupId) {}
}

/// libnccl: never loaded in this build.
pub(crate) mod nccl {
    use super::disabled;
    use collectix_runtime::Result;
    use std::sync::Arc;

    /// The library: none can exist in this build.
    pub(crate) enum Nccl {}

    impl Nccl {
        /// [`DeviceError::FeatureDisabled`](collectix_runtime::DeviceError::FeatureDisabled).
        pub(crate) fn load() -> Result<Arc<Nccl>> {
            disabled()
        }

        /// Unreachable: no `Nccl` exists.
        pub(crate) fn version(&self) -> Result<u32> {
            match *self {}
        }

        /// Unreachable: no `Nccl` exists.
        pub(crate) fn unique_id(&self) -> Result<[u8; 128]> {
            match *self {}
        }
    }
}

/// Device workers: none run in this build.
pub(crate) mod worker {
    use collectix_runtime::GroupId;

    /// A device worker: none can exist in this build.
    pub(crate) enum WorkerHandle {}

    impl WorkerHandle {
        /// Unreachable: no `WorkerHandle` exists.
        pub(crate) fn release(&self, _: GroupId) {
            match *self {}
        }
    }
}
