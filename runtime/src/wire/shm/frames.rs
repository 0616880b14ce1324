//! Frames over a ring: the codec's frames ([`crate::wire::codec`]), as a socket carries them,
//! written into a ring by a [`FrameWriter`] and read back by a [`FrameReader`]. Both are
//! sans-IO and never wait: the writer puts what fits and keeps the rest of a frame for the
//! next [`pump`](FrameWriter::pump); the reader takes what was published and keeps its place
//! in a frame between calls. The reader decodes with the codec's checks (every length
//! against [`Limits`] before anything is allocated), and reads each payload part straight
//! into an 8-aligned buffer from a [`Pool`]: the only copy after the sender's.

use super::ring::{RingReader, RingWriter};
use super::ShmError;
use crate::tensor::bytes_from_vec;
use crate::tensor::pool::{Pool, PoolBuf};
use crate::wire::codec::{self, Limits, MAX_HEADER_BYTES, PREFIX_BYTES};
use crate::wire::{Header, Message};
use bytes::{Bytes, BytesMut};

/// Parts up to this size are read into a pooled buffer taken whole; larger ones into a buffer
/// that grows by this much as their bytes arrive (a length a peer announces is never
/// allocated ahead of its data, beyond one step).
pub const BIG_PART: usize = 64 << 20;

/// The sending side: a ring, and the frame it is in the middle of.
pub struct FrameWriter {
    ring: RingWriter,
    /// The head of the frame in progress (reused: no allocation per frame).
    head: BytesMut,
    /// The frame in progress and how many of its bytes went.
    pending: Option<(Message, usize)>,
}

/// What [`FrameWriter::send`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum Sent {
    /// The whole frame is in the ring.
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
        }
    }

    /// The ring (its segment's doorbell).
    pub fn ring(&self) -> &RingWriter {
        &self.ring
    }

    /// Whether a frame is in progress.
    pub fn is_pending(&self) -> bool {
        self.pending.is_some()
    }

    /// Starts `msg`'s frame and writes what fits; `Err((msg, None))` back if a frame is still
    /// in progress, `Err((_, Some(e)))` if the ring is corrupt.
    #[allow(clippy::result_large_err)]
    pub fn send(&mut self, msg: Message) -> Result<Sent, (Message, Option<ShmError>)> {
        if self.pending.is_some() {
            return Err((msg, None));
        }
        self.head.clear();
        codec::encode_head(&msg, &mut self.head);
        self.pending = Some((msg, 0));
        match self.pump() {
            Ok(true) => Ok(Sent::Whole),
            Ok(false) => Ok(Sent::Partly),
            Err(e) => match self.pending.take() {
                Some((msg, _)) => Err((msg, Some(e))),
                None => unreachable!("a pump that fails keeps its frame"),
            },
        }
    }

    /// Writes more of the frame in progress; whether it is done (or none was in progress).
    /// When the ring has no room it asks the reader to say when it has (then looks once
    /// more: room freed before the request was seen is not waited for). On an error the
    /// frame stays in progress (and [`send`](FrameWriter::send) hands its message back).
    pub fn pump(&mut self) -> Result<bool, ShmError> {
        loop {
            let mut room = self.ring.room()?;
            let Some((msg, mut written)) = self.pending.take() else {
                return Ok(true);
            };
            let mut skip = written;
            let mut full = false;
            for piece in std::iter::once(&self.head[..]).chain(msg.payload.iter().map(|p| &p[..])) {
                if skip >= piece.len() {
                    skip -= piece.len();
                    continue;
                }
                let rest = &piece[skip..];
                skip = 0;
                let n = self.ring.put(rest, &mut room);
                written += n;
                if n < rest.len() {
                    full = true;
                    break;
                }
            }
            self.ring.publish();
            self.pending = Some((msg, written));
            if !full {
                self.pending = None;
                return Ok(true);
            }
            self.ring.want_room();
            if self.ring.room()? == 0 {
                return Ok(false);
            }
        }
    }

    /// Whether the ring has room now (for a frame in progress).
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
}

/// The receiving side's place in a frame.
enum Place {
    /// Reading a frame's head into `head`.
    Head,
    /// Reading the payload of a frame whose head was decoded.
    Parts {
        header: Header,
        lens: Vec<usize>,
        done: Vec<Bytes>,
        part: Option<Part>,
    },
}

/// The receiving side of a ring (see the module doc).
pub struct FrameReader {
    limits: Limits,
    head: BytesMut,
    place: Place,
}

impl FrameReader {
    /// A reader that accepts frames within `limits`.
    pub fn new(limits: Limits) -> FrameReader {
        FrameReader {
            limits,
            head: BytesMut::with_capacity(256),
            place: Place::Head,
        }
    }

    /// The next whole message from `ring` (its payload in buffers from `pool`), or `None`
    /// when the ring has no more of one now. The bytes read are returned to the writer
    /// before this returns ([`RingReader::release`]); `wake` is told whether the writer waits
    /// for room. An error means the ring does not carry a valid stream: the peer is lost.
    pub fn next(
        &mut self,
        ring: &mut RingReader,
        pool: &Pool,
        wake: &mut bool,
    ) -> Result<Option<(Header, Vec<Bytes>)>, ShmError> {
        let mut ready = ring.ready()?;
        let r = self.step(ring, pool, &mut ready);
        if ring.release() {
            *wake = true;
        }
        r
    }

    fn step(
        &mut self,
        ring: &mut RingReader,
        pool: &Pool,
        ready: &mut u64,
    ) -> Result<Option<(Header, Vec<Bytes>)>, ShmError> {
        loop {
            match &mut self.place {
                Place::Head => {
                    if self.head.len() < PREFIX_BYTES
                        && !take_into(&mut self.head, PREFIX_BYTES, ring, ready)
                    {
                        return Ok(None);
                    }
                    match codec::decode_head(&mut self.head, &self.limits)? {
                        Some(h) => {
                            let mut lens = h.parts;
                            lens.reverse();
                            self.place = Place::Parts {
                                header: h.header,
                                done: Vec::with_capacity(lens.len()),
                                lens,
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
                Place::Parts {
                    lens, done, part, ..
                } => {
                    if part.is_none() {
                        let Some(len) = lens.pop() else {
                            let Place::Parts { header, done, .. } =
                                std::mem::replace(&mut self.place, Place::Head)
                            else {
                                unreachable!("matched above")
                            };
                            return Ok(Some((header, done)));
                        };
                        *part = Some(if len > BIG_PART {
                            Part::Big(Vec::new(), 0, len)
                        } else {
                            Part::Pooled(pool.take(len), 0)
                        });
                    }
                    let finished = match part {
                        Some(Part::Pooled(buf, at)) => {
                            let dst = buf.bytes_mut();
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
        let sent: Vec<Message> = (0..20u64)
            .map(|i| msg(i, &[(i as usize * 1733) % 20_000, 3, 0]))
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
            while let Ok(Some((h, p))) = fr.next(&mut r, &pool, &mut wake) {
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
            fr.next(&mut r, &Pool::none(), &mut wake),
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
            fr.next(&mut r, &Pool::none(), &mut wake),
            Err(ShmError::Decode(_))
        ));
    }
}
