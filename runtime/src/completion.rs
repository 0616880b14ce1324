//! The completion slot between a rank (which completes a call) and whoever waits for it
//! (a future, a blocking `wait`, a `wait_timeout`, an `is_completed` poll, or nobody).
//!
//! One [`Completer`] and one [`Waiter`] share a slot. The value is set once; the first of
//! `poll`/`wait` to see it takes it. A `Completer` dropped without a value completes the slot
//! with [`Error::Shutdown`], so a waiter can never be left behind by a rank that stopped.
//! Dropping the `Waiter` detaches: the call still completes, its value is dropped.

use crate::error::{Error, Result};
use crate::sync::{lock, Arc, Condvar, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

enum State<T> {
    Pending(Option<Waker>),
    Ready(Result<T>),
    Taken,
}

struct Shared<T> {
    state: Mutex<State<T>>,
    ready: Condvar,
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
        state: Mutex::new(State::Pending(None)),
        ready: Condvar::new(),
    });
    (
        Completer {
            shared: Some(shared.clone()),
        },
        Waiter { shared },
    )
}

fn set<T>(shared: &Shared<T>, value: Result<T>) {
    let waker = {
        let mut st = lock(&shared.state);
        match std::mem::replace(&mut *st, State::Taken) {
            State::Pending(w) => {
                *st = State::Ready(value);
                w
            }
            other => {
                *st = other;
                None
            }
        }
    };
    shared.ready.notify_all();
    if let Some(w) = waker {
        w.wake();
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
        !matches!(*lock(&self.shared.state), State::Pending(_))
    }

    /// Takes the value if it is there, else registers `cx`'s waker.
    pub fn poll(&self, cx: &mut Context<'_>) -> Poll<Result<T>> {
        let mut st = lock(&self.shared.state);
        match std::mem::replace(&mut *st, State::Taken) {
            State::Ready(v) => Poll::Ready(v),
            State::Pending(_) => {
                *st = State::Pending(Some(cx.waker().clone()));
                Poll::Pending
            }
            State::Taken => Poll::Ready(Err(Error::invalid("the result was already taken"))),
        }
    }

    /// Blocks until the value is there and takes it.
    pub fn wait(self) -> Result<T> {
        let mut st = lock(&self.shared.state);
        loop {
            match std::mem::replace(&mut *st, State::Taken) {
                State::Ready(v) => return v,
                State::Taken => return Err(Error::invalid("the result was already taken")),
                pending @ State::Pending(_) => {
                    *st = pending;
                    st = self
                        .shared
                        .ready
                        .wait(st)
                        .unwrap_or_else(|e| e.into_inner());
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
            match std::mem::replace(&mut *st, State::Taken) {
                State::Ready(v) => return Some(v),
                State::Taken => return Some(Err(Error::invalid("the result was already taken"))),
                pending @ State::Pending(_) => {
                    *st = pending;
                    if waited {
                        return None;
                    }
                    // One timed wait: spurious wake-ups end it early, which is allowed.
                    st = self
                        .shared
                        .ready
                        .wait_timeout(st, d)
                        .map(|(g, _)| g)
                        .unwrap_or_else(|e| e.into_inner().0);
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
