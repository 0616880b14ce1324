//! Who reads a segment's rings, and when a sender wakes the segment's owner: the doorbell
//! protocol, as the owner's process and its senders run it.
//!
//! A segment's owner reads its rings on a progress thread of its own, and on its callers'
//! threads while they wait for a call (they *poll*, which saves a wake-up per frame). A sender
//! that published a frame wakes the owner (rings the doorbell, then a futex wake on it) only
//! when nobody reads: no caller polls (the segment's `polling`) and the progress thread is
//! parked (`sleeping`); [`Segment::needs_wake`]. Three pairings keep a frame from waiting
//! for a wake-up that never comes, each a store, a `SeqCst` fence, then a load, against the
//! sender's publish, fence and look:
//! - the progress thread raises `sleeping`, fences, then looks at the rings once more before
//!   it parks ([`Callers::going_to_sleep`], then [`Callers::rest`]): a frame published
//!   before the sender saw `sleeping` is found by that look, one after it rings;
//! - the last caller out leaves `polling` raised for a moment (the *linger*: a caller that
//!   comes back soon takes what came, as between two calls), and the progress thread lowers
//!   it once no caller came for a whole wait ([`Callers::lingered`]), then looks again;
//! - a caller about to park lowers it as it leaves ([`Callers::leave`]) and reads once more;
//!   one that leaves it raised while the progress thread is parked (it parks only when
//!   `polling` is low, and nothing would lower it) with calls left to the background wakes
//!   the thread, which then lingers. (With none, what comes is for a later call, whose
//!   caller takes it: no wake-up is spent between two blocking calls.)
//!
//! [`Callers`] counts this process's callers (the segment's word is a peer's to read, and a
//! peer may scribble on it); its atomics come from the `sync` facade, so the loom models
//! (`loom_models::ring`) run this code with a writer, a caller and a progress thread.

use super::memory::{Memory, Word};
use super::ring::Segment;
use crate::sync::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

/// How the progress thread rests when it found no work ([`Callers::rest`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rest {
    /// Callers read the rings, or did a moment ago: wait on the doorbell (while it still
    /// reads `bell`) for at most the linger, then call [`Callers::lingered`] with `looks`.
    Linger {
        /// The doorbell's value before `sleeping` was raised.
        bell: u32,
        /// Callers' entries counted when the wait began.
        looks: u64,
    },
    /// Nobody reads: park on the doorbell while it reads `bell` (a sender that publishes
    /// from now on rings it).
    Park {
        /// The doorbell's value before `sleeping` was raised.
        bell: u32,
    },
    /// There is work: go on.
    Stay,
}

/// What a caller that leaves does next ([`Callers::leave`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Leave {
    /// Nothing.
    Done,
    /// Read the rings once more (it lowered `polling`: what a sender published before it
    /// saw the lowered flag is this caller's to take). All of it: a reader that takes a
    /// ring a slice at a time (`frames::SLICE`) and leaves bytes published behind must wake
    /// the progress thread for them (ring the doorbell, then a futex wake), since their
    /// sender will not ring.
    ReadOnce,
    /// Wake the progress thread (ring the doorbell, then a futex wake): it is parked,
    /// `polling` stays raised for it to lower, and calls are left to the background.
    WakeProgress,
}

/// The callers of one process that read its segment's rings themselves now.
#[derive(Debug, Default)]
pub struct Callers {
    /// Callers reading now.
    polling: AtomicUsize,
    /// Callers' entries, ever (the progress thread lowers the segment's `polling` once this
    /// stopped moving).
    looks: AtomicU64,
    /// A caller about to park asked for `polling` to be lowered as it leaves.
    parking: AtomicBool,
    /// The progress thread parks (or is about to): nothing lowers `polling` until it is
    /// woken.
    parked: AtomicBool,
    /// A planted bug for the loom models: a caller that leaves `polling` raised never wakes
    /// the parked progress thread (what the code did before the model found it: a frame
    /// then waited for the thread's next timed look).
    #[cfg(collectix_loom)]
    no_wake: bool,
}

impl Callers {
    /// No caller reads.
    pub fn new() -> Callers {
        Callers::default()
    }

    /// The same with the planted bug (`no_wake`).
    #[cfg(all(collectix_loom, test))]
    pub(crate) fn without_wake() -> Callers {
        Callers {
            no_wake: true,
            ..Callers::default()
        }
    }

    fn wakes(&self) -> bool {
        #[cfg(collectix_loom)]
        {
            !self.no_wake
        }
        #[cfg(not(collectix_loom))]
        {
            true
        }
    }

    /// A caller starts reading the rings of `seg` (its process's own segment).
    pub fn enter<M: Memory>(&self, seg: &Segment<M>) {
        self.looks.fetch_add(1, Ordering::SeqCst);
        self.polling.fetch_add(1, Ordering::SeqCst);
        seg.polling().store(1, Ordering::SeqCst);
    }

    /// A caller stops reading. The last one out leaves the segment's `polling` raised (the
    /// progress thread lowers it within the linger; if that thread is parked and
    /// `background` says calls are in flight with nobody waiting for them, the caller wakes
    /// it: [`Leave::WakeProgress`]), unless it parks: then it lowers it and must read the
    /// rings once more ([`Leave::ReadOnce`]), to take what a sender published before it saw
    /// no reader (after that, the sender rings).
    pub fn leave<M: Memory>(&self, seg: &Segment<M>, background: impl FnOnce() -> bool) -> Leave {
        let last = self.polling.fetch_sub(1, Ordering::SeqCst) == 1;
        if !last {
            return Leave::Done;
        }
        if self.parking.swap(false, Ordering::SeqCst) {
            self.lower(seg);
            return Leave::ReadOnce;
        }
        // `polling` (raised at entry) before the look at `parked`; the progress thread
        // raises `parked`, fences, then looks at `polling` before it parks.
        seg.region().fence(Ordering::SeqCst);
        if self.parked.load(Ordering::SeqCst) && self.wakes() && background() {
            Leave::WakeProgress
        } else {
            Leave::Done
        }
    }

    /// The caller that leaves next will park (its thread sleeps until its call ends).
    pub fn parking(&self) {
        self.parking.store(true, Ordering::SeqCst);
    }

    /// Whether a caller reads now.
    pub fn any(&self) -> bool {
        self.polling.load(Ordering::SeqCst) > 0
    }

    /// Lowers the segment's `polling` (senders ring the doorbell from now on), unless a
    /// caller came in meanwhile.
    pub fn lower<M: Memory>(&self, seg: &Segment<M>) {
        seg.polling().store(0, Ordering::SeqCst);
        seg.region().fence(Ordering::SeqCst);
        if self.any() {
            seg.polling().store(1, Ordering::SeqCst);
        }
    }

    /// The progress thread found no work and is going to rest: it raises `sleeping` and
    /// fences. Returns the doorbell's value from before, for [`rest`](Callers::rest). The
    /// thread then looks at the rings once more (and at anything else it serves) before it
    /// rests.
    pub fn going_to_sleep<M: Memory>(seg: &Segment<M>) -> u32 {
        let bell = seg.doorbell().load(Ordering::SeqCst);
        seg.sleeping().store(1, Ordering::SeqCst);
        seg.region().fence(Ordering::SeqCst);
        bell
    }

    /// How the progress thread rests after its last look: it lingers while callers read (or
    /// did a moment ago), else parks if `idle` (asked only then: whether that look found
    /// nothing), else stays. Before it parks it says so (`parked`, for a caller that leaves
    /// `polling` raised) and looks at `polling` again.
    pub fn rest<M: Memory>(
        &self,
        seg: &Segment<M>,
        bell: u32,
        idle: impl FnOnce() -> bool,
    ) -> Rest {
        let linger = || Rest::Linger {
            bell,
            looks: self.looks.load(Ordering::SeqCst),
        };
        let polled = || self.any() || seg.polling().load(Ordering::SeqCst) != 0;
        if polled() {
            return linger();
        }
        if !idle() {
            return Rest::Stay;
        }
        self.parked.store(true, Ordering::SeqCst);
        seg.region().fence(Ordering::SeqCst);
        if polled() {
            self.parked.store(false, Ordering::SeqCst);
            return linger();
        }
        Rest::Park { bell }
    }

    /// The linger's wait is over: if no caller came during it (`looks` unchanged, nobody
    /// reading), lowers the segment's `polling`; the thread then looks at the rings again
    /// (what came before is read by that look, what comes after rings).
    pub fn lingered<M: Memory>(&self, seg: &Segment<M>, looks: u64) {
        if !self.any() && self.looks.load(Ordering::SeqCst) == looks {
            self.lower(seg);
        }
    }

    /// The progress thread is up again.
    pub fn woke<M: Memory>(&self, seg: &Segment<M>) {
        self.parked.store(false, Ordering::SeqCst);
        seg.sleeping().store(0, Ordering::SeqCst);
    }
}

#[cfg(all(test, not(collectix_loom)))]
mod tests {
    use super::*;
    use crate::wire::shm::ring::Layout;
    use crate::wire::shm::Region;
    use std::sync::Arc;

    fn segment() -> Segment {
        let layout = Layout::new(1, 4096).unwrap_or_else(|e| panic!("{e}"));
        let region = Arc::new(Region::heap(layout.bytes().unwrap_or(0)));
        Segment::create(region, layout, 1).unwrap_or_else(|e| panic!("{e}"))
    }

    fn polling(seg: &Segment) -> u32 {
        seg.polling().load(Ordering::SeqCst)
    }

    #[test]
    fn the_last_caller_out_leaves_polling_raised_and_one_that_parks_lowers_it() {
        let (seg, c) = (segment(), Callers::new());
        c.enter(&seg);
        c.enter(&seg);
        assert_eq!(polling(&seg), 1);
        assert_eq!(c.leave(&seg, || true), Leave::Done, "not the last one");
        assert_eq!(
            c.leave(&seg, || true),
            Leave::Done,
            "the progress thread is up"
        );
        assert_eq!(polling(&seg), 1, "left raised for the linger");
        c.enter(&seg);
        c.parking();
        assert_eq!(c.leave(&seg, || true), Leave::ReadOnce);
        assert_eq!(polling(&seg), 0);
        c.enter(&seg);
        assert_eq!(
            c.leave(&seg, || true),
            Leave::Done,
            "parking is asked for once"
        );
    }

    #[test]
    fn the_progress_thread_lingers_while_callers_read_parks_when_idle_and_stays_with_work() {
        let (seg, c) = (segment(), Callers::new());
        let bell = Callers::going_to_sleep(&seg);
        assert_eq!(seg.sleeping().load(Ordering::SeqCst), 1);
        assert_eq!(c.rest(&seg, bell, || false), Rest::Stay);
        assert_eq!(c.rest(&seg, bell, || true), Rest::Park { bell });
        c.woke(&seg);
        assert_eq!(seg.sleeping().load(Ordering::SeqCst), 0);
        c.enter(&seg);
        assert_eq!(
            c.rest(&seg, bell, || panic!("not asked while callers read")),
            Rest::Linger { bell, looks: 1 }
        );
        assert_eq!(c.leave(&seg, || true), Leave::Done);
        // Left raised: the thread still lingers, and lowers it after a wait no caller came in.
        let Rest::Linger { looks, .. } = c.rest(&seg, bell, || true) else {
            panic!("lingers");
        };
        c.enter(&seg);
        assert_eq!(c.leave(&seg, || true), Leave::Done);
        c.lingered(&seg, looks);
        assert_eq!(polling(&seg), 1, "a caller came during the wait");
        c.lingered(&seg, looks + 1);
        assert_eq!(polling(&seg), 0);
        assert_eq!(c.rest(&seg, bell, || true), Rest::Park { bell });
    }

    #[test]
    fn a_caller_that_leaves_polling_raised_with_calls_in_the_background_wakes_a_parked_thread() {
        let (seg, c) = (segment(), Callers::new());
        let bell = Callers::going_to_sleep(&seg);
        assert_eq!(c.rest(&seg, bell, || true), Rest::Park { bell });
        c.enter(&seg);
        assert_eq!(
            c.leave(&seg, || false),
            Leave::Done,
            "nothing in the background: the next caller takes what comes"
        );
        c.enter(&seg);
        assert_eq!(c.leave(&seg, || true), Leave::WakeProgress);
        c.woke(&seg);
        c.enter(&seg);
        assert_eq!(
            c.leave(&seg, || true),
            Leave::Done,
            "the thread is up: it lowers polling"
        );
    }

    #[test]
    fn a_caller_in_the_segment_turns_a_park_into_a_linger() {
        let (seg, c) = (segment(), Callers::new());
        let bell = Callers::going_to_sleep(&seg);
        // The caller enters between the first look at `polling` and the park.
        let rest = c.rest(&seg, bell, || {
            c.enter(&seg);
            true
        });
        assert_eq!(rest, Rest::Linger { bell, looks: 1 });
        assert_eq!(
            c.leave(&seg, || true),
            Leave::Done,
            "the thread lingers: not parked"
        );
    }

    #[test]
    fn polling_stays_raised_while_a_caller_reads() {
        let (seg, c) = (segment(), Callers::new());
        c.enter(&seg);
        assert!(c.any());
        let Rest::Linger { looks, .. } = c.rest(&seg, 0, || true) else {
            panic!("a caller reads: the thread lingers");
        };
        c.lingered(&seg, looks);
        assert_eq!(polling(&seg), 1, "not lowered under a caller");
        c.lower(&seg);
        assert_eq!(polling(&seg), 1, "raised again: a caller reads");
        c.enter(&seg);
        c.parking();
        assert_eq!(c.leave(&seg, || true), Leave::Done, "not the last one out");
        assert_eq!(polling(&seg), 1);
        assert_eq!(
            c.leave(&seg, || true),
            Leave::ReadOnce,
            "the last one parks"
        );
        assert!(!c.any());
        assert_eq!(polling(&seg), 0);
    }

    #[test]
    fn a_sender_wakes_the_owner_only_when_nobody_reads() {
        let (seg, c) = (segment(), Callers::new());
        assert!(!seg.needs_wake(), "the progress thread is up");
        let bell = Callers::going_to_sleep(&seg);
        assert!(seg.needs_wake());
        c.enter(&seg);
        assert!(!seg.needs_wake(), "a caller reads");
        c.parking();
        assert_eq!(c.leave(&seg, || true), Leave::ReadOnce);
        assert!(seg.needs_wake());
        seg.ring();
        assert_eq!(seg.doorbell().load(Ordering::SeqCst), bell + 1);
    }
}
