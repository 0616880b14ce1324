//! The group registry: the groups this rank belongs to, each with its calls in flight, its
//! early and completed calls' records, its point-to-point queues and its flow control; and
//! the messages kept for groups not created here yet.

use super::flow::Flow;
use super::p2p_flow::P2pFlow;
use super::{Engine, OpId};
use crate::error::Error;
use crate::group::{GroupId, GroupInfo};
use crate::ids::Fingerprint;
use crate::time::Time;
use crate::wire::message::{Message, Transmit};
use std::collections::{BTreeMap, HashMap};

pub(super) struct Group {
    pub(super) info: GroupInfo,
    pub(super) aborted: Option<Error>,
    pub(super) active: HashMap<u64, OpId>,
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
}
