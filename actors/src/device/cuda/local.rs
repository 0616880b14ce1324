//! The device-local path: collectives and send/recv of ranks that live in one process and
//! hold their tensors on one GPU, run with device copies and a reduction kernel on that GPU —
//! never through host memory, and without NCCL (which refuses two ranks on one device).
//!
//! The ranks of a [`World`](crate::World) share a [`LocalHub`]. After a call's agreement step
//! (the same as NCCL's: every rank's fingerprint, so mismatches and missing ranks are the
//! usual typed errors), each rank *deposits* its part of the call — its planned [`NcclOp`],
//! holding its tensors — in the call's slot, keyed by group and NCCL ordinal, on the thread
//! that completed its agreement step. The rank whose part completes the slot executes the
//! whole call at once on the group's stream (`exec.rs`): it allocates every rank's output
//! (or writes over an input nobody else holds, as NCCL in place), enqueues the kernels and
//! copies, and records one event. Each rank's device worker watches the slot and completes
//! the rank's call when that event fires, each taking its own output. A transfer of device
//! send/recv is a slot of two parts (sender, receiver) keyed by its lane and the lane's
//! ordinal; across two GPUs the copy runs on the receiver's, peer to peer.
//!
//! What each operation becomes:
//! - all_reduce: one fold kernel reads every rank's input and writes every rank's output
//!   (rank order, the host reference's rounding: `kernels/fold.cu`); reduce: the same into
//!   the root's output only; reduce_scatter: a fold per rank over the ranks' blocks of it.
//! - broadcast, all_gather, and the exchanges (gather, scatter, all_to_all, all_to_all_single,
//!   all_gather of unequal blocks, a transfer): device-to-device copies between the ranks'
//!   buffers.
//!
//! Every dtype and op the host engine reduces is supported (the kernel covers bitwise ops,
//! integer types NCCL lacks, bool); the engine's argument rules apply (`Plan::check`). The
//! hub knows groups only by id and members only by position: it knows no `Member`.

mod exec;

use super::ffi::fold::FoldKernels;
use super::plan::NcclOp;
use super::pool::Pool;
use super::{context, cuda_err};
use crate::sync::lock;
use collectix_runtime::{DType, Error, GroupId, Output, Result, Tensor};
use cudarc::driver::{CudaContext, CudaEvent, CudaStream};
use exec::Executor;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// What the ranks of one process share for the device-local path: the slots of calls being
/// gathered, each device's context and kernels, each group's stream. A value of the world
/// (no global state): every [`World`](crate::World) has its own.
#[derive(Default)]
pub(crate) struct LocalHub {
    state: Mutex<HubState>,
}

#[derive(Default)]
struct HubState {
    /// Calls some members have come to (deposited or abandoned), by group and NCCL
    /// ordinal, with how many have.
    slots: HashMap<SlotKey, (Arc<Slot>, usize)>,
    /// Each device's context and kernels, loaded on first use.
    devices: HashMap<u32, Arc<DeviceKit>>,
    /// Each group's stream (one device per group's local calls).
    streams: HashMap<GroupId, Arc<CudaStream>>,
    /// Each group's NCCL id, for a group whose ranks are on different devices.
    nccl_ids: HashMap<GroupId, [u8; 128]>,
    /// libnccl, kept loaded while the hub lives once it made an id: `ncclGetUniqueId`
    /// starts a thread inside the library, which must not be unloaded under it.
    nccl: Option<Arc<super::nccl::Nccl>>,
}

/// A device's context, kernels, and the pool local calls' outputs come from.
struct DeviceKit {
    ctx: Arc<CudaContext>,
    kernels: FoldKernels,
    pool: Pool,
}

/// One rank's part of a call.
pub(crate) struct Part {
    /// The rank's operation, holding its tensors.
    pub(crate) op: NcclOp,
    /// The call's element type.
    pub(crate) dtype: DType,
    /// The device the rank's tensors are on.
    pub(crate) ordinal: u32,
}

/// Who deposits: the call, the group's size and this rank in it.
pub(crate) struct Deposit {
    pub(crate) group: GroupId,
    /// For a point-to-point transfer, its lane: (sender, receiver) in the group; `k` is then
    /// the lane's ordinal, the sender part 0 and the receiver part 1.
    pub(crate) lane: Option<(usize, usize)>,
    pub(crate) k: u64,
    pub(crate) size: usize,
    pub(crate) rank: usize,
}

/// A slot's key: the group, the lane of a transfer (none for a collective), the ordinal.
type SlotKey = (GroupId, Option<(usize, usize)>, u64);

/// One call as the ranks deposit and then wait for it.
pub(crate) struct Slot {
    state: Mutex<SlotState>,
}

impl Slot {
    fn new(size: usize) -> Arc<Slot> {
        Arc::new(Slot {
            state: Mutex::new(SlotState::Gathering((0..size).map(|_| None).collect())),
        })
    }
}

enum SlotState {
    /// Parts so far, by group rank.
    Gathering(Vec<Option<Part>>),
    /// The last rank to deposit is enqueueing the call.
    Executing,
    /// Enqueued: done once `event` fires; each rank takes its output.
    Running(Running),
    /// Failed for every rank.
    Failed(Error),
}

struct Running {
    event: CudaEvent,
    outputs: Vec<Option<Output>>,
    /// Every rank's inputs, kept until every rank has taken its output.
    _keep: Vec<Tensor>,
}

impl LocalHub {
    /// A hub for the ranks of one process.
    pub(crate) fn new() -> LocalHub {
        LocalHub::default()
    }

    /// The slot `key`, counting this rank's arrival at it: the hub forgets a slot once
    /// every member has come (deposited or abandoned it).
    fn arrive(&self, key: SlotKey, size: usize) -> Arc<Slot> {
        let mut hub = lock(&self.state);
        let entry = hub.slots.entry(key).or_insert_with(|| (Slot::new(size), 0));
        entry.1 += 1;
        let slot = entry.0.clone();
        if entry.1 >= size {
            hub.slots.remove(&key);
        }
        slot
    }

    /// Deposits this rank's part of call `d.k` of group `d.group`; the rank whose part
    /// completes the call enqueues it (on this thread). Returns the slot to wait on.
    pub(crate) fn deposit(&self, d: &Deposit, part: Part) -> Arc<Slot> {
        let slot = self.arrive((d.group, d.lane, d.k), d.size);
        let complete = {
            let mut st = lock(&slot.state);
            match &mut *st {
                SlotState::Gathering(parts) => match parts.get_mut(d.rank) {
                    Some(p @ None) => {
                        *p = Some(part);
                        if parts.iter().all(Option::is_some) {
                            let parts = std::mem::take(parts);
                            *st = SlotState::Executing;
                            Some(parts)
                        } else {
                            None
                        }
                    }
                    _ => {
                        *st = SlotState::Failed(Error::internal(format!(
                            "rank {} deposited call {} of group {} twice",
                            d.rank, d.k, d.group.0
                        )));
                        None
                    }
                },
                // Failed already (a rank gave up on it): this part is dropped.
                _ => None,
            }
        };
        if let Some(parts) = complete {
            let parts: Vec<Part> = parts.into_iter().flatten().collect();
            let outcome = self.execute(d.group, parts);
            *lock(&slot.state) = match outcome {
                Ok(r) => SlotState::Running(r),
                Err(e) => SlotState::Failed(e),
            };
        }
        slot
    }

    /// A rank will never deposit call `k` of `group` (its agreement step failed with `e`):
    /// the call fails at once for the ranks that did, or will.
    pub(crate) fn abandon(&self, group: GroupId, k: u64, size: usize, e: Error) {
        let slot = self.arrive((group, None, k), size);
        let mut st = lock(&slot.state);
        if let SlotState::Gathering(_) = &*st {
            *st = SlotState::Failed(e);
        }
    }

    /// Forgets what the hub holds for `group` (destroyed): its stream and its slots.
    pub(crate) fn release(&self, group: GroupId) {
        let mut hub = lock(&self.state);
        hub.streams.remove(&group);
        hub.slots.retain(|(g, _, _), _| *g != group);
        hub.nccl_ids.remove(&group);
    }

    /// The group's NCCL id (made by the first rank that asks), for a group of this process
    /// whose ranks are on different devices.
    pub(crate) fn nccl_id(&self, group: GroupId) -> Result<[u8; 128]> {
        let mut hub = lock(&self.state);
        if let Some(id) = hub.nccl_ids.get(&group) {
            return Ok(*id);
        }
        let nccl = match &hub.nccl {
            Some(n) => n.clone(),
            None => super::nccl::Nccl::load()?,
        };
        hub.nccl = Some(nccl.clone());
        let id = nccl.unique_id()?;
        hub.nccl_ids.insert(group, id);
        Ok(id)
    }

    /// Device `ordinal`'s context and kernels, and `group`'s stream on it.
    fn kit(&self, group: GroupId, ordinal: u32) -> Result<(Arc<DeviceKit>, Arc<CudaStream>)> {
        let mut hub = lock(&self.state);
        let kit = match hub.devices.get(&ordinal) {
            Some(k) => k.clone(),
            None => {
                let ctx = context(ordinal)?;
                let kernels = FoldKernels::load(&ctx)?;
                let pool = Pool::new(&ctx)?;
                let k = Arc::new(DeviceKit { ctx, kernels, pool });
                hub.devices.insert(ordinal, k.clone());
                k
            }
        };
        let stream = match hub.streams.get(&group) {
            Some(s) if s.context().ordinal() == ordinal as usize => s.clone(),
            _ => {
                let s = kit.ctx.new_stream().map_err(cuda_err("cuStreamCreate"))?;
                hub.streams.insert(group, s.clone());
                s
            }
        };
        Ok((kit, stream))
    }

    /// Enqueues the call whose parts (one per group rank, in order) have all arrived: on the
    /// parts' device, or for a transfer between two devices (ranks of one process on
    /// different GPUs) on the receiver's, the copy going peer to peer.
    fn execute(&self, group: GroupId, parts: Vec<Part>) -> Result<Running> {
        let first = parts
            .first()
            .ok_or_else(|| Error::internal("a local call with no parts"))?;
        let (dtype, ordinal) = match parts.iter().find(|p| p.ordinal != first.ordinal) {
            None => (first.dtype, first.ordinal),
            // Only a transfer's two ends can be on different devices (a collective takes
            // this path only when every member is on one): part 1 receives.
            Some(receiver) if parts.len() == 2 => (receiver.dtype, receiver.ordinal),
            Some(p) => {
                return Err(Error::internal(format!(
                    "a local call on cuda:{} and cuda:{}",
                    first.ordinal, p.ordinal
                )))
            }
        };
        let (kit, stream) = self.kit(group, ordinal)?;
        kit.ctx
            .bind_to_thread()
            .map_err(cuda_err("cuCtxSetCurrent"))?;
        let x = Executor {
            stream: &stream,
            kernels: &kit.kernels,
            pool: &kit.pool,
            ordinal,
            dtype,
            size: parts.len(),
        };
        let ops: Vec<NcclOp> = parts.into_iter().map(|p| p.op).collect();
        let (outputs, keep) = x.run(ops)?;
        let event = stream
            .record_event(None)
            .map_err(cuda_err("cuEventRecord"))?;
        Ok(Running {
            event,
            outputs: outputs.into_iter().map(Some).collect(),
            _keep: keep,
        })
    }
}

impl Slot {
    /// This rank's result once the call has completed on the device (`None` until then).
    pub(crate) fn poll(&self, rank: usize) -> Option<Result<Output>> {
        let mut st = lock(&self.state);
        match &mut *st {
            SlotState::Gathering(_) | SlotState::Executing => None,
            SlotState::Failed(e) => Some(Err(e.clone())),
            SlotState::Running(r) => match r.event.try_is_complete() {
                Ok(false) => None,
                Ok(true) => Some(
                    r.outputs
                        .get_mut(rank)
                        .and_then(Option::take)
                        .ok_or_else(|| Error::internal("a local call's output taken twice")),
                ),
                Err(e) => Some(Err(cuda_err("cuEventQuery")(e))),
            },
        }
    }

    /// The call did not complete in time on this rank: it fails for every rank, with the
    /// error `timeout` makes of the ranks that never deposited (none if it was enqueued and
    /// is still running), or with the error it had failed with already.
    pub(crate) fn expire(&self, timeout: impl FnOnce(Vec<usize>) -> Error) -> Error {
        let mut st = lock(&self.state);
        let e = match &*st {
            SlotState::Gathering(parts) => timeout(
                parts
                    .iter()
                    .enumerate()
                    .filter(|(_, p)| p.is_none())
                    .map(|(r, _)| r)
                    .collect(),
            ),
            SlotState::Failed(e) => return e.clone(),
            SlotState::Executing | SlotState::Running(_) => timeout(Vec::new()),
        };
        *st = SlotState::Failed(e.clone());
        e
    }
}

#[cfg(test)]
mod tests;
