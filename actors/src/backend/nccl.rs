//! The NCCL backend: calls on CUDA tensors run by NCCL on the group's device worker, after
//! an agreement step on the engine; and the NCCL carrier of device send and receive, a
//! worker per lane running the lane's transfers in ordinal order on a communicator of two
//! ranks (the sender is rank 0).
//!
//! The agreement step is a small all_gather marked [`DataPath::Nccl`]: every rank's call
//! fingerprint, the call's NCCL ordinal, a status, its device, and (on the group's first
//! NCCL call) rank 0's NCCL id, checked alike on every rank by the runtime
//! (`collectix_runtime::device_agreement`). Mismatched calls fail on every rank there, before
//! NCCL is called; the worker then creates the group's communicator if it has none, runs the
//! operation, and completes the call's `Work` when its CUDA event fires (or aborts the
//! communicator when it does not within the group's timeout).
//!
//! The ranks of one process (a [`World`](crate::World)) share a hub: when the agreement
//! shows every member on the same device, the call takes the device-local path instead
//! (`device/cuda/local.rs`: device copies and a reduction kernel, no NCCL, which refuses two
//! ranks on one device); on different devices it runs on NCCL, the group's NCCL id coming
//! from the hub. Every rank sees the same agreement, so every rank takes the same path.

use crate::device::cuda::local::{Deposit, LocalHub, Part};
use crate::device::cuda::nccl::Nccl;
use crate::device::cuda::worker::{Call, Init, Job, LocalCall, WorkerHandle};
use crate::device::cuda::{plan, Exchange, NcclOp, OutputLayout, Runner};
use crate::device::lanes::{Carrier, Key, RecvDone, SendDone, Transfer};
use crate::member::Member;
use crate::rank::driver::Done;
use crate::sync::lock;
use crate::work::Work;
use collectix_runtime::device_agreement::{takes_local_path, Agreed, Ours, BLOCK_BYTES};
use collectix_runtime::{
    CallOptions, DType, DataPath, Device, Error, OpKind, Output, Plan, Request, Result, Tensor,
    TensorSpec,
};
use crossbeam_channel::SendError;
use std::sync::Arc;

/// The group's worker on this rank, started on first use; with a hub (the ranks of one
/// process) it loads libnccl only if an NCCL call comes.
fn group_worker(member: &Member) -> Result<crossbeam_channel::Sender<Job>> {
    let mut slot = lock(&member.group.nccl_worker);
    if let Some(w) = slot.as_ref() {
        return Ok(w.sender());
    }
    let name = format!(
        "cx-nccl-{}-{:x}",
        member.global_rank(),
        member.group.info.id.0 & 0xffff
    );
    let w = if member.rank.hub.is_some() {
        WorkerHandle::spawn_lazy(name)?
    } else {
        WorkerHandle::spawn_named(name)?
    };
    let tx = w.sender();
    *slot = Some(w);
    Ok(tx)
}

/// A call on CUDA tensors that failed on this rank before its agreement step: it takes its
/// NCCL ordinal and its sequence number, as it would have (so the group's next call is the
/// next on every member), and the other members hear at once (`Member::refuse`): their
/// agreement steps fail with `Error::CallFailed`. The group's worker is told that the
/// ordinal never runs, or it would wait for it before every later call.
pub(super) fn refuse<T: Send + 'static>(member: &Member, e: Error) -> Work<T> {
    let mut n = lock(&member.group.nccl_calls);
    let k = *n;
    *n += 1;
    let w = member.refuse(false, e);
    drop(n);
    // Without a worker (libnccl cannot be loaded) no NCCL call of the group ever runs.
    if let Ok(tx) = group_worker(member) {
        let _ = tx.send(Job::Skip {
            group: member.group.info.id,
            k,
        });
    }
    w
}

/// Issues a call on CUDA tensors through NCCL.
pub(crate) fn call<T: Send + 'static>(
    member: &Member,
    device: Device,
    req: Request,
    opts: &CallOptions,
    map: fn(Output) -> Result<T>,
) -> Work<T> {
    let Device::Cuda(ordinal) = device else {
        return refuse(member, Error::invalid(format!("no NCCL path for {device}")));
    };
    let info = &member.group.info;
    let hub = member.rank.hub.clone();
    // A group of one keeps NCCL (nothing to share, and NCCL's refusals stay what they are).
    let runner = if hub.is_some() && info.size() > 1 {
        Runner::NcclOrLocal
    } else {
        Runner::Nccl
    };
    let (op, fp) = match plan(req, info, runner) {
        Ok(x) => x,
        Err(e) => return refuse(member, e),
    };
    let tx = match group_worker(member) {
        Ok(t) => t,
        Err(e) => return refuse(member, e),
    };
    // The sequence number and the NCCL ordinal are taken together, so both orders agree.
    let (seq, open, k) = {
        let mut n = lock(&member.group.nccl_calls);
        let k = *n;
        *n += 1;
        match member.reserve() {
            Ok(seq) => (seq, member.open(), k),
            Err(e) => {
                drop(n);
                let _ = tx.send(Job::Skip { group: info.id, k });
                return member.ready(Err(e));
            }
        }
    };
    // Rank 0 makes the group's NCCL id for its first NCCL call; a failure is reported in
    // the agreement step, so every rank fails together. (With a hub, the id comes from the
    // hub if and when the group needs NCCL.)
    let mut status = 0u64;
    let mut id = [0u8; 128];
    if k == 0 && info.rank == 0 && hub.is_none() {
        match Nccl::load().and_then(|n| n.unique_id()) {
            Ok(i) => id = i,
            Err(_) => status = 1,
        }
    }
    let ours = Ours::new(fp, seq, k, info.clone());
    let size = info.size();
    let req = Request::AllGatherIntoTensor {
        input: Tensor::from_vec(ours.block(status, ordinal, &id)),
        output: TensorSpec::new(&[size * BLOCK_BYTES], DType::U8),
    };
    let plan = match Plan::new(req, info, opts) {
        Ok(p) => p.with_path(DataPath::Nccl),
        Err(e) => {
            // The numbers are taken: the members hear, as from `refuse`, and the worker
            // skips the ordinal.
            member.rank.driver.fail_call(info.id, seq, &e);
            let _ = tx.send(Job::Skip { group: info.id, k });
            return member.ready(Err(e));
        }
    };
    let (done, work) = Work::pair(member.rank.rank_threads.clone(), map);
    // The call completes, for the survivors' agreement, when its device operation does.
    let done: Done<Output> = {
        let (driver, group) = (member.rank.driver.clone(), info.id);
        Box::new(move |r: Result<Output>| {
            if r.is_ok() {
                driver.device_done(group, seq);
            }
            drop(open);
            done(r)
        })
    };
    let timeout = opts.timeout.unwrap_or(info.options.timeout);
    member.issue_raw(
        seq,
        plan,
        Box::new(move |agreed: Result<Output>| {
            let (group, k) = (ours.info.id, ours.k);
            let job = match agreed.and_then(|out| ours.check(out)) {
                Ok(agreed) => job(
                    &ours,
                    agreed,
                    hub,
                    Next {
                        ordinal,
                        op,
                        timeout,
                        done,
                    },
                ),
                Err(e) => {
                    // The members that agreed learn at once that this one never comes.
                    if let Some(hub) = &hub {
                        hub.abandon(group, k, ours.info.size(), e.clone());
                    }
                    done(Err(e));
                    Job::Skip { group, k }
                }
            };
            // A worker that is gone has failed every call it held; this one's `done` was
            // moved into the job, and dropping it completes the Work with `Shutdown`.
            let _ = tx.send(job);
        }),
    );
    work
}

/// The rest of a call, for its job.
struct Next {
    ordinal: u32,
    op: NcclOp,
    timeout: std::time::Duration,
    done: Done<Output>,
}

/// The job a call whose agreement step succeeded becomes: the device-local path when two or
/// more ranks share a hub and a device, else NCCL.
fn job(ours: &Ours, agreed: Agreed, hub: Option<Arc<LocalHub>>, next: Next) -> Job {
    let Next {
        ordinal,
        op,
        timeout,
        done,
    } = next;
    let (group, k, rank, size) = (ours.info.id, ours.k, ours.info.rank, ours.info.size());
    let init = match &hub {
        Some(hub) if takes_local_path(size, &agreed.devices, ordinal) => {
            // Deposited here, on the thread that completed the agreement (the last
            // rank to deposit enqueues the call on it); the worker only watches it.
            let deposit = Deposit {
                group,
                lane: None,
                k,
                size,
                rank,
            };
            let part = Part {
                op,
                dtype: ours.fp.dtype,
                ordinal,
            };
            return Job::Local(Box::new(LocalCall {
                slot: hub.deposit(&deposit, part),
                group,
                k,
                rank,
                seq: Some(ours.seq),
                global_rank: ours.info.members.get(rank).copied().unwrap_or(rank),
                members: ours.info.members.to_vec(),
                kind: ours.fp.kind,
                timeout,
                done,
            }));
        }
        // Ranks of one process on different devices: NCCL, with the hub's id (used when
        // this rank's communicator is created).
        Some(hub) => match hub.nccl_id(group) {
            Ok(id) => Some(Init { id, rank, size }),
            Err(e) => {
                done(Err(e));
                return Job::Skip { group, k };
            }
        },
        None => agreed.init_id.map(|id| Init { id, rank, size }),
    };
    Job::Call(Box::new(Call {
        group,
        k,
        init,
        device: ordinal,
        kind: ours.fp.kind,
        dtype: ours.fp.dtype,
        rank,
        op,
        timeout,
        done,
    }))
}

/// Starts an NCCL lane's worker on its first send, so that a sender without libnccl fails
/// at once rather than after its receiver has answered (and libnccl is loaded once per
/// lane, not per send).
pub(super) fn start_lane(member: &Member, key: Key) -> Result<()> {
    if key.1 == Carrier::Nccl {
        out_worker(member, key)?;
    }
    Ok(())
}

/// The worker of the lane to `key.0`, started on first use.
fn out_worker(member: &Member, key: Key) -> Result<crossbeam_channel::Sender<Job>> {
    let mut lanes = member.group.p2p.lock();
    let slot = lanes.out_workers.entry(key).or_default();
    lane_worker(slot, member, &format!("to{}", key.0))
}

/// The worker of the lane from `key.0`, started on first use.
fn in_worker(member: &Member, key: Key) -> Result<crossbeam_channel::Sender<Job>> {
    let mut lanes = member.group.p2p.lock();
    let slot = lanes.in_workers.entry(key).or_default();
    lane_worker(slot, member, &format!("from{}", key.0))
}

/// The lane's worker, started on first use.
fn lane_worker(
    slot: &mut Option<WorkerHandle>,
    member: &Member,
    what: &str,
) -> Result<crossbeam_channel::Sender<Job>> {
    if let Some(w) = slot.as_ref() {
        return Ok(w.sender());
    }
    let w = WorkerHandle::spawn_named(format!("cx-nccl-{}-{what}", member.global_rank()))?;
    let tx = w.sender();
    *slot = Some(w);
    Ok(tx)
}

/// This rank's end of a lane: its rank in the lane's communicator (the sender is 0) and its
/// device.
struct LaneEnd {
    rank: usize,
    ordinal: u32,
}

/// Transfer `k` of a lane as its worker runs it: lane rank 0 sends, 1 receives; the
/// first transfer creates the lane's communicator of two ranks from the go's id.
fn lane_call(
    member: &Member,
    Transfer { k, id }: Transfer,
    end: LaneEnd,
    op: NcclOp,
    opts: &CallOptions,
    done: Done<Output>,
) -> Box<Call> {
    Box::new(Call {
        group: member.group.info.id,
        k,
        init: (k == 0).then_some(Init {
            id,
            rank: end.rank,
            size: 2,
        }),
        device: end.ordinal,
        kind: if end.rank == 0 {
            OpKind::Send
        } else {
            OpKind::Recv
        },
        dtype: DType::U8,
        rank: end.rank,
        op,
        timeout: opts.timeout.unwrap_or(member.group.info.options.timeout),
        done,
    })
}

/// A transfer's sending end as an exchange: the whole of `tensor` to the lane's other end.
fn send_op(tensor: Tensor) -> NcclOp {
    let bytes = tensor.nbytes();
    NcclOp::Exchange(Exchange {
        sends: vec![(1, tensor, 0..bytes)],
        recvs: Vec::new(),
        local: Vec::new(),
        out_bytes: 0,
        layout: OutputLayout::Nothing,
    })
}

/// A transfer's receiving end as an exchange: `bytes` from the lane's other end, into a new
/// buffer of `shape`.
fn recv_op(bytes: usize, shape: Vec<usize>) -> NcclOp {
    NcclOp::Exchange(Exchange {
        sends: Vec::new(),
        recvs: if bytes > 0 {
            vec![(0, 0..bytes)]
        } else {
            Vec::new()
        },
        local: Vec::new(),
        out_bytes: bytes,
        layout: OutputLayout::Whole(shape),
    })
}

/// What completes a send's transfer: a failure breaks the lane to the peer first.
fn send_finished(member: &Member, key: Key, done: SendDone) -> Done<Output> {
    // Weak: a call the worker holds must not keep the group (and so the worker) alive.
    let group = Arc::downgrade(&member.group);
    Box::new(move |r: Result<Output>| {
        if let (Err(e), Some(g)) = (&r, group.upgrade()) {
            g.p2p.break_out(key, e.clone());
        }
        done(r.map(|_| ()));
    })
}

/// Hands send `k` of a lane to the lane's worker.
pub(super) fn send_job(
    member: &Member,
    key: Key,
    t: Transfer,
    tensor: Tensor,
    opts: &CallOptions,
    done: SendDone,
) -> std::result::Result<(), (Error, SendDone)> {
    let ordinal = match tensor.device() {
        Device::Cuda(o) => o,
        d => return Err((Error::invalid(format!("an NCCL send from {d}")), done)),
    };
    let tx = match out_worker(member, key) {
        Ok(t) => t,
        Err(e) => return Err((e, done)),
    };
    let op = send_op(tensor);
    let finished = send_finished(member, key, done);
    // A worker that is gone gives the call back, to be failed once the lock is released.
    match tx.send(Job::Call(lane_call(
        member,
        t,
        LaneEnd { rank: 0, ordinal },
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
    member: &Member,
    key: Key,
    t: Transfer,
    spec: TensorSpec,
    opts: &CallOptions,
    done: RecvDone,
) -> std::result::Result<(), (RecvDone, Error)> {
    let Device::Cuda(ordinal) = spec.device else {
        let e = Error::invalid(format!("an NCCL receive into {}", spec.device));
        return Err((done, e));
    };
    let tx = match in_worker(member, key) {
        Ok(t) => t,
        Err(e) => return Err((done, e)),
    };
    let bytes = match spec.numel() {
        Ok(n) => n.saturating_mul(spec.dtype.size()),
        Err(e) => return Err((done, e)),
    };
    let (dtype, shape) = (spec.dtype, spec.shape.clone());
    let op = recv_op(bytes, vec![bytes]);
    let group = std::sync::Arc::downgrade(&member.group);
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
            g.p2p.break_in(key, e.clone());
        }
        done(r);
    });
    // A worker that is gone gives the call back, to be failed once the lock is released.
    match tx.send(Job::Call(lane_call(
        member,
        t,
        LaneEnd { rank: 1, ordinal },
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

/// Transfer `k` of a lane between ranks of one process, as one end deposits it in the
/// world's hub: part 0 is the sender's (its tensor), part 1 the receiver's (a buffer of the
/// spec's size on its device). The last end to deposit enqueues the copy; each end's group
/// worker watches the transfer and completes its call when the copy's event fires.
struct LocalEnd {
    /// Which end: 0 sends, 1 receives.
    end: usize,
    /// The lane: (sender, receiver) in the group.
    lane: (usize, usize),
    k: u64,
    part: Part,
    kind: OpKind,
    timeout: std::time::Duration,
    done: Done<Output>,
}

/// Deposits one end of a device-local transfer and hands it to the group's worker to
/// watch; a failure completes `done` at once.
fn local_end(member: &Member, e: LocalEnd) {
    let LocalEnd {
        end,
        lane,
        k,
        part,
        kind,
        timeout,
        done,
    } = e;
    let Some(hub) = member.rank.hub.clone() else {
        return done(Err(Error::internal(
            "a device-local transfer without a hub",
        )));
    };
    let tx = match group_worker(member) {
        Ok(t) => t,
        Err(e) => return done(Err(e)),
    };
    let info = &member.group.info;
    let group = info.id;
    let deposit = Deposit {
        group,
        lane: Some(lane),
        k,
        size: 2,
        rank: end,
    };
    let slot = hub.deposit(&deposit, part);
    let ends = [info.global(lane.0), info.global(lane.1)];
    let job = Job::Watch(Box::new(LocalCall {
        slot,
        group,
        k,
        rank: end,
        seq: None,
        global_rank: member.global_rank(),
        members: ends.to_vec(),
        kind,
        timeout,
        done,
    }));
    // A worker that is gone dropped the job: its `done` completes with `Shutdown`.
    let _ = tx.send(job);
}

/// Transfer `k` of the lane to `key.0` on the device-local path, sending `tensor`.
pub(super) fn local_send(
    member: &Member,
    key: Key,
    k: u64,
    tensor: Tensor,
    opts: &CallOptions,
    done: SendDone,
) {
    let ordinal = match tensor.device() {
        Device::Cuda(o) => o,
        d => return done(Err(Error::invalid(format!("a device-local send from {d}")))),
    };
    let dtype = tensor.dtype();
    let op = send_op(tensor);
    let finished = send_finished(member, key, done);
    local_end(
        member,
        LocalEnd {
            end: 0,
            lane: (member.group_rank(), key.0),
            k,
            part: Part { op, dtype, ordinal },
            kind: OpKind::Send,
            timeout: opts.timeout.unwrap_or(member.group.info.options.timeout),
            done: finished,
        },
    );
}

/// Transfer `k` of the lane from `key.0` on the device-local path, into a new buffer of
/// `spec` on its device.
pub(super) fn local_recv(
    member: &Member,
    key: Key,
    k: u64,
    spec: TensorSpec,
    opts: &CallOptions,
    done: RecvDone,
) {
    let Device::Cuda(ordinal) = spec.device else {
        return done(Err(Error::invalid(format!(
            "a device-local receive into {}",
            spec.device
        ))));
    };
    let bytes = match spec.numel() {
        Ok(n) => n.saturating_mul(spec.dtype.size()),
        Err(e) => return done(Err(e)),
    };
    let (dtype, shape) = (spec.dtype, spec.shape.clone());
    let op = recv_op(bytes, shape);
    let group = Arc::downgrade(&member.group);
    let finished: Done<Output> = Box::new(move |r: Result<Output>| {
        let r = r.and_then(|out| match out {
            Output::Tensor(t) => Ok(t),
            other => Err(Error::internal(format!("a local receive gave {other:?}"))),
        });
        if let (Err(e), Some(g)) = (&r, group.upgrade()) {
            g.p2p.break_in(key, e.clone());
        }
        done(r);
    });
    local_end(
        member,
        LocalEnd {
            end: 1,
            lane: (key.0, member.group_rank()),
            k,
            part: Part { op, dtype, ordinal },
            kind: OpKind::Recv,
            timeout: opts.timeout.unwrap_or(member.group.info.options.timeout),
            done: finished,
        },
    );
}
