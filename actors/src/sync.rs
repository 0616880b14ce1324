//! Locking that ignores poisoning: the one place the crate's locks are taken from; and
//! stopping a thread blocked in `accept`.
//!
//! A panic elsewhere (in user code run on a rank's thread, say) must not turn into a panic
//! here: the state each of the crate's locks guards stays whole between its statements, so
//! a poisoned lock is taken as it is.

use std::io::{Read, Write};
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

/// A socket whose reads must all end by one deadline: each read waits at most the time left,
/// so a peer that trickles a byte now and then cannot stretch a bounded step (a handshake)
/// past it, as it can a timeout per read. Writes go straight through.
pub(crate) struct ReadUntil<'a> {
    s: &'a mut TcpStream,
    deadline: Instant,
}

impl<'a> ReadUntil<'a> {
    /// `s`, read until `deadline`.
    pub(crate) fn new(s: &'a mut TcpStream, deadline: Instant) -> ReadUntil<'a> {
        ReadUntil { s, deadline }
    }
}

impl Read for ReadUntil<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the step's time is up",
            ));
        }
        self.s.set_read_timeout(Some(left))?;
        self.s.read(buf)
    }
}

impl Write for ReadUntil<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.s.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.s.flush()
    }
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

/// A client that sends `bytes` one at a time, one every `every`, until the other side closes
/// or it has sent them all; how long the other side took to close (`None`: it never did).
/// For the tests of bounded handshakes.
#[cfg(test)]
pub(crate) fn trickle(addr: SocketAddr, bytes: &[u8], every: Duration) -> Option<Duration> {
    let mut s = TcpStream::connect(addr).ok()?;
    let t0 = Instant::now();
    let mut watcher = s.try_clone().ok()?;
    let closed = std::thread::spawn(move || {
        let mut b = [0u8; 256];
        loop {
            match watcher.read(&mut b) {
                Ok(0) | Err(_) => return Instant::now(),
                Ok(_) => {}
            }
        }
    });
    for &b in bytes {
        if closed.is_finished() || s.write_all(&[b]).is_err() {
            break;
        }
        std::thread::sleep(every);
    }
    let _ = s.shutdown(std::net::Shutdown::Write);
    if !closed.is_finished() {
        let _ = s.shutdown(std::net::Shutdown::Both);
        return None;
    }
    closed.join().ok().map(|at| at.duration_since(t0))
}
