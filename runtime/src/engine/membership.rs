//! Who is still in a group: revoking it (MPI ULFM's `MPI_Comm_revoke`: a member ends the
//! group for everyone), members that left it cleanly (a destroy or a shutdown with nothing in
//! flight: the calls that needed them fail at once, the others complete), and the peers this
//! rank knows lost, so that a group made after a loss (a shrunk one, say) that still names a
//! lost rank fails at once instead of at its first call's timeout.

use super::{Engine, Event, OpId, State};
use crate::error::{Error, Result};
use crate::ids::GroupId;
use crate::recovery::Evidence;
use crate::wire::message::{Header, Message, Transmit};
use std::collections::BTreeSet;

/// How sure a rank is that a peer it saw lost is gone.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Certainty {
    /// Its link broke or fell silent (a cut link, a partition, a stopped process): the peer
    /// may be alive, and reach every other rank.
    Suspected,
    /// The peer is gone: the kernel closed or reset its connection, or its process is gone.
    Dead,
}

impl Engine {
    /// Revokes group `gid` on behalf of this rank: every pending call on it fails here and on
    /// every other member with [`Error::GroupAborted`] whose cause is [`Error::Revoked`]
    /// naming this rank, and so does every later call (the other members are told at once,
    /// with the same abort every other failure uses). Revoking a group that already failed
    /// keeps its first cause and succeeds: the group is over either way. The revoke is no
    /// pending error of this rank's (it knows).
    pub fn revoke_group(&mut self, gid: GroupId) -> Result<()> {
        if self.destroyed.contains(&gid) {
            return Err(Error::invalid(format!(
                "group {gid} was destroyed on this rank; there is nothing left to revoke"
            )));
        }
        if !self.groups.contains_key(&gid) {
            return Err(Error::NotAMember {
                group: gid,
                rank: self.rank,
            });
        }
        let cause = Error::Revoked {
            group: gid,
            by: self.rank,
        };
        self.abort(gid, cause, None, true);
        if let Some(g) = self.groups.get_mut(&gid) {
            g.heard = true;
        }
        Ok(())
    }

    /// This rank issued calls on group `gid` from two threads at once (`crate::issuers`):
    /// their order here was the scheduler's, so the group is aborted with `cause` and its
    /// members told, as on a mismatch; the calls in flight fail with it. The caller of the
    /// call refused hears `cause` itself.
    pub fn abort_disordered(&mut self, gid: GroupId, cause: Error) {
        self.abort(gid, cause, None, true);
        if let Some(g) = self.groups.get_mut(&gid) {
            g.heard = true;
        }
    }

    /// A new incarnation of `peer` (a restarted process) connected: the previous one is lost
    /// for good ([`handle_peer_lost`](Self::handle_peer_lost), if it was not already), and
    /// the new one may be a member of groups registered from now on (it is no longer
    /// among the [lost peers](Self::lost_peers)). It is a member of no group registered
    /// before: those it shared with the previous incarnation stay aborted.
    pub fn handle_peer_rejoined(&mut self, peer: usize, now: crate::time::Time) {
        self.handle_peer_dead(peer, now);
        self.lost.remove(&peer);
        self.seen_lost.remove(&peer);
    }

    /// This rank's own evidence against the members of group `gid`, for the survivors'
    /// agreement: the peers it saw lost (dead for certain, or only suspected), and the
    /// members that left the group in order (destroyed it, or shut down), who count as
    /// dead. Losses that other members only reported are not evidence.
    pub fn departed(&self, gid: GroupId) -> Evidence {
        let mut e = Evidence::default();
        for (&peer, &c) in &self.seen_lost {
            match c {
                Certainty::Dead => e.dead.insert(peer),
                Certainty::Suspected => e.suspected.insert(peer),
            };
        }
        if let Some(g) = self.groups.get(&gid) {
            e.dead.extend(g.left.iter().map(|&(r, _)| r));
        }
        e.suspected.retain(|p| !e.dead.contains(p));
        e
    }

    /// Records that this rank saw `peer` lost, with `certainty` (a certain loss is never
    /// made a suspicion again).
    pub(super) fn saw_lost(&mut self, peer: usize, certainty: Certainty) {
        tracing::debug!(rank = self.rank, peer, ?certainty, "saw a peer lost");
        self.lost.insert(peer);
        let c = self.seen_lost.entry(peer).or_insert(certainty);
        *c = (*c).max(certainty);
    }

    /// The peers this rank saw lost (global ranks), in order.
    pub fn lost_peers(&self) -> &BTreeSet<usize> {
        &self.lost
    }

    /// Group `gid` was just registered: if a member is a peer this rank already saw lost
    /// itself, the group is aborted at once with [`Error::PeerLost`] (and the other members
    /// told). A loss another member only reported does not count: the survivors' agreement
    /// may have found that peer alive (its link to the reporter alone broke).
    pub(super) fn abort_if_lost(&mut self, gid: GroupId) {
        let Some(g) = self.groups.get(&gid) else {
            return;
        };
        if g.aborted.is_some() {
            return;
        }
        let Some(&peer) = g
            .info
            .members
            .iter()
            .find(|m| self.seen_lost.contains_key(m))
        else {
            return;
        };
        self.abort(gid, Error::PeerLost { rank: peer }, None, true);
    }
}

impl Engine {
    /// This rank leaves group `gid` cleanly (no call of it in flight there, nothing held):
    /// every other member is told how many collective calls it made, so that their calls up
    /// to those can still complete and later ones fail at once with
    /// [`Error::PeerShutdown`] (instead of at their timeout). The group is over here.
    pub(super) fn tell_left(&mut self, gid: GroupId) {
        let Some(g) = self.groups.get_mut(&gid) else {
            return;
        };
        if g.aborted.is_some() {
            return;
        }
        let made = |s: Option<u64>| s.map_or(0, |s| s + 1);
        let calls = made(g.done.latest()).max(made(g.active.keys().max().copied()));
        g.aborted = Some(Error::Shutdown);
        super::bump(&self.board_epoch);
        g.heard = true;
        let me = self.rank;
        for &dst in g.info.members.iter().filter(|&&m| m != me) {
            self.transmits.push_back(Transmit {
                dst,
                msg: Message {
                    src: me,
                    header: Header::Left { group: gid, calls },
                    payload: Vec::new(),
                },
            });
        }
    }

    /// Member `from` (global) left group `gid` cleanly after `calls` collective calls: the
    /// calls here that can no longer complete fail with [`Error::PeerShutdown`] (see
    /// [`Header::Left`]), and so will later ones.
    pub(super) fn on_left(&mut self, gid: GroupId, from: usize, calls: u64) {
        let Some(g) = self.groups.get_mut(&gid) else {
            return;
        };
        tracing::debug!(rank = self.rank, group = %gid, peer = from, calls, "a member left the group");
        if !g.left.iter().any(|&(r, _)| r == from) {
            g.left.push((from, calls));
            super::bump(&self.board_epoch);
        }
        self.fail_needing_left(gid);
    }

    /// Why a call of group `gid` at `seq` (`None`: point-to-point with group rank `peer`, if
    /// any) cannot complete because a member left, if it cannot.
    pub(super) fn left_refusal(
        &self,
        gid: GroupId,
        seq: Option<u64>,
        peer: Option<usize>,
    ) -> Option<Error> {
        let g = self.groups.get(&gid)?;
        let gone = |&(rank, calls): &(usize, u64)| match seq {
            Some(s) => s >= calls,
            None => peer.is_some_and(|p| g.info.global(p) == rank),
        };
        g.left
            .iter()
            .find(|l| gone(l))
            .map(|&(rank, _)| Error::PeerShutdown {
                rank,
                undelivered: 0,
            })
    }

    /// Fails the calls of group `gid` in flight that a member that left makes impossible.
    pub(super) fn fail_needing_left(&mut self, gid: GroupId) {
        let doomed: Vec<(OpId, Error)> = self
            .ops
            .iter()
            .filter(|(_, op)| op.group == gid)
            .filter_map(|(&id, op)| {
                let peer = match &op.state {
                    State::Recv { src, .. } => *src,
                    State::Collective(_) => None,
                };
                self.left_refusal(gid, op.seq, peer).map(|e| (id, e))
            })
            .collect();
        for (id, e) in doomed {
            if let Some(op) = self.ops.remove(&id) {
                self.forget(&op, id);
                self.events.push_back(Event {
                    op: id,
                    result: Err(e),
                });
            }
        }
    }
}
