//! How the members of a board wake each other: the rule is the runtime's
//! ([`collectix_runtime::board::wake`]: each rank's activity, what a mover finds, the
//! wake-ups it owes); this file reads it and wakes threads.

use super::super::Driver;
use crate::sync::lock;
use collectix_runtime::board::wake::{Need, Owed};
use collectix_runtime::Time;
use std::sync::atomic::{fence, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

pub(crate) use collectix_runtime::board::wake::Signal as Activity;

/// How another member learns that this rank moved the board (published a slot, finished a
/// call): whether it has a call waiting that nobody drives, and how to wake it.
pub(crate) trait Wake: Send + Sync {
    /// Whether the member needs a wake-up now (read after a `SeqCst` fence that follows the
    /// move).
    fn need(&self) -> Need;
    /// Wakes it.
    fn wake_now(&self);
}

/// A rank's board activity and its driver, shared with the members that wake it (without
/// keeping its driver alive).
#[derive(Default)]
pub(crate) struct Signal {
    pub(crate) activity: Activity,
    driver: std::sync::OnceLock<Weak<Driver>>,
}

impl Signal {
    /// Names the driver that a wake-up goes to (once).
    pub(crate) fn attach(&self, d: &Arc<Driver>) {
        let _ = self.driver.set(Arc::downgrade(d));
    }

    /// The driver a wake-up goes to, once named.
    pub(crate) fn driver(&self) -> Option<Weak<Driver>> {
        self.driver.get().cloned()
    }
}

impl Wake for Signal {
    fn need(&self) -> Need {
        self.activity.need()
    }

    fn wake_now(&self) {
        if let Some(d) = self.driver.get().and_then(Weak::upgrade) {
            d.wake_background();
        }
    }
}

/// A member owed a wake-up (the same member is the same `Wake`).
struct Member(Arc<dyn Wake>);

impl PartialEq for Member {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// The members this rank moved for that may need a wake-up ([`Owed`]), settled on the rank's
/// next board progress (every turn of a waiting caller) and flushed when it stops driving.
pub(crate) struct OwedWakes {
    n: AtomicUsize,
    owed: Mutex<Owed<Member>>,
    /// The origin of the times given to [`Owed`] (its grace is microseconds: the engine's
    /// coarse clock would not do).
    base: Instant,
}

impl Default for OwedWakes {
    fn default() -> Self {
        OwedWakes {
            n: AtomicUsize::new(0),
            owed: Mutex::new(Owed::default()),
            base: Instant::now(),
        }
    }
}

impl OwedWakes {
    fn now(&self) -> Time {
        Time::ZERO + self.base.elapsed()
    }

    pub(super) fn add(&self, w: &Arc<dyn Wake>) {
        let mut o = lock(&self.owed);
        o.add(Member(w.clone()), self.now());
        self.n.store(o.len(), Ordering::Relaxed);
    }

    /// Wakes those whose grace is over and still need it; forgets those that do not.
    pub(super) fn settle(&self) {
        if self.n.load(Ordering::Relaxed) == 0 {
            return;
        }
        let Ok(mut o) = self.owed.try_lock() else {
            return;
        };
        fence(Ordering::SeqCst);
        let mut wake = Vec::new();
        o.settle(self.now(), |m| m.0.need(), &mut wake);
        self.n.store(o.len(), Ordering::Relaxed);
        drop(o);
        for m in wake {
            m.0.wake_now();
        }
    }

    /// Wakes now those that still need it: the mover stops making progress (its last
    /// driver leaves, a background run ends), so nobody would look at them again.
    pub(super) fn flush(&self) {
        if self.n.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut o = lock(&self.owed);
        fence(Ordering::SeqCst);
        let mut wake = Vec::new();
        o.flush(|m| m.0.need(), &mut wake);
        self.n.store(0, Ordering::Relaxed);
        drop(o);
        for m in wake {
            m.0.wake_now();
        }
    }
}
