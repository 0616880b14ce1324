//! Who takes a small message written into an in-process rank's mailboxes
//! ([`crate::board::mail`]): the rule, sans-IO.
//!
//! A mailbox is not a transport: nothing hands its messages to the receiving rank's
//! [`Inbox`], so the rank learns of one only by looking. Every run of its engine reads its
//! mailboxes, and a thread that drives the rank (a caller spinning or waiting, a background
//! run) runs the engine when the rank's [`MailFlag`] is raised. When no thread drives it, the
//! sender must wake it. The flag plays the part of an inbox's queue length in the protocol of
//! an in-process arrival ([`crate::progress`]):
//! - the sender writes its message, raises the receiver's flag, fences (`SeqCst`) and reads
//!   the receiver's count of drivers ([`MailFlag::raise`]): none, and it wakes a parked
//!   caller of the receiver or asks for its background run ([`Inbox::ask`]); a sender that
//!   can wait a moment (a caller between two calls is about to drive) looks again before it
//!   asks;
//! - a run clears the flag before it reads the mailboxes ([`MailFlag::take`]): a message
//!   written after the read raises it again;
//! - a driver that stops driving leaves ([`Driving::leave`]: its count, then a `SeqCst`
//!   fence) and then reads the flag ([`MailFlag::leave`]): raised, and it runs once more.
//!
//! Of a sender's fence and a leaving driver's, one comes first: either the driver sees the
//! flag (and runs), or the sender sees that nobody drives (and wakes the rank). So no message
//! is left in a mailbox with nobody driving and no run asked for. A sender is itself counted
//! as a driver of its own rank while it settles this: two ranks that send to each other at
//! once each find the other driven, and each, leaving, sees the flag the other raised. The
//! loom model `mail_wake` checks these races, and that a driver which leaves without looking
//! at the flag, or a sender without its fence, strands a message.
//!
//! Between processes the flag is the first word of the receiver's mailbox in its
//! shared-memory segment ([`crate::board::mail::MAIL_FLAG`]), and the rule is the segment's
//! doorbell protocol (`crate::wire::shm::ring::Segment::needs_wake`): the flag counts as work
//! for the receiving process's progress thread, which then raises the rank's own flag here.

use crate::progress::{CachePadded, Driving, Inbox};
use crate::sync::{fence, AtomicBool, Ordering};

/// A rank's "new mail" flag: a sender raised it since the rank's last run read its
/// mailboxes. See the module doc.
///
/// Raised with a swap, not a store: loom 0.7 lets a thread's load miss its own store to a
/// word that another thread's swap raced (tokio-rs/loom#389, a model outcome no hardware
/// has), and the flag's every write then being a read-modify-write keeps the model's
/// outcomes those of the memory model. The swap is a locked instruction where the store was
/// a plain one; not measured apart (the small-send A/B in `docs/performance.md` includes it).
#[derive(Debug, Default)]
pub struct MailFlag {
    new: CachePadded<AtomicBool>,
    #[cfg(collectix_loom)]
    flaw: Option<MailWakeFlaw>,
}

/// A deliberate bug the loom model plants in [`MailFlag`] (models only).
#[cfg_attr(not(collectix_loom), allow(dead_code))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MailWakeFlaw {
    /// [`MailFlag::raise`] reads the receiver's drivers without a fence after the flag.
    NoFence,
    /// [`MailFlag::leave`] stops driving without looking at the flag.
    NoLook,
}

impl MailFlag {
    /// A lowered flag.
    pub fn new() -> MailFlag {
        MailFlag::default()
    }

    /// This flag with a deliberate bug (loom models only).
    #[cfg(all(collectix_loom, test))]
    pub(crate) fn with_flaw(flaw: MailWakeFlaw) -> MailFlag {
        MailFlag {
            flaw: Some(flaw),
            ..MailFlag::default()
        }
    }

    #[cfg(collectix_loom)]
    fn flawed(&self, f: MailWakeFlaw) -> bool {
        self.flaw == Some(f)
    }

    #[cfg(not(collectix_loom))]
    #[inline(always)]
    fn flawed(&self, _: MailWakeFlaw) -> bool {
        false
    }

    /// A sender wrote a message into the mailboxes of the rank this flag and `inbox` belong
    /// to (or its process's progress thread read the segment's flag): raises the flag, then
    /// says whether nobody drives the rank (`true`: the caller wakes a parked caller of it or
    /// asks for its background run, [`Inbox::ask`]; a caller that may wait a moment first
    /// looks at [`Inbox::drivers`] again before it asks).
    #[must_use = "`true` means nobody drives the receiver: it must be woken"]
    pub fn raise<T>(&self, inbox: &Inbox<T>) -> bool {
        self.new.swap(true, Ordering::AcqRel);
        if !self.flawed(MailWakeFlaw::NoFence) {
            // Pairs with the fence of a leaving driver (`MailFlag::leave`).
            fence(Ordering::SeqCst);
        }
        inbox.drivers_after_fence() == 0
    }

    /// Raises the flag from a thread that drives the rank itself (a caller that read the
    /// segment's flag with the rank's transports): it looks before it leaves
    /// ([`MailFlag::leave`]), so nobody need be woken.
    pub fn raise_driven(&self) {
        self.new.swap(true, Ordering::AcqRel);
    }

    /// Whether the flag is raised (a hint for a driver deciding whether to run).
    pub fn looks_raised(&self) -> bool {
        self.new.load(Ordering::Acquire)
    }

    /// A run is about to read the rank's mailboxes: lowers the flag and says whether it was
    /// raised (a message written after this raises it again, for the next run).
    pub fn take(&self) -> bool {
        self.new.swap(false, Ordering::AcqRel)
    }

    /// A driver of the rank stops driving. `true`: arrivals wait in its inbox that no other
    /// driver is sure to take, or a sender raised the flag: the caller runs the engine once
    /// more.
    #[must_use = "`true` means messages wait that only this caller will take"]
    pub fn leave<T>(&self, driving: Driving<'_, T>) -> bool {
        // `leave` fences after it stops counting: a sender that raised the flag before it
        // saw this driver gone is seen by the look that follows.
        let arrivals = driving.leave();
        arrivals || (!self.flawed(MailWakeFlaw::NoLook) && self.looks_raised())
    }
}
