//! Model group 9: a shared-memory segment's ring and its doorbell protocol
//! (`crate::wire::shm::{ring, wake}`): the real [`Segment`], [`RingWriter`], [`RingReader`]
//! and [`Callers`] over a model [`Memory`] whose counters, flags and data bytes are loom
//! atomics (the bytes copied relaxed, as plain copies order nothing: a byte read without the
//! publish's release and the reader's acquire between its write and the read may be stale,
//! and the model checks every byte).
//!
//! What they prove, in every interleaving loom explores:
//! - a writer's frames reach the reader whole and in order across the ring's wrap, a writer
//!   that finds no room says so (`waiting`) and is told once room is freed, never left
//!   waiting (and with release stores made relaxed, the planted bug, loom finds a read of
//!   a byte the writer's publish did not order before it, which is stale);
//! - a frame published while the owner's progress thread goes to rest and a caller of the
//!   owner enters, reads and leaves (parking, or lingering: the segment's `polling` left
//!   raised for the progress thread to lower) is read, by the caller or by the progress
//!   thread, with no wake-up lost: the progress thread parks only where a later publish
//!   rings (and with the segment's fences dropped, the planted bug, loom finds the execution
//!   where the sender skips the doorbell while the progress thread parks on a frame it did
//!   not see).
//!
//! What stands in for the OS: a futex is a loom mutex and condition variable (a wait sleeps
//! while the word holds the value it was given; a wake notifies every waiter). A timed wait
//! (the linger) returns at once, as if its time had passed. Not modelled: a peer that
//! scribbles on the segment (the ring's checks, unit-tested in `wire::shm::ring`), the
//! process's board ([`super::board`]), and the actors crate's threads themselves.

use super::{check, check_from, must_fail, must_fail_from};
use crate::wire::shm::memory::{Memory, Word};
use crate::wire::shm::ring::{
    Layout, Segment, ACKED, DOORBELL_AT, HEAD, MAGIC_AT, MAIL_AT, POLLING_AT, RING_HEAD,
    SLEEPING_AT, TAIL, WAITING,
};
use crate::wire::shm::wake::{Callers, Leave, Rest};
use crate::wire::shm::{RingReader, RingWriter};
use loom::sync::atomic::{fence, AtomicU32, AtomicU64, AtomicU8, Ordering};
use loom::sync::{Arc, Condvar, Mutex};

/// The model's ring: one ring of 64 bytes.
const CAP: u64 = 64;

/// A planted bug in the memory: what the ring code asks for is weakened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Flaw {
    /// Release stores are relaxed (a publish orders nothing before it).
    RelaxedStores,
    /// Fences do nothing.
    NoFences,
    /// A caller that leaves `polling` raised does not wake the parked progress thread
    /// ([`Callers::without_wake`]; the memory is sound).
    NoWake,
}

fn weaken(order: Ordering, flaw: Option<Flaw>) -> Ordering {
    match (flaw, order) {
        (Some(Flaw::RelaxedStores), Ordering::Release) => Ordering::Relaxed,
        _ => order,
    }
}

/// A model word: a loom atomic and the memory's flaw.
struct W<A> {
    a: A,
    flaw: Option<Flaw>,
}

macro_rules! model_word {
    ($atomic:ty, $t:ty) => {
        impl Word<$t> for W<$atomic> {
            fn zero() -> Self {
                W {
                    a: <$atomic>::new(0),
                    flaw: None,
                }
            }
            fn load(&self, order: Ordering) -> $t {
                self.a.load(order)
            }
            fn store(&self, v: $t, order: Ordering) {
                self.a.store(v, weaken(order, self.flaw))
            }
            fn swap(&self, v: $t, order: Ordering) -> $t {
                self.a.swap(v, order)
            }
            fn fetch_add(&self, v: $t, order: Ordering) -> $t {
                self.a.fetch_add(v, order)
            }
        }
    };
}

model_word!(AtomicU32, u32);
model_word!(AtomicU64, u64);

/// A segment's memory for the model: loom atomics at the offsets the segment and its one
/// ring use and for each data byte, and the header's plain bytes (written and read only
/// before the model's threads start).
struct ModelMemory {
    len: usize,
    u32s: Vec<(usize, W<AtomicU32>)>,
    u64s: Vec<(usize, W<AtomicU64>)>,
    data: Vec<AtomicU8>,
    header: Mutex<Vec<u8>>,
    flaw: Option<Flaw>,
}

/// The model's segment: one ring.
const LAYOUT: Layout = Layout { rings: 1, cap: CAP };
/// Where the ring starts.
const RING_AT: usize = LAYOUT.rings_start();
/// Where the ring's data starts.
const DATA: usize = RING_AT + RING_HEAD;

impl ModelMemory {
    fn new(flaw: Option<Flaw>) -> ModelMemory {
        let base = RING_AT;
        let w32 = |at| {
            (
                at,
                W {
                    a: AtomicU32::new(0),
                    flaw,
                },
            )
        };
        let w64 = |at| {
            (
                at,
                W {
                    a: AtomicU64::new(0),
                    flaw,
                },
            )
        };
        ModelMemory {
            len: DATA + CAP as usize,
            u32s: [DOORBELL_AT, SLEEPING_AT, POLLING_AT, base + WAITING]
                .into_iter()
                .map(w32)
                .collect(),
            u64s: [MAGIC_AT, base + TAIL, base + HEAD, base + ACKED]
                .into_iter()
                .map(w64)
                .collect(),
            data: (0..CAP).map(|_| AtomicU8::new(0)).collect(),
            header: Mutex::new(vec![0; 64]),
            flaw,
        }
    }
}

impl ModelMemory {
    /// [`new`](Self::new), with the owner's mail flag and the mail model's two message
    /// words.
    fn with_mail(flaw: Option<Flaw>) -> ModelMemory {
        let mut m = ModelMemory::new(flaw);
        for at in [MAIL_FLAG_AT, MAIL_MSG_AT[0], MAIL_MSG_AT[1]] {
            m.u64s.push((
                at,
                W {
                    a: AtomicU64::new(0),
                    flaw,
                },
            ));
        }
        m
    }
}

impl Memory for ModelMemory {
    type W32 = W<AtomicU32>;
    type W64 = W<AtomicU64>;
    fn len(&self) -> usize {
        self.len
    }
    fn u32(&self, at: usize) -> Option<&W<AtomicU32>> {
        self.u32s.iter().find(|(k, _)| *k == at).map(|(_, w)| w)
    }
    fn u64(&self, at: usize) -> Option<&W<AtomicU64>> {
        self.u64s.iter().find(|(k, _)| *k == at).map(|(_, w)| w)
    }
    fn write(&self, at: usize, src: &[u8]) -> bool {
        if at >= DATA {
            let Some(cells) = self.data.get(at - DATA..at - DATA + src.len()) else {
                return false;
            };
            for (c, b) in cells.iter().zip(src) {
                c.store(*b, Ordering::Relaxed);
            }
            return true;
        }
        let mut h = self.header.lock().unwrap_or_else(|e| e.into_inner());
        match h.get_mut(at..at + src.len()) {
            Some(d) => {
                d.copy_from_slice(src);
                true
            }
            None => false,
        }
    }
    fn read(&self, at: usize, dst: &mut [u8]) -> bool {
        if at >= DATA {
            let Some(cells) = self.data.get(at - DATA..at - DATA + dst.len()) else {
                return false;
            };
            for (c, b) in cells.iter().zip(dst.iter_mut()) {
                *b = c.load(Ordering::Relaxed);
            }
            return true;
        }
        let h = self.header.lock().unwrap_or_else(|e| e.into_inner());
        match h.get(at..at + dst.len()) {
            Some(s) => {
                dst.copy_from_slice(s);
                true
            }
            None => false,
        }
    }
    fn fence(&self, order: Ordering) {
        if self.flaw != Some(Flaw::NoFences) {
            fence(order)
        }
    }
}

/// A futex on a model word: a wait sleeps while the word holds the value it was given, a
/// wake notifies every waiter.
#[derive(Default)]
struct Futex {
    lock: Mutex<()>,
    cv: Condvar,
}

impl Futex {
    fn wait(&self, word: &W<AtomicU32>, value: u32) {
        let mut g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        while word.load(Ordering::SeqCst) == value {
            g = self.cv.wait(g).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn wake(&self) {
        let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        self.cv.notify_all();
    }
}

/// The owner's segment, a writer's end and the reader's end of its one ring.
fn ring(
    flaw: Option<Flaw>,
) -> (
    std::sync::Arc<Segment<ModelMemory>>,
    RingWriter<ModelMemory>,
    RingReader<ModelMemory>,
) {
    let mem = std::sync::Arc::new(ModelMemory::new(flaw));
    let layout = LAYOUT;
    // One segment for both ends (a sender's mapping is another view of the same memory;
    // `Segment::open` would refuse the model's small ring, below the smallest real one).
    let own = std::sync::Arc::new(
        Segment::create(mem, layout, 1).unwrap_or_else(|e| panic!("create: {e}")),
    );
    let w = own.writer(0).unwrap_or_else(|| panic!("no writer end"));
    let r = own.reader(0).unwrap_or_else(|| panic!("no reader end"));
    (own, w, r)
}

/// Frame `i` of `n` bytes: each byte says which frame and where.
fn frame(i: u8, n: usize) -> Vec<u8> {
    (0..n)
        .map(|k| i.wrapping_mul(64).wrapping_add(k as u8))
        .collect()
}

/// A writer sends three 24-byte frames through the 64-byte ring (the third wraps, and waits
/// for room: it says so, then parks on a futex the reader wakes once `release` says the
/// writer waits); the reader takes them and checks every byte.
fn frames_across_the_wrap(flaw: Option<Flaw>) {
    const N: usize = 24;
    let (_own, mut w, mut r) = ring(flaw);
    let room_bell = Arc::new((AtomicU32::new(0), Futex::default()));
    let bell = room_bell.clone();
    let writer = loom::thread::spawn(move || {
        for i in 0..3u8 {
            let src = frame(i, N);
            loop {
                let seen = bell.0.load(Ordering::SeqCst);
                let mut room = w.room().unwrap_or_else(|e| panic!("room: {e}"));
                if room >= N as u64 {
                    assert_eq!(w.put(&src, &mut room), N);
                    w.publish();
                    break;
                }
                w.want_room();
                if w.room().unwrap_or(0) >= N as u64 {
                    continue;
                }
                // Parks until the reader rings (a model futex on the reader's count).
                let mut g = bell.1.lock.lock().unwrap_or_else(|e| e.into_inner());
                while bell.0.load(Ordering::SeqCst) == seen {
                    g = bell.1.cv.wait(g).unwrap_or_else(|e| e.into_inner());
                }
            }
        }
    });
    let mut got = 0usize;
    let mut buf = [0u8; N];
    let mut filled = 0usize;
    while got < 3 {
        let mut ready = r.ready().unwrap_or_else(|e| panic!("ready: {e}"));
        let n = r.take(&mut buf[filled..], &mut ready);
        filled += n;
        if r.release() {
            room_bell.0.fetch_add(1, Ordering::SeqCst);
            room_bell.1.wake();
        }
        if filled == N {
            assert_eq!(buf.to_vec(), frame(got as u8, N), "frame {got}");
            got += 1;
            filled = 0;
        } else if n == 0 {
            loom::thread::yield_now();
        }
    }
    writer
        .join()
        .unwrap_or_else(|_| panic!("the writer panicked"));
}

#[test]
fn frames_cross_the_wrap_whole_and_the_writer_is_told_of_room() {
    check(
        "ring: three frames across the wrap of a 64-byte ring",
        || frames_across_the_wrap(None),
    );
}

/// The bug: the writer's publish (and every release store) is relaxed. loom must find the
/// reader reading a stale byte: one the publish did not order before its acquire of the
/// tail.
#[test]
fn with_relaxed_stores_the_reader_reads_bytes_not_yet_written() {
    let (msg, _) = must_fail("bug: ring publish without release", || {
        frames_across_the_wrap(Some(Flaw::RelaxedStores))
    });
    assert!(msg.contains("frame"), "unexpected failure: {msg}");
}

/// The doorbell models' smallest preemption bound: 2 (at 3 each explores about 470,000
/// executions, 45 s; `LOOM_MAX_PREEMPTIONS=3` runs them so).
const DOORBELL_BOUND: usize = 2;

/// How the caller of the doorbell model leaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Leaves {
    /// It parks: it lowers `polling` and reads once more.
    Parking,
    /// It lingers: `polling` stays raised until the progress thread lowers it.
    Lingering,
}

/// What the readers of the doorbell model share: the reader's end and the frames read.
struct Reading {
    ring: RingReader<ModelMemory>,
    got: usize,
}

/// Reads what is there; whether it took anything.
fn read(reading: &Mutex<Reading>) -> bool {
    let mut g = reading.lock().unwrap_or_else(|e| e.into_inner());
    let mut ready = g.ring.ready().unwrap_or_else(|e| panic!("ready: {e}"));
    if ready == 0 {
        return false;
    }
    let mut buf = [0u8; 8];
    assert_eq!(g.ring.take(&mut buf, &mut ready), 8);
    assert_eq!(buf.to_vec(), frame(0, 8));
    g.ring.release();
    g.got += 1;
    true
}

/// A sender publishes one 8-byte frame and wakes the owner if it needs to; a caller of the
/// owner enters, reads, and leaves (`leaves`); the owner's progress thread reads, and rests
/// as the doorbell protocol says, until the frame was read. A lost wake-up leaves the
/// progress thread parked for good with the frame unread, and the main thread joining it:
/// loom's deadlock. (A caller that took the frame rings the doorbell, as a close would, so
/// that the progress thread, which may have parked with nothing left to do, ends.)
fn doorbell(leaves: Leaves, flaw: Option<Flaw>) {
    let (own, mut w, r) = ring(flaw);
    let callers = Arc::new(match flaw {
        Some(Flaw::NoWake) => Callers::without_wake(),
        _ => Callers::new(),
    });
    let futex = Arc::new(Futex::default());
    let reading = Arc::new(Mutex::new(Reading { ring: r, got: 0 }));
    let progress = {
        let (own, callers, futex, reading) =
            (own.clone(), callers.clone(), futex.clone(), reading.clone());
        loom::thread::spawn(move || loop {
            let got = reading.lock().unwrap_or_else(|e| e.into_inner()).got;
            if got > 0 {
                return got;
            }
            if read(&reading) {
                continue;
            }
            let bell = Callers::going_to_sleep(&own);
            // The frame taken by the caller counts as work: the thread then ends.
            let idle = || {
                let g = reading.lock().unwrap_or_else(|e| e.into_inner());
                g.got == 0 && g.ring.ready().unwrap_or(1) == 0
            };
            match callers.rest(&own, bell, idle) {
                Rest::Linger { looks, .. } => {
                    // The linger's timed wait: its time passes.
                    loom::thread::yield_now();
                    callers.lingered(&own, looks);
                }
                Rest::Park { bell } => futex.wait(own.doorbell(), bell),
                Rest::Stay => {}
            }
            callers.woke(&own);
        })
    };
    let caller = {
        let (own, callers, reading, futex) =
            (own.clone(), callers.clone(), reading.clone(), futex.clone());
        loom::thread::spawn(move || {
            let took = |own: &Segment<ModelMemory>| {
                if read(&reading) {
                    own.ring();
                    futex.wake();
                }
            };
            callers.enter(&own);
            took(&own);
            if leaves == Leaves::Parking {
                callers.parking();
            }
            // The frame is for a call in flight (its caller gone): the background's.
            match callers.leave(&own, || true) {
                Leave::Done => {}
                Leave::ReadOnce => took(&own),
                Leave::WakeProgress => {
                    own.ring();
                    futex.wake();
                }
            }
        })
    };
    let sender = {
        let (theirs, futex) = (w.segment().clone(), futex.clone());
        loom::thread::spawn(move || {
            let src = frame(0, 8);
            let mut room = w.room().unwrap_or_else(|e| panic!("room: {e}"));
            assert_eq!(w.put(&src, &mut room), 8);
            w.publish();
            if theirs.needs_wake() {
                theirs.ring();
                futex.wake();
            }
        })
    };
    // No loom object may be on this thread's stack when loom reports a deadlock (dropping
    // one while that panic unwinds aborts the test binary).
    drop((own, callers, futex, reading));
    sender
        .join()
        .unwrap_or_else(|_| panic!("the sender panicked"));
    caller
        .join()
        .unwrap_or_else(|_| panic!("the caller panicked"));
    let got = progress
        .join()
        .unwrap_or_else(|_| panic!("the progress thread panicked"));
    assert_eq!(got, 1, "the frame is read once");
}

#[test]
fn a_frame_is_read_while_a_caller_leaves_parking() {
    check_from(
        "ring: doorbell, a caller that parks",
        DOORBELL_BOUND,
        || doorbell(Leaves::Parking, None),
    );
}

#[test]
fn a_frame_is_read_while_a_caller_leaves_lingering() {
    check_from(
        "ring: doorbell, a caller that lingers",
        DOORBELL_BOUND,
        || doorbell(Leaves::Lingering, None),
    );
}

/// The bug: the segment's fences do nothing. loom must find the lost wake-up: the sender
/// reads `sleeping` and `polling` from before the progress thread raised one and the caller
/// lowered the other, and skips the doorbell, while the progress thread's last look reads a
/// tail from before the publish, and parks for good.
/// The bug: a caller that leaves `polling` raised while the progress thread is parked does
/// not wake it (the code before this model). loom must find the lost wake-up: the sender
/// sees `polling` raised and skips the doorbell, and nothing ever lowers it (the first
/// schedule already: the progress thread parks before the caller comes). A real progress
/// thread parks for at most half a second, so the frame waited up to that long.
#[test]
fn a_lingering_caller_that_does_not_wake_the_parked_thread_loses_a_wake_up() {
    let (msg, _) = must_fail_from("bug: lingering caller, no wake", DOORBELL_BOUND, || {
        doorbell(Leaves::Lingering, Some(Flaw::NoWake))
    });
    assert!(msg.contains("deadlock"), "unexpected failure: {msg}");
}

#[test]
fn without_the_fences_a_wake_up_is_lost() {
    let (msg, _) = must_fail_from("bug: doorbell without its fences", DOORBELL_BOUND, || {
        doorbell(Leaves::Parking, Some(Flaw::NoFences))
    });
    assert!(msg.contains("deadlock"), "unexpected failure: {msg}");
}

/// Where the owner's mail flag is (`crate::board::mail::MAIL_FLAG` of its mailbox), and two
/// senders' stand-ins for a message in their rings of that mailbox: a word each, written
/// with release as a slot's position word is.
const MAIL_FLAG_AT: usize = MAIL_AT + 8 * crate::board::mail::MAIL_FLAG;
const MAIL_MSG_AT: [usize; 2] = [MAIL_FLAG_AT + 8, MAIL_FLAG_AT + 16];

/// Two senders in other processes each put a message in the owner's mailbox and raise its
/// flag only if it is down ([`Segment::raise_mail_flag`]), while the owner looks at the flag
/// until a take lowers it ([`Segment::take_mail_flag`]) and then reads both messages. Every
/// message is seen by that read, or the flag is up at the end (its raiser rang: another
/// take comes). (A model whose owner looks once finds the flag down in every execution
/// loom explores, and checks nothing: its planted bug went unnoticed.)
fn mail_flag(flaw: Option<Flaw>) {
    let mem = std::sync::Arc::new(ModelMemory::with_mail(flaw));
    let seg = std::sync::Arc::new(
        Segment::create(mem.clone(), LAYOUT, 1).unwrap_or_else(|e| panic!("create: {e}")),
    );
    let senders: Vec<_> = MAIL_MSG_AT
        .iter()
        .map(|&at| {
            let (mem, seg) = (mem.clone(), seg.clone());
            loom::thread::spawn(move || {
                if let Some(w) = mem.u64(at) {
                    w.store(1, Ordering::Release);
                }
                seg.raise_mail_flag()
            })
        })
        .collect();
    // The owner looks until a take lowers the flag (a raise rang for it), then reads.
    while !seg.take_mail_flag() {
        loom::thread::yield_now();
    }
    let seen: Vec<u64> = MAIL_MSG_AT
        .iter()
        .map(|&at| mem.u64(at).map_or(0, |w| w.load(Ordering::Acquire)))
        .collect();
    for s in senders {
        s.join().unwrap_or_else(|_| panic!("a sender panicked"));
    }
    let up = seg.mail_flag();
    for (k, &v) in seen.iter().enumerate() {
        assert!(
            up || v == 1,
            "message {k} stranded: the flag is down and the owner's take did not see it"
        );
    }
}

#[test]
fn a_sender_that_finds_the_mail_flag_up_leaves_its_message_to_the_take_that_lowers_it() {
    check("mail flag: two senders raise it only when down", || {
        mail_flag(None)
    });
}

#[test]
fn without_the_fences_a_sender_that_finds_the_flag_up_strands_its_message() {
    let (msg, _) = must_fail("bug: mail flag without its fences", || {
        mail_flag(Some(Flaw::NoFences))
    });
    assert!(msg.contains("stranded"), "unexpected failure: {msg}");
}
