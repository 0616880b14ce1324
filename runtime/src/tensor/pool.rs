//! Recycled, aligned buffers for reduction results, joined outputs and received payloads, so
//! that a long collective does not allocate (and page-fault in) a fresh buffer for every chunk
//! it reduces, every output it assembles, or every segment a socket delivers.
//!
//! A [`PoolBuf`] is a `Vec<u64>` (8-aligned, so it can be viewed as any element type) that
//! becomes a `Bytes` without copying ([`PoolBuf::freeze`]). When the last `Bytes` that shares
//! it is dropped — on this rank, or on the peer it was sent to — the buffer goes back to the
//! pool it came from, as long as the pool holds less than its limit.
//!
//! Like the payload buffers it recycles, the pool stays outside the loom model: it uses
//! `std::sync` (`crate::sync::unmodelled`), not the modelled types of the facade.

use crate::sync::unmodelled::{Mutex, MutexGuard};
use bytes::Bytes;
use std::sync::Arc;

struct Free {
    bufs: Vec<Vec<u64>>,
    bytes: usize,
    limit: usize,
}

fn lock(m: &Mutex<Free>) -> MutexGuard<'_, Free> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A pool of buffers, shared by the buffers it hands out.
#[derive(Clone)]
pub struct Pool {
    free: Option<Arc<Mutex<Free>>>,
}

impl Pool {
    /// A pool that keeps at most `limit` bytes of free buffers.
    pub fn new(limit: usize) -> Pool {
        Pool {
            free: Some(Arc::new(Mutex::new(Free {
                bufs: Vec::new(),
                bytes: 0,
                limit,
            }))),
        }
    }

    /// No pool: every buffer is a fresh allocation, freed when dropped.
    pub fn none() -> Pool {
        Pool { free: None }
    }

    /// A buffer of `len` bytes; its contents are unspecified (the caller overwrites them).
    pub fn take(&self, len: usize) -> PoolBuf {
        let words = len.div_ceil(8);
        let reused = self.free.as_ref().and_then(|f| {
            let mut f = lock(f);
            // A buffer at least as large, and not more than twice as large (plus a little).
            let i = f
                .bufs
                .iter()
                .position(|b| b.len() >= words && b.len() <= 2 * words + 8)?;
            let b = f.bufs.swap_remove(i);
            f.bytes -= b.len() * 8;
            Some(b)
        });
        let words = reused.unwrap_or_else(|| super::pages::filled(words, 0u64));
        PoolBuf {
            words,
            len,
            home: self.free.clone(),
        }
    }

    /// Bytes held free (for tests).
    #[cfg(test)]
    pub(crate) fn free_bytes(&self) -> usize {
        self.free.as_ref().map_or(0, |f| lock(f).bytes)
    }
}

/// A buffer from a [`Pool`]: 8-aligned, so its bytes can be viewed as any element type.
pub struct PoolBuf {
    words: Vec<u64>,
    len: usize,
    home: Option<Arc<Mutex<Free>>>,
}

impl PoolBuf {
    /// The first `n` elements of type `T` (`n * size_of::<T>() <= len`).
    pub(crate) fn typed_mut<T: bytemuck::Pod>(&mut self, n: usize) -> Option<&mut [T]> {
        let all: &mut [T] = bytemuck::try_cast_slice_mut(self.words.as_mut_slice()).ok()?;
        all.get_mut(..n)
    }

    /// Its bytes, to fill.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        let len = self.len;
        let all: &mut [u8] = bytemuck::cast_slice_mut(self.words.as_mut_slice());
        let n = len.min(all.len());
        &mut all[..n]
    }

    /// Shares the buffer as `Bytes` (no copy); it returns to the pool when the last share is
    /// dropped.
    pub fn freeze(self) -> Bytes {
        if self.len == 0 {
            return Bytes::new();
        }
        Bytes::from_owner(self)
    }
}

impl AsRef<[u8]> for PoolBuf {
    fn as_ref(&self) -> &[u8] {
        let all: &[u8] = bytemuck::cast_slice(self.words.as_slice());
        &all[..self.len.min(all.len())]
    }
}

impl Drop for PoolBuf {
    fn drop(&mut self) {
        let Some(home) = self.home.take() else { return };
        let size = self.words.len() * 8;
        let mut f = lock(&home);
        if size > 0 && f.bytes + size <= f.limit {
            f.bytes += size;
            f.bufs.push(std::mem::take(&mut self.words));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_come_back_when_the_last_share_drops() {
        let pool = Pool::new(1 << 20);
        let mut b = pool.take(4000);
        let p = b
            .typed_mut::<f32>(1000)
            .map(|s| s.as_ptr() as usize)
            .unwrap_or(0);
        let shared = b.freeze();
        let clone = shared.clone();
        drop(shared);
        assert_eq!(pool.free_bytes(), 0, "still shared");
        drop(clone);
        assert_eq!(pool.free_bytes(), 4000);
        let mut again = pool.take(3999);
        assert_eq!(
            again.typed_mut::<f32>(999).map(|s| s.as_ptr() as usize),
            Some(p),
            "the same memory"
        );
        assert_eq!(pool.free_bytes(), 0);
        drop(again);
        // Too small a request for the free buffer: a new one.
        let small = pool.take(16);
        assert_eq!(small.as_ref().len(), 16);
    }

    #[test]
    fn the_limit_bounds_what_the_pool_keeps() {
        let pool = Pool::new(100);
        drop(pool.take(800).freeze());
        assert_eq!(pool.free_bytes(), 0, "over the limit: freed, not kept");
        drop(pool.take(96).freeze());
        assert_eq!(pool.free_bytes(), 96);
        assert!(Pool::none().take(8).typed_mut::<u8>(8).is_some());
    }
}
