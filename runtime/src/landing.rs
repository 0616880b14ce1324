//! [`Landings`]: where the payload of a message this rank expects goes, named before the
//! payload is read, so that a transport reads it straight into its place in the call's
//! output instead of into a buffer of its own that the output is later joined from.
//!
//! A rank whose peers are other processes gets, for each large call whose schedule copies
//! received chunks into its output, one output buffer of its own (an [`Arena`] nobody else
//! shares). When the call starts, the engine registers, for every receive that copies chunks
//! into the output, the message it expects (group, call, sender, step tag, the call's
//! fingerprint) and the byte ranges its parts take in that buffer. A transport's reader,
//! having decoded a frame's head (every length checked against its limits), asks
//! [`Landings::place`]; if the frame is the one expected, part for part of exactly the
//! expected lengths, it gets the claimed ranges ([`ArenaPart`]) and reads each part into its
//! range; else it reads the parts into buffers of its own, as before. Either way the message
//! goes to the engine unchanged in meaning, which checks it as any other; when every chunk of
//! the output is in place, the output is the buffer itself (no join; the chunks that are not
//! in place, such as this rank's own, are copied in: `engine/output.rs`).
//!
//! A remote record (over shared memory: the payload stays in the sender's memory until the
//! receiver reads it) may come before this rank has made its call, when the peer is ahead:
//! its landing is not registered yet. The frame reader then keeps it unread for a moment
//! ([`Landings::awaits`], `wire::shm::frames::HOLD`), so that the call, once made, finds its
//! payload still to read and it lands; read into a buffer of its own it would be copied
//! twice.
//!
//! Correctness never depends on a landing: a frame that does not match, comes before its call
//! starts or after it ends, or whose range was claimed already, is read as before, and an
//! output is taken from the buffer only when every chunk is the frozen range at its own
//! offset. A landing is taken by the first frame that matches it, and a call's landings are
//! dropped when it ends (the map holds the buffer weakly meanwhile).
//!
//! The lock here guards where payload bytes go, never a protocol decision (like the arena's,
//! it stays outside the loom model: `sync::unmodelled`).

use crate::fast_hash::FastMap;
use crate::ids::{Fingerprint, GroupId};
use crate::sync::unmodelled::{AtomicU64, Mutex, MutexGuard, Ordering};
use crate::tensor::arena::{Arena, ArenaPart};
use crate::wire::Header;
use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::{Arc, Weak};

/// Outputs below this many bytes get no landings: joining them costs less than the buffer
/// and the registration.
pub const LAND_MIN: usize = 64 << 10;

/// A message expected: group, call, global rank of the sender, step tag.
type Key = (GroupId, u64, usize, u32);

/// Where one expected message's parts go.
struct Landing {
    fp: Fingerprint,
    arena: Weak<Arena>,
    /// The range of each part, in order.
    ranges: Vec<Range<usize>>,
}

/// The landings of the calls in flight of one rank (see the module doc); shared by its
/// engine, which registers and drops them, and its transports' readers, which take them.
#[derive(Default)]
pub struct Landings {
    expected: Mutex<BTreeMap<Key, Landing>>,
    /// Per group, the calls this rank has made: those below the mark. The engine keeps each
    /// group's mark in its group state and raises it with one atomic store per call
    /// ([`Made`]); the map is only looked at by readers holding a remote record.
    made: Mutex<FastMap<GroupId, Arc<AtomicU64>>>,
    /// Messages placed so far.
    placed: AtomicU64,
    /// Run when [`place`](Self::place) finds no landing (tests: a call made right after).
    #[cfg(test)]
    pub(crate) on_miss: Mutex<Option<Box<dyn FnMut() + Send>>>,
}

/// One group's mark of the calls this rank has made (those below it): raised by the engine
/// once a call's landings are registered, read by the frame readers through
/// [`Landings::awaits`].
#[derive(Clone, Default)]
pub(crate) struct Made(Arc<AtomicU64>);

impl Made {
    /// Call `seq` (and those before it) is made: its landings, if it has any, are
    /// registered (the release orders them before the mark).
    pub(crate) fn mark(&self, seq: u64) {
        self.0.fetch_max(seq.saturating_add(1), Ordering::Release);
    }
}

impl Landings {
    /// No landings.
    pub fn new() -> Arc<Landings> {
        Arc::new(Landings::default())
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<Key, Landing>> {
        self.expected.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers the message of `key` (group, call, sender's global rank, tag) of the call
    /// fingerprinted `fp`: its parts go to `ranges` of `arena`.
    pub(crate) fn expect(
        &self,
        key: (GroupId, u64, usize, u32),
        fp: Fingerprint,
        arena: &Arc<Arena>,
        ranges: Vec<Range<usize>>,
    ) {
        self.lock().insert(
            key,
            Landing {
                fp,
                arena: Arc::downgrade(arena),
                ranges,
            },
        );
    }

    /// The mark of calls made on `group` (see [`Made`]), registered until
    /// [`drop_group`](Self::drop_group).
    pub(crate) fn made_mark(&self, group: GroupId) -> Made {
        let mut m = self.made.lock().unwrap_or_else(|e| e.into_inner());
        Made(m.entry(group).or_default().clone())
    }

    /// Forgets `group`'s mark (the group was destroyed on this rank): a record of it still in
    /// a ring is read when it waited its while, and dropped by the engine.
    pub(crate) fn drop_group(&self, group: GroupId) {
        self.made
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&group);
    }

    /// Whether a frame with `header` is a data message of a call this rank has not made yet
    /// (whose landing, if the call has one, is still to come). When this says no after
    /// [`place`](Self::place) found nothing, the caller looks again: the call may have been
    /// made (its landings registered) between the two looks.
    pub fn awaits(&self, header: &Header) -> bool {
        let Header::Data { group, seq, .. } = header else {
            return false;
        };
        let m = self.made.lock().unwrap_or_else(|e| e.into_inner());
        m.get(group)
            .is_none_or(|made| *seq >= made.load(Ordering::Acquire))
    }

    /// Drops the landings of call `seq` of `group` (it ended).
    pub(crate) fn forget(&self, group: GroupId, seq: u64) {
        let mut m = self.lock();
        if m.is_empty() {
            return;
        }
        let keys: Vec<Key> = m
            .range((group, seq, 0, 0)..=(group, seq, usize::MAX, u32::MAX))
            .map(|(k, _)| *k)
            .collect();
        for k in keys {
            m.remove(&k);
        }
    }

    /// How many groups have a mark of calls made (those registered and not destroyed).
    pub fn groups_marked(&self) -> usize {
        self.made.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// How many messages were read straight into their place so far.
    pub fn placed(&self) -> u64 {
        self.placed.load(Ordering::Relaxed)
    }

    /// How many landings are registered.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Where the parts of a frame from global rank `src` go, given its decoded head: the
    /// claimed range of each part, if the frame is a call's data message that this rank
    /// expects, of `lens` exactly as expected; else `None` (read it into buffers of its own).
    /// The landing is taken: a second frame with the same head lands nowhere.
    pub fn place(&self, src: usize, header: &Header, lens: &[usize]) -> Option<Vec<ArenaPart>> {
        let Header::Data {
            group,
            seq,
            tag,
            call,
        } = header
        else {
            return None;
        };
        let landing = {
            let mut m = self.lock();
            if m.is_empty() {
                None
            } else {
                m.remove(&(*group, *seq, src, *tag))
            }
        };
        let Some(landing) = landing else {
            #[cfg(test)]
            if let Some(f) = self
                .on_miss
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .as_mut()
            {
                f();
            }
            return None;
        };
        if landing.fp != *call
            || landing.ranges.len() != lens.len()
            || landing.ranges.iter().zip(lens).any(|(r, &l)| r.len() != l)
        {
            return None;
        }
        let arena = landing.arena.upgrade()?;
        let parts: Option<Vec<ArenaPart>> =
            landing.ranges.into_iter().map(|r| arena.claim(r)).collect();
        if parts.is_some() {
            self.placed.fetch_add(1, Ordering::Relaxed);
        }
        parts
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::OpKind;
    use crate::tensor::dtype::DType;
    use crate::tensor::pool::Pool;

    fn data(seq: u64, tag: u32, call: Fingerprint) -> Header {
        Header::Data {
            group: GroupId::WORLD,
            seq,
            tag,
            call,
        }
    }

    #[test]
    fn an_expected_frame_lands_in_its_ranges_once() {
        let fp = Fingerprint::new(OpKind::Broadcast, DType::F32);
        let arena = Arena::new(&Pool::none(), 32);
        let l = Landings::new();
        l.expect((GroupId::WORLD, 7, 3, 1), fp, &arena, vec![0..16, 16..32]);
        assert!(
            l.place(2, &data(7, 1, fp), &[16, 16]).is_none(),
            "another sender"
        );
        assert!(
            l.place(3, &data(8, 1, fp), &[16, 16]).is_none(),
            "another call"
        );
        let parts = l.place(3, &data(7, 1, fp), &[16, 16]);
        let parts: Vec<_> = parts
            .into_iter()
            .flatten()
            .enumerate()
            .map(|(i, mut p)| {
                p.bytes_mut().fill(i as u8 + 1);
                p.freeze()
            })
            .collect();
        assert_eq!(parts.len(), 2);
        assert!(arena.holds_at(&parts[0], 0) && arena.holds_at(&parts[1], 16));
        assert!(l.is_empty(), "taken");
        assert_eq!(l.placed(), 1);
        assert!(
            l.place(3, &data(7, 1, fp), &[16, 16]).is_none(),
            "only once"
        );
    }

    #[test]
    fn a_frame_that_differs_from_the_expected_lands_nowhere() {
        let fp = Fingerprint::new(OpKind::Broadcast, DType::F32);
        let other = Fingerprint::new(OpKind::Broadcast, DType::I32);
        let arena = Arena::new(&Pool::none(), 32);
        let l = Landings::new();
        let key = (GroupId::WORLD, 1, 0, 0);
        for (call, lens) in [
            (other, &[16usize, 16][..]),
            (fp, &[16, 8]),
            (fp, &[16]),
            (fp, &[16, 16, 0]),
        ] {
            l.expect(key, fp, &arena, vec![0..16, 16..32]);
            assert!(
                l.place(0, &data(1, 0, call), lens).is_none(),
                "{call:?} {lens:?}"
            );
        }
        // A range already claimed (by this rank's own output code) is not claimed again.
        let held = arena.claim(0..16);
        l.expect(key, fp, &arena, vec![0..16, 16..32]);
        assert!(l.place(0, &data(1, 0, fp), &[16, 16]).is_none());
        drop(held);
        // The call ended: its buffer is gone, and its landings are dropped.
        l.expect(key, fp, &arena, std::iter::once(16..32).collect());
        l.expect(
            (GroupId::WORLD, 2, 0, 0),
            fp,
            &arena,
            std::iter::once(16..32).collect(),
        );
        l.forget(GroupId::WORLD, 1);
        assert_eq!(l.len(), 1);
        drop(arena);
        assert!(l.place(0, &data(2, 0, fp), &[16]).is_none());
    }
}
