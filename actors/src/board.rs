//! Where a rank's groups get their boards: the memory their small calls run in
//! (`collectix_runtime::board`, driven by `rank::driver::board`).
//!
//! A group runs small calls on a board only if every member can read every other member's
//! lane; the answer must be the same on every member, or the members would take different
//! paths for the same call. The ranks of one process ([`LocalBoards`]) share heap lanes, one
//! set per group, made by the first member that asks. Setting `COLLECTIX_BOARD=0` turns the
//! boards off (every call goes through the engine), for comparison.

use crate::rank::driver::{GroupBoard, Signal, Wake};
use crate::sync::lock;
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
}

/// A group's members (global ranks) and their lanes.
type Lanes = (Vec<usize>, Vec<Arc<dyn Lane>>);

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
    /// The boards of ranks whose signals are `signals` (by global rank).
    pub(crate) fn new(signals: Vec<Arc<Signal>>) -> Arc<LocalBoards> {
        Arc::new(LocalBoards {
            state: Mutex::new(LocalState {
                groups: HashMap::new(),
                signals,
                retired: HashSet::new(),
            }),
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
            .filter(|(_, (members, _))| members.contains(&r))
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
        let (members, lanes) = s.groups.entry(info.id).or_insert_with(|| {
            let lanes = info
                .members
                .iter()
                .map(|_| Arc::new(HeapLane::default()) as Arc<dyn Lane>)
                .collect();
            (info.members.clone(), lanes)
        });
        if *members != info.members {
            // Two groups with one id and other members: never made by collectix.
            return None;
        }
        let board = Board::new(lanes.clone(), info.rank).ok()?;
        Some(Arc::new(GroupBoard::new(board, info.clone(), wake)))
    }
}
