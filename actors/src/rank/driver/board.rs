//! Small calls on the board ([`collectix_runtime::board`]), driven by the rank's [`Driver`].
//!
//! A call on the board is queued on its group's [`GroupBoard`] and runs in the group's order:
//! it is *published* (its slot written) as soon as its slot is free, and *finished* (the
//! other members' slots read, the result made) once every slot it needs is there, one call
//! after another (a call may finish before it is published). Whoever is at hand does it, as
//! for the engine: the caller that issues it, a caller that waits (every turn of
//! [`Driver::drive_until`]), the rank's background driver (every run of the engine, so the
//! actor's too), the shared-memory progress thread. A member that publishes or finishes wakes
//! the members whose last driver left with calls pending (their parked caller, or their
//! actor: [`Signal`], or across processes the mirror in their lane and their doorbell), and
//! owes a wake-up to those whose calls were issued but not yet waited for ([`OwedWakes`]: settled
//! after a grace on its next progress, or when it stops driving).
//!
//! The engine keeps the calls' records (made, finished, failed: `Engine::board`; finishes
//! go in with the next run), and every run of the engine looks at the first unfinished call
//! of each board: if the group was aborted (a lost peer, a mismatch, a revoke), a member's
//! part failed before it started, or the rank is shutting down, the call fails with the
//! engine's error; past its deadline the group is asked which call each member is in (the
//! desync report), whose verdict ends it. The earliest deadline is part of the actor's timer.

use super::recorder::{Key, Recorder};
use super::state::Waiting;
use super::{After, Core, Done, Driver};
use crate::sync::lock;
use collectix_runtime::board::queue::{Queue, Record};
use collectix_runtime::board::wake::Need;
use collectix_runtime::board::{Board, BoardCall};
use collectix_runtime::{BoardEvent, Error, GroupInfo, Output, Result, Time};
use std::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

mod quick;
mod records;
mod wake;
pub(crate) use collectix_runtime::board::ran::Ran;
pub(crate) use quick::Quick;
pub(crate) use wake::{OwedWakes, Signal, Wake};

/// What a rank holds of its boards: those with calls waiting, and its [`Signal`].
pub(crate) struct Boards {
    live: Mutex<Vec<Arc<GroupBoard>>>,
    pub(crate) signal: Arc<Signal>,
    owed: OwedWakes,
    /// Queued calls finished on a board whose records the engine has not taken yet: they go
    /// in with the rank's next run of the engine (its next call, or whatever runs it first),
    /// so that a call on the board takes the engine's lock once, not twice. Failures go in
    /// at once (they abort the group).
    finished: Mutex<Vec<(collectix_runtime::GroupId, Record)>>,
    finished_n: AtomicUsize,
    /// The boards whose quick calls' records ([`Ran`], under each board's issue lock) the
    /// engine has not taken yet, and whether there are any.
    ran: Mutex<Vec<Arc<GroupBoard>>>,
    ran_any: AtomicBool,
    /// Where a progress collects the results it hands over (kept for its allocation).
    scratch: Mutex<Vec<(Waiting, Result<Output>)>>,
}

impl Default for Boards {
    fn default() -> Self {
        Boards {
            live: Mutex::new(Vec::new()),
            owed: OwedWakes::default(),
            finished: Mutex::new(Vec::new()),
            finished_n: AtomicUsize::new(0),
            ran: Mutex::new(Vec::new()),
            ran_any: AtomicBool::new(false),
            scratch: Mutex::new(Vec::new()),
            signal: Arc::new(Signal::default()),
        }
    }
}

/// A group's board as one rank holds it: the board, the group, how to wake each other
/// member, and this rank's calls on it. On cache lines of its own: each call takes its locks,
/// and the members' copies in one process are allocated one after another (a line shared
/// with another member's copy would move between their cores on every call).
#[repr(align(128))]
pub(crate) struct GroupBoard {
    board: Board,
    pub(super) info: GroupInfo,
    wake: Vec<Option<Arc<dyn Wake>>>,
    queue: Mutex<Queue<Waiting>>,
    /// Held from taking a call's sequence number to queueing it, so that the queue is in
    /// sequence order when several threads call on the group at once (the calls finish in
    /// that order; `Board::finish` only goes up).
    /// It also guards the records of the calls that ran on this board's quick path and the
    /// engine has not taken yet ([`Ran`]).
    pub(crate) issue: Mutex<Ran>,
    /// This board is in the rank's list of boards with such records (`Boards::ran`; read
    /// and written under the issue lock).
    listed: AtomicBool,
    /// The group's barrier as it runs on this board (the same for every barrier).
    barrier: BoardCall,
    /// Calls in `queue` (read by the quick path without its lock; written under it).
    queued: AtomicUsize,
    /// The engine's [`board_epoch`](collectix_runtime::Engine::board_epoch) when the quick
    /// path last found the group clear, and up to which call it is (see
    /// [`Driver::board_quick`]; `u64::MAX`: never checked). Written under the issue lock.
    clear_epoch: AtomicU64,
    clear_until: AtomicU64,
    /// The group's mailboxes, for its small sends and receives (`None`: they go through
    /// the engine).
    pub(crate) mail: Option<super::GroupMail>,
}

/// A call's `tracing` span, and when it started (`None` when nobody records the span: a
/// clock read per call is a measurable part of a small call).
pub(crate) struct BoardSpan(tracing::Span, Option<std::time::Instant>);

impl BoardSpan {
    /// Closes the span of a call that finished on its quick path.
    pub(crate) fn finished(self, result: &Result<Output>) {
        Waiting::log(&self.0, self.1, result);
    }
}

/// A call to queue on a board ([`Driver::submit_board`]).
pub(crate) struct BoardSubmit {
    /// Its sequence number in the group.
    pub(crate) seq: u64,
    pub(crate) call: BoardCall,
    /// How long it may wait for the other members.
    pub(crate) timeout: Duration,
    /// Its slot is published already (its quick path did not finish it).
    pub(crate) published: bool,
    pub(crate) span: BoardSpan,
}

impl GroupBoard {
    /// Member `info.rank`'s view of a board whose other members are woken through `wake`
    /// (one per member, in group order; this member's is not used).
    pub(crate) fn new(
        board: Board,
        info: GroupInfo,
        wake: Vec<Option<Arc<dyn Wake>>>,
        mail: Option<super::GroupMail>,
    ) -> Self {
        let n = board.size();
        GroupBoard {
            board,
            info,
            wake,
            queue: Mutex::new(Queue::new(n)),
            issue: Mutex::new(Ran::default()),
            listed: AtomicBool::new(false),
            barrier: BoardCall::barrier(),
            queued: AtomicUsize::new(0),
            clear_epoch: AtomicU64::new(u64::MAX),
            clear_until: AtomicU64::new(0),
            mail,
        }
    }

    /// Publishes what it can and ends what it can, each in order ([`Queue::step`]):
    /// whether anything moved, and how many calls are done with.
    fn step(
        &self,
        q: &mut Queue<Waiting>,
        out: &mut Vec<(Waiting, Result<Output>)>,
        records: &mut Vec<(collectix_runtime::GroupId, Record)>,
        clock: &dyn Fn() -> Time,
    ) -> (bool, usize) {
        let mut mine = Vec::new();
        let r = q.step(&self.board, &self.info, clock, out, &mut mine);
        records.extend(mine.into_iter().map(|r| (self.info.id, r)));
        self.queued.store(q.len(), Ordering::Release);
        r
    }

    /// Wakes the other members that wait and are not driven (those that may be about to
    /// drive go to `owed`).
    fn wake_others(&self, owed: &OwedWakes) {
        fence(Ordering::SeqCst);
        self.look_at_others(owed);
    }

    /// [`wake_others`](Self::wake_others) without its fence: it may miss a member that just
    /// began to wait (the quick path looks so while it spins, to wake a waiting member soon,
    /// and with the fence once at its end: see [`Driver::board_quick`]).
    fn look_at_others(&self, owed: &OwedWakes) {
        for w in self.wake.iter().flatten() {
            match w.need() {
                Need::No => {}
                Need::Now => w.wake_now(),
                Need::Soon => owed.add(w),
            }
        }
    }

    /// An engine call `fp` at `seq` finds another member's slot of `seq` on the board
    /// ([`Board::clash`]).
    pub(crate) fn clash(&self, seq: u64, fp: collectix_runtime::Fingerprint) -> Option<Error> {
        self.board.clash(&self.info, seq, fp)
    }

    /// The group's barrier as it runs on this board.
    pub(crate) fn barrier(&self) -> &BoardCall {
        &self.barrier
    }

    /// The `tracing` span of call `seq` (`fp`) on this board, made when it takes its
    /// sequence number.
    pub(crate) fn span(&self, seq: u64, fp: &collectix_runtime::Fingerprint) -> BoardSpan {
        let span = tracing::debug_span!(
            "call",
            rank = self.info.global(self.info.rank),
            group = %self.info.id,
            seq,
            op = %fp.kind,
            dtype = %fp.dtype,
            count = fp.count,
            algorithm = "board",
            bytes = fp.count.map(|c| c.saturating_mul(fp.dtype.size() as u64)),
        );
        let start = (!span.is_disabled()).then(std::time::Instant::now);
        BoardSpan(span, start)
    }
}

impl Driver {
    /// Queues call `c` on `gb`'s board (under the group's issue lock): the engine records it
    /// as made, or says why it cannot be (handed back with `done`, for the caller to
    /// complete once the lock is released); `done` gets its result. Its deadline is for
    /// [`submitted_board`](Self::submitted_board); what the run completed meanwhile (engine
    /// calls) is handed back too, for [`hand_over`](Self::hand_over).
    pub(crate) fn submit_board(
        &self,
        gb: &Arc<GroupBoard>,
        ran: &mut Ran,
        c: BoardSubmit,
        done: Done<Output>,
    ) -> (std::result::Result<Time, (Done<Output>, Error)>, After) {
        let BoardSubmit {
            seq,
            call,
            timeout,
            published,
            span,
        } = c;
        let gid = gb.info.id;
        let fp = call.fingerprint();
        self.board_run_deferred(move |core, now| {
            // This group's quick calls first (the run could not take them: this caller
            // holds the issue lock).
            core.take_ran(gid, ran);
            if core.quiesced {
                return Err((done, Error::Shutdown));
            }
            let deadline = now + timeout;
            let BoardSpan(span, start) = span;
            // Queued under the engine's lock (core, then boards, then queue: the order of
            // `board_checks`): a run that aborts the group, or quiesces the rank, either came
            // before the engine took the call or finds it in the queue and ends it. Queued
            // after the lock is released, a call could miss the abort a run just took and
            // wait for its deadline.
            let mut live = lock(&self.boards.live);
            let mut q = lock(&gb.queue);
            let waiting = Waiting { done, span, start };
            let made = q.submit(
                &mut core.engine,
                gid,
                seq,
                call,
                published,
                waiting,
                deadline,
            );
            if let Err((w, e)) = made {
                return Err((w.done, e));
            }
            gb.queued.store(q.len(), Ordering::Release);
            drop(q);
            let record = Recorder::record(gid, Some(seq), fp.kind, fp.dtype, fp.count, now);
            core.recorder.started(Key::Board(gid, seq), record);
            self.boards.signal.activity.add_pending(1);
            if !live.iter().any(|b| Arc::ptr_eq(b, gb)) {
                live.push(gb.clone());
            }
            Ok(deadline)
        })
    }

    /// After [`submit_board`](Self::submit_board), once the group's issue lock is released:
    /// the call is published (if its slot is free) and the timer covers its deadline.
    pub(crate) fn submitted_board(&self, deadline: Time) {
        self.board_progress();
        self.check_timer(Some(deadline));
    }

    /// Publishes and finishes what it can on this rank's boards (in each group's order);
    /// whether anything moved. Results are handed over outside every lock.
    pub(crate) fn board_progress(&self) -> bool {
        self.board_progress_with(false)
    }

    /// [`board_progress`](Self::board_progress) by a thread about to stop looking (the last
    /// driver leaving, a progress thread about to park): it waits for the boards' lock
    /// rather than trusting whoever holds it, who may have read a slot before it was
    /// published and will not look again.
    pub(crate) fn board_progress_last(&self) -> bool {
        self.board_progress_with(true)
    }

    fn board_progress_with(&self, wait: bool) -> bool {
        self.boards.owed.settle();
        if !self.boards.signal.activity.any_pending() {
            return false;
        }
        let mut live = if wait {
            lock(&self.boards.live)
        } else {
            match self.boards.live.try_lock() {
                Ok(l) => l,
                Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => return false,
            }
        };
        let mut out = std::mem::take(&mut *lock(&self.boards.scratch));
        let mut records: Vec<(collectix_runtime::GroupId, Record)> = Vec::new();
        let mut moved = false;
        let mut done = 0;
        let clock = || self.now();
        let mut hold: Option<Time> = None;
        for gb in live.iter() {
            // The queue's lock is taken under `live` only by the submit path's push, briefly.
            let mut q = lock(&gb.queue);
            let (m, d) = gb.step(&mut q, &mut out, &mut records, &clock);
            if let Some(h) = q.hold_until() {
                hold = Some(hold.map_or(h, |t| t.min(h)));
            }
            drop(q);
            done += d;
            if m {
                moved = true;
                gb.wake_others(&self.boards.owed);
            }
        }
        if done > 0 {
            live.retain(|gb| !lock(&gb.queue).is_empty());
            self.boards.signal.activity.sub_pending(done);
        }
        drop(live);
        // A call waiting a while for its slot (`queue::HOLD`) is looked at again then.
        self.check_timer(hold);
        if records.is_empty() {
            *lock(&self.boards.scratch) = out;
            return moved;
        }
        let (failed, finished): (Vec<_>, Vec<_>) =
            records.into_iter().partition(|(_, r)| r.failed());
        if !finished.is_empty() {
            let mut f = lock(&self.boards.finished);
            f.extend(finished);
            self.boards.finished_n.store(f.len(), Ordering::Release);
        }
        if !failed.is_empty() {
            self.record_board(failed);
        }
        for (w, r) in out.drain(..) {
            w.finish(r);
        }
        *lock(&self.boards.scratch) = out;
        self.completed();
        true
    }

    /// Gives the engine the records of the calls finished on a board since its last run:
    /// the queued calls', and the quick paths' of each board whose issue lock is free (a
    /// board in a call now keeps them for the next run, or hands them over itself).
    pub(super) fn take_board_records(&self, core: &mut Core, now: Time) {
        if self.boards.finished_n.load(Ordering::Acquire) != 0 {
            let mut f = lock(&self.boards.finished);
            self.boards.finished_n.store(0, Ordering::Release);
            for (gid, r) in f.drain(..) {
                core.board_record(gid, r, now);
            }
        }
        if self.boards.ran_any.load(Ordering::Acquire) {
            let mut list = lock(&self.boards.ran);
            // Only tried: a caller holds its issue lock while it takes the engine's.
            list.retain(|gb| {
                let mut ran = match gb.issue.try_lock() {
                    Ok(r) => r,
                    Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
                    Err(std::sync::TryLockError::WouldBlock) => return true,
                };
                core.take_ran(gb.info.id, &mut ran);
                gb.listed.store(false, Ordering::Relaxed);
                false
            });
            self.boards
                .ran_any
                .store(!list.is_empty(), Ordering::Release);
        }
    }

    /// Gives the engine the records of calls that ended on a board.
    fn record_board(&self, records: Vec<(collectix_runtime::GroupId, Record)>) {
        self.board_run(|core, now| {
            for (gid, r) in records {
                core.board_record(gid, r, now);
            }
        });
    }

    /// A short run for the board's records: what arrived is taken first, then `f` on the
    /// core, then what the engine has to send leaves and what it completed is handed over; no
    /// board is looked at (the calls' own paths do that), so a call on the board takes the
    /// lock for its bookkeeping only.
    fn board_run<R>(&self, f: impl FnOnce(&mut Core, Time) -> R) -> R {
        let (r, after) = self.board_run_deferred(f);
        self.hand_over(after);
        r
    }

    /// [`board_run`](Self::board_run), with what it completed handed back for the caller
    /// to hand over ([`hand_over`](Self::hand_over)) once it holds no lock.
    fn board_run_deferred<R>(&self, f: impl FnOnce(&mut Core, Time) -> R) -> (R, After) {
        let mut core = lock(&self.core);
        let now = self.now();
        let epoch = self.board_epoch.load(Ordering::Acquire);
        self.take_board_records(&mut core, now);
        let mut after = After::default();
        // What arrived first goes first (an abort before this call), as in any run.
        if !self.inbox.looks_empty() {
            core.progress(&self.inbox, now, &mut after, &|c| self.read_mail(c));
        }
        let r = f(&mut core, now);
        core.drain(now, &mut after);
        if self.board_epoch.load(Ordering::Acquire) != epoch {
            // The run took an abort (or another change that may end a call on a board): the
            // calls queued on the boards are looked at in it, as in any run, else a call
            // waiting for a member that will never come would wait for its deadline.
            let (next, moved) = self.board_checks(&mut core, now, &mut after);
            drop(core);
            self.board_wake(moved);
            self.check_timer(next);
        }
        (r, after)
    }

    /// Completes the calls a run finished (user code: under no lock), and settles what the
    /// run owes the peers it handed messages to while nobody drove them (a group's abort
    /// after a mismatch seen here, above all: without it a peer parked on the board would
    /// hear of the abort only at its call's deadline).
    pub(crate) fn hand_over(&self, after: After) {
        let any = !after.finished.is_empty() || !after.refused.is_empty();
        after.complete();
        if any {
            self.completed();
        }
        self.settle(self.grace());
    }

    /// In a run of the engine: publishes and finishes what it can on each board (as
    /// [`board_progress`](Self::board_progress)), then fails the first waiting call of each
    /// board that cannot go on (see the module doc). Returns the earliest deadline of the
    /// calls left, and the boards that moved (whose other members to wake once the lock is
    /// released).
    pub(super) fn board_checks(
        &self,
        core: &mut Core,
        now: Time,
        after: &mut After,
    ) -> (Option<Time>, Vec<Arc<GroupBoard>>) {
        let mut moved = Vec::new();
        if self.boards.signal.activity.pending() == 0 {
            return (None, moved);
        }
        let mut live = lock(&self.boards.live);
        let mut next: Option<Time> = None;
        let mut done = 0;
        for gb in live.iter() {
            let gid = gb.info.id;
            let mut q = lock(&gb.queue);
            let mut records = Vec::new();
            let (stepped, d) = gb.step(&mut q, &mut after.board, &mut records, &|| now);
            done += d;
            for (gid, r) in records {
                core.board_record(gid, r, now);
            }
            // The first calls not finished: can they go on?
            let judged = q.judge(&gb.board, &gb.info, &mut core.engine, core.quiesced, now);
            if stepped || !judged.ended.is_empty() {
                moved.push(gb.clone());
            }
            for e in judged.ended {
                core.recorder
                    .ended(Key::Board(gid, e.seq), now, Some(&e.error));
                if let Some(w) = e.waiting {
                    after.board.push((w, Err(e.error)));
                }
            }
            if let Some(t) = judged.next {
                next = Some(next.map_or(t, |n| n.min(t)));
            }
            done += judged.done;
            gb.queued.store(q.len(), Ordering::Release);
        }
        live.retain(|gb| !lock(&gb.queue).is_empty());
        // Under `live`, as every change of the count (the mirror stays in order).
        if done > 0 {
            self.boards.signal.activity.sub_pending(done);
        }
        drop(live);
        // What the engine has to send now (an inquiry, an abort) leaves in this run. Only
        // sent: an arrival taken here (a member's abort) would come after the looks above,
        // and a call waiting on a board would hear of it at its deadline; it waits in the
        // inbox for the next run, which its push asked for.
        core.drain(now, after);
        (next, moved)
    }

    /// A background run (the actor's, a progress thread's) ends: the members it moved for
    /// that still need a wake-up get it now.
    pub(crate) fn board_flush(&self) {
        self.boards.owed.flush();
    }

    /// Wakes the other members of boards that moved in a run.
    pub(super) fn board_wake(&self, moved: Vec<Arc<GroupBoard>>) {
        for gb in moved {
            gb.wake_others(&self.boards.owed);
        }
    }

    /// Engine call `seq` of group `gid` met a call on the board (`e`, from
    /// [`GroupBoard::clash`]): the group is aborted and its members told.
    pub(crate) fn board_clash(&self, gid: collectix_runtime::GroupId, seq: u64, e: &Error) {
        let clash = |error| BoardEvent::Clash { seq, error };
        self.run(|core, _, _| core.engine.board(gid, clash(e.clone())));
    }

    /// A caller starts driving the rank.
    pub(super) fn board_enter(&self) {
        self.boards.signal.activity.enter();
    }

    /// A caller stops driving the rank: if it was the last and calls wait on a board, a
    /// member that moved before it could see nobody driving is seen here
    /// ([`Activity::leave`](wake::Activity::leave)).
    pub(super) fn board_leave(&self) {
        let (last, look) = self.boards.signal.activity.leave();
        if look {
            self.board_progress_last();
        }
        if last {
            self.boards.owed.flush();
        }
    }
}
