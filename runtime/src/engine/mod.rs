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

pub(crate) mod flow;
pub(crate) mod p2p_flow;

use crate::collective::{p2p_fp, Body, Finish, Output, Plan, TensorSpec};
use crate::engine::flow::{Flow, FlowOut};
use crate::engine::p2p_flow::{P2pFlow, P2pOut};
use crate::error::{CallDesc, Error, ProtocolError, Result};
use crate::group::{GroupId, GroupInfo};
use crate::ids::Fingerprint;
use crate::op::OpKind;
use crate::schedule::{Action, Schedule};
use crate::tensor::dtype::DType;
use crate::tensor::pool::Pool;
use crate::tensor::reduce::{self, ReduceOp};
use crate::tensor::{validate_storage, Tensor};
use crate::time::Time;
use crate::wire::message::{AbortReason, Header, Message, Transmit};
use bytes::Bytes;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ops::Range;

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

/// Fingerprints of completed calls kept per group, to check late messages against.
const DONE_KEPT: usize = 4096;

struct Group {
    info: GroupInfo,
    aborted: Option<Error>,
    active: HashMap<u64, OpId>,
    unexpected: HashMap<u64, Vec<Message>>,
    done: BTreeMap<u64, Fingerprint>,
    forgotten_below: u64,
    p2p_send_seq: HashMap<(usize, u32), u64>,
    p2p_recv_seq: HashMap<(usize, u32), u64>,
    /// (src, tag, seq) → (arrival number, message).
    p2p_arrived: BTreeMap<(usize, u32, u64), (u64, Message)>,
    p2p_posted: Vec<OpId>,
    /// The window of calls per peer (see [`crate::engine::flow`]).
    flow: Flow<Transmit>,
    /// Point-to-point flow control (see [`crate::engine::p2p_flow`]): a window of eager messages
    /// per peer over all tags, and grants from posted receives. A peer can so make this rank
    /// buffer at most a window of its messages, whatever tags it uses and whatever receives
    /// are posted for other ranks (issue 7: credit was counted per tag, and receives posted
    /// for one rank granted credit to all).
    p2p_flow: P2pFlow,
}

struct Coll {
    /// The call's sequence number in its group.
    seq: u64,
    sched: Schedule,
    step: usize,
    posted: bool,
    chunks: Vec<Option<Bytes>>,
    /// Arrived payloads by (group-local source, tag).
    inbox: HashMap<(usize, u32), Vec<Bytes>>,
    /// Chunks each expected (source, tag) carries.
    expected: HashMap<(usize, u32), Range<usize>>,
    finish: Finish,
}

enum State {
    Coll(Box<Coll>),
    Recv {
        src: Option<usize>,
        tag: u32,
        spec: TensorSpec,
    },
}

struct Op {
    group: GroupId,
    /// The call's sequence number in its group (`None` for point-to-point calls).
    seq: Option<u64>,
    fp: Fingerprint,
    reduce: Option<ReduceOp>,
    group_size: usize,
    deadline: Time,
    state: State,
}

/// The protocol engine of one rank.
pub struct Engine {
    rank: usize,
    groups: HashMap<GroupId, Group>,
    /// Messages for groups this rank has not registered yet.
    orphans: HashMap<GroupId, Vec<Message>>,
    /// Messages in `orphans`, per sending rank (bounded by [`ORPHANS_PER_PEER`]).
    orphans_from: HashMap<usize, usize>,
    ops: BTreeMap<OpId, Op>,
    next_op: u64,
    arrivals: u64,
    transmits: VecDeque<Transmit>,
    events: VecDeque<Event>,
    /// Buffers for reduction results, recycled when their last share is dropped.
    pool: Pool,
    /// Set by [`Engine::shutdown`]: until when held messages may still be sent (`None` once
    /// that time has passed and the peers were told).
    closing: Option<Option<Time>>,
}

/// Free reduction buffers an engine keeps for reuse.
const POOL_BYTES: usize = 64 << 20;

impl Engine {
    /// An engine for global rank `rank`.
    pub fn new(rank: usize) -> Engine {
        Engine {
            rank,
            groups: HashMap::new(),
            orphans: HashMap::new(),
            orphans_from: HashMap::new(),
            ops: BTreeMap::new(),
            next_op: 0,
            arrivals: 0,
            transmits: VecDeque::new(),
            events: VecDeque::new(),
            pool: Pool::new(POOL_BYTES),
            closing: None,
        }
    }

    /// This engine's global rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Registers a group this rank belongs to; messages that arrived for it early are handled
    /// now.
    pub fn add_group(&mut self, info: GroupInfo, now: Time) {
        let id = info.id;
        let window = info.options.window;
        self.groups.entry(id).or_insert_with(|| Group {
            info,
            aborted: None,
            active: HashMap::new(),
            unexpected: HashMap::new(),
            done: BTreeMap::new(),
            forgotten_below: 0,
            p2p_send_seq: HashMap::new(),
            p2p_recv_seq: HashMap::new(),
            p2p_arrived: BTreeMap::new(),
            p2p_posted: Vec::new(),
            flow: Flow::new(window),
            p2p_flow: P2pFlow::new(window),
        });
        for m in self.orphans.remove(&id).unwrap_or_default() {
            if let Some(n) = self.orphans_from.get_mut(&m.src) {
                *n = n.saturating_sub(1);
            }
            self.handle_message(m, now);
        }
    }

    /// The group, if registered.
    pub fn group(&self, id: GroupId) -> Option<&GroupInfo> {
        self.groups.get(&id).map(|g| &g.info)
    }

    /// Why the group was aborted, if it was.
    pub fn aborted(&self, id: GroupId) -> Option<&Error> {
        self.groups.get(&id).and_then(|g| g.aborted.as_ref())
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
            self.events.push_back(Event {
                op: id,
                result: Err(Error::NotAMember {
                    group,
                    rank: self.rank,
                }),
            });
            return id;
        };
        if let Some(cause) = &g.aborted {
            let result = Err(Error::GroupAborted {
                group,
                cause: Box::new(cause.root_cause().clone()),
            });
            self.events.push_back(Event { op: id, result });
            return id;
        }
        let deadline = now + plan.timeout;
        let Plan {
            fp,
            reduce,
            body,
            group_size,
            ..
        } = plan;
        match body {
            Body::Send {
                dst,
                tag,
                data,
                count,
            } => {
                let s = g.p2p_send_seq.entry((dst, tag)).or_insert(0);
                let header = Header::P2p {
                    group,
                    tag,
                    seq: *s,
                    dtype: fp.dtype,
                    count,
                    eager: false,
                };
                let q = *s;
                *s += 1;
                let t = Transmit {
                    dst: g.info.global(dst),
                    msg: Message {
                        src: self.rank,
                        header,
                        payload: vec![data],
                    },
                };
                let out = g.p2p_flow.send(dst, tag, q, t).into_iter().collect();
                self.emit_p2p(group, out);
                self.events.push_back(Event {
                    op: id,
                    result: Ok(Output::None),
                });
            }
            Body::Recv { src, tag, spec } => {
                // Credit goes to a peer when a receive consumes its message (`match_p2p`).
                g.p2p_posted.push(id);
                let state = State::Recv { src, tag, spec };
                self.ops.insert(
                    id,
                    Op {
                        group,
                        seq: None,
                        fp,
                        reduce,
                        group_size,
                        deadline,
                        state,
                    },
                );
                self.match_p2p(group);
            }
            Body::Collective {
                schedule,
                init,
                finish,
            } => {
                if g.active.contains_key(&seq)
                    || g.done.contains_key(&seq)
                    || seq < g.forgotten_below
                {
                    let e = Error::invalid(format!(
                        "sequence number {seq} of group {group} was already used"
                    ));
                    self.events.push_back(Event {
                        op: id,
                        result: Err(e),
                    });
                    return id;
                }
                g.active.insert(seq, id);
                let mut out = Vec::new();
                g.flow.on_made(seq, &mut out);
                let early = g.unexpected.remove(&seq).unwrap_or_default();
                let mut expected = HashMap::new();
                for step in &schedule.steps {
                    for r in &step.recvs {
                        expected.insert((r.peer, r.tag), r.chunks.clone());
                    }
                }
                let coll = Coll {
                    seq,
                    sched: schedule,
                    step: 0,
                    posted: false,
                    chunks: init,
                    inbox: HashMap::new(),
                    expected,
                    finish,
                };
                let state = State::Coll(Box::new(coll));
                self.ops.insert(
                    id,
                    Op {
                        group,
                        seq: Some(seq),
                        fp,
                        reduce,
                        group_size,
                        deadline,
                        state,
                    },
                );
                self.emit(group, out);
                for m in early {
                    if self.ops.contains_key(&id) {
                        self.deliver(id, m);
                    } else {
                        // The call already finished (or failed): what is left is checked like
                        // any late message (a duplicate is a protocol error, never dropped).
                        self.handle_message(m, now);
                    }
                }
                if self.ops.contains_key(&id) {
                    self.progress(id);
                }
            }
        }
        id
    }

    /// Handles a message from a peer.
    pub fn handle_message(&mut self, msg: Message, _now: Time) {
        let gid = msg.header.group();
        let Some(g) = self.groups.get_mut(&gid) else {
            let from = self.orphans_from.entry(msg.src).or_insert(0);
            if *from >= ORPHANS_PER_PEER {
                tracing::warn!(rank = self.rank, src = msg.src, group = %gid, "message for a group not created yet dropped: the peer is over ORPHANS_PER_PEER");
                return;
            }
            *from += 1;
            self.orphans.entry(gid).or_default().push(msg);
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
            Header::Abort { reason, .. } => {
                let cause = reason.clone().into_error(gid);
                // A lost peer heard of from another member before this rank noticed: the
                // calls that talk to it fail with `PeerLost`, as if this rank had noticed.
                if let Error::PeerLost { rank } = cause.root_cause() {
                    self.fail_talking_to(gid, *rank);
                }
                self.abort(gid, cause, None, false);
            }
            Header::P2p {
                tag, seq, eager, ..
            } => {
                if !g.p2p_flow.admit(src, *tag, *seq, *eager) {
                    let err = Error::Protocol {
                        rank: msg.src,
                        detail: ProtocolError::Window { seq: *seq },
                    };
                    self.abort(gid, err, None, true);
                    return;
                }
                let key = (src, *tag, *seq);
                let n = self.arrivals;
                self.arrivals += 1;
                g.p2p_arrived.insert(key, (n, msg));
                self.match_p2p(gid);
            }
            Header::Credit { calls, .. } => {
                let mut out = Vec::new();
                g.flow.on_credit(src, *calls, &mut out);
                self.emit(gid, out);
            }
            Header::WantCredit { seq, .. } => {
                let mut out = Vec::new();
                g.flow.on_want(src, *seq, &mut out);
                self.emit(gid, out);
            }
            Header::P2pGrant { tag, upto, .. } => {
                let mut out = Vec::new();
                g.p2p_flow.on_grant(src, *tag, *upto, &mut out);
                self.emit_p2p(gid, out);
            }
            Header::P2pConsumed { eager, .. } => {
                let mut out = Vec::new();
                g.p2p_flow.on_consumed(src, *eager, &mut out);
                self.emit_p2p(gid, out);
            }
            Header::Data { seq, call, .. } => {
                let seq = *seq;
                if !g.flow.admits(seq) {
                    // A conforming peer never sends beyond the window it was granted.
                    let err = Error::Protocol {
                        rank: msg.src,
                        detail: ProtocolError::Window { seq },
                    };
                    self.abort(gid, err, None, true);
                    return;
                }
                // A message of call `seq` shows that the peer has made that call: an implicit
                // credit, which releases what this rank holds for it without a round trip.
                let mut out = Vec::new();
                g.flow.on_credit(src, seq.saturating_add(1), &mut out);
                if !out.is_empty() {
                    self.emit(gid, out);
                }
                let Some(g) = self.groups.get_mut(&gid) else {
                    return;
                };
                if let Some(&id) = g.active.get(&seq) {
                    self.deliver(id, msg);
                } else if let Some(ours) = g.done.get(&seq).copied() {
                    let err = if ours == *call {
                        Error::Protocol {
                            rank: msg.src,
                            detail: ProtocolError::Stale { seq },
                        }
                    } else {
                        self.mismatch(gid, Some(seq), ours, msg.src, *call)
                    };
                    self.abort(gid, err, None, true);
                } else if seq < g.forgotten_below {
                    tracing::warn!(rank = self.rank, seq, group = %gid, "message for a forgotten call dropped");
                } else {
                    g.unexpected.entry(seq).or_default().push(msg);
                }
            }
        }
    }

    /// Starts shutting this rank down at `now`: calls still pending fail with
    /// [`Error::Shutdown`], and so do later ones. Messages that flow control still holds for
    /// peers (of calls that completed here early, such as a broadcast root's) go on being
    /// sent as those peers grant credit, for at most `linger`; then each peer they were for
    /// is sent an abort of the group with [`Error::PeerShutdown`], so that its calls fail at
    /// once instead of at their timeout. [`is_drained`](Self::is_drained) tells when nothing
    /// is left to send; the driver keeps feeding messages and timeouts until then.
    pub fn shutdown(&mut self, now: Time, linger: std::time::Duration) {
        if self.closing.is_some() {
            return;
        }
        self.closing = Some(Some(now + linger));
        let ids: Vec<OpId> = self.ops.keys().copied().collect();
        for id in ids {
            if let Some(op) = self.ops.remove(&id) {
                self.forget(&op, id);
                self.events.push_back(Event {
                    op: id,
                    result: Err(Error::Shutdown),
                });
            }
        }
        self.handle_timeout(now);
    }

    /// Whether a rank that is shutting down has nothing left to send: every held message
    /// went out, or its peers were told they never will.
    pub fn is_drained(&self) -> bool {
        self.closing.is_some() && self.held() == 0
    }

    /// The linger time of a shutdown is over: tell each peer that this rank still holds
    /// messages for, and drop them.
    fn give_up_held(&mut self) {
        let mut told = Vec::new();
        for (&gid, g) in &mut self.groups {
            let mut peers: BTreeMap<usize, usize> = BTreeMap::new();
            for (p, n) in g.flow.holding_for().chain(g.p2p_flow.holding_for()) {
                *peers.entry(g.info.global(p)).or_insert(0) += n;
            }
            g.flow.clear();
            g.p2p_flow.clear();
            for (dst, undelivered) in peers {
                told.push((gid, dst, undelivered));
            }
        }
        for (group, dst, undelivered) in told {
            tracing::warn!(rank = self.rank, peer = dst, group = %group, undelivered, "shut down with messages held for a peer; telling it");
            let cause = Error::PeerShutdown {
                rank: self.rank,
                undelivered,
            };
            self.transmits.push_back(Transmit {
                dst,
                msg: Message {
                    src: self.rank,
                    header: Header::Abort {
                        group,
                        reason: AbortReason::from(&cause),
                    },
                    payload: Vec::new(),
                },
            });
        }
    }

    /// Handles the passage of time: calls past their deadline fail with
    /// [`Error::Timeout`] and abort their group; a shutdown's linger time ends.
    pub fn handle_timeout(&mut self, now: Time) {
        if let Some(Some(until)) = self.closing {
            if now >= until || self.held() == 0 {
                self.closing = Some(None);
                self.give_up_held();
            }
        }
        let due: Vec<OpId> = self
            .ops
            .iter()
            .filter(|(_, op)| op.deadline <= now)
            .map(|(&id, _)| id)
            .collect();
        for id in due {
            let Some(op) = self.ops.get(&id) else {
                continue;
            };
            let Some(g) = self.groups.get(&op.group) else {
                continue;
            };
            let waiting_for: Vec<usize> = match &op.state {
                State::Coll(c) => match c.sched.steps.get(c.step) {
                    Some(step) => {
                        let mut w: Vec<usize> = step
                            .recvs
                            .iter()
                            .filter(|r| !c.inbox.contains_key(&(r.peer, r.tag)))
                            .map(|r| g.info.global(r.peer))
                            .collect();
                        w.sort_unstable();
                        w.dedup();
                        w
                    }
                    None => Vec::new(),
                },
                State::Recv { src: Some(s), .. } => vec![g.info.global(*s)],
                State::Recv { src: None, .. } => g
                    .info
                    .members
                    .iter()
                    .copied()
                    .filter(|&m| m != self.rank)
                    .collect(),
            };
            let err = Error::Timeout {
                group: op.group,
                seq: op.seq,
                op: op.fp.kind,
                rank: self.rank,
                waiting_for,
            };
            let gid = op.group;
            self.abort(gid, err.clone(), Some((id, err)), true);
        }
    }

    /// Handles the loss of a peer (its link closed, or a simulator isolated it): every group
    /// it belongs to is aborted. Calls that exchange messages with it later in their schedule
    /// fail with [`Error::PeerLost`]; the others with [`Error::GroupAborted`].
    pub fn handle_peer_lost(&mut self, peer: usize, _now: Time) {
        let gids: Vec<GroupId> = self
            .groups
            .iter()
            .filter(|(_, g)| g.aborted.is_none() && g.info.local(peer).is_some())
            .map(|(&id, _)| id)
            .collect();
        for gid in gids {
            self.fail_talking_to(gid, peer);
            self.abort(gid, Error::PeerLost { rank: peer }, None, true);
        }
    }

    /// Fails with [`Error::PeerLost`] the calls of group `gid` whose remaining schedule
    /// exchanges messages with global rank `peer`.
    fn fail_talking_to(&mut self, gid: GroupId, peer: usize) {
        let Some(local) = self.groups.get(&gid).and_then(|g| g.info.local(peer)) else {
            return;
        };
        let direct: Vec<OpId> = self
            .ops
            .iter()
            .filter(|(_, op)| op.group == gid && op.talks_to(local))
            .map(|(&id, _)| id)
            .collect();
        for id in direct {
            if let Some(op) = self.ops.remove(&id) {
                self.forget(&op, id);
                self.events.push_back(Event {
                    op: id,
                    result: Err(Error::PeerLost { rank: peer }),
                });
            }
        }
    }

    /// The next message to send.
    #[must_use]
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.transmits.pop_front()
    }

    /// The next completed or failed call.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
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

    fn mismatch(
        &self,
        gid: GroupId,
        seq: Option<u64>,
        ours: Fingerprint,
        peer: usize,
        theirs: Fingerprint,
    ) -> Error {
        Error::Mismatch {
            group: gid,
            seq,
            ours: CallDesc {
                rank: self.rank,
                call: ours,
            },
            theirs: CallDesc {
                rank: peer,
                call: theirs,
            },
        }
    }

    /// Routes a collective message to call `id`, checking it first.
    fn deliver(&mut self, id: OpId, msg: Message) {
        let Some((gid, fp)) = self.ops.get(&id).map(|op| (op.group, op.fp)) else {
            return;
        };
        let Header::Data { tag, call, seq, .. } = msg.header else {
            return;
        };
        if call != fp {
            let err = self.mismatch(gid, Some(seq), fp, msg.src, call);
            self.abort(gid, err.clone(), Some((id, err)), true);
            return;
        }
        let Some(src) = self.groups.get(&gid).and_then(|g| g.info.local(msg.src)) else {
            return;
        };
        let dtype = fp.dtype;
        let Some(State::Coll(c)) = self.ops.get_mut(&id).map(|op| &mut op.state) else {
            return;
        };
        let checked = match c.expected.get(&(src, tag)) {
            None => Err(ProtocolError::UnexpectedTag { seq, tag }),
            Some(_) if c.inbox.contains_key(&(src, tag)) => {
                Err(ProtocolError::Duplicate { seq, tag })
            }
            Some(chunks) => check_payload(
                msg.payload,
                &c.sched.layout.chunk_elems[chunks.clone()],
                dtype,
            ),
        };
        match checked {
            Ok(parts) => {
                c.inbox.insert((src, tag), parts);
                self.progress(id);
            }
            Err(detail) => {
                let err = Error::Protocol {
                    rank: msg.src,
                    detail,
                };
                self.abort(gid, err.clone(), Some((id, err)), true);
            }
        }
    }

    /// Runs call `id` as far as the arrived messages allow.
    fn progress(&mut self, id: OpId) {
        loop {
            let Some(op) = self.ops.get_mut(&id) else {
                return;
            };
            let State::Coll(c) = &mut op.state else {
                return;
            };
            let Some(step) = c.sched.steps.get(c.step) else {
                self.finish(id);
                return;
            };
            let Some(g) = self.groups.get_mut(&op.group) else {
                return;
            };
            if !c.posted {
                let mut out = Vec::new();
                for s in &step.sends {
                    let mut payload = Vec::with_capacity(s.chunks.len());
                    for ch in s.chunks.clone() {
                        match &c.chunks[ch] {
                            Some(b) => payload.push(b.clone()),
                            None => {
                                // A schedule bug, not a peer's fault: fail loudly, never hang.
                                let e = Error::invalid(format!(
                                    "internal: schedule sends chunk {ch} before it is filled"
                                ));
                                let gid = op.group;
                                self.abort(gid, e.clone(), Some((id, e)), true);
                                return;
                            }
                        }
                    }
                    let header = Header::Data {
                        group: op.group,
                        seq: c.seq,
                        tag: s.tag,
                        call: op.fp,
                    };
                    let dst = g.info.global(s.peer);
                    let t = Transmit {
                        dst,
                        msg: Message {
                            src: self.rank,
                            header,
                            payload,
                        },
                    };
                    g.flow.send(s.peer, c.seq, t, &mut out);
                }
                c.posted = true;
                let gid = op.group;
                self.emit(gid, out);
                continue;
            }
            if !step
                .recvs
                .iter()
                .all(|r| c.inbox.contains_key(&(r.peer, r.tag)))
            {
                return;
            }
            let (dtype, rop) = (op.fp.dtype, op.reduce.unwrap_or(ReduceOp::Sum));
            for r in &step.recvs {
                let parts = c.inbox.remove(&(r.peer, r.tag)).unwrap_or_default();
                for (ch, part) in r.chunks.clone().zip(parts) {
                    let new = match (r.action, &c.chunks[ch]) {
                        (Action::Copy, _) => Ok(part),
                        (Action::Reduce { remote_first }, Some(local)) => {
                            let (a, b) = if remote_first {
                                (&part, local)
                            } else {
                                (local, &part)
                            };
                            reduce::combine(dtype, rop, a, b, &self.pool)
                        }
                        (Action::Reduce { .. }, None) => {
                            Err(Error::invalid("internal: reduce into an empty chunk"))
                        }
                    };
                    match new {
                        Ok(b) => c.chunks[ch] = Some(b),
                        Err(e) => {
                            let gid = op.group;
                            self.abort(gid, e.clone(), Some((id, e)), true);
                            return;
                        }
                    }
                }
            }
            c.step += 1;
            c.posted = false;
        }
    }

    fn finish(&mut self, id: OpId) {
        let Some(op) = self.ops.remove(&id) else {
            return;
        };
        self.forget(&op, id);
        if let (Some(g), Some(seq)) = (self.groups.get_mut(&op.group), op.seq) {
            g.done.insert(seq, op.fp);
            while g.done.len() > DONE_KEPT {
                if let Some((s, _)) = g.done.pop_first() {
                    g.forgotten_below = g.forgotten_below.max(s + 1);
                }
            }
        }
        let result = match op.state {
            State::Coll(c) => build_output(*c, op.fp.dtype, op.reduce, op.group_size),
            State::Recv { .. } => Err(Error::invalid("internal: receive finished as a collective")),
        };
        self.events.push_back(Event { op: id, result });
    }

    /// Removes a call's traces from its group's indexes.
    fn forget(&mut self, op: &Op, id: OpId) {
        if let Some(g) = self.groups.get_mut(&op.group) {
            if let Some(seq) = op.seq {
                if g.active.get(&seq) == Some(&id) {
                    g.active.remove(&seq);
                }
            }
            g.p2p_posted.retain(|&p| p != id);
        }
    }

    /// Aborts group `gid` because of `cause`: every pending call on it fails (`failing`
    /// with its own error, the others with [`Error::GroupAborted`]), and, when the failure
    /// was seen here, every other member is told.
    fn abort(&mut self, gid: GroupId, cause: Error, failing: Option<(OpId, Error)>, tell: bool) {
        let Some(g) = self.groups.get_mut(&gid) else {
            return;
        };
        if g.aborted.is_some() {
            if let Some((id, e)) = failing {
                if let Some(op) = self.ops.remove(&id) {
                    self.forget(&op, id);
                    self.events.push_back(Event {
                        op: id,
                        result: Err(e),
                    });
                }
            }
            return;
        }
        let root = cause.root_cause().clone();
        tracing::debug!(rank = self.rank, group = %gid, cause = %root, "group aborted");
        g.aborted = Some(root.clone());
        g.unexpected.clear();
        g.p2p_arrived.clear();
        g.flow.clear();
        g.p2p_flow.clear();
        if tell {
            for &m in &g.info.members {
                if m != self.rank {
                    let header = Header::Abort {
                        group: gid,
                        reason: AbortReason::from(&root),
                    };
                    self.transmits.push_back(Transmit {
                        dst: m,
                        msg: Message {
                            src: self.rank,
                            header,
                            payload: Vec::new(),
                        },
                    });
                }
            }
        }
        let ids: Vec<OpId> = self
            .ops
            .iter()
            .filter(|(_, op)| op.group == gid)
            .map(|(&id, _)| id)
            .collect();
        for id in ids {
            if let Some(op) = self.ops.remove(&id) {
                self.forget(&op, id);
                let result = match &failing {
                    Some((fid, e)) if *fid == id => Err(e.clone()),
                    _ => Err(Error::GroupAborted {
                        group: gid,
                        cause: Box::new(root.clone()),
                    }),
                };
                self.events.push_back(Event { op: id, result });
            }
        }
    }

    /// Sends what the flow control of group `gid` released or asks for.
    fn emit(&mut self, gid: GroupId, out: Vec<FlowOut<Transmit>>) {
        let Some(g) = self.groups.get(&gid) else {
            return;
        };
        for o in out {
            let (dst, header) = match o {
                FlowOut::Send(t) => {
                    self.transmits.push_back(t);
                    continue;
                }
                FlowOut::Ask { peer, seq } => {
                    (g.info.global(peer), Header::WantCredit { group: gid, seq })
                }
                FlowOut::Credit { peer, calls } => {
                    (g.info.global(peer), Header::Credit { group: gid, calls })
                }
            };
            let msg = Message {
                src: self.rank,
                header,
                payload: Vec::new(),
            };
            self.transmits.push_back(Transmit { dst, msg });
        }
    }

    /// Sends what the point-to-point flow control of group `gid` released or tells.
    fn emit_p2p(&mut self, gid: GroupId, out: Vec<P2pOut>) {
        let Some(g) = self.groups.get(&gid) else {
            return;
        };
        for o in out {
            let (dst, header) = match o {
                P2pOut::Send(t) => {
                    self.transmits.push_back(t);
                    continue;
                }
                P2pOut::Grant { peer, tag, upto } => (
                    g.info.global(peer),
                    Header::P2pGrant {
                        group: gid,
                        tag,
                        upto,
                    },
                ),
                P2pOut::Consumed { peer, eager } => (
                    g.info.global(peer),
                    Header::P2pConsumed { group: gid, eager },
                ),
            };
            let msg = Message {
                src: self.rank,
                header,
                payload: Vec::new(),
            };
            self.transmits.push_back(Transmit { dst, msg });
        }
    }

    /// Solicits the messages that the receives posted in group `gid` wait for: per (peer,
    /// tag), the lane's consumed messages plus the receives that could match it (see
    /// [`crate::engine::p2p_flow`]).
    fn solicit(&mut self, gid: GroupId) {
        let Some(g) = self.groups.get_mut(&gid) else {
            return;
        };
        let mut named: HashMap<(usize, u32), u64> = HashMap::new();
        let mut any: HashMap<u32, u64> = HashMap::new();
        for rid in &g.p2p_posted {
            if let Some(Op {
                state: State::Recv { src, tag, .. },
                ..
            }) = self.ops.get(rid)
            {
                match src {
                    Some(s) => *named.entry((*s, *tag)).or_insert(0) += 1,
                    None => *any.entry(*tag).or_insert(0) += 1,
                }
            }
        }
        let me = g.info.rank;
        let mut lanes: HashMap<(usize, u32), u64> = named;
        for (&tag, &n) in &any {
            for peer in (0..g.info.size()).filter(|&p| p != me) {
                *lanes.entry((peer, tag)).or_insert(0) += n;
            }
        }
        let mut out = Vec::new();
        for ((peer, tag), waiting) in lanes {
            let consumed = g.p2p_recv_seq.get(&(peer, tag)).copied().unwrap_or(0);
            g.p2p_flow
                .solicit(peer, tag, consumed.saturating_add(waiting), &mut out);
        }
        self.emit_p2p(gid, out);
    }

    /// Matches posted point-to-point receives of group `gid` with arrived messages, in FIFO
    /// order per (source, tag); a receive from any source takes the earliest arrival.
    fn match_p2p(&mut self, gid: GroupId) {
        loop {
            let Some(g) = self.groups.get(&gid) else {
                return;
            };
            let mut found = None;
            for &rid in &g.p2p_posted {
                let Some(Op {
                    state: State::Recv { src, tag, .. },
                    ..
                }) = self.ops.get(&rid)
                else {
                    continue;
                };
                let best = g
                    .p2p_arrived
                    .iter()
                    .filter(|((s, t, q), _)| {
                        *t == *tag
                            && src.is_none_or(|want| want == *s)
                            && *q == g.p2p_recv_seq.get(&(*s, *t)).copied().unwrap_or(0)
                    })
                    .min_by_key(|(_, (n, _))| *n)
                    .map(|(k, _)| *k);
                if let Some(k) = best {
                    found = Some((rid, k));
                    break;
                }
            }
            let Some((rid, key)) = found else {
                // What is still posted waits for messages not here yet: ask for them.
                self.solicit(gid);
                return;
            };
            let Some(g) = self.groups.get_mut(&gid) else {
                return;
            };
            let Some((_, msg)) = g.p2p_arrived.remove(&key) else {
                return;
            };
            let consumed = g.p2p_recv_seq.entry((key.0, key.1)).or_insert(0);
            *consumed += 1;
            let eager = matches!(msg.header, Header::P2p { eager: true, .. });
            let mut out = Vec::new();
            g.p2p_flow.on_consume(key.0, eager, &mut out);
            self.emit_p2p(gid, out);
            let Some(g) = self.groups.get_mut(&gid) else {
                return;
            };
            g.p2p_posted.retain(|&p| p != rid);
            let Some(op) = self.ops.remove(&rid) else {
                return;
            };
            let State::Recv { spec, .. } = &op.state else {
                return;
            };
            let spec = spec.clone();
            let Header::P2p { dtype, count, .. } = msg.header else {
                return;
            };
            let theirs = p2p_fp(OpKind::Send, dtype, count);
            if dtype != spec.dtype || Some(count) != spec.numel().ok().map(|n| n as u64) {
                let err = self.mismatch(gid, None, op.fp, msg.src, theirs);
                self.ops.insert(rid, op);
                self.abort(gid, err.clone(), Some((rid, err)), true);
                return;
            }
            let result = match msg
                .payload
                .into_iter()
                .next()
                .map(|b| validate_storage(b, dtype))
            {
                Some(Ok(b)) if b.len() as u64 == count * dtype.size() as u64 => {
                    Ok(Output::Received {
                        tensor: Tensor::from_parts(b, dtype, spec.shape),
                        src: key.0,
                    })
                }
                _ => Err(Error::Protocol {
                    rank: msg.src,
                    detail: ProtocolError::InvalidElements { dtype },
                }),
            };
            self.events.push_back(Event { op: rid, result });
        }
    }
}

impl Op {
    /// Whether the rest of this call's schedule exchanges messages with group rank `peer`.
    fn talks_to(&self, peer: usize) -> bool {
        match &self.state {
            State::Coll(c) => c.sched.steps[c.step.min(c.sched.steps.len())..]
                .iter()
                .any(|s| {
                    s.sends.iter().any(|x| x.peer == peer) || s.recvs.iter().any(|x| x.peer == peer)
                }),
            State::Recv { src, .. } => src.is_none_or(|s| s == peer),
        }
    }
}

/// Checks a payload against the chunk sizes the receiver expects; aligns and validates it.
fn check_payload(
    parts: Vec<Bytes>,
    elems: &[usize],
    dtype: DType,
) -> std::result::Result<Vec<Bytes>, ProtocolError> {
    if parts.len() != elems.len() {
        return Err(ProtocolError::Parts {
            expected: elems.len(),
            got: parts.len(),
        });
    }
    parts
        .into_iter()
        .zip(elems)
        .enumerate()
        .map(|(i, (p, &n))| {
            let want = (n as u64).saturating_mul(dtype.size() as u64);
            if p.len() as u64 != want {
                return Err(ProtocolError::Length {
                    part: i,
                    expected: want,
                    got: p.len() as u64,
                });
            }
            validate_storage(p, dtype).map_err(|()| ProtocolError::InvalidElements { dtype })
        })
        .collect()
}

/// Joins chunks into one aligned buffer (no copy when only one chunk holds data).
fn concat(chunks: &[Option<Bytes>], dtype: DType) -> Result<Bytes> {
    let missing = || Error::invalid("internal: result chunk never filled");
    let mut nonempty = chunks
        .iter()
        .filter(|c| c.as_ref().is_none_or(|b| !b.is_empty()));
    match (nonempty.next(), nonempty.next()) {
        (None, _) => return Ok(Bytes::new()),
        (Some(one), None) => return one.clone().ok_or_else(missing),
        _ => {}
    }
    let total: usize = chunks
        .iter()
        .map(|c| c.as_ref().map_or(0, Bytes::len))
        .sum();
    crate::with_storage_type!(dtype, T => {
        let mut v: Vec<T> = Vec::with_capacity(total / dtype.size());
        for c in chunks {
            v.extend_from_slice(reduce::view::<T>(c.as_ref().ok_or_else(missing)?)?);
        }
        Ok(crate::tensor::bytes_from_vec(v))
    })
}

fn build_output(c: Coll, dtype: DType, op: Option<ReduceOp>, group_size: usize) -> Result<Output> {
    let post = |b: Bytes| -> Result<Bytes> {
        match op {
            Some(op) => Ok(reduce::post(dtype, op, &b, group_size)?.unwrap_or(b)),
            None => Ok(b),
        }
    };
    let layout = &c.sched.layout;
    let tensor = |b: Bytes, shape: Vec<usize>| Tensor::from_parts(b, dtype, shape);
    Ok(match c.finish {
        Finish::Nothing => Output::None,
        Finish::Return(t) => Output::Tensor(t),
        Finish::Whole(shape) => Output::Tensor(tensor(post(concat(&c.chunks, dtype)?)?, shape)),
        Finish::Concat(blocks, shape) => {
            let b = concat(&c.chunks[layout.chunks_of(blocks)], dtype)?;
            Output::Tensor(tensor(post(b)?, shape))
        }
        Finish::Blocks(blocks, shapes) => {
            let mut out = Vec::with_capacity(shapes.len());
            for (b, shape) in blocks.zip(shapes) {
                out.push(tensor(
                    concat(&c.chunks[layout.chunks_of(b..b + 1)], dtype)?,
                    shape,
                ));
            }
            Output::Tensors(out)
        }
    })
}
