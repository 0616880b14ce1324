//! Small point-to-point messages through shared memory: a *mailbox* per member of a board
//! group, one single-producer, single-consumer ring of cache-line slots per other member.
//!
//! A send of at most [`MAIL_MAX`] bytes between members that share memory need not cross
//! the engine's transports: the sender writes the message into a slot of its ring toward
//! the receiver and its call is done (buffered, as MPI's eager send); whoever drives the
//! receiving rank reads the ring in order and hands each message to the engine, which
//! matches it with receives exactly as a message from a transport
//! (`Engine::on_p2p_mail`): the message carries its lane's sequence number, drawn from the
//! engine's count like any send's, so messages of one (source, tag) are received in the
//! order they were sent whichever way each travelled.
//!
//! ```text
//!  a member's mailbox (words)
//!  0                  new mail: a sender in another process sets it after its message,
//!                     the owner clears it before it reads (a hint, never trusted)
//!  8 + p × 8          freed[p] for each member p, a cache line each: how many of p's
//!                     messages to this member the engine consumed (this member writes it,
//!                     p reads it)
//!  (1 + size) × 8     ring toward member q, for each q: MAIL_DEPTH slots of 8 words
//!                     [position + 1 (written last), tag | dtype << 32 | len << 40,
//!                      lane sequence number, payload (5 words, MAIL_MAX bytes)]
//! ```
//!
//! Slot `position % MAIL_DEPTH` of a ring holds the ring's message number `position`; the
//! sender writes it only while fewer than [`MAIL_DEPTH`] of its messages to that receiver
//! are unconsumed (its `written` against the receiver's `freed`), and a consumed message
//! was read before: a slot is never written while its last message is unread, and what one
//! peer can make another buffer is [`MAIL_DEPTH`] messages of [`MAIL_MAX`] bytes. The
//! sequence word is written last with release ordering and read first with acquire, so a
//! slot whose word names the position the reader wants holds that message whole.
//!
//! Every word read from another member's mailbox is untrusted: a slot whose word names
//! neither the wanted position nor the one before it in that slot, whose dtype does not
//! decode or whose length is out of range or not whole elements, and a `freed` count above
//! what was written, are a [`BoardError`], never undefined behaviour.

use super::{BoardError, Lane, SLOT_WORDS};
use crate::DType;

/// Slots per ring: how many of one member's messages another member may hold unconsumed
/// (the point-to-point eager window, `engine::p2p_flow::P2P_WINDOW`).
pub const MAIL_DEPTH: usize = 16;
/// The most payload bytes of a message in a mailbox: the five words of its slot left after
/// the position, the tag, the dtype, the length and the lane's sequence number.
pub const MAIL_MAX: usize = (SLOT_WORDS - 3) * 8;
/// The largest group whose members get mailboxes: a member's mailbox holds a ring per other
/// member (`MAIL_DEPTH` cache lines each), so the memory of the group's mailboxes grows with
/// the square of its size.
pub const MAIL_MEMBERS: usize = 64;

/// Word of a mailbox that says a message may have come (see the module doc).
pub const MAIL_FLAG: usize = 0;

/// Words of one member's mailbox in a group of `size` members.
pub const fn mailbox_words(size: usize) -> usize {
    (1 + size) * SLOT_WORDS + size * MAIL_DEPTH * SLOT_WORDS
}

/// The word of a mailbox where its owner counts member `p`'s messages consumed.
fn freed_word(p: usize) -> usize {
    (1 + p) * SLOT_WORDS
}

/// A message read from a mailbox.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mail {
    /// Its tag.
    pub tag: u32,
    /// Its lane's sequence number (per source and tag).
    pub seq: u64,
    /// Its elements' type.
    pub dtype: DType,
    /// Its bytes (whole elements of `dtype`).
    pub bytes: Vec<u8>,
}

/// A sender's side of its mailbox: how many messages it wrote toward each member, and how
/// many of them each member had freed when it last looked.
#[derive(Debug)]
pub struct MailOut {
    written: Vec<u64>,
    freed: Vec<u64>,
}

/// A receiver's side: how many messages it read from each member's ring toward it, and how
/// many of them the engine consumed.
#[derive(Debug)]
pub struct MailIn {
    read: Vec<u64>,
    freed: Vec<u64>,
}

/// Why a message was not posted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NotPosted {
    /// The ring toward the receiver holds [`MAIL_DEPTH`] unconsumed messages (or the
    /// message is larger than a slot, or the receiver is this member or no member): the
    /// message goes through the engine.
    Full,
    /// The receiver's mailbox said something impossible.
    Broken(BoardError),
}

/// A group's mailboxes as one member sees them: every member's, in group-rank order.
pub struct Mailboxes {
    boxes: Vec<std::sync::Arc<dyn Lane>>,
    me: usize,
    /// Slots per ring ([`MAIL_DEPTH`]; fewer in the loom models).
    depth: usize,
    /// A deliberate bug, for the loom models that must catch it.
    #[cfg(collectix_loom)]
    flaw: Option<MailFlaw>,
}

/// A deliberate bug a loom model plants in [`Mailboxes`] (`loom_models/mail.rs`); none
/// outside the models.
#[cfg_attr(not(collectix_loom), allow(dead_code))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MailFlaw {
    /// [`Mailboxes::post`] writes the slot's position word before the message.
    PositionFirst,
    /// [`Mailboxes::has_room`] does not look at what the receiver freed.
    RoomUnchecked,
}

impl Mailboxes {
    /// The mailboxes of a group of `boxes.len()` members, seen by member `me`; `None` if
    /// `me` is not one of them or the group is larger than [`MAIL_MEMBERS`].
    pub fn new(boxes: Vec<std::sync::Arc<dyn Lane>>, me: usize) -> Option<Mailboxes> {
        (me < boxes.len() && boxes.len() <= MAIL_MEMBERS).then_some(Mailboxes {
            boxes,
            me,
            depth: MAIL_DEPTH,
            #[cfg(collectix_loom)]
            flaw: None,
        })
    }

    /// These mailboxes with `depth` slots per ring and a deliberate bug (loom models only).
    #[cfg(all(collectix_loom, test))]
    pub(crate) fn for_model(mut self, depth: usize, flaw: Option<MailFlaw>) -> Mailboxes {
        self.depth = depth.clamp(1, MAIL_DEPTH);
        self.flaw = flaw;
        self
    }

    #[cfg(collectix_loom)]
    fn flawed(&self, f: MailFlaw) -> bool {
        self.flaw == Some(f)
    }

    #[cfg(not(collectix_loom))]
    #[inline(always)]
    fn flawed(&self, _: MailFlaw) -> bool {
        false
    }

    /// Members.
    pub fn size(&self) -> usize {
        self.boxes.len()
    }

    /// This member's sending state (nothing written yet).
    pub fn outbox(&self) -> MailOut {
        MailOut {
            written: vec![0; self.size()],
            freed: vec![0; self.size()],
        }
    }

    /// This member's receiving state (nothing read yet).
    pub fn inbox(&self) -> MailIn {
        MailIn {
            read: vec![0; self.size()],
            freed: vec![0; self.size()],
        }
    }

    fn ring_base(&self, toward: usize, position: u64) -> usize {
        // The depth is small: the remainder fits.
        (1 + self.size()) * SLOT_WORDS
            + toward * self.depth * SLOT_WORDS
            + (position % self.depth as u64) as usize * SLOT_WORDS
    }

    /// Whether a message to `dst` would find a free slot now (a sender checks before it
    /// takes the message's sequence number: a slot, once free, stays free until it writes).
    ///
    /// The receiver's count of freed slots is read only when the count last read says the
    /// ring is full: that line is the receiver's, and reading it on every send moved it
    /// between the cores once a message. A count read earlier is never above the receiver's
    /// (it only grows), so the ring is never taken for emptier than it is.
    pub fn has_room(&self, out: &mut MailOut, dst: usize) -> Result<bool, BoardError> {
        if dst == self.me || dst >= self.size() {
            return Ok(false);
        }
        let written = out.written[dst];
        if self.flawed(MailFlaw::RoomUnchecked) {
            return Ok(true);
        }
        if written - out.freed[dst] < self.depth as u64 {
            return Ok(true);
        }
        let freed = self.boxes[dst]
            .load(freed_word(self.me))
            .ok_or(BoardError {
                member: dst,
                what: "mailbox out of range",
            })?;
        if freed > written {
            return Err(BoardError {
                member: dst,
                what: "mailbox freed more messages than were sent",
            });
        }
        // A count that went back (a broken receiver) only makes the ring look fuller.
        out.freed[dst] = freed;
        Ok(written - freed < self.depth as u64)
    }

    /// Writes message (`tag`, lane sequence number `seq`, `bytes` of `dtype`) into the ring
    /// toward `dst`; the receiver may read it as soon as this returns.
    pub fn post(
        &self,
        out: &mut MailOut,
        dst: usize,
        tag: u32,
        seq: u64,
        dtype: DType,
        bytes: &[u8],
    ) -> Result<(), NotPosted> {
        if bytes.len() > MAIL_MAX || !bytes.len().is_multiple_of(dtype.size()) {
            return Err(NotPosted::Full);
        }
        if !self.has_room(out, dst).map_err(NotPosted::Broken)? {
            return Err(NotPosted::Full);
        }
        let position = out.written[dst];
        let mut words = [0u64; SLOT_WORDS];
        words[1] = u64::from(tag) | (u64::from(dtype.code()) << 32) | ((bytes.len() as u64) << 40);
        words[2] = seq;
        for (k, chunk) in bytes.chunks(8).enumerate() {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            words[3 + k] = u64::from_le_bytes(w);
        }
        let base = self.ring_base(dst, position);
        let mine = &self.boxes[self.me];
        let stored = if self.flawed(MailFlaw::PositionFirst) {
            let head = mine.store(base, position + 1);
            head && mine.store_run(base + 1, &words[1..])
        } else {
            // The message, then its position (release): the receiver reads them the other
            // way round.
            let body = mine.store_run(base + 1, &words[1..]);
            body && mine.store(base, position + 1)
        };
        if !stored {
            return Err(NotPosted::Broken(BoardError {
                member: self.me,
                what: "mailbox out of range",
            }));
        }
        out.written[dst] = position + 1;
        Ok(())
    }

    /// Whether `src`'s ring toward this member seems to hold a message not read yet (a hint
    /// without the receiver's state: its `read` count is passed in).
    pub fn looks_ready(&self, src: usize, read: u64) -> bool {
        src != self.me
            && src < self.size()
            && self.boxes[src].load(self.ring_base(self.me, read)) == Some(read + 1)
    }

    /// How many messages of `src` this member has read.
    pub fn read_of(inn: &MailIn, src: usize) -> u64 {
        inn.read.get(src).copied().unwrap_or(0)
    }

    /// The next message of `src`'s ring toward this member, if it is there.
    pub fn take(&self, inn: &mut MailIn, src: usize) -> Option<Result<Mail, BoardError>> {
        if src == self.me || src >= self.size() {
            return None;
        }
        let position = inn.read[src];
        let base = self.ring_base(self.me, position);
        let lane = &self.boxes[src];
        let broken = |what| Some(Err(BoardError { member: src, what }));
        let Some(head) = lane.load(base) else {
            return broken("mailbox out of range");
        };
        if head != position + 1 {
            // The slot's previous message (or none yet): not written yet.
            let before = (position + 1).saturating_sub(self.depth as u64);
            return if head == before {
                None
            } else {
                broken("mailbox slot names another message")
            };
        }
        let mut words = [0u64; SLOT_WORDS - 1];
        if !lane.load_run(base + 1, &mut words) {
            return broken("mailbox out of range");
        }
        let tag = words[0] as u32;
        let Ok(dtype) = DType::try_from((words[0] >> 32) as u8) else {
            return broken("mailbox message of no dtype");
        };
        let len = (words[0] >> 40) as usize;
        if words[0] >> 48 != 0 || len > MAIL_MAX || !len.is_multiple_of(dtype.size()) {
            return broken("mailbox message of a wrong length");
        }
        let mut all = [0u8; MAIL_MAX];
        for (k, w) in words[2..].iter().enumerate() {
            all[k * 8..k * 8 + 8].copy_from_slice(&w.to_le_bytes());
        }
        let bytes = all[..len].to_vec();
        inn.read[src] = position + 1;
        Some(Ok(Mail {
            tag,
            seq: words[1],
            dtype,
            bytes,
        }))
    }

    /// The engine consumed `n` more messages of `src` that came through the mailbox: their
    /// slots may be written again.
    pub fn free(&self, inn: &mut MailIn, src: usize, n: u64) {
        if src == self.me || src >= self.size() || n == 0 {
            return;
        }
        // Never more than were read (the engine consumes only what it was handed).
        let freed = (inn.freed[src] + n).min(inn.read[src]);
        inn.freed[src] = freed;
        self.boxes[self.me].store(freed_word(src), freed);
    }
}

#[cfg(all(test, not(collectix_loom)))]
mod tests {
    use super::*;
    use crate::board::AtomicWords;
    use crate::sync::AtomicU64;
    use std::sync::Arc;

    /// Words on the heap.
    struct Words(Vec<AtomicU64>);

    impl AtomicWords for Words {
        fn word(&self, i: usize) -> Option<&AtomicU64> {
            self.0.get(i)
        }
    }

    fn group(size: usize) -> (Vec<Arc<Words>>, Vec<Mailboxes>) {
        let mem: Vec<Arc<Words>> = (0..size)
            .map(|_| {
                Arc::new(Words(
                    (0..mailbox_words(size))
                        .map(|_| AtomicU64::new(0))
                        .collect(),
                ))
            })
            .collect();
        let boxes = (0..size)
            .map(|me| {
                let l: Vec<Arc<dyn Lane>> =
                    mem.iter().map(|m| m.clone() as Arc<dyn Lane>).collect();
                Mailboxes::new(l, me).unwrap_or_else(|| panic!("mailboxes"))
            })
            .collect();
        (mem, boxes)
    }

    /// Messages come out in the order they went in, whole, and a full ring refuses the next
    /// until the receiver frees a slot.
    #[test]
    fn messages_come_in_order_and_a_full_ring_waits_for_a_freed_slot() {
        let (_mem, b) = group(3);
        let mut out = b[0].outbox();
        let mut inn = b[2].inbox();
        for i in 0..MAIL_DEPTH as u64 {
            let bytes = (i as u32).to_le_bytes();
            b[0].post(&mut out, 2, 7, i, DType::I32, &bytes)
                .unwrap_or_else(|e| panic!("{e:?}"));
        }
        assert_eq!(
            b[0].post(&mut out, 2, 7, 99, DType::I32, &[0; 4]),
            Err(NotPosted::Full)
        );
        // Nothing for member 1.
        assert!(b[1].take(&mut b[1].inbox(), 0).is_none());
        for i in 0..MAIL_DEPTH as u64 {
            assert!(b[2].looks_ready(0, Mailboxes::read_of(&inn, 0)));
            let m = b[2]
                .take(&mut inn, 0)
                .unwrap_or_else(|| panic!("message {i} missing"))
                .unwrap_or_else(|e| panic!("{e}"));
            assert_eq!((m.tag, m.seq, m.dtype), (7, i, DType::I32));
            assert_eq!(m.bytes, (i as u32).to_le_bytes());
        }
        assert!(b[2].take(&mut inn, 0).is_none());
        // Read is not freed: still full.
        assert_eq!(
            b[0].post(&mut out, 2, 7, 99, DType::I32, &[0; 4]),
            Err(NotPosted::Full)
        );
        b[2].free(&mut inn, 0, 1);
        let payload: Vec<u8> = (0..MAIL_MAX as u8).collect();
        b[0].post(&mut out, 2, 9, 16, DType::U8, &payload)
            .unwrap_or_else(|e| panic!("{e:?}"));
        let m = b[2]
            .take(&mut inn, 0)
            .unwrap_or_else(|| panic!("missing"))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((m.tag, m.seq, m.bytes), (9, 16, payload));
        // Too large, or not whole elements: through the engine.
        assert_eq!(
            b[0].post(&mut out, 2, 9, 17, DType::U8, &[0; MAIL_MAX + 1]),
            Err(NotPosted::Full)
        );
        assert_eq!(
            b[0].post(&mut out, 2, 9, 17, DType::I32, &[0; 3]),
            Err(NotPosted::Full)
        );
        // Not to itself.
        assert_eq!(
            b[0].post(&mut out, 0, 9, 0, DType::U8, &[1]),
            Err(NotPosted::Full)
        );
    }

    /// Garbage in another member's mailbox is an error naming it, never a panic or a
    /// message: a slot naming another position, a dtype that does not decode, a length out
    /// of range, a freed count above what was written.
    #[test]
    fn a_corrupt_mailbox_is_an_error_naming_its_member() {
        let (mem, b) = group(2);
        let base = 3 * SLOT_WORDS + MAIL_DEPTH * SLOT_WORDS; // member 0's ring toward 1, slot 0
        let set = |i: usize, v: u64| mem[0].0[i].store(v, crate::sync::Ordering::Release);
        let take = || b[1].take(&mut b[1].inbox(), 0);
        set(base, 5);
        assert!(matches!(take(), Some(Err(BoardError { member: 0, .. }))));
        set(base, 1);
        set(base + 1, 200 << 32);
        assert!(matches!(take(), Some(Err(BoardError { member: 0, .. }))));
        set(base + 1, (u64::from(DType::U8.code()) << 32) | (41 << 40));
        assert!(matches!(take(), Some(Err(BoardError { member: 0, .. }))));
        set(base + 1, (u64::from(DType::I32.code()) << 32) | (6 << 40));
        assert!(matches!(take(), Some(Err(BoardError { member: 0, .. }))));
        set(base + 1, (u64::from(DType::I32.code()) << 32) | (8 << 40));
        assert!(matches!(take(), Some(Ok(Mail { bytes, .. })) if bytes.len() == 8));
        // Member 1 claims it freed messages member 0 never sent: seen once member 0's ring
        // toward it looks full (the count is read only then).
        let (mem, b) = group(2);
        let mut out = b[0].outbox();
        for k in 0..MAIL_DEPTH as u64 {
            assert_eq!(b[0].post(&mut out, 1, 0, k, DType::U8, &[1]), Ok(()));
        }
        mem[1].0[freed_word(0)].store(MAIL_DEPTH as u64 + 1, crate::sync::Ordering::Release);
        assert!(matches!(
            b[0].has_room(&mut out, 1),
            Err(BoardError { member: 1, .. })
        ));
    }
}
