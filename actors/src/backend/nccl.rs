//! The NCCL backend: calls on CUDA tensors run by NCCL on the group's device worker, after
//! an agreement step on the engine; and the NCCL carrier of device send and receive, a
//! worker per lane running the lane's transfers in ordinal order on a communicator of two
//! ranks (the sender is rank 0).
//!
//! The agreement step is a small all_gather marked [`DataPath::Nccl`]: every rank's call
//! fingerprint, the call's NCCL ordinal, a status, and (on the group's first NCCL call)
//! rank 0's NCCL id. Mismatched calls fail on every rank there, before NCCL is called; the
//! worker then creates the group's communicator if it has none, runs the operation, and
//! completes the call's `Work` when its CUDA event fires (or aborts the communicator when it
//! does not within the group's timeout).

use crate::device::cuda::nccl::Nccl;
use crate::device::cuda::worker::{Call, Init, Job, WorkerHandle};
use crate::device::cuda::{plan, Exchange, NcclOp, OutputLayout};
use crate::device::lanes::{Carrier, InLane, OutLane, RecvDone, SendDone, Transfer};
use crate::member::Member;
use crate::rank::driver::Done;
use crate::sync::lock;
use crate::work::Work;
use collectix_runtime::error::CallDesc;
use collectix_runtime::ids::FINGERPRINT_BYTES;
use collectix_runtime::{
    CallOptions, DType, DataPath, Device, DeviceError, Error, Fingerprint, GroupInfo, OpKind,
    Output, Plan, Request, Result, Tensor, TensorSpec,
};
use crossbeam_channel::SendError;

/// Words of the agreement step per rank: the fingerprint (its wire encoding, zero-padded),
/// the call's NCCL ordinal, a status, and rank 0's NCCL id on the group's first NCCL call.
const FP_BYTES: usize = 64;
const HANDSHAKE_BYTES: usize = FP_BYTES + 8 + 8 + 128;

fn encode_fp(fp: &Fingerprint) -> Result<[u8; FP_BYTES]> {
    let mut out = [0u8; FP_BYTES];
    out[..FINGERPRINT_BYTES].copy_from_slice(&fp.to_bytes());
    Ok(out)
}

fn decode_fp(b: &[u8]) -> Option<Fingerprint> {
    let bytes: &[u8; FINGERPRINT_BYTES] = b.get(..FINGERPRINT_BYTES)?.try_into().ok()?;
    Fingerprint::from_bytes(bytes).ok()
}

/// One rank's part of the agreement step, as it arrived.
struct Agreement {
    fp_bytes: Vec<u8>,
    k: u64,
    status: u64,
    id: [u8; 128],
}

fn parse(block: &[u8]) -> Option<Agreement> {
    let fp_bytes = block.get(..FP_BYTES)?.to_vec();
    let k = u64::from_le_bytes(block.get(FP_BYTES..FP_BYTES + 8)?.try_into().ok()?);
    let status = u64::from_le_bytes(block.get(FP_BYTES + 8..FP_BYTES + 16)?.try_into().ok()?);
    let id: [u8; 128] = block.get(FP_BYTES + 16..HANDSHAKE_BYTES)?.try_into().ok()?;
    Some(Agreement {
        fp_bytes,
        k,
        status,
        id,
    })
}

/// The group's worker on this rank, started on first use.
fn group_worker(member: &Member) -> Result<crossbeam_channel::Sender<Job>> {
    let mut slot = lock(&member.group.nccl_worker);
    if let Some(w) = slot.as_ref() {
        return Ok(w.sender());
    }
    let w = WorkerHandle::spawn_named(format!(
        "cx-nccl-{}-{:x}",
        member.global_rank(),
        member.group.info.id.0 & 0xffff
    ))?;
    let tx = w.sender();
    *slot = Some(w);
    Ok(tx)
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
        return member.ready(Err(Error::invalid(format!("no NCCL path for {device}"))));
    };
    let info = &member.group.info;
    let (op, fp) = match plan(req, info) {
        Ok(x) => x,
        Err(e) => return member.ready(Err(e)),
    };
    let tx = match group_worker(member) {
        Ok(t) => t,
        Err(e) => return member.ready(Err(e)),
    };
    let fp_bytes = match encode_fp(&fp) {
        Ok(b) => b,
        Err(e) => return member.ready(Err(e)),
    };
    // The sequence number and the NCCL ordinal are taken together, so both orders agree.
    let (seq, k) = {
        let mut n = lock(&member.group.nccl_calls);
        let k = *n;
        *n += 1;
        (member.reserve(1), k)
    };
    // Rank 0 makes the group's NCCL id for its first NCCL call; a failure is reported in
    // the agreement step, so every rank fails together.
    let mut status = 0u64;
    let mut id = [0u8; 128];
    if k == 0 && info.rank == 0 {
        match Nccl::load().and_then(|n| n.unique_id()) {
            Ok(i) => id = i,
            Err(_) => status = 1,
        }
    }
    let mut block = Vec::with_capacity(HANDSHAKE_BYTES);
    block.extend_from_slice(&fp_bytes);
    block.extend_from_slice(&k.to_le_bytes());
    block.extend_from_slice(&status.to_le_bytes());
    block.extend_from_slice(&id);
    let size = info.size();
    let req = Request::AllGatherIntoTensor {
        input: Tensor::from_vec(block),
        output: TensorSpec::new(&[size * HANDSHAKE_BYTES], DType::U8),
    };
    let plan = match Plan::new(req, info, opts) {
        Ok(p) => p.with_path(DataPath::Nccl),
        Err(e) => return member.ready(Err(e)),
    };
    let (done, work) = Work::pair(member.rank.rank_threads.clone(), map);
    let ours = Ours {
        fp,
        fp_bytes,
        seq,
        k,
        info: info.clone(),
    };
    let timeout = opts.timeout.unwrap_or(info.options.timeout);
    member.issue_raw(
        seq,
        plan,
        Box::new(move |agreed: Result<Output>| {
            let (group, k) = (ours.info.id, ours.k);
            let job = match agreed.and_then(|out| ours.check(out)) {
                Ok(init) => Job::Call(Box::new(Call {
                    group,
                    k,
                    init,
                    device: ordinal,
                    kind: ours.fp.kind,
                    dtype: ours.fp.dtype,
                    rank: ours.info.rank,
                    op,
                    timeout,
                    done,
                })),
                Err(e) => {
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

/// This rank's part of a call's agreement step, to check the others' against.
struct Ours {
    fp: Fingerprint,
    fp_bytes: [u8; FP_BYTES],
    seq: u64,
    /// The call's NCCL ordinal in the group.
    k: u64,
    info: GroupInfo,
}

impl Ours {
    /// Checks the agreement step's output (every rank's block, in group-rank order): the
    /// same call at the same NCCL ordinal everywhere, and rank 0's NCCL id made. The
    /// communicator to create first, on the group's first NCCL call.
    fn check(&self, out: Output) -> Result<Option<Init>> {
        let all = match out {
            Output::Tensor(t) => t.to_vec::<u8>()?,
            other => return Err(Error::internal(format!("agreement step gave {other:?}"))),
        };
        let members = &self.info.members;
        let mut init_id = None;
        for (r, block) in all.chunks(HANDSHAKE_BYTES).enumerate() {
            let theirs = parse(block).ok_or_else(|| Error::internal("short agreement block"))?;
            let rank = members.get(r).copied().unwrap_or(r);
            if theirs.fp_bytes != self.fp_bytes || theirs.k != self.k {
                return Err(self.mismatch(rank, &theirs));
            }
            if theirs.status != 0 {
                return Err(DeviceError::Nccl {
                    call: format!("ncclGetUniqueId on rank {rank}"),
                    code: 0,
                    detail: "rank 0 could not make the group's NCCL id".into(),
                }
                .into());
            }
            if r == 0 && self.k == 0 {
                init_id = Some(theirs.id);
            }
        }
        let (rank, size) = (self.info.rank, self.info.size());
        Ok(init_id.map(|id| Init { id, rank, size }))
    }

    /// The mismatch between this rank's call and world rank `rank`'s.
    fn mismatch(&self, rank: usize, theirs: &Agreement) -> Error {
        let me = self.info.rank;
        Error::Mismatch {
            group: self.info.id,
            seq: Some(self.seq),
            ours: CallDesc {
                rank: self.info.members.get(me).copied().unwrap_or(me),
                call: self.fp,
            },
            theirs: CallDesc {
                rank,
                call: decode_fp(&theirs.fp_bytes).unwrap_or(self.fp),
            },
            report: Vec::new(),
        }
    }
}

/// Starts an NCCL lane's worker on its first send, so that a sender without libnccl fails
/// at once rather than after its receiver has answered (and libnccl is loaded once per
/// lane, not per send).
pub(super) fn start_lane(member: &Member, key: (usize, Carrier), lane: &mut OutLane) -> Result<()> {
    if key.1 == Carrier::Nccl {
        lane_worker(&mut lane.worker, member, &format!("to{}", key.0))?;
    }
    Ok(())
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

/// Hands send `k` of a lane to the lane's worker.
pub(super) fn send_job(
    member: &Member,
    key: (usize, Carrier),
    lane: &mut OutLane,
    t: Transfer,
    tensor: Tensor,
    opts: &CallOptions,
    done: SendDone,
) -> std::result::Result<(), (Error, SendDone)> {
    let ordinal = match tensor.device() {
        Device::Cuda(o) => o,
        d => return Err((Error::invalid(format!("an NCCL send from {d}")), done)),
    };
    let tx = match lane_worker(&mut lane.worker, member, &format!("to{}", key.0)) {
        Ok(t) => t,
        Err(e) => return Err((e, done)),
    };
    let bytes = tensor.nbytes();
    let op = NcclOp::Exchange(Exchange {
        sends: vec![(1, tensor, 0..bytes)],
        recvs: Vec::new(),
        local: Vec::new(),
        out_bytes: 0,
        layout: OutputLayout::Nothing,
    });
    // Weak: a call the worker holds must not keep the group (and so the worker) alive.
    let group = std::sync::Arc::downgrade(&member.group);
    let finished: Done<Output> = Box::new(move |r: Result<Output>| {
        if let (Err(e), Some(g)) = (&r, group.upgrade()) {
            g.p2p.break_out(key, e.clone());
        }
        done(r.map(|_| ()));
    });
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
    key: (usize, Carrier),
    lane: &mut InLane,
    t: Transfer,
    spec: TensorSpec,
    opts: &CallOptions,
    done: RecvDone,
) -> std::result::Result<(), (RecvDone, Error)> {
    let Device::Cuda(ordinal) = spec.device else {
        let e = Error::invalid(format!("an NCCL receive into {}", spec.device));
        return Err((done, e));
    };
    let tx = match lane_worker(&mut lane.worker, member, &format!("from{}", key.0)) {
        Ok(t) => t,
        Err(e) => return Err((done, e)),
    };
    let bytes = match spec.numel() {
        Ok(n) => n.saturating_mul(spec.dtype.size()),
        Err(e) => return Err((done, e)),
    };
    let (dtype, shape) = (spec.dtype, spec.shape.clone());
    let op = NcclOp::Exchange(Exchange {
        sends: Vec::new(),
        recvs: if bytes > 0 {
            vec![(0, 0..bytes)]
        } else {
            Vec::new()
        },
        local: Vec::new(),
        out_bytes: bytes,
        layout: OutputLayout::Whole(vec![bytes]),
    });
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
