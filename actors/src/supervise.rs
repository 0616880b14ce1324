//! Supervised ranks in one process (as actix supervises actors, and as `collectix launch`
//! handles processes): [`World::run`] runs a body per rank, and a rank whose body panics or
//! returns an error is handled by a [`Policy`] with the launcher's names: `Stop` stops every
//! rank, `Shrink` lets the others go on without it (they hear of it at once, as of a killed
//! process, and shrink their groups), `Restart` starts it again as a new incarnation (as
//! `--max-restarts` does), which rejoins the others while they regrow their group.

use crate::comm::Communicator;
use crate::work::guarded;
use crate::world::World;
use collectix_runtime::Result;

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
                            tracing::warn!(rank = r, error = %e, ?policy, "a supervised rank failed");
                            match policy {
                                Policy::Restart(most) if restarts < most => {
                                    restarts += 1;
                                    match self.restart(r) {
                                        Ok(c) => {
                                            comm = c;
                                            continue;
                                        }
                                        Err(e) => {
                                            tracing::warn!(rank = r, error = %e, "cannot restart the rank");
                                        }
                                    }
                                }
                                Policy::Shrink | Policy::Restart(_) => {
                                    let _ = self.kill(r);
                                }
                                Policy::Stop => {
                                    for other in 0..self.size() {
                                        let _ = self.kill(other);
                                    }
                                }
                            }
                            return result;
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
}
