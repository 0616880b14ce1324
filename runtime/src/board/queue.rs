//! A member's calls on one board, in the group's order ([`Queue`]): which to publish, which
//! to look at, what each call's end is, when its slot may be reused, and when it is done
//! with. Sans-IO, like [`Board`]: the rank's driver holds a queue under a lock, hands it the
//! board and the clock, and completes the waiters and hands the engine the records that
//! come out.
//!
//! The rules, in [`Queue::step`]:
//! - calls are published in order, each once its slot is free ([`Board::can_publish`]); a
//!   publish that fails ends its call with the error (and the group with it: a
//!   [`Record::Failed`]), and the calls after it are left to the group's abort;
//! - calls end in order: the first whose needed slots are not all there stops the calls
//!   after it; a call ends from every slot there ([`Board::look`]), and a call that ended
//!   before its slot was published owes the look once it is ([`Board::check`]; a
//!   disagreement found then is a [`Record::Disagreed`], the rank's pending error); once
//!   [`AHEAD`] calls are held so, the next waits for its slot up to [`HOLD`] before it is
//!   held too;
//! - this member's `finished` mark goes up to a call only once the call and every call before
//!   it looked at the slots after their publish (the others keep their slots for that look);
//! - a call is done with (popped) once published, looked at, and its waiter given its result.
//!
//! And in [`Queue::judge`], in every run of the engine, the verdicts on the first call still
//! waiting: the rank quiesced (`Shutdown`), the engine refuses it (the group aborted, a
//! member's part failed, the group destroyed), or its deadline passed (the group is asked
//! which call each member is in, once; that report's verdict, or a timeout naming the
//! members whose slots it still needs, ends it). Each ended call stops the calls after it
//! from being looked at until the next is judged in turn.

use super::{Board, BoardCall, Slot};
use crate::collective::Output;
use crate::engine::{BoardEvent, Engine};
use crate::error::{Error, Result};
use crate::group::{GroupId, GroupInfo};
use crate::time::Time;
use std::collections::VecDeque;

pub use crate::engine::BoardRecord as Record;

/// How many calls a member holds for their publish (ended before their slots were free)
/// before its next call waits for its slot a while ([`HOLD`]).
pub const AHEAD: usize = 8;

/// How long a call waits for its slot once its member holds [`AHEAD`] calls, before it too
/// ends and is held: a member that needs nobody (a reduce's non-root, a broadcast's root)
/// keeps in step with the slowest member when that one is merely slow, and still never
/// waits on one that has not made its calls yet. Once a hold runs out with no slot freed,
/// the calls after it are held at once until one is (the slowest is not merely slow: a
/// burst of calls made ahead of it pays one hold, not one each).
pub const HOLD: std::time::Duration = std::time::Duration::from_millis(1);

/// A call that [`Queue::judge`] ended, with the error its waiter gets.
#[derive(Debug)]
pub struct Ended<W> {
    /// Its sequence number in the group.
    pub seq: u64,
    /// What waits for its result (none if its waiter had its result already).
    pub waiting: Option<W>,
    /// Why it ended.
    pub error: Error,
}

/// What [`Queue::judge`] decided.
#[derive(Debug)]
pub struct Judged<W> {
    /// The calls it ended, in order.
    pub ended: Vec<Ended<W>>,
    /// The earliest deadline of the calls still waiting (when to judge again).
    pub next: Option<Time>,
    /// Calls done with and dropped from the front.
    pub done: usize,
}

/// A call queued on a board; `W` is what waits for its result.
#[derive(Debug)]
pub struct Pending<W> {
    /// Its sequence number in the group.
    pub seq: u64,
    /// The call.
    pub call: BoardCall,
    published: bool,
    /// Every other member's slot that was there after the publish was compared with the
    /// call: until then the call is not finished on the board.
    checked: bool,
    waiting: Option<W>,
    /// When it gives up on the other members.
    pub deadline: Time,
    /// Past its deadline the group was asked which call each member is in (the desync
    /// report); `deadline` is then the report's.
    pub inquiring: bool,
    /// Since when a look found a slot it needs missing, and the first member whose slot was
    /// missing at the last such look: the call's late-comer once it finishes
    /// (`crate::lateness`).
    waited: Option<(Time, Option<usize>)>,
}

impl<W> Pending<W> {
    fn done(&self) -> bool {
        self.published && self.checked && self.waiting.is_none()
    }
}

/// A member's calls on one board, and the slots read for the one being looked at.
#[derive(Debug)]
pub struct Queue<W> {
    calls: VecDeque<Pending<W>>,
    /// Every call in front of this index has ended (calls end in order, the first waiting
    /// one first): a step skips the calls that ended before their publish up to here, so a
    /// member that needs nobody and runs far ahead pays no walk over what it holds.
    ended: usize,
    /// The call waiting for its slot because the member holds [`AHEAD`] calls, and until
    /// when ([`HOLD`]).
    hold: Option<(u64, Time)>,
    /// A hold ran out and no slot of this member was published since: its calls are held at
    /// once.
    spent: bool,
    slots: Vec<Option<Slot>>,
    /// Calls the last step's second pass looked at (a test's measure of its walk).
    #[cfg(test)]
    visited: usize,
}

impl<W> Queue<W> {
    /// An empty queue for a board of `members`.
    pub fn new(members: usize) -> Queue<W> {
        Queue {
            calls: VecDeque::new(),
            ended: 0,
            hold: None,
            spent: false,
            slots: vec![None; members],
            #[cfg(test)]
            visited: 0,
        }
    }

    /// Calls queued and not done with.
    pub fn len(&self) -> usize {
        self.calls.len()
    }

    /// Whether no call is queued.
    pub fn is_empty(&self) -> bool {
        self.calls.is_empty()
    }

    /// Makes call `seq` of group `gid` on the board: `engine` records it as made
    /// ([`BoardEvent::Made`]) and it is queued ([`push`](Self::push)), or the engine says why
    /// it cannot run and `waiting` comes back with the error.
    #[allow(clippy::too_many_arguments)]
    pub fn submit(
        &mut self,
        engine: &mut Engine,
        gid: GroupId,
        seq: u64,
        call: BoardCall,
        published: bool,
        waiting: W,
        deadline: Time,
    ) -> std::result::Result<(), (W, Error)> {
        let made = BoardEvent::Made {
            seq,
            fp: call.fingerprint(),
        };
        if let Some(e) = engine.board(gid, made) {
            return Err((waiting, e));
        }
        self.push(seq, call, published, waiting, deadline);
        Ok(())
    }

    /// Queues call `seq` (after every call queued before: sequence order), whose slot is
    /// `published` already or not, `waiting` for its result until `deadline`.
    pub fn push(&mut self, seq: u64, call: BoardCall, published: bool, waiting: W, deadline: Time) {
        self.calls.push_back(Pending {
            seq,
            call,
            published,
            checked: false,
            waiting: Some(waiting),
            deadline,
            inquiring: false,
            waited: None,
        });
    }

    /// Publishes what it can and ends what it can, each in order (the module doc's rules):
    /// the ended calls' waiters with their results go to `out`, their records to `records`
    /// (`now` stamps a finished one). Returns whether anything moved (a slot published, a
    /// call ended or looked at: the other members may want a wake-up), and how many calls
    /// are done with.
    pub fn step(
        &mut self,
        board: &Board,
        group: &GroupInfo,
        now: &dyn Fn() -> Time,
        out: &mut Vec<(W, Result<Output>)>,
        records: &mut Vec<Record>,
    ) -> (bool, usize) {
        let mut moved = false;
        for p in self.calls.iter_mut().filter(|p| !p.published) {
            if !board.can_publish(p.seq) {
                break;
            }
            moved = true;
            p.published = true;
            // A slot freed: the slowest member moves, and a hold is worth waiting again.
            self.spent = false;
            if let Err(e) = board.publish(p.seq, p.call.fingerprint_bytes(), p.call.payload()) {
                // Nobody will see this call: it fails with the reason, and the group with
                // it (the members hear of it as of any failed call, not at their deadline).
                // The calls after it end with the group's abort, not here.
                p.checked = true;
                records.push(Record::Failed(p.seq, Box::new(e.clone())));
                if let Some(w) = p.waiting.take() {
                    out.push((w, Err(e)));
                }
                return (true, self.pop_done());
            }
        }
        let Queue {
            calls,
            ended,
            hold,
            spent,
            slots,
            ..
        } = self;
        // Every call before this one is finished on the board: the `finished` mark may go
        // up to here.
        let mut in_order = true;
        // Calls ended before their publish (held for it).
        let mut held = 0;
        let mut i = 0;
        #[cfg(test)]
        let mut visited = 0;
        while let Some(p) = calls.get_mut(i) {
            #[cfg(test)]
            {
                visited += 1;
            }
            if p.waiting.is_none() && !p.published && i < *ended {
                // The first call held for its publish: the first pass published nothing
                // after it, and every call from it to `ended` ended (held, or looked at), so
                // none of them has anything to do now.
                in_order = false;
                held += *ended - i;
                i = *ended;
                continue;
            }
            i += 1;
            if p.waiting.is_none() && (p.checked || !p.published) {
                in_order &= p.checked;
                held += usize::from(!p.published);
                continue;
            }
            if !p.published && held >= AHEAD && !*spent {
                // Its slot is not free and the member holds enough: it waits for the slot
                // a while before it is held too.
                let t = now();
                let until = match *hold {
                    Some((seq, until)) if seq == p.seq => until,
                    _ => {
                        *hold = Some((p.seq, t + HOLD));
                        t + HOLD
                    }
                };
                if t < until {
                    break;
                }
                *spent = true;
            }
            slots.fill(None);
            let result = if p.waiting.is_some() {
                match board.look(&p.call, group, p.seq, p.published, slots) {
                    Some(r) => r,
                    // A slot it needs is not there: the calls after it wait (they end in
                    // order). Whose, and since when, name the late-comer.
                    None => {
                        let late = Self::first_missing(board, p);
                        p.waited = Some((p.waited.map_or_else(now, |w| w.0), late));
                        break;
                    }
                }
            } else {
                // Ended before its slot was published: the look it owes now that it is.
                board
                    .check(&p.call, group, p.seq, slots)
                    .map(|()| Output::None)
            };
            moved = true;
            p.checked = p.published;
            match p.waiting.take() {
                Some(w) => {
                    // It and every call before it have ended.
                    *ended = i;
                    records.push(match &result {
                        Ok(_) => {
                            let t = now();
                            let late = p
                                .waited
                                .and_then(|(since, m)| Some((m?, t.saturating_since(since))));
                            Record::Finished(p.seq, p.call.fingerprint(), t, late)
                        }
                        Err(e) => Record::Failed(p.seq, Box::new(e.clone())),
                    });
                    out.push((w, result));
                }
                None => {
                    if let Err(e) = result {
                        records.push(Record::Disagreed(p.seq, Box::new(e)));
                    }
                }
            }
            in_order &= p.checked;
            if in_order {
                board.finish(p.seq);
            }
        }
        #[cfg(test)]
        {
            self.visited = visited;
        }
        (moved, self.pop_done())
    }

    /// Until when the first call still waiting waits for its slot before it ends and is held
    /// ([`HOLD`]), if it does: its driver steps the queue again then.
    pub fn hold_until(&self) -> Option<Time> {
        if self.spent {
            return None;
        }
        let (seq, until) = self.hold?;
        let p = self.calls.get(self.first_waiting_at()?)?;
        (p.seq == seq && !p.published).then_some(until)
    }

    /// Where the first call still waiting is (none in front of `ended`).
    fn first_waiting_at(&self) -> Option<usize> {
        (self.ended..self.calls.len())
            .find(|&i| self.calls.get(i).is_some_and(|p| p.waiting.is_some()))
    }

    /// The first call still waiting for its result (the one a deadline, an abort or a
    /// shutdown ends first).
    pub fn first_waiting(&mut self) -> Option<&mut Pending<W>> {
        let at = self.first_waiting_at()?;
        self.calls.get_mut(at)
    }

    /// Ends the first call still waiting (it failed: an abort, a refusal, its deadline): it
    /// is not published any more and this member is done with its slot (the group is
    /// aborted, or the call failed on every member before it started). Its waiter, if any.
    pub fn end_first_waiting(&mut self, board: &Board) -> Option<W> {
        let first = self.first_waiting_at()?;
        self.ended = first + 1;
        let p = self.calls.get_mut(first)?;
        board.finish(p.seq);
        p.published = true;
        p.checked = true;
        p.waiting.take()
    }

    /// The group can run no more calls here: calls ended but not yet published or looked
    /// at need not be (nobody will read their slots).
    pub fn abandon_slots(&mut self) {
        for p in self.calls.iter_mut() {
            p.published = true;
            p.checked = true;
        }
    }

    /// Drops the calls at the front that are done with; how many.
    pub fn pop_done(&mut self) -> usize {
        let mut n = 0;
        while self.calls.front().is_some_and(Pending::done) {
            self.calls.pop_front();
            n += 1;
        }
        self.ended = self.ended.saturating_sub(n);
        n
    }

    /// The verdicts of a run of `engine` (this member's, for group `group`) at `now` on the
    /// first calls still waiting (the module doc): the calls ended, in order, each with its
    /// error (the engine has its record); when to judge again; how many calls are done
    /// with. `quiesced`: the rank stopped (its calls end with `Shutdown`).
    pub fn judge(
        &mut self,
        board: &Board,
        group: &GroupInfo,
        engine: &mut Engine,
        quiesced: bool,
        now: Time,
    ) -> Judged<W> {
        let gid = group.id;
        let mut ended = Vec::new();
        let mut next = None;
        while let Some(front) = self.first_waiting() {
            let why = if quiesced {
                Some(Error::Shutdown)
            } else if let Some(e) = engine.board_waiting_refusal(gid, front.seq) {
                Some(e)
            } else if now >= front.deadline && front.inquiring {
                engine.board_inquiry_over(gid, front.seq);
                engine.board_refusal(gid, front.seq)
            } else if now >= front.deadline {
                Self::timed_out(front, board, group, engine, now)
            } else {
                None
            };
            let Some(error) = why else {
                next = Some(front.deadline);
                break;
            };
            let seq = front.seq;
            // Unpublished, it is not published any more (the group is aborted, or the call
            // failed on every member before it started).
            let waiting = self.end_first_waiting(board);
            ended.push(Ended {
                seq,
                waiting,
                error,
            });
        }
        if quiesced || engine.board_dead(gid) {
            // Calls ended and still to publish: nobody will read them.
            self.abandon_slots();
        }
        if let Some(until) = self.hold_until() {
            next = Some(next.map_or(until, |n: Time| n.min(until)));
        }
        Judged {
            ended,
            next,
            done: self.pop_done(),
        }
    }

    /// Call `front` passed its deadline: the group is asked which call each member is in
    /// (and `front` waits for the report), or, where nobody can be asked, it fails with a
    /// timeout naming the members whose slots it still needs.
    fn timed_out(
        front: &mut Pending<W>,
        board: &Board,
        group: &GroupInfo,
        engine: &mut Engine,
        now: Time,
    ) -> Option<Error> {
        let fp = front.call.fingerprint();
        let missing: Vec<usize> = Self::missing(board, front)
            .into_iter()
            .map(|m| group.global(m))
            .collect();
        match engine.board_timed_out(group.id, front.seq, fp, missing.clone(), now) {
            Some(until) => {
                front.deadline = until;
                front.inquiring = true;
                None
            }
            None => {
                let e = Error::Timeout {
                    group: group.id,
                    seq: Some(front.seq),
                    op: fp.kind,
                    rank: group.global(group.rank),
                    waiting_for: missing,
                    report: Vec::new(),
                };
                let failed = Record::Failed(front.seq, Box::new(e.clone()));
                engine.board(group.id, BoardEvent::Record(failed));
                Some(e)
            }
        }
    }

    /// The first member (group rank) whose slot call `p` still needs.
    fn first_missing(board: &Board, p: &Pending<W>) -> Option<usize> {
        let me = board.me();
        (0..board.size())
            .find(|&m| p.call.needs(me, m) && !matches!(board.read(m, p.seq), Ok(Some(_))))
    }

    /// The members (group ranks) whose slots call `p` still needs (for a timeout's report).
    pub fn missing(board: &Board, p: &Pending<W>) -> Vec<usize> {
        let me = board.me();
        (0..board.size())
            .filter(|&m| p.call.needs(me, m) && !matches!(board.read(m, p.seq), Ok(Some(_))))
            .collect()
    }
}

#[cfg(all(test, not(collectix_loom)))]
mod tests {
    use super::*;
    use crate::board::{HeapLane, Lane, DEPTH};
    use crate::collective::Request;
    use crate::group::{CallOptions, GroupOptions};
    use crate::tensor::Tensor;
    use std::sync::Arc;

    fn info(n: usize, me: usize) -> GroupInfo {
        GroupInfo::world(n, me, GroupOptions::default()).unwrap_or_else(|e| panic!("{e}"))
    }

    fn broadcast(n: usize, me: usize, root: usize) -> BoardCall {
        let req = Request::Broadcast {
            tensor: Tensor::from_vec(vec![me as f32]),
            root,
        };
        match BoardCall::of(&req, &info(n, me), &CallOptions::default()) {
            Some(Ok(c)) => c,
            other => panic!("not a board call: {other:?}"),
        }
    }

    type Out = Vec<(u64, Result<Output>)>;

    fn step(q: &mut Queue<u64>, b: &Board, me: usize) -> (Out, Vec<Record>) {
        let (mut out, mut records) = (Vec::new(), Vec::new());
        q.step(b, &info(2, me), &|| Time::ZERO, &mut out, &mut records);
        (out, records)
    }

    #[test]
    fn a_call_that_ended_before_its_publish_looks_once_published() {
        // Member 0, a broadcast's root, runs DEPTH + 1 calls ahead of member 1: the last
        // ends at once (it needs nobody) but its slot is still taken. Member 1 then makes
        // the first DEPTH calls, and at DEPTH names itself the root. Member 0's look, once
        // its slot frees and it publishes, finds that: its pending error.
        let lanes0: Arc<dyn Lane> = Arc::new(HeapLane::default());
        let lanes: Vec<Arc<dyn Lane>> = vec![lanes0.clone(), Arc::new(HeapLane::default())];
        let b0 = Board::new(lanes.clone(), 0).unwrap_or_else(|e| panic!("{e}"));
        let b1 = Board::new(lanes, 1).unwrap_or_else(|e| panic!("{e}"));
        let last = DEPTH as u64;
        let (mut q0, mut q1) = (Queue::new(2), Queue::new(2));
        for seq in 0..=last {
            q0.push(seq, broadcast(2, 0, 0), false, seq, Time::ZERO);
        }
        let (out, records) = step(&mut q0, &b0, 0);
        assert_eq!(out.len(), DEPTH + 1, "every call of the root ended");
        assert!(out.iter().all(|(_, r)| r.is_ok()));
        assert!(records.iter().all(|r| !r.failed()));
        assert_eq!(q0.len(), 1, "the last call waits for its slot");
        assert!(!b0.can_publish(last), "member 1 has not finished call 0");
        assert_eq!(
            lanes0.load(0),
            Some(last),
            "member 0's finished mark stops before the call that owes its look"
        );
        for seq in 0..=last {
            let root = if seq == last { 1 } else { 0 };
            q1.push(seq, broadcast(2, 1, root), false, seq, Time::ZERO);
        }
        let (out, _) = step(&mut q1, &b1, 1);
        // Member 1's call DEPTH names itself the root and needs nobody: it saw no slot of
        // member 0's (not published yet), so it ended Ok.
        assert_eq!(out.len(), DEPTH + 1);
        assert!(out.iter().all(|(_, r)| r.is_ok()), "{out:?}");
        let (out, records) = step(&mut q0, &b0, 0);
        assert!(out.is_empty(), "no waiter left: {out:?}");
        assert!(
            matches!(records.as_slice(), [Record::Disagreed(s, e)] if *s == last && matches!(**e, Error::Mismatch { .. })),
            "{records:?}"
        );
        assert!(records[0].failed(), "a disagreement fails the group");
        assert!(q0.is_empty(), "the call is done with");
    }

    /// A lane no word of which can be written.
    struct Unwritable;

    impl Lane for Unwritable {
        fn load(&self, _: usize) -> Option<u64> {
            Some(0)
        }
        fn store(&self, _: usize, _: u64) -> bool {
            false
        }
    }

    #[test]
    fn a_publish_that_fails_fails_its_call_and_the_group() {
        let lanes: Vec<Arc<dyn Lane>> = vec![Arc::new(Unwritable), Arc::new(HeapLane::default())];
        let b = Board::new(lanes, 0).unwrap_or_else(|e| panic!("{e}"));
        let mut q = Queue::new(2);
        q.push(0, broadcast(2, 0, 0), false, 7, Time::ZERO);
        q.push(1, broadcast(2, 0, 0), false, 8, Time::ZERO);
        let (out, records) = step(&mut q, &b, 0);
        assert!(
            matches!(out.as_slice(), [(7, Err(Error::Internal(_)))]),
            "{out:?}"
        );
        assert!(
            matches!(records.as_slice(), [Record::Failed(0, _)]),
            "{records:?}"
        );
        assert!(records[0].failed());
    }

    fn reduce(n: usize, me: usize, root: usize) -> BoardCall {
        let req = Request::Reduce {
            tensor: Tensor::from_vec(vec![me as f32]),
            root,
            op: crate::tensor::reduce::ReduceOp::Sum,
        };
        match BoardCall::of(&req, &info(n, me), &CallOptions::default()) {
            Some(Ok(c)) => c,
            other => panic!("not a board call: {other:?}"),
        }
    }

    /// Three members' boards over heap lanes; the lanes too.
    fn three() -> (Vec<Arc<dyn Lane>>, Vec<Board>) {
        let lanes: Vec<Arc<dyn Lane>> = (0..3)
            .map(|_| Arc::new(HeapLane::default()) as Arc<dyn Lane>)
            .collect();
        let boards = (0..3)
            .map(|m| Board::new(lanes.clone(), m).unwrap_or_else(|e| panic!("{e}")))
            .collect();
        (lanes, boards)
    }

    fn step3(q: &mut Queue<u64>, b: &Board) -> (Out, Vec<Record>, (bool, usize)) {
        let (mut out, mut records) = (Vec::new(), Vec::new());
        let r = q.step(b, &info(3, b.me()), &|| Time::ZERO, &mut out, &mut records);
        (out, records, r)
    }

    fn step3_at(q: &mut Queue<u64>, b: &Board, t: Time) -> (Out, Vec<Record>) {
        let (mut out, mut records) = (Vec::new(), Vec::new());
        q.step(b, &info(3, b.me()), &|| t, &mut out, &mut records);
        (out, records)
    }

    #[test]
    fn a_member_far_ahead_waits_a_while_for_its_slot_and_walks_none_of_what_it_holds() {
        // Member 1, a reduce's non-root, makes its calls one at a time (the next once the
        // last ended), as a user does, while the root (member 0) makes none. Its calls end
        // at once up to the board's depth and AHEAD more (held for their publish); the next
        // waits HOLD for its slot, then ends held (a member that needs nobody never waits on
        // one that has not made its calls), and, no slot freed meanwhile, so do the rest, at
        // once. A step looks at a few calls, not at all it holds.
        let (_, bs) = three();
        let mut q1 = Queue::new(3);
        let mut engine = Engine::new(1);
        engine.add_group(info(3, 1), Time::ZERO);
        let calls = (DEPTH + 3000) as u64;
        let mut t = Time::ZERO;
        for seq in 0..calls {
            q1.push(seq, reduce(3, 1, 0), false, seq, far());
            let (mut out, records) = step3_at(&mut q1, &bs[1], t);
            assert!(records.iter().all(|r| !r.failed()), "{records:?}");
            if seq == (DEPTH + AHEAD) as u64 {
                assert!(out.is_empty(), "call {seq} ended at once: {out:?}");
                let j = q1.judge(&bs[1], &info(3, 1), &mut engine, false, t);
                assert!(j.ended.is_empty());
                assert_eq!(j.next, Some(t + HOLD), "call {seq}: its driver's next look");
                t = t + HOLD;
                out = step3_at(&mut q1, &bs[1], t).0;
            }
            assert!(
                matches!(out.as_slice(), [(w, Ok(_))] if *w == seq),
                "call {seq}: {out:?}"
            );
            assert!(q1.visited <= 3, "call {seq}: {} looked at", q1.visited);
        }
        assert_eq!(q1.len(), 3000, "held for their publish");
        assert!(q1.first_waiting().is_none());
        assert_eq!(q1.hold_until(), None);
        // The root comes: member 1 publishes as slots free and looks at each call once.
        let mut q0 = Queue::new(3);
        let mut q2 = Queue::new(3);
        for seq in 0..calls {
            q0.push(seq, reduce(3, 0, 0), false, seq, far());
            q2.push(seq, reduce(3, 2, 0), false, seq, far());
            let (_, records2) = step3_at(&mut q2, &bs[2], t);
            assert!(records2.iter().all(|r| !r.failed()), "{records2:?}");
            let (_, records0) = step3_at(&mut q0, &bs[0], t);
            assert!(records0.iter().all(|r| !r.failed()), "{records0:?}");
            let (out1, records1) = step3_at(&mut q1, &bs[1], t);
            assert!(out1.is_empty(), "{out1:?}");
            assert!(records1.iter().all(|r| !r.failed()), "{records1:?}");
            let (_, records0) = step3_at(&mut q0, &bs[0], t);
            assert!(records0.iter().all(|r| !r.failed()), "{records0:?}");
        }
        for _ in 0..4 {
            step3_at(&mut q0, &bs[0], t);
            step3_at(&mut q1, &bs[1], t);
            step3_at(&mut q2, &bs[2], t);
        }
        assert!(q1.is_empty(), "{} calls of member 1 left", q1.len());
        assert!(q0.is_empty(), "{} calls of the root left", q0.len());
    }

    #[test]
    fn a_hold_that_ran_out_is_waited_again_once_the_slowest_frees_a_slot() {
        // The non-root's first call past the bound waits HOLD and ends held; the next ends
        // at once (nothing freed). The root and member 2 then finish call 0: the non-root
        // publishes the slot that freed, and its next call past the bound waits again.
        let (_, bs) = three();
        let mut q1 = Queue::new(3);
        let first = (DEPTH + AHEAD) as u64;
        for seq in 0..first {
            q1.push(seq, reduce(3, 1, 0), false, seq, far());
            step3_at(&mut q1, &bs[1], Time::ZERO);
        }
        q1.push(first, reduce(3, 1, 0), false, first, far());
        assert!(
            step3_at(&mut q1, &bs[1], Time::ZERO).0.is_empty(),
            "it waits"
        );
        let t = Time::ZERO + HOLD;
        assert_eq!(step3_at(&mut q1, &bs[1], t).0.len(), 1, "its hold ran out");
        q1.push(first + 1, reduce(3, 1, 0), false, first + 1, far());
        assert_eq!(
            step3_at(&mut q1, &bs[1], t).0.len(),
            1,
            "nothing freed: at once"
        );
        assert_eq!(q1.hold_until(), None);
        let (mut q0, mut q2) = (Queue::new(3), Queue::new(3));
        q0.push(0, reduce(3, 0, 0), false, 0, far());
        q2.push(0, reduce(3, 2, 0), false, 0, far());
        step3_at(&mut q2, &bs[2], t);
        assert_eq!(step3_at(&mut q0, &bs[0], t).0.len(), 1, "the root's call 0");
        q1.push(first + 2, reduce(3, 1, 0), false, first + 2, far());
        let (out, _) = step3_at(&mut q1, &bs[1], t);
        assert!(
            out.is_empty(),
            "a slot freed: the hold is worth waiting again: {out:?}"
        );
        assert_eq!(q1.hold_until(), Some(t + HOLD));
    }

    #[test]
    fn a_member_ahead_keeps_in_step_when_the_slowest_frees_its_slot_in_time() {
        // The non-root holds AHEAD calls past the depth; its next waits; the root (and member
        // 2) then finish call 0: the slot is free within HOLD, and the waiting call is
        // published and ends without being held.
        let (_, bs) = three();
        let mut q1 = Queue::new(3);
        let last = (DEPTH + AHEAD) as u64;
        for seq in 0..=last {
            q1.push(seq, reduce(3, 1, 0), false, seq, far());
            step3_at(&mut q1, &bs[1], Time::ZERO);
        }
        assert_eq!(
            q1.hold_until(),
            Some(Time::ZERO + HOLD),
            "call {last} waits"
        );
        let (mut q0, mut q2) = (Queue::new(3), Queue::new(3));
        q0.push(0, reduce(3, 0, 0), false, 0, far());
        q2.push(0, reduce(3, 2, 0), false, 0, far());
        step3_at(&mut q2, &bs[2], Time::ZERO);
        let (out0, _) = step3_at(&mut q0, &bs[0], Time::ZERO);
        assert_eq!(out0.len(), 1, "the root's call 0 ended");
        let (out1, records1) = step3_at(&mut q1, &bs[1], Time::ZERO);
        assert!(records1.iter().all(|r| !r.failed()), "{records1:?}");
        assert!(
            matches!(out1.as_slice(), [(w, Ok(_))] if *w == last),
            "before its hold ran out: {out1:?}"
        );
        assert_eq!(q1.hold_until(), None);
    }

    #[test]
    fn a_root_waits_for_the_slots_it_needs_and_names_the_missing_members() {
        let (_, bs) = three();
        let mut q0 = Queue::new(3);
        assert!(q0.is_empty());
        q0.push(0, reduce(3, 0, 0), false, 10, Time::ZERO);
        q0.push(1, reduce(3, 0, 0), false, 11, Time::ZERO);
        assert_eq!(q0.len(), 2);
        assert!(!q0.is_empty());
        let (out, records, (moved, done)) = step3(&mut q0, &bs[0]);
        assert!(out.is_empty() && records.is_empty(), "{out:?} {records:?}");
        assert!(moved, "both slots were published");
        assert_eq!(done, 0);
        assert_eq!(q0.len(), 2, "published, still waiting: not done with");
        // Member 1 gives its slot; member 2 does not.
        let mut q1 = Queue::new(3);
        q1.push(0, reduce(3, 1, 0), false, 20, Time::ZERO);
        let (out1, _, _) = step3(&mut q1, &bs[1]);
        assert_eq!(out1.len(), 1, "a non-root needs nobody");
        let first = q0.first_waiting().map(|p| p.seq);
        assert_eq!(first, Some(0));
        let p = q0.first_waiting().map(|p| Queue::missing(&bs[0], p));
        assert_eq!(p, Some(vec![2]), "only member 2's slot is missing");
        let (out, _, (moved, done)) = step3(&mut q0, &bs[0]);
        assert!(
            out.is_empty() && !moved && done == 0,
            "still waiting for member 2"
        );
    }

    #[test]
    fn the_first_waiting_call_ends_and_its_slot_is_given_up() {
        let (lanes, bs) = three();
        let mut q0 = Queue::new(3);
        q0.push(0, reduce(3, 0, 0), false, 10, Time::ZERO);
        q0.push(1, reduce(3, 0, 0), false, 11, Time::ZERO);
        let _ = step3(&mut q0, &bs[0]);
        assert_eq!(q0.end_first_waiting(&bs[0]), Some(10));
        assert_eq!(lanes[0].load(0), Some(1), "call 0 is finished here");
        assert_eq!(q0.pop_done(), 1);
        assert_eq!(q0.first_waiting().map(|p| p.seq), Some(1));
        assert_eq!(q0.end_first_waiting(&bs[0]), Some(11));
        assert_eq!(q0.pop_done(), 1);
        assert!(q0.is_empty());
        assert_eq!(q0.end_first_waiting(&bs[0]), None, "nothing waits");
    }

    #[test]
    fn abandoned_slots_leave_nothing_to_publish_or_look_at() {
        // Member 0 roots DEPTH + 1 broadcasts: the last ends at once but cannot publish
        // (member 1 has not finished call 0). The group ends: it is done with.
        let (_, bs) = three();
        let mut q0 = Queue::new(3);
        for seq in 0..=DEPTH as u64 {
            q0.push(seq, broadcast(3, 0, 0), false, seq, Time::ZERO);
        }
        let (out, _, (_, done)) = step3(&mut q0, &bs[0]);
        assert_eq!(out.len(), DEPTH + 1);
        assert_eq!(done, DEPTH, "all but the unpublished one");
        assert_eq!(q0.len(), 1);
        q0.abandon_slots();
        assert_eq!(q0.pop_done(), 1);
        assert!(q0.is_empty());
    }

    fn far() -> Time {
        Time::ZERO + std::time::Duration::from_secs(1 << 30)
    }

    /// Rank 0 of a world of 2 whose engine made broadcast `seq` 0 (root 1) on the board,
    /// queued with `deadline`: its queue, board and engine.
    fn judged_world(
        grace: std::time::Duration,
        deadline: Time,
    ) -> (Queue<u64>, Board, GroupInfo, Engine) {
        let g = GroupInfo::world(
            2,
            0,
            GroupOptions {
                desync_grace: grace,
                ..GroupOptions::default()
            },
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let mut e = Engine::new(0);
        e.add_group(g.clone(), Time::ZERO);
        let lanes: Vec<Arc<dyn Lane>> =
            vec![Arc::new(HeapLane::default()), Arc::new(HeapLane::default())];
        let b = Board::new(lanes, 0).unwrap_or_else(|e| panic!("{e}"));
        let call = broadcast(2, 0, 1);
        assert_eq!(e.board_made(g.id, 0, call.fingerprint()), None);
        let mut q = Queue::new(2);
        q.push(0, call, false, 7, deadline);
        let _ = step(&mut q, &b, 0);
        (q, b, g, e)
    }

    #[test]
    fn a_call_past_its_deadline_asks_the_group_then_ends_with_the_verdict() {
        let (s1, grace) = (
            Time::ZERO + std::time::Duration::from_secs(1),
            std::time::Duration::from_millis(500),
        );
        let (mut q, b, g, mut e) = judged_world(grace, s1);
        // Before its deadline: nothing ends, judge again at the deadline.
        let j = q.judge(&b, &g, &mut e, false, Time::ZERO);
        assert!(j.ended.is_empty());
        assert_eq!((j.next, j.done), (Some(s1), 0));
        // At it: the other member is asked which call it is in, and the call waits for the
        // report.
        let j = q.judge(&b, &g, &mut e, false, s1);
        assert!(j.ended.is_empty());
        assert_eq!(j.next, Some(s1 + grace));
        let asked = e
            .poll_transmit()
            .unwrap_or_else(|| panic!("no inquiry sent"));
        assert_eq!(asked.dst, 1);
        assert!(matches!(
            asked.msg.header,
            crate::wire::message::Header::Inquire { seq: 0, .. }
        ));
        // Before the report's end: it still waits for the answers.
        let j = q.judge(&b, &g, &mut e, false, s1 + grace / 2);
        assert!(j.ended.is_empty(), "{j:?}");
        assert_eq!(j.next, Some(s1 + grace));
        // Nobody answered by the report's end: a timeout that names the member whose slot it
        // needs, and the call is done with (its slot is not published any more).
        let j = q.judge(&b, &g, &mut e, false, s1 + grace);
        assert_eq!(j.ended.len(), 1, "{j:?}");
        assert_eq!((j.ended[0].seq, j.ended[0].waiting), (0, Some(7)));
        match j.ended[0].error.root_cause() {
            Error::Timeout { waiting_for, .. } => assert_eq!(waiting_for, &vec![1]),
            other => panic!("not a timeout: {other:?}"),
        }
        assert_eq!((j.next, j.done), (None, 1));
        assert!(q.is_empty());
    }

    #[test]
    fn without_a_report_a_call_past_its_deadline_times_out_at_once() {
        let s1 = Time::ZERO + std::time::Duration::from_secs(1);
        let (mut q, b, g, mut e) = judged_world(std::time::Duration::ZERO, s1);
        let j = q.judge(&b, &g, &mut e, false, s1);
        assert_eq!(j.ended.len(), 1);
        assert!(
            matches!(&j.ended[0].error, Error::Timeout { waiting_for, .. } if waiting_for == &vec![1])
        );
        assert!(
            e.poll_transmit().is_none_or(|t| !matches!(
                t.msg.header,
                crate::wire::message::Header::Inquire { .. }
            )),
            "nobody asked"
        );
        assert_eq!(j.done, 1);
    }

    #[test]
    fn a_quiesced_rank_ends_its_calls_with_shutdown_and_gives_up_their_slots() {
        let (mut q, b, g, mut e) = judged_world(std::time::Duration::from_secs(1), far());
        let call = broadcast(2, 0, 1);
        assert_eq!(e.board_made(g.id, 1, call.fingerprint()), None);
        q.push(1, call, false, 8, far());
        let j = q.judge(&b, &g, &mut e, true, Time::ZERO);
        let got: Vec<_> = j
            .ended
            .iter()
            .map(|x| (x.seq, x.waiting, x.error.clone()))
            .collect();
        assert_eq!(
            got,
            vec![(0, Some(7), Error::Shutdown), (1, Some(8), Error::Shutdown)]
        );
        assert_eq!((j.next, j.done), (None, 2));
    }

    #[test]
    fn a_call_of_an_aborted_group_ends_with_the_abort() {
        let (mut q, b, g, mut e) = judged_world(std::time::Duration::from_secs(1), far());
        let cause = Error::internal("a member's part failed");
        e.board_failed(g.id, 1, cause.clone());
        let j = q.judge(&b, &g, &mut e, false, Time::ZERO);
        assert_eq!(j.ended.len(), 1);
        assert!(
            matches!(&j.ended[0].error, Error::GroupAborted { cause: c, .. } if **c == cause),
            "{:?}",
            j.ended[0].error
        );
        assert_eq!(j.done, 1, "an aborted group's slots are given up");
    }

    #[test]
    fn an_aborted_groups_calls_that_ended_unpublished_give_up_their_slots() {
        // Member 0, a broadcast's root, runs DEPTH + 1 calls ahead: the last ended at once,
        // but its slot is still taken, so it is not done with (it owes its look). Once the
        // group is aborted nobody will read that slot: the call is done with.
        let g = GroupInfo::world(2, 0, GroupOptions::default()).unwrap_or_else(|e| panic!("{e}"));
        let mut e = Engine::new(0);
        e.add_group(g.clone(), Time::ZERO);
        let lanes: Vec<Arc<dyn Lane>> =
            vec![Arc::new(HeapLane::default()), Arc::new(HeapLane::default())];
        let b = Board::new(lanes, 0).unwrap_or_else(|e| panic!("{e}"));
        let mut q = Queue::new(2);
        for seq in 0..=DEPTH as u64 {
            q.push(seq, broadcast(2, 0, 0), false, seq, far());
        }
        let (out, _) = step(&mut q, &b, 0);
        assert_eq!(out.len(), DEPTH + 1);
        assert_eq!(
            q.len(),
            1,
            "the last call waits to publish, and owes its look"
        );
        e.board_failed(g.id, 0, Error::internal("a member's part failed"));
        let j = q.judge(&b, &g, &mut e, false, Time::ZERO);
        assert!(j.ended.is_empty(), "no call waits for its result: {j:?}");
        assert_eq!(j.done, 1, "its slot is given up");
        assert!(q.is_empty());
    }

    #[test]
    fn a_call_is_queued_once_the_engine_made_it_and_given_back_when_refused() {
        let (mut q, b, g, mut e) = judged_world(std::time::Duration::from_secs(1), far());
        let call = broadcast(2, 0, 1);
        let made = q.submit(&mut e, g.id, 1, call.clone(), false, 8, far());
        assert!(made.is_ok());
        assert_eq!(q.len(), 2, "queued behind call 0");
        e.board_failed(g.id, 1, Error::internal("a member's part failed"));
        let refused = q.submit(&mut e, g.id, 2, call, false, 9, far());
        assert!(
            matches!(&refused, Err((9, Error::GroupAborted { .. }))),
            "{refused:?}"
        );
        assert_eq!(q.len(), 2, "not queued");
        let _ = b;
    }

    #[test]
    fn the_members_a_call_still_needs_are_those_of_its_own_member() {
        // A reduce to member 1 of three: its root needs every other slot, the others none.
        let lanes: Vec<Arc<dyn Lane>> = (0..3)
            .map(|_| Arc::new(HeapLane::default()) as Arc<dyn Lane>)
            .collect();
        let reduce = |me: usize| {
            let req = Request::Reduce {
                tensor: Tensor::from_vec(vec![me as f32]),
                root: 1,
                op: crate::tensor::reduce::ReduceOp::Sum,
            };
            match BoardCall::of(&req, &info(3, me), &CallOptions::default()) {
                Some(Ok(c)) => c,
                other => panic!("not a board call: {other:?}"),
            }
        };
        for (me, needs) in [(0, vec![]), (1, vec![0, 2]), (2, vec![])] {
            let b = Board::new(lanes.clone(), me).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(b.me(), me);
            let mut q: Queue<u64> = Queue::new(3);
            q.push(0, reduce(me), false, 0, Time::ZERO);
            let p = q.first_waiting().unwrap_or_else(|| panic!("queued"));
            assert_eq!(Queue::missing(&b, p), needs, "member {me}");
        }
    }
}
