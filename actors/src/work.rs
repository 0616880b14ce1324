//! [`Work`]: the handle of a call in flight (torch's `Work`, from `async_op=True`).

use collectix_runtime::completion::{slot, Completer, Waiter};
use collectix_runtime::{Error, Result};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::thread::ThreadId;
use std::time::Duration;

/// A call in flight. The call was issued (and took its place in the group's order) when the
/// method returned; it progresses whether or not anyone polls this handle.
///
/// - `.await` it (it is a `Future`, usable from any async runtime), or
/// - [`wait`](Work::wait) for it from ordinary threads, or poll with
///   [`is_completed`](Work::is_completed) / [`wait_timeout`](Work::wait_timeout).
///
/// Dropping a `Work` detaches it: the call still completes on this rank, so the group stays
/// in step; only its result is dropped.
#[must_use = "a dropped Work detaches the call; await or wait it to see its result"]
pub struct Work<T> {
    waiter: Waiter<T>,
    /// Threads that run ranks of the world: blocking there would stop a rank.
    rank_threads: Arc<[ThreadId]>,
}

/// What completes a [`Work`]: takes the engine's output (boxed so the rank actor can hold
/// completers of every type in one map).
pub(crate) type Done<I> = Box<dyn FnOnce(Result<I>) + Send>;

impl<T: Send + 'static> Work<T> {
    /// A new handle and the function that completes it from an `I`, mapped by `map`.
    pub(crate) fn pair<I: 'static>(
        rank_threads: Arc<[ThreadId]>,
        map: impl FnOnce(I) -> Result<T> + Send + 'static,
    ) -> (Done<I>, Work<T>) {
        let (c, w) = slot::<T>();
        // `map` is user code on the rank's thread (a `Deserialize` impl in the object
        // collectives): a panic in it fails this call with `Error::Panic`, and the rank
        // carries on.
        let done: Done<I> =
            Box::new(move |r: Result<I>| c.complete(r.and_then(|i| guarded(|| map(i)))));
        (
            done,
            Work {
                waiter: w,
                rank_threads,
            },
        )
    }

    /// A new handle and its raw completer.
    pub(crate) fn raw(rank_threads: Arc<[ThreadId]>) -> (Completer<T>, Work<T>) {
        let (c, w) = slot::<T>();
        (
            c,
            Work {
                waiter: w,
                rank_threads,
            },
        )
    }

    /// A handle that is already complete.
    pub(crate) fn ready(rank_threads: Arc<[ThreadId]>, v: Result<T>) -> Work<T> {
        let (c, w) = Work::raw(rank_threads);
        c.complete(v);
        w
    }
}

impl<T> Work<T> {
    fn on_rank_thread(&self) -> bool {
        self.rank_threads.contains(&std::thread::current().id())
    }

    /// Whether the call has finished (successfully or not).
    pub fn is_completed(&self) -> bool {
        self.waiter.is_completed()
    }

    /// Blocks until the call finishes. On a thread that runs a rank of the same world this
    /// would deadlock, so it returns [`Error::WouldDeadlock`] there instead.
    pub fn wait(self) -> Result<T> {
        if self.on_rank_thread() {
            return Err(Error::WouldDeadlock);
        }
        self.waiter.wait()
    }

    /// Blocks for at most `d`: `Some(result)` if the call finished, `None` if it is still
    /// running (the handle stays usable).
    pub fn wait_timeout(&self, d: Duration) -> Option<Result<T>> {
        if self.on_rank_thread() {
            return Some(Err(Error::WouldDeadlock));
        }
        self.waiter.wait_timeout(d)
    }
}

impl<T> Future for Work<T> {
    type Output = Result<T>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<T>> {
        self.waiter.poll(cx)
    }
}

impl<T> std::fmt::Debug for Work<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Work")
            .field("completed", &self.is_completed())
            .finish()
    }
}

/// Runs user code that collectix calls on a rank's thread (a `Deserialize` impl, a map of a
/// result): a panic in it becomes [`Error::Panic`] for this call instead of unwinding
/// through the rank.
pub(crate) fn guarded<R>(f: impl FnOnce() -> Result<R>) -> Result<R> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
        .unwrap_or_else(|p| Err(Error::from_panic("your code", p.as_ref())))
}
