//! Calls on the board in the simulator ([`Sim::with_boards`]): each group has a board in heap
//! lanes that its members share, and each member a [`Queue`] of its calls on it, moved on as
//! the actors crate's driver moves them: a call that can run on the board is made there
//! ([`Queue::submit`]), an engine call first looks for a member's slot of its sequence number
//! ([`Board::clash`]), and after every event of the run each member publishes and ends what
//! it can ([`Queue::step`], the records to its engine) and judges its first waiting call
//! ([`Queue::judge`]: an abort, a refusal, a deadline and its desync report). Board
//! deadlines are events of the run like the engines' own.

use super::trace::TraceEvent;
use super::Sim;
use crate::board::queue::Queue;
use crate::board::{Board, BoardCall, HeapLane, Lane};
use crate::collective::Request;
use crate::engine::{BoardEvent, OpId};
use crate::error::{Error, Result};
use crate::group::{CallOptions, GroupId, GroupInfo};
use crate::time::Time;
use std::collections::BTreeMap;
use std::sync::Arc;

/// The ids of calls on a board: the engines' ids count up from 0, these from here.
const BOARD_OPS: u64 = 1 << 62;

/// A group's board, and each member's calls on it.
pub(super) struct SimBoard {
    /// Per member (group rank): its view of the board, its queue, its earliest deadline.
    members: Vec<(Board, Queue<OpId>, Option<Time>)>,
    /// Each member's global rank.
    ranks: Vec<usize>,
}

/// The boards of a simulation with boards on.
#[derive(Default)]
pub(super) struct SimBoards {
    groups: BTreeMap<GroupId, SimBoard>,
    next_op: u64,
}

impl SimBoard {
    fn new(info: &GroupInfo) -> Result<SimBoard> {
        let n = info.size();
        let lanes: Vec<Arc<dyn Lane>> = (0..n)
            .map(|_| Arc::new(HeapLane::default()) as Arc<dyn Lane>)
            .collect();
        let members = (0..n)
            .map(|m| Ok((Board::new(lanes.clone(), m)?, Queue::new(n), None)))
            .collect::<Result<_>>()?;
        Ok(SimBoard {
            members,
            ranks: info.members.to_vec(),
        })
    }
}

impl Sim {
    /// Turns boards on: every group gets a board, and a call that runs on one (a small
    /// all_reduce, broadcast, reduce or barrier with no algorithm forced, as in a world of
    /// one process) runs there.
    pub fn with_boards(mut self) -> Sim {
        self.boards = Some(SimBoards::default());
        self
    }

    /// Whether call `op` did not run on the engine (it ran on a board, or met a member's slot
    /// on one before it reached the engine).
    pub fn off_the_engine(&self, op: OpId) -> bool {
        op.0 >= BOARD_OPS
    }

    /// Calls waiting on rank `rank`'s boards.
    pub fn board_pending(&self, rank: usize) -> usize {
        let Some(b) = &self.boards else {
            return 0;
        };
        b.groups
            .values()
            .flat_map(|sb| sb.members.iter().zip(&sb.ranks))
            .filter(|(_, &r)| r == rank)
            .map(|((_, q, _), _)| q.len())
            .sum()
    }

    /// Submits `req` on the board of `info`'s group if it runs there (boards on, and
    /// [`BoardCall::of`] says so): `Some` with the call's id, or its argument error.
    pub(super) fn submit_on_board(
        &mut self,
        rank: usize,
        info: &GroupInfo,
        req: &Request,
        opts: &CallOptions,
    ) -> Option<Result<OpId>> {
        self.boards.as_ref()?;
        let call = match BoardCall::of(req, info, opts)? {
            Ok(c) => c,
            Err(e) => return Some(Err(e)),
        };
        let gid = info.id;
        let seq = self.next_seq(rank, gid);
        let now = self.now;
        let deadline = now + opts.timeout.unwrap_or(info.options.timeout);
        let id = self.board_op_id();
        let boards = self.boards.as_mut()?;
        let sb = match boards.groups.entry(gid) {
            std::collections::btree_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::btree_map::Entry::Vacant(v) => match SimBoard::new(info) {
                Ok(sb) => v.insert(sb),
                Err(e) => return Some(Err(e)),
            },
        };
        let member = sb.members.get_mut(info.rank)?;
        let engine = self.engines.get_mut(rank)?;
        let made = member.1.submit(engine, gid, seq, call, false, id, deadline);
        if let Err((id, e)) = made {
            self.complete(rank, id, Err(e));
        }
        self.drain(rank);
        self.step_boards();
        Some(Ok(id))
    }

    /// An engine call `fp` of `info`'s group at `seq` on `rank` meets a member's slot of
    /// `seq` on the board: the mismatch, which aborts the group (as the driver's `clash`).
    pub(super) fn clash_on_board(
        &mut self,
        rank: usize,
        info: &GroupInfo,
        seq: u64,
        fp: crate::ids::Fingerprint,
    ) -> Option<Error> {
        let sb = self.boards.as_ref()?.groups.get(&info.id)?;
        let e = sb.members.get(info.rank)?.0.clash(info, seq, fp)?;
        let event = BoardEvent::Clash {
            seq,
            error: e.clone(),
        };
        self.engines.get_mut(rank)?.board(info.id, event);
        self.drain(rank);
        Some(e)
    }

    /// An id for a call that the engine does not run (on a board, or ended before it).
    pub(super) fn board_op_id(&mut self) -> OpId {
        let boards = self.boards.get_or_insert_with(SimBoards::default);
        boards.next_op += 1;
        OpId(BOARD_OPS + boards.next_op - 1)
    }

    /// Records a call's result.
    pub(super) fn complete(&mut self, rank: usize, op: OpId, r: Result<crate::Output>) {
        self.log(TraceEvent::Done {
            rank,
            op,
            error: r.as_ref().err().cloned(),
        });
        self.completed_at.insert((rank, op), self.now);
        self.results.insert((rank, op), r);
    }

    /// Moves every live member's calls on every board on, as its driver does after a run,
    /// until nothing moves.
    pub(super) fn step_boards(&mut self) {
        let Some(mut boards) = self.boards.take() else {
            return;
        };
        loop {
            let mut moved = false;
            for (gid, sb) in boards.groups.iter_mut() {
                for ((board, queue, next), &rank) in sb.members.iter_mut().zip(&sb.ranks) {
                    if queue.is_empty() || self.dead.contains(&rank) {
                        continue;
                    }
                    let Some(info) = self.groups.get(&(rank, *gid)).cloned() else {
                        continue;
                    };
                    let now = self.now;
                    let (mut out, mut records) = (Vec::new(), Vec::new());
                    let (stepped, _) = queue.step(board, &info, &|| now, &mut out, &mut records);
                    let engine = &mut self.engines[rank];
                    for r in records {
                        engine.board(*gid, BoardEvent::Record(r));
                    }
                    let judged = queue.judge(board, &info, engine, false, now);
                    *next = judged.next;
                    moved |= stepped || !judged.ended.is_empty();
                    for (id, r) in out {
                        self.complete(rank, id, r);
                    }
                    for e in judged.ended {
                        if let Some(id) = e.waiting {
                            self.complete(rank, id, Err(e.error));
                        }
                    }
                    self.drain(rank);
                }
            }
            if !moved {
                break;
            }
        }
        self.boards = Some(boards);
    }

    /// The earliest deadline of a live member's call on a board.
    pub(super) fn board_deadline(&self) -> Option<Time> {
        let boards = self.boards.as_ref()?;
        boards
            .groups
            .values()
            .flat_map(|sb| {
                sb.members
                    .iter()
                    .zip(&sb.ranks)
                    .filter(|(_, r)| !self.dead.contains(r))
                    .filter_map(|((_, q, next), _)| next.filter(|_| !q.is_empty()))
            })
            .min()
    }
}
