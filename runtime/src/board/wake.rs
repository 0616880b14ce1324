//! How the members of a board wake each other: the rule, sans-IO.
//!
//! A board has no messages, so a member whose call waits for another's slot learns of it
//! only by looking. While a thread of its rank drives it (a caller spinning or waiting, a
//! background run), that thread looks. When none does, the member that moved the board (it
//! published a slot, finished a call) wakes it. Each rank's [`Signal`] says which applies:
//! how many calls it has pending on its boards, how many threads drive it, and whether its
//! last driver left with calls pending. The mover reads that signal after a `SeqCst` fence
//! that follows its move, and the driver that leaves stores it, fences, and looks at the
//! boards once more: of the two, one sees the other ([`Signal::leave`]).
//!
//! What a mover finds, [`Need`]:
//! - [`Need::No`]: nothing pending, or a thread drives it;
//! - [`Need::Now`]: its last driver left with calls pending (a parked caller, a pending
//!   future): it is woken now;
//! - [`Need::Soon`]: its calls were issued and nobody waited for them yet (a caller between
//!   its call and its wait drives a moment later). The mover owes it a wake-up after a grace
//!   ([`Owed`]): settled on the mover's next progress, or when the mover stops driving.
//!
//! Across processes the signal is mirrored into the rank's lane header ([`PENDING_WORD`],
//! [`DRIVERS_WORD`], [`UNATTENDED_WORD`]), which the other members read with
//! [`need_of_lane`]. The mirror is written under a lock: two threads that each changed the
//! signal could otherwise store what they read in either order, and a stale store landing
//! after a leaving driver's fence would say "driven" to a mover while nobody drives (the
//! loom model `board_wake` finds that execution without the lock).

use super::{Lane, DRIVERS_WORD, PENDING_WORD, UNATTENDED_WORD};
use crate::progress::CachePadded;
use crate::sync::{fence, lock, AtomicBool, AtomicUsize, Mutex, Ordering};
use crate::time::Time;
use std::sync::Arc;
use std::time::Duration;

/// Whether a member needs a wake-up after another moved a board they share.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// No call pending, or a thread drives it.
    No,
    /// Its last driver left with calls pending: wake it now.
    Now,
    /// Its calls were issued and nobody waited for them yet: wake it after [`GRACE`] if it
    /// still needs it.
    Soon,
}

/// What a member needs, from its `pending` calls, its `drivers` and its `unattended` flag.
pub fn need(pending: u64, drivers: u64, unattended: bool) -> Need {
    match (pending > 0 && drivers == 0, unattended) {
        (false, _) => Need::No,
        (true, true) => Need::Now,
        (true, false) => Need::Soon,
    }
}

/// What a member needs, from the mirror in its lane header (untrusted words: they decide a
/// wake-up, nothing else; a word out of range reads as zero).
pub fn need_of_lane(lane: &dyn Lane) -> Need {
    let w = |i| lane.load(i).unwrap_or(0);
    need(w(PENDING_WORD), w(DRIVERS_WORD), w(UNATTENDED_WORD) != 0)
}

/// How long a mover lets a member whose calls were issued but not yet waited for come to
/// drive them itself before it wakes it (the grace a message gets).
pub const GRACE: Duration = Duration::from_micros(20);

/// A rank's board activity (see the module doc), read by the members that wake it.
pub struct Signal {
    /// Calls queued on this rank's boards and not finished.
    pending: CachePadded<AtomicUsize>,
    /// Threads driving the rank now.
    drivers: CachePadded<AtomicUsize>,
    /// The last thread to drive the rank left with calls waiting: they need a wake-up. A call
    /// issued and not waited for yet needs none (its caller is about to drive, or dropped
    /// it; either way a later drive of the rank finishes it).
    unattended: CachePadded<AtomicBool>,
    /// Whether `mirror` holds a lane (read without its lock on every change).
    mirrored: AtomicBool,
    /// Where the other members read this state when they are other processes; its lock is
    /// held while the mirror is written.
    mirror: Mutex<Option<Arc<dyn Lane>>>,
    #[cfg(collectix_loom)]
    unlocked_mirror: AtomicBool,
}

impl Default for Signal {
    fn default() -> Self {
        Signal {
            pending: CachePadded(AtomicUsize::new(0)),
            drivers: CachePadded(AtomicUsize::new(0)),
            unattended: CachePadded(AtomicBool::new(false)),
            mirrored: AtomicBool::new(false),
            mirror: Mutex::new(None),
            #[cfg(collectix_loom)]
            unlocked_mirror: AtomicBool::new(false),
        }
    }
}

impl Signal {
    /// Mirrors this state into `lane`'s header from now on (the first lane given).
    pub fn mirror_into(&self, lane: Arc<dyn Lane>) {
        let mut m = lock(&self.mirror);
        if m.is_none() {
            *m = Some(lane);
            self.mirrored.store(true, Ordering::SeqCst);
        }
        drop(m);
        self.sync_mirror();
    }

    /// The planted bug of the loom model: the mirror written without its lock (each writer
    /// stores what it read, again until the state did not change meanwhile).
    #[cfg(all(collectix_loom, test))]
    pub(crate) fn with_unlocked_mirror(self) -> Self {
        self.unlocked_mirror.store(true, Ordering::SeqCst);
        self
    }

    fn state(&self) -> (usize, usize, bool) {
        (
            self.pending.load(Ordering::SeqCst),
            self.drivers.load(Ordering::SeqCst),
            self.unattended.load(Ordering::SeqCst),
        )
    }

    /// Copies the state into the mirror after a change, under the mirror's lock: a writer
    /// that changed the state before another stores before it, so the last store holds the
    /// last state.
    fn sync_mirror(&self) {
        if !self.mirrored.load(Ordering::SeqCst) {
            return;
        }
        let write = |l: &Arc<dyn Lane>, s: (usize, usize, bool)| {
            l.store(PENDING_WORD, s.0 as u64);
            l.store(DRIVERS_WORD, s.1 as u64);
            l.store(UNATTENDED_WORD, u64::from(s.2));
        };
        #[cfg(collectix_loom)]
        if self.unlocked_mirror.load(Ordering::SeqCst) {
            let Some(l) = lock(&self.mirror).clone() else {
                return;
            };
            loop {
                let s = self.state();
                write(&l, s);
                if self.state() == s {
                    return;
                }
            }
        }
        let m = lock(&self.mirror);
        if let Some(l) = m.as_ref() {
            write(l, self.state());
        }
    }

    /// Calls queued on this rank's boards and not finished (`SeqCst`).
    pub fn pending(&self) -> usize {
        self.pending.load(Ordering::SeqCst)
    }

    /// Whether any call may be pending (a relaxed look, for a progress that skips the boards
    /// when none is: the calls it would miss are their own callers' to drive).
    pub fn any_pending(&self) -> bool {
        self.pending.load(Ordering::Relaxed) > 0
    }

    /// `n` calls were queued.
    pub fn add_pending(&self, n: usize) {
        self.pending.fetch_add(n, Ordering::SeqCst);
        self.sync_mirror();
    }

    /// `n` calls are done with.
    pub fn sub_pending(&self, n: usize) {
        self.pending.fetch_sub(n, Ordering::SeqCst);
        self.sync_mirror();
    }

    /// A thread starts driving the rank.
    pub fn enter(&self) {
        self.drivers.fetch_add(1, Ordering::SeqCst);
        self.sync_mirror();
        if self.unattended.load(Ordering::Relaxed) {
            self.unattended.store(false, Ordering::SeqCst);
            self.sync_mirror();
        }
    }

    /// A thread stops driving the rank. If it was the last and calls wait on a board, it
    /// says they are unattended and fences: it must then look at the boards once more (a
    /// member that moved before it could see nobody driving is seen by that look, one that
    /// moves after sees [`Need::Now`]). Returns `(last, look)`: whether it was the last
    /// driver (then the wake-ups it owes are due now: [`Owed::flush`]), and whether it must
    /// look.
    pub fn leave(&self) -> (bool, bool) {
        let was = self.drivers.fetch_sub(1, Ordering::SeqCst);
        self.sync_mirror();
        let look = was == 1 && self.pending.load(Ordering::SeqCst) > 0;
        if look {
            self.unattended.store(true, Ordering::SeqCst);
            self.sync_mirror();
            fence(Ordering::SeqCst);
        }
        (was == 1, look)
    }

    /// Whether this rank needs a wake-up (read by a member in this process, after its fence).
    pub fn need(&self) -> Need {
        let (p, d, u) = self.state();
        need(p as u64, d as u64, u)
    }
}

/// The wake-ups a mover owes the members whose calls were issued but not yet waited for
/// ([`Need::Soon`]): each is looked at again on the mover's next progress and woken once its
/// [`GRACE`] is over if it still needs it, instead of the mover spinning for it. `M` names a
/// member (how to read its [`Need`] and wake it is the driver's).
#[derive(Debug)]
pub struct Owed<M> {
    members: Vec<(M, Time)>,
}

impl<M> Default for Owed<M> {
    fn default() -> Self {
        Owed {
            members: Vec::new(),
        }
    }
}

impl<M: PartialEq> Owed<M> {
    /// Members owed a wake-up.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// `m` is owed a wake-up from `now` (once: a member owed already keeps its time).
    pub fn add(&mut self, m: M, now: Time) {
        if !self.members.iter().any(|(x, _)| *x == m) {
            self.members.push((m, now));
        }
    }

    /// At `now` (after a `SeqCst` fence), with each member's `need`: those to wake now go to
    /// `wake` (they need it now, or their grace is over), those that need nothing any more
    /// are forgotten, the others stay.
    pub fn settle(&mut self, now: Time, need: impl Fn(&M) -> Need, wake: &mut Vec<M>) {
        let mut i = 0;
        while i < self.members.len() {
            let (m, since) = &self.members[i];
            let due = match need(m) {
                Need::No => Some(false),
                Need::Now => Some(true),
                Need::Soon if now >= *since + GRACE => Some(true),
                Need::Soon => None,
            };
            match due {
                None => i += 1,
                Some(w) => {
                    let (m, _) = self.members.swap_remove(i);
                    if w {
                        wake.push(m);
                    }
                }
            }
        }
    }

    /// The mover stops making progress (its last driver leaves, a background run ends), so
    /// nobody would look at them again: those that still need a wake-up go to `wake` now,
    /// and none is owed any more.
    pub fn flush(&mut self, need: impl Fn(&M) -> Need, wake: &mut Vec<M>) {
        wake.extend(
            self.members
                .drain(..)
                .map(|(m, _)| m)
                .filter(|m| need(m) != Need::No),
        );
    }
}

#[cfg(all(test, not(collectix_loom)))]
mod tests {
    use super::*;
    use crate::board::HeapLane;

    #[test]
    fn a_member_needs_a_wake_up_only_when_nobody_drives_its_pending_calls() {
        assert_eq!(need(0, 0, true), Need::No, "nothing pending");
        assert_eq!(need(2, 1, true), Need::No, "driven");
        assert_eq!(need(1, 0, true), Need::Now, "its last driver left");
        assert_eq!(need(1, 0, false), Need::Soon, "issued, not waited for yet");
    }

    #[test]
    fn a_leaving_driver_looks_only_if_it_was_the_last_with_calls_pending() {
        let s = Signal::default();
        s.enter();
        s.enter();
        assert_eq!(s.leave(), (false, false), "another still drives");
        assert_eq!(s.leave(), (true, false), "nothing pending");
        s.add_pending(1);
        assert_eq!(s.need(), Need::Soon);
        s.enter();
        assert_eq!(s.need(), Need::No);
        assert_eq!(s.leave(), (true, true));
        assert_eq!(
            s.need(),
            Need::Now,
            "the last driver left with a call pending"
        );
        s.enter();
        assert_eq!(s.need(), Need::No, "a driver that comes attends");
    }

    #[test]
    fn the_pending_count_follows_the_calls_queued_and_finished() {
        let s = Signal::default();
        assert_eq!((s.pending(), s.any_pending()), (0, false));
        s.add_pending(2);
        assert_eq!((s.pending(), s.any_pending()), (2, true));
        s.sub_pending(1);
        assert_eq!((s.pending(), s.any_pending()), (1, true));
        s.sub_pending(1);
        assert_eq!((s.pending(), s.any_pending()), (0, false));
    }

    #[test]
    fn the_mirror_follows_every_change() {
        let s = Signal::default();
        s.add_pending(2);
        let lane: Arc<dyn Lane> = Arc::new(HeapLane::default());
        assert_eq!(need_of_lane(&*lane), Need::No, "not mirrored yet");
        s.mirror_into(lane.clone());
        assert_eq!(need_of_lane(&*lane), Need::Soon, "the state when mirrored");
        s.enter();
        assert_eq!(need_of_lane(&*lane), Need::No);
        let _ = s.leave();
        assert_eq!(need_of_lane(&*lane), Need::Now);
        s.sub_pending(2);
        assert_eq!(need_of_lane(&*lane), Need::No);
        assert_eq!(lane.load(PENDING_WORD), Some(0));
    }

    #[test]
    fn an_owed_wake_up_waits_for_its_grace_unless_it_is_needed_now() {
        let t0 = Time::ZERO;
        let mut o = Owed::default();
        o.add(1, t0);
        o.add(2, t0);
        o.add(3, t0);
        o.add(1, t0 + GRACE);
        assert_eq!(o.len(), 3, "a member is owed once");
        assert!(!o.is_empty());
        let need = |m: &usize| match m {
            1 => Need::Soon,
            2 => Need::Now,
            _ => Need::No,
        };
        let mut woke = Vec::new();
        o.settle(t0 + GRACE / 2, need, &mut woke);
        assert_eq!(woke, vec![2], "needed now: woken; needs nothing: forgotten");
        assert_eq!(o.len(), 1, "in its grace: kept");
        o.settle(t0 + GRACE, need, &mut woke);
        assert_eq!(woke, vec![2, 1], "its grace is over");
        assert!(o.is_empty());
    }

    #[test]
    fn a_flush_wakes_every_member_that_still_needs_it() {
        let mut o = Owed::default();
        for m in 0..3 {
            o.add(m, Time::ZERO);
        }
        let mut woke = Vec::new();
        o.flush(|m| if *m == 1 { Need::No } else { Need::Soon }, &mut woke);
        assert_eq!(woke, vec![0, 2]);
        assert!(o.is_empty());
    }
}
