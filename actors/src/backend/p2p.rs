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

use crate::device::lanes::{
    fail_all, Carrier, Deferred, Failed, InLane, LanesInner, Locked, OutLane, PendingSend,
    RecvDone, Released, SendDone, Transfer,
};
use crate::device::{StandIn, TensorDeviceExt};
use crate::member::Member;
use crate::rank::driver::{Done, Driver};
use crate::work::Work;
use collectix_runtime::completion::Completer;
use collectix_runtime::error::ProtocolError;
use collectix_runtime::{
    CallOptions, DType, DataPath, Device, DeviceError, Error, Output, Plan, Request, Result,
    Tensor, TensorSpec,
};
use std::sync::Arc;

/// The first of the point-to-point tags collectix keeps for itself (up to `u32::MAX`): a
/// [`send`](crate::Communicator::send) or [`recv`](crate::Communicator::recv) with one of
/// them is refused with [`Error::InvalidArgument`].
pub const FIRST_RESERVED_TAG: u32 = 0xFFFF_FF00;
/// The data of a device send between stand-in tensors.
const DATA_TAG: u32 = FIRST_RESERVED_TAG + 2;

/// The tag the receivers' answers to a carrier's tickets travel on: one per carrier, so that
/// each lane's answers are matched only by that lane's waiting sends.
fn go_tag(carrier: Carrier) -> u32 {
    FIRST_RESERVED_TAG
        + match carrier {
            Carrier::Nccl => 0,
            Carrier::Host => 1,
            Carrier::Local => 3,
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
struct Notify<T> {
    c: Option<Completer<T>>,
    driver: Arc<Driver>,
}

impl<T> Notify<T> {
    fn new(c: Completer<T>, member: &Member) -> Notify<T> {
        Notify {
            c: Some(c),
            driver: member.rank.driver.clone(),
        }
    }

    fn complete(mut self, r: Result<T>) {
        if let Some(c) = self.c.take() {
            c.complete(r);
            self.driver.notify();
        }
    }
}

impl<T> Drop for Notify<T> {
    fn drop(&mut self) {
        if let Some(c) = self.c.take() {
            c.complete(Err(Error::Shutdown));
            self.driver.notify();
        }
    }
}

/// The carrier of a device tensor that `member` sends: the host for stand-ins, a device
/// copy between ranks of one process (they share a hub), NCCL between processes.
fn carrier_of(member: &Member, t: &Tensor) -> Result<Carrier> {
    if t.device_storage()
        .is_some_and(|s| s.as_any().is::<StandIn>())
    {
        return Ok(Carrier::Host);
    }
    crate::device::cuda::storage_of(t)?;
    Ok(if member.rank.hub.is_some() {
        Carrier::Local
    } else {
        Carrier::Nccl
    })
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// Plans a host request and issues it now; `done` gets its output (or the planning error).
fn issue(member: &Member, req: Request, opts: &CallOptions, done: Done<Output>) {
    match Plan::new(req, &member.group.info, opts) {
        Ok(plan) => member.issue_raw(0, plan, done),
        Err(e) => done(Err(e)),
    }
}

/// Issues a host-carried transfer (`req`, on the data tag) for `member`; `then` gets the
/// member back with the transfer's output, to break its lane if it failed.
fn issue_transfer(
    member: Member,
    req: Request,
    opts: &CallOptions,
    then: impl FnOnce(&Member, Result<Output>) + Send + 'static,
) {
    let me = member.clone();
    issue(&member, req, opts, Box::new(move |r| then(&me, r)));
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
pub(crate) fn send<T: Send + 'static>(
    member: &Member,
    tensor: Tensor,
    dst: usize,
    tag: u32,
    opts: &CallOptions,
    map: fn(Output) -> Result<T>,
) -> Work<T> {
    let carrier = match carrier_of(member, &tensor) {
        Ok(c) => c,
        Err(e) => return member.ready(Err(e)),
    };
    let info = &member.group.info;
    let key = (dst, carrier);
    let (dtype, count, device) = (tensor.dtype(), tensor.numel() as u64, tensor.device());
    let (c, work) = Work::raw(member.rank.rank_threads.clone());
    // Its caller drives the rank while it waits, as for any call: the steps run as it does.
    let work = work.driven_by(member.rank.driver.clone());
    let fin = Notify::new(c, member);
    let done: SendDone = Box::new(move |r| fin.complete(r.and_then(|()| map(Output::None))));
    let admitted = {
        let mut lanes = member.group.p2p.lock();
        if lanes.released {
            Err((Error::Shutdown, done))
        } else {
            let lane = lanes.out.entry(key).or_default();
            if let Some(e) = &lane.broken {
                Err((e.clone(), done))
            } else if let Err(e) = same_device(&mut lane.device, device) {
                Err((e, done))
            } else if let Err(e) = super::nccl::start_lane(member, key, lane) {
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
    let plan = match Plan::nccl_ticket(info, opts, dst, tag, dtype, count, ticket) {
        Ok(p) => p,
        Err(e) => {
            fail_pending(member, key, s, e);
            return work;
        }
    };
    // The wait for the receiver's answer takes the group's timeout, not the call's: answers
    // are matched in the order they come, by whichever of the lane's waiting sends posted
    // first, so each must wait as long as any.
    let me = member.clone();
    let opts_go = opts.clone();
    issue(
        member,
        Request::Recv {
            spec: TensorSpec::new(&[GO_BYTES], DType::U8),
            src: Some(dst),
            tag: go_tag(carrier),
        },
        &CallOptions::default(),
        Box::new(move |r| match r {
            Ok(out) => on_go(&me, key, out, &opts_go),
            // No answer within the timeout (or the group failed): the receiver's order is
            // unknown from here on, so the lane is broken.
            Err(e) => me.group.p2p.break_out(key, e),
        }),
    );
    let me = member.clone();
    member.issue_raw(
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

/// Fails send `s` of a lane, if it still waits.
fn fail_pending(member: &Member, key: (usize, Carrier), s: u64, e: Error) {
    let p = member
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

/// The receiver's answer to one of this rank's tickets.
fn on_go(member: &Member, key: (usize, Carrier), out: Output, opts: &CallOptions) {
    let b = match out {
        Output::Received { tensor, .. } => tensor.to_vec::<u8>().unwrap_or_default(),
        _ => Vec::new(),
    };
    let peer = member.group.info.global(key.0);
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
        let mut lanes = member.group.p2p.lock();
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
                    issue_released(member, key, Locked { lane, outbox }, opts)
                }
            },
            _ => lane.break_with(protocol(format!("an answer of {} bytes", b.len()))),
        }
    };
    fail_all(failed);
    member.group.p2p.drain();
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
    member: &Member,
    key: (usize, Carrier),
    mut at: Locked<'_, OutLane>,
    opts: &CallOptions,
) -> Failed {
    while let Some(r) = at.lane.released.remove(&at.lane.next_k) {
        let k = at.lane.next_k;
        at.lane.next_k += 1;
        if let Err((e, done)) = start_send(member, key, at.reborrow(), k, r, opts) {
            let mut failed = at.lane.break_with(e.clone());
            failed.push((done, e));
            return failed;
        }
    }
    Vec::new()
}

/// Issues transfer `k` of a lane to a peer (a host message goes into the outbox); gives
/// the send back if it could not.
fn start_send(
    member: &Member,
    key: (usize, Carrier),
    at: Locked<'_, OutLane>,
    k: u64,
    r: Released,
    opts: &CallOptions,
) -> std::result::Result<(), (Error, SendDone)> {
    let (dst, carrier) = key;
    let Locked { lane, outbox } = at;
    let Released { send, id } = r;
    let t = Transfer { k, id };
    let PendingSend { tensor, done } = send;
    match carrier {
        Carrier::Host => {
            let (me, opts) = (member.clone(), opts.clone());
            outbox.push_back(Box::new(move || {
                // The copy is made here, not under the lanes' lock.
                let host = match tensor.to_host() {
                    Ok(h) => h,
                    Err(e) => {
                        // Transfer `k` never leaves: the lane cannot go on.
                        me.group.p2p.break_out(key, e.clone());
                        return done(Err(e));
                    }
                };
                let req = Request::Send {
                    tensor: host,
                    dst,
                    tag: DATA_TAG,
                };
                issue_transfer(me, req, &opts, move |me, r| {
                    if let Err(e) = &r {
                        me.group.p2p.break_out(key, e.clone());
                    }
                    done(r.map(|_| ()));
                });
            }));
            Ok(())
        }
        Carrier::Nccl => super::nccl::send_job(member, key, lane, t, tensor, opts, done),
        Carrier::Local => {
            // Deposited once the lanes' lock is released (the last of the two ends to
            // deposit enqueues the copy).
            let (me, opts) = (member.clone(), opts.clone());
            outbox.push_back(Box::new(move || {
                super::nccl::local_send(&me, key, k, tensor, &opts, done)
            }));
            Ok(())
        }
    }
}

/// `recv` of a device tensor on the NCCL backend.
pub(crate) fn recv<T: Send + 'static>(
    member: &Member,
    spec: TensorSpec,
    src: Option<usize>,
    tag: u32,
    opts: &CallOptions,
    map: fn(Output) -> Result<T>,
) -> Work<T> {
    let plan = match Plan::new(
        Request::Recv {
            spec: spec.clone().on(Device::Host),
            src,
            tag,
        },
        &member.group.info,
        opts,
    ) {
        Ok(p) => p.with_path(DataPath::Nccl),
        Err(e) => return member.ready(Err(e)),
    };
    let (c, work) = Work::raw(member.rank.rank_threads.clone());
    // Its caller drives the rank while it waits, as for any call: the steps run as it does.
    let work = work.driven_by(member.rank.driver.clone());
    let fin = Notify::new(c, member);
    let (me, opts) = (member.clone(), opts.clone());
    member.issue_raw(
        0,
        plan,
        Box::new(move |r| match r {
            Ok(Output::Received { tensor, src }) => {
                let done: RecvDone = Box::new(move |r| {
                    fin.complete(r.and_then(|tensor| map(Output::Received { tensor, src })))
                });
                let ticket = tensor.to_vec::<u8>().unwrap_or_default();
                on_ticket(&me, &ticket, src, spec, &opts, done);
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
    member: &Member,
    ticket: &[u8],
    src: usize,
    spec: TensorSpec,
    opts: &CallOptions,
    done: RecvDone,
) {
    let device = spec.device;
    let s = u64_at(ticket, 0);
    let carrier = match ticket.get(8) {
        Some(0) => Some(Carrier::Nccl),
        Some(1) => Some(Carrier::Host),
        Some(2) => Some(Carrier::Local),
        _ => None,
    };
    let (Some(s), Some(carrier), TICKET_BYTES) = (s, carrier, ticket.len()) else {
        return done(Err(Error::Protocol {
            rank: member.group.info.global(src),
            detail: ProtocolError::Malformed(format!(
                "a device send's ticket of {} bytes",
                ticket.len()
            )),
        }));
    };
    // The answer, issued from the outbox (small and eager: it completes at once; a failure
    // shows as the sender's timeout and the transfer's).
    let go = |k: u64, status: u64, id: [u8; 128]| -> Deferred {
        let mut b = Vec::with_capacity(GO_BYTES);
        b.extend_from_slice(&s.to_le_bytes());
        b.extend_from_slice(&k.to_le_bytes());
        b.extend_from_slice(&status.to_le_bytes());
        b.extend_from_slice(&id);
        let (me, opts) = (member.clone(), opts.clone());
        Box::new(move || {
            let req = Request::Send {
                tensor: Tensor::from_vec(b),
                dst: src,
                tag: go_tag(carrier),
            };
            issue(&me, req, &opts, Box::new(|_| ()));
        })
    };
    let refused = {
        let mut lanes = member.group.p2p.lock();
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
                post(
                    member,
                    (src, carrier),
                    Locked { lane, outbox },
                    spec,
                    opts,
                    &go,
                    done,
                )
            }
        }
    };
    if let Some((done, e)) = refused {
        done(Err(e));
    }
    member.group.p2p.drain();
}

/// Takes the next ordinal `k` of a lane from a peer, makes the lane's NCCL id when `k = 0`,
/// posts transfer `k` and queues the answer, with the lock held (the lane's transfers are
/// posted in ordinal order, each before the sender hears of it). Gives `done` back, with
/// the error, when the transfer cannot be posted (the sender is refused).
fn post(
    member: &Member,
    key: (usize, Carrier),
    at: Locked<'_, InLane>,
    spec: TensorSpec,
    opts: &CallOptions,
    go: &dyn Fn(u64, u64, [u8; 128]) -> Deferred,
    done: RecvDone,
) -> Option<(RecvDone, Error)> {
    let (src, carrier) = key;
    let Locked { lane, outbox } = at;
    let device = spec.device;
    let k = lane.next_k;
    let mut id = [0u8; 128];
    if k == 0 && carrier == Carrier::Nccl {
        let made = crate::device::cuda::nccl::Nccl::load().and_then(|n| n.unique_id());
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
            let (me, opts) = (member.clone(), opts.clone());
            outbox.push_back(Box::new(move || {
                let req = Request::Recv {
                    spec: spec.on(Device::Host),
                    src: Some(src),
                    tag: DATA_TAG,
                };
                issue_transfer(me, req, &opts, move |me, r| {
                    let r = r.and_then(|out| match out {
                        Output::Received { tensor, .. } => StandIn::tensor(&tensor, device),
                        other => Err(Error::internal(format!("a transfer gave {other:?}"))),
                    });
                    if let Err(e) = &r {
                        me.group.p2p.break_in(key, e.clone());
                    }
                    done(r);
                });
            }));
            Ok(())
        }
        Carrier::Nccl => {
            super::nccl::recv_job(member, key, lane, Transfer { k, id }, spec, opts, done)
        }
        Carrier::Local if member.rank.hub.is_none() => Err((
            done,
            Error::internal("a device-local transfer to a rank with no hub"),
        )),
        Carrier::Local => {
            // Deposited before the go is sent (both from the outbox, in this order).
            let (me, opts) = (member.clone(), opts.clone());
            outbox.push_back(Box::new(move || {
                super::nccl::local_recv(&me, key, k, spec, &opts, done)
            }));
            Ok(())
        }
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

#[cfg(test)]
mod tests {
    use super::Notify;
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
            let (done, work) = Work::<u32>::raw(c.member.rank.rank_threads.clone());
            let work = work.driven_by(c.member.rank.driver.clone());
            let fin = Notify::new(done, &c.member);
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
