//! The host-staged path: copy a call's device inputs to the host, run the call on the
//! engine like any host call (so its fingerprint says [`DataPath::Engine`](collectix_runtime::DataPath::Engine)
//! and ranks with host tensors can take part), and copy the outputs back to the device.
//!
//! The copies down happen on the calling thread, when the call is issued (so the call reads
//! the values the tensors hold then); the copies up happen when the result arrives.

use crate::device::{upload, TensorDeviceExt};
use crate::member::Member;
use crate::work::Work;
use collectix_runtime::{CallOptions, Device, DeviceStorage, Output, Request, Result, Tensor};
use std::sync::Arc;

/// Issues `req` (on `device`) through the host.
pub(super) fn call<T: Send + 'static>(
    member: &Member,
    device: Device,
    req: Request,
    opts: &CallOptions,
    map: fn(Output) -> Result<T>,
) -> Work<T> {
    let like = first_storage(&req);
    let p2p = req.is_p2p();
    let host = match host_request(req) {
        Ok(r) => r,
        Err(e) => return member.refuse(p2p, e),
    };
    member.call_host(host, opts, move |out| {
        map(up(out, device, like.as_deref())?)
    })
}

/// Device storage of the call's first device tensor: outputs are made of the same kind.
fn first_storage(req: &Request) -> Option<Arc<dyn DeviceStorage>> {
    let first = |ts: &[Tensor]| ts.iter().find_map(|t| t.device_storage().cloned());
    match req {
        Request::AllReduce { tensor, .. }
        | Request::Reduce { tensor, .. }
        | Request::Broadcast { tensor, .. }
        | Request::Send { tensor, .. } => first(std::slice::from_ref(tensor)),
        Request::AllGather { input, .. }
        | Request::AllGatherIntoTensor { input, .. }
        | Request::Gather { input, .. }
        | Request::ReduceScatterTensor { input, .. }
        | Request::AllToAllSingle { input, .. } => first(std::slice::from_ref(input)),
        Request::Scatter { inputs, .. } => inputs.as_deref().and_then(first),
        Request::ReduceScatter { inputs, .. } | Request::AllToAll { inputs, .. } => first(inputs),
        _ => None,
    }
}

/// The same request with every tensor copied to the host and every spec on the host.
fn host_request(req: Request) -> Result<Request> {
    req.try_map(|t| t.to_host(), |s| s.on(Device::Host))
}

/// The engine's output, copied to `device`.
fn up(out: Output, device: Device, like: Option<&dyn DeviceStorage>) -> Result<Output> {
    let one = |t: Tensor| upload(&t, device, like);
    Ok(match out {
        Output::Tensor(t) => Output::Tensor(one(t)?),
        Output::Tensors(ts) => Output::Tensors(ts.into_iter().map(one).collect::<Result<_>>()?),
        Output::Received { tensor, src } => Output::Received {
            tensor: one(tensor)?,
            src,
        },
        other => other,
    })
}
