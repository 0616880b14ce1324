//! [`Work`]: the handle of a call in flight (torch's `Work`, from `async_op=True`).

use crate::metrics::Probe;
use crate::rank::driver::{Done, Driver};
use collectix_runtime::completion::{slot, Completer, Waiter};
use collectix_runtime::{Error, Result};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::thread::ThreadId;
use std::time::Duration;

/// The threads that run a world's ranks (blocking on one would stop a rank), one copy per
/// rank, on cache lines of its own: every call clones and drops its rank's, and two ranks'
/// counts on one line (small allocations made one after another lie side by side) would move
/// that line between their cores on each call.
#[repr(align(128))]
pub(crate) struct RankThreads(pub(crate) Box<[ThreadId]>);

impl RankThreads {
    /// The threads, as a handle a rank shares with its calls.
    pub(crate) fn shared(threads: &[ThreadId]) -> Arc<RankThreads> {
        Arc::new(RankThreads(threads.into()))
    }

    /// Whether the calling thread is one of them (only a thread that runs rank actors can
    /// be: others are told apart by a thread-local flag, without asking for their id).
    pub(crate) fn is_current(&self) -> bool {
        crate::rank::rank_thread().is_some_and(|me| self.0.contains(&me))
    }
}

/// A call in flight. The call was issued (and took its place in the group's order) when the
/// method returned; it progresses whether or not anyone polls this handle.
///
/// - `.await` it (it is a `Future`, usable from any async runtime), or
/// - [`wait`](Work::wait) for it from ordinary threads, or poll with
///   [`is_completed`](Work::is_completed) / [`wait_timeout`](Work::wait_timeout).
///
/// Dropping a `Work` detaches it: the call still completes on this rank, so the group stays
/// in step; only its result is dropped.
///
/// Waiting makes progress: [`wait`](Work::wait), [`wait_timeout`](Work::wait_timeout) and the
/// first poll of the future drive the rank on the waiting thread (they take the rank's
/// arrivals and run its engine) for up to the rank's spin budget (`COLLECTIX_SPIN_US`;
/// 50 µs by default in one process, 200 µs over TCP), so a short call completes with no
/// thread hand-off; a longer one then parks (blocks, or returns `Pending`) and the rank's
/// actor finishes it.
#[must_use = "a dropped Work detaches the call; await or wait it to see its result"]
pub struct Work<T> {
    state: State<T>,
    /// The future was polled before (later polls do not spin).
    polled: bool,
    /// The call's metrics, reported when its result is taken (`None` when no recorder is
    /// installed: see `metrics.rs`).
    probe: std::sync::Mutex<Option<Box<Probe>>>,
}

/// Where a [`Work`]'s result is.
enum State<T> {
    /// Known when the handle was made (a call refused by its checks, or one that finished on
    /// its caller's quick path): held here until it is taken, with no completion slot.
    Ready(std::sync::Mutex<Option<Result<T>>>),
    /// To come through a completion slot.
    InFlight {
        waiter: Waiter<T>,
        /// Threads that run ranks of the world: blocking there would stop a rank.
        rank_threads: Arc<RankThreads>,
        /// The rank a waiting caller drives (none for a handle no engine call stands
        /// behind).
        driver: Option<Arc<Driver>>,
    },
}

/// What a second take of a result gets.
fn taken<T>() -> Result<T> {
    Err(Error::invalid("the result was already taken"))
}

impl<T: Send + 'static> Work<T> {
    /// A new handle and the function that completes it from an `I`, mapped by `map`.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn pair<I: 'static>(
        rank_threads: Arc<RankThreads>,
        map: impl FnOnce(I) -> Result<T> + Send + 'static,
    ) -> (Done<I>, Work<T>) {
        let (c, w) = Work::raw(rank_threads);
        // `map` is user code on the rank's thread (a `Deserialize` impl in the object
        // collectives): a panic in it fails this call with `Error::Panic`, and the rank
        // carries on.
        let done: Done<I> =
            Box::new(move |r: Result<I>| c.complete(r.and_then(|i| guarded(|| map(i)))));
        (done, w)
    }

    /// [`pair`](Self::pair) for a call with a place in its group's order: `open` is counted
    /// finished before the handle completes.
    pub(crate) fn pair_open<I: 'static>(
        rank_threads: Arc<RankThreads>,
        open: crate::member::Open,
        map: impl FnOnce(I) -> Result<T> + Send + 'static,
    ) -> (Done<I>, Work<T>) {
        let (c, w) = Work::raw(rank_threads);
        let done: Done<I> = Box::new(move |r: Result<I>| {
            drop(open);
            c.complete(r.and_then(|i| guarded(|| map(i))));
        });
        (done, w)
    }

    /// A new handle and its raw completer.
    pub(crate) fn raw(rank_threads: Arc<RankThreads>) -> (Completer<T>, Work<T>) {
        let (c, waiter) = slot::<T>();
        (
            c,
            Work {
                state: State::InFlight {
                    waiter,
                    rank_threads,
                    driver: None,
                },
                polled: false,
                probe: std::sync::Mutex::new(None),
            },
        )
    }

    /// A handle that is already complete, with `v`.
    pub(crate) fn ready(v: Result<T>) -> Work<T> {
        Work {
            state: State::Ready(std::sync::Mutex::new(Some(v))),
            polled: false,
            probe: std::sync::Mutex::new(None),
        }
    }
}

impl<T> Work<T> {
    /// This handle, reporting its call's metrics through `probe` when its result is taken.
    pub(crate) fn measured(self, probe: Option<Box<Probe>>) -> Work<T> {
        Work {
            probe: std::sync::Mutex::new(probe),
            ..self
        }
    }

    /// [`report`](Self::report) through a handle held exclusively: no lock.
    fn report_owned(probe: &mut std::sync::Mutex<Option<Box<Probe>>>, result: &Result<T>) {
        let probe = probe
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(p) = probe.take() {
            p.finish(result);
        }
    }

    /// Reports the call's metrics, once, with its `result` (through a shared handle:
    /// `wait_timeout`).
    fn report(&self, result: &Result<T>) {
        if let Some(p) = crate::sync::lock(&self.probe).take() {
            p.finish(result);
        }
    }

    fn on_rank_thread(&self) -> bool {
        match &self.state {
            State::InFlight { rank_threads, .. } => rank_threads.is_current(),
            // Nothing to block on.
            State::Ready(_) => false,
        }
    }

    /// This handle, waited for by driving `driver`'s rank (the rank its call runs on).
    pub(crate) fn driven_by(mut self, d: Arc<Driver>) -> Work<T> {
        if let State::InFlight { driver, .. } = &mut self.state {
            *driver = Some(d);
        }
        self
    }

    /// Drives the rank until the call completes, for at most `limit`, parking once nothing
    /// arrived for the rank's spin budget.
    fn drive(&self, limit: Duration) {
        if let State::InFlight {
            waiter,
            driver: Some(d),
            ..
        } = &self.state
        {
            d.drive_until(&|| waiter.is_completed(), d.spin(), limit);
        }
    }

    /// Whether the call has finished (successfully or not).
    pub fn is_completed(&self) -> bool {
        match &self.state {
            State::Ready(_) => true,
            State::InFlight { waiter, driver, .. } => {
                if let Some(d) = driver {
                    // A call on a board is finished by whoever looks (see
                    // `rank::driver::board`).
                    d.board_progress();
                }
                waiter.is_completed()
            }
        }
    }

    /// Takes a ready handle's result.
    fn take_ready(r: &std::sync::Mutex<Option<Result<T>>>) -> Result<T> {
        crate::sync::lock(r).take().unwrap_or_else(taken)
    }

    /// Blocks until the call finishes. On a thread that runs a rank of the same world this
    /// would deadlock, so it returns [`Error::WouldDeadlock`] there instead (unless the call
    /// has finished already).
    pub fn wait(mut self) -> Result<T> {
        if self.on_rank_thread() {
            return Err(Error::WouldDeadlock);
        }
        self.drive(Duration::MAX);
        match std::mem::take(
            self.probe
                .get_mut()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        ) {
            // The result goes straight out (no copy of it kept for the report).
            None => Self::wait_state(self.state),
            Some(p) => {
                let result = Self::wait_state(self.state);
                p.finish(&result);
                result
            }
        }
    }

    /// The result `state` holds or will hold, waited for.
    #[inline(always)]
    fn wait_state(state: State<T>) -> Result<T> {
        match state {
            // Owned: no lock to take.
            State::Ready(r) => r
                .into_inner()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .unwrap_or_else(taken),
            State::InFlight { waiter, driver, .. } => {
                if let Some(d) = &driver {
                    d.sleep_until(&|| waiter.is_completed());
                }
                waiter.wait()
            }
        }
    }

    /// Blocks for at most `d`: `Some(result)` if the call finished, `None` if it is still
    /// running (the handle stays usable).
    pub fn wait_timeout(&self, d: Duration) -> Option<Result<T>> {
        if self.on_rank_thread() {
            return Some(Err(Error::WouldDeadlock));
        }
        let start = std::time::Instant::now();
        self.drive(d);
        let result = match &self.state {
            State::Ready(r) => Some(Self::take_ready(r)),
            State::InFlight { waiter, .. } => waiter.wait_timeout(
                d.saturating_sub(start.elapsed())
                    .max(Duration::from_nanos(1)),
            ),
        };
        if let Some(r) = &result {
            self.report(r);
        }
        result
    }
}

// The result is never pinned: a poll only moves it out.
impl<T> Unpin for Work<T> {}

impl<T> Future for Work<T> {
    type Output = Result<T>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<T>> {
        let this = self.get_mut();
        let on_rank_thread = this.on_rank_thread();
        let (waiter, driver) = match &mut this.state {
            State::Ready(r) => {
                let r = r
                    .get_mut()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                let r = r.take().unwrap_or_else(taken);
                Self::report_owned(&mut this.probe, &r);
                return Poll::Ready(r);
            }
            State::InFlight { waiter, driver, .. } => (&*waiter, &*driver),
        };
        if let Some(d) = driver {
            // The first poll drives the rank for up to its spin budget (as `wait` does); a
            // later one (after a wake-up) takes what arrived, if nobody else is at it. On a
            // rank's own thread, never spin: that thread is a rank's background driver.
            if !this.polled && !on_rank_thread {
                d.drive_until(&|| waiter.is_completed(), d.spin(), d.spin());
            } else {
                d.poke();
            }
        }
        this.polled = true;
        let polled = waiter.poll(cx);
        if let Poll::Ready(r) = &polled {
            Self::report_owned(&mut this.probe, r);
        }
        polled
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
