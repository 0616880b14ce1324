//! The device-local path: a collective of ranks that live in one process and hold their
//! tensors on one GPU, run with device copies and a reduction kernel on that GPU — never
//! through host memory, and without NCCL (which refuses two ranks on one device).
//!
//! The ranks of a [`World`](crate::World) share a [`LocalHub`]. After a call's agreement step
//! (the same as NCCL's: every rank's fingerprint, so mismatches and missing ranks are the
//! usual typed errors), each rank's device worker *deposits* its part of the call — its
//! planned [`NcclOp`], holding its tensors — in the call's slot, keyed by group and NCCL
//! ordinal. The rank whose part completes the slot executes the whole call at once on the
//! group's stream: it allocates every rank's output (or writes over an input nobody else
//! holds, as NCCL in place), enqueues the kernels and copies, and records one event. Every
//! rank's worker then completes its call when that event fires, each taking its own output.
//!
//! What each operation becomes:
//! - all_reduce: one fold kernel reads every rank's input and writes every rank's output
//!   (rank order, the host reference's rounding: `kernels/fold.cu`); reduce: the same into
//!   the root's output only; reduce_scatter: a fold per rank over the ranks' blocks of it.
//! - broadcast, all_gather, and the exchanges (gather, scatter, all_to_all, all_to_all_single,
//!   all_gather of unequal blocks): device-to-device copies between the ranks' buffers.
//!
//! Every dtype and op the host engine reduces is supported (the kernel covers bitwise ops,
//! integer types NCCL lacks, bool); the engine's argument rules apply (`Plan::check`).

use super::ffi::driver::OwnedPool;
use super::ffi::fold::{Fold, FoldKernels, Span, MAX_PTRS};
use super::launch::{as_output, sole_owner};
use super::plan::{Exchange, NcclOp, OutputLayout};
use super::{context, cuda_err, storage_of};
use crate::sync::lock;
use collectix_runtime::{
    DType, Error, GroupId, OpKind, Output, ReduceOp, Result, Tensor, TensorSpec,
};
use cudarc::driver::{CudaContext, CudaEvent, CudaSlice, CudaStream};
use std::collections::HashMap;
use std::ops::Range;
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
    pool: OwnedPool,
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
                let pool = OwnedPool::new(&ctx)?;
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
        let receiver = parts.iter().find(|p| match &p.op {
            NcclOp::Exchange(x) => !x.recvs.is_empty(),
            _ => false,
        });
        let (dtype, ordinal) = match parts.iter().find(|p| p.ordinal != first.ordinal) {
            None => (first.dtype, first.ordinal),
            Some(_) if parts.len() == 2 => match receiver {
                Some(r) => (r.dtype, r.ordinal),
                None => return Err(Error::internal("a transfer with no receiver")),
            },
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

/// Enqueues one call's work on the group's stream.
struct Executor<'a> {
    stream: &'a Arc<CudaStream>,
    kernels: &'a FoldKernels,
    pool: &'a OwnedPool,
    ordinal: u32,
    dtype: DType,
    size: usize,
}

/// Every rank's output, and the tensors to keep until the call completes.
type Ran = Result<(Vec<Output>, Vec<Tensor>)>;

/// A tensor's bytes: its buffer and range (`None` when empty).
fn bytes_of(t: &Tensor) -> Result<Option<Span<'_>>> {
    Ok(storage_of(t)?
        .slice()
        .map(|(buf, range)| Span { buf, range }))
}

/// Where an output goes: a buffer of the executor's, or an input written over.
enum Dest {
    Fresh(Option<CudaSlice<u8>>),
    Over(Tensor),
}

impl Executor<'_> {
    fn run(&self, ops: Vec<NcclOp>) -> Ran {
        let mut it = ops.into_iter().peekable();
        let kind = match it.peek() {
            Some(NcclOp::AllReduce { .. }) => OpKind::AllReduce,
            Some(NcclOp::Reduce { .. }) => OpKind::Reduce,
            Some(NcclOp::Broadcast { .. }) => OpKind::Broadcast,
            Some(NcclOp::AllGather { .. }) => OpKind::AllGather,
            Some(NcclOp::ReduceScatter { .. }) => OpKind::ReduceScatter,
            Some(NcclOp::Exchange(_)) => OpKind::AllToAll,
            None => return Err(Error::internal("a local call with no parts")),
        };
        let ops: Vec<NcclOp> = it.collect();
        match kind {
            OpKind::AllReduce => self.all_reduce(ops),
            OpKind::Reduce => self.reduce(ops),
            OpKind::Broadcast => self.broadcast(ops),
            OpKind::AllGather => self.all_gather(ops),
            OpKind::ReduceScatter => self.reduce_scatter(ops),
            _ => self.exchange(ops),
        }
    }

    fn alloc(&self, bytes: usize) -> Result<Option<CudaSlice<u8>>> {
        self.pool.alloc(self.stream, bytes)
    }

    fn output(&self, buf: Option<CudaSlice<u8>>, layout: OutputLayout) -> Result<Output> {
        as_output(buf, self.ordinal, self.dtype, layout)
    }

    /// Copies bytes `from` of `src` to bytes `at..` of `dst`.
    fn copy(
        &self,
        src: &CudaSlice<u8>,
        from: Range<usize>,
        dst: &mut CudaSlice<u8>,
        at: usize,
    ) -> Result<()> {
        if from.is_empty() {
            return Ok(());
        }
        let len = from.len();
        if from.end > src.len() || at.checked_add(len).is_none_or(|e| e > dst.len()) {
            return Err(Error::internal("a local copy out of bounds"));
        }
        let mut d = dst.slice_mut(at..at + len);
        self.stream
            .memcpy_dtod(&src.slice(from), &mut d)
            .map_err(cuda_err("cuMemcpyDtoD"))
    }

    /// Folds `srcs` into `outs`, [`MAX_PTRS`] outputs a launch (a later launch reads the
    /// sources again, so outputs written over inputs must fit in one).
    fn fold(&self, op: ReduceOp, count: usize, srcs: &[Span<'_>], outs: &[Span<'_>]) -> Result<()> {
        for chunk in outs.chunks(MAX_PTRS) {
            let f = Fold {
                dtype: self.dtype,
                op,
                count,
                group_size: self.size,
                srcs,
                outs: chunk,
            };
            self.kernels.fold(self.stream, &f)?;
        }
        Ok(())
    }

    /// all_reduce: every input folded, in rank order, into every output (written over an
    /// input that only the call holds).
    fn all_reduce(&self, ops: Vec<NcclOp>) -> Ran {
        let mut inputs = Vec::with_capacity(ops.len());
        let mut op = ReduceOp::Sum;
        for o in ops {
            match o {
                NcclOp::AllReduce { input, op: p } => {
                    op = p;
                    inputs.push(input);
                }
                _ => return Err(Error::internal("mixed operations in a local all_reduce")),
            }
        }
        let count = inputs.first().map_or(0, Tensor::numel);
        let dests: Vec<Dest> = inputs
            .iter()
            .map(|t| {
                // Written over only when one launch writes every output (see `fold`).
                Ok(if sole_owner(t) && inputs.len() <= MAX_PTRS {
                    Dest::Over(t.clone())
                } else {
                    Dest::Fresh(self.alloc(t.nbytes())?)
                })
            })
            .collect::<Result<_>>()?;
        {
            let srcs = inputs
                .iter()
                .filter_map(|t| bytes_of(t).transpose())
                .collect::<Result<Vec<_>>>()?;
            let outs = dests
                .iter()
                .filter_map(|d| match d {
                    Dest::Fresh(b) => b.as_ref().map(|buf| {
                        Ok(Span {
                            buf,
                            range: 0..buf.len(),
                        })
                    }),
                    Dest::Over(t) => bytes_of(t).transpose(),
                })
                .collect::<Result<Vec<_>>>()?;
            if count > 0 {
                self.fold(op, count, &srcs, &outs)?;
            }
        }
        let outputs = dests
            .into_iter()
            .zip(&inputs)
            .map(|(d, t)| match d {
                Dest::Over(t) => Ok(Output::Tensor(t)),
                Dest::Fresh(b) => self.output(b, OutputLayout::Whole(t.shape().to_vec())),
            })
            .collect::<Result<_>>()?;
        Ok((outputs, inputs))
    }

    /// reduce: the root's output is every input folded; the others get their input back.
    fn reduce(&self, ops: Vec<NcclOp>) -> Ran {
        let mut inputs = Vec::with_capacity(ops.len());
        let (mut op, mut root) = (ReduceOp::Sum, 0);
        for o in ops {
            match o {
                NcclOp::Reduce {
                    input,
                    root: r,
                    op: p,
                } => {
                    (op, root) = (p, r);
                    inputs.push(input);
                }
                _ => return Err(Error::internal("mixed operations in a local reduce")),
            }
        }
        let at_root = inputs
            .get(root)
            .ok_or_else(|| Error::internal("reduce root out of range"))?;
        let mut out = self.alloc(at_root.nbytes())?;
        if let Some(buf) = out.as_mut() {
            let srcs = inputs
                .iter()
                .filter_map(|t| bytes_of(t).transpose())
                .collect::<Result<Vec<_>>>()?;
            let outs = vec![Span {
                range: 0..buf.len(),
                buf,
            }];
            self.fold(op, at_root.numel(), &srcs, &outs)?;
        }
        let shape = at_root.shape().to_vec();
        let mut root_out = Some(self.output(out, OutputLayout::Whole(shape))?);
        let outputs = inputs
            .iter()
            .enumerate()
            .map(|(r, t)| {
                if r == root {
                    root_out.take().unwrap_or(Output::None)
                } else {
                    Output::Tensor(t.clone())
                }
            })
            .collect();
        Ok((outputs, inputs))
    }

    /// broadcast: the root's input copied to every other rank (over an input only the call
    /// holds, else into a new buffer); the root gets its input back.
    fn broadcast(&self, ops: Vec<NcclOp>) -> Ran {
        let mut inputs = Vec::with_capacity(ops.len());
        let mut root = 0;
        for o in ops {
            match o {
                NcclOp::Broadcast { input, root: r } => {
                    root = r;
                    inputs.push(input);
                }
                _ => return Err(Error::internal("mixed operations in a local broadcast")),
            }
        }
        let src = inputs
            .get(root)
            .ok_or_else(|| Error::internal("broadcast root out of range"))?
            .clone();
        let from = bytes_of(&src)?;
        let mut outputs = Vec::with_capacity(inputs.len());
        for (r, t) in inputs.iter().enumerate() {
            if r == root {
                outputs.push(Output::Tensor(src.clone()));
                continue;
            }
            // A copy needs a buffer it may write: a fresh one (an input written over is
            // reached only through shared handles here, so it is copied into a new buffer).
            let mut out = self.alloc(t.nbytes())?;
            if let (Some(o), Some(Span { buf, range })) = (out.as_mut(), from.as_ref()) {
                if range.len() != o.len() {
                    return Err(Error::internal("broadcast sizes differ across ranks"));
                }
                self.copy(buf, range.clone(), o, 0)?;
            }
            outputs.push(self.output(out, OutputLayout::Whole(t.shape().to_vec()))?);
        }
        Ok((outputs, inputs))
    }

    /// all_gather of equal blocks: every rank's input copied into every rank's output at its
    /// offset.
    fn all_gather(&self, ops: Vec<NcclOp>) -> Ran {
        let mut inputs = Vec::with_capacity(ops.len());
        let mut layouts = Vec::with_capacity(ops.len());
        for o in ops {
            match o {
                NcclOp::AllGather { input, layout } => {
                    inputs.push(input);
                    layouts.push(layout);
                }
                _ => return Err(Error::internal("mixed operations in a local all_gather")),
            }
        }
        let block = inputs.first().map_or(0, Tensor::nbytes);
        if inputs.iter().any(|t| t.nbytes() != block) {
            return Err(Error::internal("all_gather blocks differ across ranks"));
        }
        let total = block
            .checked_mul(inputs.len())
            .ok_or_else(|| Error::invalid("all_gather size overflows"))?;
        let mut outputs = Vec::with_capacity(inputs.len());
        for layout in layouts {
            let mut out = self.alloc(total)?;
            if let Some(o) = out.as_mut() {
                for (j, t) in inputs.iter().enumerate() {
                    if let Some(Span { buf, range }) = bytes_of(t)? {
                        self.copy(buf, range, o, j * block)?;
                    }
                }
            }
            outputs.push(self.output(out, layout)?);
        }
        Ok((outputs, inputs))
    }

    /// reduce_scatter: rank r's output is block r of every rank's input, folded in rank
    /// order. A list input's blocks are its tensors; one tensor's are equal slices of it.
    fn reduce_scatter(&self, ops: Vec<NcclOp>) -> Ran {
        let mut all = Vec::with_capacity(ops.len());
        let mut shapes = Vec::with_capacity(ops.len());
        let mut op = ReduceOp::Sum;
        for o in ops {
            match o {
                NcclOp::ReduceScatter {
                    inputs,
                    shape,
                    op: p,
                } => {
                    op = p;
                    all.push(inputs);
                    shapes.push(shape);
                }
                _ => {
                    return Err(Error::internal(
                        "mixed operations in a local reduce_scatter",
                    ))
                }
            }
        }
        let n = all.len();
        let esize = self.dtype.size();
        // A list's blocks may differ in size: rank r's output has the shape of block r (the
        // plan gives the first block's, which NCCL, refusing unequal blocks, relies on).
        let list = n > 1 && all.iter().all(|inputs| inputs.len() == n);
        let shapes: Vec<Vec<usize>> = if list {
            (0..n).map(|r| all[r][r].shape().to_vec()).collect()
        } else {
            shapes
        };
        let mut outputs = Vec::with_capacity(n);
        for (r, shape) in shapes.into_iter().enumerate() {
            let count = TensorSpec::new(&shape, self.dtype).numel()?;
            let bytes = count
                .checked_mul(esize)
                .ok_or_else(|| Error::invalid("reduce_scatter size overflows"))?;
            let mut out = self.alloc(bytes)?;
            if let Some(o) = out.as_mut() {
                let mut srcs = Vec::with_capacity(n);
                for inputs in &all {
                    let (t, range) = if list {
                        let t = &inputs[r];
                        (t, 0..t.nbytes())
                    } else {
                        let t = inputs
                            .first()
                            .ok_or_else(|| Error::internal("reduce_scatter without input"))?;
                        (t, r * bytes..(r + 1) * bytes)
                    };
                    let Span { buf, range: whole } = bytes_of(t)?
                        .ok_or_else(|| Error::internal("reduce_scatter block out of range"))?;
                    if range.end > whole.len() || range.len() != bytes {
                        return Err(Error::internal("reduce_scatter blocks differ across ranks"));
                    }
                    srcs.push(Span {
                        buf,
                        range: whole.start + range.start..whole.start + range.end,
                    });
                }
                let outs = vec![Span {
                    range: 0..o.len(),
                    buf: &*o,
                }];
                self.fold(op, count, &srcs, &outs)?;
            }
            outputs.push(self.output(out, OutputLayout::Whole(shape))?);
        }
        Ok((outputs, all.into_iter().flatten().collect()))
    }

    /// The exchanges: each rank's receives filled from the matching send of the peer (one
    /// per pair and call), its own parts copied locally.
    fn exchange(&self, ops: Vec<NcclOp>) -> Ran {
        let xs: Vec<Exchange> = ops
            .into_iter()
            .map(|o| match o {
                NcclOp::Exchange(x) => Ok(x),
                _ => Err(Error::internal("mixed operations in a local exchange")),
            })
            .collect::<Result<_>>()?;
        let mut outs = Vec::with_capacity(xs.len());
        for (r, x) in xs.iter().enumerate() {
            let mut out = self.alloc(x.out_bytes)?;
            if let Some(o) = out.as_mut() {
                for (t, range, at) in &x.local {
                    if let Some(Span { buf, range: whole }) = bytes_of(t)? {
                        let from = whole.start + range.start..whole.start + range.end;
                        self.copy(buf, from, o, *at)?;
                    }
                }
                for (peer, into) in &x.recvs {
                    let theirs = xs
                        .get(*peer)
                        .and_then(|p| p.sends.iter().find(|(to, _, _)| *to == r))
                        .ok_or_else(|| {
                            Error::internal(format!(
                                "rank {r} receives from {peer}, which sends nothing to it"
                            ))
                        })?;
                    let (_, t, range) = theirs;
                    if range.len() != into.len() {
                        return Err(Error::internal(
                            "an exchange's send and receive differ in size",
                        ));
                    }
                    if let Some(Span { buf, range: whole }) = bytes_of(t)? {
                        let from = whole.start + range.start..whole.start + range.end;
                        self.copy(buf, from, o, into.start)?;
                    }
                }
            }
            outs.push(out);
        }
        let mut keep = Vec::new();
        let mut outputs = Vec::with_capacity(xs.len());
        for (x, out) in xs.into_iter().zip(outs) {
            outputs.push(self.output(out, x.layout)?);
            keep.extend(x.sends.into_iter().map(|(_, t, _)| t));
            keep.extend(x.local.into_iter().map(|(t, _, _)| t));
        }
        Ok((outputs, keep))
    }
}

#[cfg(test)]
mod tests {
    //! The slot's protocol without a GPU: parts meet, a member that gives up fails the call
    //! for all, a call that never fills times out naming who never came, and the hub
    //! forgets a slot once every member has come. (The execution itself needs a GPU:
    //! tests/cuda_local.rs.)
    use super::*;

    fn part() -> Part {
        Part {
            op: NcclOp::AllReduce {
                input: Tensor::from_vec(vec![1.0f32; 4]),
                op: ReduceOp::Sum,
            },
            dtype: DType::F32,
            ordinal: 0,
        }
    }

    fn deposit(k: u64, rank: usize) -> Deposit {
        Deposit {
            group: GroupId(7),
            lane: None,
            k,
            size: 3,
            rank,
        }
    }

    fn pending(hub: &LocalHub) -> usize {
        lock(&hub.state).slots.len()
    }

    #[test]
    fn a_member_that_gives_up_fails_the_call_for_every_member_at_once() {
        let hub = LocalHub::new();
        let a = hub.deposit(&deposit(0, 0), part());
        assert!(a.poll(0).is_none(), "waits for the others");
        hub.abandon(GroupId(7), 0, 3, Error::Shutdown);
        assert!(matches!(a.poll(0), Some(Err(Error::Shutdown))));
        // A member that comes later fails at once too, and its part is dropped.
        let c = hub.deposit(&deposit(0, 2), part());
        assert!(matches!(c.poll(2), Some(Err(Error::Shutdown))));
        assert_eq!(pending(&hub), 0, "every member came: the slot is forgotten");
    }

    #[test]
    fn a_call_that_never_fills_times_out_naming_who_never_came() {
        let hub = LocalHub::new();
        let slot = hub.deposit(&deposit(3, 1), part());
        let e = slot.expire(|missing| Error::invalid(format!("missing {missing:?}")));
        assert!(
            matches!(&e, Error::InvalidArgument(m) if m == "missing [0, 2]"),
            "{e:?}"
        );
        // Every member sees the same failure, and a late one fails at once.
        assert!(matches!(slot.poll(1), Some(Err(Error::InvalidArgument(_)))));
        let late = hub.deposit(&deposit(3, 0), part());
        assert!(matches!(late.poll(0), Some(Err(Error::InvalidArgument(_)))));
        assert_eq!(pending(&hub), 1, "rank 2 has not come yet");
    }

    #[test]
    fn a_part_deposited_twice_is_an_error_not_a_silent_overwrite() {
        let hub = LocalHub::new();
        let a = hub.deposit(&deposit(0, 1), part());
        let b = hub.deposit(&deposit(0, 1), part());
        assert!(matches!(a.poll(1), Some(Err(Error::Internal(_)))));
        assert!(matches!(b.poll(1), Some(Err(Error::Internal(_)))));
    }

    #[test]
    fn calls_are_kept_apart_by_group_and_ordinal() {
        let hub = LocalHub::new();
        let a = hub.deposit(&deposit(0, 0), part());
        let b = hub.deposit(&deposit(1, 0), part());
        hub.abandon(GroupId(7), 1, 3, Error::Shutdown);
        assert!(
            a.poll(0).is_none(),
            "call 0 is not touched by call 1's failure"
        );
        assert!(matches!(b.poll(0), Some(Err(Error::Shutdown))));
        assert_eq!(pending(&hub), 2);
    }

    /// When every part has come, the last member executes the call; without a GPU (CI)
    /// that fails with a typed device error, the same for every member.
    #[test]
    fn a_full_call_runs_or_fails_with_a_typed_error_for_every_member() {
        let hub = LocalHub::new();
        let slots: Vec<_> = (0..3)
            .map(|r| hub.deposit(&deposit(0, r), part()))
            .collect();
        assert_eq!(pending(&hub), 0);
        for (r, s) in slots.iter().enumerate() {
            match s.poll(r) {
                // No GPU here: the context cannot be made. With one: host tensors are not
                // CUDA memory.
                Some(Err(Error::Device(_))) | Some(Err(Error::InvalidArgument(_))) => {}
                other => panic!("rank {r}: {other:?}"),
            }
        }
    }
}
