//! The group registry: the groups this rank belongs to, each with its calls in flight, its
//! early and completed calls' records, its point-to-point queues and its flow control; and
//! the messages kept for groups not created here yet.

use super::flow::Flow;
use super::p2p_flow::P2pFlow;
use super::{Engine, Event, OpId, DONE_KEPT};
use crate::error::{Error, Result};
use crate::fast_hash::FastMap;
use crate::group::{GroupId, GroupInfo};
use crate::ids::Fingerprint;
use crate::landing::Made;
use crate::lateness::{Lateness, LatenessSummary};
use crate::time::Time;
use crate::wire::message::{Message, Transmit};
use std::collections::{BTreeMap, BTreeSet, HashMap};

// On cache lines of its own: the ranks' engines of one process create their world groups one
// after another, and each rank writes its group's state on every call.
#[repr(align(128))]
pub(super) struct Group {
    pub(super) info: GroupInfo,
    pub(super) aborted: Option<Error>,
    /// Whether a call of this rank on the group has failed since it was aborted, so that the
    /// user heard of the failure; an abort nobody heard of is the group's *pending error*.
    pub(super) heard: bool,
    pub(super) active: FastMap<u64, OpId>,
    pub(super) unexpected: HashMap<u64, Vec<Message>>,
    pub(super) done: DoneCalls,
    pub(super) forgotten_below: u64,
    /// Per (peer, tag) of this rank's own sends and receives (keys it chose: a receive's
    /// lane enters only once a message matched it).
    pub(super) p2p_send_seq: FastMap<(usize, u32), u64>,
    pub(super) p2p_recv_seq: FastMap<(usize, u32), u64>,
    /// (src, tag, seq) → (arrival number, message).
    pub(super) p2p_arrived: BTreeMap<(usize, u32, u64), (u64, Message)>,
    pub(super) p2p_posted: Vec<OpId>,
    /// The arrived messages (keys of `p2p_arrived`) that came through the group's mailbox
    /// (`crate::board::mail`): outside the eager window; consuming one frees its slot.
    pub(super) p2p_mail: FastMap<(usize, u32, u64), ()>,
    /// The window of calls per peer (see [`crate::engine::flow`]).
    pub(super) flow: Flow<Transmit>,
    /// Point-to-point flow control (see [`crate::engine::p2p_flow`]): a window of eager messages
    /// per peer over all tags, and grants from posted receives. A peer can so make this rank
    /// buffer at most a window of its messages, whatever tags it uses and whatever receives
    /// are posted for other ranks (credit used to be counted per tag, and receives posted
    /// for one rank granted credit to all).
    pub(super) p2p_flow: P2pFlow,
    /// Members that left the group cleanly (global rank, collective calls they made): see
    /// `Header::Left`.
    pub(super) left: Vec<(usize, u64)>,
    /// Calls this rank has not made yet that failed on another member before they started
    /// (`Header::Failed`): sequence number → (that member, global, and why). At most a
    /// window of them (a marker beyond the window is a protocol violation).
    pub(super) failed: BTreeMap<u64, (usize, String)>,
    /// This rank's calls in flight on the group's board (`crate::board`), by sequence
    /// number: what it answers a member that asks which call it is in.
    pub(super) board: FastMap<u64, Fingerprint>,
    /// Desync reports on this rank's calls on the board that passed their deadlines.
    pub(super) board_inquiries: FastMap<u64, super::board::BoardInquiry>,
    /// The verdicts of those reports, for the calls they were about.
    pub(super) board_verdicts: FastMap<u64, Error>,
    /// Calls on the NCCL path whose host step finished and whose device operation has not
    /// finished yet (sequence numbers): not completed, for the survivors' agreement.
    pub(super) device_open: BTreeSet<u64>,
    /// The mark of the collective calls made here, for the frame readers
    /// (`crate::landing::Made`).
    pub(super) made: Made,
    /// When this rank made each call and its peers' messages of it came: who is late
    /// (`crate::lateness`).
    pub(super) lateness: Lateness,
}

/// The fingerprints of a group's last [`DONE_KEPT`] finished calls, by sequence number: a
/// ring indexed by `seq % DONE_KEPT`, so that recording a call allocates nothing (the ring
/// grows to its size once) and looking one up is one index. A call that ended because it
/// failed on a member before it started (`Header::Failed`) is kept without a fingerprint:
/// its late messages are dropped, not checked.
///
/// The gapless prefix of finished calls is kept apart from the ring: a call that finishes
/// after calls more than [`DONE_KEPT`] later took its slot (and theirs) still closes its gap.
#[derive(Default)]
pub(super) struct DoneCalls {
    slots: Vec<Option<(u64, Option<Fingerprint>)>>,
    latest: Option<u64>,
    /// Calls `0..prefix` all finished here (the gapless prefix).
    prefix: u64,
    /// Calls past `prefix` that finished here (at most the calls that finished while an
    /// earlier one was still open).
    ahead: BTreeSet<u64>,
}

impl DoneCalls {
    fn slot(seq: u64) -> usize {
        // DONE_KEPT fits in a usize, and so does the remainder.
        (seq % DONE_KEPT as u64) as usize
    }

    /// Finished call `seq`, if it is still kept: `Some(None)` if it ended because it failed
    /// on a member before it started.
    pub(super) fn entry(&self, seq: u64) -> Option<Option<Fingerprint>> {
        match self.slots.get(Self::slot(seq)) {
            Some(Some((s, fp))) if *s == seq => Some(*fp),
            _ => None,
        }
    }

    /// The fingerprint of finished call `seq`, if it is still kept and completed.
    pub(super) fn get(&self, seq: u64) -> Option<Fingerprint> {
        self.entry(seq).flatten()
    }

    /// Whether finished call `seq` (completed or failed) is still kept.
    pub(super) fn contains(&self, seq: u64) -> bool {
        self.entry(seq).is_some()
    }

    /// The highest sequence number recorded.
    pub(super) fn latest(&self) -> Option<u64> {
        self.latest
    }

    /// How many calls finished here without a gap: calls `0..prefix()` all did (a call that
    /// failed on a member before it started counts: it ended everywhere).
    pub(super) fn prefix(&self) -> u64 {
        self.prefix
    }

    /// Records finished call `seq` (`fp` `None`: it failed on a member before it started);
    /// the call no longer kept because of it (the older call in its slot, or `seq` itself if
    /// its slot holds a newer one).
    pub(super) fn insert(&mut self, seq: u64, fp: Option<Fingerprint>) -> Option<u64> {
        let i = Self::slot(seq);
        if self.slots.len() <= i {
            self.slots.resize(i + 1, None);
        }
        self.latest = self.latest.max(Some(seq));
        // In order (the common case) the set is not touched: recording allocates nothing.
        if seq == self.prefix {
            self.prefix += 1;
            while !self.ahead.is_empty() && self.ahead.remove(&self.prefix) {
                self.prefix += 1;
            }
        } else if seq > self.prefix {
            self.ahead.insert(seq);
        }
        match self.slots[i] {
            Some((s, _)) if s > seq => Some(seq),
            old => {
                self.slots[i] = Some((seq, fp));
                old.map(|(s, _)| s).filter(|s| *s != seq)
            }
        }
    }
}

impl Engine {
    /// Registers a group this rank belongs to; messages that arrived for it early are handled
    /// now.
    pub fn add_group(&mut self, info: GroupInfo, now: Time) {
        let id = info.id;
        let (window, budget) = (info.options.window, info.options.peer_budget_bytes);
        let landings = &self.landings;
        let lateness = Lateness::new(info.rank, info.members.len());
        self.groups.entry(id).or_insert_with(|| Group {
            info,
            aborted: None,
            heard: false,
            active: FastMap::default(),
            unexpected: HashMap::new(),
            done: DoneCalls::default(),
            device_open: BTreeSet::new(),
            forgotten_below: 0,
            p2p_send_seq: FastMap::default(),
            p2p_recv_seq: FastMap::default(),
            p2p_arrived: BTreeMap::new(),
            p2p_posted: Vec::new(),
            p2p_mail: FastMap::default(),
            flow: Flow::new(window, budget),
            p2p_flow: P2pFlow::new(window.min(super::p2p_flow::P2P_WINDOW), budget),
            left: Vec::new(),
            failed: BTreeMap::new(),
            board: FastMap::default(),
            board_inquiries: FastMap::default(),
            board_verdicts: FastMap::default(),
            made: landings.made_mark(id),
            lateness,
        });
        for m in self.orphans.remove(&id).unwrap_or_default() {
            self.unorphan(&m);
            self.handle_message(m, now);
        }
        self.abort_if_lost(id);
    }

    /// Who came last to the group's calls that completed through the engine, as this rank saw
    /// them (`crate::lateness`; `None`: not a group of this rank).
    pub fn lateness(&self, id: GroupId) -> Option<&LatenessSummary> {
        self.groups.get(&id).map(|g| g.lateness.summary())
    }

    /// Every group of this rank with who came last to its calls (as
    /// [`lateness`](Self::lateness)), in no particular order.
    pub fn lateness_all(&self) -> impl Iterator<Item = (&GroupInfo, &LatenessSummary)> {
        self.groups
            .values()
            .map(|g| (&g.info, g.lateness.summary()))
    }

    /// The group, if registered.
    pub fn group(&self, id: GroupId) -> Option<&GroupInfo> {
        self.groups.get(&id).map(|g| &g.info)
    }

    /// How many of the group's collective calls completed on this rank without a gap: calls
    /// `0..n` (by sequence number) all did (`None`: not a group of this rank). A failed call
    /// ends the prefix. A call on the NCCL path completes when its device operation does
    /// ([`device_done`](Self::device_done)), not when its host agreement step does. This is
    /// this rank's part of the survivors' agreement on what completed everywhere
    /// (`recovery::Agreement`).
    pub fn completed_calls(&self, id: GroupId) -> Option<u64> {
        self.groups.get(&id).map(|g| {
            let prefix = g.done.prefix();
            g.device_open.first().map_or(prefix, |&s| s.min(prefix))
        })
    }

    /// Call `seq` of group `gid`, on the NCCL path, finished its device operation: it counts
    /// as completed from now on (see [`completed_calls`](Self::completed_calls)). Its host
    /// step finished before (the device operation starts after it).
    pub fn device_done(&mut self, gid: GroupId, seq: u64) {
        if let Some(g) = self.groups.get_mut(&gid) {
            g.device_open.remove(&seq);
        }
    }

    /// Why the group was aborted, if it was.
    pub fn aborted(&self, id: GroupId) -> Option<&Error> {
        self.groups.get(&id).and_then(|g| g.aborted.as_ref())
    }

    /// The group's *pending error*: it was aborted (a mismatch, a timeout or a lost peer
    /// seen here or by another member) after this rank's calls on it had completed, and no
    /// call of this rank has failed with it since. The group's next call that reaches the
    /// engine fails with it ([`Error::GroupAborted`]); this is how a rank whose calls
    /// finished early (a broadcast root, a send) learns of a failure it caused or shared. An
    /// abort by this rank's own shutdown is not one.
    pub fn pending_error(&self, id: GroupId) -> Option<Error> {
        let g = self.groups.get(&id)?;
        match &g.aborted {
            Some(cause) if !g.heard && *cause != Error::Shutdown => Some(Error::GroupAborted {
                group: id,
                cause: Box::new(cause.root_cause().clone()),
            }),
            _ => None,
        }
    }

    /// Every group's [pending error](Self::pending_error), in group order.
    pub fn pending_errors(&self) -> Vec<Error> {
        let mut ids: Vec<GroupId> = self.groups.keys().copied().collect();
        ids.sort_unstable();
        ids.into_iter()
            .filter_map(|id| self.pending_error(id))
            .collect()
    }

    /// Releases group `id` on this rank (torch's `destroy_process_group`; local, not
    /// collective) and returns its [pending error](Self::pending_error), if any. Calls still
    /// in flight on it fail with [`Error::Shutdown`], and every other member is told, as at a
    /// shutdown (their part of those calls can never complete); later calls on it fail with
    /// [`Error::InvalidArgument`], and messages for it are dropped.
    pub fn destroy_group(&mut self, id: GroupId) -> Result<()> {
        if self.destroyed.contains(&id) {
            return Err(Error::invalid(format!(
                "group {id} was already destroyed on this rank"
            )));
        }
        let pending = self.pending_error(id);
        let Some(g) = self.groups.get(&id) else {
            return Err(Error::NotAMember {
                group: id,
                rank: self.rank,
            });
        };
        let in_flight: Vec<OpId> = self
            .ops
            .iter()
            .filter(|(_, op)| op.group == id)
            .map(|(&op, _)| op)
            .collect();
        if !in_flight.is_empty() || g.flow.held() + g.p2p_flow.held() > 0 {
            for op_id in in_flight {
                if let Some(op) = self.ops.remove(&op_id) {
                    self.forget(&op, op_id);
                    self.events.push_back(Event {
                        op: op_id,
                        result: Err(Error::Shutdown),
                    });
                }
            }
            self.tell_shutdown(id);
        } else {
            // Nothing in flight: the other members hear that this rank left (their calls
            // that need it fail at once instead of at their timeout).
            self.tell_left(id);
        }
        self.groups.remove(&id);
        self.landings.drop_group(id);
        self.board_changed();
        // (No orphans to drop: a registered group adopted its orphans when it was added.)
        self.destroyed.insert(id);
        match pending {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{DoneCalls, DONE_KEPT};
    use crate::ids::Fingerprint;
    use crate::op::OpKind;
    use crate::tensor::dtype::DType;

    fn fp(count: u64) -> Fingerprint {
        Fingerprint {
            count: Some(count),
            ..Fingerprint::new(OpKind::AllReduce, DType::F32)
        }
    }

    #[test]
    fn finished_calls_are_kept_until_a_call_kept_calls_later_takes_their_slot() {
        let k = DONE_KEPT as u64;
        let mut done = DoneCalls::default();
        assert_eq!(done.latest(), None);
        assert_eq!(done.prefix(), 0);
        for seq in 0..k {
            assert_eq!(
                done.insert(seq, Some(fp(seq))),
                None,
                "nothing forgotten yet"
            );
        }
        assert_eq!(done.get(5), Some(fp(5)));
        assert_eq!(done.latest(), Some(k - 1));
        assert_eq!(done.prefix(), k, "every call up to k - 1 finished");
        // Out of order: a later call finishes before an earlier one.
        assert_eq!(
            done.insert(k + 1, Some(fp(k + 1))),
            Some(1),
            "call 1 is forgotten"
        );
        assert!(!done.contains(1));
        assert_eq!(done.insert(k, Some(fp(k))), Some(0));
        assert_eq!(done.get(k), Some(fp(k)));
        assert_eq!(done.latest(), Some(k + 1));
        assert_eq!(done.prefix(), k + 2, "call k closed the gap");
        // A call older than the one in its slot is forgotten at once, never the newer one.
        assert_eq!(done.insert(1, Some(fp(1))), Some(1));
        assert_eq!(done.get(k + 1), Some(fp(k + 1)));
        assert_eq!(done.get(1), None);
        assert_eq!(
            done.get(2 * k + 2),
            None,
            "not finished: its slot holds another call"
        );
    }

    #[test]
    fn a_call_that_finishes_after_more_than_the_ring_of_later_ones_still_closes_its_gap() {
        let k = DONE_KEPT as u64;
        let mut done = DoneCalls::default();
        // Call 0 stays open while calls 1..=k + 900 finish: calls k..=k + 900 take the slots
        // of call 0 and of calls 1..=900.
        for seq in 1..=k + 900 {
            done.insert(seq, Some(fp(seq)));
        }
        assert_eq!(done.prefix(), 0, "call 0 is still open");
        assert_eq!(
            done.insert(0, Some(fp(0))),
            Some(0),
            "its slot holds call k"
        );
        assert_eq!(done.prefix(), k + 901, "every call up to k + 900 finished");
        // The ahead set is empty again: nothing past the prefix finished.
        assert!(done.ahead.is_empty());
    }
}
