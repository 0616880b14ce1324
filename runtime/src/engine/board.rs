//! Calls that run outside the engine, on the board of small calls ([`crate::board`]): they
//! take their sequence numbers in the group's order like any call, and the engine keeps
//! their records — made (flow control's credit), finished (the gapless prefix the survivors
//! of a failure agree on), or failed (the group is aborted and its members told) — so that
//! the calls around them, and recovery, cannot tell them apart from the engine's own.

use super::Engine;
use crate::board::ran::Ran;
use crate::error::{Error, RankCall};
use crate::group::GroupId;
use crate::ids::Fingerprint;
use crate::time::Time;
use crate::wire::message::{Header, Message, Transmit};
use std::collections::BTreeMap;
use std::time::Duration;

/// A desync report on a call on the board that passed its deadline (as an engine call's,
/// `PendingCall::inquiry`): the call, the members whose slots it still needed, the answers.
pub(super) struct BoardInquiry {
    fp: Fingerprint,
    missing: Vec<usize>,
    replies: BTreeMap<usize, RankCall>,
    /// As an engine call's (`failure::Inquiry`): probes sent, and a member that has not
    /// made the call has calls in flight elsewhere (the report then waits for its grace).
    probing: bool,
    elsewhere: bool,
}

/// How a call on the board ended, for the engine's records ([`BoardEvent::Record`]).
#[derive(Debug)]
pub enum Record {
    /// Finished at the time given (the flight recorder's end); if it waited for a member's
    /// slot, the last member it waited for and how long (`crate::lateness`).
    Finished(u64, Fingerprint, Time, Option<(usize, Duration)>),
    /// Failed (boxed: an error is large, and records are moved about).
    Failed(u64, Box<Error>),
    /// Gave its caller its result, and was then found to disagree with a member's call (the
    /// look a call owes once published): the group is aborted, and the error is the rank's
    /// pending error.
    Disagreed(u64, Box<Error>),
}

impl Record {
    /// Whether the call failed (the group must be aborted at once).
    pub fn failed(&self) -> bool {
        matches!(self, Record::Failed(..) | Record::Disagreed(..))
    }
}

/// What a member tells its engine of its calls on a board ([`Engine::board`]): the board's
/// one input to the engine. The engine's answers to it, and to the desync reports and
/// verdicts of [`Queue::judge`](crate::board::queue::Queue::judge), leave as its own: the
/// messages of [`poll_transmit`](Engine::poll_transmit) (an abort, an inquiry), and the
/// errors the calls get.
#[derive(Debug)]
pub enum BoardEvent<'a> {
    /// Call `seq` (`fp`) is made on the board: the engine records it as made (flow control's
    /// credit, the desync report), or says why it cannot run (this rank is shutting down,
    /// the group is not this rank's or was aborted, a member left, a member's part failed
    /// before it started, a member's message for it came: the calls differ).
    Made {
        /// Its sequence number in the group.
        seq: u64,
        /// Its fingerprint.
        fp: Fingerprint,
    },
    /// Calls that ran on a caller's quick path from start to finish before the engine heard
    /// of them (checked with [`Engine::board_clear`]), taken (emptied).
    Ran(&'a mut Ran),
    /// A queued call ended: finished, failed, or found to disagree after its caller had its
    /// result ([`Queue::step`](crate::board::queue::Queue::step)).
    Record(Record),
    /// An engine call at `seq` met a member's call on the board (`error`, the mismatch): the
    /// group is aborted and its members told.
    Clash {
        /// The sequence number of both calls.
        seq: u64,
        /// The mismatch.
        error: Error,
    },
}

impl Engine {
    /// The board's input to the engine (see [`BoardEvent`]) for group `gid`: for
    /// [`BoardEvent::Made`], why the call cannot run, if it cannot; `None` for the others.
    pub fn board(&mut self, gid: GroupId, event: BoardEvent<'_>) -> Option<Error> {
        match event {
            BoardEvent::Made { seq, fp } => self
                .board_refusal(gid, seq)
                .or_else(|| self.board_made(gid, seq, fp)),
            BoardEvent::Ran(ran) => {
                self.board_ran(gid, ran.each());
                ran.clear();
                None
            }
            BoardEvent::Record(Record::Finished(seq, fp, _, late)) => {
                self.board_finished(gid, seq, fp, late);
                None
            }
            BoardEvent::Record(Record::Failed(seq, e)) => {
                self.board_failed(gid, seq, *e);
                None
            }
            BoardEvent::Record(Record::Disagreed(seq, e)) => {
                self.board_disagreed(gid, seq, *e);
                None
            }
            BoardEvent::Clash { seq, error } => {
                self.board_failed(gid, seq, error);
                None
            }
        }
    }

    /// Why call `seq` of group `gid` cannot run (the error its caller gets), checked when it
    /// is made and while it waits: this rank is shutting down, the group is not one of this
    /// rank's or was aborted, a member left before the call, or a member's part of it failed
    /// before it started. `None`: it may go on.
    pub(crate) fn board_refusal(&mut self, gid: GroupId, seq: u64) -> Option<Error> {
        let e = self.refusal(gid, seq)?;
        if let Some(g) = self.groups.get_mut(&gid) {
            g.board.remove(&seq);
        }
        Some(e)
    }

    /// [`board_refusal`](Self::board_refusal) for call `seq` of group `gid` made on the
    /// board and still waiting: a group destroyed on this rank since ends it with
    /// `Shutdown`, as `destroy` ends the engine's calls in flight (a call made after the
    /// destroy is refused with `InvalidArgument`).
    pub(crate) fn board_waiting_refusal(&mut self, gid: GroupId, seq: u64) -> Option<Error> {
        if !self.groups.contains_key(&gid) && self.destroyed.contains(&gid) {
            return Some(Error::Shutdown);
        }
        self.board_refusal(gid, seq)
    }

    fn refusal(&mut self, gid: GroupId, seq: u64) -> Option<Error> {
        if let Some(g) = self.groups.get_mut(&gid) {
            if let Some(e) = g.board_verdicts.remove(&seq) {
                g.heard = true;
                return Some(e);
            }
        }
        if self.closing.is_some() {
            return Some(Error::Shutdown);
        }
        let Some(g) = self.groups.get_mut(&gid) else {
            return Some(if self.destroyed.contains(&gid) {
                Error::invalid(format!(
                    "group {gid} was destroyed on this rank; make a new one for more calls"
                ))
            } else {
                Error::NotAMember {
                    group: gid,
                    rank: self.rank,
                }
            });
        };
        if let Some(cause) = &g.aborted {
            let e = Error::GroupAborted {
                group: gid,
                cause: Box::new(cause.root_cause().clone()),
            };
            g.heard = true;
            return Some(e);
        }
        if g.failed.contains_key(&seq) {
            return self.failed_elsewhere(gid, seq);
        }
        if !g.left.is_empty() {
            return self.left_refusal(gid, Some(seq), None);
        }
        None
    }

    /// Whether call `seq` of group `gid` may run on the board with no record made first (a
    /// caller's quick path): [`BoardEvent::Made`] would be refused for nothing, and
    /// there is nothing for it to consume (no verdict, no member's failed part). `Some(n)`:
    /// it may, and so may the group's calls after it up to `n` (excluded), as long as the
    /// [`board_epoch`](Self::board_epoch) stays the same. Changes nothing.
    pub fn board_clear(&self, gid: GroupId, seq: u64) -> Option<u64> {
        if self.closing.is_some() {
            return None;
        }
        let g = self.groups.get(&gid)?;
        if g.aborted.is_some() || !g.left.is_empty() {
            return None;
        }
        let failed = g.failed.range(seq..).next().map_or(u64::MAX, |(s, _)| *s);
        let verdict = g
            .board_verdicts
            .keys()
            .copied()
            .filter(|s| *s >= seq)
            .min()
            .unwrap_or(u64::MAX);
        let until = failed.min(verdict);
        (until > seq).then_some(until)
    }

    /// A counter that goes up with every change of this engine's state that may make
    /// [`board_clear`](Self::board_clear) say no where it said yes: the engine is closing, a
    /// group is aborted or released, a member left one, a member's part of a call failed
    /// before it started, a desync report gave a verdict. A caller that checked a group
    /// with `board_clear` may skip the check (and the engine's lock) while it reads the
    /// same count.
    pub fn board_epoch(&self) -> std::sync::Arc<crate::sync::unmodelled::AtomicU64> {
        self.board_epoch.clone()
    }

    /// A change that [`board_epoch`](Self::board_epoch) counts.
    pub(super) fn board_changed(&self) {
        super::bump(&self.board_epoch);
    }

    /// Calls of group `gid` (sequence numbers and fingerprints, in order) ran on the board
    /// from start to finish before the engine heard of them (a caller's quick path, checked
    /// with [`board_clear`](Self::board_clear)): each is recorded as finished, and the
    /// members' flow control learns of them once, as of their last.
    ///
    /// A member's message for one of them is a mismatch (a call on the board sends none):
    /// the group is aborted. Its caller had its result already, from slots that all named
    /// its call; the member that sent the message hears of the mismatch.
    pub(crate) fn board_ran(
        &mut self,
        gid: GroupId,
        calls: impl IntoIterator<Item = (u64, Fingerprint)>,
    ) {
        let Some(g) = self.groups.get_mut(&gid) else {
            return;
        };
        let mut last = None;
        let mut early = None;
        for (seq, fp) in calls {
            if early.is_none() && !g.unexpected.is_empty() {
                early = g
                    .unexpected
                    .remove(&seq)
                    .and_then(|ms| {
                        ms.into_iter().find_map(|m| match m.header {
                            Header::Data { call, .. } => Some((m.src, call)),
                            _ => None,
                        })
                    })
                    .map(|(src, call)| (seq, fp, src, call));
            }
            if let Some(s) = g.done.insert(seq, Some(fp)) {
                g.forgotten_below = g.forgotten_below.max(s + 1);
            }
            last = last.max(Some(seq));
        }
        if let Some(seq) = last {
            let mut out = Vec::new();
            g.flow.on_made(seq, &mut out);
            self.emit(gid, out);
        }
        if let Some((seq, fp, src, call)) = early {
            let err = self.mismatch(gid, Some(seq), fp, src, call);
            self.abort(gid, err, None, true);
        }
    }

    /// Whether group `gid` can run no more calls on this rank (shutting down, not a group of
    /// this rank, or aborted): calls finished here but not yet published need not be.
    pub(crate) fn board_dead(&self, gid: GroupId) -> bool {
        self.closing.is_some() || self.groups.get(&gid).is_none_or(|g| g.aborted.is_some())
    }

    /// Call `seq` of group `gid` is made on the board (checked with
    /// [`board_refusal`](Self::board_refusal) first): the members' flow control learns of it
    /// as of an engine call, and a member that asks which call this rank is in (a desync
    /// report) hears of it.
    ///
    /// A member's message for the call that came before it is a mismatch (a call on the
    /// board sends none): the group is aborted, and the error is the call's.
    pub(crate) fn board_made(&mut self, gid: GroupId, seq: u64, fp: Fingerprint) -> Option<Error> {
        let g = self.groups.get_mut(&gid)?;
        g.board.insert(seq, fp);
        // A member's message for this call came early: it is in another call (one on the
        // board sends none).
        let early = g.unexpected.remove(&seq).and_then(|ms| {
            ms.into_iter().find_map(|m| match m.header {
                Header::Data { call, .. } => Some((m.src, call)),
                _ => None,
            })
        });
        let mut out = Vec::new();
        g.flow.on_made(seq, &mut out);
        self.emit(gid, out);
        let (src, call) = early?;
        let err = self.mismatch(gid, Some(seq), fp, src, call);
        self.abort(gid, err.clone(), None, true);
        if let Some(g) = self.groups.get_mut(&gid) {
            g.board.remove(&seq);
            g.heard = true;
        }
        Some(err)
    }

    /// Call `seq` of group `gid`, `fp`, finished on the board on this rank.
    pub(crate) fn board_finished(
        &mut self,
        gid: GroupId,
        seq: u64,
        fp: Fingerprint,
        late: Option<(usize, Duration)>,
    ) {
        if let Some(g) = self.groups.get_mut(&gid) {
            if let Some((m, by)) = late {
                g.lateness.judged(seq, m, by);
            }
            g.board.remove(&seq);
            // A report asked for at its deadline is moot: the call finished after all.
            g.board_inquiries.remove(&seq);
            g.board_verdicts.remove(&seq);
            if let Some(s) = g.done.insert(seq, Some(fp)) {
                g.forgotten_below = g.forgotten_below.max(s + 1);
            }
        }
    }

    /// Call `seq` of group `gid` failed on the board on this rank with `e` (a mismatch, a
    /// timeout, a member's broken lane): the group is aborted and its members told, as when
    /// an engine call fails so; this rank's caller hears `e` itself.
    pub(crate) fn board_failed(&mut self, gid: GroupId, seq: u64, e: Error) {
        self.board_disagreed(gid, seq, e);
        if let Some(g) = self.groups.get_mut(&gid) {
            g.heard = true;
        }
    }

    /// Call `seq` of group `gid` gave its caller its result on the board, and was then found
    /// to disagree with a member's call (`e`: the look a call that ended before its slot
    /// was published owes once it is, [`Board::check`](crate::board::Board::check)): the
    /// group is aborted and its members told; `e` is this rank's pending error, which its
    /// next call, `destroy` or `shutdown` returns.
    pub(crate) fn board_disagreed(&mut self, gid: GroupId, seq: u64, e: Error) {
        if let Some(g) = self.groups.get_mut(&gid) {
            g.board.remove(&seq);
            g.board_inquiries.remove(&seq);
            g.board_verdicts.remove(&seq);
        }
        self.abort(gid, e, None, true);
    }

    /// Call `seq` (`fp`) of group `gid` on the board passed its deadline, still needing the
    /// slots of `missing` (global ranks): asks every other member which call it is in and
    /// returns when the report is due (the group's `desync_grace` from `now`). The report's
    /// verdict — a mismatch if a member is in another call, else a timeout naming the members
    /// that have not made it — aborts the group, and is what
    /// [`board_refusal`](Self::board_refusal) gives the call. `None`: no report (no grace,
    /// nobody to ask, or one already asked for).
    pub(crate) fn board_timed_out(
        &mut self,
        gid: GroupId,
        seq: u64,
        fp: Fingerprint,
        missing: Vec<usize>,
        now: Time,
    ) -> Option<Time> {
        let me = self.rank;
        let g = self.groups.get_mut(&gid)?;
        let grace = g.info.options.desync_grace;
        if grace.is_zero() || g.info.size() < 2 || g.board_inquiries.contains_key(&seq) {
            return None;
        }
        let probes = missing.clone();
        g.board_inquiries.insert(
            seq,
            BoardInquiry {
                fp,
                missing,
                replies: BTreeMap::new(),
                probing: false,
                elsewhere: false,
            },
        );
        tracing::warn!(rank = me, group = %gid, seq, call = %fp, "call on the board timed out; asking the group which call each rank is in");
        for &m in g.info.members.iter() {
            if m != me {
                self.transmits.push_back(Transmit {
                    dst: m,
                    msg: Message {
                        src: me,
                        header: Header::Inquire { group: gid, seq },
                        payload: Vec::new(),
                    },
                });
            }
        }
        let probing = self.send_probes(gid, seq, fp.kind, &probes);
        if let Some(inq) = self
            .groups
            .get_mut(&gid)
            .and_then(|g| g.board_inquiries.get_mut(&seq))
        {
            inq.probing = probing;
        }
        Some(now + grace)
    }

    /// A member answered the desync report on call `seq` of group `gid` (a call on the
    /// board, if there is such a report): the report concludes once every member answered.
    pub(super) fn board_status(
        &mut self,
        gid: GroupId,
        seq: u64,
        from: usize,
        reply: super::failure::Reply,
    ) {
        let Some(g) = self.groups.get_mut(&gid) else {
            return;
        };
        let size = g.info.size();
        let Some(inq) = g.board_inquiries.get_mut(&seq) else {
            return;
        };
        let line = super::failure::status_line(from, reply.made, reply.latest, None);
        inq.replies.insert(from, line);
        inq.elsewhere |= reply.made.is_none() && reply.elsewhere;
        if inq.replies.len() + 1 >= size && !(inq.probing && inq.elsewhere) {
            self.board_inquiry_over(gid, seq);
        }
    }

    /// The desync report on call `seq` of group `gid` concludes with what came (its grace is
    /// over, or every member answered): its verdict aborts the group and waits for the call
    /// ([`board_refusal`](Self::board_refusal)).
    pub(crate) fn board_inquiry_over(&mut self, gid: GroupId, seq: u64) {
        let Some(inq) = self
            .groups
            .get_mut(&gid)
            .and_then(|g| g.board_inquiries.remove(&seq))
        else {
            return;
        };
        let Some(err) = self.verdict(gid, Some(seq), inq.fp, &inq.replies, inq.missing) else {
            return;
        };
        if let Some(g) = self.groups.get_mut(&gid) {
            if g.aborted.is_some() {
                return;
            }
            g.board_verdicts.insert(seq, err.clone());
            super::bump(&self.board_epoch);
        }
        self.abort(gid, err, None, true);
    }
}
