//! What a segment needs of memory ([`Memory`]): atomic words for its counters and flags, and
//! byte copies for its data. [`Region`](super::Region), memory shared with other processes,
//! is the one of production; the loom models give the same ring code a memory of loom atomics
//! and cells (`loom_models::ring`), so that loom explores the orderings the ring relies on.

use crate::sync::unmodelled::{fence, AtomicU32, AtomicU64, Ordering};

/// An atomic word of a [`Memory`].
pub trait Word<T>: Send + Sync {
    /// A word holding zero (outside any memory: a stand-in).
    fn zero() -> Self;
    /// Loads the word.
    fn load(&self, order: Ordering) -> T;
    /// Stores `v`.
    fn store(&self, v: T, order: Ordering);
    /// Stores `v`, returning what was there.
    fn swap(&self, v: T, order: Ordering) -> T;
    /// Adds `v` (wrapping), returning what was there.
    fn fetch_add(&self, v: T, order: Ordering) -> T;
}

/// Memory a segment lives in. Every accessor is checked: an offset outside it (or not aligned)
/// is `None` or `false`, never an access.
pub trait Memory: Send + Sync + 'static {
    /// Its 32-bit words.
    type W32: Word<u32>;
    /// Its 64-bit words.
    type W64: Word<u64>;
    /// Its size in bytes.
    fn len(&self) -> usize;
    /// Whether it has no bytes.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The `u32` at byte `at` (4-aligned).
    fn u32(&self, at: usize) -> Option<&Self::W32>;
    /// The `u64` at byte `at` (8-aligned).
    fn u64(&self, at: usize) -> Option<&Self::W64>;
    /// Copies `src` in at byte `at`; `false` (nothing written) if it does not fit.
    fn write(&self, at: usize, src: &[u8]) -> bool;
    /// Copies the bytes at `at` into `dst`; `false` (nothing read) if they do not fit.
    fn read(&self, at: usize, dst: &mut [u8]) -> bool;
    /// A fence of the same model as the words.
    fn fence(&self, order: Ordering);
}

macro_rules! std_word {
    ($atomic:ty, $t:ty) => {
        impl Word<$t> for $atomic {
            fn zero() -> Self {
                <$atomic>::new(0)
            }
            fn load(&self, order: Ordering) -> $t {
                <$atomic>::load(self, order)
            }
            fn store(&self, v: $t, order: Ordering) {
                <$atomic>::store(self, v, order)
            }
            fn swap(&self, v: $t, order: Ordering) -> $t {
                <$atomic>::swap(self, v, order)
            }
            fn fetch_add(&self, v: $t, order: Ordering) -> $t {
                <$atomic>::fetch_add(self, v, order)
            }
        }
    };
}

std_word!(AtomicU32, u32);
std_word!(AtomicU64, u64);

impl Memory for super::Region {
    type W32 = AtomicU32;
    type W64 = AtomicU64;
    fn len(&self) -> usize {
        super::Region::len(self)
    }
    fn u32(&self, at: usize) -> Option<&AtomicU32> {
        super::Region::u32(self, at)
    }
    fn u64(&self, at: usize) -> Option<&AtomicU64> {
        super::Region::u64(self, at)
    }
    fn write(&self, at: usize, src: &[u8]) -> bool {
        super::Region::write(self, at, src)
    }
    fn read(&self, at: usize, dst: &mut [u8]) -> bool {
        super::Region::read(self, at, dst)
    }
    fn fence(&self, order: Ordering) {
        fence(order)
    }
}
