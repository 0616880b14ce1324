//! The group registry: the groups this rank belongs to, each with its calls in flight, its
//! early and completed calls' records, its point-to-point queues and its flow control; and
//! the messages kept for groups not created here yet.

use super::flow::Flow;
use super::p2p_flow::P2pFlow;
use super::{Engine, Event, OpId};
use crate::error::{Error, Result};
use crate::fast_hash::FastMap;
use crate::group::{GroupId, GroupInfo};
use crate::ids::Fingerprint;
use crate::time::Time;
use crate::wire::message::{Message, Transmit};
use std::collections::{BTreeMap, HashMap};

pub(super) struct Group {
    pub(super) info: GroupInfo,
    pub(super) aborted: Option<Error>,
    /// Whether a call of this rank on the group has failed since it was aborted, so that the
    /// user heard of the failure; an abort nobody heard of is the group's *pending error*.
    pub(super) heard: bool,
    pub(super) active: FastMap<u64, OpId>,
    pub(super) unexpected: HashMap<u64, Vec<Message>>,
    pub(super) done: BTreeMap<u64, Fingerprint>,
    pub(super) forgotten_below: u64,
    pub(super) p2p_send_seq: HashMap<(usize, u32), u64>,
    pub(super) p2p_recv_seq: HashMap<(usize, u32), u64>,
    /// (src, tag, seq) → (arrival number, message).
    pub(super) p2p_arrived: BTreeMap<(usize, u32, u64), (u64, Message)>,
    pub(super) p2p_posted: Vec<OpId>,
    /// The window of calls per peer (see [`crate::engine::flow`]).
    pub(super) flow: Flow<Transmit>,
    /// Point-to-point flow control (see [`crate::engine::p2p_flow`]): a window of eager messages
    /// per peer over all tags, and grants from posted receives. A peer can so make this rank
    /// buffer at most a window of its messages, whatever tags it uses and whatever receives
    /// are posted for other ranks (issue 7: credit was counted per tag, and receives posted
    /// for one rank granted credit to all).
    pub(super) p2p_flow: P2pFlow,
}

impl Engine {
    /// Registers a group this rank belongs to; messages that arrived for it early are handled
    /// now.
    pub fn add_group(&mut self, info: GroupInfo, now: Time) {
        let id = info.id;
        let (window, budget) = (info.options.window, info.options.peer_budget_bytes);
        self.groups.entry(id).or_insert_with(|| Group {
            info,
            aborted: None,
            heard: false,
            active: FastMap::default(),
            unexpected: HashMap::new(),
            done: BTreeMap::new(),
            forgotten_below: 0,
            p2p_send_seq: HashMap::new(),
            p2p_recv_seq: HashMap::new(),
            p2p_arrived: BTreeMap::new(),
            p2p_posted: Vec::new(),
            flow: Flow::new(window, budget),
            p2p_flow: P2pFlow::new(window, budget),
        });
        for m in self.orphans.remove(&id).unwrap_or_default() {
            self.unorphan(&m);
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
        }
        self.groups.remove(&id);
        // (No orphans to drop: a registered group adopted its orphans when it was added.)
        self.destroyed.insert(id);
        match pending {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}
