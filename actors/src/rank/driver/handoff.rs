//! How an arrival reaches a rank and who is asked to take it: the hand-over from a peer rank's
//! run in this process or from a connection's reader, and what a run owes the peers it
//! handed messages to while nobody drove them (a look after a short grace, then a wake-up).
//! The protocol is `collectix_runtime::progress`'s, which loom checks.

use super::Driver;
use crate::sync::lock;
use collectix_runtime::progress::Driving;
use collectix_runtime::wire::Message;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, TryLockError};
use std::time::{Duration, Instant};

/// How long a caller that handed a peer a message while nobody drove that peer looks again
/// before it wakes the peer's actor (at most the spin budget): a peer between two calls
/// takes it itself a moment later.
pub(super) const GRACE: Duration = Duration::from_micros(20);
/// Peers a rank's caller handed messages to while nobody drove them: it owes each an
/// `Inbox::ask_if_unattended` (see `Driver::settle`).
pub(crate) type Owed = Arc<OwedPeers>;
/// The list behind [`Owed`], with a flag that lets the common case (nothing owed) skip the
/// lock. Only the owing rank's own runs push to it, and each run settles what it pushed, so
/// a stale `false` read by another thread's settle never leaves a debt unpaid.
/// On cache lines of its own (the ranks' lists are allocated one after another, and each
/// rank's calls read its flag).
#[derive(Default)]
#[repr(align(128))]
pub(crate) struct OwedPeers {
    any: AtomicBool,
    peers: Mutex<Vec<Arc<Driver>>>,
}
impl OwedPeers {
    /// Records that `peer` is owed a look. Its inbox says so once per burst (the first
    /// deferred arrival), so a peer is seldom listed twice, and a second look at it is
    /// harmless; no search of the list (a run that hands messages to thousands of peers
    /// would pay for each in every other).
    pub(super) fn push(&self, peer: &Arc<Driver>) {
        lock(&self.peers).push(peer.clone());
        self.any.store(true, Ordering::Release);
    }

    /// Moves the peers owed into `out`.
    pub(super) fn take_into(&self, out: &mut Vec<Arc<Driver>>) {
        if !self.any.load(Ordering::Acquire) {
            return;
        }
        let mut o = lock(&self.peers);
        self.any.store(false, Ordering::Release);
        out.append(&mut o);
    }
}

impl Driver {
    /// An arrival from global rank `src` (the link's word for it), from any transport.
    pub(crate) fn deliver(&self, src: usize, mut msg: Message) {
        // The source is the link's, never the message's own claim.
        msg.src = src;
        if self.inbox.push(msg) {
            self.wake_background();
        }
    }
    /// An arrival handed over by a run of a peer rank in this process, which records in
    /// `owed` (the peer's) that it must look again if nobody drives this rank now.
    pub(crate) fn deliver_from_peer(self: &Arc<Self>, src: usize, mut msg: Message, owed: &Owed) {
        msg.src = src;
        if self.inbox.push_deferred(msg) {
            owed.push(self);
        }
    }
    /// An arrival handed over by a connection's reader thread, which looks again for up to
    /// the grace before it wakes the actor if nobody drives this rank now (a caller between
    /// two calls takes it itself a moment later); the next frame waits meanwhile.
    pub(crate) fn deliver_read(&self, src: usize, mut msg: Message) {
        msg.src = src;
        if self.inbox.push_deferred(msg) {
            wait_attended(|| self.inbox.looks_attended(), GRACE.min(self.spin));
            if self.inbox.ask_if_unattended() {
                self.wake_background();
            }
        }
    }
    /// Where this rank's in-process links record the peers it owes a look.
    pub(crate) fn owed(&self) -> Owed {
        self.owed.clone()
    }
    /// Settles what this rank's runs owe its peers: waits up to `grace` for each to be
    /// attended (its caller took the message, or drives), then wakes the actor of any still
    /// unattended.
    pub(super) fn settle(&self, grace: Duration) {
        let mut owed = Vec::new();
        self.owed.take_into(&mut owed);
        if owed.is_empty() {
            return;
        }
        wait_attended(|| owed.iter().all(|p| p.inbox.looks_attended()), grace);
        Driver::ask_owed(owed);
    }
    /// Asks for a background run of each owed peer still unattended.
    pub(super) fn ask_owed(owed: Vec<Arc<Driver>>) {
        for p in owed {
            if p.inbox.ask_if_unattended() {
                p.wake_background();
            }
        }
    }
    /// [`settle`](Driver::settle) for a caller that issued a call, which counts as a driver of
    /// its rank from the start of its call (`driving`): peers that hand the rank messages
    /// meanwhile owe it nothing, since this caller takes them before it leaves. While it
    /// waits for its peers to attend, it drives its own rank (takes and runs what arrives).
    /// Two ranks that send to each other between their calls thus never wait on each other
    /// here: each one's arrivals are attended by its own settling caller.
    pub(super) fn settle_driving(&self, grace: Duration, driving: Driving<'_, Message>) {
        let mut owed: Vec<Arc<Driver>> = Vec::new();
        self.owed.take_into(&mut owed);
        // The common case skips the loop: the peers drive, or took their messages already.
        if !owed.iter().all(|p| p.inbox.looks_attended()) {
            let start = Instant::now();
            let mut turns: u32 = 0;
            loop {
                self.owed.take_into(&mut owed);
                if owed.iter().all(|p| p.inbox.looks_attended()) {
                    break;
                }
                if !self.inbox.looks_empty() || self.mail_looks_ready() {
                    self.try_run_unsettled();
                }
                turns = turns.wrapping_add(1);
                if turns.is_multiple_of(64) && start.elapsed() >= grace {
                    break;
                }
                self.pause(turns);
            }
        }
        // A mailbox message written before its sender saw this caller gone is seen here
        // (`collectix_runtime::board::mail_wake`).
        if self.mail_new.leave(driving) {
            let core = lock(&self.core);
            self.run_with(core, |_, _, _| (), None);
        }
        self.owed.take_into(&mut owed);
        Driver::ask_owed(owed);
    }
    /// A run if nobody holds the rank now, leaving what it owes peers to the caller.
    pub(super) fn try_run_unsettled(&self) {
        let core = match self.core.try_lock() {
            Ok(c) => c,
            Err(TryLockError::Poisoned(e)) => e.into_inner(),
            Err(TryLockError::WouldBlock) => return,
        };
        let (_, next) = self.run_with(core, |_, _, _| (), None);
        self.check_timer(next);
    }
}

/// Spins until `attended()` (the peers owed a look have had their arrivals taken, or a
/// caller drives them), for at most `grace`.
pub(super) fn wait_attended(attended: impl Fn() -> bool, grace: Duration) {
    if grace.is_zero() || attended() {
        return;
    }
    let start = Instant::now();
    let mut turns: u32 = 0;
    while !attended() {
        turns = turns.wrapping_add(1);
        if turns.is_multiple_of(64) && start.elapsed() >= grace {
            return;
        }
        std::hint::spin_loop();
    }
}
