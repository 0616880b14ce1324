//! One rank's runtime: the [`Driver`](driver::Driver) that holds its engine behind a lock
//! (the hot path every transport and caller shares), the actix actor that drives it when no
//! caller does ([`actor`]), and the actix system the actors run on ([`system`]).
//!
//! The driver knows nothing of the actor above it: it wakes it through a
//! `Recipient<Kick>`, so the arrows run one way, actor → driver.

pub(crate) mod actor;
pub(crate) mod driver;
pub(crate) mod system;

thread_local! {
    /// This thread's id if it runs rank actors (an arbiter of a rank system).
    static RANK_THREAD: std::cell::Cell<Option<std::thread::ThreadId>> =
        const { std::cell::Cell::new(None) };
}

/// Marks the calling thread as one that runs rank actors (`system::start`).
pub(crate) fn mark_rank_thread() {
    RANK_THREAD.with(|f| f.set(Some(std::thread::current().id())));
}

/// Whether the calling thread runs rank actors: a caller there must not spin for its peers
/// (the thread is a rank's background driver), as a `Work` polled there does not.
pub(crate) fn on_rank_thread() -> bool {
    rank_thread().is_some()
}

/// The calling thread's id if it runs rank actors (read without asking the thread for it).
pub(crate) fn rank_thread() -> Option<std::thread::ThreadId> {
    RANK_THREAD.with(std::cell::Cell::get)
}
