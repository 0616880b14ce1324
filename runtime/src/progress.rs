//! [`Inbox`]: a rank's arrivals, and who turns them into progress.
//!
//! A rank's engine is driven by whoever is at hand: a caller waiting for one of the rank's
//! calls drives it itself (MPI's progress in the wait: no thread hand-off on the critical
//! path), and when no caller is waiting a *background driver* (the rank's actor) does. Every
//! transport hands arrivals to the rank the same way, with [`Inbox::push`]: the in-process
//! links from the sending rank's thread, a TCP connection from its reader thread, and a
//! shared-memory ring's poller later.
//!
//! The protocol, which the loom model `progress` checks in every interleaving:
//! - A caller that drives enters ([`Inbox::enter`]) and, while it is counted, takes what
//!   arrives ([`Inbox::take`]). Before it stops driving it leaves ([`Driving::leave`]), which
//!   says whether arrivals are waiting that nobody else will take: it then takes them itself.
//! - [`Inbox::push`] says whether the pusher must wake the background driver: only when no
//!   caller drives and nobody has woken it since it last started a run
//!   ([`Inbox::begin_background`]). One wake-up covers a burst of arrivals.
//! - A pusher that can look again shortly (a caller's thread, which goes on to wait for its
//!   own call) may defer that decision: [`Inbox::push_deferred`] asks nobody, and the pusher
//!   then owes an [`Inbox::ask_if_unattended`] within a bounded time. Between two calls a
//!   rank's caller is briefly not driving; a peer's message landing in that gap would wake the
//!   rank's actor for nothing, since the caller takes it a microsecond later.
//!
//! So every arrival is taken by a driving caller, by a leaving one, or by a background run
//! that was asked for (at once, or by the deferred ask): none is stranded.
//!
//! The queue and the "asked" flag are under the inbox's lock; the count of driving callers
//! is an atomic beside it, so that entering and leaving (twice per call) take no lock. A
//! push and a leave that race must not both miss each other: the pusher stores the queue's
//! new length, then a `SeqCst` fence, then reads the count; the leaver decrements the count,
//! then a fence, then reads the length. One of the two fences comes first in their total
//! order, so either the leaver sees the arrival (and takes it) or the pusher sees that
//! nobody drives (and asks for a background run). loom models fences (not `SeqCst` loads
//! and stores), which is why the protocol is written with them; the loom models of this
//! module check it in every interleaving. A deferred ask first reads the length and the
//! count alone: the pusher's own push came before, so a count it reads is stale only if a
//! driver left since (and a leaving driver takes what it leaves behind), and an empty queue
//! was taken after the push. The lock, the queue's header, the length and the count share
//! one cache line: a push writes the first three and reads the count in one transfer of the
//! line, and a spinning caller that sees the length has fetched the line its take locks:
//! small calls are measurably faster than with each on a line of its own. The queue's slots
//! are aligned so that an arrival of 96 bytes (a message, whose source its transport sets on
//! delivery, rather than a larger (source, message) pair) spans two lines, never three: the
//! push's fence waits for the lines it wrote, and the take reads them, so every line saved
//! shortens both. (Figures: `docs/performance.md`, "Cache lines, fewer messages,
//! placement".)

use crate::sync::{fence, lock, AtomicUsize, Mutex, Ordering};
use std::collections::VecDeque;

/// A value on cache lines of its own (128 bytes: adjacent-line prefetchers pair lines), so
/// that the ranks writing one field of a shared structure do not steal the line another
/// field's readers spin on.
#[derive(Debug, Default)]
#[repr(align(128))]
pub struct CachePadded<T>(pub T);

impl<T> std::ops::Deref for CachePadded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// A rank's arrivals (any number of producers), with the doorbell protocol of the module doc.
pub struct Inbox<T> {
    state: CachePadded<Locked<T>>,
}

/// The lock and the two counters read beside it, on one line (64 bytes, a unit test checks).
struct Locked<T> {
    lock: Mutex<State<T>>,
    /// Arrivals in the queue: stored under the lock, read without it by spinning callers
    /// and by the push/leave handshake of the module doc.
    len: AtomicUsize,
    /// Callers driving the rank now: counted without the lock (see the module doc).
    drivers: AtomicUsize,
}

/// An arrival in the queue, aligned so that a 96-byte message spans two cache lines, never
/// three: the lines a push writes are the lines a take reads.
#[repr(align(32))]
struct Slot<T>(T);

/// What the inbox's lock guards.
struct State<T> {
    queue: VecDeque<Slot<T>>,
    /// The background driver was asked to run and has not started since.
    asked: bool,
}

impl<T> State<T> {
    fn ask(&mut self) -> bool {
        !std::mem::replace(&mut self.asked, true)
    }
}

impl<T> Default for Inbox<T> {
    fn default() -> Self {
        Inbox::new()
    }
}

impl<T> Inbox<T> {
    /// An empty inbox, nobody driving.
    pub fn new() -> Inbox<T> {
        Inbox {
            state: CachePadded(Locked {
                lock: Mutex::new(State {
                    queue: VecDeque::new(),
                    asked: false,
                }),
                len: AtomicUsize::new(0),
                drivers: AtomicUsize::new(0),
            }),
        }
    }

    /// Adds an arrival. `true`: the pusher must wake the background driver (nobody drives
    /// the rank and nobody has asked it to run yet).
    #[must_use = "`true` means the background driver must be woken"]
    pub fn push(&self, item: T) -> bool {
        let mut st = lock(&self.state.lock);
        st.queue.push_back(Slot(item));
        self.state.len.store(st.queue.len(), Ordering::Release);
        self.unattended_after_push() && st.ask()
    }

    /// Adds an arrival from a pusher that can look again shortly (a caller's thread): it
    /// asks nobody now. `true`: nobody drives the rank and no background run is asked for,
    /// so the pusher owes a call to [`ask_if_unattended`](Inbox::ask_if_unattended) within a
    /// bounded time (by then a caller of this rank has usually come and taken it, and no
    /// thread needs waking).
    #[must_use = "`true` means a later `ask_if_unattended` is owed"]
    pub fn push_deferred(&self, item: T) -> bool {
        let mut st = lock(&self.state.lock);
        st.queue.push_back(Slot(item));
        self.state.len.store(st.queue.len(), Ordering::Release);
        self.unattended_after_push() && !st.asked
    }

    /// Whether no caller drives, as a pusher sees it after storing the new length. The
    /// fence pairs with the one in [`Driving::leave`]: of a push and a leave that race, at
    /// least one sees the other (the leaver the arrival, or the pusher that it left).
    fn unattended_after_push(&self) -> bool {
        fence(Ordering::SeqCst);
        self.state.drivers.load(Ordering::Relaxed) == 0
    }

    /// The owed half of [`push_deferred`](Inbox::push_deferred): asks for a background run
    /// if arrivals still wait and nobody drives. `true`: the caller must wake it.
    #[must_use = "`true` means the background driver must be woken"]
    pub fn ask_if_unattended(&self) -> bool {
        // Attended as far as the hints tell is attended: a hint of a driver is stale only if
        // that driver left since, and a leaving driver takes what it leaves behind; an empty
        // queue was taken after this caller's push (which set the length).
        if self.looks_attended() {
            return false;
        }
        let mut st = lock(&self.state.lock);
        !st.queue.is_empty() && self.unattended_after_push() && st.ask()
    }

    /// Whether someone seems to attend to the arrivals (none wait, or a caller drives):
    /// without the lock, a hint for a pusher deciding whether to look again.
    pub fn looks_attended(&self) -> bool {
        self.looks_empty() || self.state.drivers.load(Ordering::Acquire) > 0
    }

    /// Asks for a background run. `true`: this call is the one that must wake it.
    #[must_use = "`true` means the background driver must be woken"]
    pub fn ask(&self) -> bool {
        lock(&self.state.lock).ask()
    }

    /// The background driver starts a run: takes every arrival, in order, to the end of
    /// `out`; arrivals from now on ask again.
    pub fn begin_background(&self, out: &mut Vec<T>) {
        let mut st = lock(&self.state.lock);
        st.asked = false;
        out.extend(st.queue.drain(..).map(|s| s.0));
        self.state.len.store(0, Ordering::Release);
    }

    /// Whether arrivals seem to wait (without the lock: a hint for a spinning caller).
    pub fn looks_empty(&self) -> bool {
        self.state.len.load(Ordering::Acquire) == 0
    }

    /// Moves every arrival, in order, to the end of `out`.
    pub fn take(&self, out: &mut Vec<T>) {
        let mut st = lock(&self.state.lock);
        out.extend(st.queue.drain(..).map(|s| s.0));
        self.state.len.store(0, Ordering::Release);
    }

    /// A caller starts driving the rank: arrivals no longer wake the background driver
    /// until it leaves.
    pub fn enter(&self) -> Driving<'_, T> {
        self.state.drivers.fetch_add(1, Ordering::SeqCst);
        Driving {
            inbox: self,
            left: false,
        }
    }

    /// Callers driving the rank now.
    pub fn drivers(&self) -> usize {
        self.state.drivers.load(Ordering::SeqCst)
    }

    /// Callers driving the rank now, read by a thread right after its own `SeqCst` fence
    /// (the handshake of the module doc, as a mailbox's sender does it:
    /// [`crate::board::mail_wake`]).
    pub(crate) fn drivers_after_fence(&self) -> usize {
        self.state.drivers.load(Ordering::Relaxed)
    }
}

/// A caller counted as driving its rank (from [`Inbox::enter`]); [`leave`](Driving::leave)
/// ends it. Dropped without `leave`, it stops counting but cannot report arrivals left
/// behind: always leave.
pub struct Driving<'a, T> {
    inbox: &'a Inbox<T>,
    left: bool,
}

impl<T> Driving<'_, T> {
    /// Stops driving. `true`: arrivals are waiting that no other driver is sure to take,
    /// and the caller must take them itself (or ask for a background run).
    #[must_use = "`true` means arrivals wait that only this caller will take"]
    pub fn leave(mut self) -> bool {
        self.left = true;
        self.inbox.state.drivers.fetch_sub(1, Ordering::SeqCst);
        // Pairs with the fence of a push (`unattended_after_push`).
        fence(Ordering::SeqCst);
        !self.inbox.looks_empty()
    }
}

impl<T> Drop for Driving<'_, T> {
    fn drop(&mut self) {
        if !self.left {
            self.inbox.state.drivers.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

#[cfg(all(test, not(collectix_loom)))]
mod tests {
    use super::{Inbox, Locked};

    #[test]
    fn the_lock_and_its_counters_fit_one_cache_line() {
        assert!(std::mem::size_of::<Locked<crate::wire::Message>>() <= 64);
    }

    #[test]
    fn the_first_arrival_with_nobody_driving_asks_for_the_background_driver_once() {
        let inbox = Inbox::new();
        assert!(inbox.push(1));
        assert!(!inbox.push(2), "one wake-up covers a burst");
        let mut out = Vec::new();
        inbox.begin_background(&mut out);
        assert_eq!(out, [1, 2]);
        assert!(inbox.looks_empty());
        assert!(
            inbox.push(3),
            "after a run started, the next arrival asks again"
        );
    }

    #[test]
    fn arrivals_while_a_caller_drives_wake_nobody_and_a_leaving_caller_is_told_of_them() {
        let inbox = Inbox::new();
        let d = inbox.enter();
        assert_eq!(inbox.drivers(), 1);
        assert!(!inbox.push(1));
        assert!(!inbox.looks_empty());
        assert!(d.leave(), "the arrival is left to the leaving caller");
        assert_eq!(inbox.drivers(), 0);
        let mut out = Vec::new();
        inbox.take(&mut out);
        assert_eq!(out, [1]);
        let d = inbox.enter();
        assert!(!d.leave(), "nothing waits");
    }

    #[test]
    fn a_deferred_push_asks_later_only_if_nobody_came_for_it() {
        let inbox = Inbox::new();
        assert!(inbox.push_deferred(1), "nobody drives: an ask is owed");
        assert!(!inbox.looks_attended());
        let mut out = Vec::new();
        inbox.take(&mut out);
        assert!(inbox.looks_attended());
        assert!(
            !inbox.ask_if_unattended(),
            "taken meanwhile: nobody to wake"
        );
        assert!(inbox.push_deferred(2));
        let d = inbox.enter();
        assert!(inbox.looks_attended());
        assert!(
            !inbox.ask_if_unattended(),
            "a caller drives: it will take it"
        );
        assert!(d.leave());
        assert!(
            inbox.ask_if_unattended(),
            "left behind: wake the background driver"
        );
        assert!(
            !inbox.push_deferred(3),
            "a run is asked for already: nothing owed"
        );
    }
}
