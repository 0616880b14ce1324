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
//! buffer), as torch's NCCL `isend` does, and waits for its receiver at most the group's
//! timeout. A transfer that fails or times out breaks its lane on that rank: every later
//! device send or receive between the two ranks in that direction fails with the same
//! error (as a timed-out NCCL operation aborts torch's communicator).
//!
//! Each step runs in the completion callback of the step before (whoever drives the rank
//! runs it at once: no thread is woken for it). A callback never calls the engine with the
//! lanes' lock held — the engine may run other callbacks on the same thread, which take the
//! lock — so what must be issued in ordinal order goes into the lanes' *outbox* under the
//! lock, and is issued, in order, by one thread at a time once the lock is released.

use super::standin::StandIn;
use super::TensorDeviceExt;
use crate::comm::{Communicator, DATA_TAG, GO_TAGS};
use crate::rank::driver::{Done, Driver};
use crate::work::Work;
use collectix_runtime::completion::Completer;
use collectix_runtime::error::ProtocolError;
use collectix_runtime::{
    CallOptions, DType, DataPath, Device, DeviceError, Error, Output, Plan, Request, Result,
    Tensor, TensorSpec,
};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};

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

/// A user's `Work`, completed once: with its result, or with [`Error::Shutdown`] when it is
/// dropped unfinished (a device worker that died with the call). Either way the callers
/// parked on its rank are woken: the call may complete on a device worker's thread, outside
/// any run of the engine, which would not announce it.
struct Finish<T> {
    c: Option<Completer<T>>,
    driver: Arc<Driver>,
}

impl<T> Finish<T> {
    fn new(c: Completer<T>, comm: &Communicator) -> Finish<T> {
        Finish {
            c: Some(c),
            driver: comm.rank.driver.clone(),
        }
    }

    fn complete(mut self, r: Result<T>) {
        if let Some(c) = self.c.take() {
            c.complete(r);
            self.driver.notify();
        }
    }
}

impl<T> Drop for Finish<T> {
    fn drop(&mut self) {
        if let Some(c) = self.c.take() {
            c.complete(Err(Error::Shutdown));
            self.driver.notify();
        }
    }
}

/// Completes a send's `Work`.
type SendDone = Box<dyn FnOnce(Result<()>) + Send>;

/// Completes a receive's `Work` with the received tensor.
type RecvDone = Box<dyn FnOnce(Result<Tensor>) + Send>;

/// A call on the engine, queued under the lanes' lock and issued after it (see the module
/// doc).
type Action = Box<dyn FnOnce() + Send>;

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
    /// Calls on the engine to issue, in this order, once the lock is released.
    outbox: VecDeque<Action>,
    /// A thread is issuing the outbox.
    draining: bool,
}

impl Lanes {
    fn lock(&self) -> std::sync::MutexGuard<'_, LanesInner> {
        crate::sync::lock(&self.inner)
    }

    /// Issues the outbox, in order, unless another thread is at it (it then issues what was
    /// added too). Called without the lock held.
    fn drain(&self) {
        {
            let mut lanes = self.lock();
            if lanes.draining {
                return;
            }
            lanes.draining = true;
        }
        // Should an action unwind, the next drain must still be possible.
        struct Owner<'a>(&'a Lanes, bool);
        impl Drop for Owner<'_> {
            fn drop(&mut self) {
                if self.1 {
                    self.0.lock().draining = false;
                }
            }
        }
        let mut owner = Owner(self, true);
        loop {
            let next = {
                let mut lanes = self.lock();
                match lanes.outbox.pop_front() {
                    Some(a) => a,
                    None => {
                        lanes.draining = false;
                        owner.1 = false;
                        return;
                    }
                }
            };
            next();
        }
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

/// Plans a host request and issues it now; `done` gets its output (or the planning error).
fn issue(comm: &Communicator, req: Request, opts: &CallOptions, done: Done<Output>) {
    match Plan::new(req, &comm.group.info, opts) {
        Ok(plan) => comm.issue_raw(0, plan, done),
        Err(e) => done(Err(e)),
    }
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
    // Its caller drives the rank while it waits, as for any call: the steps run as it does.
    let work = work.driven_by(comm.rank.driver.clone());
    let fin = Finish::new(c, comm);
    let done: SendDone = Box::new(move |r| fin.complete(r.and_then(|()| map(Output::None))));
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
    let me = comm.clone();
    let opts_go = opts.clone();
    issue(
        comm,
        Request::Recv {
            spec: TensorSpec::new(&[GO_BYTES], DType::U8),
            src: Some(dst),
            tag: carrier.go_tag(),
        },
        &CallOptions::default(),
        Box::new(move |r| match r {
            Ok(out) => on_go(&me, key, out, &opts_go),
            // No answer within the timeout (or the group failed): the receiver's order is
            // unknown from here on, so the lane is broken.
            Err(e) => break_out_lane(&me.group.p2p, key, e),
        }),
    );
    let me = comm.clone();
    comm.issue_raw(
        0,
        plan,
        Box::new(move |r| {
            if let Err(e) = r {
                fail_pending(&me, key, s, e);
            }
        }),
    );
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
        let LanesInner { out, outbox, .. } = &mut *lanes;
        let Some(lane) = out.get_mut(&key) else {
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
                    issue_released(comm, key, (lane, outbox), opts)
                }
            },
            _ => lane.break_with(protocol(format!("an answer of {} bytes", b.len()))),
        }
    };
    fail_all(failed);
    comm.group.p2p.drain();
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
    (lane, outbox): (&mut OutLane, &mut VecDeque<Action>),
    opts: &CallOptions,
) -> Failed {
    while let Some(r) = lane.released.remove(&lane.next_k) {
        let k = lane.next_k;
        lane.next_k += 1;
        if let Err((e, done)) = start_send(comm, key, (lane, outbox), k, r, opts) {
            let mut failed = lane.break_with(e.clone());
            failed.push((done, e));
            return failed;
        }
    }
    Vec::new()
}

/// Issues transfer `k` of a lane to a peer (a host message goes into the outbox); gives
/// the send back if it could not.
fn start_send(
    comm: &Communicator,
    key: (usize, Carrier),
    (lane, outbox): (&mut OutLane, &mut VecDeque<Action>),
    k: u64,
    r: Released,
    opts: &CallOptions,
) -> std::result::Result<(), (Error, SendDone)> {
    let (dst, carrier) = key;
    let Released { send, id } = r;
    let PendingSend { tensor, done } = send;
    match carrier {
        Carrier::Host => {
            let (me, opts) = (comm.clone(), opts.clone());
            outbox.push_back(Box::new(move || {
                // The copy is made here, not under the lanes' lock.
                let host = match tensor.to_host() {
                    Ok(h) => h,
                    Err(e) => {
                        // Transfer `k` never leaves: the lane cannot go on.
                        break_out_lane(&me.group.p2p, key, e.clone());
                        return done(Err(e));
                    }
                };
                let req = Request::Send {
                    tensor: host,
                    dst,
                    tag: DATA_TAG,
                };
                let lanes = me.clone();
                issue(
                    &me,
                    req,
                    &opts,
                    Box::new(move |r| {
                        if let Err(e) = &r {
                            break_out_lane(&lanes.group.p2p, key, e.clone());
                        }
                        done(r.map(|_| ()));
                    }),
                );
            }));
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
    // Its caller drives the rank while it waits, as for any call: the steps run as it does.
    let work = work.driven_by(comm.rank.driver.clone());
    let fin = Finish::new(c, comm);
    let (me, opts) = (comm.clone(), opts.clone());
    comm.issue_raw(
        0,
        plan,
        Box::new(move |r| match r {
            Ok(Output::Received { tensor, src }) => {
                let done: RecvDone = Box::new(move |r| {
                    fin.complete(r.and_then(|tensor| map(Output::Received { tensor, src })))
                });
                let ticket = tensor.to_vec::<u8>().unwrap_or_default();
                on_ticket(&me, (&ticket, src), (spec, device), &opts, done);
            }
            Ok(other) => fin.complete(Err(Error::internal(format!(
                "a ticket receive gave {other:?}"
            )))),
            Err(e) => fin.complete(Err(e)),
        }),
    );
    work
}

/// Answers a ticket from `src`: posts transfer `k` of the lane, then tells the sender `k`
/// (or refuses, and the sender's send fails at once); `done` gets the transfer's tensor.
fn on_ticket(
    comm: &Communicator,
    (ticket, src): (&[u8], usize),
    (spec, device): (TensorSpec, Device),
    opts: &CallOptions,
    done: RecvDone,
) {
    let s = u64_at(ticket, 0);
    let carrier = match ticket.get(8) {
        Some(0) => Some(Carrier::Nccl),
        Some(1) => Some(Carrier::Host),
        _ => None,
    };
    let (Some(s), Some(carrier), TICKET_BYTES) = (s, carrier, ticket.len()) else {
        return done(Err(Error::Protocol {
            rank: comm.group.info.global(src),
            detail: ProtocolError::Malformed(format!(
                "a device send's ticket of {} bytes",
                ticket.len()
            )),
        }));
    };
    // The answer, issued from the outbox (small and eager: it completes at once; a failure
    // shows as the sender's timeout and the transfer's).
    let go = |k: u64, status: u64, id: [u8; 128]| -> Action {
        let mut b = Vec::with_capacity(GO_BYTES);
        b.extend_from_slice(&s.to_le_bytes());
        b.extend_from_slice(&k.to_le_bytes());
        b.extend_from_slice(&status.to_le_bytes());
        b.extend_from_slice(&id);
        let (me, opts) = (comm.clone(), opts.clone());
        Box::new(move || {
            let req = Request::Send {
                tensor: Tensor::from_vec(b),
                dst: src,
                tag: carrier.go_tag(),
            };
            issue(&me, req, &opts, Box::new(|_| ()));
        })
    };
    let refused = {
        let mut lanes = comm.group.p2p.lock();
        let LanesInner {
            inn,
            outbox,
            released,
            ..
        } = &mut *lanes;
        if *released {
            outbox.push_back(go(0, REFUSED_BROKEN, [0; 128]));
            Some((done, Error::Shutdown))
        } else {
            let lane = inn.entry((src, carrier)).or_default();
            if let Some(e) = &lane.broken {
                outbox.push_back(go(0, REFUSED_BROKEN, [0; 128]));
                Some((done, e.clone()))
            } else if let Err(e) = same_device(&mut lane.device, device) {
                outbox.push_back(go(0, REFUSED_DEVICE, [0; 128]));
                Some((done, e))
            } else {
                post(comm, (src, carrier), (lane, outbox), spec, opts, &go, done)
            }
        }
    };
    if let Some((done, e)) = refused {
        done(Err(e));
    }
    comm.group.p2p.drain();
}

/// Takes the next ordinal `k` of a lane from a peer, makes the lane's NCCL id when `k = 0`,
/// posts transfer `k` and queues the answer, with the lock held (the lane's transfers are
/// posted in ordinal order, each before the sender hears of it). Gives `done` back, with
/// the error, when the transfer cannot be posted (the sender is refused).
fn post(
    comm: &Communicator,
    key: (usize, Carrier),
    (lane, outbox): (&mut InLane, &mut VecDeque<Action>),
    spec: TensorSpec,
    opts: &CallOptions,
    go: &dyn Fn(u64, u64, [u8; 128]) -> Action,
    done: RecvDone,
) -> Option<(RecvDone, Error)> {
    let (src, carrier) = key;
    let device = spec.device;
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
                outbox.push_back(go(0, REFUSED_NO_NCCL, id));
                return Some((done, e));
            }
        }
    }
    let posted: std::result::Result<(), (RecvDone, Error)> = match carrier {
        Carrier::Host => {
            let (me, opts) = (comm.clone(), opts.clone());
            outbox.push_back(Box::new(move || {
                let req = Request::Recv {
                    spec: spec.on(Device::Host),
                    src: Some(src),
                    tag: DATA_TAG,
                };
                let lanes = me.clone();
                issue(
                    &me,
                    req,
                    &opts,
                    Box::new(move |r| {
                        let r = r.and_then(|out| match out {
                            Output::Received { tensor, .. } => StandIn::tensor(&tensor, device),
                            other => Err(Error::internal(format!("a transfer gave {other:?}"))),
                        });
                        if let Err(e) = &r {
                            break_in_lane(&lanes.group.p2p, key, e.clone());
                        }
                        done(r);
                    }),
                );
            }));
            Ok(())
        }
        #[cfg(feature = "cuda")]
        Carrier::Nccl => nccl::recv_job(comm, key, lane, (k, id), spec, opts, done),
        #[cfg(not(feature = "cuda"))]
        Carrier::Nccl => Err((done, DeviceError::FeatureDisabled.into())),
    };
    match posted {
        Ok(()) => {
            lane.next_k += 1;
            outbox.push_back(go(k, 0, id));
            None
        }
        Err((done, e)) => {
            lane.broken = Some(e.clone());
            outbox.push_back(go(0, REFUSED_BROKEN, [0; 128]));
            Some((done, e))
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
    use super::{break_in_lane, break_out_lane, Carrier, InLane, OutLane, RecvDone, SendDone};
    use crate::comm::Communicator;
    use crate::rank::driver::Done;
    use collectix_runtime::{
        CallOptions, DType, Device, Error, OpKind, Output, Result, Tensor, TensorSpec,
    };
    use crossbeam_channel::SendError;

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
        // A worker that is gone gives the call back, to be failed once the lock is released.
        match tx.send(Job::Call(lane_call(
            comm,
            k_id,
            (0, ordinal),
            op,
            opts,
            finished,
        ))) {
            Ok(()) => Ok(()),
            Err(SendError(job)) => Err((Error::Shutdown, Box::new(move |r| fail_job(job, r)))),
        }
    }

    /// Hands receive `k` of a lane to the lane's worker; gives `done` back if it cannot.
    pub(super) fn recv_job(
        comm: &Communicator,
        key: (usize, Carrier),
        lane: &mut InLane,
        k_id: (u64, [u8; 128]),
        spec: TensorSpec,
        opts: &CallOptions,
        done: RecvDone,
    ) -> std::result::Result<(), (RecvDone, Error)> {
        let Device::Cuda(ordinal) = spec.device else {
            let e = Error::invalid(format!("an NCCL receive into {}", spec.device));
            return Err((done, e));
        };
        let tx = match worker(&mut lane.worker, comm, &format!("from{}", key.0)) {
            Ok(t) => t,
            Err(e) => return Err((done, e)),
        };
        let bytes = match spec.numel() {
            Ok(n) => n.saturating_mul(spec.dtype.size()),
            Err(e) => return Err((done, e)),
        };
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
            done(r);
        });
        // A worker that is gone gives the call back, to be failed once the lock is released.
        match tx.send(Job::Call(lane_call(
            comm,
            k_id,
            (1, ordinal),
            op,
            opts,
            finished,
        ))) {
            Ok(()) => Ok(()),
            Err(SendError(job)) => Err((Box::new(move |r| fail_job(job, r)), Error::Shutdown)),
        }
    }

    /// Fails a call that a gone worker gave back: its `done` gets `r`'s error (never a
    /// result: the call did not run).
    fn fail_job<T>(job: Job, r: Result<T>) {
        if let Job::Call(call) = job {
            (call.done)(Err(r.err().unwrap_or(Error::Shutdown)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Finish;
    use crate::work::Work;
    use crate::World;
    use collectix_runtime::Error;
    use std::time::Duration;

    /// A device call completed (or dropped) on a worker's thread, outside any run of the
    /// engine, still wakes the caller parked in `wait()` on its rank.
    #[test]
    fn a_call_finished_off_the_engine_wakes_its_parked_caller() {
        let world = World::local(1).unwrap_or_else(|e| panic!("{e}"));
        let c = world.communicators()[0].clone();
        for drop_it in [false, true] {
            let (done, work) = Work::<u32>::raw(c.rank.rank_threads.clone());
            let work = work.driven_by(c.rank.driver.clone());
            let fin = Finish::new(done, &c);
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let _ = tx.send(work.wait());
            });
            // Long past the caller's spin: it is parked on the rank.
            std::thread::sleep(Duration::from_millis(200));
            std::thread::spawn(move || {
                if drop_it {
                    drop(fin);
                } else {
                    fin.complete(Ok(7));
                }
            });
            let got = rx.recv_timeout(Duration::from_secs(30));
            let want = if drop_it { Err(Error::Shutdown) } else { Ok(7) };
            assert_eq!(got.ok(), Some(want), "dropped: {drop_it}");
        }
    }
}
