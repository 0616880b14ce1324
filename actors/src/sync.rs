//! Locking that ignores poisoning: the one place the crate's locks are taken from; and
//! stopping a thread blocked in `accept`.
//!
//! A panic elsewhere (in user code run on a rank's thread, say) must not turn into a panic
//! here: the state each of the crate's locks guards stays whole between its statements, so
//! a poisoned lock is taken as it is.

use std::net::{SocketAddr, TcpStream};
use std::sync::{Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Locks `m`, ignoring poisoning (see the module doc).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// `d` from now; when `d` is longer than the clock can count (`Duration::MAX` for "no end"),
/// as far ahead as it can (more than thirty years), instead of the panic of `Instant + d`.
pub(crate) fn deadline_after(d: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(d).unwrap_or_else(|| {
        [1_000_000_000u64, 1_000_000, 1_000]
            .into_iter()
            .find_map(|s| now.checked_add(Duration::from_secs(s)))
            .unwrap_or(now)
    })
}

/// How long [`wake_acceptor`] tries.
pub(crate) const WAKE_TIMEOUT: Duration = Duration::from_secs(2);

/// Stops `acceptor`, a thread blocked in `accept` on the listener at `addr` that returns
/// once it accepts a connection after its stop flag was set (the caller set it): wakes it
/// with a connection of our own, and again while it has not woken, since one connection can
/// be lost (a dropped SYN on a lossy link, a full backlog), and a join after a lost one
/// waited forever. Bounded by [`WAKE_TIMEOUT`]: an acceptor that does not wake is left behind
/// (it holds only its listener, until the process ends). `what` names it in the warning.
pub(crate) fn wake_acceptor(acceptor: JoinHandle<()>, addr: SocketAddr, what: &str) {
    let deadline = Instant::now() + WAKE_TIMEOUT;
    while !acceptor.is_finished() && Instant::now() < deadline {
        let _ = TcpStream::connect_timeout(&addr, Duration::from_millis(100));
        let settle = (Instant::now() + Duration::from_millis(20)).min(deadline);
        while !acceptor.is_finished() && Instant::now() < settle {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    if acceptor.is_finished() {
        let _ = acceptor.join();
    } else {
        tracing::warn!("{what} did not wake within {WAKE_TIMEOUT:?}; left behind");
    }
}
