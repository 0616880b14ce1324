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

/// What stays outside the loom model, always `std`'s, each for a reason:
/// - the words of memory shared with other processes (`wire::shm`'s region, the board's
///   lanes in a segment): loom has no memory that another process writes. The code that
///   uses them is generic over its memory (`wire::shm::Memory`, `board::Lane`), and the
///   loom models run it over loom's atomics instead;
/// - the payload buffers' pool, arena and shared heap, and the caller-owned destinations of
///   a call (`tensor::pool`, `tensor::arena`, `tensor::shared_heap`, `collective::dest`):
///   payloads stay outside the model, as `bytes::Bytes` does;
/// - the landings of a rank's calls (`landing`): where payload bytes go, as the arena;
/// - caches whose locks guard no protocol decision (`schedule`'s built schedules,
///   `data_plane`'s arenas by call);
/// - the engine's board epoch: the runtime only counts it up (under the engine's lock), and
///   its reader, a caller's quick path deciding whether to ask the engine again, lives in
///   the actors crate, which is not built under loom. (An engine dropped while a deadlock
///   model unwinds would also take a loom atomic out of its execution, which aborts.)
///
/// Everything else (the engine, the board, the inbox, the completion slot) takes the
/// modelled types above.
pub(crate) mod unmodelled {
    pub(crate) use std::sync::atomic::{fence, AtomicU32, AtomicU64, AtomicUsize, Ordering};
    pub(crate) use std::sync::{Mutex, MutexGuard};
}
