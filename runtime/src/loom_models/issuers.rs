//! The issuers' rule ([`crate::issuers`]) between two loom threads: a thread that hands the
//! group to another once its call finished is never refused, and two threads whose calls
//! overlap are refused on the second, whatever the interleaving.

use super::check;
use crate::error::Error;
use crate::issuers::Issuers;
use crate::GroupId;
use loom::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use loom::sync::Arc;

/// Thread A's call finishes, then it lets thread B go: B's call (the next number) is never
/// refused.
#[test]
fn a_hand_off_after_the_call_finished_is_never_refused() {
    check("issuers: hand-off", || {
        let (issuers, next, go) = (
            Arc::new(Issuers::default()),
            Arc::new(AtomicU64::new(0)),
            Arc::new(AtomicBool::new(false)),
        );
        let (i2, n2, g2) = (issuers.clone(), next.clone(), go.clone());
        let a = loom::thread::spawn(move || {
            let seq = n2.fetch_add(1, Ordering::Relaxed);
            assert_eq!(i2.issue(GroupId(1), seq, 1, None, || "a".into()), Ok(()));
            // The call finishes (its completion counts it) before its caller hears.
            i2.finished();
            g2.store(true, Ordering::Release);
        });
        if go.load(Ordering::Acquire) {
            let seq = next.fetch_add(1, Ordering::Relaxed);
            assert_eq!(
                issuers.issue(GroupId(1), seq, 2, None, || "b".into()),
                Ok(())
            );
        }
        a.join().unwrap_or_else(|_| panic!("thread a panicked"));
    });
}

/// Both threads issue while neither call has finished: exactly one of them, the second to
/// take the lock, is refused with `ConcurrentCalls`.
#[test]
fn overlapping_calls_of_two_threads_are_refused_once() {
    check("issuers: overlap", || {
        let (issuers, next) = (Arc::new(Issuers::default()), Arc::new(AtomicU64::new(0)));
        let (i2, n2) = (issuers.clone(), next.clone());
        let a = loom::thread::spawn(move || {
            let seq = n2.fetch_add(1, Ordering::Relaxed);
            i2.issue(GroupId(1), seq, 1, None, || "a".into())
        });
        let seq = next.fetch_add(1, Ordering::Relaxed);
        let b = issuers.issue(GroupId(1), seq, 2, None, || "b".into());
        let a = a.join().unwrap_or_else(|_| panic!("thread a panicked"));
        let refused = [&a, &b]
            .iter()
            .filter(|r| matches!(r, Err(Error::ConcurrentCalls { .. })))
            .count();
        // Neither finished: the second to take the lock finds the first's call in flight,
        // whichever number it took.
        assert_eq!(refused, 1, "{a:?} {b:?}");
    });
}
