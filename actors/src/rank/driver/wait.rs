//! A caller waiting for its call: it drives its rank for the spin budget, then parks on the
//! rank's bell, which a completion rings (and which hands a parked caller the background
//! run before the actor gets it).

use super::{Driver, PollerKind};
use crate::sync::lock;
use std::sync::atomic::{fence, Ordering};
use std::time::{Duration, Instant};

/// Spin turns between two yields of a caller whose host has more ranks than cores.
pub(crate) const YIELD_TURNS: u32 = 1;
/// Spin turns between two yields of a process's caller whose host has a core per rank: often
/// enough for the process's own threads (its shared-memory progress thread, its actor) to
/// run soon when they are woken, rarely enough that the yields (system calls) stay off the
/// path of a small call.
pub(crate) const YIELD_TURNS_SPARSE: u32 = 32;
/// How long a waiting caller drives its rank before it parks, unless `COLLECTIX_SPIN_US`
/// says otherwise.
pub(crate) const DEFAULT_SPIN: Duration = Duration::from_micros(50);
/// The default spin budget of a rank of a multi-process job: a message over TCP crosses two
/// more threads (the sender's writer, the receiver's reader), each hand-off 20–30 µs on a
/// small VM, so a caller spinning only [`DEFAULT_SPIN`] would park before most answers came.
pub(crate) const DEFAULT_SPIN_TCP: Duration = Duration::from_micros(200);
/// The spin budget from `COLLECTIX_SPIN_US` (microseconds; 0: a waiting caller parks at
/// once and the actor does all the work), or `default`.
pub(crate) fn spin_from_env(default: Duration) -> Duration {
    match std::env::var("COLLECTIX_SPIN_US") {
        Err(_) => default,
        Ok(v) => match v.trim().parse::<u64>() {
            Ok(us) => Duration::from_micros(us.min(1_000_000)),
            Err(_) => {
                tracing::warn!(value = %v, "COLLECTIX_SPIN_US is not a number of microseconds; using the default");
                default
            }
        },
    }
}
/// A caller reading a [`Poller`]'s arrivals: leaves when dropped.
struct Reading<'a>(&'a dyn super::Poller);

impl Drop for Reading<'_> {
    fn drop(&mut self) {
        self.0.leave();
    }
}

/// The parked callers of a rank, and whether one of them was asked to run it.
#[derive(Default)]
pub(super) struct Bell {
    sleepers: usize,
    /// A background run was asked for and handed to a sleeper.
    rung: bool,
    /// Raised each time a transport posted work every thread of the rank may share (a large
    /// read in pieces): each sleeper that saw an older value wakes to take its part.
    help: u64,
}

/// A caller counted as reading the rank's transports that it polls itself (shared memory,
/// TCP: [`Driver::read_transports`]); it stops counting when dropped.
pub(super) struct Readers<'a> {
    _reading: [Option<Reading<'a>>; 2],
}

impl Driver {
    /// Counts the caller as a reader of the transports it polls itself (a sender then rings
    /// no doorbell for it), until the result is dropped.
    pub(super) fn read_transports(&self) -> Readers<'_> {
        let polled = [
            self.pollers[PollerKind::Shm as usize]
                .get()
                .map(|p| p.as_ref()),
            self.pollers[PollerKind::Tcp as usize]
                .get()
                .map(|p| p.as_ref()),
        ];
        let _reading = polled.map(|p| {
            p.map(|p| {
                p.enter();
                Reading(p)
            })
        });
        Readers { _reading }
    }

    /// Wakes whoever makes the asked-for background run: a caller parked on this rank if
    /// there is one (it then drives the rank again, as in its wait), else the actor.
    pub(super) fn wake_background(&self) {
        {
            let mut b = lock(&self.bell);
            if b.sleepers > 0 {
                b.rung = true;
                self.bell_rung.notify_one();
                return;
            }
        }
        self.wake_actor();
    }
    /// Wakes every caller parked on this rank to take part in work a transport posted for
    /// all of the rank's threads (a large read in pieces,
    /// `collectix_runtime::wire::shm::shared_read`): each drives the rank again, which
    /// takes pieces while any is left, then parks again if its call is not done. Nobody
    /// is woken when no caller is parked (the actor has no part in it).
    pub(crate) fn wake_helpers(&self) {
        fence(Ordering::SeqCst);
        if self.sleeping.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut b = lock(&self.bell);
        if b.sleepers > 0 {
            b.help = b.help.wrapping_add(1);
            self.bell_rung.notify_all();
        }
    }
    /// Tells the parked callers that calls completed (theirs may be among them).
    pub(super) fn completed(&self) {
        // Pairs with the fence in `sleep_until`: the results were set before this fence, so a
        // caller counted after it sees its call completed and does not park.
        fence(Ordering::SeqCst);
        if self.sleeping.load(Ordering::Relaxed) == 0 {
            return;
        }
        let b = lock(&self.bell);
        if b.sleepers > 0 {
            self.bell_rung.notify_all();
        }
    }
    /// Wakes the callers parked on this rank to look at their calls again: for a call
    /// completed outside a run of the engine (a device transfer completed by its worker
    /// thread), which the engine's own completions would not announce.
    pub(crate) fn notify(&self) {
        self.completed();
    }
    /// Parks a caller until `done()` (its call completed) or the bell asks it to run the
    /// rank: then it makes the background run and drives the rank while arrivals keep
    /// coming, as in its wait, before it parks again. A long call whose caller parked while
    /// its peers were late is thus still driven by its caller, with no actor hand-off per
    /// message.
    pub(crate) fn sleep_until(&self, done: &dyn Fn() -> bool) {
        if done() {
            // Not counted as a sleeper: nobody handed this caller a run.
            return;
        }
        loop {
            let rung = {
                let mut b = lock(&self.bell);
                b.sleepers += 1;
                self.sleeping.store(b.sleepers, Ordering::Relaxed);
                // Pairs with the fence in `completed`: a completion that did not see this
                // count is seen by `done()` below.
                fence(Ordering::SeqCst);
                let seen = b.help;
                while !b.rung && b.help == seen && !done() {
                    b = self.bell_rung.wait(b).unwrap_or_else(|e| e.into_inner());
                }
                b.sleepers -= 1;
                self.sleeping.store(b.sleepers, Ordering::Relaxed);
                std::mem::take(&mut b.rung)
            };
            if rung {
                // The run asked for must happen even if this caller's call is done now; the
                // actor still owns the timer.
                if let Some(at) = self.background() {
                    if at.as_nanos() < self.timer_at.load(Ordering::SeqCst) && self.inbox.ask() {
                        self.wake_actor();
                    }
                }
            }
            if done() {
                return;
            }
            self.drive_until(done, self.spin, Duration::MAX);
            if done() {
                return;
            }
        }
    }
    /// Drives the rank until `done()` says so, for at most `limit` in all, and until it has
    /// been idle (nothing arrived) for `idle`: a long call that keeps receiving is driven by
    /// its caller to the end, a call waiting for a slow peer parks. Then it stops driving
    /// (taking what arrived meanwhile, so that nothing is left behind for nobody); the caller
    /// parks on its call's slot if it is not done, and the actor finishes the work.
    pub(crate) fn drive_until(&self, done: &dyn Fn() -> bool, idle: Duration, limit: Duration) {
        if idle.is_zero() || limit.is_zero() || done() {
            return;
        }
        let driving = self.inbox.enter();
        let (shm, tcp) = (
            self.pollers[PollerKind::Shm as usize].get(),
            self.pollers[PollerKind::Tcp as usize].get(),
        );
        // Leaves on every way out, a panic in a completion included (a reader count left
        // behind would keep the transport's senders from waking its thread).
        let _reading = [shm, tcp].map(|p| {
            p.map(|p| {
                p.enter();
                Reading(p.as_ref())
            })
        });
        self.board_enter();
        let start = Instant::now();
        let mut active = start;
        let mut turns: u32 = 0;
        loop {
            if shm.is_some_and(|p| p.poll()) | tcp.is_some_and(|p| p.poll()) {
                active = Instant::now();
            }
            if self.board_progress() {
                active = Instant::now();
            }
            if !self.inbox.looks_empty() || self.mail_looks_ready() {
                self.try_run();
                turns = 0;
                active = Instant::now();
            }
            if done() {
                break;
            }
            turns = turns.wrapping_add(1);
            if turns.is_multiple_of(64) {
                let now = Instant::now();
                if now.duration_since(active) >= idle || now.duration_since(start) >= limit {
                    break;
                }
            }
            self.pause(turns);
        }
        if !done() {
            for p in [shm, tcp].into_iter().flatten() {
                p.parking();
            }
        }
        // Reads once more after it stops counting as a reader: what a sender published before
        // it saw this caller gone is taken here, what came after it wakes the transport's
        // thread.
        drop(_reading);
        self.board_leave();
        self.leave_driving(driving);
    }
    /// One turn of a spin: a pause, and every `YIELD_TURNS` turns, when the process's
    /// ranks outnumber the cores, the core itself (the rank we wait for may need it).
    pub(super) fn pause(&self, turns: u32) {
        if self.yield_every > 0 && turns.is_multiple_of(self.yield_every) {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
    /// One turn of a quick path's spin ([`board_quick`](Driver::board_quick)): the core is
    /// yielded only when the host's ranks outnumber its cores. With a core per rank the
    /// now-and-then yield of [`pause`](Self::pause) (for the process's own threads, which a
    /// quick path does not wait for) lets the scheduler keep two ranks on one core, each
    /// yielding to the other, at several microseconds a call.
    pub(super) fn pause_quick(&self, turns: u32) {
        if self.yield_every == YIELD_TURNS && turns.is_multiple_of(YIELD_TURNS) {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
    /// One run of the engine if arrivals wait and nobody drives it now (a `Work` polled
    /// again).
    pub(crate) fn poke(&self) {
        if !self.inbox.looks_empty() {
            self.try_run();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Driver, Poller, PollerKind, DEFAULT_SPIN};
    use collectix_runtime::{Engine, GroupInfo, GroupOptions};
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    /// A transport that counts how often a caller read it.
    #[derive(Default)]
    struct Counting(AtomicUsize);

    impl Poller for Counting {
        fn enter(&self) {}
        fn poll(&self) -> bool {
            self.0.fetch_add(1, Ordering::SeqCst);
            false
        }
        fn leave(&self) {}
        fn drain(&self) {}
    }

    /// A caller parked for its call is woken when a transport posts work for every thread
    /// of the rank (a large read in pieces) and drives the rank again, where it takes its
    /// part; nobody wakes it otherwise. (Before: a parked caller slept through the whole
    /// read while one thread copied and a core stood idle.)
    #[test]
    fn a_parked_caller_wakes_to_help_and_parks_again() {
        let world =
            GroupInfo::world(2, 0, GroupOptions::default()).unwrap_or_else(|e| panic!("{e}"));
        let d = Arc::new(Driver::new(Engine::new(0), world, DEFAULT_SPIN, 0));
        let polls = Arc::new(Counting::default());
        d.set_poller(PollerKind::Shm, polls.clone());
        let done = Arc::new(AtomicBool::new(false));
        let caller = {
            let (d, done) = (d.clone(), done.clone());
            std::thread::spawn(move || d.sleep_until(&|| done.load(Ordering::SeqCst)))
        };
        let start = Instant::now();
        while d.sleeping.load(Ordering::SeqCst) == 0 {
            assert!(start.elapsed() < Duration::from_secs(10), "never parked");
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(50));
        let before = polls.0.load(Ordering::SeqCst);
        assert_eq!(before, 0, "a parked caller read the transport unasked");
        d.wake_helpers();
        while polls.0.load(Ordering::SeqCst) == before {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "the caller slept on"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        // It parks again, its call not done.
        while d.sleeping.load(Ordering::SeqCst) == 0 {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "never parked again"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(
            !caller.is_finished(),
            "the caller returned with its call not done"
        );
        done.store(true, Ordering::SeqCst);
        d.completed();
        caller
            .join()
            .unwrap_or_else(|_| panic!("the caller panicked"));
    }
}
