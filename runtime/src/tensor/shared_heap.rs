//! [`SharedHeap`]: memory of one process that the other processes of its host map read-only,
//! so that a payload living there crosses to them with one copy (theirs, out of their
//! mapping) instead of two through a ring. Tensors made with
//! `Communicator::alloc_shared` (and `to_shared`), and so the results of in-place all_gathers
//! into them, live here when the job runs over shared memory.
//!
//! The heap hands out blocks ([`HeapBuf`]): a size class per power of two from
//! [`MIN_BLOCK`] up, a free list per class, and a bump pointer for blocks never used yet. A
//! block is written through its `HeapBuf` alone, then frozen into `Bytes`, read-only from then
//! on; its memory returns to the free list when the last share of it drops. A peer reads a
//! frozen block only while a message that holds it is lent to the peer (the shared-memory
//! writer keeps the message until the peer acknowledges the record), so a block is never
//! reused under a reader. When the heap is full, `alloc` says so (`None`) and the caller
//! uses ordinary memory: nothing depends on the heap but speed.
//!
//! **The safety argument.** The heap is `len` bytes at `base`, valid and writable by this
//! process for the heap's life (a mapping of its own memfd, sealed so that no other process
//! can map it writable, or heap memory in tests), and this process writes it only through a
//! live `HeapBuf`: the free lists hand each block to one `HeapBuf` at a time (under their
//! lock), so two writers never alias, and a frozen block is only read. A block may instead be
//! handed to an arena (`tensor::arena::Arena::from_heap`: a caller's output written in
//! place), which writes it by claimed ranges that never overlap a frozen one, and lends other
//! processes only frozen ranges. Other processes can only read it, so no write from outside
//! races the references formed here.
//!
//! This module is one of the crate's few with `unsafe` code; CI runs its tests under Miri on
//! heap-backed heaps (`cargo +nightly miri test -p collectix-runtime --lib tensor::shared_heap`).

#![allow(unsafe_code)]

use crate::sync::unmodelled::{Mutex, MutexGuard};
use crate::wire::shm::region::Backing;
use bytes::Bytes;
use std::ops::Range;
use std::ptr::NonNull;
use std::sync::Arc;

/// The smallest block (a page); blocks are powers of two from it up.
pub const MIN_BLOCK: usize = 4096;

/// Heap memory standing in for a mapping (tests, Miri).
struct Owned(NonNull<[u64]>);

// SAFETY: `Owned` owns its words (a leaked box) and only frees them.
unsafe impl Send for Owned {}
// SAFETY: `Owned` has no methods that touch the words.
unsafe impl Sync for Owned {}
impl Backing for Owned {}

impl Drop for Owned {
    fn drop(&mut self) {
        // SAFETY: the pointer came from `Box::leak` in `SharedHeap::on_heap` and is freed only
        // here, once, when the heap that pointed into it is dropped.
        drop(unsafe { Box::from_raw(self.0.as_ptr()) });
    }
}

/// The free blocks: a list per size class, and where never-used memory starts.
struct Free {
    bump: usize,
    classes: Vec<Vec<usize>>,
    /// Bytes in blocks handed out and not returned.
    in_use: usize,
}

/// A process's heap of shared memory (see the module doc).
pub struct SharedHeap {
    base: NonNull<u8>,
    len: usize,
    free: Mutex<Free>,
    _backing: Box<dyn Backing>,
}

// SAFETY: the heap's memory is reached only through `HeapBuf`s, one per block at a time
// (handed out under `free`'s lock), and frozen blocks, which are only read; `_backing` is
// `Send + Sync`.
unsafe impl Send for SharedHeap {}
// SAFETY: as for `Send`.
unsafe impl Sync for SharedHeap {}

/// The size class of a block for `len` bytes, and the block's size.
fn class_of(len: usize) -> Option<(usize, usize)> {
    let size = len.max(MIN_BLOCK).checked_next_power_of_two()?;
    let class = (size.trailing_zeros() - MIN_BLOCK.trailing_zeros()) as usize;
    Some((class, size))
}

impl SharedHeap {
    /// A heap over `len` bytes at `base`, kept alive by `backing`.
    ///
    /// # Safety
    /// `base` must be valid for reads and writes of `len` bytes, 8-aligned, for as long as
    /// `backing` lives, and written by nothing in this process but this heap.
    pub unsafe fn from_raw(
        base: NonNull<u8>,
        len: usize,
        backing: Box<dyn Backing>,
    ) -> Arc<SharedHeap> {
        Arc::new(SharedHeap {
            base,
            len,
            free: Mutex::new(Free {
                bump: 0,
                classes: Vec::new(),
                in_use: 0,
            }),
            _backing: backing,
        })
    }

    /// A heap of `len` bytes of this process's own memory (tests, and Miri, use it as a
    /// mapping).
    pub fn on_heap(len: usize) -> Arc<SharedHeap> {
        let words: Box<[u64]> = vec![0u64; len.div_ceil(8)].into_boxed_slice();
        let raw = NonNull::from(Box::leak(words));
        let base = raw.cast::<u8>();
        // SAFETY: `raw` is a leaked box of at least `len` bytes, 8-aligned, owned by the
        // backing made here (which frees it last) and touched by nothing else.
        unsafe { SharedHeap::from_raw(base, len, Box::new(Owned(raw))) }
    }

    /// The addresses of its memory in this process.
    pub fn range(&self) -> Range<u64> {
        let start = self.base.as_ptr() as usize as u64;
        start..start + self.len as u64
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it has no memory.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes in blocks handed out and not returned (whole blocks).
    pub fn in_use(&self) -> usize {
        self.lock().in_use
    }

    /// Whether all of `b` lies in this heap.
    pub fn holds(&self, b: &[u8]) -> bool {
        let r = self.range();
        let start = b.as_ptr() as usize as u64;
        !b.is_empty() && start >= r.start && start.saturating_add(b.len() as u64) <= r.end
    }

    fn lock(&self) -> MutexGuard<'_, Free> {
        self.free.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A block for `len` bytes (its contents unspecified), or `None` if the heap has no room
    /// for one (or `len` is 0).
    pub fn alloc(self: &Arc<Self>, len: usize) -> Option<HeapBuf> {
        if len == 0 {
            return None;
        }
        let (class, size) = class_of(len)?;
        let mut f = self.lock();
        let off = match f.classes.get_mut(class).and_then(Vec::pop) {
            Some(off) => off,
            None => {
                let off = f.bump;
                let end = off.checked_add(size)?;
                if end > self.len {
                    return None;
                }
                f.bump = end;
                off
            }
        };
        f.in_use += size;
        Some(HeapBuf {
            heap: self.clone(),
            off,
            class,
            len,
        })
    }

    /// Takes back the block at `off` of `class`.
    fn give_back(&self, off: usize, class: usize) {
        let mut f = self.lock();
        if f.classes.len() <= class {
            f.classes.resize_with(class + 1, Vec::new);
        }
        f.classes[class].push(off);
        f.in_use = f.in_use.saturating_sub(MIN_BLOCK << class);
    }
}

/// One block of a [`SharedHeap`], `len` bytes of it the buffer's, written by its holder alone
/// until it is [`freeze`](HeapBuf::freeze)d.
pub struct HeapBuf {
    heap: Arc<SharedHeap>,
    off: usize,
    class: usize,
    len: usize,
}

impl HeapBuf {
    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no bytes (never: a block has at least one).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Its bytes, to fill (unspecified until written).
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: the block is in bounds (`alloc` checked `off + size <= len`, and `len` bytes
        // of it are the buffer's) and handed to this buffer alone until it is returned, which
        // only its drop or its frozen bytes' drop does; `&mut self` makes this the only access.
        unsafe { std::slice::from_raw_parts_mut(self.heap.base.as_ptr().add(self.off), self.len) }
    }

    /// Ends the writing: the bytes, shared and read-only; the block returns to the heap when
    /// the last share drops.
    pub fn freeze(self) -> Bytes {
        Bytes::from_owner(Frozen(self))
    }

    /// The heap it is from.
    pub fn heap(&self) -> &Arc<SharedHeap> {
        &self.heap
    }
}

impl Drop for HeapBuf {
    fn drop(&mut self) {
        self.heap.give_back(self.off, self.class);
    }
}

/// A frozen block, as the owner of a `Bytes`.
struct Frozen(HeapBuf);

impl AsRef<[u8]> for Frozen {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: in bounds (as in `bytes_mut`); frozen: its writer is gone (freezing consumed
        // it), so nothing writes it while it is shared.
        unsafe { std::slice::from_raw_parts(self.0.heap.base.as_ptr().add(self.0.off), self.0.len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_disjoint_reused_by_class_and_refused_past_the_end() {
        let heap = SharedHeap::on_heap(64 << 10);
        let mut a = heap.alloc(100).unwrap_or_else(|| panic!("room"));
        let mut b = heap.alloc(5000).unwrap_or_else(|| panic!("room"));
        a.bytes_mut().fill(1);
        b.bytes_mut().fill(2);
        let (a, b) = (a.freeze(), b.freeze());
        assert!(a.iter().all(|&x| x == 1) && b.iter().all(|&x| x == 2));
        assert!(heap.holds(&a) && heap.holds(&b) && !heap.holds(&[0u8; 4]));
        assert_eq!(heap.in_use(), MIN_BLOCK + 2 * MIN_BLOCK);
        let at = a.as_ptr();
        drop(a);
        assert_eq!(heap.in_use(), 2 * MIN_BLOCK);
        let c = heap.alloc(MIN_BLOCK).map(HeapBuf::freeze);
        assert_eq!(
            c.as_ref().map(|c| c.as_ptr()),
            Some(at),
            "the same class, reused"
        );
        assert!(heap.alloc(64 << 10).is_none(), "no room left for 64 KiB");
        assert!(heap.alloc(0).is_none());
        assert!(heap.alloc(usize::MAX).is_none());
        drop((b, c));
        assert_eq!(heap.in_use(), 0);
    }

    #[test]
    fn blocks_written_on_several_threads_read_back() {
        let heap = SharedHeap::on_heap(1 << 20);
        let got: Vec<Bytes> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4u8)
                .map(|k| {
                    let heap = heap.clone();
                    s.spawn(move || {
                        let mut b = heap.alloc(3000 + usize::from(k))?;
                        b.bytes_mut().fill(k + 1);
                        Some(b.freeze())
                    })
                })
                .collect();
            hs.into_iter()
                .filter_map(|h| h.join().ok().flatten())
                .collect()
        });
        assert_eq!(got.len(), 4);
        for (k, b) in got.iter().enumerate() {
            assert!(b.iter().all(|&x| usize::from(x) == k + 1));
        }
    }
}
