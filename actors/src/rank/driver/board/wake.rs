//! How the members of a board wake each other: each rank's [`Signal`] (calls pending,
//! threads driving, whether its last driver left with calls pending), read by a member that
//! moved, and the wake-ups it owes ([`OwedWakes`]).

use super::super::Driver;
use crate::sync::lock;
use collectix_runtime::board::{Lane, DRIVERS_WORD, PENDING_WORD, UNATTENDED_WORD};
use collectix_runtime::progress::CachePadded;
use std::sync::atomic::{fence, AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// How another member learns that this rank moved the board (published a slot, finished a
/// call): whether it has a call waiting that nobody drives, and how to wake it.
pub(crate) trait Wake: Send + Sync {
    /// Whether the member needs a wake-up now (read after a `SeqCst` fence that follows the
    /// move): `None` if not (no call pending, or a thread drives it), `Some(true)` if its last
    /// driver left with calls pending (a parked caller, a pending future), `Some(false)` if
    /// its calls were issued and nobody waited for them yet (a caller between its call and
    /// its wait drives a moment later: the mover looks again after a grace, see [`OwedWakes`]).
    fn state(&self) -> Option<bool>;
    /// Wakes it.
    fn wake_now(&self);
}

/// A rank's board activity, shared with the members that wake it (without keeping its
/// driver alive).
pub(crate) struct Signal {
    /// Calls queued on this rank's boards and not finished.
    pub(super) pending: CachePadded<AtomicUsize>,
    /// Threads driving the rank now (in `drive_until`).
    pub(super) drivers: CachePadded<AtomicUsize>,
    /// The last thread to drive the rank left with calls waiting (a caller parked, or a
    /// future returned `Pending`): they need a wake-up. A call issued and not waited for
    /// yet needs none (its caller is about to drive, or dropped it; either way a later drive
    /// of the rank finishes it).
    pub(super) unattended: CachePadded<AtomicBool>,
    pub(super) driver: std::sync::OnceLock<Weak<Driver>>,
    /// Where the other members read this state when they are other processes: the rank's
    /// lane in its shared-memory segment (its header words `PENDING_WORD`, `DRIVERS_WORD`,
    /// `UNATTENDED_WORD`).
    pub(super) mirror: std::sync::OnceLock<Arc<dyn Lane>>,
}

impl Signal {
    /// Names the driver that a wake-up goes to (once).
    pub(crate) fn attach(&self, d: &Arc<Driver>) {
        let _ = self.driver.set(Arc::downgrade(d));
    }

    /// Mirrors this state into `lane`'s header from now on (once).
    pub(crate) fn mirror_into(&self, lane: Arc<dyn Lane>) {
        let _ = self.mirror.set(lane);
    }

    /// Copies the state into the mirror after a change: the current values, again until
    /// they did not change meanwhile (two threads' copies may land in either order; the last
    /// to change the state copies last, with what it finds).
    pub(super) fn sync_mirror(&self) {
        let Some(l) = self.mirror.get() else {
            return;
        };
        let read = || {
            (
                self.pending.load(Ordering::SeqCst),
                self.drivers.load(Ordering::SeqCst),
                self.unattended.load(Ordering::SeqCst),
            )
        };
        loop {
            let state = read();
            l.store(PENDING_WORD, state.0 as u64);
            l.store(DRIVERS_WORD, state.1 as u64);
            l.store(UNATTENDED_WORD, u64::from(state.2));
            if read() == state {
                return;
            }
        }
    }

    pub(super) fn add_pending(&self, n: usize) {
        self.pending.fetch_add(n, Ordering::SeqCst);
        self.sync_mirror();
    }

    pub(super) fn sub_pending(&self, n: usize) {
        self.pending.fetch_sub(n, Ordering::SeqCst);
        self.sync_mirror();
    }

    pub(super) fn set_unattended(&self, on: bool) {
        self.unattended.store(on, Ordering::SeqCst);
        self.sync_mirror();
    }
}

/// How long a member that moved lets a member whose calls were issued but not yet waited for
/// come to drive them itself before it wakes it (the grace a message gets).
const GRACE: Duration = Duration::from_micros(20);

/// [`Wake::state`] from a member's `pending` calls, `drivers` and `unattended` flag.
pub(crate) fn state_of(pending: u64, drivers: u64, unattended: bool) -> Option<bool> {
    (pending > 0 && drivers == 0).then_some(unattended)
}

/// Members this rank moved for that may need a wake-up: each is looked at again on the
/// rank's next board progress (every turn of a waiting caller) and woken once its grace is
/// over, instead of the mover spinning for it.
#[derive(Default)]
pub(crate) struct OwedWakes {
    n: AtomicUsize,
    members: Mutex<Vec<(Arc<dyn Wake>, std::time::Instant)>>,
}

impl OwedWakes {
    pub(super) fn add(&self, w: &Arc<dyn Wake>) {
        let mut m = lock(&self.members);
        if !m.iter().any(|(x, _)| Arc::ptr_eq(x, w)) {
            m.push((w.clone(), std::time::Instant::now()));
            self.n.store(m.len(), Ordering::Relaxed);
        }
    }

    /// Wakes those whose grace is over and still need it; forgets those that do not.
    pub(super) fn settle(&self) {
        if self.n.load(Ordering::Relaxed) == 0 {
            return;
        }
        let Ok(mut m) = self.members.try_lock() else {
            return;
        };
        fence(Ordering::SeqCst);
        m.retain(|(w, since)| match w.state() {
            None => false,
            Some(true) => {
                w.wake_now();
                false
            }
            Some(false) if since.elapsed() >= GRACE => {
                w.wake_now();
                false
            }
            Some(false) => true,
        });
        self.n.store(m.len(), Ordering::Relaxed);
    }

    /// Wakes now those that still need it: the mover stops making progress (its last
    /// driver leaves, a background run ends), so nobody would look at them again.
    pub(super) fn flush(&self) {
        if self.n.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut m = lock(&self.members);
        fence(Ordering::SeqCst);
        for (w, _) in m.drain(..) {
            if w.state().is_some() {
                w.wake_now();
            }
        }
        self.n.store(0, Ordering::Relaxed);
    }
}

impl Wake for Signal {
    fn state(&self) -> Option<bool> {
        state_of(
            self.pending.load(Ordering::SeqCst) as u64,
            self.drivers.load(Ordering::SeqCst) as u64,
            self.unattended.load(Ordering::SeqCst),
        )
    }

    fn wake_now(&self) {
        if let Some(d) = self.driver.get().and_then(Weak::upgrade) {
            d.wake_background();
        }
    }
}
