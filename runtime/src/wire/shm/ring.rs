//! A segment's layout and its rings: single-producer, single-consumer byte rings in shared
//! memory, one per sender, in the segment of the process that receives.
//!
//! ```text
//!  segment                               ring k (at rings_start + k × (RING_HEAD + cap))
//!  0    magic "cx-shm01" (u64)           +0    tail (u64): bytes ever written; the sender's
//!  8    version (u32)                    +64   waiting (u32): the sender waits for room
//!  12   rings (u32)                      +128  head (u64): bytes ever read; the receiver's
//!  16   ring capacity (u64)              +192  acked (u64): remote records read; the
//!                                              receiver's; +200 remote (u32): the receiver
//!                                              can read the sender's memory
//!                                        +256  cap bytes of data, written at tail % cap
//!  24   owner's pid (u32)
//!  64   doorbell (u32, a futex word)
//!  128  sleeping (u32): the owner's progress thread is parked on the doorbell
//!  192  polling (u32): callers of the owner that read its rings themselves now
//!  256  the owner's board lane (`crate::board`, LANE_BYTES)
//!  MAIL_AT  the owner's mailbox (`crate::board::mail`, `Layout::mail_bytes`: room for a
//!       group of one member per ring, none past MAIL_MEMBERS but its flag's line); the
//!       rings follow (`Layout::rings_start`)
//! ```
//!
//! Every counter sits on a cache line of its own and has one writer: the tail and `waiting`
//! the sender, the head the receiver (and `waiting`'s reset). Data is published by a release
//! store of the tail, which the receiver loads with acquire before it reads the bytes;
//! space is returned by a release store of the head. Each side keeps its own counter in
//! private memory and only *reads* the other's from the segment, checking it: a tail that
//! claims more than a ring holds, or a head ahead of the tail, is [`ShmError::Corrupt`], never
//! a read outside the ring. A sender that dies mid-write never published the bytes it wrote.

use super::memory::{Memory, Word};
use super::region::Region;
use super::ShmError;
use crate::sync::unmodelled::Ordering;
use std::sync::Arc;

/// Bytes of a cache line (each counter has one to itself).
pub const LINE: usize = 64;
/// A segment's magic.
pub const SEGMENT_MAGIC: u64 = u64::from_le_bytes(*b"cx-shm01");
/// The segment format's version.
pub const SEGMENT_VERSION: u32 = 6;
/// Bytes of a segment's header.
pub const HEADER_BYTES: usize = 4 * LINE;
/// Where the owner's board lane is ([`crate::board`]: the small calls of a group whose
/// members all share memory), right after the header.
pub const BOARD_AT: usize = HEADER_BYTES;
/// Where the owner's mailbox is ([`crate::board::mail`]: the small point-to-point messages of
/// the group whose board is in the segment), right after the board lane.
pub const MAIL_AT: usize = BOARD_AT + crate::board::LANE_BYTES;
/// Bytes in front of each ring's data.
pub const RING_HEAD: usize = 4 * LINE;
/// The smallest ring.
pub const MIN_RING: u64 = 4 << 10;
/// The largest ring.
pub const MAX_RING: u64 = 1 << 30;
/// The most rings in a segment (senders of one host).
pub const MAX_RINGS: u32 = 4096;

pub(crate) const MAGIC_AT: usize = 0;
pub(crate) const VERSION_AT: usize = 8;
pub(crate) const RINGS_AT: usize = 12;
pub(crate) const CAP_AT: usize = 16;
pub(crate) const PID_AT: usize = 24;
pub(crate) const DOORBELL_AT: usize = LINE;
pub(crate) const SLEEPING_AT: usize = 2 * LINE;
pub(crate) const POLLING_AT: usize = 3 * LINE;
pub(crate) const TAIL: usize = 0;
pub(crate) const WAITING: usize = LINE;
pub(crate) const HEAD: usize = 2 * LINE;
pub(crate) const ACKED: usize = 3 * LINE;
pub(crate) const REMOTE: usize = 3 * LINE + 8;
/// A bit of `REMOTE`: the reader reads the writer's memory (any payload).
const CAN_READ_MEMORY: u32 = 1;
/// A bit of `REMOTE`: the reader maps the writer's shared heap.
const CAN_READ_HEAP: u32 = 2;

/// A segment's shape: how many rings, of what capacity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Rings (one per sender).
    pub rings: u32,
    /// Each ring's capacity in bytes (a multiple of [`LINE`]).
    pub cap: u64,
}

impl Layout {
    /// Members the segment's mailbox has room for: one per ring (a segment has a ring for
    /// each rank of its host, and a group whose members all share memory is at most that),
    /// none for more than [`crate::board::mail::MAIL_MEMBERS`].
    pub const fn mail_members(&self) -> usize {
        let n = self.rings as usize;
        if n <= crate::board::mail::MAIL_MEMBERS {
            n
        } else {
            0
        }
    }

    /// Bytes of the mailbox, at [`MAIL_AT`]: a group of [`Layout::mail_members`] (its first
    /// line, the new-mail flag, is there even for none).
    pub const fn mail_bytes(&self) -> usize {
        crate::board::mail::mailbox_words(self.mail_members()) * 8
    }

    /// Where the rings start, after the mailbox.
    pub const fn rings_start(&self) -> usize {
        MAIL_AT + self.mail_bytes()
    }

    /// A layout of `rings` rings of `cap` bytes; `cap` must be a multiple of 64 between
    /// [`MIN_RING`] and [`MAX_RING`], and `rings` at most [`MAX_RINGS`].
    pub fn new(rings: u32, cap: u64) -> Result<Layout, ShmError> {
        if rings > MAX_RINGS {
            return Err(ShmError::Layout(format!(
                "{rings} rings (at most {MAX_RINGS})"
            )));
        }
        if !(MIN_RING..=MAX_RING).contains(&cap) || !cap.is_multiple_of(LINE as u64) {
            return Err(ShmError::Layout(format!(
                "a ring of {cap} bytes (a multiple of 64 from {MIN_RING} to {MAX_RING})"
            )));
        }
        let l = Layout { rings, cap };
        l.bytes()
            .map(|_| l)
            .ok_or_else(|| ShmError::Layout(format!("{rings} rings of {cap} bytes overflow")))
    }

    /// The segment's size in bytes (`None` if it overflows).
    pub fn bytes(&self) -> Option<usize> {
        let per = usize::try_from(self.cap).ok()?.checked_add(RING_HEAD)?;
        per.checked_mul(self.rings as usize)?
            .checked_add(self.rings_start())
    }

    /// Where ring `k` starts.
    fn ring_at(&self, k: u32) -> Option<usize> {
        if k >= self.rings {
            return None;
        }
        let per = usize::try_from(self.cap).ok()?.checked_add(RING_HEAD)?;
        per.checked_mul(k as usize)?.checked_add(self.rings_start())
    }
}

/// A segment: a region with a checked [`Layout`] (its size is at least the layout's), in
/// shared memory ([`Region`]) or, in the loom models, in a model's [`Memory`].
pub struct Segment<M: Memory = Region> {
    region: Arc<M>,
    layout: Layout,
    /// Stands in for a counter the region cannot hold (never used: the size was checked).
    spare: M::W32,
}

impl<M: Memory> Segment<M> {
    /// Formats a new segment (this process receives on it): writes the header of `layout`
    /// for owner `pid`. The region must be zeroed and at least `layout.bytes()` long.
    pub fn create(region: Arc<M>, layout: Layout, pid: u32) -> Result<Segment<M>, ShmError> {
        let need = layout.bytes().unwrap_or(usize::MAX);
        if region.len() < need {
            return Err(ShmError::Layout(format!(
                "a region of {} bytes for a segment of {need}",
                region.len()
            )));
        }
        region.write(VERSION_AT, &SEGMENT_VERSION.to_le_bytes());
        region.write(RINGS_AT, &layout.rings.to_le_bytes());
        region.write(CAP_AT, &layout.cap.to_le_bytes());
        region.write(PID_AT, &pid.to_le_bytes());
        if let Some(m) = region.u64(MAGIC_AT) {
            // Last, with release: a peer that sees the magic sees the header.
            m.store(SEGMENT_MAGIC, Ordering::Release);
        }
        Ok(Segment {
            region,
            layout,
            spare: Word::zero(),
        })
    }

    /// Opens a peer's segment (this process sends on it): checks its header against what the
    /// job agreed on (`rings`) and the region's size. Bad values are errors, never trusted.
    pub fn open(region: Arc<M>, rings: u32) -> Result<Segment<M>, ShmError> {
        let magic = region.u64(MAGIC_AT).map(|m| m.load(Ordering::Acquire));
        if magic != Some(SEGMENT_MAGIC) {
            return Err(ShmError::Corrupt("the segment's magic".into()));
        }
        let mut b4 = [0u8; 4];
        let mut b8 = [0u8; 8];
        region.read(VERSION_AT, &mut b4);
        let version = u32::from_le_bytes(b4);
        if version != SEGMENT_VERSION {
            return Err(ShmError::Corrupt(format!(
                "the segment's version {version} (this build speaks {SEGMENT_VERSION})"
            )));
        }
        region.read(RINGS_AT, &mut b4);
        let got = u32::from_le_bytes(b4);
        if got != rings {
            return Err(ShmError::Corrupt(format!(
                "the segment has {got} rings where {rings} were agreed"
            )));
        }
        region.read(CAP_AT, &mut b8);
        let layout = Layout::new(rings, u64::from_le_bytes(b8))?;
        let need = layout.bytes().unwrap_or(usize::MAX);
        if region.len() < need {
            return Err(ShmError::Corrupt(format!(
                "the segment is {} bytes, its header says {need}",
                region.len()
            )));
        }
        Ok(Segment {
            region,
            layout,
            spare: Word::zero(),
        })
    }

    /// The memory under the segment (its accessors are all checked: a test scribbles on a
    /// peer's counters through it, as a broken peer would).
    pub fn region(&self) -> &Arc<M> {
        &self.region
    }

    /// Where ring `k`'s tail counter is, in the region.
    pub fn tail_at(&self, k: u32) -> Option<usize> {
        self.layout.ring_at(k).map(|b| b + TAIL)
    }

    /// The segment's layout.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// The owner's pid, as its header says (a peer's word: for diagnostics).
    pub fn owner_pid(&self) -> u32 {
        let mut b4 = [0u8; 4];
        self.region.read(PID_AT, &mut b4);
        u32::from_le_bytes(b4)
    }

    fn word(&self, at: usize) -> &M::W32 {
        self.region.u32(at).unwrap_or(&self.spare)
    }

    /// The doorbell: a counter that wakes the owner's progress thread (a futex word).
    pub fn doorbell(&self) -> &M::W32 {
        self.word(DOORBELL_AT)
    }

    /// Non-zero while the owner's progress thread is parked on the doorbell.
    pub fn sleeping(&self) -> &M::W32 {
        self.word(SLEEPING_AT)
    }

    /// How many of the owner's callers read its rings themselves now.
    pub fn polling(&self) -> &M::W32 {
        self.word(POLLING_AT)
    }

    /// Whether a sender that just published must wake the owner: nobody of the owner's reads
    /// its rings now and its progress thread is parked. (After a `SeqCst` fence, paired with
    /// the owner's fences before it parks or stops polling.)
    pub fn needs_wake(&self) -> bool {
        self.region.fence(Ordering::SeqCst);
        self.polling().load(Ordering::Relaxed) == 0 && self.sleeping().load(Ordering::Relaxed) != 0
    }

    /// Rings the doorbell (then the caller wakes a thread parked on it with the OS: a futex
    /// wake on [`Segment::doorbell`]).
    pub fn ring(&self) {
        self.doorbell().fetch_add(1, Ordering::SeqCst);
    }

    /// The owner's board lane in this segment: written by the owner only, read by the
    /// members of its boards (every word checked against the region).
    pub fn lane(self: &Arc<Self>) -> SegmentLane<M> {
        SegmentWords {
            seg: self.clone(),
            at: BOARD_AT,
            words: crate::board::LANE_WORDS,
        }
    }

    /// The owner's mailbox in this segment: its rings written by the owner only, read by
    /// the members they are toward (every word checked against the region).
    pub fn mailbox(self: &Arc<Self>) -> SegmentMail<M> {
        SegmentWords {
            seg: self.clone(),
            at: MAIL_AT,
            words: self.layout.mail_bytes() / 8,
        }
    }

    /// Whether a sender said a message may have come into a mailbox toward the owner
    /// (`crate::board::mail::MAIL_FLAG`), clearing it: the owner then reads its mailboxes.
    /// A swap, so that a flag raised after it is kept for the next look.
    ///
    /// A take that lowers the flag is followed by a `SeqCst` fence: a sender that found the
    /// flag up after its own fence ([`raise_mail_flag`](Self::raise_mail_flag)) left it
    /// alone, and the fence pair orders its message before the owner's reads that follow.
    pub fn take_mail_flag(&self) -> bool {
        // A load first: the flag's line is written only when a flag was raised.
        let took = self
            .region
            .u64(MAIL_AT + 8 * crate::board::mail::MAIL_FLAG)
            .is_some_and(|w| w.load(Ordering::Relaxed) != 0 && w.swap(0, Ordering::AcqRel) != 0);
        if took {
            self.region.fence(Ordering::SeqCst);
        }
        took
    }

    /// For a sender in another process whose message is in its ring of the owner's mailbox:
    /// raises the owner's mail flag if it is down, after a `SeqCst` fence and a look. `true`:
    /// this call raised it (or the segment has no flag), and the sender rings the owner's
    /// doorbell as after a frame in a ring. `false`: it was up, and the sender does nothing
    /// more: whoever raised it rang, so the owner will take it, and that take's swap comes
    /// after this look in the flag's order, so its fence follows this one and the owner's
    /// reads after it see the message (one line written per burst of messages instead of
    /// one per message, and no doorbell looked at).
    pub fn raise_mail_flag(&self) -> bool {
        let Some(w) = self.region.u64(MAIL_AT + 8 * crate::board::mail::MAIL_FLAG) else {
            return true;
        };
        self.region.fence(Ordering::SeqCst);
        if w.load(Ordering::Relaxed) != 0 {
            return false;
        }
        // A swap, as the owner lowers it with one (a store racing that swap is where loom
        // 0.7 errs: `docs/testing.md`).
        w.swap(1, Ordering::AcqRel);
        true
    }

    /// Whether the mail flag is raised (without clearing it).
    pub fn mail_flag(&self) -> bool {
        self.region
            .u64(MAIL_AT + 8 * crate::board::mail::MAIL_FLAG)
            .is_some_and(|w| w.load(Ordering::Acquire) != 0)
    }

    /// The sending end of ring `k` (this process's ring in a peer's segment).
    pub fn writer(self: &Arc<Self>, k: u32) -> Option<RingWriter<M>> {
        let base = self.layout.ring_at(k)?;
        let w = RingWriter {
            seg: self.clone(),
            base,
            cap: self.layout.cap,
            tail: 0,
        };
        // A fresh ring: both counters at zero (a reused or scribbled one is refused).
        (w.load(TAIL) == 0 && w.load(HEAD) == 0).then_some(w)
    }

    /// The receiving end of ring `k` (from sender `k`, in this process's segment).
    pub fn reader(self: &Arc<Self>, k: u32) -> Option<RingReader<M>> {
        let base = self.layout.ring_at(k)?;
        Some(RingReader {
            seg: self.clone(),
            base,
            cap: self.layout.cap,
            head: 0,
        })
    }
}

/// The sending end of a ring.
pub struct RingWriter<M: Memory = Region> {
    seg: Arc<Segment<M>>,
    base: usize,
    cap: u64,
    /// Bytes written (this side's own count; the segment's copy is only published).
    tail: u64,
}

impl<M: Memory> RingWriter<M> {
    fn load(&self, at: usize) -> u64 {
        self.seg
            .region
            .u64(self.base + at)
            .map_or(0, |a| a.load(Ordering::Acquire))
    }

    /// The segment the ring is in (its owner's doorbell).
    pub fn segment(&self) -> &Arc<Segment<M>> {
        &self.seg
    }

    /// Bytes the ring can take now.
    pub fn room(&self) -> Result<u64, ShmError> {
        let head = self.load(HEAD);
        let used = self.tail.wrapping_sub(head);
        if used > self.cap {
            return Err(ShmError::Corrupt(format!(
                "the reader's head {head} is not within a ring of {} bytes behind the tail {}",
                self.cap, self.tail
            )));
        }
        Ok(self.cap - used)
    }

    /// Copies as much of `src` as `room` allows into the ring (not yet visible to the
    /// reader: see [`publish`](RingWriter::publish)); takes what it wrote off `room`.
    pub fn put(&mut self, src: &[u8], room: &mut u64) -> usize {
        let n = (src.len() as u64).min(*room) as usize;
        let mut done = 0;
        while done < n {
            let at = self.tail % self.cap;
            let run = ((self.cap - at) as usize).min(n - done);
            let ok = self
                .seg
                .region
                .write(self.base + RING_HEAD + at as usize, &src[done..done + run]);
            debug_assert!(ok, "a ring's data lies inside its segment");
            done += run;
            self.tail += run as u64;
        }
        *room -= n as u64;
        n
    }

    /// Makes what was put visible to the reader.
    pub fn publish(&self) {
        if let Some(t) = self.seg.region.u64(self.base + TAIL) {
            t.store(self.tail, Ordering::Release);
        }
    }

    /// Remote records the reader has read (their memory may be let go); at most `sent`, the
    /// records this side wrote (a larger count is a scribbled ring).
    pub fn acked(&self, sent: u64) -> Result<u64, ShmError> {
        let n = self.load(ACKED);
        if n > sent {
            return Err(ShmError::Corrupt(format!(
                "the reader acknowledges {n} remote records of {sent}"
            )));
        }
        Ok(n)
    }

    /// Whether the reader said it can read this process's memory (remote records of any
    /// payload).
    pub fn remote_ok(&self) -> bool {
        self.reader_can() & CAN_READ_MEMORY != 0
    }

    /// Whether the reader said it maps this process's shared heap (remote records of
    /// payloads that live there).
    pub fn heap_ok(&self) -> bool {
        self.reader_can() & CAN_READ_HEAP != 0
    }

    fn reader_can(&self) -> u32 {
        self.seg
            .region
            .u32(self.base + REMOTE)
            .map_or(0, |a| a.load(Ordering::Relaxed))
    }

    /// Asks the reader to ring this side's doorbell once it frees room; then the caller
    /// checks [`room`](RingWriter::room) again (a `SeqCst` pairing with the reader's).
    pub fn want_room(&self) {
        if let Some(w) = self.seg.region.u32(self.base + WAITING) {
            w.store(1, Ordering::SeqCst);
        }
        // The store above before the caller's next load of the head (the reader stores the
        // head, fences, then loads this flag).
        self.seg.region.fence(Ordering::SeqCst);
    }
}

/// The receiving end of a ring.
pub struct RingReader<M: Memory = Region> {
    seg: Arc<Segment<M>>,
    base: usize,
    cap: u64,
    /// Bytes read (this side's own count).
    head: u64,
}

impl<M: Memory> RingReader<M> {
    /// Bytes published and not read yet.
    pub fn ready(&self) -> Result<u64, ShmError> {
        let tail = self
            .seg
            .region
            .u64(self.base + TAIL)
            .map_or(0, |a| a.load(Ordering::Acquire));
        let n = tail.wrapping_sub(self.head);
        if n > self.cap {
            return Err(ShmError::Corrupt(format!(
                "the writer's tail {tail} is not within a ring of {} bytes ahead of the head {}",
                self.cap, self.head
            )));
        }
        Ok(n)
    }

    /// Copies up to `ready` bytes into `dst`; takes what it read off `ready`.
    pub fn take(&mut self, dst: &mut [u8], ready: &mut u64) -> usize {
        let n = (dst.len() as u64).min(*ready) as usize;
        let mut done = 0;
        while done < n {
            let at = self.head % self.cap;
            let run = ((self.cap - at) as usize).min(n - done);
            let ok = self.seg.region.read(
                self.base + RING_HEAD + at as usize,
                &mut dst[done..done + run],
            );
            debug_assert!(ok, "a ring's data lies inside its segment");
            done += run;
            self.head += run as u64;
        }
        *ready -= n as u64;
        n
    }

    /// Tells the writer that `n` remote records were read in all (their memory may go).
    pub fn ack(&self, n: u64) {
        if let Some(a) = self.seg.region.u64(self.base + ACKED) {
            a.store(n, Ordering::Release);
        }
    }

    /// Tells the writer that this side can read its memory (it may send remote records).
    pub fn allow_remote(&self) {
        self.allow(CAN_READ_MEMORY);
    }

    /// Tells the writer that this side maps its shared heap (it may send remote records of
    /// payloads that live there).
    pub fn allow_heap(&self) {
        self.allow(CAN_READ_HEAP);
    }

    fn allow(&self, what: u32) {
        if let Some(a) = self.seg.region.u32(self.base + REMOTE) {
            // This side is the word's one writer (at setup, before any record).
            a.store(a.load(Ordering::Acquire) | what, Ordering::Release);
        }
    }

    /// Returns what was read to the writer; whether the writer waits for room and should be
    /// woken now (then ring its doorbell): once at most half the ring holds unread bytes.
    /// A writer woken for every slice freed would fill it and sleep again at once, a wake-up
    /// per slice; its own looks at the head still see every byte freed. Nothing is lost by
    /// waiting: the reader reads on while bytes are published (the caller that stops reading
    /// leaves them to the progress thread), so the ring drains below half.
    pub fn release(&self) -> bool {
        let region = &self.seg.region;
        if let Some(h) = region.u64(self.base + HEAD) {
            h.store(self.head, Ordering::SeqCst);
        }
        region.fence(Ordering::SeqCst);
        let Some(w) = region.u32(self.base + WAITING) else {
            return false;
        };
        if w.load(Ordering::SeqCst) == 0 {
            return false;
        }
        let tail = region
            .u64(self.base + TAIL)
            .map_or(0, |t| t.load(Ordering::Acquire));
        // A scribbled tail (more than a ring ahead) wakes the writer: its own look fails.
        let unread = tail.wrapping_sub(self.head);
        if unread > self.cap / 2 && unread <= self.cap {
            return false;
        }
        w.swap(0, Ordering::SeqCst) != 0
    }
}

/// Words of a segment from byte `at`, `words` of them, read with acquire and written with
/// release ordering ([`crate::board::Lane`]); a word out of them, or out of the region, fails.
pub struct SegmentWords<M: Memory = Region> {
    seg: Arc<Segment<M>>,
    at: usize,
    words: usize,
}

impl<M: Memory> crate::board::Lane for SegmentWords<M> {
    fn load(&self, i: usize) -> Option<u64> {
        if i >= self.words {
            return None;
        }
        let w = self.seg.region.u64(self.at + 8 * i)?;
        Some(w.load(Ordering::Acquire))
    }

    fn store(&self, i: usize, v: u64) -> bool {
        if i >= self.words {
            return false;
        }
        self.seg
            .region
            .u64(self.at + 8 * i)
            .map(|w| w.store(v, Ordering::Release))
            .is_some()
    }
}

/// A process's board lane in its segment ([`Segment::lane`]).
pub type SegmentLane<M = Region> = SegmentWords<M>;
/// A process's mailbox in its segment ([`Segment::mailbox`]): a board group's mailbox
/// (`crate::board::mail`) for a group of up to `MAIL_MEMBERS`.
pub type SegmentMail<M = Region> = SegmentWords<M>;

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(cap: u64) -> (RingWriter, RingReader) {
        let layout = Layout::new(2, cap).unwrap_or(Layout {
            rings: 2,
            cap: 4096,
        });
        let region = Arc::new(Region::heap(layout.bytes().unwrap_or(0)));
        let seg = Arc::new(
            Segment::create(region.clone(), layout, 7)
                .ok()
                .unwrap_or_else(|| unreachable!()),
        );
        let peer = Arc::new(
            Segment::open(region, 2)
                .ok()
                .unwrap_or_else(|| unreachable!()),
        );
        let w = peer.writer(1).unwrap_or_else(|| unreachable!());
        let r = seg.reader(1).unwrap_or_else(|| unreachable!());
        (w, r)
    }

    #[test]
    fn bytes_come_out_in_order_across_the_wrap() {
        let (mut w, mut r) = pair(4096);
        let mut next = 0u8;
        let mut expect = 0u8;
        // Fewer under Miri, whose interpreter is slow: the ring still wraps (4 KiB, chunks
        // of up to 3 000 bytes) several times.
        let rounds = if cfg!(miri) { 15usize } else { 50 };
        for round in 0..rounds {
            let chunk: Vec<u8> = (0..(round * 97) % 3000 + 1)
                .map(|_| {
                    next = next.wrapping_add(1);
                    next
                })
                .collect();
            let mut room = w.room().unwrap_or(0);
            assert_eq!(w.put(&chunk, &mut room), chunk.len());
            w.publish();
            let mut ready = r.ready().unwrap_or(0);
            assert_eq!(ready, chunk.len() as u64);
            let mut got = vec![0u8; chunk.len()];
            assert_eq!(r.take(&mut got, &mut ready), chunk.len());
            assert!(!r.release());
            for b in got {
                expect = expect.wrapping_add(1);
                assert_eq!(b, expect);
            }
        }
    }

    #[test]
    fn a_full_ring_takes_nothing_until_the_reader_frees_room_and_says_so() {
        let (mut w, mut r) = pair(4096);
        let mut room = w.room().unwrap_or(0);
        assert_eq!(w.put(&[1u8; 5000], &mut room), 4096);
        w.publish();
        assert_eq!(w.room().ok(), Some(0));
        w.want_room();
        let mut ready = r.ready().unwrap_or(0);
        let mut got = vec![0u8; 100];
        r.take(&mut got, &mut ready);
        assert!(
            !r.release(),
            "more than half the ring still unread: not yet told"
        );
        assert_eq!(
            w.room().ok(),
            Some(100),
            "though its own look sees the room"
        );
        let mut half = vec![0u8; 1948];
        r.take(&mut half, &mut ready);
        assert!(
            r.release(),
            "the writer asked for room, and half the ring is free"
        );
        assert!(!r.release(), "and is told once");
        assert_eq!(w.room().ok(), Some(2048));
    }

    #[test]
    fn counters_a_peer_scribbled_are_errors_not_reads() {
        let (w, r) = pair(4096);
        // A tail far ahead of the head: more than the ring holds.
        if let Some(t) = r.seg.region.u64(r.base + TAIL) {
            t.store(1 << 40, Ordering::Release);
        }
        assert!(matches!(r.ready(), Err(ShmError::Corrupt(_))));
        // A head ahead of the writer's tail.
        if let Some(h) = w.seg.region.u64(w.base + HEAD) {
            h.store(5, Ordering::Release);
        }
        assert!(matches!(w.room(), Err(ShmError::Corrupt(_))));
    }

    #[test]
    fn a_segment_is_opened_only_with_the_agreed_header() {
        let layout = Layout::new(3, 4096).unwrap_or(Layout {
            rings: 3,
            cap: 4096,
        });
        let bytes = layout.bytes().unwrap_or(0);
        let region = Arc::new(Region::heap(bytes));
        assert!(
            matches!(Segment::open(region.clone(), 3), Err(ShmError::Corrupt(_))),
            "no magic yet"
        );
        let _own = Segment::create(region.clone(), layout, 1);
        assert!(Segment::open(region.clone(), 3).is_ok());
        assert!(
            Segment::open(region.clone(), 2).is_err(),
            "another ring count"
        );
        // A capacity that would put the rings past the region's end.
        region.write(CAP_AT, &(1u64 << 20).to_le_bytes());
        assert!(matches!(
            Segment::open(region.clone(), 3),
            Err(ShmError::Corrupt(_))
        ));
        region.write(CAP_AT, &4097u64.to_le_bytes());
        assert!(matches!(Segment::open(region, 3), Err(ShmError::Layout(_))));
        assert!(Layout::new(MAX_RINGS + 1, 4096).is_err());
        assert!(Layout::new(1, 100).is_err());
    }

    #[test]
    fn a_writer_and_a_reader_on_two_threads_agree_on_every_byte() {
        let (mut w, mut r) = pair(4096);
        let total: usize = if cfg!(miri) { 20_000 } else { 2_000_000 };
        let t = std::thread::spawn(move || {
            let mut sent = 0usize;
            let mut buf = [0u8; 777];
            while sent < total {
                for (i, b) in buf.iter_mut().enumerate() {
                    *b = ((sent + i) % 251) as u8;
                }
                let n = buf.len().min(total - sent);
                let mut room = w.room().unwrap_or(0);
                let k = w.put(&buf[..n], &mut room);
                w.publish();
                sent += k;
                if k == 0 {
                    std::thread::yield_now();
                }
            }
        });
        let mut got = 0usize;
        let mut buf = [0u8; 1000];
        while got < total {
            let mut ready = r.ready().unwrap_or(0);
            let n = r.take(&mut buf, &mut ready);
            r.release();
            for (i, b) in buf[..n].iter().enumerate() {
                assert_eq!(*b, ((got + i) % 251) as u8);
            }
            got += n;
            if n == 0 {
                std::thread::yield_now();
            }
        }
        assert!(t.join().is_ok());
    }
}
