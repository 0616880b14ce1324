//! The completion slot between a rank (which completes a call) and whoever waits for it
//! (a future, a blocking `wait`, a `wait_timeout`, an `is_completed` poll, or nobody).
//!
//! One [`Completer`] and one [`Waiter`] share a slot. The value is set once; the first of
//! `poll`/`wait` to see it takes it. A `Completer` dropped without a value completes the slot
//! with [`Error::Shutdown`], so a waiter can never be left behind by a rank that stopped.
//! Dropping the `Waiter` detaches: the call still completes, its value is dropped.

use crate::error::{Error, Result};
use crate::sync::{lock, Arc, AtomicBool, Condvar, Mutex, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

enum State<T> {
    Pending(Option<Waker>),
    /// The value is set and its waker is running (outside the lock): nobody may take the
    /// value yet, since the waker may panic and turn it into [`Error::Panic`]. A poll in this
    /// state leaves its waker, woken once the first one returned.
    Waking(Result<T>, Option<Waker>),
    Ready(Result<T>),
    Taken,
}

/// The slot's state, and how many threads are blocked on its condition variable (so that
/// completing a call nobody blocks on makes no system call: a futex wake-up is a syscall
/// even with no waiter, and a waiting caller that drives its rank usually sees the value
/// before it would block).
struct Inner<T> {
    st: State<T>,
    sleepers: usize,
}

struct Shared<T> {
    state: Mutex<Inner<T>>,
    ready: Condvar,
    /// Set (under the lock) once the value is `Ready`: a spinning waiter reads it without
    /// taking the lock.
    done: AtomicBool,
}

/// The completing side of a slot.
pub struct Completer<T> {
    shared: Option<Arc<Shared<T>>>,
}

/// The waiting side of a slot.
pub struct Waiter<T> {
    shared: Arc<Shared<T>>,
}

/// A new, empty slot.
pub fn slot<T>() -> (Completer<T>, Waiter<T>) {
    let shared = Arc::new(Shared {
        state: Mutex::new(Inner {
            st: State::Pending(None),
            sleepers: 0,
        }),
        ready: Condvar::new(),
        done: AtomicBool::new(false),
    });
    (
        Completer {
            shared: Some(shared.clone()),
        },
        Waiter { shared },
    )
}

/// Runs a waker — the user's executor's code, here on the rank's thread — so that a panic in
/// it does not unwind through the rank: the panic comes back as [`Error::Panic`].
fn wake_guarded(w: Waker) -> Option<Error> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| w.wake()))
        .err()
        .map(|p| Error::from_panic("the waker of this call's Work", p.as_ref()))
}

fn set<T>(shared: &Shared<T>, value: Result<T>) {
    let (waker, sleepers) = {
        let mut st = lock(&shared.state);
        let waker = match std::mem::replace(&mut st.st, State::Taken) {
            State::Pending(Some(w)) => {
                st.st = State::Waking(value, None);
                Some(w)
            }
            State::Pending(None) => {
                st.st = State::Ready(value);
                shared.done.store(true, Ordering::Release);
                None
            }
            other => {
                st.st = other;
                None
            }
        };
        (waker, st.sleepers)
    };
    let Some(w) = waker else {
        if sleepers > 0 {
            shared.ready.notify_all();
        }
        return;
    };
    // A panicking waker fails the call it was woken for (the executor that panicked may never
    // poll again, but any later poll or wait sees it).
    let panicked = wake_guarded(w);
    let (later, sleepers) = {
        let mut st = lock(&shared.state);
        let later = match std::mem::replace(&mut st.st, State::Taken) {
            State::Waking(v, later) => {
                st.st = State::Ready(match panicked {
                    Some(e) => Err(e),
                    None => v,
                });
                shared.done.store(true, Ordering::Release);
                later
            }
            other => {
                st.st = other;
                None
            }
        };
        (later, st.sleepers)
    };
    if sleepers > 0 {
        shared.ready.notify_all();
    }
    if let Some(l) = later {
        // The value is final now; a second panicking waker can only be ignored.
        let _ = wake_guarded(l);
    }
}

impl<T> Completer<T> {
    /// Sets the value and wakes the waiter.
    pub fn complete(mut self, value: Result<T>) {
        if let Some(s) = self.shared.take() {
            set(&s, value);
        }
    }
}

impl<T> Drop for Completer<T> {
    fn drop(&mut self) {
        if let Some(s) = self.shared.take() {
            set(&s, Err(Error::Shutdown));
        }
    }
}

impl<T> Waiter<T> {
    /// Whether the value is there (or was taken).
    pub fn is_completed(&self) -> bool {
        self.shared.done.load(Ordering::Acquire)
    }

    /// Takes the value if it is there, else registers `cx`'s waker.
    pub fn poll(&self, cx: &mut Context<'_>) -> Poll<Result<T>> {
        let mut st = lock(&self.shared.state);
        match std::mem::replace(&mut st.st, State::Taken) {
            State::Ready(v) => Poll::Ready(v),
            State::Pending(_) => {
                st.st = State::Pending(Some(cx.waker().clone()));
                Poll::Pending
            }
            State::Waking(v, _) => {
                st.st = State::Waking(v, Some(cx.waker().clone()));
                Poll::Pending
            }
            State::Taken => Poll::Ready(Err(Error::invalid("the result was already taken"))),
        }
    }

    /// Blocks until the value is there and takes it.
    pub fn wait(self) -> Result<T> {
        let mut st = lock(&self.shared.state);
        loop {
            match std::mem::replace(&mut st.st, State::Taken) {
                State::Ready(v) => return v,
                State::Taken => return Err(Error::invalid("the result was already taken")),
                pending @ (State::Pending(_) | State::Waking(..)) => {
                    st.st = pending;
                    st.sleepers += 1;
                    st = self
                        .shared
                        .ready
                        .wait(st)
                        .unwrap_or_else(|e| e.into_inner());
                    st.sleepers -= 1;
                }
            }
        }
    }

    /// Blocks for at most `d`; takes the value if it came, `None` if it did not (the slot
    /// stays usable).
    pub fn wait_timeout(&self, d: Duration) -> Option<Result<T>> {
        let mut st = lock(&self.shared.state);
        let mut waited = false;
        loop {
            match std::mem::replace(&mut st.st, State::Taken) {
                State::Ready(v) => return Some(v),
                State::Taken => return Some(Err(Error::invalid("the result was already taken"))),
                pending @ (State::Pending(_) | State::Waking(..)) => {
                    st.st = pending;
                    if waited {
                        return None;
                    }
                    // One timed wait: spurious wake-ups end it early, which is allowed.
                    st.sleepers += 1;
                    st = self
                        .shared
                        .ready
                        .wait_timeout(st, d)
                        .map(|(g, _)| g)
                        .unwrap_or_else(|e| e.into_inner().0);
                    st.sleepers -= 1;
                    waited = true;
                }
            }
        }
    }
}

#[cfg(all(test, not(collectix_loom)))]
mod tests {
    use super::*;

    #[test]
    fn value_reaches_a_blocked_waiter() {
        let (c, w) = slot::<u32>();
        let t = std::thread::spawn(move || w.wait());
        c.complete(Ok(7));
        assert_eq!(t.join().ok(), Some(Ok(7)));
    }

    #[test]
    fn dropped_completer_means_shutdown() {
        let (c, w) = slot::<u32>();
        drop(c);
        assert!(w.is_completed());
        assert_eq!(w.wait(), Err(Error::Shutdown));
    }

    #[test]
    fn wait_timeout_returns_none_then_the_value() {
        let (c, w) = slot::<u32>();
        assert!(w.wait_timeout(Duration::from_millis(1)).is_none());
        c.complete(Ok(1));
        assert_eq!(w.wait_timeout(Duration::from_millis(1)), Some(Ok(1)));
        assert!(matches!(
            w.wait_timeout(Duration::from_millis(1)),
            Some(Err(Error::InvalidArgument(_)))
        ));
    }
}
