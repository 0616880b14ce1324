//! The NCCL backend of a build without the `cuda` feature: every call on it is
//! [`DeviceError::FeatureDisabled`]. The feature is chosen once, where this module is.

use crate::device::lanes::{Key, RecvDone, SendDone, Transfer};
use crate::member::Member;
use crate::work::Work;
use collectix_runtime::{CallOptions, Device, DeviceError, Error, Output, Request, Result};
use collectix_runtime::{Tensor, TensorSpec};

/// [`DeviceError::FeatureDisabled`].
pub(crate) fn call<T: Send + 'static>(
    member: &Member,
    _: Device,
    _: Request,
    _: &CallOptions,
    _: fn(Output) -> Result<T>,
) -> Work<T> {
    member.ready(Err(DeviceError::FeatureDisabled.into()))
}

/// A call that failed its checks: every NCCL call of this build fails alike without taking
/// a place in the group's order, and so does this one.
pub(super) fn refuse<T: Send + 'static>(member: &Member, e: Error) -> Work<T> {
    member.ready(Err(e))
}

/// Nothing to start: a send on the NCCL carrier fails when its transfer is issued.
pub(super) fn start_lane(_: &Member, _: Key) -> Result<()> {
    Ok(())
}

/// [`DeviceError::FeatureDisabled`]; the send is given back.
pub(super) fn send_job(
    _: &Member,
    _: Key,
    _: Transfer,
    _: Tensor,
    _: &CallOptions,
    done: SendDone,
) -> std::result::Result<(), (Error, SendDone)> {
    Err((DeviceError::FeatureDisabled.into(), done))
}

/// [`DeviceError::FeatureDisabled`]; the receive is given back.
pub(super) fn recv_job(
    _: &Member,
    _: Key,
    _: Transfer,
    _: TensorSpec,
    _: &CallOptions,
    done: RecvDone,
) -> std::result::Result<(), (RecvDone, Error)> {
    Err((done, DeviceError::FeatureDisabled.into()))
}

/// Unreachable in this build (no CUDA tensor exists to take the device-local carrier);
/// fails the send with [`DeviceError::FeatureDisabled`].
pub(super) fn local_send(_: &Member, _: Key, _: u64, _: Tensor, _: &CallOptions, done: SendDone) {
    done(Err(DeviceError::FeatureDisabled.into()))
}

/// As [`local_send`], for the receive.
pub(super) fn local_recv(
    _: &Member,
    _: Key,
    _: u64,
    _: TensorSpec,
    _: &CallOptions,
    done: RecvDone,
) {
    done(Err(DeviceError::FeatureDisabled.into()))
}
