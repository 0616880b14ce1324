//! [`Arena`]: one output buffer that the ranks of a process fill together, each its own
//! disjoint part, and then all share as immutable `Bytes`. This is how an in-process world
//! gives W ranks one result instead of W copies: the rank that reduces (or owns) block `b`
//! writes it straight into the arena, sends the frozen part to its peers (a message in one
//! process carries the `Bytes`, not a copy), and every rank's output is the whole arena once
//! every part is frozen — no join, no copy, one allocation for the world.
//!
//! The safety argument is the claim rule, checked at run time under the arena's lock:
//! - a byte range is written only through the one [`ArenaPart`] that claimed it, and a claim
//!   never overlaps another (so writers never alias, and never alias a reader);
//! - a range is read only once it is frozen ([`ArenaPart::freeze`] consumes the part, so its
//!   writer is gone), and only through a share of it (`Bytes`); a frozen range is claimed
//!   again only after [`Arena::thaw`] finds no share overlapping it (nobody reads it, and no
//!   new share of it can be made once it is not frozen); an arena nothing else holds any
//!   more gives its heap block back whole ([`Arena::into_heap`]).
//!
//! Correctness never depends on the arena: a caller that cannot claim a part (a stale arena,
//! a mismatched call) falls back to an ordinary buffer, and an output is taken from the arena
//! only when every chunk of it is the frozen part at its own offset ([`Arena::frozen`]).
//!
//! This module is one of the crate's three that hold `unsafe` code (with
//! `wire::shm::region` and `tensor::shared_heap`), outside the zero-copy casts of `bytemuck`;
//! CI (`.ci/run`) runs its tests under Miri:
//! `cargo +nightly miri test -p collectix-runtime --lib tensor::arena`.

#![allow(unsafe_code)]

use crate::sync::unmodelled::{Mutex, MutexGuard};
use crate::tensor::pool::{Pool, PoolBuf};
use crate::tensor::shared_heap::{HeapBuf, SharedHeap};
use bytes::Bytes;
use std::ops::Range;
use std::sync::Arc;

/// Who holds each claimed range of an arena.
#[derive(Default)]
struct Claims {
    /// Ranges claimed by a live [`ArenaPart`] (being written).
    writing: Vec<Range<usize>>,
    /// Ranges frozen: written once, read-only from now on (until [`Arena::thaw`] finds no
    /// share of one left).
    frozen: Vec<Range<usize>>,
    /// The range of each live share (`Bytes` of it, through [`Frozen`]): what may be read.
    shared: Vec<Range<usize>>,
}

fn overlap(a: &Range<usize>, b: &Range<usize>) -> bool {
    a.start < b.end && b.start < a.end
}

impl Claims {
    fn overlaps(&self, r: &Range<usize>) -> bool {
        self.writing
            .iter()
            .chain(&self.frozen)
            .any(|c| c.start < r.end && r.start < c.end)
    }

    /// Whether `r` is covered by frozen ranges.
    fn covered(&self, r: &Range<usize>) -> bool {
        let mut frozen: Vec<&Range<usize>> = self
            .frozen
            .iter()
            .filter(|c| c.start < r.end && r.start < c.end)
            .collect();
        frozen.sort_by_key(|c| c.start);
        let mut at = r.start;
        for c in frozen {
            if c.start > at {
                return false;
            }
            at = at.max(c.end);
        }
        at >= r.end
    }
}

/// The memory an arena's `base` points into.
enum Memory {
    /// From a pool; back to it when dropped.
    Pool(PoolBuf),
    /// A block of this process's shared heap (a caller's output, written in place); back to
    /// the heap when dropped.
    Heap(HeapBuf),
}

/// One buffer filled in disjoint parts by several ranks, then shared read-only (see the
/// module doc). Its memory comes from a [`Pool`] and goes back to it when the last share is
/// dropped, or is a block of the shared heap that a caller filled in part
/// ([`from_heap`](Arena::from_heap)).
pub struct Arena {
    /// The start of the buffer (8-aligned; `len` bytes). Derived once from `_buf`, which is
    /// never touched again until it is dropped.
    base: *mut u8,
    len: usize,
    claims: Mutex<Claims>,
    /// Owns the memory `base` points into; returns it to its pool (or heap) on drop.
    _buf: Memory,
}

// SAFETY: `base` points into `_buf`, which the arena owns and which lives as long as it. Every
// access through `base` follows the claim rule (module doc), enforced under `claims`: writes
// go through one exclusive `ArenaPart` per range, reads only to frozen ranges. So sharing the
// arena between threads creates no data race.
unsafe impl Send for Arena {}
// SAFETY: as for `Send`: `&Arena` gives no access to the buffer outside the claim rule.
unsafe impl Sync for Arena {}

impl std::fmt::Debug for Arena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Arena").field("len", &self.len).finish()
    }
}

impl Arena {
    /// An arena of `len` bytes from `pool` (8-aligned, so any element type can view it); its
    /// contents are unspecified until its parts are written.
    pub fn new(pool: &Pool, len: usize) -> Arc<Arena> {
        Arena::over(Memory::Pool(pool.take(len)))
    }

    /// An arena over a block of the shared heap, its contents as its writer left them: a
    /// caller's output that already holds this rank's part (an in-place all_gather), which
    /// is then claimed and frozen without being written. Peers read the frozen ranges out of
    /// their mapping of the heap while this process writes the others (disjoint bytes, under
    /// the claim rule).
    pub fn from_heap(buf: HeapBuf) -> Arc<Arena> {
        Arena::over(Memory::Heap(buf))
    }

    /// An arena over `mem` (its memory does not move with it: a pool's or the heap's).
    fn over(mut mem: Memory) -> Arc<Arena> {
        let bytes = match &mut mem {
            Memory::Pool(b) => b.bytes_mut(),
            Memory::Heap(b) => b.bytes_mut(),
        };
        let (base, len) = (bytes.as_mut_ptr(), bytes.len());
        Arc::new(Arena {
            base,
            len,
            claims: Mutex::new(Claims::default()),
            _buf: mem,
        })
    }

    /// The heap block under it, once nothing else holds the arena (the caller took it out
    /// of its `Arc` with `Arc::try_unwrap`: no part, share or landing is left): its claims
    /// forgotten, its contents as the last writers left them. An arena from a pool comes
    /// back as it is.
    pub fn into_heap(self) -> Result<HeapBuf, Arena> {
        match self._buf {
            Memory::Heap(b) => Ok(b),
            Memory::Pool(_) => Err(self),
        }
    }

    /// Whether a range outside `keep` is claimed (being written, or frozen).
    pub fn claimed_outside(&self, keep: &Range<usize>) -> bool {
        let c = self.claims();
        (c.writing.iter().chain(&c.frozen)).any(|r| r.start < keep.start || r.end > keep.end)
    }

    /// The shared heap its memory is a block of, if it is ([`from_heap`](Self::from_heap)).
    pub fn heap(&self) -> Option<&Arc<SharedHeap>> {
        match &self._buf {
            Memory::Heap(b) => Some(b.heap()),
            Memory::Pool(_) => None,
        }
    }

    /// Makes claimable again every frozen range that no share overlaps (no `Bytes` of it is
    /// left, so nobody reads it, and none can be made: it is no longer frozen): a caller's
    /// output gathered into again while a peer still reads another part of it.
    pub fn thaw(&self) {
        let mut c = self.claims();
        let Claims { frozen, shared, .. } = &mut *c;
        frozen.retain(|f| shared.iter().any(|s| overlap(f, s)));
    }

    /// The frozen ranges, to copy out of with [`frozen`](Self::frozen).
    pub fn frozen_ranges(&self) -> Vec<Range<usize>> {
        self.claims().frozen.clone()
    }

    /// A share of `range` (frozen: checked by the caller under the claims' lock, `c`).
    fn share(self: &Arc<Self>, c: &mut Claims, range: Range<usize>) -> Bytes {
        c.shared.push(range.clone());
        Bytes::from_owner(Frozen {
            arena: self.clone(),
            range,
        })
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn claims(&self) -> MutexGuard<'_, Claims> {
        self.claims.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The exclusive right to write `range`; `None` if it is out of bounds, empty, or
    /// overlaps a range claimed before (by this rank or another).
    pub fn claim(self: &Arc<Self>, range: Range<usize>) -> Option<ArenaPart> {
        if range.start >= range.end || range.end > self.len {
            return None;
        }
        let mut c = self.claims();
        if c.overlaps(&range) {
            return None;
        }
        c.writing.push(range.clone());
        Some(ArenaPart {
            arena: self.clone(),
            range,
        })
    }

    /// `range` as shared `Bytes`, if every byte of it is frozen.
    pub fn frozen(self: &Arc<Self>, range: Range<usize>) -> Option<Bytes> {
        if range.start > range.end || range.end > self.len {
            return None;
        }
        if range.is_empty() {
            return Some(Bytes::new());
        }
        let mut c = self.claims();
        if !c.covered(&range) {
            return None;
        }
        Some(self.share(&mut c, range))
    }

    /// Whether `b` is exactly the arena's bytes at `offset..offset + b.len()` (the same
    /// memory, not equal contents).
    pub fn holds_at(&self, b: &[u8], offset: usize) -> bool {
        (self.base as usize).checked_add(offset) == Some(b.as_ptr() as usize)
            && offset
                .checked_add(b.len())
                .is_some_and(|end| end <= self.len)
    }
}

/// The exclusive right to write one range of an [`Arena`]; [`freeze`](ArenaPart::freeze)
/// ends it and shares the range. A part dropped unfrozen (an error midway) keeps its claim:
/// its range, maybe half-written, is never read nor claimed again.
pub struct ArenaPart {
    arena: Arc<Arena>,
    range: Range<usize>,
}

impl ArenaPart {
    /// The range's bytes, to fill (their contents are unspecified until then).
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: the range is in bounds (checked by `claim`) and claimed by this part alone:
        // no other part writes it and nobody reads it until it is frozen, which consumes this
        // part. The `&mut self` borrow makes the slice the only access through this part.
        unsafe {
            std::slice::from_raw_parts_mut(
                self.arena.base.add(self.range.start),
                self.range.end - self.range.start,
            )
        }
    }

    /// Its range in the arena.
    pub fn range(&self) -> Range<usize> {
        self.range.clone()
    }

    /// The arena it is a part of.
    pub fn arena(&self) -> &Arc<Arena> {
        &self.arena
    }

    /// The part as consecutive parts of at most `piece` bytes (each its own claim, in order),
    /// to be written by several threads at once; once all are frozen the whole range is
    /// [`Arena::frozen`]. A `piece` of 0 is taken as the whole range.
    pub fn split(self, piece: usize) -> Vec<ArenaPart> {
        let piece = if piece == 0 { usize::MAX } else { piece };
        let mut ranges = Vec::new();
        let mut at = self.range.start;
        while at < self.range.end {
            let end = at.saturating_add(piece).min(self.range.end);
            ranges.push(at..end);
            at = end;
        }
        let mut c = self.arena.claims();
        c.writing.retain(|r| *r != self.range);
        c.writing.extend(ranges.iter().cloned());
        drop(c);
        ranges
            .into_iter()
            .map(|range| ArenaPart {
                arena: self.arena.clone(),
                range,
            })
            .collect()
    }

    /// Ends the writing and shares the range, read-only from now on.
    pub fn freeze(self) -> Bytes {
        let range = self.range.clone();
        let mut c = self.arena.claims();
        c.writing.retain(|r| *r != range);
        c.frozen.push(range.clone());
        self.arena.share(&mut c, range)
    }
}

/// A frozen range of an arena, as the owner of a `Bytes`.
struct Frozen {
    arena: Arc<Arena>,
    range: Range<usize>,
}

impl Drop for Frozen {
    fn drop(&mut self) {
        let mut c = self.arena.claims();
        if let Some(i) = c.shared.iter().position(|r| *r == self.range) {
            c.shared.swap_remove(i);
        }
    }
}

impl AsRef<[u8]> for Frozen {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: the range is in bounds and frozen: its writer is gone (freezing consumed
        // it) and it is not claimed again while this share lives (`thaw` keeps every range
        // a share overlaps frozen), so shared reads of it cannot race a write.
        unsafe {
            std::slice::from_raw_parts(
                self.arena.base.add(self.range.start),
                self.range.end - self.range.start,
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frozen_range_is_claimed_again_only_once_no_share_of_it_lives() {
        let pool = Pool::new(1 << 20);
        let arena = Arena::new(&pool, 64);
        let fill = |range: Range<usize>, v: u8| {
            let mut p = arena.claim(range).unwrap_or_else(|| panic!("free"));
            p.bytes_mut().fill(v);
            p.freeze()
        };
        let a = fill(0..32, 1);
        let b = fill(32..64, 2);
        let whole = arena.frozen(0..64).unwrap_or_else(|| panic!("frozen"));
        drop(b);
        arena.thaw();
        assert!(
            arena.claim(32..64).is_none(),
            "a share of the whole still reads it"
        );
        drop(whole);
        arena.thaw();
        assert!(arena.claim(0..32).is_none(), "still shared");
        assert!(arena.frozen(32..64).is_none(), "thawed: no new share of it");
        let again = arena.claim(32..64).map(ArenaPart::freeze);
        assert_eq!(again.as_deref(), Some(&[2u8; 32][..]), "as it was left");
        assert_eq!(&a[..], &[1u8; 32][..]);
        drop(a);
        arena.thaw();
        assert_eq!(arena.frozen_ranges(), vec![32..64]);
        assert!(arena.claim(0..32).is_some());
    }

    #[test]
    fn an_arena_over_a_heap_block_keeps_what_its_writer_left_and_returns_the_block() {
        use crate::tensor::shared_heap::SharedHeap;
        let heap = SharedHeap::on_heap(64 << 10);
        let mut buf = heap.alloc(96).unwrap_or_else(|| panic!("room"));
        buf.bytes_mut()[32..64].fill(7);
        let arena = Arena::from_heap(buf);
        assert_eq!(arena.len(), 96);
        // The part already written is frozen as it is; the others are written by parts.
        let own = arena.claim(32..64).map(ArenaPart::freeze);
        assert_eq!(own.as_deref(), Some(&[7u8; 32][..]));
        assert!(own
            .as_ref()
            .is_some_and(|b| heap.holds(b) && arena.holds_at(b, 32)));
        for (range, v) in [(0..32, 1u8), (64..96, 2)] {
            let mut part = arena.claim(range).unwrap_or_else(|| panic!("free"));
            part.bytes_mut().fill(v);
            part.freeze();
        }
        assert!(arena.claim(40..50).is_none(), "frozen");
        let whole = arena.frozen(0..96).unwrap_or_else(|| panic!("all frozen"));
        assert!(whole[..32].iter().all(|&x| x == 1) && whole[32..64].iter().all(|&x| x == 7));
        assert!(whole[64..].iter().all(|&x| x == 2));
        assert!(heap.in_use() > 0);
        assert!(arena.claimed_outside(&(32..64)));
        let arena = match Arc::try_unwrap(arena) {
            Ok(_) => panic!("shares live"),
            Err(a) => a,
        };
        drop((own, whole));
        assert!(arena.heap().is_some_and(|h| Arc::ptr_eq(h, &heap)));
        let mut back = Arc::try_unwrap(arena)
            .ok()
            .and_then(|a| a.into_heap().ok())
            .unwrap_or_else(|| panic!("no share left"));
        assert_eq!(back.bytes_mut()[40], 7, "the contents stay");
        back.bytes_mut()[40] = 9;
        let arena = Arena::from_heap(back);
        assert!(!arena.claimed_outside(&(32..64)), "claims forgotten");
        let part = arena.claim(32..64).map(ArenaPart::freeze);
        assert_eq!(
            part.as_ref().map(|b| b[8]),
            Some(9),
            "claimable again, as written"
        );
        drop((arena, part));
        assert_eq!(heap.in_use(), 0, "the block went back to the heap");
    }

    #[test]
    fn parts_written_on_several_threads_read_back_as_one_buffer() {
        let pool = Pool::new(1 << 20);
        let arena = Arena::new(&pool, 64);
        let parts: Vec<Bytes> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|k| {
                    let arena = arena.clone();
                    s.spawn(move || {
                        let mut p = arena.claim(k * 16..(k + 1) * 16)?;
                        p.bytes_mut().fill(k as u8 + 1);
                        Some(p.freeze())
                    })
                })
                .collect();
            hs.into_iter()
                .filter_map(|h| h.join().ok().flatten())
                .collect()
        });
        assert_eq!(parts.len(), 4);
        for (k, p) in parts.iter().enumerate() {
            assert!(arena.holds_at(p, k * 16));
            assert!(!arena.holds_at(p, k * 16 + 1));
        }
        let whole = arena.frozen(0..64).map(|b| b.to_vec());
        let want: Vec<u8> = (0..64).map(|i| (i / 16) as u8 + 1).collect();
        assert_eq!(whole, Some(want));
    }

    #[test]
    fn a_split_part_is_written_by_several_threads_and_read_whole() {
        let pool = Pool::new(1 << 20);
        let arena = Arena::new(&pool, 100);
        let part = arena.claim(10..90).map(|p| p.split(16));
        let pieces = part.unwrap_or_default();
        let ranges: Vec<_> = pieces.iter().map(ArenaPart::range).collect();
        assert_eq!(ranges, vec![10..26, 26..42, 42..58, 58..74, 74..90]);
        assert!(arena.claim(50..60).is_none(), "a piece is still claimed");
        assert!(arena.frozen(10..90).is_none(), "nothing is frozen yet");
        std::thread::scope(|s| {
            for mut p in pieces {
                s.spawn(move || {
                    let at = p.range().start;
                    for (i, b) in p.bytes_mut().iter_mut().enumerate() {
                        *b = (at + i) as u8;
                    }
                    drop(p.freeze());
                });
            }
        });
        let whole = arena.frozen(10..90).map(|b| b.to_vec());
        assert_eq!(whole, Some((10..90u8).collect::<Vec<u8>>()));
        assert!(arena.claim(10..11).is_none(), "frozen for good");
        assert!(arena.claim(0..10).is_some(), "outside the split part");
    }

    #[test]
    fn a_claimed_or_frozen_range_cannot_be_claimed_again() {
        let pool = Pool::none();
        let arena = Arena::new(&pool, 32);
        let a = arena.claim(0..16);
        assert!(a.is_some());
        assert!(
            arena.claim(8..24).is_none(),
            "overlaps a part being written"
        );
        assert!(arena.claim(0..0).is_none() && arena.claim(16..40).is_none());
        assert!(arena.frozen(0..16).is_none(), "not frozen yet");
        let frozen = a.map(ArenaPart::freeze);
        assert!(
            arena.claim(0..16).is_none(),
            "frozen ranges are never written again"
        );
        assert!(
            arena.frozen(0..32).is_none(),
            "half of it was never written"
        );
        assert_eq!(arena.frozen(0..16).map(|b| b.len()), Some(16));
        assert_eq!(frozen.map(|b| b.len()), Some(16));
        // A part dropped unfrozen keeps its claim, and is never readable.
        drop(arena.claim(16..32));
        assert!(arena.claim(16..32).is_none() && arena.frozen(16..32).is_none());
    }

    #[test]
    fn the_memory_returns_to_the_pool_when_the_last_share_drops() {
        let pool = Pool::new(1 << 20);
        let arena = Arena::new(&pool, 4096);
        let part = arena.claim(0..4096).map(ArenaPart::freeze);
        drop(arena);
        assert_eq!(pool.free_bytes(), 0, "the frozen part still shares it");
        drop(part);
        assert_eq!(pool.free_bytes(), 4096);
    }
}
