//! Calls that failed on one member before they started. A rank whose part of a collective
//! fails its argument checks (a root out of range, sizes that cannot work) still takes the
//! call's sequence number and tells the group's other members (`Header::Failed`, sent
//! through flow control like a message of the call). Their parts fail at once with
//! [`Error::CallFailed`] instead of at their timeout, and the group goes on with the next
//! call, on every member alike. Each member records the call as ended, without a fingerprint,
//! so that messages of it still on their way are dropped rather than checked.
//!
//! A member whose part of that call had already completed (a broadcast root, which needs
//! nothing from the others) keeps its result: as when a peer fails for any other reason, a
//! call can succeed on one rank and fail on another (the survivors' agreement on what
//! completed, `recovery`, is the way to learn which calls completed everywhere).

use super::{Engine, Event};
use crate::error::{Error, ProtocolError};
use crate::ids::GroupId;
use crate::wire::message::{Header, Message, Transmit};

impl Engine {
    /// This rank's part of collective call `seq` of group `gid` failed before it started:
    /// `why` is the error its caller got. The call takes its sequence number (the next call
    /// is `seq + 1` here, as on every member), and every other member is told, so that its
    /// part fails with [`Error::CallFailed`]. Nothing happens on a group that is aborted or
    /// not registered here (the members hear of those otherwise), or for a sequence number
    /// already used.
    pub fn fail_call(&mut self, gid: GroupId, seq: u64, why: &Error) {
        let Some(g) = self.groups.get_mut(&gid) else {
            return;
        };
        if g.aborted.is_some()
            || g.active.contains_key(&seq)
            || g.done.contains(seq)
            || seq < g.forgotten_below
        {
            return;
        }
        tracing::debug!(rank = self.rank, group = %gid, seq, error = %why, "call failed before it started; telling the group");
        let mut out = Vec::new();
        g.flow.on_made(seq, &mut out);
        g.failed.remove(&seq);
        let reason = why.to_string();
        let me = self.rank;
        for peer in (0..g.info.size()).filter(|&p| p != g.info.rank) {
            let t = Transmit {
                dst: g.info.global(peer),
                msg: Message {
                    src: me,
                    header: Header::Failed {
                        group: gid,
                        seq,
                        reason: reason.clone(),
                    },
                    payload: Vec::new(),
                },
            };
            g.flow.send(peer, seq, 0, t, &mut out);
        }
        self.end_failed(gid, seq);
        self.emit(gid, out);
    }

    /// Member `from` (global; `src` in the group) says its part of call `seq` failed before
    /// it started, because of `reason`: this rank's part fails with [`Error::CallFailed`]
    /// now if it is in flight, or when it is made; a part that already completed here is
    /// left alone. The marker is a credit of the call, as a data message of it is.
    pub(super) fn on_failed(
        &mut self,
        gid: GroupId,
        src: usize,
        from: usize,
        seq: u64,
        reason: String,
    ) {
        let Some(g) = self.groups.get_mut(&gid) else {
            return;
        };
        if !g.flow.admits(seq) {
            // A conforming peer sends the marker through its flow control.
            let err = Error::Protocol {
                rank: from,
                detail: ProtocolError::Window { seq },
            };
            self.abort(gid, err, None, true);
            return;
        }
        let mut out = Vec::new();
        g.flow.on_credit(src, seq.saturating_add(1), &mut out);
        self.emit(gid, out);
        let Some(g) = self.groups.get_mut(&gid) else {
            return;
        };
        tracing::debug!(rank = self.rank, group = %gid, seq, peer = from, %reason, "a member's part of a call failed before it started");
        if let Some(&id) = g.active.get(&seq) {
            let err = Error::CallFailed {
                group: gid,
                seq,
                rank: from,
                reason,
            };
            if let Some(op) = self.ops.remove(&id) {
                self.forget(&op, id);
            }
            self.end_failed(gid, seq);
            self.events.push_back(Event {
                op: id,
                result: Err(err),
            });
        } else if !g.done.contains(seq) && seq >= g.forgotten_below {
            // Not made here yet: it fails when it is. The window bounds these records (a
            // marker beyond it was refused above); a stale one goes first.
            let keep = usize::try_from(g.info.options.window.max(1))
                .unwrap_or(usize::MAX)
                .saturating_mul(2);
            g.failed.entry(seq).or_insert((from, reason));
            super::bump(&self.board_epoch);
            while g.failed.len() > keep {
                g.failed.pop_first();
            }
        }
    }

    /// If a member said call `seq` of group `gid` failed before it started, the error this
    /// rank's part of it fails with, now that it is being made (the call is recorded as
    /// ended and takes its sequence number, as [`fail_call`](Self::fail_call) does).
    pub(super) fn failed_elsewhere(&mut self, gid: GroupId, seq: u64) -> Option<Error> {
        let g = self.groups.get_mut(&gid)?;
        let (rank, reason) = g.failed.remove(&seq)?;
        let mut out = Vec::new();
        g.flow.on_made(seq, &mut out);
        self.end_failed(gid, seq);
        self.emit(gid, out);
        Some(Error::CallFailed {
            group: gid,
            seq,
            rank,
            reason,
        })
    }

    /// Records call `seq` of group `gid` as ended by a failure before it started, and drops
    /// what arrived early for it.
    fn end_failed(&mut self, gid: GroupId, seq: u64) {
        let Some(g) = self.groups.get_mut(&gid) else {
            return;
        };
        if let Some(s) = g.done.insert(seq, None) {
            g.forgotten_below = g.forgotten_below.max(s + 1);
        }
        g.unexpected.remove(&seq);
    }
}
