//! The per-rank protocol engine: a deterministic state machine with no IO and no clock.
//!
//! Inputs: [`Engine::submit`], [`Engine::handle_message`], [`Engine::handle_timeout`],
//! [`Engine::handle_peer_lost`]. Outputs, drained by the driver after every input:
//! [`Engine::poll_transmit`] (messages to send), [`Engine::poll_event`] (calls that completed
//! or failed) and [`Engine::poll_timeout`] (when to call `handle_timeout` next).
//!
//! Matching: a collective message is routed by `(group, seq)` to its call, then by
//! `(source, tag)` to a receive of the call's schedule; messages for calls this rank has not
//! made yet wait in a per-group store, messages for later steps wait in the call's inbox.
//! Every message's fingerprint is compared with the call's before anything else: a
//! disagreement fails the call with [`Error::Mismatch`] and aborts the group, which tells
//! every other member (they fail with [`Error::GroupAborted`]).
//!
//! One concern per file: `mod.rs` (the engine's state, inputs and outputs), `groups.rs` (the
//! group registry), `call.rs` (the schedule interpreter), `p2p.rs` (point-to-point matching),
//! `flow.rs` and `p2p_flow.rs` (flow control), `failure.rs` (timeouts, lost peers,
//! mismatches, aborts, shutdown), `failed.rs` (a call that failed on one member before it
//! started), `membership.rs` (revoking a group, members that left it, and lost peers) and
//! `output.rs` (payload checks and output assembly).

mod board;
mod call;
mod cycle;
mod failed;
mod failure;
pub(crate) mod flow;
mod groups;
mod membership;
mod output;
mod p2p;
pub(crate) mod p2p_flow;
mod sink;

pub use board::{BoardEvent, Record as BoardRecord};
pub use membership::Certainty;

use crate::collective::{Assembly, Body, Output, Plan, Share, TensorSpec};
use crate::data_plane::{DataPlane, HostPlane};
use crate::error::{Error, Result};
use crate::fast_hash::FastMap;
use crate::group::GroupId;
use crate::ids::Fingerprint;
use crate::landing::Landings;
use crate::schedule::Schedule;
use crate::tensor::arena::Arena;
use crate::tensor::dtype::DType;
use crate::tensor::reduce::ReduceOp;
use crate::time::Time;
use crate::wire::message::{Header, Message, Transmit};
use bytes::Bytes;
use groups::Group;
use output::build_output;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

/// Identifies a submitted call within one engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OpId(pub u64);

/// A call finished, one way or the other.
#[derive(Clone, Debug)]
pub struct Event {
    /// Which call.
    pub op: OpId,
    /// Its result.
    pub result: Result<Output>,
}

/// The most messages kept per peer for groups this rank has not created yet. A conforming
/// peer sends at most a window of calls per group before this rank's credit, and new groups are
/// created together (`new_group` is a collective over the parent), so it stays far below;
/// messages beyond it are dropped with a warning, and the call they belonged to then ends in
/// `Timeout` on this rank (never a hang, never unbounded memory).
pub const ORPHANS_PER_PEER: usize = 4096;

/// The most payload bytes kept per peer for groups this rank has not created yet (256 MiB:
/// four default byte budgets, `GroupOptions::peer_budget_bytes`); beyond it, as beyond
/// [`ORPHANS_PER_PEER`], messages are dropped with a warning.
pub const ORPHAN_BYTES_PER_PEER: u64 = 256 << 20;

/// Fingerprints of completed calls kept per group, to check late messages against.
const DONE_KEPT: usize = 4096;

/// A collective that finished: its output is built when its event is polled.
struct Finishing {
    op: OpId,
    coll: Box<CollectiveState>,
    dtype: DType,
    reduce: Option<ReduceOp>,
    group_size: usize,
}

/// A collective call's progress through its schedule: the step it is at, its chunks, what
/// arrived for it, and how its output is assembled.
struct CollectiveState {
    /// The call's sequence number in its group.
    seq: u64,
    sched: Arc<Schedule>,
    step: usize,
    posted: bool,
    /// How many of the current step's receives, in order, are known to have arrived (a
    /// step of W receives is checked in O(W) over all its arrivals, not per arrival).
    ready: usize,
    chunks: Vec<Option<Bytes>>,
    /// Arrived payloads by (group-local source, tag).
    inbox: FastMap<(usize, u32), Vec<Bytes>>,
    /// Chunks each expected (source, tag) carries, indexed for a schedule of more than
    /// [`SCANNED_RECVS`] receives (a small one is scanned: no map built for every call).
    expected: Option<FastMap<(usize, u32), Range<usize>>>,
    assembly: Assembly,
    /// The output the ranks of this process share for this call, and which chunks this rank
    /// writes into it (see `tensor::arena`).
    arena: Option<(Arc<Arena>, Share)>,
    /// The output buffer of this rank alone that received chunks land in (see
    /// [`crate::landing`]), and the chunks it holds, in order.
    landed: Option<(Arc<Arena>, Range<usize>)>,
    /// The caller's buffers the result goes into, if it has them (`sink.rs`).
    sink: Option<sink::Sink>,
}

/// The most receives a call's schedule may have for its messages to be checked by scanning
/// it rather than through an index built for the call.
const SCANNED_RECVS: usize = 16;

impl CollectiveState {
    /// The chunks that the message from (group-local) `src` tagged `tag` carries, if the
    /// schedule expects one.
    fn expected(&self, src: usize, tag: u32) -> Option<Range<usize>> {
        match &self.expected {
            Some(index) => index.get(&(src, tag)).cloned(),
            None => self
                .sched
                .steps
                .iter()
                .flat_map(|s| &s.recvs)
                .find(|r| r.peer == src && r.tag == tag)
                .map(|r| r.chunks.clone()),
        }
    }

    /// Where chunk `ch` lies in the call's output, in bytes (for outputs made of every chunk).
    fn output_range(&self, ch: usize, size: usize) -> Range<usize> {
        let elems = &self.sched.layout.chunk_elems;
        let start: usize = elems[..ch.min(elems.len())].iter().sum();
        let len = elems.get(ch).copied().unwrap_or(0);
        start * size..(start + len) * size
    }
}

/// What a pending call is: a collective running its schedule, or a posted receive.
enum State {
    Collective(Box<CollectiveState>),
    Recv {
        src: Option<usize>,
        tag: u32,
        spec: TensorSpec,
    },
}

/// A call in flight in the engine, under its [`OpId`]: a collective or a posted receive (a
/// send completes when it is submitted, and is never one).
struct PendingCall {
    group: GroupId,
    /// The call's sequence number in its group (`None` for point-to-point calls).
    seq: Option<u64>,
    fp: Fingerprint,
    reduce: Option<ReduceOp>,
    group_size: usize,
    deadline: Time,
    /// When the call was made here.
    started: Time,
    state: State,
    /// Set when the call timed out and this rank asked the group which call each member is
    /// in (the desync report).
    inquiry: Option<failure::Inquiry>,
}

/// The protocol engine of one rank.
pub struct Engine {
    rank: usize,
    groups: FastMap<GroupId, Group>,
    /// Messages for groups this rank has not registered yet.
    orphans: HashMap<GroupId, Vec<Message>>,
    /// Messages in `orphans` and their payload bytes, per sending rank (bounded by
    /// [`ORPHANS_PER_PEER`] and [`ORPHAN_BYTES_PER_PEER`]).
    orphans_from: HashMap<usize, (usize, u64)>,
    /// Scratch list for what a call's step hands flow control (kept for its allocation).
    flow_out: Vec<flow::FlowOut<Transmit>>,
    ops: BTreeMap<OpId, Box<PendingCall>>,
    next_op: u64,
    arrivals: u64,
    /// Messages through a mailbox consumed since the driver last asked: (group, sender).
    mail_freed: Vec<(GroupId, usize)>,
    transmits: VecDeque<Transmit>,
    events: VecDeque<Event>,
    /// Collectives that finished, whose outputs are assembled when their events are polled.
    finishing: VecDeque<Finishing>,
    /// Calls whose received values are ready to reduce, held back until the messages queued
    /// before them have been taken ([`Engine::poll_transmit`] runs them once its queue is
    /// empty): a peer waiting for those messages need not wait for this rank's reduction.
    reducing: VecDeque<OpId>,
    /// Whether reductions may be held back for queued messages (not while
    /// [`Engine::poll_event`] runs the held ones for a driver that polls events first).
    hold_reductions: bool,
    /// Where chunks live and how they are combined (host memory with recycled reduction
    /// buffers by default).
    plane: Box<dyn DataPlane>,
    /// Set by [`Engine::shutdown`]: until when held messages may still be sent (`None` once
    /// that time has passed and the peers were told).
    closing: Option<Option<Time>>,
    /// Groups released by [`Engine::destroy_group`]: their messages are dropped.
    destroyed: HashSet<GroupId>,
    /// Peers this rank knows lost, by its own evidence or a member's report: the calls that
    /// need them fail.
    lost: BTreeSet<usize>,
    /// The peers of [`lost`](Self::lost) this rank saw lost itself, and whether for certain
    /// ([`Engine::handle_peer_lost`], [`Engine::handle_peer_dead`]): a group registered
    /// later with one of them as a member is aborted at once, and the survivors' agreement
    /// hears of them.
    seen_lost: BTreeMap<usize, Certainty>,
    /// Counts the changes that may stop a call on a board from running without a record
    /// made first (see [`Engine::board_epoch`]).
    board_epoch: std::sync::Arc<crate::sync::unmodelled::AtomicU64>,
    /// Where the payloads of the messages this rank's calls expect go (see
    /// [`crate::landing`]): its transports' readers take them.
    landings: Arc<Landings>,
    /// The wait-cycle probes followed here: (starting rank, its call's group and sequence
    /// number, the call named here's group and sequence number) (`cycle.rs`).
    probes_seen: HashSet<(usize, GroupId, u64, GroupId, u64)>,
}

/// Counts a change in an engine's [`board_epoch`](Engine::board_epoch) (a free function, for
/// the places that hold one of the engine's groups mutably).
fn bump(epoch: &crate::sync::unmodelled::AtomicU64) {
    epoch.fetch_add(1, crate::sync::unmodelled::Ordering::Release);
}

/// Free buffers (reduction results, joined outputs) an engine keeps for reuse: room for a
/// 64 MiB output and its chunks (larger limits measured no faster; each engine keeps at
/// most this much, so a process of W in-process ranks up to W times it).
pub const POOL_BYTES: usize = 128 << 20;

impl Engine {
    /// An engine for global rank `rank`.
    pub fn new(rank: usize) -> Engine {
        Engine::with_data_plane(rank, Box::new(HostPlane::new(POOL_BYTES)))
    }

    /// An engine for global rank `rank` of an in-process world: its peers share its address
    /// space, and calls whose output can be shared get one buffer for all of them from
    /// `arenas` (see [`crate::tensor::arena`]).
    pub fn in_process(rank: usize, arenas: Arc<crate::data_plane::Arenas>) -> Engine {
        Engine::with_data_plane(rank, Box::new(HostPlane::shared(POOL_BYTES, arenas)))
    }

    /// An engine for global rank `rank` whose chunks live in, and are combined by, `plane`
    /// (see [`crate::data_plane`]).
    pub fn with_data_plane(rank: usize, plane: Box<dyn DataPlane>) -> Engine {
        Engine {
            rank,
            groups: FastMap::default(),
            orphans: HashMap::new(),
            orphans_from: HashMap::new(),
            ops: BTreeMap::new(),
            flow_out: Vec::new(),
            next_op: 0,
            arrivals: 0,
            mail_freed: Vec::new(),
            transmits: VecDeque::new(),
            events: VecDeque::new(),
            finishing: VecDeque::new(),
            reducing: VecDeque::new(),
            hold_reductions: true,
            plane,
            closing: None,
            board_epoch: std::sync::Arc::new(crate::sync::unmodelled::AtomicU64::new(0)),
            landings: Landings::new(),
            destroyed: HashSet::new(),
            lost: BTreeSet::new(),
            seen_lost: BTreeMap::new(),
            probes_seen: HashSet::new(),
        }
    }

    /// This engine's global rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Where the payloads of the messages its calls expect go, for its transports' readers
    /// to take (see [`crate::landing`]).
    pub fn landings(&self) -> Arc<Landings> {
        self.landings.clone()
    }

    /// Messages waiting here for a peer's credit (flow control), over all groups.
    pub fn held(&self) -> usize {
        self.groups
            .values()
            .map(|g| g.flow.held() + g.p2p_flow.held())
            .sum()
    }

    /// Messages buffered for calls this rank has not made yet, over all groups.
    pub fn buffered(&self) -> usize {
        self.groups
            .values()
            .map(|g| g.unexpected.values().map(Vec::len).sum::<usize>())
            .sum()
    }

    /// Payload bytes buffered for calls this rank has not made yet and in point-to-point
    /// messages waiting for a receive, over all groups: what peers made this rank hold
    /// (bounded per peer and group by `GroupOptions::peer_budget_bytes`, twice).
    pub fn buffered_bytes(&self) -> u64 {
        let bytes = |m: &Message| m.payload.iter().map(|b| b.len() as u64).sum::<u64>();
        self.groups
            .values()
            .map(|g| {
                g.unexpected.values().flatten().map(bytes).sum::<u64>()
                    + g.p2p_arrived.values().map(|(_, m)| bytes(m)).sum::<u64>()
            })
            .sum()
    }

    /// Keeps `msg` for group `gid`, which this rank has not created yet (it is handled when
    /// the group is added), unless its sender is over [`ORPHANS_PER_PEER`] or
    /// [`ORPHAN_BYTES_PER_PEER`]: then it is dropped with a warning.
    fn keep_orphan(&mut self, gid: GroupId, msg: Message) {
        let bytes: u64 = msg.payload.iter().map(|b| b.len() as u64).sum();
        let from = self.orphans_from.entry(msg.src).or_insert((0, 0));
        if from.0 >= ORPHANS_PER_PEER || from.1.saturating_add(bytes) > ORPHAN_BYTES_PER_PEER {
            tracing::warn!(rank = self.rank, src = msg.src, group = %gid, "message for a group not created yet dropped: the peer is over ORPHANS_PER_PEER or ORPHAN_BYTES_PER_PEER");
            return;
        }
        from.0 += 1;
        from.1 += bytes;
        self.orphans.entry(gid).or_default().push(msg);
    }

    /// No longer keeps `m` for a group not created yet.
    pub(super) fn unorphan(&mut self, m: &Message) {
        if let Some(n) = self.orphans_from.get_mut(&m.src) {
            let bytes: u64 = m.payload.iter().map(|b| b.len() as u64).sum();
            n.0 = n.0.saturating_sub(1);
            n.1 = n.1.saturating_sub(bytes);
        }
    }

    /// Messages kept for groups this rank has not created yet.
    pub fn orphaned(&self) -> usize {
        self.orphans.values().map(Vec::len).sum()
    }

    /// Point-to-point messages that arrived and wait for a receive, over all groups.
    pub fn p2p_buffered(&self) -> usize {
        self.groups.values().map(|g| g.p2p_arrived.len()).sum()
    }

    /// Calls in flight.
    pub fn pending(&self) -> usize {
        self.ops.len()
    }

    /// Starts a call. `seq` is the call's sequence number in its group (ignored for
    /// point-to-point calls), taken by the caller when the call was made. The result comes
    /// out of [`poll_event`](Self::poll_event), perhaps at once.
    pub fn submit(&mut self, group: GroupId, seq: u64, plan: Plan, now: Time) -> OpId {
        let p2p = plan.is_p2p();
        let id = self.start(group, seq, plan, now);
        if !p2p {
            // Its landings, if any, are registered: a payload of it that came early need not
            // wait for them any more (see `crate::landing`).
            if let Some(g) = self.groups.get(&group) {
                g.made.mark(seq);
            }
        }
        id
    }

    /// [`submit`](Self::submit), but for the mark of the call made.
    fn start(&mut self, group: GroupId, seq: u64, plan: Plan, now: Time) -> OpId {
        let id = OpId(self.next_op);
        self.next_op += 1;
        if self.closing.is_some() {
            self.events.push_back(Event {
                op: id,
                result: Err(Error::Shutdown),
            });
            return id;
        }
        let Some(g) = self.groups.get_mut(&group) else {
            let e = if self.destroyed.contains(&group) {
                Error::invalid(format!(
                    "group {group} was destroyed on this rank; make a new one for more calls"
                ))
            } else {
                Error::NotAMember {
                    group,
                    rank: self.rank,
                }
            };
            self.events.push_back(Event {
                op: id,
                result: Err(e),
            });
            return id;
        };
        if let Some(cause) = &g.aborted {
            let result = Err(Error::GroupAborted {
                group,
                cause: Box::new(cause.root_cause().clone()),
            });
            g.heard = true;
            self.events.push_back(Event { op: id, result });
            return id;
        }
        let someone_left = !g.left.is_empty();
        if someone_left {
            let refusal = match &plan.body {
                Body::Collective { .. } => self.left_refusal(group, Some(seq), None),
                Body::Send { dst, .. } => self.left_refusal(group, None, Some(*dst)),
                Body::Recv { .. } => None,
            };
            if let Some(e) = refusal {
                self.events.push_back(Event {
                    op: id,
                    result: Err(e),
                });
                return id;
            }
        }
        let deadline = now + plan.timeout;
        let Plan {
            fp,
            reduce,
            body,
            group_size,
            ..
        } = plan;
        let op = |seq, state| PendingCall {
            group,
            seq,
            fp,
            reduce,
            group_size,
            deadline,
            started: now,
            state,
            inquiry: None,
        };
        match body {
            Body::Send {
                dst,
                tag,
                data,
                count,
            } => self.submit_send(id, group, fp, dst, tag, data, count),
            Body::Recv { src, tag, spec } => {
                self.submit_recv(id, op(None, State::Recv { src, tag, spec }));
                if someone_left {
                    // What already arrived from a member that left was matched; nothing more
                    // will come from it.
                    self.fail_needing_left(group);
                }
            }
            Body::Collective {
                schedule,
                mut init,
                assembly,
                share,
                dest,
                into,
            } => {
                let recvs = schedule.steps.iter().map(|s| s.recvs.len()).sum::<usize>();
                let expected = (recvs > SCANNED_RECVS).then(|| {
                    let mut index = FastMap::default();
                    for step in &schedule.steps {
                        for r in &step.recvs {
                            index.insert((r.peer, r.tag), r.chunks.clone());
                        }
                    }
                    index
                });
                let size = fp.dtype.size();
                let sink = dest.map(|d| sink::Sink::new(d, &schedule, &assembly, size));
                // A non-root of a split reduce writes its reduced block into the root's output.
                let arena = match (&share, &assembly) {
                    _ if sink.is_some() => None,
                    (Share::Folds | Share::Own(_), Assembly::Whole(_))
                    | (Share::Folds, Assembly::Return(_)) => self
                        .plane
                        .arena((group, seq), schedule.layout.total().saturating_mul(size))
                        .map(|a| (a, share)),
                    _ => None,
                };
                let mut coll = CollectiveState {
                    seq,
                    sched: schedule,
                    step: 0,
                    posted: false,
                    ready: 0,
                    chunks: Vec::new(),
                    inbox: FastMap::default(),
                    expected,
                    assembly,
                    arena: None,
                    landed: None,
                    sink,
                };
                if let Some((a, Share::Own(own))) = &arena {
                    // This rank's own blocks go into the shared output now; a range it cannot
                    // claim (a stale arena) stays where it is, and the output is joined.
                    for ch in own.clone() {
                        let range = coll.output_range(ch, size);
                        let Some(Some(data)) = init.get(ch) else {
                            continue;
                        };
                        if data.len() != range.len() {
                            continue;
                        }
                        if let Some(mut part) = a.claim(range) {
                            part.bytes_mut().copy_from_slice(data);
                            init[ch] = Some(part.freeze());
                        }
                    }
                }
                coll.chunks = init;
                if arena.is_none() && coll.sink.is_none() {
                    coll.landed = self.expect_landings(group, seq, fp, &coll, into);
                }
                coll.arena = arena;
                self.submit_collective(id, op(Some(seq), State::Collective(Box::new(coll))), now);
            }
        }
        id
    }

    /// Handles a message from a peer.
    pub fn handle_message(&mut self, msg: Message, now: Time) {
        let gid = msg.header.group();
        if self.destroyed.contains(&gid) {
            return;
        }
        let Some(g) = self.groups.get_mut(&gid) else {
            self.keep_orphan(gid, msg);
            return;
        };
        if g.aborted.is_some() {
            return;
        }
        let Some(src) = g.info.local(msg.src) else {
            tracing::warn!(rank = self.rank, src = msg.src, group = %gid, "message from a non-member dropped");
            return;
        };
        match &msg.header {
            Header::Abort { reason, .. } => self.on_abort(gid, msg.src, reason),
            Header::Left { calls, .. } => self.on_left(gid, msg.src, *calls),
            Header::Failed { seq, reason, .. } => {
                let (seq, reason) = (*seq, reason.clone());
                self.on_failed(gid, src, msg.src, seq, reason);
            }
            Header::P2p {
                tag, seq, eager, ..
            } => self.on_p2p(gid, src, *tag, *seq, *eager, msg),
            Header::Credit { calls, .. } => self.on_credit(gid, src, *calls),
            Header::WantCredit { seq, .. } => self.on_want_credit(gid, src, *seq),
            Header::Inquire { seq, .. } => self.on_inquire(gid, msg.src, *seq, now),
            Header::Status {
                seq,
                made,
                latest,
                in_call_for,
                elsewhere,
                ..
            } => {
                let (seq, made, latest) =
                    (*seq, made.as_deref().copied(), latest.as_deref().copied());
                let in_call_for = in_call_for.map(Duration::from_nanos);
                let reply = failure::Reply {
                    made,
                    latest,
                    in_call_for,
                    elsewhere: *elsewhere,
                };
                self.on_status(gid, seq, msg.src, reply);
            }
            Header::Probe { path, .. } => {
                let path = (**path).clone();
                self.on_probe(gid, msg.src, path);
            }
            Header::P2pGrant { tag, upto, .. } => self.on_p2p_grant(gid, src, *tag, *upto),
            Header::P2pAsk { tag, seq, .. } => self.on_p2p_ask(gid, src, *tag, *seq),
            Header::P2pConsumed { eager, .. } => self.on_p2p_consumed(gid, src, *eager),
            Header::Data { seq, call, .. } => {
                g.lateness.arrived(*seq, src, now);
                self.on_data(gid, src, *seq, *call, msg)
            }
        }
    }

    /// Whether the engine holds messages to send, calls completed or failed, or held
    /// reductions: a driver that changed it outside a full run must run it.
    pub fn has_output(&self) -> bool {
        !self.transmits.is_empty()
            || !self.events.is_empty()
            || !self.finishing.is_empty()
            || !self.reducing.is_empty()
    }

    /// The next message to send.
    #[must_use]
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        while self.transmits.is_empty() {
            // The queue is empty: now the reductions held back for it run (they may send).
            let id = self.reducing.pop_front()?;
            self.progress(id);
        }
        self.transmits.pop_front()
    }

    /// The next completed or failed call.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<Event> {
        if self.events.is_empty() && self.finishing.is_empty() && !self.reducing.is_empty() {
            // A driver that polls events before (or instead of) messages: the held
            // reductions run now (what they send joins the queue).
            self.hold_reductions = false;
            while let Some(id) = self.reducing.pop_front() {
                self.progress(id);
            }
            self.hold_reductions = true;
        }
        if let Some(e) = self.events.pop_front() {
            return Some(e);
        }
        let f = self.finishing.pop_front()?;
        let result = build_output(
            self.plane.as_ref(),
            *f.coll,
            f.dtype,
            f.reduce,
            f.group_size,
        );
        Some(Event { op: f.op, result })
    }

    /// When [`handle_timeout`](Self::handle_timeout) should next be called.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Time> {
        let linger = match self.closing {
            Some(Some(until)) if self.held() > 0 => Some(until),
            _ => None,
        };
        self.ops.values().map(|op| op.deadline).chain(linger).min()
    }
}
