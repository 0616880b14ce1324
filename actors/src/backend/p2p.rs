//! Send and receive of device tensors on the NCCL backend: a rendezvous on the engine, then
//! the data on a lane of its own.
//!
//! NCCL matches point-to-point operations by order on a communicator, not by tag, and a
//! receive it has not reached blocks everything behind it on the communicator's stream. A
//! collectix receive is matched by (source, tag), possibly from any source, so the order in
//! which a receiver takes messages need not be the order they were sent. The protocol makes
//! the receiver decide the order, and gives every direction between two ranks a
//! communicator of its own (a *lane*), so that no transfer ever waits behind another one it
//! does not depend on. Its decisions (serial numbers, ordinals, refusals, broken lanes) are
//! the runtime's state machine, [`collectix_runtime::device_lanes`]; this module moves it
//! on:
//!
//! 1. The sender sends a *ticket* on the user's tag: a message on the engine marked
//!    [`DataPath::Nccl`] that says "`count` elements of `dtype`" and carries the send's
//!    serial number `s` and its carrier (NCCL, or the host for [`StandIn`] tensors). It is
//!    matched like any message, by (source, tag) in FIFO order; a receive on the engine's
//!    path, or of another size, is an [`Error::Mismatch`] on both ranks
//!    (`collectix-runtime`'s `Plan::nccl_ticket`). The sender posts a receive for the answer.
//! 2. The receiver's receive (marked [`DataPath::Nccl`]) matches the ticket. The lanes give
//!    it the next ordinal `k` of the lane (sender → receiver), and the lane's NCCL id when
//!    `k = 0`; it posts transfer `k` and answers *go* `(s, k, id)` on a reserved tag.
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
//! lock — so the lanes queue what must be issued in order ([`Action`]s), and one thread at
//! a time issues them once the lock is released ([`drain`]).

use crate::device::lanes::{
    Carrier, Key, PendingRecv, PendingSend, Protocol, RecvDone, SendDone, Transfer,
};
use crate::device::{StandIn, TensorDeviceExt};
use crate::member::Member;
use crate::rank::driver::{Done, Driver};
use crate::work::Work;
use collectix_runtime::completion::Completer;
use collectix_runtime::device_lanes::{Action, GO_BYTES};
use collectix_runtime::{
    CallOptions, DType, DataPath, Device, Error, Output, Plan, Request, Result, Tensor, TensorSpec,
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
    member: &Member,
    req: Request,
    opts: &CallOptions,
    then: impl FnOnce(&Member, Result<Output>) + Send + 'static,
) {
    let me = member.clone();
    issue(member, req, opts, Box::new(move |r| then(&me, r)));
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
    let pending = PendingSend {
        tensor,
        opts: opts.clone(),
        done,
    };
    let admitted = member.group.p2p.lock().protocol.send(key, device, pending);
    let ticket = match admitted {
        Ok(t) => t,
        Err((e, p)) => {
            (p.done)(Err(e));
            return work;
        }
    };
    let s = Protocol::ticket_serial(&ticket);
    // A sender without libnccl fails at once rather than after its receiver has answered.
    let plan = super::nccl::start_lane(member, key)
        .and_then(|()| Plan::nccl_ticket(info, opts, dst, tag, dtype, count, ticket.to_vec()));
    let plan = match plan {
        Ok(p) => p,
        Err(e) => {
            member.group.p2p.update(|p| p.ticket_failed(key, s, e));
            return work;
        }
    };
    // The wait for the receiver's answer takes the group's timeout, not the call's: answers
    // are matched in the order they come, by whichever of the lane's waiting sends posted
    // first, so each must wait as long as any.
    let me = member.clone();
    issue(
        member,
        Request::Recv {
            spec: TensorSpec::new(&[GO_BYTES], DType::U8),
            src: Some(dst),
            tag: go_tag(carrier),
        },
        &CallOptions::default(),
        Box::new(move |r| match r {
            Ok(out) => on_go(&me, key, out),
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
                me.group.p2p.update(|p| p.ticket_failed(key, s, e));
            }
        }),
    );
    work
}

/// The receiver's answer to one of this rank's tickets.
fn on_go(member: &Member, key: Key, out: Output) {
    let b = match out {
        Output::Received { tensor, .. } => tensor.to_vec::<u8>().unwrap_or_default(),
        _ => Vec::new(),
    };
    let peer = member.group.info.global(key.0);
    member.group.p2p.update(|p| p.on_go(key, peer, &b));
    drain(member);
}

/// Issues the lanes' queued actions, in order, unless another thread is at it (it then
/// issues what was queued since, too). Called without the lanes' lock held.
fn drain(member: &Member) {
    let lanes = &member.group.p2p;
    if !lanes.lock().protocol.begin_drain() {
        return;
    }
    // Should an action unwind, the next drain must still be possible.
    struct Owner<'a>(&'a crate::device::lanes::Lanes, bool);
    impl Drop for Owner<'_> {
        fn drop(&mut self) {
            if self.1 {
                self.0.lock().protocol.abandon_drain();
            }
        }
    }
    let mut owner = Owner(lanes, true);
    loop {
        let next = lanes.lock().protocol.next_action();
        match next {
            Some(Action::Transfer { key, k, id, send }) => start_send(member, key, k, id, send),
            Some(Action::Post { key, k, id, recv }) => post(member, key, k, id, recv),
            Some(Action::Answer { key, go }) => {
                let req = Request::Send {
                    tensor: Tensor::from_vec(go),
                    dst: key.0,
                    tag: go_tag(key.1),
                };
                // Small and eager: it completes at once; a failure shows as the sender's
                // timeout and the transfer's.
                issue(member, req, &CallOptions::default(), Box::new(|_| ()));
            }
            None => {
                owner.1 = false;
                return;
            }
        }
    }
}

/// Issues transfer `k` of a lane to a peer. One that cannot be issued fails its send and
/// breaks the lane: an ordinal skipped on one end would pair the next transfer with the
/// wrong receive.
fn start_send(member: &Member, key: Key, k: u64, id: [u8; 128], send: PendingSend) {
    let (dst, carrier) = key;
    let PendingSend { tensor, opts, done } = send;
    match carrier {
        Carrier::Host => {
            let host = match tensor.to_host() {
                Ok(h) => h,
                Err(e) => {
                    member.group.p2p.break_out(key, e.clone());
                    return done(Err(e));
                }
            };
            let req = Request::Send {
                tensor: host,
                dst,
                tag: DATA_TAG,
            };
            issue_transfer(member, req, &opts, move |me, r| {
                if let Err(e) = &r {
                    me.group.p2p.break_out(key, e.clone());
                }
                done(r.map(|_| ()));
            });
        }
        Carrier::Nccl => {
            let t = Transfer { k, id };
            if let Err((e, done)) = super::nccl::send_job(member, key, t, tensor, &opts, done) {
                member.group.p2p.break_out(key, e.clone());
                done(Err(e));
            }
        }
        Carrier::Local => super::nccl::local_send(member, key, k, tensor, &opts, done),
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
                let device = spec.device;
                let recv = PendingRecv { spec, opts, done };
                let peer = me.group.info.global(src);
                // The lane's NCCL id is made for its first transfer only.
                let make_id =
                    || crate::device::cuda::nccl::Nccl::load().and_then(|n| n.unique_id());
                me.group
                    .p2p
                    .update(|p| p.on_ticket(src, peer, &ticket, device, recv, make_id));
                drain(&me);
            }
            Ok(other) => fin.complete(Err(Error::internal(format!(
                "a ticket receive gave {other:?}"
            )))),
            Err(e) => fin.complete(Err(e)),
        }),
    );
    work
}

/// Posts transfer `k` of a lane from a peer, before its go leaves. One that cannot be
/// posted fails its receive and breaks the lane (its go, and the lane's gos queued behind
/// it, become refusals).
fn post(member: &Member, key: Key, k: u64, id: [u8; 128], recv: PendingRecv) {
    let (src, carrier) = key;
    let PendingRecv { spec, opts, done } = recv;
    let device = spec.device;
    let failed = match carrier {
        Carrier::Host => {
            let req = Request::Recv {
                spec: spec.on(Device::Host),
                src: Some(src),
                tag: DATA_TAG,
            };
            issue_transfer(member, req, &opts, move |me, r| {
                let r = r.and_then(|out| match out {
                    Output::Received { tensor, .. } => StandIn::tensor(&tensor, device),
                    other => Err(Error::internal(format!("a transfer gave {other:?}"))),
                });
                if let Err(e) = &r {
                    me.group.p2p.break_in(key, e.clone());
                }
                done(r);
            });
            None
        }
        Carrier::Nccl => {
            let t = Transfer { k, id };
            super::nccl::recv_job(member, key, t, spec, &opts, done).err()
        }
        Carrier::Local if member.rank.hub.is_none() => Some((
            done,
            Error::internal("a device-local transfer to a rank with no hub"),
        )),
        Carrier::Local => {
            super::nccl::local_recv(member, key, k, spec, &opts, done);
            None
        }
    };
    if let Some((done, e)) = failed {
        member
            .group
            .p2p
            .update(|p| p.post_failed(key, k, e.clone()));
        done(Err(e));
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
