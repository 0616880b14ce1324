//! Send and receive of device tensors on the NCCL backend: a rendezvous on the engine, then
//! the data on a lane of its own.
//!
//! NCCL matches point-to-point operations by order on a communicator, not by tag, and a
//! receive it has not reached blocks everything behind it on the communicator's stream. A
//! collectix receive is matched by (source, tag), possibly from any source, so the order in
//! which a receiver takes messages need not be the order they were sent. The protocol makes
//! the receiver decide the order, and gives every direction between two ranks a
//! communicator of its own (a *lane*), so that no transfer ever waits behind another one it
//! does not depend on:
//!
//! 1. The sender sends a *ticket* on the user's tag: a message on the engine marked
//!    [`DataPath::Nccl`] that says "`count` elements of `dtype`" and carries the send's
//!    serial number `s` and its carrier (NCCL, or the host for [`StandIn`] tensors). It is
//!    matched like any message, by (source, tag) in FIFO order; a receive on the engine's
//!    path, or of another size, is an [`Error::Mismatch`] on both ranks
//!    (`collectix-runtime`'s `Plan::nccl_ticket`). The sender posts a receive for the answer.
//! 2. The receiver's receive (marked [`DataPath::Nccl`]) matches the ticket. It takes the
//!    next ordinal `k` of the lane (sender → receiver), makes the lane's NCCL id when
//!    `k = 0`, answers *go* `(s, k, id)` on a reserved tag, and posts transfer `k`.
//! 3. The sender, on *go*, posts transfer `k` of the lane, in ordinal order.
//! 4. A transfer runs on the lane: on NCCL, a communicator of two ranks (the sender is
//!    rank 0) owned by a device worker thread of its own, which runs the lane's transfers
//!    in ordinal order; for stand-in tensors, a host message on another reserved tag.
//!
//! A send completes when its transfer has (on NCCL: when the data has left the sender's
//! buffer), as torch's NCCL `isend` does, and waits at most the call's timeout for its
//! receiver. A transfer that fails or times out breaks its lane on that rank: every later
//! device send or receive between the two ranks in that direction fails with the same
//! error (as a timed-out NCCL operation aborts torch's communicator).

use super::standin::StandIn;
use super::TensorDeviceExt;
use crate::comm::{Communicator, DATA_TAG, GO_TAGS};
use crate::work::Work;
use collectix_runtime::error::ProtocolError;
use collectix_runtime::{
    CallOptions, DType, DataPath, Device, DeviceError, Error, Output, Plan, Request, Result,
    Tensor, TensorSpec,
};
use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

/// How a lane moves its data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Carrier {
    /// NCCL between two GPUs.
    Nccl = 0,
    /// A host message: the carrier of [`StandIn`] tensors (tests without a GPU).
    Host = 1,
}

impl Carrier {
    /// The tag the receivers' answers to this carrier's tickets travel on: one per carrier,
    /// so that each lane's answers are matched only by that lane's waiting sends.
    fn go_tag(self) -> u32 {
        GO_TAGS + self as u32
    }
}

/// The ticket: the send's serial number and its carrier.
const TICKET_BYTES: usize = 9;
/// The answer: `s`, `k`, a status and the lane's NCCL id (when `k = 0`).
const GO_BYTES: usize = 8 + 8 + 8 + 128;

/// Why a receiver refused a ticket (the go's status; 0 is "go").
const REFUSED_BROKEN: u64 = 1;
const REFUSED_NO_NCCL: u64 = 2;
const REFUSED_DEVICE: u64 = 3;

/// Completes a send's `Work`.
type SendDone = Box<dyn FnOnce(Result<()>) + Send>;

/// Sends to fail once the lanes' lock is released.
type Failed = Vec<(SendDone, Error)>;

fn fail_all(failed: Failed) {
    for (done, e) in failed {
        done(Err(e));
    }
}

/// A send waiting for its go.
struct PendingSend {
    tensor: Tensor,
    done: SendDone,
}

/// A send whose go arrived, waiting for the earlier ordinals of its lane.
struct Released {
    send: PendingSend,
    id: [u8; 128],
}

/// One direction from this rank to a peer.
#[derive(Default)]
struct OutLane {
    next_s: u64,
    pending: HashMap<u64, PendingSend>,
    next_k: u64,
    released: BTreeMap<u64, Released>,
    broken: Option<Error>,
    /// The device the lane's sends come from (a communicator lives on one).
    device: Option<Device>,
    #[cfg(feature = "cuda")]
    worker: Option<super::cuda::worker::WorkerHandle>,
}

impl OutLane {
    /// Marks the lane broken (the first error stays) and takes every send waiting on it.
    fn break_with(&mut self, e: Error) -> Failed {
        let e = self.broken.get_or_insert(e).clone();
        let released = std::mem::take(&mut self.released).into_values();
        self.pending
            .drain()
            .map(|(_, p)| p)
            .chain(released.map(|r| r.send))
            .map(|p| (p.done, e.clone()))
            .collect()
    }
}

/// One direction from a peer to this rank.
#[derive(Default)]
struct InLane {
    next_k: u64,
    broken: Option<Error>,
    /// The device the lane's receives go to.
    device: Option<Device>,
    #[cfg(feature = "cuda")]
    worker: Option<super::cuda::worker::WorkerHandle>,
}

/// A group member's lanes (in its [`GroupShared`](crate::comm::GroupShared)).
#[derive(Default)]
pub(crate) struct Lanes {
    inner: Mutex<LanesInner>,
}

#[derive(Default)]
struct LanesInner {
    out: HashMap<(usize, Carrier), OutLane>,
    inn: HashMap<(usize, Carrier), InLane>,
    /// The group was destroyed on this rank: no lane is made any more.
    released: bool,
}

impl Lanes {
    fn lock(&self) -> std::sync::MutexGuard<'_, LanesInner> {
        crate::lock(&self.inner)
    }

    /// The group is destroyed on this rank: every lane breaks with [`Error::Shutdown`], its
    /// waiting sends fail with it, its NCCL communicator is released (aborted), and no lane
    /// is made any more.
    pub(crate) fn release(&self, group: collectix_runtime::GroupId) {
        let failed: Failed = {
            let mut lanes = self.lock();
            lanes.released = true;
            let mut failed = Vec::new();
            for lane in lanes.out.values_mut() {
                failed.extend(lane.break_with(Error::Shutdown));
                #[cfg(feature = "cuda")]
                if let Some(w) = lane.worker.take() {
                    w.release(group);
                }
            }
            for lane in lanes.inn.values_mut() {
                lane.broken.get_or_insert(Error::Shutdown);
                #[cfg(feature = "cuda")]
                if let Some(w) = lane.worker.take() {
                    w.release(group);
                }
            }
            failed
        };
        let _ = group;
        fail_all(failed);
    }
}

/// The carrier of a device tensor that is sent.
fn carrier_of(t: &Tensor) -> Result<Carrier> {
    if t.device_storage()
        .is_some_and(|s| s.as_any().is::<StandIn>())
    {
        return Ok(Carrier::Host);
    }
    #[cfg(feature = "cuda")]
    {
        super::cuda::storage_of(t).map(|_| Carrier::Nccl)
    }
    #[cfg(not(feature = "cuda"))]
    {
        Err(DeviceError::FeatureDisabled.into())
    }
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// Checks that a lane keeps to one device, and fixes it on first use.
fn same_device(lane: &mut Option<Device>, d: Device) -> Result<()> {
    match *lane {
        Some(l) if l != d => Err(Error::invalid(format!(
            "device point-to-point between two ranks keeps to one device per direction: this \
             one is on {l}, the call on {d}"
        ))),
        _ => {
            *lane = Some(d);
            Ok(())
        }
    }
}

/// `send` of a device tensor on the NCCL backend.
pub(super) fn send<T: Send + 'static>(
    comm: &Communicator,
    (tensor, dst, tag): (Tensor, usize, u32),
    opts: &CallOptions,
    map: fn(Output) -> Result<T>,
) -> Work<T> {
    let carrier = match carrier_of(&tensor) {
        Ok(c) => c,
        Err(e) => return comm.ready(Err(e)),
    };
    let info = &comm.group.info;
    let key = (dst, carrier);
    let (dtype, count, device) = (tensor.dtype(), tensor.numel() as u64, tensor.device());
    let (c, work) = Work::raw(comm.rank.rank_threads.clone());
    let done: SendDone = Box::new(move |r| c.complete(r.and_then(|()| map(Output::None))));
    let admitted = {
        let mut lanes = comm.group.p2p.lock();
        if lanes.released {
            Err((Error::Shutdown, done))
        } else {
            let lane = lanes.out.entry(key).or_default();
            if let Some(e) = &lane.broken {
                Err((e.clone(), done))
            } else if let Err(e) = same_device(&mut lane.device, device) {
                Err((e, done))
            } else if let Err(e) = start_lane(comm, key, lane) {
                Err((e, done))
            } else {
                let s = lane.next_s;
                lane.next_s += 1;
                lane.pending.insert(s, PendingSend { tensor, done });
                Ok(s)
            }
        }
    };
    let s = match admitted {
        Ok(s) => s,
        Err((e, done)) => {
            done(Err(e));
            return work;
        }
    };
    let mut ticket = s.to_le_bytes().to_vec();
    ticket.push(carrier as u8);
    let plan = match Plan::nccl_ticket(info, opts, (dst, tag), (dtype, count), ticket) {
        Ok(p) => p,
        Err(e) => {
            fail_pending(comm, key, s, e);
            return work;
        }
    };
    // The wait for the receiver's answer takes the group's timeout, not the call's: answers
    // are matched in the order they come, by whichever of the lane's waiting sends posted
    // first, so each must wait as long as any.
    let go = comm.call_host(
        Request::Recv {
            spec: TensorSpec::new(&[GO_BYTES], DType::U8),
            src: Some(dst),
            tag: carrier.go_tag(),
        },
        &CallOptions::default(),
        Ok,
    );
    let sent = comm.issue(0, plan, |_| Ok(()));
    let me = comm.clone();
    let opts = opts.clone();
    comm.rank.arbiter.spawn(async move {
        if let Err(e) = sent.await {
            fail_pending(&me, key, s, e);
        }
        match go.await {
            Ok(out) => on_go(&me, key, out, &opts),
            // No answer within the timeout (or the group failed): the receiver's order is
            // unknown from here on, so the lane is broken.
            Err(e) => break_out_lane(&me.group.p2p, key, e),
        }
    });
    work
}

/// Starts an NCCL lane's worker on its first send, so that a sender without libnccl fails
/// at once rather than after its receiver has answered (and libnccl is loaded once per
/// lane, not per send).
fn start_lane(comm: &Communicator, key: (usize, Carrier), lane: &mut OutLane) -> Result<()> {
    #[cfg(feature = "cuda")]
    if key.1 == Carrier::Nccl {
        nccl::worker(&mut lane.worker, comm, &format!("to{}", key.0))?;
    }
    let _ = (comm, key, lane);
    Ok(())
}

/// Fails send `s` of a lane, if it still waits.
fn fail_pending(comm: &Communicator, key: (usize, Carrier), s: u64, e: Error) {
    let p = comm
        .group
        .p2p
        .lock()
        .out
        .get_mut(&key)
        .and_then(|l| l.pending.remove(&s));
    if let Some(p) = p {
        (p.done)(Err(e));
    }
}

/// Breaks a lane to a peer: every send waiting on it fails with `e`, and so does every
/// later one.
fn break_out_lane(lanes: &Lanes, key: (usize, Carrier), e: Error) {
    let failed = match lanes.lock().out.get_mut(&key) {
        Some(lane) => lane.break_with(e),
        None => Vec::new(),
    };
    fail_all(failed);
}

/// The receiver's answer to one of this rank's tickets.
fn on_go(comm: &Communicator, key: (usize, Carrier), out: Output, opts: &CallOptions) {
    let b = match out {
        Output::Received { tensor, .. } => tensor.to_vec::<u8>().unwrap_or_default(),
        _ => Vec::new(),
    };
    let peer = comm.group.info.global(key.0);
    let protocol = |what: String| Error::Protocol {
        rank: peer,
        detail: ProtocolError::Malformed(what),
    };
    let parsed = (
        u64_at(&b, 0),
        u64_at(&b, 8),
        u64_at(&b, 16),
        b.get(24..GO_BYTES)
            .and_then(|i| <[u8; 128]>::try_from(i).ok()),
    );
    let failed = {
        let mut lanes = comm.group.p2p.lock();
        let Some(lane) = lanes.out.get_mut(&key) else {
            return;
        };
        match parsed {
            (Some(s), Some(k), Some(status), Some(id)) => match lane.pending.remove(&s) {
                None if lane.broken.is_some() => Vec::new(),
                None => lane.break_with(protocol(format!(
                    "an answer for send {s}, which does not wait"
                ))),
                Some(p) if status != 0 => vec![(p.done, refusal(status, key.0))],
                Some(p) if lane.broken.is_some() => {
                    let e = lane.broken.clone().unwrap_or(Error::Shutdown);
                    vec![(p.done, e)]
                }
                Some(p) if k < lane.next_k || lane.released.contains_key(&k) => {
                    let mut f = lane.break_with(protocol(format!("ordinal {k} given twice")));
                    f.push((p.done, lane.broken.clone().unwrap_or(Error::Shutdown)));
                    f
                }
                Some(send) => {
                    lane.released.insert(k, Released { send, id });
                    issue_released(comm, key, lane, opts)
                }
            },
            _ => lane.break_with(protocol(format!("an answer of {} bytes", b.len()))),
        }
    };
    fail_all(failed);
}

/// The error a refused send fails with.
fn refusal(status: u64, peer: usize) -> Error {
    match status {
        REFUSED_NO_NCCL => DeviceError::Unsupported(format!(
            "rank {peer} cannot receive on NCCL (no `cuda` feature or no libnccl there)"
        ))
        .into(),
        REFUSED_DEVICE => Error::invalid(format!(
            "rank {peer} receives from this rank on another device than this receive names"
        )),
        _ => DeviceError::Unsupported(format!(
            "rank {peer}'s receives from this rank are broken by an earlier failure (or its group was destroyed)"
        ))
        .into(),
    }
}

/// Issues the lane's released transfers that are next in ordinal order (with the lane's
/// lock held: the host carrier's messages take their order from the order of issue). A
/// transfer that cannot be issued breaks the lane: an ordinal skipped on one end would pair
/// the next transfer with the wrong receive.
fn issue_released(
    comm: &Communicator,
    key: (usize, Carrier),
    lane: &mut OutLane,
    opts: &CallOptions,
) -> Failed {
    while let Some(r) = lane.released.remove(&lane.next_k) {
        let k = lane.next_k;
        lane.next_k += 1;
        if let Err((e, done)) = start_send(comm, key, lane, k, r, opts) {
            let mut failed = lane.break_with(e.clone());
            failed.push((done, e));
            return failed;
        }
    }
    Vec::new()
}

/// Issues transfer `k` of a lane to a peer; gives the send back if it could not.
fn start_send(
    comm: &Communicator,
    key: (usize, Carrier),
    lane: &mut OutLane,
    k: u64,
    r: Released,
    opts: &CallOptions,
) -> std::result::Result<(), (Error, SendDone)> {
    let (dst, carrier) = key;
    let Released { send, id } = r;
    let PendingSend { tensor, done } = send;
    match carrier {
        Carrier::Host => {
            let host = match tensor.to_host() {
                Ok(h) => h,
                Err(e) => return Err((e, done)),
            };
            let sent = comm.call_host(
                Request::Send {
                    tensor: host,
                    dst,
                    tag: DATA_TAG,
                },
                opts,
                |_| Ok(()),
            );
            let me = comm.clone();
            comm.rank.arbiter.spawn(async move {
                let r = sent.await;
                if let Err(e) = &r {
                    break_out_lane(&me.group.p2p, key, e.clone());
                }
                done(r);
            });
            Ok(())
        }
        #[cfg(feature = "cuda")]
        Carrier::Nccl => nccl::send_job(comm, key, lane, (k, id), tensor, opts, done),
        #[cfg(not(feature = "cuda"))]
        Carrier::Nccl => {
            let _ = (lane, k, id, tensor);
            Err((DeviceError::FeatureDisabled.into(), done))
        }
    }
}

/// `recv` of a device tensor on the NCCL backend.
pub(super) fn recv<T: Send + 'static>(
    comm: &Communicator,
    spec: TensorSpec,
    src: Option<usize>,
    tag: u32,
    opts: &CallOptions,
    map: fn(Output) -> Result<T>,
) -> Work<T> {
    let device = spec.device;
    let plan = match Plan::new(
        Request::Recv {
            spec: spec.clone().on(Device::Host),
            src,
            tag,
        },
        &comm.group.info,
        opts,
    ) {
        Ok(p) => p.with_path(DataPath::Nccl),
        Err(e) => return comm.ready(Err(e)),
    };
    let (c, work) = Work::raw(comm.rank.rank_threads.clone());
    let ticket = comm.issue(0, plan, Ok);
    let me = comm.clone();
    let opts = opts.clone();
    comm.rank.arbiter.spawn(async move {
        let r = match ticket.await {
            Ok(Output::Received { tensor, src }) => {
                let ticket = tensor.to_vec::<u8>().unwrap_or_default();
                match on_ticket(&me, &ticket, src, (spec, device), &opts) {
                    Ok(w) => w.await.map(|tensor| Output::Received { tensor, src }),
                    Err(e) => Err(e),
                }
            }
            Ok(other) => Err(Error::internal(format!("a ticket receive gave {other:?}"))),
            Err(e) => Err(e),
        };
        c.complete(r.and_then(map));
    });
    work
}

/// Answers a ticket from `src`: posts transfer `k` of the lane, then tells the sender `k`
/// (or refuses, and the sender's send fails at once).
fn on_ticket(
    comm: &Communicator,
    ticket: &[u8],
    src: usize,
    (spec, device): (TensorSpec, Device),
    opts: &CallOptions,
) -> Result<Work<Tensor>> {
    let s = u64_at(ticket, 0);
    let carrier = match ticket.get(8) {
        Some(0) => Some(Carrier::Nccl),
        Some(1) => Some(Carrier::Host),
        _ => None,
    };
    let (Some(s), Some(carrier), TICKET_BYTES) = (s, carrier, ticket.len()) else {
        return Err(Error::Protocol {
            rank: comm.group.info.global(src),
            detail: ProtocolError::Malformed(format!(
                "a device send's ticket of {} bytes",
                ticket.len()
            )),
        });
    };
    let go = |k: u64, status: u64, id: [u8; 128]| {
        let mut b = Vec::with_capacity(GO_BYTES);
        b.extend_from_slice(&s.to_le_bytes());
        b.extend_from_slice(&k.to_le_bytes());
        b.extend_from_slice(&status.to_le_bytes());
        b.extend_from_slice(&id);
        // Eager (small): it completes at once; a failure here shows as the sender's
        // timeout and the transfer's. Dropping the handle leaves the send to the engine.
        drop(comm.call_host(
            Request::Send {
                tensor: Tensor::from_vec(b),
                dst: src,
                tag: carrier.go_tag(),
            },
            opts,
            |_| Ok(()),
        ));
    };
    let mut lanes = comm.group.p2p.lock();
    if lanes.released {
        go(0, REFUSED_BROKEN, [0; 128]);
        return Err(Error::Shutdown);
    }
    let lane = lanes.inn.entry((src, carrier)).or_default();
    if let Some(e) = &lane.broken {
        go(0, REFUSED_BROKEN, [0; 128]);
        return Err(e.clone());
    }
    if let Err(e) = same_device(&mut lane.device, device) {
        go(0, REFUSED_DEVICE, [0; 128]);
        return Err(e);
    }
    let k = lane.next_k;
    let mut id = [0u8; 128];
    if k == 0 && carrier == Carrier::Nccl {
        #[cfg(feature = "cuda")]
        let made = super::cuda::nccl::Nccl::load().and_then(|n| n.unique_id());
        #[cfg(not(feature = "cuda"))]
        let made: Result<[u8; 128]> = Err(DeviceError::FeatureDisabled.into());
        match made {
            Ok(i) => id = i,
            Err(e) => {
                go(0, REFUSED_NO_NCCL, id);
                return Err(e);
            }
        }
    }
    // Transfer `k` is posted before the sender hears of it, with the lock held: the lane's
    // transfers are posted in ordinal order, and one that cannot be posted is refused.
    let posted: Result<Work<Tensor>> = match carrier {
        Carrier::Host => {
            let data = comm.call_host(
                Request::Recv {
                    spec: spec.on(Device::Host),
                    src: Some(src),
                    tag: DATA_TAG,
                },
                opts,
                move |out| match out {
                    Output::Received { tensor, .. } => StandIn::tensor(&tensor, device),
                    other => Err(Error::internal(format!("a transfer gave {other:?}"))),
                },
            );
            let me = comm.clone();
            let (c, work) = Work::raw(comm.rank.rank_threads.clone());
            comm.rank.arbiter.spawn(async move {
                let r = data.await;
                if let Err(e) = &r {
                    break_in_lane(&me.group.p2p, (src, carrier), e.clone());
                }
                c.complete(r);
            });
            Ok(work)
        }
        #[cfg(feature = "cuda")]
        Carrier::Nccl => nccl::recv_job(comm, (src, carrier), lane, (k, id), spec, device, opts),
        #[cfg(not(feature = "cuda"))]
        Carrier::Nccl => Err(DeviceError::FeatureDisabled.into()),
    };
    match posted {
        Ok(work) => {
            lane.next_k += 1;
            go(k, 0, id);
            Ok(work)
        }
        Err(e) => {
            lane.broken = Some(e.clone());
            go(0, REFUSED_BROKEN, [0; 128]);
            Err(e)
        }
    }
}

/// Breaks a lane from a peer: every later receive matched to it fails with `e`.
fn break_in_lane(lanes: &Lanes, key: (usize, Carrier), e: Error) {
    if let Some(lane) = lanes.lock().inn.get_mut(&key) {
        lane.broken.get_or_insert(e);
    }
}

/// The NCCL carrier: a device worker per lane, running the lane's transfers in ordinal
/// order on a communicator of two ranks (the sender is rank 0).
#[cfg(feature = "cuda")]
mod nccl {
    use super::super::cuda::ops::{Finish, Op};
    use super::super::cuda::worker::{Call, Init, Job, WorkerHandle};
    use super::{break_in_lane, break_out_lane, Carrier, InLane, OutLane, SendDone};
    use crate::comm::Communicator;
    use crate::work::{Done, Work};
    use collectix_runtime::{
        CallOptions, DType, Device, Error, OpKind, Output, Result, Tensor, TensorSpec,
    };

    /// The lane's worker, started on first use.
    pub(super) fn worker(
        slot: &mut Option<WorkerHandle>,
        comm: &Communicator,
        what: &str,
    ) -> Result<crossbeam_channel::Sender<Job>> {
        if let Some(w) = slot.as_ref() {
            return Ok(w.sender());
        }
        let w = WorkerHandle::spawn_named(format!("cx-nccl-{}-{what}", comm.global_rank()))?;
        let tx = w.sender();
        *slot = Some(w);
        Ok(tx)
    }

    /// Transfer `k` of a lane as its worker runs it: lane rank 0 sends, 1 receives; the
    /// first transfer creates the lane's communicator of two ranks from the go's id.
    fn lane_call(
        comm: &Communicator,
        (k, id): (u64, [u8; 128]),
        (lane_rank, ordinal): (usize, u32),
        op: Op,
        opts: &CallOptions,
        done: Done<Output>,
    ) -> Box<Call> {
        Box::new(Call {
            group: comm.group.info.id,
            k,
            init: (k == 0).then_some(Init {
                id,
                rank: lane_rank,
                size: 2,
            }),
            device: ordinal,
            kind: if lane_rank == 0 {
                OpKind::Send
            } else {
                OpKind::Recv
            },
            dtype: DType::U8,
            rank: lane_rank,
            op,
            timeout: opts.timeout.unwrap_or(comm.group.info.options.timeout),
            done,
        })
    }

    /// Hands send `k` of a lane to the lane's worker.
    pub(super) fn send_job(
        comm: &Communicator,
        key: (usize, Carrier),
        lane: &mut OutLane,
        k_id: (u64, [u8; 128]),
        tensor: Tensor,
        opts: &CallOptions,
        done: SendDone,
    ) -> std::result::Result<(), (Error, SendDone)> {
        let ordinal = match tensor.device() {
            Device::Cuda(o) => o,
            d => return Err((Error::invalid(format!("an NCCL send from {d}")), done)),
        };
        let tx = match worker(&mut lane.worker, comm, &format!("to{}", key.0)) {
            Ok(t) => t,
            Err(e) => return Err((e, done)),
        };
        let bytes = tensor.nbytes();
        let op = Op::Exchange {
            sends: vec![(1, tensor, 0..bytes)],
            recvs: Vec::new(),
            local: Vec::new(),
            out_bytes: 0,
            finish: Finish::Nothing,
        };
        // Weak: a call the worker holds must not keep the group (and so the worker) alive.
        let group = std::sync::Arc::downgrade(&comm.group);
        let finished: Done<Output> = Box::new(move |r: Result<Output>| {
            if let (Err(e), Some(g)) = (&r, group.upgrade()) {
                break_out_lane(&g.p2p, key, e.clone());
            }
            done(r.map(|_| ()));
        });
        // A worker that is gone drops the call, whose `done` then reports `Shutdown`.
        let _ = tx.send(Job::Call(lane_call(
            comm,
            k_id,
            (0, ordinal),
            op,
            opts,
            finished,
        )));
        Ok(())
    }

    /// Hands receive `k` of a lane to the lane's worker.
    pub(super) fn recv_job(
        comm: &Communicator,
        key: (usize, Carrier),
        lane: &mut InLane,
        k_id: (u64, [u8; 128]),
        spec: TensorSpec,
        device: Device,
        opts: &CallOptions,
    ) -> Result<Work<Tensor>> {
        let Device::Cuda(ordinal) = device else {
            return Err(Error::invalid(format!("an NCCL receive into {device}")));
        };
        let tx = worker(&mut lane.worker, comm, &format!("from{}", key.0))?;
        let bytes = spec.numel()?.saturating_mul(spec.dtype.size());
        let (dtype, shape) = (spec.dtype, spec.shape.clone());
        let op = Op::Exchange {
            sends: Vec::new(),
            recvs: if bytes > 0 {
                vec![(0, 0..bytes)]
            } else {
                Vec::new()
            },
            local: Vec::new(),
            out_bytes: bytes,
            finish: Finish::Whole(vec![bytes]),
        };
        let (c, work) = Work::raw(comm.rank.rank_threads.clone());
        let group = std::sync::Arc::downgrade(&comm.group);
        let finished: Done<Output> = Box::new(move |r: Result<Output>| {
            // The bytes, viewed as the receive's dtype and shape.
            let r = r.and_then(|out| match out {
                Output::Tensor(t) => match t.device_storage() {
                    Some(st) => Tensor::from_device_storage(st.clone(), dtype, &shape),
                    None => Err(Error::internal("an NCCL receive into host memory")),
                },
                other => Err(Error::internal(format!("an NCCL receive gave {other:?}"))),
            });
            if let (Err(e), Some(g)) = (&r, group.upgrade()) {
                break_in_lane(&g.p2p, key, e.clone());
            }
            c.complete(r);
        });
        let _ = tx.send(Job::Call(lane_call(
            comm,
            k_id,
            (1, ordinal),
            op,
            opts,
            finished,
        )));
        Ok(work)
    }
}
