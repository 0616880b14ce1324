//! A process's connections as its callers read them: [`Readers`], the rank driver's
//! [`Poller`] for TCP. A caller waiting for its call reads its connections itself on every
//! turn of its spin (the progress in the wait of Gloo's busy-poll mode and of MPI), so the
//! answer to a small call is taken by the thread that waits for it: no hand-off from the
//! connection's reader thread (20–30 µs per wake-up of a sleeping thread on a small VM,
//! `docs/performance.md`). The reader threads stay: they take what arrives while no caller
//! waits, and they alone report a loss. While callers read a connection, its reader thread
//! sleeps through its arrivals (`recv.rs`, `Watch`), so they wake no thread at all.

use super::recv::Receiving;
use crate::rank::driver::Poller;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

/// Connections a caller reads with one `poll` system call rather than one read each.
#[cfg(unix)]
const POLL_ABOVE: usize = 2;

/// The receiving sides of a process's connections, for its callers to read (see the module
/// doc). Connections to peers reached another way (shared memory) are left to their reader
/// threads.
pub(crate) struct Readers {
    list: RwLock<Vec<Arc<Receiving>>>,
    /// Per global rank: its messages come another way, a caller need not read its connection.
    elsewhere: Vec<AtomicBool>,
}

impl Readers {
    /// No connection yet, for a world of `world` ranks.
    pub(crate) fn new(world: usize) -> Readers {
        Readers {
            list: RwLock::new(Vec::new()),
            elsewhere: (0..world).map(|_| AtomicBool::new(false)).collect(),
        }
    }

    /// A new connection (its ended predecessors go).
    pub(super) fn add(&self, rx: Arc<Receiving>) {
        let mut list = self.list.write().unwrap_or_else(|e| e.into_inner());
        list.retain(|r| !r.has_ended());
        list.push(rx);
    }

    /// Callers stop reading the connection to `peer`: its messages come another way.
    pub(crate) fn elsewhere(&self, peer: usize) {
        if let Some(e) = self.elsewhere.get(peer) {
            e.store(true, Ordering::Relaxed);
        }
    }

    /// Whether the connection of any peer of `rank` carries its messages (callers then read
    /// them).
    pub(crate) fn carries_any(&self, rank: usize) -> bool {
        self.elsewhere
            .iter()
            .enumerate()
            .any(|(p, e)| p != rank && !e.load(Ordering::Relaxed))
    }

    /// Whether a caller reads the connection `rx`.
    fn wanted(&self, rx: &Receiving) -> bool {
        !rx.has_ended()
            && !self
                .elsewhere
                .get(rx.peer)
                .is_some_and(|e| e.load(Ordering::Relaxed))
    }

    /// Reads every connection that has something (see the module doc); whether anything came.
    pub(crate) fn read(&self) -> bool {
        let list = self.list.read().unwrap_or_else(|e| e.into_inner());
        #[cfg(unix)]
        if list.len() > POLL_ABOVE {
            return self.read_ready(&list);
        }
        let mut any = false;
        for rx in list.iter() {
            if self.wanted(rx) {
                any |= rx.poll();
            }
        }
        any
    }

    /// Reads the connections that one `poll` says are readable.
    #[cfg(unix)]
    fn read_ready(&self, list: &[Arc<Receiving>]) -> bool {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        let wanted: Vec<&Arc<Receiving>> = list.iter().filter(|r| self.wanted(r)).collect();
        let mut fds: Vec<PollFd<'_>> = wanted
            .iter()
            .map(|r| PollFd::new(r.socket(), PollFlags::POLLIN))
            .collect();
        if fds.is_empty() || poll(&mut fds, PollTimeout::ZERO).unwrap_or(0) <= 0 {
            return false;
        }
        let mut any = false;
        for (rx, fd) in wanted.iter().zip(&fds) {
            if fd.any().unwrap_or(true) {
                any |= rx.poll();
            }
        }
        any
    }
}

impl Poller for Readers {
    fn enter(&self) {}

    fn poll(&self) -> bool {
        self.read()
    }

    /// Nothing to hand back: the reader threads watch their sockets again within `LINGER`
    /// of the last look (see `recv.rs`).
    fn leave(&self) {}

    /// The reader threads are woken by every arrival again at once: the parked caller's
    /// answer comes through them.
    fn parking(&self) {
        let list = self.list.read().unwrap_or_else(|e| e.into_inner());
        for rx in list.iter().filter(|r| self.wanted(r)) {
            rx.arm(false);
        }
    }

    /// Nothing to take first: a connection's reader thread hands over what came before its
    /// end before it reports the loss.
    fn drain(&self) {}
}
