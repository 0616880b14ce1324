//! Model group 4: the completion slot behind `Work` ([`crate::completion`]), a `Completer`
//! on one loom thread and a `Waiter` on another. Every model checks that the waiting side
//! gets the value (or `Shutdown`) whatever the interleaving: no lost wake-up (loom reports
//! a waiter blocked forever as a deadlock), no waiter left behind, no leaked slot (loom
//! fails an execution that leaks a loom `Arc`).
//!
//! loom's `Condvar::wait_timeout` is a plain `wait` (it never times out), so the
//! `wait_timeout` models prove the wake-up path of a timed wait, not its expiry; the expiry
//! path is covered by the std unit test in `completion.rs`.

use super::check;
use crate::completion::{slot, Waiter};
use crate::error::{Error, Result};
use loom::sync::Arc;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

/// A future over [`Waiter::poll`], as the `Work` handle's `Future` impl is.
struct Wait<'a, T>(&'a Waiter<T>);

impl<T> Future for Wait<'_, T> {
    type Output = Result<T>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<T>> {
        self.0.poll(cx)
    }
}

/// A blocking `wait` racing `complete`: the waiter gets the value.
#[test]
fn wait_vs_complete() {
    check("completion: wait vs complete", || {
        let (c, w) = slot::<u32>();
        let t = loom::thread::spawn(move || c.complete(Ok(7)));
        assert_eq!(w.wait(), Ok(7));
        t.join().unwrap_or_else(|_| panic!("completer panicked"));
    });
}

/// A future polled by `block_on` (the waker is loom's) racing `complete`: the waker
/// registered by a `Pending` poll is woken, and the value is taken once.
#[test]
fn poll_vs_complete() {
    check("completion: poll vs complete", || {
        let (c, w) = slot::<u32>();
        let t = loom::thread::spawn(move || c.complete(Ok(7)));
        assert_eq!(loom::future::block_on(Wait(&w)), Ok(7));
        assert!(w.is_completed());
        let again = w.poll(&mut Context::from_waker(Waker::noop()));
        assert!(
            matches!(again, Poll::Ready(Err(Error::InvalidArgument(_)))),
            "a second take must fail, got {again:?}"
        );
        t.join().unwrap_or_else(|_| panic!("completer panicked"));
    });
}

/// A first poll with a waker that does nothing, then `block_on` with a real one, racing
/// `complete`: the second poll must replace the stale waker, or the wake-up is lost.
#[test]
fn stale_waker_is_replaced() {
    check("completion: stale waker replaced", || {
        let (c, w) = slot::<u32>();
        let t = loom::thread::spawn(move || c.complete(Ok(7)));
        let first = w.poll(&mut Context::from_waker(Waker::noop()));
        let v = match first {
            Poll::Ready(v) => v,
            Poll::Pending => loom::future::block_on(Wait(&w)),
        };
        assert_eq!(v, Ok(7));
        t.join().unwrap_or_else(|_| panic!("completer panicked"));
    });
}

/// The completer dropped without a value (a rank that stopped) racing `wait`: the waiter
/// gets `Shutdown`.
#[test]
fn drop_completer_vs_wait() {
    check("completion: drop completer vs wait", || {
        let (c, w) = slot::<u32>();
        let t = loom::thread::spawn(move || drop(c));
        assert_eq!(w.wait(), Err(Error::Shutdown));
        t.join().unwrap_or_else(|_| panic!("completer panicked"));
    });
}

/// The completer dropped racing a polled future: the future is woken with `Shutdown`.
#[test]
fn drop_completer_vs_poll() {
    check("completion: drop completer vs poll", || {
        let (c, w) = slot::<u32>();
        let t = loom::thread::spawn(move || drop(c));
        assert_eq!(loom::future::block_on(Wait(&w)), Err(Error::Shutdown));
        t.join().unwrap_or_else(|_| panic!("completer panicked"));
    });
}

/// The waiter dropped (detached) racing `complete`, after perhaps registering a waker:
/// `complete` neither blocks nor panics, and the value is dropped (its `Arc` count goes
/// back to one; loom also checks the slot itself is freed).
#[test]
fn drop_waiter_vs_complete() {
    check("completion: drop waiter vs complete", || {
        let value = std::sync::Arc::new(5u32);
        let (c, w) = slot::<std::sync::Arc<u32>>();
        let t = loom::thread::spawn(move || {
            let first = w.poll(&mut Context::from_waker(Waker::noop()));
            drop(first);
            drop(w);
        });
        c.complete(Ok(value.clone()));
        t.join()
            .unwrap_or_else(|_| panic!("waiter thread panicked"));
        assert_eq!(std::sync::Arc::strong_count(&value), 1, "the value leaked");
    });
}

/// `wait_timeout` racing `complete` (loom's timed wait never expires, so this is the
/// wake-up path): the value comes back, and a later `wait_timeout` finds it taken.
#[test]
fn wait_timeout_vs_complete() {
    check("completion: wait_timeout vs complete", || {
        let (c, w) = slot::<u32>();
        let t = loom::thread::spawn(move || c.complete(Ok(7)));
        assert_eq!(w.wait_timeout(Duration::from_secs(1)), Some(Ok(7)));
        assert!(matches!(
            w.wait_timeout(Duration::from_secs(1)),
            Some(Err(Error::InvalidArgument(_)))
        ));
        t.join().unwrap_or_else(|_| panic!("completer panicked"));
    });
}

/// Two threads in `wait_timeout` on one waiter, racing `complete`: both wake (the slot
/// notifies all, not one), exactly one gets the value and the other is told it was taken.
#[test]
fn two_timed_waiters_vs_complete() {
    check("completion: two timed waiters vs complete", || {
        let (c, w) = slot::<u32>();
        let w = Arc::new(w);
        let spawn_waiter = |w: Arc<Waiter<u32>>| {
            loom::thread::spawn(move || w.wait_timeout(Duration::from_secs(1)))
        };
        let a = spawn_waiter(w.clone());
        let b = spawn_waiter(w.clone());
        c.complete(Ok(7));
        let got: Vec<Option<Result<u32>>> = [a, b]
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| panic!("waiter panicked")))
            .collect();
        let values = got.iter().filter(|g| matches!(g, Some(Ok(7)))).count();
        let taken = got
            .iter()
            .filter(|g| matches!(g, Some(Err(Error::InvalidArgument(_)))))
            .count();
        assert_eq!((values, taken), (1, 1), "{got:?}");
    });
}

/// `is_completed` racing `complete`: once it said `true`, a poll is `Ready` with the value
/// (never `Pending`), and the flag never goes back to `false`.
#[test]
fn is_completed_vs_complete() {
    check("completion: is_completed vs complete", || {
        let (c, w) = slot::<u32>();
        let t = loom::thread::spawn(move || c.complete(Ok(7)));
        let seen = w.is_completed();
        let polled = w.poll(&mut Context::from_waker(Waker::noop()));
        if seen {
            assert_eq!(polled, Poll::Ready(Ok(7)));
        }
        t.join().unwrap_or_else(|_| panic!("completer panicked"));
        assert!(w.is_completed());
        if polled.is_pending() {
            assert_eq!(w.wait(), Ok(7));
        }
    });
}
