//! Supervised ranks in one process (as actix supervises actors, and as `collectix launch`
//! handles processes): [`World::run`] runs a body per rank, and a rank whose body panics or
//! returns an error is handled by a [`Policy`] with the launcher's names: `Stop` stops every
//! rank, `Shrink` lets the others go on without it (they hear of it at once, as of a killed
//! process, and shrink their groups), `Restart` starts it again as a new incarnation (as
//! `--max-restarts` does), which rejoins the others while they regrow their group.

use crate::comm::Communicator;
use crate::work::guarded;
use crate::world::World;
use collectix_runtime::{Error, Result};
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::{mpsc, Arc};
use std::task::{Context, Poll};

/// What a failed rank does to the others (`collectix launch --on-failure` names the same).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// Every other rank is stopped too: its pending and later calls fail with
    /// `Error::Shutdown` at once (without supervision, they wait out their timeout).
    Stop,
    /// The failed rank dies as a killed process would ([`World::kill`]): the others' calls
    /// that need it fail at once with `Error::PeerLost`, and they go on without it (with
    /// `Communicator::shrink`).
    Shrink,
    /// The failed rank is killed and started again as a new incarnation
    /// ([`World::restart`]), at most this many times per rank (then as `Shrink`); its body
    /// runs again with the new incarnation's world communicator, whose
    /// [`incarnation`](Communicator::incarnation) says it is a restart: it joins the others
    /// with [`Communicator::rejoin`], while they, hearing of the loss, call
    /// [`Communicator::regrow`] and send it the state (`collectix launch --max-restarts N`
    /// does the same with processes).
    Restart(u32),
}

impl World {
    /// Runs `body` for every rank at once, each on a thread of its own with the rank's world
    /// communicator, and returns each rank's result, in rank order (a restarted rank's: its
    /// last incarnation's). A body that panics (its result is `Error::Panic`) or returns an
    /// error is handled by `policy`, the moment it ends.
    ///
    /// ```
    /// use collectix_actors::{Policy, World};
    /// use collectix_runtime::{Error, ReduceOp, Tensor};
    ///
    /// let world = World::local(3).unwrap();
    /// let results = world.run(Policy::Shrink, |comm| {
    ///     if comm.rank() == 1 {
    ///         panic!("rank 1 gives up");
    ///     }
    ///     let mut comm = comm;
    ///     loop {
    ///         match comm.all_reduce(Tensor::from_vec(vec![1i64]), ReduceOp::Sum).wait() {
    ///             Ok(t) if comm.size() == 2 => return Ok(t.to_vec::<i64>()?),
    ///             Ok(_) => std::thread::sleep(std::time::Duration::from_millis(1)),
    ///             Err(_) => comm = comm.shrink().wait()?.communicator,
    ///         }
    ///     }
    /// });
    /// assert!(matches!(results[1], Err(Error::Panic(_))));
    /// assert_eq!(results[0], Ok(vec![2]));
    /// assert_eq!(results[2], Ok(vec![2]));
    /// world.shutdown().unwrap_or_default();
    /// ```
    pub fn run<T: Send>(
        &self,
        policy: Policy,
        body: impl Fn(Communicator) -> Result<T> + Sync,
    ) -> Vec<Result<T>> {
        if let Some(refused) = self.on_own_thread() {
            return refused;
        }
        let body = &body;
        std::thread::scope(|s| {
            let handles: Vec<_> = self
                .communicators()
                .iter()
                .enumerate()
                .map(|(r, comm)| {
                    let mut comm = comm.clone();
                    s.spawn(move || {
                        let mut restarts = 0;
                        loop {
                            let result = guarded(|| body(comm.clone()));
                            let Err(e) = &result else {
                                return result;
                            };
                            match self.failed(r, e, policy, &mut restarts) {
                                Some(c) => comm = c,
                                None => return result,
                            }
                        }
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(collectix_runtime::Error::internal(
                            "a supervised rank's thread panicked outside its body",
                        ))
                    })
                })
                .collect()
        })
    }

    /// Runs `body` for every rank at once as an async task on the threads the ranks' actors
    /// share ([`WorldBuilder::threads`](crate::WorldBuilder::threads)): no thread per rank,
    /// so a world of thousands of ranks runs on a few threads. Returns each rank's result,
    /// in rank order, once every body has ended; `policy` handles a body that panics or
    /// returns an error as [`run`](Self::run) does (a restarted rank's body runs again, as a
    /// task of its new incarnation).
    ///
    /// A body awaits its calls (a [`Work`](crate::Work) is a future); it must not block its
    /// thread (`Work::wait` there returns [`Error::WouldDeadlock`](collectix_runtime::Error),
    /// as do `run` and `spawn` called there), since the ranks sharing that thread would stop
    /// with it.
    ///
    /// ```
    /// use collectix_actors::{Policy, World};
    /// use collectix_runtime::{ReduceOp, Tensor};
    ///
    /// let world = World::builder(64).threads(2).start().unwrap();
    /// let results = world.spawn(Policy::Stop, |comm| async move {
    ///     let t = Tensor::from_vec(vec![comm.rank() as i64]);
    ///     comm.all_reduce(t, ReduceOp::Sum).await?.to_vec::<i64>()
    /// });
    /// assert!(results.iter().all(|r| r == &Ok(vec![(0..64).sum()])));
    /// world.shutdown().unwrap_or_default();
    /// ```
    pub fn spawn<T, F, Fut>(&self, policy: Policy, body: F) -> Vec<Result<T>>
    where
        T: Send + 'static,
        F: Fn(Communicator) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<T>> + Send + 'static,
    {
        if let Some(refused) = self.on_own_thread() {
            return refused;
        }
        let body = Arc::new(body);
        let (tx, rx) = mpsc::channel::<(usize, Result<T>)>();
        let start = |r: usize, comm: Communicator| {
            let (body, reply) = (body.clone(), Reply(r, Some(tx.clone())));
            let arbiter = comm.member.rank.spawner.clone();
            // A task its thread drops unfinished (the thread stopped) replies on its drop.
            let _ = arbiter.spawn(async move {
                let result = match guarded(|| Ok(body(comm))) {
                    Ok(f) => Guarded(Box::pin(f)).await,
                    Err(e) => Err(e),
                };
                reply.send(result);
            });
        };
        let n = self.size();
        for (r, comm) in self.communicators().iter().enumerate() {
            start(r, comm.clone());
        }
        let mut results: Vec<Option<Result<T>>> = (0..n).map(|_| None).collect();
        let mut restarts = vec![0; n];
        let mut left = n;
        while left > 0 {
            let Ok((r, result)) = rx.recv() else { break };
            if let Err(e) = &result {
                if let Some(c) = self.failed(r, e, policy, &mut restarts[r]) {
                    start(r, c);
                    continue;
                }
            }
            if let Some(slot) = results.get_mut(r) {
                *slot = Some(result);
                left -= 1;
            }
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or(Err(Error::Shutdown)))
            .collect()
    }

    /// On a thread of this world's ranks, waiting for the bodies would stop the ranks that
    /// share it: every rank's result is `Error::WouldDeadlock` instead.
    fn on_own_thread<T>(&self) -> Option<Vec<Result<T>>> {
        let mine = self
            .communicators()
            .first()
            .is_some_and(|c| c.member.rank.rank_threads.is_current());
        mine.then(|| {
            (0..self.size())
                .map(|_| Err(Error::WouldDeadlock))
                .collect()
        })
    }

    /// Rank `r`'s body failed with `e`: `policy` is applied; the communicator of its new
    /// incarnation when its body is to run again.
    fn failed(
        &self,
        r: usize,
        e: &Error,
        policy: Policy,
        restarts: &mut u32,
    ) -> Option<Communicator> {
        tracing::warn!(rank = r, error = %e, ?policy, "a supervised rank failed");
        match policy {
            Policy::Restart(most) if *restarts < most => {
                *restarts += 1;
                match self.restart(r) {
                    Ok(c) => return Some(c),
                    Err(e) => {
                        tracing::warn!(rank = r, error = %e, "cannot restart the rank");
                    }
                }
                let _ = self.kill(r);
            }
            Policy::Shrink | Policy::Restart(_) => {
                let _ = self.kill(r);
            }
            Policy::Stop => self.kill_all(),
        }
        None
    }
}

/// Where rank `.0`'s body's result goes: once, when it ends, or as [`Error::Shutdown`] if its
/// task is dropped before (its thread stopped).
struct Reply<T>(usize, Option<mpsc::Sender<(usize, Result<T>)>>);

impl<T> Reply<T> {
    fn send(mut self, result: Result<T>) {
        if let Some(tx) = self.1.take() {
            let _ = tx.send((self.0, result));
        }
    }
}

impl<T> Drop for Reply<T> {
    fn drop(&mut self) {
        if let Some(tx) = self.1.take() {
            let _ = tx.send((self.0, Err(Error::Shutdown)));
        }
    }
}

/// A rank body's future, whose panic is that rank's failure ([`Error::Panic`]) rather than
/// its thread's: the ranks sharing the thread go on.
pub(crate) struct Guarded<F>(Pin<Box<F>>);

impl<F> Guarded<F> {
    pub(crate) fn new(f: F) -> Guarded<F> {
        Guarded(Box::pin(f))
    }
}

impl<T, F: Future<Output = Result<T>>> Future for Guarded<F> {
    type Output = Result<T>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<T>> {
        let f = self.0.as_mut();
        match std::panic::catch_unwind(AssertUnwindSafe(|| f.poll(cx))) {
            Ok(p) => p,
            Err(p) => Poll::Ready(Err(Error::from_panic("your code", p.as_ref()))),
        }
    }
}
