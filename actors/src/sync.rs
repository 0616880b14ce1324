//! Locking that ignores poisoning: the one place the crate's locks are taken from.
//!
//! A panic elsewhere (in user code run on a rank's thread, say) must not turn into a panic
//! here: the state each of the crate's locks guards stays whole between its statements, so
//! a poisoned lock is taken as it is.

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, ignoring poisoning (see the module doc).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
