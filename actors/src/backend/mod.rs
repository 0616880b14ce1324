//! How a call on device tensors runs (torch's choice of backend for CUDA tensors), chosen per
//! communicator handle with [`Communicator::with_device_backend`](crate::Communicator::with_device_backend):
//!
//! - [`DeviceBackend::Nccl`] (the default, `nccl.rs`): an agreement step on the engine — a
//!   small all_gather of every rank's call fingerprint, marked
//!   [`DataPath::Nccl`](collectix_runtime::DataPath::Nccl) — then the NCCL operation on the
//!   group's device worker thread, which owns the group's NCCL communicator. Mismatched calls
//!   fail on every rank in the agreement step, before NCCL is called; an NCCL operation that
//!   does not finish within the group's timeout aborts the communicator. Needs the `cuda`
//!   feature.
//! - [`DeviceBackend::HostStaged`] (`staged.rs`): the inputs are copied to the host, the
//!   ordinary engine runs the call, and the outputs are copied back to the call's device. It
//!   works without NCCL and in groups that mix ranks with and without GPUs (their
//!   fingerprints agree: both take the engine's path).
//!
//! Send and receive of device tensors on the NCCL backend take a path of their own
//! (`p2p.rs`): a rendezvous on the engine (a ticket matched by source and tag), then the data
//! on NCCL, on a communicator per direction between the two ranks.
//! [`StandIn`](crate::device::StandIn) tensors take the same protocol with the host carrying
//! the data, so tests drive it without a GPU.
//!
//! A backend takes a [`Member`] (never a communicator): it plans against the member's group
//! and issues its engine steps through it. The device resources it uses (lanes, workers,
//! CUDA memory) are in `device/`.

#[cfg(feature = "cuda")]
mod nccl;
#[cfg(not(feature = "cuda"))]
#[path = "no_nccl.rs"]
mod nccl;
pub(crate) mod p2p;
mod staged;

use crate::member::Member;
use crate::work::Work;
use collectix_runtime::{CallOptions, Device, Error, Output, Request, Result};

/// How calls on device tensors run (torch's choice of backend for CUDA tensors).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum DeviceBackend {
    /// NCCL, on the group's device worker (needs the `cuda` feature and libnccl).
    #[default]
    Nccl,
    /// Copy to the host, run on the engine, copy back.
    HostStaged,
}

/// Runs a call whose tensors are on `device` through `backend`.
pub(crate) fn call_on_device<T: Send + 'static>(
    member: &Member,
    backend: DeviceBackend,
    device: Device,
    req: Request,
    opts: &CallOptions,
    map: fn(Output) -> Result<T>,
) -> Work<T> {
    let limit = member.group.info.options.max_call_bytes;
    let refusal = match req.declared_bytes() {
        Err(e) => Some(e),
        Ok(b) if b > limit => Some(Error::invalid(format!(
            "the call declares {b} bytes of inputs and outputs, above the group's max_call_bytes ({limit})"
        ))),
        Ok(_) => None,
    };
    if let Some(e) = refusal {
        // The call takes its place in the group's order as it would have on this backend.
        return match (backend, req.is_p2p()) {
            (DeviceBackend::Nccl, false) => nccl::refuse(member, e),
            (_, p2p) => member.refuse(p2p, e),
        };
    }
    // Point-to-point calls on the NCCL backend: a rendezvous on the engine, then the data
    // on a lane of their own (`p2p.rs`).
    match (backend, req) {
        (DeviceBackend::Nccl, Request::Send { tensor, dst, tag }) => {
            p2p::send(member, tensor, dst, tag, opts, map)
        }
        (DeviceBackend::Nccl, Request::Recv { spec, src, tag }) => {
            p2p::recv(member, spec, src, tag, opts, map)
        }
        (DeviceBackend::HostStaged, req) => staged::call(member, device, req, opts, map),
        (DeviceBackend::Nccl, req) => nccl::call(member, device, req, opts, map),
    }
}
