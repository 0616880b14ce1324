//! Failures: timeouts, lost peers, mismatches, aborts, and a rank's own shutdown. Every path
//! ends each affected call with an error on this rank and, where the failure was seen here,
//! tells the group's other members (an abort), so no rank waits for its timeout in vain.

use super::{Engine, Event, OpId, PendingCall, State};
use crate::error::{CallDesc, Error, RankCall};
use crate::ids::{Fingerprint, GroupId};
use crate::time::Time;
use crate::wire::message::{AbortReason, Header, Message, Transmit};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// A desync inquiry in progress: the answers so far, by global rank, and how long this rank
/// had been in the call when it asked.
pub(super) struct Inquiry {
    replies: BTreeMap<usize, RankCall>,
    waited: Duration,
    /// Whether this rank sent wait-cycle probes for the call (`cycle.rs`).
    probing: bool,
    /// Whether a member that has not made the call has calls in flight elsewhere: with
    /// probes out, the report waits for its grace to end (a probe may come back).
    elsewhere: bool,
}

/// A member's answer to a desync inquiry ([`Header::Status`]).
pub(super) struct Reply {
    /// Its fingerprint of the call asked about, if it made it.
    pub(super) made: Option<Fingerprint>,
    /// Its latest call on the group.
    pub(super) latest: Option<(u64, Fingerprint)>,
    /// How long it had been in the call, if it is in it.
    pub(super) in_call_for: Option<Duration>,
    /// Whether it has other collective calls in flight.
    pub(super) elsewhere: bool,
}

impl Engine {
    /// Starts shutting this rank down at `now`: calls still pending fail with
    /// [`Error::Shutdown`], and so do later ones; every other member of a group that had a
    /// call in flight is told at once (an abort with [`Error::PeerShutdown`]), since its part
    /// of that call can never complete. Messages that flow control still holds for peers in
    /// other groups (of calls that completed here early, such as a broadcast root's) go on
    /// being sent as those peers grant credit, for at most `linger`; then every member of a
    /// group with messages still held is told, each with how many were for it, so that their
    /// calls fail at once instead of at their timeout. [`is_drained`](Self::is_drained) tells
    /// when nothing is left to send; the driver keeps feeding messages and timeouts until
    /// then, and sends what [`poll_transmit`](Self::poll_transmit) gives before it stops.
    pub fn shutdown(&mut self, now: Time, linger: std::time::Duration) {
        if self.closing.is_some() {
            return;
        }
        self.closing = Some(Some(now + linger));
        self.board_changed();
        let cut: BTreeSet<GroupId> = self.ops.values().map(|op| op.group).collect();
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
        for gid in cut {
            self.tell_shutdown(gid);
        }
        // The groups with nothing in flight here: their members hear that this rank left, so
        // that a call of theirs that needs it fails at once, and a link closing after this
        // is no surprise to them.
        let idle: Vec<GroupId> = self
            .groups
            .iter()
            .filter(|(_, g)| g.aborted.is_none() && g.flow.held() + g.p2p_flow.held() == 0)
            .map(|(&gid, _)| gid)
            .collect();
        for gid in idle {
            self.tell_left(gid);
        }
        self.handle_timeout(now);
    }

    /// Whether a rank that is shutting down has nothing left to send: every held message
    /// went out, or its peers were told they never will, and the engine's own output queue
    /// is empty.
    pub fn is_drained(&self) -> bool {
        self.closing.is_some() && self.held() == 0 && self.transmits.is_empty()
    }

    /// The linger time of a shutdown is over: tell every member of each group with messages
    /// still held, and drop them.
    pub(super) fn give_up_held(&mut self) {
        let holding: Vec<GroupId> = self
            .groups
            .iter()
            .filter(|(_, g)| g.flow.held() + g.p2p_flow.held() > 0)
            .map(|(&gid, _)| gid)
            .collect();
        for gid in holding {
            self.tell_shutdown(gid);
        }
        let rest: Vec<GroupId> = self
            .groups
            .iter()
            .filter(|(_, g)| g.aborted.is_none())
            .map(|(&gid, _)| gid)
            .collect();
        for gid in rest {
            self.tell_left(gid);
        }
    }

    /// This rank leaves group `gid` for good: drop what flow control holds for it and send
    /// every other member an abort with [`Error::PeerShutdown`] (with the number of messages
    /// that were held for that member).
    pub(super) fn tell_shutdown(&mut self, gid: GroupId) {
        let Some(g) = self.groups.get_mut(&gid) else {
            return;
        };
        if g.aborted.is_some() {
            return;
        }
        let mut held: BTreeMap<usize, usize> = BTreeMap::new();
        for (p, n) in g.flow.holding_for().chain(g.p2p_flow.holding_for()) {
            *held.entry(g.info.global(p)).or_insert(0) += n;
        }
        g.flow.clear();
        g.p2p_flow.clear();
        g.aborted = Some(Error::Shutdown);
        super::bump(&self.board_epoch);
        let me = self.rank;
        let members: Vec<usize> = g
            .info
            .members
            .iter()
            .copied()
            .filter(|&m| m != me)
            .collect();
        for dst in members {
            let undelivered = held.get(&dst).copied().unwrap_or(0);
            if undelivered > 0 {
                tracing::warn!(rank = me, peer = dst, group = %gid, undelivered, "shut down with messages held for a peer; telling it");
            }
            let cause = Error::PeerShutdown {
                rank: me,
                undelivered,
            };
            self.transmits.push_back(Transmit {
                dst,
                msg: Message {
                    src: me,
                    header: Header::Abort {
                        group: gid,
                        reason: Box::new(AbortReason::from(&cause)),
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
            if self.start_inquiry(id, now) {
                continue;
            }
            if self.ops.get(&id).is_some_and(|op| op.inquiry.is_some()) {
                // The grace is over: the report has what came.
                self.conclude_inquiry(id);
                continue;
            }
            let Some(op) = self.ops.get(&id) else {
                continue;
            };
            let waiting_for = self.awaited(op);
            let err = Error::Timeout {
                group: op.group,
                seq: op.seq,
                op: op.fp.kind,
                rank: self.rank,
                waiting_for,
                report: Vec::new(),
            };
            let gid = op.group;
            self.abort(gid, err.clone(), Some((id, err)), true);
        }
    }

    /// The ranks (global) whose messages call `op` waits for in its current step.
    pub(super) fn awaited(&self, op: &PendingCall) -> Vec<usize> {
        let Some(g) = self.groups.get(&op.group) else {
            return Vec::new();
        };
        match &op.state {
            State::Collective(c) => match c.sched.steps.get(c.step) {
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
        }
    }

    /// A collective call `id` is past its deadline: ask every other member which call it is
    /// in, and wait up to the group's `desync_grace` for the answers (the desync report).
    /// `false` when there is nobody to ask, no grace, or the inquiry already ran.
    fn start_inquiry(&mut self, id: OpId, now: Time) -> bool {
        let Some(op) = self.ops.get_mut(&id) else {
            return false;
        };
        let Some(g) = self.groups.get(&op.group) else {
            return false;
        };
        let grace = g.info.options.desync_grace;
        let (Some(seq), None) = (op.seq, &op.inquiry) else {
            return false;
        };
        if grace.is_zero() || g.info.size() < 2 {
            return false;
        }
        op.inquiry = Some(Inquiry {
            replies: BTreeMap::new(),
            waited: now.saturating_since(op.started),
            probing: false,
            elsewhere: false,
        });
        op.deadline = now + grace;
        let (gid, kind) = (op.group, op.fp.kind);
        tracing::warn!(rank = self.rank, group = %gid, seq, call = %op.fp, "call timed out; asking the group which call each rank is in");
        for &m in g.info.members.iter() {
            if m != self.rank {
                self.transmits.push_back(Transmit {
                    dst: m,
                    msg: Message {
                        src: self.rank,
                        header: Header::Inquire { group: gid, seq },
                        payload: Vec::new(),
                    },
                });
            }
        }
        // Who waits for whom, across groups: a probe to each member the call waits for.
        let awaited = self
            .ops
            .get(&id)
            .map(|op| self.awaited(op))
            .unwrap_or_default();
        let probing = self.send_probes(gid, seq, kind, &awaited);
        if let Some(inq) = self.ops.get_mut(&id).and_then(|op| op.inquiry.as_mut()) {
            inq.probing = probing;
        }
        true
    }

    /// `from` (global) asked about call `seq` of group `gid`: this rank answers with its
    /// status.
    pub(super) fn on_inquire(&mut self, gid: GroupId, from: usize, seq: u64, now: Time) {
        let reply = self.status_of(gid, seq, now);
        self.transmits.push_back(Transmit {
            dst: from,
            msg: Message {
                src: self.rank,
                header: reply,
                payload: Vec::new(),
            },
        });
    }

    /// This rank's answer to an inquiry about call `seq` of group `gid`, at `now`.
    pub(super) fn status_of(&self, gid: GroupId, seq: u64, now: Time) -> Header {
        let fp_of = |s: u64| -> Option<Fingerprint> {
            let g = self.groups.get(&gid)?;
            match g.active.get(&s) {
                Some(id) => self.ops.get(id).map(|op| op.fp),
                None => g.board.get(&s).copied().or_else(|| g.done.get(s)),
            }
        };
        let latest = self.groups.get(&gid).and_then(|g| {
            let a = g.active.keys().chain(g.board.keys()).max().copied();
            let d = g.done.latest();
            a.max(d).and_then(|s| fp_of(s).map(|fp| (s, fp)))
        });
        // A call finished so long ago that its fingerprint is forgotten has `made` empty, but
        // `latest` beyond it shows the asker that this rank passed it.
        let made = fp_of(seq);
        let in_call_for = self
            .groups
            .get(&gid)
            .and_then(|g| g.active.get(&seq))
            .and_then(|id| self.ops.get(id))
            .map(|op| {
                u64::try_from(now.saturating_since(op.started).as_nanos()).unwrap_or(u64::MAX)
            });
        Header::Status {
            group: gid,
            seq,
            made: made.map(Box::new),
            latest: latest.map(Box::new),
            in_call_for,
            elsewhere: self.in_flight_elsewhere(gid, seq),
        }
    }

    /// `from` (global) answered the inquiry about call `seq` of group `gid`.
    pub(super) fn on_status(&mut self, gid: GroupId, seq: u64, from: usize, reply: Reply) {
        let Some(&id) = self.groups.get(&gid).and_then(|g| g.active.get(&seq)) else {
            self.board_status(gid, seq, from, reply);
            return;
        };
        let Some(op) = self.ops.get_mut(&id) else {
            return;
        };
        let Some(inq) = &mut op.inquiry else {
            return;
        };
        // A member that had been in the call for less than half of what this rank had
        // waited when it asked made it at least `waited - in_call_for` later (the asking came
        // after this rank's wait, the answer after the asking): it came late.
        let late = reply
            .in_call_for
            .filter(|&d| d < inq.waited / 2)
            .map(|d| inq.waited.saturating_sub(d));
        inq.elsewhere |= reply.made.is_none() && reply.elsewhere;
        inq.replies
            .insert(from, status_line(from, reply.made, reply.latest, late));
        // With probes out and a member that has not made the call waiting elsewhere, the
        // report waits for its grace: the probes may come back with a cycle.
        if inq.replies.len() + 1 >= op.group_size && !(inq.probing && inq.elsewhere) {
            self.conclude_inquiry(id);
        }
    }

    /// Ends call `id` with its desync report: a mismatch if some rank is in a different
    /// call, else a timeout naming exactly the ranks that said they have not made it.
    fn conclude_inquiry(&mut self, id: OpId) {
        let Some(Inquiry { replies, .. }) = self.ops.get_mut(&id).and_then(|op| op.inquiry.take())
        else {
            return;
        };
        let Some(op) = self.ops.get(&id) else {
            return;
        };
        let awaited = self.awaited(op);
        let (gid, seq, fp) = (op.group, op.seq, op.fp);
        let Some(err) = self.verdict(gid, seq, fp, &replies, awaited) else {
            return;
        };
        self.abort(gid, err.clone(), Some((id, err)), true);
    }

    /// The verdict of a desync report on call `seq` (`fp`) of group `gid`, from the members'
    /// `replies`: a mismatch if some rank is in a different call, else a timeout naming
    /// exactly the ranks that said they have not made it (or, when every rank is in the call,
    /// those in `awaited`, whose messages it waits for).
    pub(super) fn verdict(
        &self,
        gid: GroupId,
        seq: Option<u64>,
        fp: Fingerprint,
        replies: &BTreeMap<usize, RankCall>,
        awaited: Vec<usize>,
    ) -> Option<Error> {
        let g = self.groups.get(&gid)?;
        let report: Vec<RankCall> = g
            .info
            .members
            .iter()
            .filter(|&&m| m != self.rank)
            .map(|&m| {
                replies
                    .get(&m)
                    .cloned()
                    .unwrap_or(RankCall::NoAnswer { rank: m })
            })
            .collect();
        let different = report.iter().find_map(|r| match r {
            RankCall::Made { rank, call } | RankCall::Late { rank, call, .. } if *call != fp => {
                Some((seq, fp, *rank, *call))
            }
            _ => None,
        });
        // A rank still in an earlier call that this rank made differently (and finished
        // early: a broadcast root, a call on the board) is a mismatch of that call.
        let earlier = || {
            report.iter().find_map(|r| match r {
                RankCall::NotReached {
                    rank,
                    latest: Some((l, call)),
                } => g
                    .done
                    .get(*l)
                    .filter(|ours| ours != call)
                    .map(|ours| (Some(*l), ours, *rank, *call)),
                _ => None,
            })
        };
        Some(match different.or_else(earlier) {
            Some((seq, ours, rank, call)) => Error::Mismatch {
                group: gid,
                seq,
                ours: CallDesc {
                    rank: self.rank,
                    call: ours,
                },
                theirs: CallDesc { rank, call },
                report,
            },
            None => {
                let s = seq.unwrap_or_default();
                // A rank whose latest call is this one or later has passed it, even when its
                // fingerprint of it is forgotten. A rank that did not answer is named only
                // when the call waits for its messages: nothing shows that it made the call.
                let behind: Vec<usize> = report
                    .iter()
                    .filter_map(|r| match r {
                        RankCall::NotReached { rank, latest } => {
                            latest.is_none_or(|(l, _)| l < s).then_some(*rank)
                        }
                        RankCall::NoAnswer { rank } => awaited.contains(rank).then_some(*rank),
                        RankCall::Made { .. } | RankCall::Late { .. } => None,
                    })
                    .collect();
                let everyone_in = behind.is_empty()
                    && !report
                        .iter()
                        .any(|r| matches!(r, RankCall::NoAnswer { .. }));
                let late: Vec<usize> = report
                    .iter()
                    .filter_map(|r| match r {
                        RankCall::Late { rank, .. } => Some(*rank),
                        _ => None,
                    })
                    .collect();
                Error::Timeout {
                    group: gid,
                    seq,
                    op: fp.kind,
                    rank: self.rank,
                    // Every rank is in the call: name those that came late, or else (a lost
                    // message, a schedule bug) whose messages the current step still waits
                    // for.
                    waiting_for: match (everyone_in, late.is_empty()) {
                        (false, _) => behind,
                        (true, false) => late,
                        (true, true) => awaited,
                    },
                    report,
                }
            }
        })
    }

    /// Handles the loss of a peer (its link closed, or a simulator isolated it): every group
    /// it belongs to is aborted. Calls that exchange messages with it later in their schedule
    /// fail with [`Error::PeerLost`]; the others with [`Error::GroupAborted`].
    pub fn handle_peer_lost(&mut self, peer: usize, now: Time) {
        self.peer_lost_as(peer, super::Certainty::Suspected, now);
    }

    /// Like [`handle_peer_lost`](Self::handle_peer_lost), for a peer this rank knows dead
    /// for certain: the kernel closed or reset its connection, or its process is gone. The
    /// survivors' agreement counts it dead, not only unreachable.
    pub fn handle_peer_dead(&mut self, peer: usize, now: Time) {
        self.peer_lost_as(peer, super::Certainty::Dead, now);
    }

    fn peer_lost_as(&mut self, peer: usize, certainty: super::Certainty, _now: Time) {
        self.saw_lost(peer, certainty);
        // A peer that left every group it shares with this rank (a clean shutdown) closes
        // its links next: no failure.
        let gids: Vec<GroupId> = self
            .groups
            .iter()
            .filter(|(_, g)| {
                g.aborted.is_none()
                    && g.info.local(peer).is_some()
                    && !g.left.iter().any(|&(r, _)| r == peer)
            })
            .map(|(&id, _)| id)
            .collect();
        if gids.is_empty() {
            tracing::debug!(rank = self.rank, peer, "link to a peer closed");
        } else {
            tracing::warn!(rank = self.rank, peer, "peer lost");
        }
        for gid in gids {
            self.fail_talking_to(gid, peer);
            self.abort(gid, Error::PeerLost { rank: peer }, None, true);
        }
    }

    /// `from` (global) aborted group `gid` for `reason`: the group is aborted here too.
    pub(super) fn on_abort(&mut self, gid: GroupId, from: usize, reason: &AbortReason) {
        let cause = reason.clone().into_error(gid, from);
        // A wait cycle: this rank's call on it fails with the cycle itself, and the groups it
        // waits in on the cycle are aborted in turn (`cycle.rs`).
        if let Error::WaitCycle { .. } = &cause {
            let failing = self.waits_on_cycle(gid, &cause);
            self.abort(
                gid,
                cause.clone(),
                failing.map(|id| (id, cause.clone())),
                false,
            );
            self.cycle_spreads(gid, &cause);
            return;
        }
        // A peer says this very rank was lost (it was frozen, stopped or cut off while the
        // others went on): not a peer's loss, and said so.
        if matches!(cause.root_cause(), Error::PeerLost { rank } if *rank == self.rank) {
            self.abort(gid, Error::DeclaredLost { by: from }, None, false);
            return;
        }
        // A lost peer heard of from another member before this rank noticed: the
        // calls that talk to it fail with `PeerLost`, as if this rank had noticed, and it
        // counts as lost here too (its own link may take a moment more to break).
        if let Error::PeerLost { rank } = cause.root_cause() {
            if *rank != self.rank {
                self.lost.insert(*rank);
            }
            self.fail_talking_to(gid, *rank);
        }
        self.abort(gid, cause, None, false);
    }

    /// Fails with [`Error::PeerLost`] the calls of group `gid` whose remaining schedule
    /// exchanges messages with global rank `peer`.
    pub(super) fn fail_talking_to(&mut self, gid: GroupId, peer: usize) {
        let Some(local) = self.groups.get(&gid).and_then(|g| g.info.local(peer)) else {
            return;
        };
        let direct: Vec<OpId> = self
            .ops
            .iter()
            .filter(|(_, op)| op.group == gid && op.talks_to(local))
            .map(|(&id, _)| id)
            .collect();
        if let Some(g) = self.groups.get_mut(&gid).filter(|_| !direct.is_empty()) {
            g.heard = true;
        }
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

    pub(super) fn mismatch(
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
            report: Vec::new(),
        }
    }

    /// Aborts group `gid` because of `cause`: every pending call on it fails (`failing`
    /// with its own error, the others with [`Error::GroupAborted`]), and, when the failure
    /// was seen here, every other member is told.
    pub(super) fn abort(
        &mut self,
        gid: GroupId,
        cause: Error,
        failing: Option<(OpId, Error)>,
        tell: bool,
    ) {
        let Some(g) = self.groups.get_mut(&gid) else {
            return;
        };
        if g.aborted.is_some() {
            if let Some((id, e)) = failing {
                if let Some(op) = self.ops.remove(&id) {
                    g.heard = true;
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
        tracing::warn!(rank = self.rank, group = %gid, cause = %root, told = tell, "group aborted");
        g.aborted = Some(root.clone());
        super::bump(&self.board_epoch);
        g.unexpected.clear();
        g.p2p_arrived.clear();
        g.p2p_mail.clear();
        g.flow.clear();
        g.p2p_flow.clear();
        if tell {
            for &m in g.info.members.iter() {
                if m != self.rank {
                    let header = Header::Abort {
                        group: gid,
                        reason: Box::new(AbortReason::from(&root)),
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
        if !ids.is_empty() {
            g.heard = true;
        }
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
}

impl PendingCall {
    /// Whether the rest of this call's schedule exchanges messages with group rank `peer`.
    pub(super) fn talks_to(&self, peer: usize) -> bool {
        match &self.state {
            State::Collective(c) => {
                c.sched.steps[c.step.min(c.sched.steps.len())..]
                    .iter()
                    .any(|s| {
                        s.sends.iter().any(|x| x.peer == peer)
                            || s.recvs.iter().any(|x| x.peer == peer)
                    })
            }
            State::Recv { src, .. } => src.is_none_or(|s| s == peer),
        }
    }
}

/// A member's answer to a desync inquiry as a line of the report: in the call (with its
/// fingerprint), or not there yet (with its latest call, if any).
pub(super) fn status_line(
    from: usize,
    made: Option<Fingerprint>,
    latest: Option<(u64, Fingerprint)>,
    late: Option<Duration>,
) -> RankCall {
    match (made, late) {
        (Some(call), Some(after)) => RankCall::Late {
            rank: from,
            call,
            after,
        },
        (Some(call), None) => RankCall::Made { rank: from, call },
        (None, _) => RankCall::NotReached { rank: from, latest },
    }
}
