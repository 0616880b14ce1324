//! The one place that picks `std` or loom synchronization, as tokio's `src/loom/` does.
//! Built with `RUSTFLAGS="--cfg collectix_loom"`, every lock, condition variable and atomic of
//! the runtime comes from loom, which then explores their interleavings. Payload buffers are
//! plain `bytes::Bytes` and stay outside the model.

#[cfg(collectix_loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicUsize, Ordering};
#[cfg(collectix_loom)]
pub(crate) use loom::sync::{Arc, Condvar, Mutex, MutexGuard};

#[cfg(not(collectix_loom))]
pub(crate) use std::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicUsize, Ordering};
#[cfg(not(collectix_loom))]
pub(crate) use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// Locks, ignoring poisoning: a panic elsewhere must not turn into a panic here.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    #[cfg(collectix_loom)]
    {
        m.lock().unwrap_or_else(|e| e.into_inner())
    }
    #[cfg(not(collectix_loom))]
    {
        m.lock().unwrap_or_else(|e| e.into_inner())
    }
}
