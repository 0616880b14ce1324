//! The collectives as specs: each [`Request`] is validated against the group (torch's
//! argument checks), given an algorithm, and turned into a [`Plan`]: the fingerprint every
//! message will carry, the schedule, the initial chunks and how to build the result.
//! Nothing here sends anything, so a wrong argument fails on the calling rank, at once.
//!
//! Each collective's file holds its spec first (`check_*`: validation, sizes, fingerprint
//! fields and output shape, as a `Checked` call; the busbw factor; the expected result for
//! tests and benchmarks), then its host planning (algorithm, schedule, initial chunks).

mod all_gather;
mod all_reduce;
mod all_to_all;
mod barrier;
mod broadcast;
#[cfg(any(test, feature = "testing"))]
pub(crate) mod case;
pub mod coalesce;
mod dest;
mod gather_scatter;
mod p2p;
mod reduce;
mod reduce_scatter;
mod request;
mod select;

pub use dest::{Destination, Run};
pub use request::Request;

use crate::error::{Error, Result};
use crate::group::{CallOptions, GroupInfo};
use crate::ids::{DataPath, Fingerprint};
use crate::op::{Algorithm, OpKind};
use crate::schedule::{Layout, Schedule, ScheduleCache, ScheduleKey};
use crate::tensor::arena::Arena;
use crate::tensor::dtype::DType;
use crate::tensor::reduce::ReduceOp;
use crate::tensor::Tensor;
use bytes::Bytes;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

pub use crate::tensor::spec::TensorSpec;

/// The result of a call.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Output {
    /// Nothing (barrier, send, gather on a non-root).
    None,
    /// One tensor.
    Tensor(Tensor),
    /// One tensor per rank.
    Tensors(Vec<Tensor>),
    /// The caller's buffers, holding the result (a plan
    /// [`writing_into`](Plan::writing_into) a [`Destination`]).
    Buffers(Vec<crate::tensor::buffer::Buffer>),
    /// A received tensor and its sender (group-local).
    Received {
        /// The data.
        tensor: Tensor,
        /// The sender, group-local.
        src: usize,
    },
}

/// How the result is assembled from the chunks.
#[derive(Clone, Debug)]
pub(crate) enum Assembly {
    /// Every chunk in order, as one tensor of `shape`.
    Whole(Vec<usize>),
    /// Blocks `blocks`, one tensor each.
    Blocks(Range<usize>, Vec<Vec<usize>>),
    /// Blocks `blocks` concatenated into one tensor of `shape`.
    Concat(Range<usize>, Vec<usize>),
    /// Just the input back.
    Return(Tensor),
    /// No output.
    Nothing,
}

/// The body of a plan.
#[derive(Clone, Debug)]
pub(crate) enum Body {
    Collective {
        schedule: Arc<Schedule>,
        init: Vec<Option<Bytes>>,
        assembly: Assembly,
        share: Share,
        /// The caller's buffers the result goes into, if any (instead of new tensors).
        dest: Option<Destination>,
        /// The caller's output buffer that the received chunks land in, if any
        /// ([`Plan::landing_in`]).
        into: Option<Arc<Arena>>,
    },
    Send {
        dst: usize,
        tag: u32,
        data: Bytes,
        count: u64,
    },
    Recv {
        src: Option<usize>,
        tag: u32,
        spec: TensorSpec,
    },
}

/// Which chunks of a call's output a rank writes into the arena the ranks of one process
/// share for it (see [`crate::tensor::arena`]); the engine uses an arena only where its data
/// plane offers one, and only for outputs made of all the call's chunks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) enum Share {
    /// No arena: the output is joined from the chunks.
    #[default]
    Nothing,
    /// The chunks this rank reduces in a step that folds several received values are
    /// written into the arena (direct all_reduce: each rank its own block).
    Folds,
    /// These chunks of this rank's own data are copied into the arena when the call starts
    /// (direct all_gather_into_tensor: each rank its own block).
    Own(Range<usize>),
}

/// A validated call, ready for the engine.
#[derive(Clone, Debug)]
pub struct Plan {
    pub(crate) fp: Fingerprint,
    pub(crate) reduce: Option<ReduceOp>,
    pub(crate) body: Body,
    pub(crate) timeout: Duration,
    pub(crate) group_size: usize,
}

impl Plan {
    /// The fingerprint of the call.
    pub fn fingerprint(&self) -> Fingerprint {
        self.fp
    }

    /// What kind of call.
    pub fn kind(&self) -> OpKind {
        self.fp.kind
    }

    /// The schedule, for collectives.
    pub fn schedule(&self) -> Option<&Schedule> {
        match &self.body {
            Body::Collective { schedule, .. } => Some(schedule.as_ref()),
            _ => None,
        }
    }

    /// With `share` as the arena use of a collective's plan.
    fn sharing(mut self, how: Share) -> Plan {
        if let Body::Collective { share, .. } = &mut self.body {
            *share = how;
        }
        self
    }

    /// The same call, its received chunks landing in `arena`, a caller's output whose part
    /// holding this rank's own data is frozen there already (the input's bytes are that
    /// part): an in-place all_gather. Where the transport reads peers' payloads (processes)
    /// and the output is one run of chunks of the arena's length, the chunks land in it and
    /// the result is the arena itself; anywhere else the arena is not used (the result is a
    /// new tensor, as without it). Correctness never depends on it (see
    /// [`crate::landing`]).
    pub fn landing_in(mut self, arena: Arc<Arena>) -> Plan {
        if let Body::Collective { into, .. } = &mut self.body {
            *into = Some(arena);
        }
        self
    }

    /// Whether this is a point-to-point call (matched by tag, outside the group sequence).
    pub fn is_p2p(&self) -> bool {
        matches!(self.body, Body::Send { .. } | Body::Recv { .. })
    }

    /// A plan from a hand-made schedule (for model checking and tests of the engine itself,
    /// including deliberately broken schedules). The result is every chunk joined.
    #[doc(hidden)]
    pub fn from_schedule(
        fp: Fingerprint,
        schedule: Schedule,
        init: Vec<Option<Bytes>>,
        timeout: Duration,
        group_size: usize,
    ) -> Plan {
        let assembly = Assembly::Whole(vec![schedule.layout.total()]);
        Plan {
            fp,
            reduce: None,
            body: Body::Collective {
                schedule: Arc::new(schedule),
                init,
                assembly,
                share: Share::Nothing,
                dest: None,
                into: None,
            },
            timeout,
            group_size,
        }
    }

    /// Checks `req` for this member of `group` as planning it would (the collective's
    /// argument rules: list lengths, roots, dtypes, sizes), on any device, without planning
    /// a schedule or reading any data. A data path of its own (the NCCL backend) starts from
    /// this, so every path enforces the same rules and fingerprints a call alike. Only the
    /// collectives have such a check; point-to-point calls and `monitored_barrier` are an
    /// [`Error::InvalidArgument`].
    pub fn check(req: Request, group: &GroupInfo) -> Result<CheckedCall> {
        Planner {
            g: group,
            opts: &CallOptions::default(),
            cache: None,
        }
        .check(req)
        .map(CheckedCall)
    }

    /// Validates `req` for this member of `group` and plans it. The engine moves host
    /// memory only: a request on a device is an [`Error::InvalidArgument`] here (the device
    /// layer in `collectix-actors` routes those to NCCL or stages them through the host).
    pub fn new(req: Request, group: &GroupInfo, opts: &CallOptions) -> Result<Plan> {
        Plan::check_host(&req, group)?;
        Planner {
            g: group,
            opts,
            cache: None,
        }
        .plan(req)
    }

    /// The checks every plan starts with: host memory, and the declared size within the
    /// group's `max_call_bytes`.
    fn check_host(req: &Request, group: &GroupInfo) -> Result<()> {
        let device = req.device()?;
        if !device.is_host() {
            return Err(Error::invalid(format!(
                "the engine moves host memory only; this call is on {device} (device calls go through the communicator)"
            )));
        }
        let bytes = req.declared_bytes()?;
        let limit = group.options.max_call_bytes;
        if bytes > limit {
            return Err(Error::invalid(format!(
                "the call declares {bytes} bytes of inputs and outputs, above the group's max_call_bytes ({limit})"
            )));
        }
        Ok(())
    }

    /// [`Plan::new`], reusing the schedules `cache` keeps for this member of `group` (a
    /// communicator keeps one per group): a small call's schedule is then looked up, not built
    /// and freed again on every call.
    pub fn new_cached(
        req: Request,
        group: &GroupInfo,
        opts: &CallOptions,
        cache: &ScheduleCache,
    ) -> Result<Plan> {
        Plan::check_host(&req, group)?;
        Planner {
            g: group,
            opts,
            cache: Some(cache),
        }
        .plan(req)
    }

    /// The same plan, marked as the agreement step of a call on another data path (see
    /// [`Fingerprint::path`]). A receive marked [`DataPath::Nccl`] matches only a send
    /// marked so (see [`Plan::nccl_ticket`]) and completes with the sender's ticket (a `u8`
    /// tensor) instead of data.
    pub fn with_path(mut self, path: DataPath) -> Plan {
        self.fp.path = path;
        self
    }

    /// A send of `ticket` (at most [`TICKET_MAX`](crate::wire::message::TICKET_MAX) bytes)
    /// that stands for `count` elements of `dtype` sent on NCCL: it is matched like any
    /// send, by (source, tag) in FIFO order, against a receive of that many elements whose
    /// plan is marked [`DataPath::Nccl`]; any other receive is a mismatch on both ranks.
    pub fn nccl_ticket(
        group: &GroupInfo,
        opts: &CallOptions,
        dst: usize,
        tag: u32,
        dtype: DType,
        count: u64,
        ticket: Vec<u8>,
    ) -> Result<Plan> {
        if ticket.len() > crate::wire::message::TICKET_MAX {
            return Err(Error::invalid("a ticket longer than TICKET_MAX"));
        }
        let mut plan = Plan::new(
            Request::Send {
                tensor: Tensor::from_vec(ticket),
                dst,
                tag,
            },
            group,
            opts,
        )?;
        plan.fp = Fingerprint {
            path: DataPath::Nccl,
            ..p2p_fp(OpKind::Send, dtype, count)
        };
        if let Body::Send { count: c, .. } = &mut plan.body {
            *c = count;
        }
        Ok(plan)
    }
}

/// nccl-tests' bus-bandwidth factor of a call of `kind` in a group of `n` ranks (busbw =
/// algbw × factor; 1 for point-to-point, 0 for a barrier, which moves no data).
pub fn busbw_factor(kind: OpKind, n: usize) -> f64 {
    let n = n.max(1) as f64;
    match kind {
        OpKind::AllReduce => all_reduce::busbw_factor(n),
        OpKind::Reduce => reduce::busbw_factor(n),
        OpKind::Broadcast => broadcast::busbw_factor(n),
        OpKind::AllGather | OpKind::AllGatherIntoTensor => all_gather::busbw_factor(n),
        OpKind::Gather | OpKind::Scatter => gather_scatter::busbw_factor(n),
        OpKind::ReduceScatter | OpKind::ReduceScatterTensor => reduce_scatter::busbw_factor(n),
        OpKind::AllToAll | OpKind::AllToAllSingle => all_to_all::busbw_factor(n),
        OpKind::Barrier | OpKind::NewGroup | OpKind::MonitoredBarrier => barrier::busbw_factor(n),
        OpKind::Send | OpKind::Recv => p2p::busbw_factor(n),
    }
}

pub use select::select;

/// A collective call whose arguments passed its checks ([`Plan::check`]): what every rank
/// must agree on, before any data path runs it.
#[derive(Clone, Debug)]
pub struct CheckedCall(Checked);

impl CheckedCall {
    /// The call's fingerprint on data path `path`, with no algorithm (a path other than the
    /// engine's picks its own).
    pub fn fingerprint(&self, path: DataPath) -> Fingerprint {
        let c = &self.0;
        Fingerprint {
            count: c.count,
            root: c.root.map(|r| r as u32),
            op: c.op.map(ReduceOp::kind),
            scalar: c.op.map_or(0, ReduceOp::scalar_bits),
            path,
            ..Fingerprint::new(c.kind, c.dtype)
        }
    }
}

/// A call whose arguments passed the collective's checks: everything of the plan that does
/// not depend on the algorithm.
#[derive(Clone, Debug)]
struct Checked {
    /// What kind of call.
    kind: OpKind,
    /// The element type the call moves.
    dtype: DType,
    /// The element count in the fingerprint (`None` where ranks may differ, as in all_to_all).
    count: Option<u64>,
    /// The root, for rooted collectives.
    root: Option<usize>,
    /// The reduction, for reducing collectives.
    op: Option<ReduceOp>,
    /// The size in bytes the default algorithm is chosen by (see [`select`]): the same on
    /// every rank of the call (for the list-form all_gather, whose blocks may differ, the
    /// mean block), or ranks would choose different algorithms.
    bytes: usize,
    /// How the result is assembled from the chunks.
    assembly: Assembly,
}

struct Planner<'a> {
    g: &'a GroupInfo,
    opts: &'a CallOptions,
    /// Where the schedules of this group member's recent calls are kept, if anywhere.
    cache: Option<&'a ScheduleCache>,
}

fn same_dtype(what: &str, want: DType, got: DType) -> Result<()> {
    if want == got {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "{what} has dtype {got}, expected {want}"
        )))
    }
}

fn list_len(what: &str, len: usize, w: usize) -> Result<()> {
    if len == w {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "{what} has {len} entries; the group has {w} ranks"
        )))
    }
}

/// Cuts `data` into the chunks of `blocks` of `layout` (no copy).
fn fill(
    init: &mut [Option<Bytes>],
    layout: &Layout,
    blocks: Range<usize>,
    data: &Bytes,
    esize: usize,
) -> Result<()> {
    let mut off = 0usize;
    for c in layout.chunks_of(blocks) {
        let len = layout.chunk_elems[c] * esize;
        let end = off
            .checked_add(len)
            .filter(|&e| e <= data.len())
            .ok_or_else(|| Error::invalid("input too short for its layout"))?;
        init[c] = Some(data.slice(off..end));
        off = end;
    }
    Ok(())
}

impl Planner<'_> {
    fn w(&self) -> usize {
        self.g.size()
    }

    fn algorithm(&self, kind: OpKind, bytes: usize) -> Result<Algorithm> {
        let forced = self.opts.algorithm.or_else(|| {
            self.g
                .options
                .algorithms
                .iter()
                .find(|(k, _)| *k == kind)
                .map(|(_, a)| *a)
        });
        match forced {
            Some(a) if kind.algorithms().contains(&a) => Ok(a),
            Some(a) => Err(Error::invalid(format!("algorithm {a} cannot run {kind}"))),
            None => Ok(select(kind, bytes, self.w(), self.g.options.locality)),
        }
    }

    fn seg_elems(&self, dtype: DType) -> usize {
        (self.g.options.segment_bytes / dtype.size()).max(1)
    }

    /// The plan of a checked call run by `algorithm` over `schedule` from the chunks `init`.
    fn collective(
        &self,
        checked: Checked,
        algorithm: Algorithm,
        schedule: impl Into<Arc<Schedule>>,
        init: Vec<Option<Bytes>>,
    ) -> Plan {
        let schedule = schedule.into();
        let reduce = checked.op;
        Plan {
            fp: Fingerprint {
                kind: checked.kind,
                dtype: checked.dtype,
                count: checked.count,
                root: checked.root.map(|r| r as u32),
                op: reduce.map(ReduceOp::kind),
                scalar: reduce.map_or(0, ReduceOp::scalar_bits),
                algorithm: Some(algorithm),
                path: DataPath::Engine,
            },
            reduce,
            body: Body::Collective {
                schedule,
                init,
                assembly: checked.assembly,
                share: Share::Nothing,
                dest: None,
                into: None,
            },
            timeout: self.opts.timeout.unwrap_or(self.g.options.timeout),
            group_size: self.w(),
        }
    }

    /// The input after the op's pre-transform (PremulSum), checked against the dtype rules.
    fn prepare(&self, t: &Tensor, op: ReduceOp) -> Result<Bytes> {
        op.check(t.dtype())?;
        Ok(crate::tensor::reduce::pre(t.dtype(), op, t.bytes())?
            .unwrap_or_else(|| t.bytes().clone()))
    }

    /// The collective's checks of `req`, with no schedule planned (see [`Plan::check`]).
    fn check(&self, req: Request) -> Result<Checked> {
        Ok(match req {
            Request::AllReduce { tensor, op } => self.check_all_reduce(tensor, op)?.0,
            Request::Reduce { tensor, root, op } => self.check_reduce(tensor, root, op)?.0,
            Request::Broadcast { tensor, root } => self.check_broadcast(tensor, root)?.0,
            Request::AllGather { input, outputs } => self.check_all_gather(input, outputs)?.0,
            Request::AllGatherIntoTensor { input, output } => {
                self.check_all_gather_into_tensor(input, output)?.0
            }
            Request::Gather { input, root } => self.check_gather(input, root)?.0,
            Request::Scatter {
                output,
                inputs,
                root,
            } => self.check_scatter(output, inputs, root)?.0,
            Request::ReduceScatter { inputs, op } => self.check_reduce_scatter(inputs, op)?.0,
            Request::ReduceScatterTensor { input, output, op } => {
                self.check_reduce_scatter_tensor(input, output, op)?.0
            }
            Request::AllToAll { inputs, outputs } => self.check_all_to_all(inputs, outputs)?.0,
            Request::AllToAllSingle {
                input,
                output,
                output_splits,
                input_splits,
            } => {
                self.check_all_to_all_single(input, output, output_splits, input_splits)?
                    .0
            }
            Request::Barrier => barrier::check_barrier(None),
            Request::NewGroup { members } => barrier::check_barrier(Some(members)),
            Request::MonitoredBarrier | Request::Send { .. } | Request::Recv { .. } => {
                return Err(Error::invalid(
                    "point-to-point calls and monitored_barrier have no collective check",
                ))
            }
        })
    }

    fn plan(&self, req: Request) -> Result<Plan> {
        match req {
            Request::AllReduce { tensor, op } => self.all_reduce(tensor, op),
            Request::Reduce { tensor, root, op } => self.reduce(tensor, root, op),
            Request::Broadcast { tensor, root } => self.broadcast(tensor, root),
            Request::AllGather { input, outputs } => self.all_gather(input, outputs),
            Request::AllGatherIntoTensor { input, output } => {
                self.all_gather_into_tensor(input, output)
            }
            Request::Gather { input, root } => self.gather(input, root),
            Request::Scatter {
                output,
                inputs,
                root,
            } => self.scatter(output, inputs, root),
            Request::ReduceScatter { inputs, op } => self.reduce_scatter(inputs, op),
            Request::ReduceScatterTensor { input, output, op } => {
                self.reduce_scatter_tensor(input, output, op)
            }
            Request::AllToAll { inputs, outputs } => self.all_to_all(inputs, outputs),
            Request::AllToAllSingle {
                input,
                output,
                output_splits,
                input_splits,
            } => self.all_to_all_single(input, output, output_splits, input_splits),
            Request::Barrier => self.barrier(None),
            Request::NewGroup { members } => self.barrier(Some(members)),
            Request::MonitoredBarrier => self.monitored_barrier(),
            Request::Send { tensor, dst, tag } => self.send(tensor, dst, tag),
            Request::Recv { spec, src, tag } => self.recv(spec, src, tag),
        }
    }

    /// The segment size (elements) of a schedule that is `segmented`, else 0: a cache key
    /// must not hold what the schedule ignores.
    fn seg_if(&self, segmented: bool, dt: DType) -> usize {
        if segmented {
            self.seg_elems(dt)
        } else {
            0
        }
    }

    /// The schedule `make` builds, from the cache if it keeps one under `key` (what the
    /// schedule depends on besides this member's group, which the cache belongs to).
    fn memo(&self, key: ScheduleKey, make: impl FnOnce() -> Schedule) -> Arc<Schedule> {
        match self.cache {
            Some(c) => c.get_or_make(key, make),
            None => Arc::new(make()),
        }
    }

    fn timeout(&self) -> Duration {
        self.opts.timeout.unwrap_or(self.g.options.timeout)
    }
}

/// The fingerprint of a point-to-point call.
pub(crate) fn p2p_fp(kind: OpKind, dtype: DType, count: u64) -> Fingerprint {
    Fingerprint {
        count: Some(count),
        algorithm: Some(Algorithm::Direct),
        ..Fingerprint::new(kind, dtype)
    }
}
