//! Small point-to-point messages through a board group's mailboxes
//! ([`collectix_runtime::board::mail`]), driven by the rank's [`Driver`].
//!
//! A small send is written into the sender's ring toward the receiver under the sender's
//! engine lock (the engine draws its lane's sequence number) and completes at once. The
//! receiving rank's drivers read the rings: every run of its engine hands what they hold
//! to the engine (before and after the run's own work), a caller that drives the rank
//! runs the engine when a ring holds something, and a driver that leaves looks once more
//! after a `SeqCst` fence. A sender, after its write and a `SeqCst` fence, so finds the
//! receiver driven (whoever drives it will see the message) or not: then it wakes a
//! parked caller of the receiver at once, or waits up to the grace for a caller between
//! two calls to come, and asks for the receiver's background run if none did (the
//! protocol of an in-process message, `collectix_runtime::progress`). A small receive from
//! a named source spins a moment on that source's ring and takes the message without a
//! pending call when it comes (`Engine::p2p_take`).

use super::handoff::wait_attended;
use super::{Core, Driver, GroupBoard};
use crate::sync::lock;
use collectix_runtime::board::mail::{MailIn, MailOut, Mailboxes};
use collectix_runtime::{DType, Output, Result, TensorSpec};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a small receive spins on its source's ring before it is posted as any receive.
const QUICK_SPIN: Duration = Duration::from_micros(20);

/// A group's mailboxes as one rank holds them.
pub(crate) struct GroupMail {
    boxes: Mailboxes,
    /// Taken under the rank's engine lock only.
    out: Mutex<MailOut>,
    inn: Mutex<MailIn>,
    /// How many messages of each member this rank read (a copy of `inn`'s, for the looks
    /// without a lock).
    read: Vec<AtomicU64>,
    /// How to wake each member (`None`: this rank).
    peers: Vec<Option<MailPeer>>,
}

/// How a sender wakes a member for a message in its mailbox.
pub(crate) enum MailPeer {
    /// A rank of this process: its signal names its driver once it runs.
    Rank(Arc<super::Signal>),
    /// A rank of another process of the host: its segment (its mail flag, its doorbell).
    Process(Arc<collectix_runtime::wire::shm::ring::Segment>),
}

/// Whom a send wakes (`MailPeer`, resolved).
enum Target {
    Rank(Arc<Driver>),
    Process(Arc<collectix_runtime::wire::shm::ring::Segment>),
}

impl GroupMail {
    pub(crate) fn new(boxes: Mailboxes, peers: Vec<Option<MailPeer>>) -> GroupMail {
        let n = boxes.size();
        GroupMail {
            out: Mutex::new(boxes.outbox()),
            inn: Mutex::new(boxes.inbox()),
            read: (0..n).map(|_| AtomicU64::new(0)).collect(),
            boxes,
            peers,
        }
    }

    /// Hands every message of `src`'s ring toward this rank to `engine` (group `gid`), in
    /// ring order; a ring that holds something else aborts the group.
    fn hand_over(
        &self,
        inn: &mut MailIn,
        engine: &mut collectix_runtime::Engine,
        gid: collectix_runtime::GroupId,
        src: usize,
    ) {
        while let Some(r) = self.boxes.take(inn, src) {
            match r {
                Ok(mail) => engine.on_p2p_mail(gid, src, mail),
                Err(e) => {
                    engine.mail_broken(gid, &e);
                    break;
                }
            }
        }
        if let Some(r) = self.read.get(src) {
            r.store(Mailboxes::read_of(inn, src), Ordering::Release);
        }
    }

    /// Whether `src`'s ring toward this rank seems to hold a message not read yet.
    fn looks_ready_from(&self, src: usize) -> bool {
        self.read
            .get(src)
            .is_some_and(|r| self.boxes.looks_ready(src, r.load(Ordering::Acquire)))
    }
}

impl Driver {
    /// Registers a group's mailboxes with the rank: its runs read them from now on (until
    /// the group is destroyed here: [`drop_mail`](Self::drop_mail)).
    pub(crate) fn add_mail(&self, gb: &Arc<GroupBoard>) {
        if gb.mail.is_some() {
            lock(&self.mail).push(gb.clone());
        }
    }

    /// The group was destroyed on this rank: its mailboxes are no longer read.
    pub(super) fn drop_mail(&self, group: collectix_runtime::GroupId) {
        lock(&self.mail).retain(|gb| gb.info.id != group);
    }

    /// Whether a mailbox of the rank may hold a message not read yet: a sender wrote one
    /// since the last run that read them. (A sender sets the flag after its message and
    /// before its `SeqCst` fence; a driver that leaves reads it after its own: see the
    /// module doc.)
    pub(super) fn mail_looks_ready(&self) -> bool {
        self.mail_new.looks_raised()
    }

    /// Hands every message the rank's mailboxes hold to the engine (under its lock), and
    /// frees the slots of those it consumed.
    pub(super) fn take_mail(&self, core: &mut Core) {
        // Cleared before the read: a message written after the read sets it again.
        if !self.mail_new.take() {
            self.free_mail(core);
            return;
        }
        self.read_mail(core);
    }

    /// Hands every mailbox's messages to the engine, whether or not the flag is up (before
    /// a peer's departure: [`collectix_runtime::wire::Message::wants_mail_first`]; the flag of a
    /// sender in another process may be seen after the departure that followed it).
    pub(super) fn read_mail(&self, core: &mut Core) {
        let boards = lock(&self.mail);
        for gb in boards.iter() {
            let Some(m) = &gb.mail else { continue };
            let mut inn = lock(&m.inn);
            for src in 0..m.boxes.size() {
                m.hand_over(&mut inn, &mut core.engine, gb.info.id, src);
            }
        }
        drop(boards);
        self.free_mail(core);
    }

    /// Frees the mailbox slots of the messages the engine consumed.
    pub(super) fn free_mail(&self, core: &mut Core) {
        let mut freed = std::mem::take(&mut core.mail_freed);
        core.engine.take_mail_freed(&mut freed);
        if !freed.is_empty() {
            for gb in lock(&self.mail).iter() {
                let Some(m) = &gb.mail else { continue };
                let mut inn = lock(&m.inn);
                for &(_, src) in freed.iter().filter(|(g, _)| *g == gb.info.id) {
                    m.boxes.free(&mut inn, src, 1);
                }
            }
            freed.clear();
        }
        core.mail_freed = freed;
    }

    /// A send of `bytes` (elements of `dtype`) to group rank `dst` on `tag` through `gb`'s
    /// mailboxes: whether it was sent (it is then done); `false`: it goes through the
    /// engine (no room, or the engine said no: `Engine::p2p_mail_seq`).
    pub(crate) fn mail_send(
        &self,
        gb: &GroupBoard,
        dst: usize,
        tag: u32,
        dtype: DType,
        bytes: &[u8],
    ) -> bool {
        let Some(m) = &gb.mail else { return false };
        // A receiver that cannot be woken (not running yet) gets its message by the engine.
        let target = match m.peers.get(dst) {
            Some(Some(MailPeer::Rank(s))) => match s.driver().and_then(|d| d.upgrade()) {
                Some(d) => Target::Rank(d),
                None => return false,
            },
            Some(Some(MailPeer::Process(seg))) => Target::Process(seg.clone()),
            _ => return false,
        };
        // Counted as a driver while it settles with the receiver: two ranks that send to
        // each other at once each find the other attended.
        let driving = self.inbox.enter();
        let sent = {
            let mut core = lock(&self.core);
            if core.quiesced {
                false
            } else {
                let mut out = lock(&m.out);
                match m.boxes.has_room(&mut out, dst) {
                    Ok(true) => match core.engine.p2p_mail_seq(gb.info.id, dst, tag) {
                        Some(seq) => m
                            .boxes
                            .post(&mut out, dst, tag, seq, dtype, bytes)
                            .map_err(|e| {
                                // Checked above, under the same locks: never.
                                tracing::error!(?e, "a mailbox with room refused a message");
                            })
                            .is_ok(),
                        None => false,
                    },
                    _ => false,
                }
            }
        };
        match (sent, target) {
            (true, Target::Rank(peer)) => self.wake_for_mail(&peer, driving),
            (true, Target::Process(seg)) => {
                // Its flag if it is down, then (after the fence in `needs_wake`) its
                // doorbell if nobody of its process reads: the protocol of a frame in a ring.
                // Up, whoever raised it rang (`Segment::raise_mail_flag`).
                if seg.raise_mail_flag() {
                    crate::transport::shm::nudge(&seg);
                }
                self.leave_driving(driving);
            }
            (false, _) => self.leave_driving(driving),
        }
        sent
    }

    /// After a message was written for `peer`: wakes it if nobody drives it (see the module
    /// doc), driving this rank meanwhile.
    fn wake_for_mail(
        &self,
        peer: &Driver,
        driving: collectix_runtime::progress::Driving<'_, collectix_runtime::wire::Message>,
    ) {
        if peer.mail_new.raise(&peer.inbox) {
            if peer.sleeping.load(Ordering::Relaxed) == 0 {
                // Between two calls, perhaps: a moment to come and take it itself.
                let grace = self.grace();
                wait_attended(
                    || {
                        if !self.inbox.looks_empty() || self.mail_looks_ready() {
                            self.try_run();
                        }
                        peer.inbox.drivers() > 0
                    },
                    grace,
                );
            }
            if peer.inbox.drivers() == 0 && peer.inbox.ask() {
                peer.wake_background();
            }
        }
        self.leave_driving(driving);
    }

    /// A sender in another process flagged a message in this rank's mailboxes (its
    /// shared-memory transport read the flag): every driver of the rank sees it now; from
    /// the transport's own thread, and nobody drives, the rank's background run is asked
    /// for.
    pub(crate) fn mail_came(&self, from_progress_thread: bool) {
        if !from_progress_thread {
            // A caller that drives the rank read it: it runs before it leaves.
            self.mail_new.raise_driven();
            return;
        }
        // No grace here (a frame's hand-over waits one): on a host with more ranks than
        // cores this thread's spin took the core a caller needed.
        if self.mail_new.raise(&self.inbox) && self.inbox.ask() {
            self.wake_background();
        }
    }

    /// Stops driving: runs the engine if arrivals or mailbox messages wait that no other
    /// driver is sure to take.
    pub(super) fn leave_driving(
        &self,
        driving: collectix_runtime::progress::Driving<'_, collectix_runtime::wire::Message>,
    ) {
        if self.mail_new.leave(driving) {
            self.run(|_, _, _| ());
        }
    }

    /// The lean run of a small receive: `src`'s ring toward this rank handed to the
    /// engine, and the receive taken if its message is here; a full run follows only if the
    /// engine has something to do for others (a message it matched with a posted receive, a
    /// count it must send).
    fn take_from(
        &self,
        m: &GroupMail,
        gid: collectix_runtime::GroupId,
        src: usize,
        tag: u32,
        spec: &TensorSpec,
    ) -> Option<Result<Output>> {
        let mut core = match self.core.try_lock() {
            Ok(c) => c,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            // Whoever holds it runs the engine: this caller looks again.
            Err(std::sync::TryLockError::WouldBlock) => return None,
        };
        if core.quiesced {
            return None;
        }
        m.hand_over(&mut lock(&m.inn), &mut core.engine, gid, src);
        let r = core.engine.p2p_take(gid, src, tag, spec);
        if core.engine.has_output() {
            self.run_locked(core, |_, _, _| ());
        } else {
            self.free_mail(&mut core);
        }
        r
    }

    /// A receive of `spec` from group rank `src` on `tag` through `gb`'s mailboxes: its
    /// result if the lane's next message came within a short spin (`None`: it is posted as
    /// any receive).
    pub(crate) fn mail_recv(
        &self,
        gb: &GroupBoard,
        src: usize,
        tag: u32,
        spec: &TensorSpec,
    ) -> Option<Result<Output>> {
        let m = gb.mail.as_ref()?;
        let gid = gb.info.id;
        let driving = self.inbox.enter();
        let budget = if crate::rank::on_rank_thread() {
            Duration::ZERO
        } else {
            self.spin.min(QUICK_SPIN)
        };
        let mut since: Option<Instant> = None;
        let mut turns: u32 = 0;
        let mut first = true;
        // Counted as a reader of its transports while it spins, though it reads only its
        // source's ring: a sender in another process then rings no doorbell (the progress
        // thread, parked, would take a core from the ranks at work). What comes by the
        // transports meanwhile is read by the wait that follows if the message did not come
        // (at most the spin later). Reading them on every turn too cost the 4-byte exchange
        // of two processes 0.4-0.6 us, and helped four processes on two cores no more than
        // the count alone (`docs/performance.md`).
        let readers = (!budget.is_zero()).then(|| self.read_transports());
        let out = loop {
            if !self.inbox.looks_empty() {
                // An engine message may be the lane's next: a full run takes it in.
                first = false;
                if let Some(r) = self.run(|core, _, _| core.engine.p2p_take(gid, src, tag, spec)) {
                    break Some(r);
                }
            } else if first || m.looks_ready_from(src) || turns % 64 == 63 {
                // Now and then without a sign in the ring: another driver of the rank may
                // have handed the lane's next message to the engine already.
                first = false;
                if let Some(r) = self.take_from(m, gid, src, tag, spec) {
                    break Some(r);
                }
            }
            if budget.is_zero() {
                break None;
            }
            turns = turns.wrapping_add(1);
            if turns.is_multiple_of(64) {
                let t0 = *since.get_or_insert_with(Instant::now);
                if t0.elapsed() >= budget {
                    break None;
                }
            }
            self.pause_quick(turns);
        };
        drop(readers);
        self.leave_driving(driving);
        out
    }
}
