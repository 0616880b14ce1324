//! Wait cycles across groups: ranks that wait for each other in calls of two or more groups
//! in an order that can never complete (rank 0 in group A waits for rank 1, which waits in
//! group B for rank 0, which has not made that call). Each group's own checks see only a
//! timeout; this finds the cycle by edge chasing (Chandy, Misra and Haas's probes for the
//! AND model), and every rank on it fails its call with [`Error::WaitCycle`] naming it.
//!
//! - When a collective call passes its deadline (its desync report starts, `failure.rs`, or
//!   the board's, `board.rs`), the rank sends a probe ([`Header::Probe`]) to each member its
//!   call waits for: a path of one wait, `(rank, group, call, peer)`.
//! - A rank that gets a probe whose last wait is for it looks at the call it names: in flight
//!   here, it follows the probe along that call's own waits (the members whose messages it
//!   waits for; on the board, every other member); not made here yet, it marks the wait
//!   `reached: false` and follows along every collective call it has in flight, on any group
//!   (it may be blocked in any of them); finished here, the probe ends (the data is on its
//!   way). It follows a probe once per (starting call, call named), never through itself
//!   twice, and never past [`MAX_WAITS`] waits.
//! - The probe's starting rank, getting it back with a wait for it in its own timed-out call
//!   or in a call it has not made, has a cycle, if at least one wait on it is for a rank that
//!   has not made its call (waits among ranks that all made their calls are progress, not a
//!   deadlock). It ends its call with [`Error::WaitCycle`] and aborts its group; the abort
//!   carries the cycle, and each rank it reaches aborts in turn the group it waits in on the
//!   cycle, so every rank on it fails its call there with the same error.
//!
//! A probe starts only once a call has timed out (it fails anyway), and the cycle comes
//! within the desync report's grace, so a program that would complete never sees one: the
//! cost of a false cycle (a rank that had not made a call, and had calls in flight it was not
//! blocked in: another thread's, or async work it would have waited for later) is a timeout
//! reported as a cycle. A rank's calls are taken as blocking it; a lane's calls are another
//! group's, as to the probe. Point-to-point receives are not followed.

use super::{Engine, State};
use crate::error::{Error, Wait};
use crate::group::GroupId;
use crate::op::OpKind;
use crate::wire::codec::MAX_WAITS;
use crate::wire::message::{Header, Message, Transmit};

/// The most probes remembered as followed here (each for one starting call and call named);
/// beyond it the record starts again (a probe followed twice costs messages, not results).
const SEEN_KEPT: usize = 4096;

/// Rank `rank` waits in `call` (group, sequence number, what) for `peer` (whether `peer` made
/// it is for `peer` to say).
fn waiting(rank: usize, (group, seq, op): (GroupId, u64, OpKind), peer: usize) -> Wait {
    Wait {
        rank,
        group,
        seq,
        op,
        peer,
        reached: false,
    }
}

/// How this rank stands on a call a probe asks about.
enum Stand {
    /// In flight here: its waits.
    InFlight(Vec<Wait>),
    /// Not made here yet.
    NotMade,
    /// Finished here (or the group is gone or aborted here): the probe ends.
    Finished,
}

impl Engine {
    /// The waits of this rank's collective call `seq` of group `gid`, if it is in flight:
    /// for the members whose messages its current step waits for (an engine call), or for
    /// every other member (a call on the board, whose slots the engine does not see).
    fn waits_of(&self, gid: GroupId, seq: u64) -> Option<Vec<Wait>> {
        let g = self.groups.get(&gid)?;
        let wait = |op: OpKind, peer: usize| waiting(self.rank, (gid, seq, op), peer);
        if let Some(op) = g.active.get(&seq).and_then(|id| self.ops.get(id)) {
            if !matches!(op.state, State::Collective(_)) {
                return None;
            }
            return Some(
                self.awaited(op)
                    .into_iter()
                    .map(|p| wait(op.fp.kind, p))
                    .collect(),
            );
        }
        let fp = g.board.get(&seq)?;
        Some(
            g.info
                .members
                .iter()
                .filter(|&&m| m != self.rank)
                .map(|&m| wait(fp.kind, m))
                .collect(),
        )
    }

    /// The waits of every collective call this rank has in flight, on any group.
    fn all_waits(&self) -> Vec<Wait> {
        let mut calls: Vec<(GroupId, u64)> = self
            .ops
            .values()
            .filter_map(|op| op.seq.map(|s| (op.group, s)))
            .collect();
        for (&gid, g) in &self.groups {
            calls.extend(g.board.keys().map(|&s| (gid, s)));
        }
        calls.sort_unstable();
        calls.dedup();
        calls
            .into_iter()
            .filter_map(|(gid, s)| self.waits_of(gid, s))
            .flatten()
            .collect()
    }

    /// Whether this rank has collective calls in flight other than call `seq` of `gid`
    /// (what its answer to a desync inquiry says: `Header::Status::elsewhere`).
    pub(super) fn in_flight_elsewhere(&self, gid: GroupId, seq: u64) -> bool {
        let other = |g: GroupId, s: u64| g != gid || s != seq;
        self.ops
            .values()
            .any(|op| op.seq.is_some_and(|s| other(op.group, s)))
            || self
                .groups
                .iter()
                .any(|(&g, grp)| grp.board.keys().any(|&s| other(g, s)))
    }

    fn stand(&self, gid: GroupId, seq: u64) -> Stand {
        let Some(g) = self.groups.get(&gid).filter(|g| g.aborted.is_none()) else {
            return Stand::Finished;
        };
        if let Some(w) = self.waits_of(gid, seq) {
            return Stand::InFlight(w);
        }
        let latest = g
            .active
            .keys()
            .chain(g.board.keys())
            .max()
            .copied()
            .max(g.done.latest());
        // A call at or below the latest made here and not in flight finished here (its
        // record may be forgotten).
        if latest.is_some_and(|l| seq <= l) || seq < g.done.prefix() {
            Stand::Finished
        } else {
            Stand::NotMade
        }
    }

    /// Call `seq` (`op`) of group `gid` passed its deadline waiting for `peers` (global):
    /// a probe goes to each. Whether any was sent.
    pub(super) fn send_probes(
        &mut self,
        gid: GroupId,
        seq: u64,
        op: OpKind,
        peers: &[usize],
    ) -> bool {
        let (mut sent, me) = (false, self.rank);
        for &peer in peers.iter().filter(|&&p| p != me) {
            let path = vec![waiting(me, (gid, seq, op), peer)];
            self.send_probe(peer, path);
            sent = true;
        }
        sent
    }

    fn send_probe(&mut self, dst: usize, path: Vec<Wait>) {
        let Some(group) = path.last().map(|w| w.group) else {
            return;
        };
        self.transmits.push_back(Transmit {
            dst,
            msg: Message {
                src: self.rank,
                header: Header::Probe {
                    group,
                    path: Box::new(path),
                },
                payload: Vec::new(),
            },
        });
    }

    /// `from` (global) sent a probe on group `gid` whose last wait is for this rank.
    pub(super) fn on_probe(&mut self, gid: GroupId, from: usize, mut path: Vec<Wait>) {
        let me = self.rank;
        let well_formed = path.len() <= MAX_WAITS
            && path
                .last()
                .is_some_and(|w| w.rank == from && w.peer == me && w.group == gid);
        if !well_formed {
            tracing::warn!(rank = me, from, group = %gid, "malformed wait-cycle probe dropped");
            return;
        }
        let Some(&Wait { group, seq, .. }) = path.last() else {
            return;
        };
        let stand = self.stand(group, seq);
        let reached = match stand {
            Stand::Finished => return,
            Stand::InFlight(_) => true,
            Stand::NotMade => false,
        };
        if let Some(last) = path.last_mut() {
            last.reached = reached;
        }
        let (origin, o_group, o_seq) = (path[0].rank, path[0].group, path[0].seq);
        if origin == me {
            let closes = (group, seq) == (o_group, o_seq) || !reached;
            if closes && path.iter().any(|w| !w.reached) && self.probing(o_group, o_seq) {
                self.cycle_found(path);
            }
            return;
        }
        // A loop that does not pass through the probe's starting rank: its own ranks find it
        // when their calls time out.
        if path[..path.len() - 1].iter().any(|w| w.rank == me) || path.len() >= MAX_WAITS {
            return;
        }
        if self.probes_seen.len() >= SEEN_KEPT {
            self.probes_seen.clear();
        }
        if !self
            .probes_seen
            .insert((origin, o_group, o_seq, group, seq))
        {
            return;
        }
        let next = match stand {
            Stand::InFlight(waits) => waits,
            _ => self.all_waits(),
        };
        for w in next {
            let mut p = path.clone();
            let dst = w.peer;
            p.push(w);
            self.send_probe(dst, p);
        }
    }

    /// Whether call `seq` of `gid` timed out here and is waiting for its desync report (its
    /// probes may still come back).
    fn probing(&self, gid: GroupId, seq: u64) -> bool {
        let Some(g) = self.groups.get(&gid) else {
            return false;
        };
        let engine = g
            .active
            .get(&seq)
            .and_then(|id| self.ops.get(id))
            .is_some_and(|op| op.inquiry.is_some());
        engine || g.board_inquiries.contains_key(&seq)
    }

    /// A probe of this rank's came back around `cycle`: its call fails with
    /// [`Error::WaitCycle`], its group is aborted, and the abort carries the cycle on.
    fn cycle_found(&mut self, cycle: Vec<Wait>) {
        let (gid, seq) = (cycle[0].group, cycle[0].seq);
        let err = Error::WaitCycle { cycle };
        tracing::warn!(rank = self.rank, group = %gid, seq, error = %err, "wait cycle found");
        self.fail_on_cycle(gid, seq, &err);
        self.cycle_spreads(gid, &err);
    }

    /// Ends this rank's call `seq` of `gid` with `err` (a wait cycle), if it is in flight, and
    /// aborts the group, telling its members.
    fn fail_on_cycle(&mut self, gid: GroupId, seq: u64, err: &Error) {
        let Some(g) = self.groups.get_mut(&gid) else {
            return;
        };
        if let Some(&id) = g.active.get(&seq) {
            if let Some(op) = self.ops.get_mut(&id) {
                op.inquiry = None;
            }
            self.abort(gid, err.clone(), Some((id, err.clone())), true);
        } else if g.board.contains_key(&seq) {
            g.board_inquiries.remove(&seq);
            if g.aborted.is_none() {
                g.board_verdicts.insert(seq, err.clone());
                super::bump(&self.board_epoch);
            }
            self.abort(gid, err.clone(), None, true);
        } else {
            self.abort(gid, err.clone(), None, true);
        }
    }

    /// Group `gid` was aborted here because of a wait cycle (`err`): every other group on the
    /// cycle that this rank belongs to is aborted too, telling its members (the next rank on
    /// the cycle, and the members waiting in a call the rank has not made, hear it from this
    /// rank at once: before anything this rank sends later, such as its leaving), and the
    /// calls this rank waits in on the cycle fail with the cycle itself.
    pub(super) fn cycle_spreads(&mut self, gid: GroupId, err: &Error) {
        let Error::WaitCycle { cycle } = err.root_cause() else {
            return;
        };
        let mut on: Vec<GroupId> = cycle
            .iter()
            .map(|w| w.group)
            .filter(|&g| g != gid)
            .collect();
        on.sort_unstable();
        on.dedup();
        let err = err.root_cause().clone();
        for g in on {
            let waits = cycle
                .iter()
                .find(|w| w.rank == self.rank && w.group == g)
                .map(|w| w.seq);
            match waits {
                Some(seq) => self.fail_on_cycle(g, seq, &err),
                None => {
                    let failing = self.waits_on_cycle(g, &err);
                    self.abort(g, err.clone(), failing.map(|id| (id, err.clone())), true);
                }
            }
        }
    }

    /// This rank's call on group `gid` that waits on the cycle of `err`, if `err` is a wait
    /// cycle: it fails with the cycle itself, not as an aborted group's call (an engine call
    /// is returned; a call on the board gets it as its verdict).
    pub(super) fn waits_on_cycle(&mut self, gid: GroupId, err: &Error) -> Option<super::OpId> {
        let Error::WaitCycle { cycle } = err.root_cause() else {
            return None;
        };
        let me = self.rank;
        let g = self.groups.get_mut(&gid)?;
        let mut engine = None;
        for w in cycle.iter().filter(|w| w.rank == me && w.group == gid) {
            if let Some(&id) = g.active.get(&w.seq) {
                engine = Some(id);
            } else if g.board.contains_key(&w.seq) && g.aborted.is_none() {
                g.board_verdicts.insert(w.seq, err.root_cause().clone());
                super::bump(&self.board_epoch);
            }
        }
        engine
    }
}
