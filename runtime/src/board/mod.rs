//! The board: small collective calls through shared memory, without the engine.
//!
//! A group whose members all share memory (the ranks of one process, or processes of one
//! host over the shared-memory transport) runs its smallest calls — a barrier, an all_reduce,
//! a broadcast or a reduce of at most [`INLINE_MAX`] bytes — on a *board* instead of the
//! engine: each member owns a *lane* of cache-line slots that only it writes and every other
//! member reads.
//! A call is one slot: its sequence number, written last, its fingerprint and its payload in
//! the same 64-byte line (the technique of Open MPI's `coll/xhc`: the flag and a tiny
//! payload in one line, single-writer flags). A member publishes its slot and reads the
//! others' slots of the same sequence number; there is no message, no schedule, no
//! second synchronisation and no final wait. Each lane has [`DEPTH`] slots, used in turn: a
//! member reuses a slot once every other member has finished with the call that was in it
//! (each lane's header says which call its owner finished last), so ranks that keep in step
//! never wait for a slot.
//!
//! This module is sans-IO: [`Lane`] is the memory (a heap allocation shared by the ranks of
//! one process, or a member's shared-memory segment), and nothing here waits. The rank's
//! driver (`collectix-actors`) decides when to publish, reads, and completes the calls. Every
//! word read from another member's lane is untrusted: a slot whose fingerprint does not
//! decode or whose length is out of range is a [`BoardError`], never undefined behaviour.
//!
//! **Which calls.** [`BoardCall::of`] decides from the call alone (its kind, its size, no
//! forced algorithm), so every member of a group takes the same path for the same call; a
//! member whose call differs (another size, another op) still publishes its fingerprint, and
//! the members that read it report an [`Error::Mismatch`]. A call whose ranks disagree on the
//! path itself (a 4-byte all_reduce on one rank, a 1 MiB one on another) is a mismatch the
//! board alone cannot see; the engine finds it (`BoardEvent::Made`, its messages' arrival,
//! an engine call that finds a slot of its sequence number, or the desync report at the
//! deadline: `docs/architecture.md`, "Small calls on the board").

mod call;
pub mod mail;
pub mod mail_wake;
pub mod queue;
pub mod ran;
#[cfg(test)]
mod tests;
pub mod wake;

pub use call::BoardCall;

use crate::collective::Output;
use crate::error::{Error, Result};
use crate::group::GroupInfo;
use crate::ids::{Fingerprint, FINGERPRINT_BYTES};
use crate::sync::{fence, AtomicU64, Ordering};

/// Members per core of the largest group of one process whose small calls run on a board. A
/// member on the board spins and reads every other member's slot: where the members outnumber
/// the cores many times over, a call costs more than through the engine. On this project's
/// 2-core VM, a 4-byte all_reduce took 54 µs on the board and 79 µs through the engine at 16
/// ranks, 164 and 126 µs at 32, and 61 and 24 ms at 1,024 (`collectix bench --collective
/// all_reduce --ranks W -b 4 -e 4`, with and without `COLLECTIX_BOARD=0`).
pub const MEMBERS_PER_CORE: usize = 8;

/// Whether a group of `members` ranks of one process, on a machine of `cores` cores, runs its
/// small calls on a board ([`MEMBERS_PER_CORE`]). Every member must ask with the same
/// numbers, so that all take the same path.
pub fn fits(members: usize, cores: usize) -> bool {
    members <= MEMBERS_PER_CORE.saturating_mul(cores.max(1))
}

/// Slots per lane: how many calls a member may have published that another member has not
/// finished yet. A member further ahead of the slowest one finishes its calls as far as their
/// results allow (a broadcast's root at once; others once the slots they read are there) and
/// publishes the rest as the slowest one catches up: so one member cannot finish more than
/// `DEPTH` calls that need a slot of a member whose own slot waits on another member that
/// has not made its calls yet (the engine, whose senders hold messages for late peers, has
/// no such bound; NCCL's FIFOs and MPI's eager buffers have one).
pub const DEPTH: usize = 512;
/// Words (u64) of a lane's header, two cache lines: `[finished, 0, ...]` and `[pending,
/// drivers, unattended, 0, ...]`. The owner writes the first on every call it finishes and
/// the others read it rarely (only to reuse a slot); the others read the second on every
/// call they move (may they need a wake-up?) and the owner writes it rarely (when calls of
/// its wait with nobody driving them): on one line, every call would move it between
/// the cores twice.
const HEADER_WORDS: usize = 16;
/// Header word where a lane's owner may say how many calls are pending on its boards (read
/// by the members that wake it; the board itself does not use it).
pub const PENDING_WORD: usize = 8;
/// Header word: how many threads drive the owner's rank now.
pub const DRIVERS_WORD: usize = 9;
/// Header word: non-zero when the owner's last driver left with calls pending (it needs a
/// wake-up to go on).
pub const UNATTENDED_WORD: usize = 10;
/// Words of a slot: one cache line.
pub(crate) const SLOT_WORDS: usize = 8;
/// Words of one member's lane.
pub const LANE_WORDS: usize = HEADER_WORDS + DEPTH * SLOT_WORDS;
/// Bytes of one member's lane.
pub const LANE_BYTES: usize = LANE_WORDS * 8;
/// The most payload bytes a call may have to run on the board: what fits in its slot's line
/// beside the sequence number, the fingerprint and the length.
pub const INLINE_MAX: usize = SLOT_WORDS * 8 - 8 - FINGERPRINT_BYTES - 1;

/// A lane's memory: [`LANE_WORDS`] words, read with acquire and written with release
/// ordering. Accesses out of range fail (`None`, `false`); a lane in memory another process
/// writes returns whatever is there.
pub trait Lane: Send + Sync {
    /// Word `i`.
    fn load(&self, i: usize) -> Option<u64>;
    /// Writes word `i`; whether it is in range.
    fn store(&self, i: usize, v: u64) -> bool;
    /// Words `i..i + out.len()` into `out`, one after another; whether they are in range.
    /// (One call for a slot's words: a call through `dyn Lane` per word is a measurable
    /// part of a small call.)
    fn load_run(&self, i: usize, out: &mut [u64]) -> bool {
        for (k, w) in out.iter_mut().enumerate() {
            match self.load(i + k) {
                Some(v) => *w = v,
                None => return false,
            }
        }
        true
    }
    /// Writes `words` at `i..`, one after another; whether they are in range.
    fn store_run(&self, i: usize, words: &[u64]) -> bool {
        words.iter().enumerate().all(|(k, &v)| self.store(i + k, v))
    }
}

/// A lane on the heap, for the ranks of one process: whole cache lines, so that each slot
/// is one line and no other data shares a line with the lane.
pub struct HeapLane(Box<[Line]>);

/// One cache line of a [`HeapLane`].
#[repr(align(64))]
struct Line([AtomicU64; SLOT_WORDS]);

impl Default for HeapLane {
    fn default() -> Self {
        HeapLane::with_words(LANE_WORDS)
    }
}

impl HeapLane {
    /// Words on the heap for another use of the same memory model (a mailbox:
    /// [`mail`]), `words` rounded up to whole cache lines.
    pub fn with_words(words: usize) -> HeapLane {
        HeapLane(
            (0..words.div_ceil(SLOT_WORDS))
                .map(|_| Line(std::array::from_fn(|_| AtomicU64::new(0))))
                .collect(),
        )
    }
}

/// A lane whose words are atomics of this address space (the heap's, a loom model's): its
/// [`Lane`] reads them with acquire and writes them with release ordering.
pub trait AtomicWords: Send + Sync {
    /// Word `i`, if it is in the lane.
    fn word(&self, i: usize) -> Option<&AtomicU64>;
}

impl<T: AtomicWords> Lane for T {
    fn load(&self, i: usize) -> Option<u64> {
        self.word(i).map(|w| w.load(Ordering::Acquire))
    }
    fn store(&self, i: usize, v: u64) -> bool {
        self.word(i)
            .map(|w| w.store(v, Ordering::Release))
            .is_some()
    }
}

impl AtomicWords for HeapLane {
    fn word(&self, i: usize) -> Option<&AtomicU64> {
        self.0.get(i / SLOT_WORDS).map(|l| &l.0[i % SLOT_WORDS])
    }
}

/// Another member's lane held something that is not a slot (a corrupted or hostile peer's
/// memory): the group cannot go on with it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("board lane of group rank {member}: {what}")]
pub struct BoardError {
    /// The member (group rank) whose lane it is.
    pub member: usize,
    /// What was wrong.
    pub what: &'static str,
}

/// One slot read from a lane: the member's call (its fingerprint as the lane holds it, not
/// decoded: a member compares it with its own call's bytes, and decodes it only when they
/// differ) and its payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot {
    fp: [u8; FINGERPRINT_BYTES],
    len: u8,
    payload: [u8; INLINE_MAX],
}

impl Slot {
    /// The payload.
    pub fn payload(&self) -> &[u8] {
        &self.payload[..usize::from(self.len)]
    }

    /// The call the member made, decoded; `None` if its bytes are not a fingerprint (a
    /// broken or hostile member's lane).
    pub fn fingerprint(&self) -> Option<Fingerprint> {
        Fingerprint::from_bytes(&self.fp).ok()
    }
}

/// The index of call `seq`'s slot's first word (its sequence number) in a lane.
pub(crate) fn slot_base(seq: u64) -> usize {
    // DEPTH is small: the remainder fits.
    HEADER_WORDS + (seq % DEPTH as u64) as usize * SLOT_WORDS
}

/// A group's board as one member sees it: every member's lane, in group-rank order.
pub struct Board {
    lanes: Vec<std::sync::Arc<dyn Lane>>,
    me: usize,
    /// The lowest `finished` word this member saw on the other members' lanes (a call they
    /// all finished, + 1): a slot whose last call is below it is free without reading their
    /// lanes again (they only go up).
    seen_finished: AtomicU64,
    /// A deliberate bug, for the loom models that must catch it.
    #[cfg(collectix_loom)]
    flaw: Option<Flaw>,
}

/// A deliberate bug a loom model plants in a [`Board`] (`loom_models/board.rs`); none
/// outside the models.
#[cfg_attr(not(collectix_loom), allow(dead_code))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Flaw {
    /// [`Board::look`] takes the slots a call does not need without its fence.
    NoCheckFence,
    /// [`Board::can_publish`] reuses a slot without looking at the other members' marks.
    ReuseUnchecked,
}

impl Board {
    /// The board of a group of `lanes.len()` members, seen by member `me`.
    pub fn new(lanes: Vec<std::sync::Arc<dyn Lane>>, me: usize) -> Result<Board> {
        if me >= lanes.len() {
            return Err(Error::internal("board member out of range"));
        }
        Ok(Board {
            lanes,
            me,
            seen_finished: AtomicU64::new(0),
            #[cfg(collectix_loom)]
            flaw: None,
        })
    }

    /// This board with a deliberate bug (loom models only).
    #[cfg(all(collectix_loom, test))]
    pub(crate) fn with_flaw(mut self, flaw: Flaw) -> Board {
        self.flaw = Some(flaw);
        self
    }

    #[cfg(collectix_loom)]
    fn flawed(&self, f: Flaw) -> bool {
        self.flaw == Some(f)
    }

    #[cfg(not(collectix_loom))]
    #[inline(always)]
    fn flawed(&self, _: Flaw) -> bool {
        false
    }

    /// Members.
    pub fn size(&self) -> usize {
        self.lanes.len()
    }

    /// This member (group rank).
    pub fn me(&self) -> usize {
        self.me
    }

    fn mine(&self) -> &dyn Lane {
        self.lanes[self.me].as_ref()
    }

    /// An engine call `fp` at `seq` of `group` finds another member's slot of `seq`: that
    /// member is in a call on the board (which sends no messages), so the calls differ. The
    /// mismatch (or a slot that is not one), for the engine ([`BoardEvent::Clash`]) and the
    /// caller.
    ///
    /// [`BoardEvent::Clash`]: crate::engine::BoardEvent::Clash
    pub fn clash(&self, group: &GroupInfo, seq: u64, fp: Fingerprint) -> Option<Error> {
        let me = self.me;
        (0..self.size()).filter(|&m| m != me).find_map(|m| {
            let slot = self.read(m, seq).ok().flatten()?;
            let Some(theirs) = slot.fingerprint() else {
                return Some(Error::Protocol {
                    rank: group.global(m),
                    detail: crate::error::ProtocolError::Malformed(format!(
                        "board lane of group rank {m}: fingerprint does not decode"
                    )),
                });
            };
            Some(Error::Mismatch {
                group: group.id,
                seq: Some(seq),
                ours: crate::error::CallDesc {
                    rank: group.global(me),
                    call: fp,
                },
                theirs: crate::error::CallDesc {
                    rank: group.global(m),
                    call: theirs,
                },
                report: Vec::new(),
            })
        })
    }

    /// Records that this member finished call `seq` (it will not read slot `seq` again).
    pub fn finish(&self, seq: u64) {
        self.mine().store(0, seq.saturating_add(1));
    }

    /// Whether this member may publish call `seq` now: the call its slot last held is
    /// finished by every other member.
    pub fn can_publish(&self, seq: u64) -> bool {
        // The slot last held a call at most `seq - DEPTH`: if every other member finished
        // that far, the slot is free without a look at it (a load of a line another member
        // may be spinning on, about to be written).
        let seen = self.seen_finished.load(Ordering::Relaxed);
        if seq < DEPTH as u64 || seen > seq - DEPTH as u64 || self.flawed(Flaw::ReuseUnchecked) {
            return true;
        }
        let Some(held) = self
            .mine()
            .load(slot_base(seq))
            .and_then(|w| w.checked_sub(1))
        else {
            return true;
        };
        if seen > held {
            return true;
        }
        let mut lowest = u64::MAX;
        for m in (0..self.size()).filter(|&m| m != self.me) {
            // `finished` + 1, as the lane holds it (0: none yet).
            let f = self.lanes.get(m).and_then(|l| l.load(0)).unwrap_or(0);
            lowest = lowest.min(f);
        }
        // Another thread of this member may have seen more meanwhile; the mark only goes up.
        self.seen_finished.fetch_max(lowest, Ordering::Relaxed);
        lowest > held
    }

    /// Publishes this member's call `seq` (check [`can_publish`](Self::can_publish) first):
    /// the fingerprint (its bytes, [`Fingerprint::to_bytes`]) and payload, then the sequence
    /// number.
    pub fn publish(&self, seq: u64, fp: &[u8; FINGERPRINT_BYTES], payload: &[u8]) -> Result<()> {
        let len = u8::try_from(payload.len())
            .ok()
            .filter(|&l| usize::from(l) <= INLINE_MAX)
            .ok_or_else(|| Error::internal("board payload too large"))?;
        let mut line = [0u8; SLOT_WORDS * 8 - 8];
        line[..FINGERPRINT_BYTES].copy_from_slice(fp);
        line[FINGERPRINT_BYTES] = len;
        line[FINGERPRINT_BYTES + 1..FINGERPRINT_BYTES + 1 + payload.len()].copy_from_slice(payload);
        let base = slot_base(seq);
        let mut words = [0u64; SLOT_WORDS - 1];
        for (w, b) in words.iter_mut().zip(line.chunks_exact(8)) {
            let mut x = [0u8; 8];
            x.copy_from_slice(b);
            *w = u64::from_le_bytes(x);
        }
        let lane = self.mine();
        if !lane.store_run(base + 1, &words) || !lane.store(base, seq.saturating_add(1)) {
            return Err(Error::internal("board lane too short"));
        }
        Ok(())
    }

    /// Member `m`'s slot of call `seq`, if it published it. Every word is checked: a slot
    /// that changes while it is read (its owner may not reuse it before this member finished
    /// the call) or whose length is out of range is an error (its fingerprint is checked by
    /// whoever reads it: [`Slot::fingerprint`]).
    pub fn read(&self, m: usize, seq: u64) -> std::result::Result<Option<Slot>, BoardError> {
        let bad = |what| BoardError { member: m, what };
        let lane = self.lanes.get(m).ok_or(bad("no such member"))?;
        let base = slot_base(seq);
        let want = seq.saturating_add(1);
        if lane.load(base) != Some(want) {
            return Ok(None);
        }
        let mut words = [0u64; SLOT_WORDS - 1];
        if !lane.load_run(base + 1, &mut words) {
            return Err(bad("short lane"));
        }
        let mut line = [0u8; SLOT_WORDS * 8 - 8];
        for (b, w) in line.chunks_exact_mut(8).zip(words) {
            b.copy_from_slice(&w.to_le_bytes());
        }
        if lane.load(base) != Some(want) {
            return Err(bad("slot rewritten while it was read"));
        }
        let mut fp = [0u8; FINGERPRINT_BYTES];
        fp.copy_from_slice(&line[..FINGERPRINT_BYTES]);
        let len = line[FINGERPRINT_BYTES];
        if usize::from(len) > INLINE_MAX {
            return Err(bad("payload length out of range"));
        }
        let mut payload = [0u8; INLINE_MAX];
        payload.copy_from_slice(&line[FINGERPRINT_BYTES + 1..]);
        Ok(Some(Slot { fp, len, payload }))
    }
}

impl Board {
    /// Member `me`'s look at call `seq` (`call`) of `group`: `None` while a slot the call
    /// [needs](BoardCall::needs) is not there, else the call's end, from every slot that is
    /// there (`slots` keeps what was read: a look that comes back `None` is taken up again
    /// where it stopped; start with every entry `None`).
    ///
    /// With `published` (this member's slot of the call is on its lane), the look ends with
    /// every other member's slot that is there, needed or not, each compared with the call:
    /// another call is an [`Error::Mismatch`]. A call that does not need every slot
    /// ([`partial`](BoardCall::partial)) takes them after a `SeqCst` fence: of two members
    /// that each publish, fence and look, one sees the other's slot, so whatever their calls
    /// need, a disagreement is seen at the call by at least one member of every pair that
    /// published (the last of a group to publish sees every slot). Without `published` (a
    /// member further than [`DEPTH`] calls ahead, whose slot is still taken) the call may
    /// end from its needed slots alone: the look is then taken again once it is published
    /// ([`check`](Self::check)).
    ///
    /// A slot that is not one ([`BoardError`]) ends the call with an
    /// [`Error::Protocol`] naming its member.
    pub fn look(
        &self,
        call: &BoardCall,
        group: &GroupInfo,
        seq: u64,
        published: bool,
        slots: &mut [Option<Slot>],
    ) -> Option<Result<Output>> {
        let me = self.me;
        let broken = |e: BoardError| Error::Protocol {
            rank: group.global(e.member),
            detail: crate::error::ProtocolError::Malformed(e.to_string()),
        };
        for (m, s) in slots.iter_mut().enumerate() {
            if s.is_some() || !call.needs(me, m) {
                continue;
            }
            match self.read(m, seq) {
                Ok(Some(slot)) => *s = Some(slot),
                Ok(None) => return None,
                Err(e) => return Some(Err(broken(e))),
            }
        }
        if published {
            if call.partial(me, slots.len()) && !self.flawed(Flaw::NoCheckFence) {
                fence(Ordering::SeqCst);
            }
            for (m, s) in slots.iter_mut().enumerate() {
                if m == me || s.is_some() {
                    continue;
                }
                match self.read(m, seq) {
                    Ok(slot) => *s = slot,
                    Err(e) => return Some(Err(broken(e))),
                }
            }
        }
        Some(call.finish(group, seq, slots))
    }

    /// The look a call that ended before its slot was published owes once it is: every
    /// other member's slot that is there compared with the call (see [`look`](Self::look)).
    /// The call's own result was given already; this says whether the group must be
    /// aborted.
    pub fn check(
        &self,
        call: &BoardCall,
        group: &GroupInfo,
        seq: u64,
        slots: &mut [Option<Slot>],
    ) -> Result<()> {
        slots.fill(None);
        match self.look(call, group, seq, true, slots) {
            // Every needed slot was there when the call ended, and stays until this member
            // finishes the call.
            None => Ok(()),
            Some(r) => r.map(drop),
        }
    }
}

#[cfg(all(test, not(collectix_loom)))]
mod limit_tests {
    /// Eight members per core, at least one core.
    #[test]
    fn a_group_fits_up_to_eight_members_per_core() {
        assert!(super::fits(16, 2) && !super::fits(17, 2));
        assert!(super::fits(8, 0) && !super::fits(9, 0));
    }
}
