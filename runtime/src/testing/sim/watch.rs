//! The simulator's own model of each collective, independent of the engine's state: the
//! call's schedule and the messages delivered to it.

use super::Sim;
use crate::engine::OpId;
use crate::group::GroupId;
use crate::schedule::Schedule;
use crate::wire::message::{Header, Transmit};
use std::collections::HashSet;

/// A collective as seen from outside its engine: its schedule and the messages delivered to
/// it, up to its completion. An independent model of how far the call got.
pub(super) struct Watch {
    group: GroupId,
    seq: u64,
    members: Vec<usize>,
    steps: Vec<WatchStep>,
    got: HashSet<(usize, u32)>,
    pub(super) done: bool,
}

/// One step of a watched call, in group-local ranks.
struct WatchStep {
    /// The peers it sends to or receives from.
    peers: Vec<usize>,
    /// Its receives: (source, tag).
    recvs: Vec<(usize, u32)>,
}

impl Watch {
    /// The step the engine must be at: the first whose receives have not all arrived.
    fn step(&self) -> usize {
        self.steps
            .iter()
            .position(|st| !st.recvs.iter().all(|k| self.got.contains(k)))
            .unwrap_or(self.steps.len())
    }

    /// The watch of call `seq` of `group` (whose members are `members`, global ranks in
    /// group-rank order), which runs `sched`.
    pub(super) fn new(group: GroupId, seq: u64, members: Vec<usize>, sched: &Schedule) -> Watch {
        Watch {
            group,
            seq,
            members,
            steps: sched
                .steps
                .iter()
                .map(|st| {
                    let peers = st.sends.iter().map(|x| x.peer);
                    let peers = peers.chain(st.recvs.iter().map(|x| x.peer)).collect();
                    WatchStep {
                        peers,
                        recvs: st.recvs.iter().map(|x| (x.peer, x.tag)).collect(),
                    }
                })
                .collect(),
            got: HashSet::new(),
            done: false,
        }
    }
}

impl Sim {
    /// Global ranks whose messages collective `op` of `rank` was still waiting for in its
    /// current step when it completed (or now, if it has not): the sim's own model, from the
    /// call's schedule and the messages delivered to it, independent of the engine's state.
    /// `None` for point-to-point calls and unknown ones.
    pub fn awaited(&self, rank: usize, op: OpId) -> Option<Vec<usize>> {
        let w = self.watches.get(&(rank, op))?;
        let mut peers: Vec<usize> = match w.steps.get(w.step()) {
            None => Vec::new(),
            Some(st) => st
                .recvs
                .iter()
                .filter(|k| !w.got.contains(k))
                .map(|&(p, _)| w.members[p])
                .collect(),
        };
        peers.sort_unstable();
        peers.dedup();
        Some(peers)
    }

    /// Whether the rest of collective `op`'s schedule on `rank` (its current step, sends
    /// included, and every later one) exchanges messages with global rank `peer`, when it
    /// completed (or now): the sim's own model, like [`awaited`](Self::awaited).
    pub fn talks_to(&self, rank: usize, op: OpId, peer: usize) -> Option<bool> {
        let w = self.watches.get(&(rank, op))?;
        let Some(local) = w.members.iter().position(|&m| m == peer) else {
            return Some(false);
        };
        Some(
            w.steps[w.step()..]
                .iter()
                .any(|st| st.peers.contains(&local)),
        )
    }

    /// Records a collective message in the watch of the call it is for.
    pub(super) fn watch_delivery(&mut self, dst: usize, t: &Transmit) {
        let Header::Data {
            group, seq, tag, ..
        } = t.msg.header
        else {
            return;
        };
        let Some(id) = self.watched.get(&(dst, group, seq)) else {
            return;
        };
        if let Some(w) = self.watches.get_mut(&(dst, *id)) {
            if let (false, Some(src)) = (w.done, w.members.iter().position(|&m| m == t.msg.src)) {
                debug_assert!(w.group == group && w.seq == seq);
                w.got.insert((src, tag));
            }
        }
    }
}
