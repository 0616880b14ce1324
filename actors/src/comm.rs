//! [`Communicator`]: one rank's handle on one group, with every torch.distributed call.

use crate::backend::p2p::FIRST_RESERVED_TAG;
use crate::backend::{self, DeviceBackend};
use crate::member::{Member, RankShared};
use crate::metrics::Probe;
use crate::work::Work;
use collectix_runtime::collective::{Request, TensorSpec};
use collectix_runtime::group::{check_members, fnv1a};
use collectix_runtime::tensor::arena::Arena;
use collectix_runtime::{
    CallOptions, DType, Error, GroupId, GroupInfo, Output, Plan, ReduceOp, Result, Tensor,
};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// A point-to-point operation for [`Communicator::batch_isend_irecv`] (torch's `P2POp`).
#[derive(Clone, Debug)]
pub enum P2POp {
    /// `P2POp(dist.isend, tensor, peer, tag=tag)`.
    Send {
        /// Data.
        tensor: Tensor,
        /// Destination (group rank).
        peer: usize,
        /// Tag.
        tag: u32,
    },
    /// `P2POp(dist.irecv, tensor, peer, tag=tag)`.
    Recv {
        /// Shape and dtype expected.
        spec: TensorSpec,
        /// Source (group rank).
        peer: usize,
        /// Tag.
        tag: u32,
    },
}

/// One rank's handle on one process group: `Send + Sync + Clone`, usable from any thread or
/// async runtime. Every method issues its call at once (taking the call's place in the
/// group's order) and returns a [`Work`]; ranks are group-local.
///
/// Tensors are moved in and results handed back as new tensors (torch writes in place);
/// where torch takes pre-allocated outputs, collectix takes their [`TensorSpec`]s.
#[derive(Clone)]
pub struct Communicator {
    /// This rank in the group: where calls are planned and issued.
    pub(crate) member: Member,
    /// How calls on device tensors run through this handle.
    pub(crate) device_backend: DeviceBackend,
}

pub(crate) fn one(o: Output) -> Result<Tensor> {
    match o {
        Output::Tensor(t) => Ok(t),
        other => Err(Error::internal(format!(
            "expected one tensor, got {other:?}"
        ))),
    }
}

pub(crate) fn many(o: Output) -> Result<Vec<Tensor>> {
    match o {
        Output::Tensors(t) => Ok(t),
        other => Err(Error::internal(format!("expected tensors, got {other:?}"))),
    }
}

/// Gather's output: a list on the root, nothing elsewhere.
pub(crate) fn gathered(o: Output) -> Result<Option<Vec<Tensor>>> {
    match o {
        Output::None => Ok(None),
        o => many(o).map(Some),
    }
}

fn unit(_: Output) -> Result<()> {
    Ok(())
}

impl Communicator {
    pub(crate) fn new(rank: Arc<RankShared>, info: GroupInfo) -> Communicator {
        Communicator {
            member: Member::new(rank, info),
            device_backend: DeviceBackend::default(),
        }
    }

    /// This handle with calls on device tensors going through `backend` (NCCL by default;
    /// [`DeviceBackend::HostStaged`] copies to the host and runs the ordinary engine). Like
    /// torch's choice of backend, every rank of the group must choose the same one for a
    /// call: ranks that differ get [`Error::Mismatch`], never a hang.
    pub fn with_device_backend(&self, backend: DeviceBackend) -> Communicator {
        let mut c = self.clone();
        c.device_backend = backend;
        c
    }

    /// Lane `name` of this group: the same members and ranks, with an order of calls of its
    /// own, so that two streams of calls (a trainer thread's and a checkpoint thread's) run
    /// at once without meeting each other's calls. Made at once, without a call: each member
    /// that uses the lane asks for it by the same name, and a member's messages for a lane
    /// it has not asked for yet wait for it. The same name gives the same lane (one order)
    /// on this rank; lanes of lanes are lanes too.
    ///
    /// A group's calls on one rank come from one thread (or async task) at a time: a call
    /// made while another thread's call on the same group is in flight fails with
    /// [`Error::ConcurrentCalls`](collectix_runtime::Error::ConcurrentCalls), naming both
    /// calls' sites, and aborts the group (the two calls' order was the scheduler's, which
    /// the other members need not share). Give each thread its lane instead. Destroying a
    /// lane ([`destroy`](Self::destroy)) is final: asking for it again gives the destroyed
    /// lane.
    pub fn lane(&self, name: &str) -> Communicator {
        let m = &self.member;
        let mut lanes = crate::sync::lock(&m.group.lanes);
        let member = match lanes.get(name) {
            Some(l) => l.clone(),
            None => {
                let info = m.group.info.lane(name);
                m.rank.driver.add_group(info.clone());
                let l = Member::new(m.rank.clone(), info);
                lanes.insert(name.to_owned(), l.clone());
                l
            }
        };
        Communicator {
            member,
            device_backend: self.device_backend,
        }
    }

    /// The backend calls on device tensors take through this handle.
    pub fn device_backend(&self) -> DeviceBackend {
        self.device_backend
    }

    /// This rank in the group.
    pub fn rank(&self) -> usize {
        self.member.group.info.rank
    }

    /// Ranks in the group.
    pub fn size(&self) -> usize {
        self.member.group.info.size()
    }

    /// This rank in the world.
    pub fn global_rank(&self) -> usize {
        self.member.global_rank()
    }

    /// Ranks in the world (its hot standbys not counted).
    pub fn world_size(&self) -> usize {
        self.member.rank.world - self.member.rank.standbys
    }

    /// Which incarnation of its rank this handle's rank is: 0 for the first, one more for
    /// each restart (of its process under `collectix launch --max-restarts`, or of the rank
    /// under [`World::run`](crate::World::run) with [`Policy::Restart`](crate::Policy)). A
    /// restarted rank joins the others with [`rejoin`](Self::rejoin).
    pub fn incarnation(&self) -> u32 {
        self.member.rank.incarnation
    }

    /// The group's identity (the same on every member).
    pub fn group_id(&self) -> GroupId {
        self.member.group.info.id
    }

    /// How many times this rank's actor has been woken to make progress that no waiting
    /// caller made (arrivals while nobody waited, or an earlier timer): a statistic of the
    /// hot path, which `collectix bench` reports per call.
    pub fn background_wakeups(&self) -> u64 {
        self.member.rank.driver.wakeups()
    }

    /// The group's members, as world ranks, in group-rank order.
    pub fn members(&self) -> &[usize] {
        &self.member.group.info.members
    }

    /// Where the group's members live, as its default algorithms see it: in this process, on
    /// one host, on several hosts with several on one (the hierarchical algorithms), or each
    /// on its own. In a multi-process job it follows from the members' published hosts.
    pub fn locality(&self) -> collectix_runtime::Locality {
        self.member.group.info.options.locality
    }

    /// Every call of this communicator ([`submit`](Self::submit) and the typed calls): measured
    /// as one call (`metrics.rs`), then on the host on the group's board or its engine
    /// (`Member::call_host`), or on a device through the device backend (`backend/`).
    /// Argument errors come back at once (a collective's still takes its sequence number and
    /// tells the other members, whose parts fail with `Error::CallFailed`:
    /// `Member::refuse`); so does a send or receive on a reserved tag.
    #[track_caller]
    fn call<T: Send + 'static>(
        &self,
        req: Request,
        opts: &CallOptions,
        map: fn(Output) -> Result<T>,
    ) -> Work<T> {
        self.call_landing(req, opts, None, map)
    }

    /// [`call`](Self::call), a host call's received chunks landing in `into` where they can
    /// (`Plan::landing_in`).
    #[track_caller]
    pub(crate) fn call_landing<T: Send + 'static>(
        &self,
        req: Request,
        opts: &CallOptions,
        into: Option<Arc<Arena>>,
        map: fn(Output) -> Result<T>,
    ) -> Work<T> {
        let _site = crate::site::enter();
        let m = &self.member;
        let p2p = req.is_p2p();
        let device = reserved_tag(&req).map_or_else(|| req.device(), Err);
        let probe = Probe::start_on(&req, m.group.info.id, &m.rank.driver);
        let work = match device {
            Ok(d) if d.is_host() => m.call_host_landing(req, opts, into, map),
            Ok(d) => backend::call_on_device(m, self.device_backend, d, req, opts, map),
            Err(e) => m.refuse(p2p, e),
        };
        match probe {
            None => work,
            probe => work.measured(probe),
        }
    }

    /// A host call that is a part of another (an object collective's sizes, `split`'s
    /// gather): not measured on its own; the call it is part of is ([`measure`](Self::measure)).
    #[track_caller]
    pub(crate) fn part<T: Send + 'static>(
        &self,
        req: Request,
        map: fn(Output) -> Result<T>,
    ) -> Work<T> {
        self.member.call_host(req, &CallOptions::default(), map)
    }

    /// `work()`'s call, measured as one call named `op` on this group, of `bytes`
    /// (`metrics.rs`): for the calls that are not one request.
    #[track_caller]
    pub(crate) fn measure<T>(
        &self,
        op: &'static str,
        bytes: u64,
        work: impl FnOnce() -> Work<T>,
    ) -> Work<T> {
        let _site = crate::site::enter();
        let probe = crate::metrics::Probe::named(op, self.member.group.info.id, bytes);
        let w = work();
        match probe {
            None => w,
            probe => w.measured(probe),
        }
    }

    /// Issues any [`Request`] and hands back the raw [`Output`] (the typed methods below are
    /// thin wrappers of this; benchmarks and test matrices use it directly).
    #[track_caller]
    pub fn submit(&self, req: Request, opts: &CallOptions) -> Work<Output> {
        self.call(req, opts, Ok)
    }

    /// `all_reduce`: every rank gets the reduction of every rank's `tensor`.
    #[track_caller]
    pub fn all_reduce(&self, tensor: Tensor, op: ReduceOp) -> Work<Tensor> {
        self.all_reduce_with(tensor, op, &CallOptions::default())
    }

    /// `all_reduce` with per-call options (algorithm, timeout).
    #[track_caller]
    pub fn all_reduce_with(
        &self,
        tensor: Tensor,
        op: ReduceOp,
        opts: &CallOptions,
    ) -> Work<Tensor> {
        self.call(Request::AllReduce { tensor, op }, opts, one)
    }

    /// `reduce`: rank `dst` gets the reduction; the others get their input back unchanged.
    #[track_caller]
    pub fn reduce(&self, tensor: Tensor, dst: usize, op: ReduceOp) -> Work<Tensor> {
        self.reduce_with(tensor, dst, op, &CallOptions::default())
    }

    /// `reduce` with per-call options.
    #[track_caller]
    pub fn reduce_with(
        &self,
        tensor: Tensor,
        dst: usize,
        op: ReduceOp,
        opts: &CallOptions,
    ) -> Work<Tensor> {
        self.call(
            Request::Reduce {
                tensor,
                root: dst,
                op,
            },
            opts,
            one,
        )
    }

    /// `broadcast`: every rank gets rank `src`'s tensor; the others pass a tensor of the
    /// same shape and dtype (its values are not read).
    #[track_caller]
    pub fn broadcast(&self, tensor: Tensor, src: usize) -> Work<Tensor> {
        self.broadcast_with(tensor, src, &CallOptions::default())
    }

    /// `broadcast` with per-call options.
    #[track_caller]
    pub fn broadcast_with(&self, tensor: Tensor, src: usize, opts: &CallOptions) -> Work<Tensor> {
        self.call(Request::Broadcast { tensor, root: src }, opts, one)
    }

    /// `all_gather(tensor_list, tensor)`: one tensor per rank; `outputs[r]` gives rank r's
    /// shape, so sizes may differ.
    #[track_caller]
    pub fn all_gather(&self, outputs: Vec<TensorSpec>, input: Tensor) -> Work<Vec<Tensor>> {
        self.all_gather_with(outputs, input, &CallOptions::default())
    }

    /// `all_gather` with per-call options.
    #[track_caller]
    pub fn all_gather_with(
        &self,
        outputs: Vec<TensorSpec>,
        input: Tensor,
        opts: &CallOptions,
    ) -> Work<Vec<Tensor>> {
        self.call(Request::AllGather { input, outputs }, opts, many)
    }

    /// `all_gather_into_tensor(output, input)`: every rank's input, concatenated in rank order
    /// into a tensor of `output`'s shape.
    #[track_caller]
    pub fn all_gather_into_tensor(&self, output: TensorSpec, input: Tensor) -> Work<Tensor> {
        self.all_gather_into_tensor_with(output, input, &CallOptions::default())
    }

    /// `all_gather_into_tensor` with per-call options.
    #[track_caller]
    pub fn all_gather_into_tensor_with(
        &self,
        output: TensorSpec,
        input: Tensor,
        opts: &CallOptions,
    ) -> Work<Tensor> {
        self.call(Request::AllGatherIntoTensor { input, output }, opts, one)
    }

    /// `gather`: rank `dst` gets every rank's tensor (`Some`), the others `None`.
    #[track_caller]
    pub fn gather(&self, input: Tensor, dst: usize) -> Work<Option<Vec<Tensor>>> {
        self.call(
            Request::Gather { input, root: dst },
            &CallOptions::default(),
            gathered,
        )
    }

    /// `scatter`: rank `src` passes one tensor per rank; every rank gets its own.
    #[track_caller]
    pub fn scatter(
        &self,
        output: TensorSpec,
        inputs: Option<Vec<Tensor>>,
        src: usize,
    ) -> Work<Tensor> {
        self.call(
            Request::Scatter {
                output,
                inputs,
                root: src,
            },
            &CallOptions::default(),
            one,
        )
    }

    /// `reduce_scatter(output, input_list, op)`: rank r gets the reduction of every rank's
    /// `inputs[r]`.
    #[track_caller]
    pub fn reduce_scatter(&self, inputs: Vec<Tensor>, op: ReduceOp) -> Work<Tensor> {
        self.reduce_scatter_with(inputs, op, &CallOptions::default())
    }

    /// `reduce_scatter` with per-call options.
    #[track_caller]
    pub fn reduce_scatter_with(
        &self,
        inputs: Vec<Tensor>,
        op: ReduceOp,
        opts: &CallOptions,
    ) -> Work<Tensor> {
        self.call(Request::ReduceScatter { inputs, op }, opts, one)
    }

    /// `reduce_scatter_tensor(output, input, op)`: the input is `size` equal blocks; rank r
    /// gets block r reduced.
    #[track_caller]
    pub fn reduce_scatter_tensor(
        &self,
        output: TensorSpec,
        input: Tensor,
        op: ReduceOp,
    ) -> Work<Tensor> {
        self.reduce_scatter_tensor_with(output, input, op, &CallOptions::default())
    }

    /// `reduce_scatter_tensor` with per-call options.
    #[track_caller]
    pub fn reduce_scatter_tensor_with(
        &self,
        output: TensorSpec,
        input: Tensor,
        op: ReduceOp,
        opts: &CallOptions,
    ) -> Work<Tensor> {
        self.call(
            Request::ReduceScatterTensor { input, output, op },
            opts,
            one,
        )
    }

    /// `all_to_all(output_list, input_list)`: `inputs[r]` goes to rank r; `outputs[r]` is the
    /// spec of what comes from rank r (sizes may differ).
    #[track_caller]
    pub fn all_to_all(&self, outputs: Vec<TensorSpec>, inputs: Vec<Tensor>) -> Work<Vec<Tensor>> {
        self.call(
            Request::AllToAll { inputs, outputs },
            &CallOptions::default(),
            many,
        )
    }

    /// `all_to_all_single(output, input, output_split_sizes, input_split_sizes)`: splits along
    /// dimension 0, equal when `None`.
    #[track_caller]
    pub fn all_to_all_single(
        &self,
        output: TensorSpec,
        input: Tensor,
        output_splits: Option<Vec<usize>>,
        input_splits: Option<Vec<usize>>,
    ) -> Work<Tensor> {
        self.call(
            Request::AllToAllSingle {
                input,
                output,
                output_splits,
                input_splits,
            },
            &CallOptions::default(),
            one,
        )
    }

    /// `barrier()`.
    #[track_caller]
    pub fn barrier(&self) -> Work<()> {
        self.call(Request::Barrier, &CallOptions::default(), unit)
    }

    /// `monitored_barrier(timeout, wait_all_ranks=True)`: every rank reports to group rank
    /// 0, which waits up to `timeout` for all of them. If some rank does not come, rank 0's
    /// call fails with [`Error::Timeout`] whose `waiting_for` names each rank that did not
    /// come (torch names only the first unless `wait_all_ranks`), and every other rank's call
    /// fails with that verdict as the group's abort ([`Error::GroupAborted`] whose
    /// [`root_cause`](Error::root_cause) is rank 0's error); a rank in another call gets
    /// [`Error::Mismatch`]. Ranks other than 0 wait one `desync_grace` longer for the
    /// verdict. Like every call, it also returns the group's pending error, if there is one:
    /// a program that ends with it hears of every failure its ranks' early-finished calls
    /// did not see.
    #[track_caller]
    pub fn monitored_barrier(&self, timeout: std::time::Duration) -> Work<()> {
        let opts = CallOptions {
            timeout: Some(timeout),
            ..Default::default()
        };
        self.call(Request::MonitoredBarrier, &opts, unit)
    }

    /// Releases this group on this rank (torch's `destroy_process_group(group)`): local, not
    /// collective. Returns the group's *pending error* — a failure of the group (a mismatch,
    /// a timeout, a lost peer) that this rank learnt of after its calls had completed and
    /// that no call of it has returned — or `Ok`. Calls still in flight on the group fail
    /// with [`Error::Shutdown`], and the other members are told at once; later calls through
    /// any handle of this group fail with [`Error::InvalidArgument`]. The group's NCCL
    /// communicator, if it has one, is released (aborted) too.
    #[track_caller]
    pub fn destroy(&self) -> Work<()> {
        // The group's NCCL communicators, if it has any, go too.
        if let Some(w) = crate::sync::lock(&self.member.group.nccl_worker).as_ref() {
            w.release(self.member.group.info.id);
        }
        if let Some(hub) = &self.member.rank.hub {
            hub.release(self.member.group.info.id);
        }
        self.member.group.p2p.release(self.member.group.info.id);
        self.member
            .ready(self.member.rank.driver.destroy(self.member.group.info.id))
    }

    /// `barrier()` on a device, as torch's NCCL backend does it: a one-element all_reduce
    /// there, through this handle's device backend, so it is ordered with the device calls
    /// around it. On the host it is [`barrier`](Communicator::barrier).
    #[track_caller]
    pub fn barrier_on(&self, device: collectix_runtime::Device) -> Work<()> {
        if device.is_host() {
            return self.barrier();
        }
        let one = crate::device::TensorDeviceExt::to_device(&Tensor::from_vec(vec![0u8]), device);
        match one {
            Ok(t) => self.call(
                Request::AllReduce {
                    tensor: t,
                    op: ReduceOp::Sum,
                },
                &CallOptions::default(),
                unit,
            ),
            Err(e) => self.member.refuse(false, e),
        }
    }

    /// `send` / `isend`: completes once the message is handed to the transport.
    #[track_caller]
    pub fn send(&self, tensor: Tensor, dst: usize, tag: u32) -> Work<()> {
        self.call(
            Request::Send { tensor, dst, tag },
            &CallOptions::default(),
            unit,
        )
    }

    /// `recv` / `irecv`: receives a tensor of `spec` from `src` (any rank if `None`) with
    /// `tag`, and returns it with its sender. Messages from one sender with one tag are
    /// received in the order they were sent.
    #[track_caller]
    pub fn recv(&self, spec: TensorSpec, src: Option<usize>, tag: u32) -> Work<(Tensor, usize)> {
        self.call(
            Request::Recv { spec, src, tag },
            &CallOptions::default(),
            |o| match o {
                Output::Received { tensor, src } => Ok((tensor, src)),
                other => Err(Error::internal(format!(
                    "expected a received tensor, got {other:?}"
                ))),
            },
        )
    }

    /// `isend`: the same as [`send`](Self::send) (every call here is asynchronous).
    #[track_caller]
    pub fn isend(&self, tensor: Tensor, dst: usize, tag: u32) -> Work<()> {
        self.send(tensor, dst, tag)
    }

    /// `irecv`: the same as [`recv`](Self::recv).
    #[track_caller]
    pub fn irecv(&self, spec: TensorSpec, src: Option<usize>, tag: u32) -> Work<(Tensor, usize)> {
        self.recv(spec, src, tag)
    }

    /// `batch_isend_irecv`: issues every operation at once; sends complete with `None`,
    /// receives with `Some(tensor)`.
    #[track_caller]
    pub fn batch_isend_irecv(&self, ops: Vec<P2POp>) -> Vec<Work<Option<Tensor>>> {
        ops.into_iter()
            .map(|op| match op {
                P2POp::Send { tensor, peer, tag } => self.call(
                    Request::Send {
                        tensor,
                        dst: peer,
                        tag,
                    },
                    &CallOptions::default(),
                    |_| Ok(None),
                ),
                P2POp::Recv { spec, peer, tag } => self.call(
                    Request::Recv {
                        spec,
                        src: Some(peer),
                        tag,
                    },
                    &CallOptions::default(),
                    |o| match o {
                        Output::Received { tensor, .. } => Ok(Some(tensor)),
                        other => Err(Error::internal(format!(
                            "expected a received tensor, got {other:?}"
                        ))),
                    },
                ),
            })
            .collect()
    }

    /// `new_group(ranks)`: collective over this group (every member calls it, with the same
    /// list). `ranks` are ranks of this group. Members get `Some(communicator)`, the others
    /// `None`. The ranks agree first (a mismatched list is an [`Error::Mismatch`]).
    #[track_caller]
    pub fn new_group(&self, ranks: &[usize]) -> Work<Option<Communicator>> {
        self.measure("new_group", 0, || self.new_group_unmeasured(ranks))
    }

    #[track_caller]
    fn new_group_unmeasured(&self, ranks: &[usize]) -> Work<Option<Communicator>> {
        // Taken first: a call that fails its checks here still counts on every member.
        let index = self.member.group.children.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = check_members(ranks, self.size()) {
            return self.member.refuse(false, e);
        }
        let members: Vec<usize> = ranks
            .iter()
            .map(|&r| self.member.group.info.global(r))
            .collect();
        let hash = fnv1a(members.iter().map(|&m| m as u64));
        let id = GroupId::derive(self.member.group.info.id, index, &[0, hash]);
        self.subgroup(id, members, hash)
    }

    /// Registers the group (if this rank is in it) and issues the agreement barrier on this
    /// group; `members` are world ranks.
    #[track_caller]
    fn subgroup(&self, id: GroupId, members: Vec<usize>, hash: u64) -> Work<Option<Communicator>> {
        let plan = match Plan::new(
            Request::NewGroup { members: hash },
            &self.member.group.info,
            &CallOptions::default(),
        ) {
            Ok(p) => p,
            Err(e) => return self.member.refuse(false, e),
        };
        let child = GroupInfo::new(
            id,
            members,
            self.member.rank.rank,
            self.member.group.info.options.clone(),
        )
        .ok();
        if let Some(info) = &child {
            self.member.rank.driver.add_group(info.clone());
        }
        let rank = self.member.rank.clone();
        let (seq, open) = match self.member.reserve() {
            Ok(seq) => (seq, self.member.open()),
            Err(e) => return self.member.ready(Err(e)),
        };
        self.member.issue(seq, open, plan, move |_| {
            Ok(child.map(|info| Communicator::new(rank, info)))
        })
    }

    /// `new_subgroups(group_size)`: cuts this group into consecutive subgroups of
    /// `group_size` ranks and returns this rank's (collective; the size must divide the
    /// group's).
    #[track_caller]
    pub fn new_subgroups(&self, group_size: usize) -> Work<Communicator> {
        self.measure("new_subgroups", 0, || {
            self.new_subgroups_unmeasured(group_size)
        })
    }

    #[track_caller]
    fn new_subgroups_unmeasured(&self, group_size: usize) -> Work<Communicator> {
        let w = self.size();
        // Taken first: a call that fails its checks here still counts on every member.
        let index = self.member.group.children.fetch_add(1, Ordering::Relaxed);
        if group_size == 0 || !w.is_multiple_of(group_size) {
            let e = Error::invalid(format!(
                "subgroup size {group_size} does not divide the group size {w}"
            ));
            return self.member.refuse(false, e);
        }
        let k = self.rank() / group_size;
        let members: Vec<usize> = (k * group_size..(k + 1) * group_size)
            .map(|r| self.member.group.info.global(r))
            .collect();
        let id = GroupId::derive(
            self.member.group.info.id,
            index,
            &[1, group_size as u64, k as u64],
        );
        let inner = self.subgroup(id, members, fnv1a([1, group_size as u64]));
        let (c, work) = Work::raw(self.member.rank.rank_threads.clone());
        self.member.rank.spawner.spawn(async move {
            c.complete(
                inner
                    .await
                    .and_then(|g| g.ok_or_else(|| Error::internal("not in own subgroup"))),
            );
        });
        work
    }

    /// A `split` that failed its checks on this rank: it takes its place as one would (a
    /// child index, and its all_gather's sequence number), and the others hear at once.
    #[track_caller]
    pub(crate) fn refuse_split<T: Send + 'static>(&self, e: Error) -> Work<T> {
        self.member.group.children.fetch_add(1, Ordering::Relaxed);
        self.member.refuse(false, e)
    }

    /// `split(color, key)` (torch's `split_group`/MPI's `Comm_split`): collective; ranks that
    /// pass the same `Some(color)` form a group, ordered by `(key, rank)`; `None` joins none.
    #[track_caller]
    pub fn split(&self, color: Option<u32>, key: i64) -> Work<Option<Communicator>> {
        self.measure("split", 0, || self.split_unmeasured(color, key))
    }

    #[track_caller]
    fn split_unmeasured(&self, color: Option<u32>, key: i64) -> Work<Option<Communicator>> {
        let index = self.member.group.children.fetch_add(1, Ordering::Relaxed);
        let mine = Tensor::from_vec(vec![color.map_or(-1, i64::from), key]);
        let w = self.size();
        let gathered = self.part(
            Request::AllGatherIntoTensor {
                input: mine,
                output: TensorSpec::new(&[w, 2], DType::I64),
            },
            one,
        );
        let (c, work) = Work::raw(self.member.rank.rank_threads.clone());
        let (rank, group) = (self.member.rank.clone(), self.member.group.clone());
        self.member.rank.spawner.spawn(async move {
            let r = gathered.await.and_then(|t| {
                let v = t.to_vec::<i64>()?;
                let Some(color) = color else { return Ok(None) };
                let mut m: Vec<(i64, usize)> = (0..w)
                    .filter(|&r| v[2 * r] == i64::from(color))
                    .map(|r| (v[2 * r + 1], r))
                    .collect();
                m.sort();
                let members: Vec<usize> =
                    m.into_iter().map(|(_, r)| group.info.global(r)).collect();
                let id = GroupId::derive(group.info.id, index, &[2, u64::from(color)]);
                let info = GroupInfo::new(id, members, rank.rank, group.info.options.clone())?;
                rank.driver.add_group(info.clone());
                Ok(Some(Communicator::new(rank, info)))
            });
            c.complete(r);
        });
        work
    }
}

impl Drop for Communicator {
    /// A handle dropped while one of the rank's own threads (its actor's) unwinds from a
    /// panic revokes its group, so that the other members hear at once (their calls on it
    /// fail with [`Error::Revoked`] naming this rank) instead of at their timeout: the rank
    /// can no longer take part. On any other thread, a panic may be caught (`catch_unwind`,
    /// a thread pool, an async runtime's task) and the program go on: a handle dropped then
    /// does nothing. A body under [`World::run`](crate::World::run) that panics is handled
    /// by its policy; a process whose panic ends it is heard at once by its peers (its
    /// connections close).
    fn drop(&mut self) {
        if std::thread::panicking() && self.member.rank.rank_threads.is_current() {
            let _ = self.member.rank.driver.revoke(self.member.group.info.id);
        }
    }
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Communicator")
            .field("group", &self.member.group.info.id)
            .field("rank", &self.rank())
            .field("size", &self.size())
            .finish()
    }
}

/// The error of a send or receive on one of the tags collectix keeps for itself.
fn reserved_tag(req: &Request) -> Option<Error> {
    match req {
        Request::Send { tag, .. } | Request::Recv { tag, .. } if *tag >= FIRST_RESERVED_TAG => {
            Some(Error::invalid(format!(
                "tag {tag:#x} is reserved by collectix (tags from {FIRST_RESERVED_TAG:#x} up)"
            )))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use crate::World;
    use collectix_runtime::Error;
    use std::sync::mpsc;
    use std::time::Duration;

    #[test]
    fn blocking_wait_on_a_rank_thread_is_refused() {
        let w = World::local(2).unwrap_or_else(|e| panic!("{e}"));
        let c = w.communicators()[0].clone();
        let (tx, rx) = mpsc::channel();
        let work = c.barrier();
        // The second call is made on the rank's thread while the first, this thread's, is in
        // flight: on a lane, or it would be refused for that (`ConcurrentCalls`).
        let lane = c.lane("the rank's thread");
        let arbiter = c.member.rank.spawner.clone();
        arbiter.spawn(async move {
            let _ = tx.send((
                work.wait(),
                lane.barrier()
                    .wait_timeout(Duration::from_secs(1))
                    .map(|r| r.err()),
            ));
        });
        let (a, b) = rx
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or((Ok(()), None));
        assert_eq!(a, Err(Error::WouldDeadlock));
        assert_eq!(b, Some(Some(Error::WouldDeadlock)));
    }

    /// A panic that escapes onto a rank's own thread (its actor's), with a handle held
    /// there, revokes the group: the others hear at once.
    #[test]
    fn a_panic_on_a_rank_s_own_thread_revokes_its_group() {
        let w = World::local(3).unwrap_or_else(|e| panic!("{e}"));
        let c = w.communicators().to_vec();
        let held = c[0].clone();
        c[0].member.rank.spawner.spawn(async move {
            let _held = held;
            panic!("a bug on rank 0's own thread");
        });
        let got: Vec<_> = c[1..]
            .iter()
            .map(|c| {
                c.all_reduce(
                    collectix_runtime::Tensor::from_vec(vec![1.0f32]),
                    collectix_runtime::ReduceOp::Sum,
                )
                .wait_timeout(Duration::from_secs(20))
            })
            .collect();
        for (r, res) in got.into_iter().enumerate() {
            let e = res.and_then(|r| r.err());
            assert!(
                matches!(
                    e.as_ref().map(Error::root_cause),
                    Some(Error::Revoked { by: 0, .. })
                ),
                "rank {}: {e:?}",
                r + 1
            );
        }
        drop(w);
    }
}
