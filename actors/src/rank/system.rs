//! Starting rank actors: an actix `System` on a thread of its own (so that ranks work from
//! plain `fn main`, from inside a tokio runtime and from tests alike), with its ranks' actors
//! spread over a fixed set of `Arbiter` threads: rank `r` on arbiter `r % threads`, one thread
//! per rank when the ranks are no more than the threads. Shared by the in-process
//! [`World`](crate::World) (many ranks) and a multi-process [`Process`](crate::Process) (one).
//!
//! A rank's actor never blocks for long on its thread (a handler runs the engine under the
//! rank's lock, which is only ever held for a run), so the ranks sharing a thread only take
//! turns; a caller on such a thread never blocks for a call (`Work::wait` there is
//! `Error::WouldDeadlock`), and an async rank body there awaits instead.

use super::actor::RankActor;
use super::driver::Driver;
use actix::{Actor, Addr, Arbiter, ArbiterHandle, System};
use collectix_runtime::{Error, Result};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::{JoinHandle, ThreadId};

/// Started ranks: the system, its thread, and per rank (in the order asked) its actor, its
/// arbiter and the arbiter's thread.
pub(crate) struct Started {
    pub(crate) system: System,
    pub(crate) thread: JoinHandle<()>,
    pub(crate) ranks: Vec<(Addr<RankActor>, ArbiterHandle, ThreadId)>,
}

/// Starts one actor per rank's driver, each the background driver of its rank (named in the
/// driver before this returns), on at most `threads` arbiter threads (at least one); links
/// are the caller's to install. A thread the system refuses is [`Error::Resource`].
pub(crate) fn start(name: &str, ranks: Vec<Arc<Driver>>, threads: usize) -> Result<Started> {
    let n = ranks.len();
    let threads = threads.clamp(1, n.max(1));
    type Reply = Result<(System, Vec<(Addr<RankActor>, ArbiterHandle, ThreadId)>)>;
    let (tx, rx) = mpsc::channel::<Reply>();
    let thread = std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let sys = System::new();
            // actix panics when it cannot start an arbiter's thread: that is a resource
            // limit, reported as one (the threads started so far are stopped).
            let mut arbiters: Vec<Arbiter> = Vec::with_capacity(threads);
            for _ in 0..threads {
                match std::panic::catch_unwind(Arbiter::new) {
                    Ok(a) => arbiters.push(a),
                    Err(p) => {
                        for a in arbiters {
                            a.stop();
                            let _ = a.join();
                        }
                        let e = Error::from_panic("starting a rank's thread", p.as_ref());
                        let _ = tx.send(Err(Error::Resource(e.to_string())));
                        return;
                    }
                }
            }
            let started: Vec<_> = ranks
                .into_iter()
                .enumerate()
                .filter_map(|(r, driver)| {
                    let arb = &arbiters[r % threads];
                    let (ttx, trx) = mpsc::channel();
                    let d = driver.clone();
                    let addr = RankActor::start_in_arbiter(&arb.handle(), move |_| {
                        super::mark_rank_thread();
                        let _ = ttx.send(std::thread::current().id());
                        RankActor::new(d)
                    });
                    driver.set_actor(addr.clone().recipient());
                    trx.recv().ok().map(|tid| (addr, arb.handle(), tid))
                })
                .collect();
            let reply = if started.len() == n {
                Ok((System::current(), started))
            } else {
                Err(Error::Shutdown)
            };
            if tx.send(reply).is_ok() {
                let _ = sys.run();
            }
            for a in &arbiters {
                a.stop();
            }
            for a in arbiters {
                let _ = a.join();
            }
        })
        .map_err(|e| Error::Resource(format!("cannot start the actor system thread: {e}")))?;
    match rx.recv() {
        Ok(Ok((system, ranks))) => Ok(Started {
            system,
            thread,
            ranks,
        }),
        Ok(Err(e)) => {
            let _ = thread.join();
            Err(e)
        }
        Err(_) => {
            let _ = thread.join();
            Err(Error::Shutdown)
        }
    }
}
