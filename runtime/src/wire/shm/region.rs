//! [`Region`]: a span of memory shared with other processes, read and written only through
//! bounds-checked accessors. This module is the shared-memory transport's only `unsafe`
//! code on the runtime's side (the mapping itself, an OS call, lives in the actors crate);
//! CI runs its tests and the ring's under Miri, on heap-backed regions
//! (`cargo +nightly miri test -p collectix-runtime --lib wire::shm`).
//!
//! **The safety argument.** A region is `len` bytes at `ptr`, valid (mapped, or owned on the
//! heap) for the region's whole life, and 64-aligned. Nothing ever forms a `&[u8]` or `&mut
//! [u8]` over it: other processes may write any byte at any time, so the region is only
//! touched through raw-pointer copies ([`Region::read`], [`Region::write`]) and through
//! atomics ([`Region::u32`], [`Region::u64`]) at aligned offsets. Every offset and length
//! is checked against `len` first (with checked arithmetic); a bad one is `None` or `false`,
//! never an access. A peer that writes garbage can thus only give this process wrong bytes or
//! wrong counters, which the ring checks ([`super::ring`]) before it trusts them; it can never
//! make this process read or write outside the region.
//!
//! The ring protocol gives each data byte one writer at a time and publishes it with a
//! release store that the reader acquires, so between honest processes the plain copies never
//! race (Miri's data race detector checks this on the heap-backed rings of the tests). A
//! hostile or broken peer can still write bytes while this process copies them: in Rust's
//! memory model that is a data race, which no check here can rule out for memory another
//! process maps. What bounds its effect: the copies go through raw pointers into this
//! process's own buffers (the compiler never holds a reference to the region's bytes, so it
//! cannot assume they are stable), every byte pattern is a valid `u8`, and everything read is
//! checked after the copy, never parsed in place. The worst outcome is wrong bytes, which the
//! codec's checks turn into a lost peer or, in a payload, wrong data from a peer that sent
//! wrong data.

#![allow(unsafe_code)]

use crate::sync::unmodelled::{AtomicU32, AtomicU64};
use std::ptr::NonNull;

/// The alignment of a region's start (a cache line).
pub const REGION_ALIGN: usize = 64;

/// What keeps a region's memory alive, and frees it.
pub trait Backing: Send + Sync + 'static {}

/// Heap memory posing as a mapping (tests, Miri): the lines of a leaked box, freed when
/// dropped.
struct Heap(NonNull<[Line]>);

// SAFETY: `Heap` owns its lines (a box turned into a raw pointer) and only frees them.
unsafe impl Send for Heap {}
// SAFETY: `Heap` has no methods that read or write the lines.
unsafe impl Sync for Heap {}
impl Backing for Heap {}

impl Drop for Heap {
    fn drop(&mut self) {
        // SAFETY: the pointer came from `Box::leak` in `Region::heap` and is freed only
        // here, once; the region that pointed into it is being dropped (it owns this backing).
        drop(unsafe { Box::from_raw(self.0.as_ptr()) });
    }
}

/// One cache line of zeroes: the heap backing's unit (gives 64-byte alignment).
#[repr(C, align(64))]
struct Line([AtomicU64; 8]);

/// A span of shared memory (see the module doc).
pub struct Region {
    ptr: NonNull<u8>,
    len: usize,
    /// Keeps the memory alive (a mapping's owner unmaps when dropped).
    _backing: Box<dyn Backing>,
}

// SAFETY: a region is only accessed through raw-pointer copies and atomics (never through
// references to plain bytes), so sharing it between threads cannot create aliasing
// references; `backing` is `Send + Sync`.
unsafe impl Send for Region {}
// SAFETY: as for `Send`.
unsafe impl Sync for Region {}

impl Region {
    /// A zeroed region of `len` bytes on the heap (rounded up to whole cache lines): the
    /// rings' tests, and Miri, use it as a mapping.
    pub fn heap(len: usize) -> Region {
        let lines = len.div_ceil(REGION_ALIGN).max(1);
        let mem: Box<[Line]> = (0..lines)
            .map(|_| Line(std::array::from_fn(|_| AtomicU64::new(0))))
            .collect();
        // A raw pointer from a leaked box (never a box that later moves, which would retag
        // it): valid for reads and writes until `Heap` frees it.
        let lines = NonNull::from(Box::leak(mem));
        Region {
            ptr: lines.cast::<u8>(),
            len,
            _backing: Box::new(Heap(lines)),
        }
    }

    /// The region of `len` bytes at `ptr`, kept alive by `backing`.
    ///
    /// # Safety
    /// `ptr` must be 64-aligned and valid for reads and writes of `len` bytes for as long as
    /// `backing` lives (a shared mapping that `backing` unmaps when dropped), and nothing in
    /// this process may hold a reference to those bytes.
    pub unsafe fn from_raw(ptr: NonNull<u8>, len: usize, backing: Box<dyn Backing>) -> Region {
        Region {
            ptr,
            len,
            _backing: backing,
        }
    }

    /// The region's length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether `[at, at + n)` lies inside the region and `at` is a multiple of `align`.
    fn fits(&self, at: usize, n: usize, align: usize) -> bool {
        at.checked_add(n).is_some_and(|end| end <= self.len) && at.is_multiple_of(align)
    }

    /// The `u32` at byte `at` (4-aligned, inside the region), as an atomic.
    pub fn u32(&self, at: usize) -> Option<&AtomicU32> {
        if !self.fits(at, 4, 4) {
            return None;
        }
        // SAFETY: `[at, at + 4)` is inside the region (checked above), which is valid for the
        // region's life (`from_raw`'s contract, or the heap box); the address is 4-aligned (the
        // region is 64-aligned and `at` a multiple of 4); an atomic may alias memory that other
        // processes write, and no reference to plain bytes ever covers it.
        Some(unsafe { &*self.ptr.as_ptr().add(at).cast::<AtomicU32>() })
    }

    /// The `u64` at byte `at` (8-aligned, inside the region), as an atomic.
    pub fn u64(&self, at: usize) -> Option<&AtomicU64> {
        if !self.fits(at, 8, 8) {
            return None;
        }
        // SAFETY: as in `u32`, with 8 bytes at an 8-aligned address.
        Some(unsafe { &*self.ptr.as_ptr().add(at).cast::<AtomicU64>() })
    }

    /// Copies `src` into the region at byte `at`; `false` (and nothing written) if it does
    /// not fit.
    pub fn write(&self, at: usize, src: &[u8]) -> bool {
        if !self.fits(at, src.len(), 1) {
            return false;
        }
        // SAFETY: the destination `[at, at + len)` is inside the region (checked), valid for
        // writes for the region's life; `src` is a slice of this process's own memory, never
        // inside a region (no reference to a region's bytes exists), so they do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.as_ptr().add(at), src.len());
        }
        true
    }

    /// Copies the region's bytes at `at` into `dst`; `false` (and nothing read) if they are
    /// not all inside it.
    pub fn read(&self, at: usize, dst: &mut [u8]) -> bool {
        if !self.fits(at, dst.len(), 1) {
            return false;
        }
        // SAFETY: the source `[at, at + len)` is inside the region (checked), valid for reads;
        // `dst` is this process's own memory, not inside a region, so they do not overlap.
        // The bytes may be anything a peer wrote: they are copied as plain bytes, and every
        // byte pattern is a valid `u8`.
        unsafe {
            std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(at), dst.as_mut_ptr(), dst.len());
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sync::unmodelled::Ordering;

    #[test]
    fn every_access_outside_the_region_or_misaligned_is_refused() {
        let r = Region::heap(100);
        assert_eq!(r.len(), 100);
        assert!(r.u32(96).is_some());
        assert!(r.u32(97).is_none(), "misaligned");
        assert!(r.u32(100).is_none(), "past the end");
        assert!(r.u64(88).is_some());
        assert!(r.u64(96).is_none(), "straddles the end");
        assert!(r.u64(usize::MAX - 3).is_none(), "overflowing offset");
        assert!(!r.write(99, &[1, 2]));
        assert!(!r.write(usize::MAX, &[1]));
        let mut two = [0u8; 2];
        assert!(!r.read(99, &mut two));
        assert!(r.write(98, &[7, 9]));
        assert!(r.read(98, &mut two));
        assert_eq!(two, [7, 9]);
        // Empty copies at the very end are fine.
        assert!(r.write(100, &[]));
        assert!(r.read(100, &mut []));
    }

    #[test]
    fn atomics_and_bytes_see_the_same_memory() {
        let r = Region::heap(64);
        r.write(8, &0x0102_0304_0506_0708u64.to_le_bytes());
        assert_eq!(
            r.u64(8).map(|a| a.load(Ordering::Relaxed)),
            Some(0x0102_0304_0506_0708)
        );
        if let Some(a) = r.u32(16) {
            a.store(0xAABB_CCDD, Ordering::Relaxed);
        }
        let mut b = [0u8; 4];
        r.read(16, &mut b);
        assert_eq!(u32::from_le_bytes(b), 0xAABB_CCDD);
    }
}
