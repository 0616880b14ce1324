//! Records over a ring: each is one message, a kind byte then the codec's frame
//! ([`crate::wire::codec`]):
//! - **inline** (kind 0): the frame as a socket carries it, payload and all: the sender copies
//!   the payload into the ring and the receiver copies it out;
//! - **remote** (kind 1): the frame's head, then each payload part's address in the sender's
//!   memory (u64 each). The receiver reads each part straight from the sender's memory into
//!   a buffer of its own ([`RemoteRead`]: one copy in all, the kernel's, with
//!   `process_vm_readv`), then acknowledges the record (the ring's `acked`); the sender keeps
//!   the message's payload alive until then. Sent for payloads of [`REMOTE_MIN`] bytes or
//!   more, once the receiver said it can read the sender's memory.
//!
//! Both ends are sans-IO and never wait: the writer puts what fits and keeps the rest of a
//! record for the next [`pump`](FrameWriter::pump); the reader takes what was published and
//! keeps its place between calls. Each moves at most a [`SLICE`] before telling the other
//! (the writer publishes, the reader frees the room), so that both copy a large payload at
//! once. The reader decodes with the codec's checks (every length against [`Limits`] before
//! anything is allocated), and puts each payload part straight into its place in the output
//! of the call that expects it ([`crate::landing`]), else in an 8-aligned buffer from a
//! [`Pool`]. A remote record of a call the receiving rank has not made yet, with nothing
//! behind it in the ring, is kept unread for at most [`HOLD`], so that it lands once the call
//! is made (its payload waits in the sender's memory either way).

use super::ring::{RingReader, RingWriter};
use super::shared_read::{SharedRead, SharedRemote, SPLIT_MIN};
use super::ShmError;
use crate::landing::Landings;
use crate::op::OpKind;
use crate::tensor::arena::{Arena, ArenaPart};
use crate::tensor::bytes_from_vec;
use crate::tensor::pool::{Pool, PoolBuf};
use crate::tensor::shared_heap::SharedHeap;
use crate::time::Time;
use crate::wire::codec::{self, Limits, MAX_HEADER_BYTES, PREFIX_BYTES};
use crate::wire::{Header, Message};
use bytes::{Bytes, BytesMut};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

/// Parts up to this size are read into a pooled buffer taken whole; larger ones into a buffer
/// that grows by this much as their bytes arrive (a length a peer announces is never
/// allocated ahead of its data, beyond one step).
pub const BIG_PART: usize = 64 << 20;

/// Payloads of at least this many bytes go as remote records (where the receiver can read
/// the sender's memory): below it, two copies through the ring cost less than the system
/// call and the acknowledgement. 16 KiB under Miri, whose interpreter copies byte by byte:
/// its tests take the same paths with a quarter of the bytes (as `shared_read::PIECE`).
pub const REMOTE_MIN: usize = if cfg!(miri) { 16 << 10 } else { 64 << 10 };

/// all_to_all's blocks of at least this many bytes go as remote records by default
/// ([`SingleCopy::Auto`]): every process sends and receives at once in an all_to_all, so
/// one copy of each byte instead of two is the gain, even read by one thread (against the
/// ring, alternating: 2 MiB blocks of 2 and 3 processes and 2-4 MiB blocks of 4 processes on
/// two cores 25-40 % faster; 1 MiB blocks of 2 processes slower, of 4 processes faster:
/// `docs/performance.md`).
pub const EXCHANGE_MIN: usize = 2 << 20;

/// The most bytes either end moves through a ring before it tells the other (the writer
/// publishes them, the reader frees their room): sender and receiver then copy a large
/// payload at once, a slice apart, instead of taking turns over the whole ring.
pub const SLICE: u64 = 128 << 10;

/// The longest a remote record of a call not made here yet is kept unread, waiting for the
/// call's landing (while nothing comes behind it in the ring). A peer ahead by more than
/// this has its payload read into a buffer of its own, as a message that lands nowhere.
pub const HOLD: Duration = Duration::from_millis(1);

/// An inline record.
const INLINE: u8 = 0;
/// A remote record.
const REMOTE: u8 = 1;

/// Reads another process's memory (the receiving process's side of remote records).
pub trait RemoteRead {
    /// Fills `dst` with the sender's bytes at `addr`; why not, if it cannot.
    fn read(&self, addr: u64, dst: &mut [u8]) -> Result<(), String>;
}

/// A record in progress: its message (for an inline record's payload; a remote record's is
/// lent, see [`FrameWriter`]) and how many of its bytes went.
struct Pending {
    msg: Option<Message>,
    written: usize,
}

/// The sending side: a ring, the record it is in the middle of, and the messages whose
/// memory the receiver may still be reading.
pub struct FrameWriter {
    ring: RingWriter,
    /// The kind byte, the frame's head, and a remote record's addresses (reused: no
    /// allocation per record).
    head: BytesMut,
    pending: Option<Pending>,
    /// Remote records written, and their messages not yet acknowledged (by number).
    remote_sent: u64,
    lent: VecDeque<(u64, Message)>,
    /// This process's shared heap, if it has one: a payload that lives there goes as a
    /// remote record to a reader that maps the heap.
    heap: Option<Arc<SharedHeap>>,
    /// Which payloads go as remote records to a reader that can read this process's memory.
    single_copy: SingleCopy,
}

/// Which large payloads a writer sends as remote records, for a reader that can read the
/// sender's memory (`process_vm_readv`): the receiver's single copy, read by every thread of
/// its process ([`crate::wire::shm::shared_read`]), in place of the ring's two copies (the
/// sender's in, the receiver's out, at once). A payload in the sender's shared heap goes as
/// a remote record whatever this says.
///
/// Measured on a 2-core VM with buffers on huge pages (`docs/performance.md`, "Huge pages
/// and one copy for rooted calls"): the single copy wins where data flows one way between two
/// processes (a broadcast, reduce, gather or scatter: the sender has nothing else to copy,
/// the receiver's threads take both cores), for large point-to-point messages (one tensor
/// each, read once) and for all_to_all's blocks (each read once, straight into the output,
/// its call's landing waited for: [`HOLD`]), and loses in the collectives' exchanges that
/// forward or reduce what they receive (all_reduce, all_gather, reduce_scatter), whose steps
/// keep both processes copying through the ring anyway, and below 8 MiB, where one thread
/// reads alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SingleCopy {
    /// None: every payload through the ring.
    Off,
    /// all_to_all's blocks of [`EXCHANGE_MIN`] bytes or more (2 MiB), and the payloads of
    /// [`SPLIT_MIN`] bytes or more (8 MiB: read by every thread of the receiver) of rooted
    /// collectives' steps (a call fingerprint with a root: broadcast, reduce, gather,
    /// scatter), of all_gather's and of point-to-point messages; the default.
    Auto,
    /// Every payload of [`REMOTE_MIN`] bytes or more.
    All,
}

impl SingleCopy {
    /// Whether a payload of `bytes` (at least [`REMOTE_MIN`]) with `header` goes as a
    /// remote record.
    pub fn wants(self, header: &Header, bytes: usize) -> bool {
        match self {
            SingleCopy::Off => false,
            SingleCopy::All => true,
            SingleCopy::Auto => match header {
                Header::Data { call, .. }
                    if matches!(call.kind, OpKind::AllToAll | OpKind::AllToAllSingle) =>
                {
                    bytes >= EXCHANGE_MIN
                }
                Header::Data { call, .. } => {
                    bytes >= SPLIT_MIN
                        && (call.root.is_some()
                            || matches!(call.kind, OpKind::AllGather | OpKind::AllGatherIntoTensor))
                }
                Header::P2p { .. } => bytes >= SPLIT_MIN,
                _ => false,
            },
        }
    }
}

/// What [`FrameWriter::send`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum Sent {
    /// The whole record is in the ring.
    Whole,
    /// Part of it; the rest goes with [`FrameWriter::pump`] once the reader frees room.
    Partly,
}

impl FrameWriter {
    /// A writer on `ring`.
    pub fn new(ring: RingWriter) -> FrameWriter {
        FrameWriter {
            ring,
            head: BytesMut::with_capacity(256),
            pending: None,
            remote_sent: 0,
            lent: VecDeque::new(),
            heap: None,
            single_copy: SingleCopy::All,
        }
    }

    /// The writer with `policy` for which payloads go as remote records (the default,
    /// [`SingleCopy::All`], sends every large one so to a reader that can read this
    /// process).
    pub fn with_single_copy(mut self, policy: SingleCopy) -> FrameWriter {
        self.single_copy = policy;
        self
    }

    /// The writer of a process whose shared heap is `heap`.
    pub fn with_heap(mut self, heap: Arc<SharedHeap>) -> FrameWriter {
        self.heap = Some(heap);
        self
    }

    /// Whether every part of `msg` lies in this process's shared heap, which the reader
    /// maps (empty parts aside).
    fn in_heap(&self, msg: &Message) -> bool {
        let Some(h) = &self.heap else { return false };
        self.ring.heap_ok() && msg.payload.iter().all(|p| p.is_empty() || h.holds(p))
    }

    /// The ring (its segment's doorbell).
    pub fn ring(&self) -> &RingWriter {
        &self.ring
    }

    /// Whether a record is in progress.
    pub fn is_pending(&self) -> bool {
        self.pending.is_some()
    }

    /// Messages lent to the receiver (remote records not yet acknowledged).
    pub fn lent(&self) -> usize {
        self.lent.len()
    }

    /// Drops the record in progress and every lent message: the ring is given up (corrupt,
    /// or its reader replaced) and nothing reads from it any more.
    pub fn abandon(&mut self) {
        self.pending = None;
        self.lent.clear();
    }

    /// Lets go of the messages whose remote records the receiver has read.
    pub fn release(&mut self) -> Result<(), ShmError> {
        if self.lent.is_empty() {
            return Ok(());
        }
        let acked = self.ring.acked(self.remote_sent)?;
        while self.lent.front().is_some_and(|(n, _)| *n <= acked) {
            self.lent.pop_front();
        }
        Ok(())
    }

    /// Starts `msg`'s record and writes what fits; `Err((msg, None))` back if a record is
    /// still in progress, `Err((msg, Some(e)))` if the ring is corrupt.
    #[allow(clippy::result_large_err)]
    pub fn send(&mut self, msg: Message) -> Result<Sent, (Message, Option<ShmError>)> {
        if self.pending.is_some() {
            return Err((msg, None));
        }
        if let Err(e) = self.release() {
            return Err((msg, Some(e)));
        }
        let bytes: usize = msg.payload.iter().map(|p| p.len()).sum();
        let remote = bytes >= REMOTE_MIN
            && ((self.ring.remote_ok() && self.single_copy.wants(&msg.header, bytes))
                || self.in_heap(&msg));
        self.head.clear();
        self.head
            .extend_from_slice(&[if remote { REMOTE } else { INLINE }]);
        codec::encode_head(&msg, &mut self.head);
        let pending = if remote {
            for p in &msg.payload {
                self.head
                    .extend_from_slice(&(p.as_ptr() as usize as u64).to_le_bytes());
            }
            self.remote_sent += 1;
            self.lent.push_back((self.remote_sent, msg));
            Pending {
                msg: None,
                written: 0,
            }
        } else {
            Pending {
                msg: Some(msg),
                written: 0,
            }
        };
        self.pending = Some(pending);
        match self.pump() {
            Ok(true) => Ok(Sent::Whole),
            Ok(false) => Ok(Sent::Partly),
            Err(e) => {
                let msg = match self.pending.take().and_then(|p| p.msg) {
                    Some(m) => m,
                    // A remote record's message is the last lent.
                    None => match self.lent.pop_back() {
                        Some((_, m)) => m,
                        None => unreachable!("a remote record lends its message"),
                    },
                };
                Err((msg, Some(e)))
            }
        }
    }

    /// Writes more of the record in progress; whether it is done (or none was in progress).
    /// When the ring has no room it asks the reader to say when it has (then looks once
    /// more: room freed before the request was seen is not waited for). On an error the
    /// record stays in progress.
    pub fn pump(&mut self) -> Result<bool, ShmError> {
        loop {
            let free = self.ring.room()?;
            let mut room = free.min(SLICE);
            let Some(mut p) = self.pending.take() else {
                return Ok(true);
            };
            let mut skip = p.written;
            let mut full = false;
            let payload = p.msg.iter().flat_map(|m| m.payload.iter().map(|b| &b[..]));
            for piece in std::iter::once(&self.head[..]).chain(payload) {
                if skip >= piece.len() {
                    skip -= piece.len();
                    continue;
                }
                let rest = &piece[skip..];
                skip = 0;
                let n = self.ring.put(rest, &mut room);
                p.written += n;
                if n < rest.len() {
                    full = true;
                    break;
                }
            }
            self.ring.publish();
            if !full {
                return Ok(true);
            }
            self.pending = Some(p);
            if free > SLICE {
                // A slice went: publish it, then the next.
                continue;
            }
            self.ring.want_room();
            if self.ring.room()? == 0 {
                return Ok(false);
            }
        }
    }

    /// Whether the ring has room now (for a record in progress).
    pub fn has_room(&self) -> bool {
        self.ring.room().map_or(true, |r| r > 0)
    }
}

/// A payload part being read.
enum Part {
    /// Into a pooled buffer of the part's size.
    Pooled(PoolBuf, usize),
    /// A part above [`BIG_PART`]: into words that grow as its bytes arrive.
    Big(Vec<u64>, usize, usize),
    /// Into its place in the output of the call that expects it ([`crate::landing`]).
    Landed(ArenaPart, usize),
}

/// The receiving side's place in a record.
enum Place {
    /// Before a record: its kind byte.
    Kind,
    /// Reading a frame's head into `head` (`remote`: a remote record's).
    Head { remote: bool },
    /// Reading a remote record's addresses into `head` (`want` bytes).
    Addrs {
        header: Header,
        lens: Vec<usize>,
        want: usize,
    },
    /// A remote record whose addresses are in `head`, kept unread until its call is made
    /// here (and it lands), something comes behind it, or `until`.
    Held {
        header: Header,
        lens: Vec<usize>,
        until: Time,
    },
    /// Reading the payload of an inline record whose head was decoded.
    Parts {
        header: Header,
        lens: Vec<usize>,
        /// The places of the parts, if the message lands (last part first, as `lens`).
        landed: Vec<ArenaPart>,
        done: Vec<Bytes>,
        part: Option<Part>,
    },
}

/// The receiving side of a ring (see the module doc).
pub struct FrameReader {
    limits: Limits,
    head: BytesMut,
    place: Place,
    /// Remote records read (acknowledged through the ring).
    remote_read: u64,
}

/// What the reader needs besides the ring: buffers, the sender's memory for remote records
/// (`None`: a remote record is an error), and where expected payloads land.
pub struct Sources<'a> {
    /// Where payload buffers come from.
    pub pool: &'a Pool,
    /// The sender's memory.
    pub remote: Option<&'a dyn RemoteRead>,
    /// The sender's global rank and the receiving rank's landings: a message its calls
    /// expect is read straight into its place (see [`crate::landing`]).
    pub landings: Option<(usize, &'a Landings)>,
    /// The sender's memory as the process's other threads may read it too, and how to post
    /// a large read for them ([`crate::wire::shm::shared_read`]); `None`: this thread reads
    /// every remote part alone.
    pub share: Option<Share<'a>>,
    /// The time now (how long a remote record has waited for its call: [`HOLD`]).
    pub now: Time,
}

/// A large remote part's read, offered to the receiving process's other threads.
pub struct Share<'a> {
    /// The sender's memory (the same as [`Sources::remote`]).
    pub remote: SharedRemote,
    /// Puts a read where the other threads look (and wakes one that rests).
    pub post: &'a dyn Fn(&Arc<SharedRead>),
}

impl Sources<'_> {
    /// Where the parts of a message with `header` and parts of `lens` go, if it lands.
    fn place(&self, header: &Header, lens: &[usize]) -> Option<Vec<ArenaPart>> {
        let (src, landings) = self.landings?;
        landings.place(src, header, lens)
    }

    /// Whether a message with `header` belongs to a call the rank has not made yet.
    fn awaits(&self, header: &Header) -> bool {
        self.landings.is_some_and(|(_, l)| l.awaits(header))
    }
}

impl FrameReader {
    /// A reader that accepts frames within `limits`.
    pub fn new(limits: Limits) -> FrameReader {
        FrameReader {
            limits,
            head: BytesMut::with_capacity(256),
            place: Place::Kind,
            remote_read: 0,
        }
    }

    /// Until when a remote record is kept unread, if one is (see [`HOLD`]): whoever reads
    /// the ring should look again by then.
    pub fn holding(&self) -> Option<Time> {
        match &self.place {
            Place::Held { until, .. } => Some(*until),
            _ => None,
        }
    }

    /// The next whole message from `ring`, or `None` when the ring has no more of one now.
    /// The bytes read are returned to the writer before this returns
    /// ([`RingReader::release`]); `wake` is told whether the writer waits for room. An
    /// error means the ring does not carry a valid stream: the peer is lost.
    pub fn next(
        &mut self,
        ring: &mut RingReader,
        src: &Sources<'_>,
        wake: &mut bool,
    ) -> Result<Option<(Header, Vec<Bytes>)>, ShmError> {
        let published = ring.ready()?;
        if let Place::Held { header, until, .. } = &self.place {
            // Read now if it lands, if its call was made without a landing for it, if
            // something waits behind it, or once it has waited long enough.
            let mut landed = src.place(header, self.held_lens());
            if landed.is_none() && published == 0 && src.now < *until {
                if src.awaits(header) {
                    return Ok(None);
                }
                // Made since the look for its landing: look again.
                landed = src.place(header, self.held_lens());
            }
            let Place::Held { header, lens, .. } = std::mem::replace(&mut self.place, Place::Kind)
            else {
                unreachable!("matched above")
            };
            return self.read_record(header, lens, landed, ring, src).map(Some);
        }
        if published == 0 {
            // Nothing published: the head's line is left alone (a caller spinning here must
            // not write the line the writer reads for room on every turn).
            return Ok(None);
        }
        // A slice at a time, its room freed at once (see `SLICE`); the caller comes back for
        // the next (between them it may pump its own sends: both directions move at once).
        let mut ready = published.min(SLICE);
        let before = ready;
        let r = self.step(ring, src, &mut ready);
        if ready != before && ring.release() {
            *wake = true;
        }
        r
    }

    fn step(
        &mut self,
        ring: &mut RingReader,
        src: &Sources<'_>,
        ready: &mut u64,
    ) -> Result<Option<(Header, Vec<Bytes>)>, ShmError> {
        loop {
            match &mut self.place {
                Place::Kind => {
                    let mut k = [0u8; 1];
                    if ring.take(&mut k, ready) == 0 {
                        return Ok(None);
                    }
                    let remote = match k[0] {
                        INLINE => false,
                        REMOTE if src.remote.is_some() => true,
                        REMOTE => {
                            return Err(ShmError::Corrupt(
                                "a remote record where none may come".into(),
                            ))
                        }
                        other => {
                            return Err(ShmError::Corrupt(format!("a record of kind {other}")))
                        }
                    };
                    self.head.clear();
                    self.place = Place::Head { remote };
                }
                Place::Head { remote } => {
                    let remote = *remote;
                    if self.head.len() < PREFIX_BYTES
                        && !take_into(&mut self.head, PREFIX_BYTES, ring, ready)
                    {
                        return Ok(None);
                    }
                    match codec::decode_head(&mut self.head, &self.limits)? {
                        Some(h) if remote => {
                            self.head.clear();
                            self.place = Place::Addrs {
                                header: h.header,
                                want: 8 * h.parts.len(),
                                lens: h.parts,
                            };
                        }
                        Some(h) => {
                            let mut landed = src.place(&h.header, &h.parts).unwrap_or_default();
                            landed.reverse();
                            let mut lens = h.parts;
                            lens.reverse();
                            self.place = Place::Parts {
                                header: h.header,
                                done: Vec::with_capacity(lens.len()),
                                lens,
                                landed,
                                part: None,
                            };
                        }
                        None if self.head.len() < PREFIX_BYTES => {} // a heartbeat went
                        None => {
                            let need = head_len(&self.head, &self.limits);
                            if !take_into(&mut self.head, need, ring, ready) {
                                return Ok(None);
                            }
                        }
                    }
                }
                Place::Addrs { want, .. } => {
                    let want = *want;
                    if !take_into(&mut self.head, want, ring, ready) {
                        return Ok(None);
                    }
                    let Place::Addrs { header, lens, .. } =
                        std::mem::replace(&mut self.place, Place::Kind)
                    else {
                        unreachable!("matched above")
                    };
                    let mut landed = src.place(&header, &lens);
                    if landed.is_none() && *ready == 0 && ring.ready()? == 0 {
                        if src.awaits(&header) {
                            // Its call is not made here yet: keep it unread for it (see
                            // `HOLD`).
                            self.place = Place::Held {
                                header,
                                lens,
                                until: src.now + HOLD,
                            };
                            return Ok(None);
                        }
                        // Made since the look for its landing (its landings registered
                        // before the mark): look again.
                        landed = src.place(&header, &lens);
                    }
                    return self.read_record(header, lens, landed, ring, src).map(Some);
                }
                Place::Held { .. } => return Ok(None),
                Place::Parts {
                    lens,
                    landed,
                    done,
                    part,
                    ..
                } => {
                    if part.is_none() {
                        let Some(len) = lens.pop() else {
                            let Place::Parts { header, done, .. } =
                                std::mem::replace(&mut self.place, Place::Kind)
                            else {
                                unreachable!("matched above")
                            };
                            return Ok(Some((header, done)));
                        };
                        *part = Some(if let Some(p) = landed.pop() {
                            Part::Landed(p, 0)
                        } else if len > BIG_PART {
                            Part::Big(Vec::new(), 0, len)
                        } else {
                            Part::Pooled(src.pool.take(len), 0)
                        });
                    }
                    let finished = match part {
                        Some(Part::Pooled(buf, at)) => {
                            let dst = buf.bytes_mut();
                            *at += ring.take(&mut dst[*at..], ready);
                            *at == dst.len()
                        }
                        Some(Part::Landed(p, at)) => {
                            let dst = p.bytes_mut();
                            *at += ring.take(&mut dst[*at..], ready);
                            *at == dst.len()
                        }
                        Some(Part::Big(words, at, len)) => {
                            while *at < *len && *ready > 0 {
                                let upto = (*at + BIG_PART).min(*len);
                                if words.len() * 8 < upto {
                                    words.resize(upto.div_ceil(8), 0);
                                }
                                let dst: &mut [u8] = bytemuck::cast_slice_mut(words.as_mut_slice());
                                *at += ring.take(&mut dst[*at..upto], ready);
                            }
                            *at == *len
                        }
                        None => false,
                    };
                    if !finished {
                        return Ok(None);
                    }
                    match part.take() {
                        Some(Part::Pooled(buf, _)) => done.push(buf.freeze()),
                        Some(Part::Landed(p, _)) => done.push(p.freeze()),
                        Some(Part::Big(words, _, len)) => {
                            let mut b = bytes_from_vec(words);
                            b.truncate(len);
                            done.push(b);
                        }
                        None => {}
                    }
                }
            }
        }
    }
}

impl FrameReader {
    /// The part lengths of the record kept unread.
    fn held_lens(&self) -> &[usize] {
        match &self.place {
            Place::Held { lens, .. } => lens,
            _ => &[],
        }
    }

    /// Reads the parts of a remote record whose addresses are in `head` (into `landed`, the
    /// places of its parts, if it lands) and acknowledges it.
    fn read_record(
        &mut self,
        header: Header,
        lens: Vec<usize>,
        landed: Option<Vec<ArenaPart>>,
        ring: &mut RingReader,
        src: &Sources<'_>,
    ) -> Result<(Header, Vec<Bytes>), ShmError> {
        let remote = src
            .remote
            .ok_or_else(|| ShmError::Corrupt("a remote record where none may come".into()))?;
        let mut landed = landed.map(Vec::into_iter);
        let mut payload = Vec::with_capacity(lens.len());
        for (i, &len) in lens.iter().enumerate() {
            let addr = self
                .head
                .get(8 * i..8 * i + 8)
                .and_then(|b| b.try_into().ok())
                .map_or(0, u64::from_le_bytes);
            let into = landed.as_mut().and_then(Iterator::next);
            payload.push(read_remote(remote, addr, len, src, into)?);
        }
        self.remote_read += 1;
        ring.ack(self.remote_read);
        Ok((header, payload))
    }
}

/// A remote part of `len` bytes at the sender's `addr`, read into its place `into` if it
/// lands, else into a buffer of this process (taken whole up to [`BIG_PART`], else grown
/// step by step as it is read).
fn read_remote(
    remote: &dyn RemoteRead,
    addr: u64,
    len: usize,
    src: &Sources<'_>,
    into: Option<ArenaPart>,
) -> Result<Bytes, ShmError> {
    let bad = |why: String| ShmError::Corrupt(format!("a remote part of {len} bytes: {why}"));
    if let Some(share) = src
        .share
        .as_ref()
        .filter(|_| (SPLIT_MIN..=BIG_PART).contains(&len))
    {
        let part = match into {
            Some(p) => Some(p),
            None => Arena::new(src.pool, len).claim(0..len),
        };
        return read_shared(share, addr, part).map_err(bad);
    }
    let pool = src.pool;
    if let Some(mut p) = into {
        remote.read(addr, p.bytes_mut()).map_err(bad)?;
        return Ok(p.freeze());
    }
    if len == 0 {
        return Ok(Bytes::new());
    }
    if len <= BIG_PART {
        let mut buf = pool.take(len);
        remote.read(addr, buf.bytes_mut()).map_err(bad)?;
        return Ok(buf.freeze());
    }
    let mut words: Vec<u64> = Vec::new();
    let mut at = 0usize;
    while at < len {
        let upto = (at + BIG_PART).min(len);
        words.resize(upto.div_ceil(8), 0);
        let dst: &mut [u8] = bytemuck::cast_slice_mut(words.as_mut_slice());
        let from = addr
            .checked_add(at as u64)
            .ok_or_else(|| bad("an address past the end of memory".into()))?;
        remote.read(from, &mut dst[at..upto]).map_err(bad)?;
        at = upto;
    }
    let mut b = bytes_from_vec(words);
    b.truncate(len);
    Ok(b)
}

/// Reads `part` (the place of a remote part at the sender's `addr`) with every thread that
/// helps, this one included; returns once every piece is written.
fn read_shared(share: &Share<'_>, addr: u64, part: Option<ArenaPart>) -> Result<Bytes, String> {
    let part = part.ok_or("no place for it")?;
    let (arena, range) = (part.arena().clone(), part.range());
    let job = SharedRead::new(share.remote.clone(), addr, part)
        .map(Arc::new)
        .ok_or("an address past the end of memory")?;
    (share.post)(&job);
    while job.help() {}
    // The other threads' last pieces: at most one each, a piece's copy.
    let mut spins = 0u32;
    while !job.finished() {
        spins += 1;
        if spins < 1_000 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
    if let Some(why) = job.failure() {
        return Err(why);
    }
    arena
        .frozen(range)
        .ok_or_else(|| "its pieces were not all written".to_string())
}

/// Copies from the ring until `buf` holds `want` bytes; whether it does.
fn take_into(buf: &mut BytesMut, want: usize, ring: &mut RingReader, ready: &mut u64) -> bool {
    if buf.len() >= want {
        return true;
    }
    let have = buf.len();
    buf.resize(want, 0);
    let n = ring.take(&mut buf[have..], ready);
    buf.truncate(have + n);
    buf.len() == want
}

/// A head's length from its prefix (which `decode_head` has checked: the header and the part
/// count are within `limits`, so this is more than the prefix and the head is whole once
/// this many bytes are in).
fn head_len(prefix: &[u8], limits: &Limits) -> usize {
    let word = |at: usize| {
        prefix
            .get(at..at + 4)
            .and_then(|b| b.try_into().ok())
            .map_or(0, u32::from_le_bytes) as usize
    };
    let header = word(4).min(MAX_HEADER_BYTES as usize);
    let parts = word(8).min(limits.max_parts as usize);
    PREFIX_BYTES
        .saturating_add(parts.saturating_mul(8))
        .saturating_add(header)
}

#[cfg(test)]
mod tests {
    use super::super::region::Region;
    use super::super::ring::{Layout, Segment};
    use super::*;
    use crate::ids::GroupId;
    use std::sync::Arc;

    fn ends(cap: u64) -> (FrameWriter, RingReader, Arc<Region>) {
        let layout = Layout { rings: 1, cap };
        let region = Arc::new(Region::heap(layout.bytes().unwrap_or(0)));
        let own = Arc::new(
            Segment::create(region.clone(), layout, 1)
                .ok()
                .unwrap_or_else(|| unreachable!()),
        );
        let peer = Arc::new(
            Segment::open(region.clone(), 1)
                .ok()
                .unwrap_or_else(|| unreachable!()),
        );
        let w = FrameWriter::new(peer.writer(0).unwrap_or_else(|| unreachable!()));
        (w, own.reader(0).unwrap_or_else(|| unreachable!()), region)
    }

    fn msg(seq: u64, parts: &[usize]) -> Message {
        Message {
            src: 0,
            header: Header::Credit {
                group: GroupId(3),
                calls: seq,
            },
            payload: parts
                .iter()
                .map(|&n| {
                    Bytes::from(
                        (0..n)
                            .map(|i| (i as u64 * 7 + seq) as u8)
                            .collect::<Vec<_>>(),
                    )
                })
                .collect(),
        }
    }

    #[test]
    fn frames_larger_than_the_ring_arrive_whole_and_in_order() {
        let (mut w, mut r, _region) = ends(4096);
        let mut fr = FrameReader::new(Limits::default());
        let pool = Pool::new(1 << 20);
        // Fewer and smaller under Miri, whose interpreter is slow; the wrap and the pieces
        // still happen (a 4 KiB ring).
        let (count, most) = if cfg!(miri) {
            (6u64, 9_000)
        } else {
            (20, 20_000)
        };
        let sent: Vec<Message> = (0..count)
            .map(|i| msg(i, &[(i as usize * 1733) % most, 3, 0]))
            .collect();
        let mut got = Vec::new();
        let mut queue: std::collections::VecDeque<Message> = sent.iter().cloned().collect();
        let mut wakes = 0;
        for _ in 0..100_000 {
            if !w.is_pending() {
                if let Some(m) = queue.pop_front() {
                    assert!(w.send(m).is_ok());
                }
            } else {
                assert!(w.pump().is_ok());
            }
            let mut wake = false;
            while let Ok(Some((h, p))) = fr.next(&mut r, &src(&pool, None), &mut wake) {
                got.push(Message {
                    src: 0,
                    header: h,
                    payload: p,
                });
            }
            wakes += usize::from(wake);
            if got.len() == sent.len() {
                break;
            }
        }
        assert_eq!(got.len(), sent.len());
        for (g, s) in got.iter().zip(&sent) {
            assert_eq!((&g.header, &g.payload), (&s.header, &s.payload));
        }
        assert!(wakes > 0, "the writer waited for room and was told");
    }

    #[test]
    fn garbage_in_the_ring_is_a_typed_error() {
        let (mut w, mut r, _region) = ends(4096);
        let mut room = w.ring.room().unwrap_or(0);
        w.ring.put(b"GARBAGE-GARBAGE-GARBAGE", &mut room);
        w.ring.publish();
        let mut fr = FrameReader::new(Limits::default());
        let mut wake = false;
        assert!(matches!(
            fr.next(&mut r, &src(&Pool::none(), None), &mut wake),
            Err(ShmError::Corrupt(_))
        ));
        // Garbage after a valid kind byte: the codec refuses it.
        let (mut w, mut r, _region) = ends(4096);
        let mut room = w.ring.room().unwrap_or(0);
        w.ring.put(b"\0GARBAGE-GARBAGE-GARBAGE", &mut room);
        w.ring.publish();
        let mut fr = FrameReader::new(Limits::default());
        assert!(matches!(
            fr.next(&mut r, &src(&Pool::none(), None), &mut wake),
            Err(ShmError::Decode(_))
        ));
    }

    #[test]
    fn a_part_beyond_the_limits_is_refused_before_anything_is_allocated() {
        let (mut w, mut r, _region) = ends(4096);
        let limits = Limits {
            max_parts: 4,
            max_payload_bytes: 1000,
        };
        assert!(w.send(msg(1, &[2000])).is_ok());
        let mut fr = FrameReader::new(limits);
        let mut wake = false;
        assert!(matches!(
            fr.next(&mut r, &src(&Pool::none(), None), &mut wake),
            Err(ShmError::Decode(_))
        ));
    }

    fn src<'a>(pool: &'a Pool, remote: Option<&'a dyn RemoteRead>) -> Sources<'a> {
        Sources {
            pool,
            remote,
            landings: None,
            share: None,
            now: Time::ZERO,
        }
    }

    /// Pumps `w` and reads `r` until a whole message comes (at most `turns` times).
    fn pump_until(
        w: &mut FrameWriter,
        fr: &mut FrameReader,
        r: &mut RingReader,
        sources: &Sources<'_>,
        turns: usize,
    ) -> Option<(Header, Vec<Bytes>)> {
        let mut wake = false;
        for _ in 0..turns {
            assert!(w.pump().is_ok());
            if let Ok(Some(x)) = fr.next(r, sources, &mut wake) {
                return Some(x);
            }
        }
        None
    }

    /// The sender's memory, as far as the test lent it: the payloads it sent.
    struct Lent(Vec<Bytes>);

    impl RemoteRead for Lent {
        fn read(&self, addr: u64, dst: &mut [u8]) -> Result<(), String> {
            for b in &self.0 {
                let start = b.as_ptr() as usize as u64;
                if addr >= start && addr + dst.len() as u64 <= start + b.len() as u64 {
                    let at = (addr - start) as usize;
                    dst.copy_from_slice(&b[at..at + dst.len()]);
                    return Ok(());
                }
            }
            Err(format!("nothing lent at {addr:#x}"))
        }
    }

    #[test]
    fn large_payloads_go_as_remote_records_and_are_lent_until_read() {
        let (mut w, mut r, _region) = ends(4096);
        let mut fr = FrameReader::new(Limits::default());
        let pool = Pool::new(1 << 20);
        let count = if cfg!(miri) { 3u64 } else { 5 };
        let sent: Vec<Message> = (0..count)
            .map(|i| msg(i, &[REMOTE_MIN + i as usize * 1000, 0, 3]))
            .collect();
        let lent = Lent(sent.iter().flat_map(|m| m.payload.clone()).collect());
        // Not allowed yet: inline (through the 4 KiB ring, in pieces).
        assert!(w.send(sent[0].clone()).is_ok());
        assert_eq!(w.lent(), 0);
        let mut got = Vec::new();
        let mut wake = false;
        for _ in 0..10_000 {
            assert!(w.pump().is_ok());
            if let Ok(Some(m)) = fr.next(&mut r, &src(&pool, Some(&lent)), &mut wake) {
                got.push(m);
                break;
            }
        }
        // Allowed: the rest go remote, each lent until the reader has read it.
        r.allow_remote();
        for m in &sent[1..] {
            assert!(w.send(m.clone()).is_ok());
            assert_eq!(w.lent(), 1);
            let m = fr.next(&mut r, &src(&pool, Some(&lent)), &mut wake);
            got.push(m.ok().flatten().unwrap_or_else(|| panic!("no record")));
            assert!(w.release().is_ok());
            assert_eq!(w.lent(), 0, "read, so let go");
        }
        assert_eq!(got.len(), sent.len());
        for ((h, p), s) in got.iter().zip(&sent) {
            assert_eq!((h, p), (&s.header, &s.payload));
        }
        // A reader that cannot read remote memory refuses a remote record.
        assert!(w.send(sent[1].clone()).is_ok());
        let mut fr = FrameReader::new(Limits::default());
        assert!(matches!(
            fr.next(&mut r, &src(&pool, None), &mut wake),
            Err(ShmError::Corrupt(_))
        ));
    }

    /// (Not under Miri: the policy is plain logic, and its messages through the ring took
    /// minutes there; the ring's and records' memory accesses are the other tests'.)
    #[cfg_attr(miri, ignore)]
    #[test]
    fn a_writer_sends_remote_records_as_its_single_copy_policy_says() {
        use crate::op::OpKind;
        use crate::tensor::dtype::DType;
        let mut rooted = crate::ids::Fingerprint::new(OpKind::Broadcast, DType::U8);
        rooted.root = Some(0);
        let exchange = crate::ids::Fingerprint::new(OpKind::AllReduce, DType::U8);
        let to_all = crate::ids::Fingerprint::new(OpKind::AllToAllSingle, DType::U8);
        let gather = crate::ids::Fingerprint::new(OpKind::AllGatherIntoTensor, DType::U8);
        let big = SPLIT_MIN;
        let p2p = |seq: u64, n: usize| {
            let mut m = msg(seq, &[n]);
            m.header = Header::P2p {
                group: GroupId(3),
                tag: 0,
                seq,
                dtype: DType::U8,
                count: n as u64,
                eager: false,
                path: crate::ids::DataPath::Engine,
            };
            m
        };
        for (policy, want) in [
            (SingleCopy::Off, [false; 13]),
            (
                SingleCopy::Auto,
                [
                    true, false, false, true, false, false, true, false, true, false, true, false,
                    false,
                ],
            ),
            (SingleCopy::All, [true; 13]),
        ] {
            let sent = [
                data(1, rooted, &[big]),
                data(2, rooted, &[REMOTE_MIN]),
                data(3, exchange, &[big]),
                p2p(4, big),
                p2p(5, REMOTE_MIN),
                msg(6, &[REMOTE_MIN]),
                data(7, to_all, &[big]),
                data(8, to_all, &[REMOTE_MIN]),
                data(9, gather, &[big]),
                data(10, gather, &[REMOTE_MIN]),
                // all_to_all's blocks from 2 MiB, all_gather's from 8 MiB only.
                data(11, to_all, &[EXCHANGE_MIN]),
                data(12, to_all, &[EXCHANGE_MIN / 2]),
                data(13, gather, &[EXCHANGE_MIN]),
            ];
            let lent = Lent(sent.iter().flat_map(|m| m.payload.clone()).collect());
            let (w, mut r, _region) = ends(1 << 20);
            let mut w = w.with_single_copy(policy);
            r.allow_remote();
            let mut fr = FrameReader::new(Limits::default());
            let pool = Pool::new(1 << 20);
            for (m, remote) in sent.iter().zip(want) {
                let before = w.lent();
                assert!(w.send(m.clone()).is_ok());
                assert_eq!(w.lent() > before, remote, "{policy:?}, {:?}", m.header);
                let got = pump_until(&mut w, &mut fr, &mut r, &src(&pool, Some(&lent)), 1_000);
                assert_eq!(got, Some((m.header.clone(), m.payload.clone())));
                assert!(w.release().is_ok());
            }
        }
    }

    /// A sender's memory that is slow to read (each read sleeps), and the threads that read
    /// it.
    struct Slow {
        lent: Lent,
        threads: crate::sync::unmodelled::Mutex<std::collections::HashSet<std::thread::ThreadId>>,
    }

    impl RemoteRead for Slow {
        fn read(&self, addr: u64, dst: &mut [u8]) -> Result<(), String> {
            std::thread::sleep(std::time::Duration::from_millis(3));
            if let Ok(mut t) = self.threads.lock() {
                t.insert(std::thread::current().id());
            }
            self.lent.read(addr, dst)
        }
    }

    /// A remote part of 8 MiB or more is posted, and a thread that helps takes pieces of it;
    /// the message comes out whole and exact, once every piece is in.
    #[cfg(not(miri))]
    #[test]
    fn a_large_remote_part_is_read_by_every_thread_that_helps() {
        let big = super::SPLIT_MIN + 12_345;
        let sent = msg(7, &[big, 3]);
        let slow = Arc::new(Slow {
            lent: Lent(sent.payload.clone()),
            threads: Default::default(),
        });
        let (mut w, mut r, _region) = ends(4096);
        r.allow_remote();
        assert!(w.send(sent.clone()).is_ok());
        assert_eq!(w.lent(), 1);
        let helpers = crate::sync::unmodelled::Mutex::new(Vec::new());
        let post = |job: &Arc<SharedRead>| {
            let job = job.clone();
            if let Ok(mut h) = helpers.lock() {
                h.push(std::thread::spawn(move || while job.help() {}));
            }
        };
        let pool = Pool::new(1 << 20);
        let sources = Sources {
            pool: &pool,
            remote: Some(&*slow),
            landings: None,
            share: Some(Share {
                remote: slow.clone(),
                post: &post,
            }),
            now: Time::ZERO,
        };
        let mut fr = FrameReader::new(Limits::default());
        let mut wake = false;
        let got = fr.next(&mut r, &sources, &mut wake);
        let got = got.ok().flatten().unwrap_or_else(|| panic!("no message"));
        assert_eq!(got, (sent.header.clone(), sent.payload.clone()));
        let threads = slow.threads.lock().map(|t| t.len()).unwrap_or(0);
        assert!(threads >= 2, "read by {threads} thread(s)");
        for h in helpers
            .lock()
            .map(|mut h| std::mem::take(&mut *h))
            .unwrap_or_default()
        {
            assert!(h.join().is_ok());
        }
        assert!(w.release().is_ok());
        assert_eq!(w.lent(), 0, "read, so let go");
    }

    /// A data message of call `seq` (tag 2) with parts of `parts` bytes.
    fn data(seq: u64, fp: crate::ids::Fingerprint, parts: &[usize]) -> Message {
        let mut m = msg(seq, parts);
        m.header = Header::Data {
            group: GroupId(3),
            seq,
            tag: 2,
            call: fp,
        };
        m
    }

    #[test]
    fn an_expected_message_is_read_straight_into_its_place_inline_and_remote() {
        use crate::op::OpKind;
        use crate::tensor::arena::Arena;
        use crate::tensor::dtype::DType;
        let fp = crate::ids::Fingerprint::new(OpKind::AllGather, DType::U8);
        let (a, b) = if cfg!(miri) {
            (5_000, 3_000)
        } else {
            (70_000, 9_000)
        };
        let pool = Pool::new(1 << 20);
        let landings = Landings::new();
        for remote in [false, true] {
            let (mut w, mut r, _region) = ends(4096);
            if remote {
                r.allow_remote();
            }
            let mut fr = FrameReader::new(Limits::default());
            let arena = Arena::new(&Pool::none(), a + b);
            let sent = [
                data(5, fp, &[a, b]),
                data(5, fp, &[a, b]),
                data(6, fp, &[a, b]),
            ];
            let lent = Lent(sent.iter().flat_map(|m| m.payload.clone()).collect());
            // Call 5 expects the message from rank 0 on tag 2; call 6 none (both made).
            landings.made_mark(GroupId(3)).mark(6);
            landings.expect((GroupId(3), 5, 0, 2), fp, &arena, vec![0..a, a..a + b]);
            let sources = Sources {
                pool: &pool,
                remote: Some(&lent),
                landings: Some((0, &landings)),
                share: None,
                now: Time::ZERO,
            };
            let mut got = Vec::new();
            let mut queue: std::collections::VecDeque<Message> = sent.iter().cloned().collect();
            let mut wake = false;
            for _ in 0..100_000 {
                if !w.is_pending() {
                    if let Some(m) = queue.pop_front() {
                        assert!(w.send(m).is_ok());
                    }
                } else {
                    assert!(w.pump().is_ok());
                }
                while let Ok(Some(m)) = fr.next(&mut r, &sources, &mut wake) {
                    got.push(m);
                    assert!(w.release().is_ok());
                }
                if got.len() == sent.len() {
                    break;
                }
            }
            assert_eq!(got.len(), sent.len(), "remote: {remote}");
            for ((h, p), s) in got.iter().zip(&sent) {
                assert_eq!((h, p), (&s.header, &s.payload), "remote: {remote}");
            }
            let (first, again, other) = (&got[0].1, &got[1].1, &got[2].1);
            assert!(
                arena.holds_at(&first[0], 0) && arena.holds_at(&first[1], a),
                "landed in place (remote: {remote})"
            );
            assert!(
                !arena.holds_at(&again[0], 0) && !arena.holds_at(&other[0], 0),
                "a landing is taken once, and only by its message"
            );
            assert_eq!(arena.frozen(0..a + b).map(|x| x.len()), Some(a + b));
        }
        assert_eq!(landings.placed(), 2);
    }

    /// A remote record of a call the rank has not made yet is kept unread until the call is
    /// made (then it lands), something comes behind it, or [`HOLD`] has passed; a call made
    /// without a landing for it has its record read at once.
    #[test]
    #[cfg_attr(miri, ignore)] // no unsafe code of its own; 64 KiB records are slow there
    fn a_remote_record_of_a_call_not_made_yet_waits_for_its_landing() {
        use crate::op::OpKind;
        use crate::tensor::arena::Arena;
        use crate::tensor::dtype::DType;
        let fp = crate::ids::Fingerprint::new(OpKind::AllGather, DType::U8);
        let n = REMOTE_MIN;
        let (w, mut r, _region) = ends(1 << 20);
        let mut w = w.with_single_copy(SingleCopy::All);
        r.allow_remote();
        let sent: Vec<Message> = (7..=11).map(|seq| data(seq, fp, &[n])).collect();
        let lent = Lent(sent.iter().flat_map(|m| m.payload.clone()).collect());
        let pool = Pool::new(1 << 20);
        let landings = Landings::new();
        let mut fr = FrameReader::new(Limits::default());
        let t0 = Time::from_nanos(5_000);
        let at = |now: Time| Sources {
            pool: &pool,
            remote: Some(&lent),
            landings: Some((0, &landings)),
            share: None,
            now,
        };
        let mut send = |m: &Message| {
            assert!(w.send(m.clone()).is_ok());
            for _ in 0..100 {
                if !w.is_pending() {
                    break;
                }
                assert!(w.pump().is_ok());
            }
            assert!(!w.is_pending());
        };
        let mut wake = false;
        let mut next = |fr: &mut FrameReader, r: &mut RingReader, now| {
            fr.next(r, &at(now), &mut wake).ok().flatten()
        };
        // Call 7, not made: kept until it is made with its landing, then read into place.
        send(&sent[0]);
        assert_eq!(next(&mut fr, &mut r, t0), None, "kept");
        assert_eq!(fr.holding(), Some(t0 + HOLD));
        assert_eq!(next(&mut fr, &mut r, t0), None, "still kept");
        let arena = Arena::new(&Pool::none(), n);
        landings.made_mark(GroupId(3)).mark(7);
        landings.expect(
            (GroupId(3), 7, 0, 2),
            fp,
            &arena,
            std::iter::once(0..n).collect(),
        );
        let (h, p) = next(&mut fr, &mut r, t0).unwrap_or_else(|| panic!("read once made"));
        assert_eq!((&h, &p), (&sent[0].header, &sent[0].payload));
        assert!(arena.holds_at(&p[0], 0), "landed");
        assert_eq!((landings.placed(), fr.holding()), (1, None));
        // Call 8, never made: read into a buffer of its own once `HOLD` has passed.
        send(&sent[1]);
        assert_eq!(next(&mut fr, &mut r, t0), None);
        let later = t0 + HOLD;
        let (h, p) = next(&mut fr, &mut r, later).unwrap_or_else(|| panic!("read at the end"));
        assert_eq!((&h, &p), (&sent[1].header, &sent[1].payload));
        // Call 9: kept until call 10's record comes behind it, which is then kept in turn
        // (nothing behind it, its call not made).
        send(&sent[2]);
        assert_eq!(next(&mut fr, &mut r, t0), None);
        send(&sent[3]);
        let got = next(&mut fr, &mut r, t0).map(|(h, _)| h);
        assert_eq!(
            got.as_ref(),
            Some(&sent[2].header),
            "nothing waits behind one kept"
        );
        assert_eq!(next(&mut fr, &mut r, t0), None);
        let got = next(&mut fr, &mut r, later).map(|(h, _)| h);
        assert_eq!(got.as_ref(), Some(&sent[3].header));
        // Call 11, made with no landing for this message: read at once.
        landings.made_mark(GroupId(3)).mark(11);
        send(&sent[4]);
        let (h, _) = next(&mut fr, &mut r, t0).unwrap_or_else(|| panic!("read at once"));
        assert_eq!(h, sent[4].header);
        assert_eq!(landings.placed(), 1);
    }

    /// A call made between the reader's look for the landing of a remote record and its
    /// question whether the call is made (its landing registered before the mark): the
    /// record still lands.
    #[test]
    #[cfg_attr(miri, ignore)] // no unsafe code of its own; 64 KiB records are slow there
    fn a_call_made_between_the_two_looks_still_lands_its_record() {
        use crate::op::OpKind;
        use crate::tensor::arena::Arena;
        use crate::tensor::dtype::DType;
        let fp = crate::ids::Fingerprint::new(OpKind::AllGather, DType::U8);
        let n = REMOTE_MIN;
        let pool = Pool::new(1 << 20);
        for kept_first in [false, true] {
            let arena = Arena::new(&Pool::none(), n);
            let (w, mut r, _region) = ends(1 << 20);
            let mut w = w.with_single_copy(SingleCopy::All);
            r.allow_remote();
            let seq = 12 + u64::from(kept_first);
            let sent = data(seq, fp, &[n]);
            let lent = Lent(sent.payload.clone());
            let landings = Landings::new();
            let mut fr = FrameReader::new(Limits::default());
            let at = Sources {
                pool: &pool,
                remote: Some(&lent),
                landings: Some((0, &landings)),
                share: None,
                now: Time::ZERO,
            };
            assert!(w.send(sent.clone()).is_ok());
            for _ in 0..100 {
                if !w.is_pending() {
                    break;
                }
                assert!(w.pump().is_ok());
            }
            let mut wake = false;
            if kept_first {
                // Kept once (not made), then made between the looks of the next turn.
                assert_eq!(fr.next(&mut r, &at, &mut wake).ok().flatten(), None);
                assert!(fr.holding().is_some());
            }
            let (l, a) = (landings.clone(), arena.clone());
            let mut once = Some(move || {
                l.expect(
                    (GroupId(3), seq, 0, 2),
                    fp,
                    &a,
                    std::iter::once(0..n).collect(),
                );
                l.made_mark(GroupId(3)).mark(seq);
            });
            *landings.on_miss.lock().unwrap_or_else(|e| e.into_inner()) =
                Some(Box::new(move || {
                    if let Some(f) = once.take() {
                        f();
                    }
                }));
            let (h, p) = fr
                .next(&mut r, &at, &mut wake)
                .ok()
                .flatten()
                .unwrap_or_else(|| panic!("read once made"));
            assert_eq!((&h, &p), (&sent.header, &sent.payload));
            assert!(
                arena.holds_at(&p[0], 0),
                "landed (kept first: {kept_first})"
            );
            assert_eq!(landings.placed(), 1);
            assert_eq!(fr.holding(), None);
        }
    }

    #[test]
    fn payloads_in_the_shared_heap_go_as_remote_records_to_a_reader_that_maps_it() {
        use crate::tensor::shared_heap::SharedHeap;
        let (w, mut r, _region) = ends(4096);
        let heap = SharedHeap::on_heap(1 << 20);
        let mut w_heap = w.with_heap(heap.clone());
        let n = if cfg!(miri) {
            REMOTE_MIN
        } else {
            3 * REMOTE_MIN
        };
        let in_heap = heap
            .alloc(n)
            .map(|mut b| {
                b.bytes_mut()
                    .iter_mut()
                    .enumerate()
                    .for_each(|(i, x)| *x = i as u8);
                b.freeze()
            })
            .unwrap_or_else(|| panic!("room"));
        let mut m = msg(1, &[]);
        m.payload = vec![in_heap.clone(), Bytes::new()];
        let outside = msg(2, &[n]);
        let lent = Lent(vec![in_heap]);
        let pool = Pool::new(1 << 20);
        let mut fr = FrameReader::new(Limits::default());
        let mut wake = false;
        // Not mapped yet: inline, through the ring in pieces.
        assert!(w_heap.send(m.clone()).is_ok());
        assert_eq!(w_heap.lent(), 0);
        let got = pump_until(
            &mut w_heap,
            &mut fr,
            &mut r,
            &src(&pool, Some(&lent)),
            10_000,
        );
        assert_eq!(got, Some((m.header.clone(), m.payload.clone())));
        // Mapped: the heap's payload goes remote (lent until read); another does not.
        r.allow_heap();
        assert!(!w_heap.ring().remote_ok());
        assert!(w_heap.send(m.clone()).is_ok());
        assert_eq!(w_heap.lent(), 1, "remote");
        let x = fr.next(&mut r, &src(&pool, Some(&lent)), &mut wake);
        assert_eq!(
            x.ok().flatten(),
            Some((m.header.clone(), m.payload.clone()))
        );
        assert!(w_heap.release().is_ok());
        assert_eq!(w_heap.lent(), 0);
        assert!(w_heap.send(outside).is_ok());
        assert_eq!(w_heap.lent(), 0, "outside the heap: inline");
    }
}
