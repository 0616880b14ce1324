//! Where a rank's groups get their boards: the memory their small calls run in
//! (`collectix_runtime::board`, driven by `rank::driver::board`).
//!
//! A group runs small calls on a board only if every member can read every other member's
//! lane; the answer must be the same on every member, or the members would take different
//! paths for the same call. The ranks of one process ([`LocalBoards`]) share heap lanes, one
//! set per group, made by the first member that asks, for the groups that fit the machine's
//! cores (`collectix_runtime::board::fits`). Setting `COLLECTIX_BOARD=0` turns the boards off
//! (every call goes through the engine), for comparison.

use crate::rank::driver::{GroupBoard, GroupMail, MailPeer, Signal, Wake};
use crate::sync::lock;
use collectix_runtime::board::mail::{mailbox_words, Mailboxes, MAIL_MEMBERS};
use collectix_runtime::board::{Board, HeapLane, Lane};
use collectix_runtime::{GroupId, GroupInfo};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

/// Where a rank's groups get their boards.
pub(crate) trait BoardSource: Send + Sync {
    /// Member `info.rank`'s board of group `info`, or `None`: the group's calls all go
    /// through the engine. Every member of a group gets the same answer.
    fn board(&self, info: &GroupInfo) -> Option<Arc<GroupBoard>>;
}

/// Whether boards are on (`COLLECTIX_BOARD`, on unless `0`).
pub(crate) fn enabled() -> bool {
    std::env::var("COLLECTIX_BOARD").map_or(true, |v| v.trim() != "0")
}

/// The boards of the ranks of one process (a [`World`](crate::World)): heap lanes.
pub(crate) struct LocalBoards {
    state: Mutex<LocalState>,
    /// The machine's cores: which groups get a board (`board::fits`).
    cores: usize,
}

/// A group's members (global ranks), their lanes and their mailboxes (none for a group
/// larger than `MAIL_MEMBERS`).
type Lanes = (Vec<usize>, Vec<Arc<dyn Lane>>, Vec<Arc<dyn Lane>>);

struct LocalState {
    /// Each group's members and lanes.
    groups: HashMap<GroupId, Lanes>,
    /// Each rank's signal (its live incarnation's).
    signals: Vec<Arc<Signal>>,
    /// Groups that had a rank that was restarted: its new incarnation gets no board on them
    /// (its calls there go to the engine, which refuses them as on any group it lost), and
    /// nobody reuses their lanes.
    retired: HashSet<GroupId>,
}

impl LocalBoards {
    /// The boards of ranks whose signals are `signals` (by global rank), on a machine of
    /// `cores` cores (the groups too large for it go through the engine).
    pub(crate) fn new(signals: Vec<Arc<Signal>>, cores: usize) -> Arc<LocalBoards> {
        Arc::new(LocalBoards {
            state: Mutex::new(LocalState {
                groups: HashMap::new(),
                signals,
                retired: HashSet::new(),
            }),
            cores,
        })
    }

    /// Rank `r` was restarted; its new incarnation's signal is `signal`.
    pub(crate) fn restarted(&self, r: usize, signal: Arc<Signal>) {
        let mut s = lock(&self.state);
        if let Some(slot) = s.signals.get_mut(r) {
            *slot = signal;
        }
        let gone: Vec<GroupId> = s
            .groups
            .iter()
            .filter(|(_, (members, _, _))| members.contains(&r))
            .map(|(id, _)| *id)
            .collect();
        for id in gone {
            s.groups.remove(&id);
            s.retired.insert(id);
        }
    }
}

impl BoardSource for LocalBoards {
    fn board(&self, info: &GroupInfo) -> Option<Arc<GroupBoard>> {
        // The same answer on every member: one value for the whole world.
        if !collectix_runtime::board::fits(info.members.len(), self.cores) {
            return None;
        }
        let mut s = lock(&self.state);
        if s.retired.contains(&info.id) {
            return None;
        }
        let wake: Vec<Option<Arc<dyn Wake>>> = info
            .members
            .iter()
            .enumerate()
            .map(|(m, &g)| {
                let w = s.signals.get(g)?.clone();
                (m != info.rank).then_some(w as Arc<dyn Wake>)
            })
            .collect();
        let peers = info
            .members
            .iter()
            .enumerate()
            .map(|(m, &g)| {
                (m != info.rank)
                    .then(|| s.signals.get(g).cloned().map(MailPeer::Rank))
                    .flatten()
            })
            .collect();
        let (members, lanes, boxes) = s.groups.entry(info.id).or_insert_with(|| {
            let n = info.members.len();
            let lanes = (0..n)
                .map(|_| Arc::new(HeapLane::default()) as Arc<dyn Lane>)
                .collect();
            let boxes = if n <= MAIL_MEMBERS {
                (0..n)
                    .map(|_| Arc::new(HeapLane::with_words(mailbox_words(n))) as Arc<dyn Lane>)
                    .collect()
            } else {
                Vec::new()
            };
            (info.members.to_vec(), lanes, boxes)
        });
        if members[..] != info.members[..] {
            // Two groups with one id and other members: never made by collectix.
            return None;
        }
        let board = Board::new(lanes.clone(), info.rank).ok()?;
        let mail = Mailboxes::new(boxes.clone(), info.rank).map(|b| GroupMail::new(b, peers));
        Some(Arc::new(GroupBoard::new(board, info.clone(), wake, mail)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use collectix_runtime::GroupOptions;

    /// A group gets a board only up to the world's size limit, the same on every member.
    #[test]
    fn a_group_larger_than_the_limit_goes_through_the_engine() {
        let signals = (0..9).map(|_| Arc::new(Signal::default())).collect();
        let boards = LocalBoards::new(signals, 1);
        let info = |members: Vec<usize>, me: usize| {
            let id = GroupId::derive(GroupId::WORLD, members.len() as u64, &[]);
            GroupInfo::new(id, members, me, GroupOptions::default())
                .unwrap_or_else(|e| panic!("{e}"))
        };
        for me in 0..8 {
            assert!(boards.board(&info((0..8).collect(), me)).is_some(), "{me}");
        }
        for me in 0..9 {
            assert!(boards.board(&info((0..9).collect(), me)).is_none(), "{me}");
        }
    }
}
