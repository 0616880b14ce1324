//! [`World`]: N in-process ranks, each an actor on its own actix `Arbiter` thread, under an
//! actix `System` that runs on a thread of its own (see the private `system` module).

use crate::assemble::{assemble, Birth};
use crate::board::BoardSource;
use crate::comm::Communicator;
use crate::member::Spawner;
use crate::rank::actor::Quiesce;
use crate::rank::driver::{spin_from_env, Driver, DEFAULT_SPIN, YIELD_TURNS};
use crate::rank::system;
use crate::store::{MemoryStore, Store};
use crate::sync::lock;
use crate::transport::local;
use actix::System;
use collectix_runtime::data_plane::Arenas;
use collectix_runtime::engine::POOL_BYTES;
use collectix_runtime::{Engine, Error, GroupId, GroupInfo, GroupOptions, Locality, Result};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::{JoinHandle, ThreadId};

/// A set of in-process ranks. [`shutdown`](World::shutdown) (or dropping it) stops every
/// rank and joins every thread it started; calls still pending then fail with
/// [`Error::Shutdown`], as do later calls on its communicators. `shutdown` also returns any
/// *pending error*: a failure of a group that a rank learnt of after its calls had completed
/// (a broadcast root whose peers were in another call) and that no call returned; dropping
/// the world logs those instead (`tracing`, at `error`).
pub struct World {
    comms: Vec<Communicator>,
    /// The hot standbys' handles (global ranks from `comms.len()` on), each on a group of
    /// its own until it replaces a lost rank ([`Communicator::stand_by`]).
    standbys: Vec<Communicator>,
    system: Option<System>,
    thread: Option<JoinHandle<()>>,
    /// What a restarted rank is made with (see [`World::restart`]).
    parts: Parts,
    /// Each rank's live incarnation: its handle (the first is in `comms`).
    current: Mutex<Vec<Communicator>>,
    /// The actor systems (and their threads) of restarted ranks, each with its rank's
    /// handle, stopped with the world.
    restarted: Mutex<Vec<(Communicator, System, JoinHandle<()>)>>,
    /// Held by a restart, so that restarts happen one at a time (the other locks are held
    /// only to read or write, never while ranks run: a completion may run user code).
    restarting: Mutex<()>,
}

/// What the ranks of a world share, kept to make a restarted rank of the same kind.
struct Parts {
    arenas: Arc<Arenas>,
    spin: std::time::Duration,
    yields: u32,
    store: Arc<dyn Store>,
    hub: Arc<crate::device::cuda::LocalHub>,
    /// The ranks' boards (`None`: turned off).
    boards: Option<Arc<crate::board::LocalBoards>>,
}

impl World {
    /// Starts `n` ranks with default group options.
    pub fn local(n: usize) -> Result<World> {
        World::local_with(n, GroupOptions::default())
    }

    /// Starts `n` ranks whose world group uses `options`.
    pub fn local_with(n: usize, options: GroupOptions) -> Result<World> {
        World::local_with_standbys(n, 0, options)
    }

    /// Starts `n` ranks whose world group uses `options`, and `standbys` hot standbys
    /// (global ranks `n..n + standbys`): ranks that are connected to every other and stay
    /// out of the world group, each waiting ([`Communicator::stand_by`] on
    /// [`standbys`](Self::standbys)) to take the place of a lost rank when the survivors
    /// [`regrow`](Communicator::regrow): the group is whole again in the same agreement,
    /// with no rank to restart.
    pub fn local_with_standbys(n: usize, standbys: usize, options: GroupOptions) -> Result<World> {
        World::builder(n)
            .standbys(standbys)
            .options(options)
            .start()
    }

    /// A world of `n` ranks with settings given in code (the threads its ranks share, hot
    /// standbys, the world group's options); [`WorldBuilder::start`] starts it.
    pub fn builder(n: usize) -> WorldBuilder {
        WorldBuilder {
            n,
            standbys: 0,
            options: GroupOptions::default(),
            threads: None,
        }
    }

    fn start(b: WorldBuilder) -> Result<World> {
        let WorldBuilder {
            n,
            standbys,
            mut options,
            threads,
        } = b;
        if n == 0 {
            return Err(Error::invalid("a world needs at least one rank"));
        }
        options.locality = Locality::Process;
        let total = n
            .checked_add(standbys)
            .ok_or_else(|| Error::invalid("too many standbys"))?;
        // Each rank's view of the world group, made (and checked) before any thread starts;
        // a standby's group of its own.
        // The world group's members are one list for all of them.
        let mut infos =
            GroupInfo::for_each(GroupId::WORLD, (0..n).collect::<Vec<_>>(), 0..n, &options)?;
        for r in n..total {
            infos.push(GroupInfo::new(
                standby_group(r),
                vec![r],
                r,
                options.clone(),
            )?);
        }
        let spin = spin_from_env(DEFAULT_SPIN);
        // The ranks share an address space: outputs that can be shared are one buffer for
        // all of them (tensors are immutable values).
        let arenas = Arenas::new(POOL_BYTES);
        // Spinning callers yield their core now and then only if the ranks outnumber the
        // cores (a yield is a system call; with a core each, the peer is already running).
        let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
        let yields = if total > cores { YIELD_TURNS } else { 0 };
        let drivers: Vec<Arc<Driver>> = infos
            .iter()
            .enumerate()
            .map(|(r, info)| {
                let engine = Engine::in_process(r, arenas.clone());
                Arc::new(Driver::new(engine, info.clone(), spin, yields))
            })
            .collect();
        let threads = threads.unwrap_or_else(|| rank_threads_from_env(cores));
        let started = system::start("collectix-system", drivers.clone(), threads)?;
        // The ranks share memory: their groups' small calls run on boards, unless a group's
        // members outnumber the cores many times over.
        let boards = crate::board::enabled().then(|| {
            crate::board::LocalBoards::new(
                drivers.iter().map(|d| d.boards.signal.clone()).collect(),
                cores,
            )
        });
        let mut threads: Vec<ThreadId> = Vec::new();
        for (_, _, t) in &started.ranks {
            if !threads.contains(t) {
                threads.push(*t);
            }
        }
        // The ranks' store: where the survivors of a failed group agree.
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        // What the ranks share for device calls on one GPU (the device-local path).
        let hub = Arc::new(crate::device::cuda::LocalHub::new());
        // One table of the ranks' drivers, which every rank's links are made from.
        let table: Arc<[Arc<Driver>]> = drivers.clone().into();
        let mut comms = Vec::with_capacity(total);
        let ranks = started.ranks.into_iter().zip(&drivers).zip(infos);
        for (r, (((addr, arbiter, thread), driver), info)) in ranks.enumerate() {
            let shared = assemble(Birth {
                rank: r,
                world: total,
                standbys,
                incarnation: 0,
                driver: driver.clone(),
                actor: (Some(addr), Spawner::Arbiter(arbiter), thread),
                threads: threads.clone(),
                links: local::links(r, table.clone()),
                store: store.clone(),
                hub: Some(hub.clone()),
                boards: boards.clone().map(|b| b as Arc<dyn BoardSource>),
                settle: crate::assemble::SETTLE_IN_PROCESS,
            });
            comms.push(Communicator::new(shared, info));
        }
        let standbys = comms.split_off(n);
        let mut all = comms.clone();
        all.extend(standbys.iter().cloned());
        Ok(World {
            current: Mutex::new(all),
            comms,
            standbys,
            system: Some(started.system),
            thread: Some(started.thread),
            parts: Parts {
                arenas,
                spin,
                yields,
                store,
                hub,
                boards,
            },
            restarted: Mutex::new(Vec::new()),
            restarting: Mutex::new(()),
        })
    }

    /// The hot standbys' handles, in order (global ranks from [`size`](Self::size) on):
    /// each waits with [`Communicator::stand_by`] to replace a lost rank.
    pub fn standbys(&self) -> &[Communicator] {
        &self.standbys
    }

    /// Ranks (the standbys not counted).
    pub fn size(&self) -> usize {
        self.comms.len()
    }

    /// The world communicator of each rank, in rank order.
    pub fn communicators(&self) -> &[Communicator] {
        &self.comms
    }

    /// Rank `r`'s world communicator.
    pub fn rank(&self, r: usize) -> Option<&Communicator> {
        self.comms.get(r)
    }

    /// Kills rank `r` as a crashed process would die: its calls fail with
    /// [`Error::Shutdown`] and later ones are refused, and every other rank sees it lost at
    /// once (its calls that need rank `r` fail with [`Error::PeerLost`], its groups with
    /// `r` abort), as a closed connection tells the ranks of a TCP job. For tests of what a
    /// program does after a loss, and for supervisors. The world's other ranks go on;
    /// [`shutdown`](Self::shutdown) still stops them all.
    pub fn kill(&self, r: usize) -> Result<()> {
        let current = lock(&self.current).clone();
        let Some(victim) = current.get(r) else {
            return Err(Error::invalid(format!(
                "no rank {r} in a world of {}",
                self.comms.len()
            )));
        };
        if victim.member.rank.driver.is_closed() {
            return Ok(());
        }
        victim.member.rank.driver.stopped();
        for (i, c) in current.iter().enumerate() {
            if i != r {
                c.member.rank.driver.peer_dead(r);
            }
        }
        Ok(())
    }

    /// Stops every rank (not the standbys) as [`kill`](Self::kill) would, without telling
    /// each the others' loss (nobody is left to hear it: a world of W ranks is stopped in
    /// O(W), not O(W²)).
    pub(crate) fn kill_all(&self) {
        for c in lock(&self.current)
            .iter()
            .take(self.size())
            .cloned()
            .collect::<Vec<_>>()
        {
            if !c.member.rank.driver.is_closed() {
                c.member.rank.driver.stopped();
            }
        }
    }

    /// Cuts the link between ranks `a` and `b`, as a network fault between two hosts
    /// would: neither takes the other's messages any more, and each sees the other lost at
    /// once (as a broken connection tells the ranks of a TCP job). Both go on running, with
    /// every other link. For tests of partitions; cutting every link of one rank isolates
    /// it.
    pub fn cut(&self, a: usize, b: usize) -> Result<()> {
        let current = lock(&self.current).clone();
        let (Some(da), Some(db)) = (current.get(a), current.get(b)) else {
            return Err(Error::invalid(format!(
                "no link between ranks {a} and {b} in a world of {}",
                self.comms.len()
            )));
        };
        if a == b {
            return Err(Error::invalid(format!("rank {a} has no link to itself")));
        }
        da.member.rank.driver.cut(b, local::cut());
        db.member.rank.driver.cut(a, local::cut());
        Ok(())
    }

    /// Heals the link between ranks `a` and `b` that [`cut`](Self::cut) broke: each takes
    /// the other's messages again, as a fresh connection (the groups they shared before stay
    /// failed). A rank that a shrink left out for that link can then come back: it calls
    /// [`Communicator::rejoin`] while the others [`regrow`](Communicator::regrow).
    pub fn heal(&self, a: usize, b: usize) -> Result<()> {
        let current = lock(&self.current).clone();
        let (Some(ca), Some(cb)) = (current.get(a), current.get(b)) else {
            return Err(Error::invalid(format!(
                "no link between ranks {a} and {b} in a world of {}",
                current.len()
            )));
        };
        if a == b {
            return Err(Error::invalid(format!("rank {a} has no link to itself")));
        }
        let (da, db) = (&ca.member.rank.driver, &cb.member.rank.driver);
        da.relink(b, local::link(a, da, db.clone()));
        db.relink(a, local::link(b, db, da.clone()));
        Ok(())
    }

    /// Restarts rank `r` as a new incarnation, as `collectix launch --max-restarts` restarts
    /// a process: the rank's live incarnation is killed first (as by [`kill`](Self::kill),
    /// if it is not dead already), then a new one starts, with a new engine on an actor
    /// thread of its own, and every other rank's link to `r` leads to it; the others' groups
    /// made from now on may have it as a member. Returns the new incarnation's world
    /// communicator ([`Communicator::incarnation`] one more than before): it holds none of
    /// the old one's state, and joins the others with [`Communicator::rejoin`] while they
    /// call [`Communicator::regrow`]. [`World::run`] with [`Policy::Restart`] does this for
    /// a rank whose body failed.
    ///
    /// [`Policy::Restart`]: crate::Policy::Restart
    pub fn restart(&self, r: usize) -> Result<Communicator> {
        let _one_at_a_time = lock(&self.restarting);
        self.kill(r)?;
        let Some(old) = lock(&self.current).get(r).cloned() else {
            return Err(Error::invalid(format!("no rank {r}")));
        };
        // Its view of the world group (the handles a world keeps are world communicators).
        let info = old.member.group.info.clone();
        let engine = Engine::in_process(r, self.parts.arenas.clone());
        let driver = Arc::new(Driver::new(
            engine,
            info.clone(),
            self.parts.spin,
            self.parts.yields,
        ));
        let started = system::start(&format!("collectix-restart-{r}"), vec![driver.clone()], 1)?;
        let Some((addr, arbiter, tid)) = started.ranks.into_iter().next() else {
            started.system.stop();
            let _ = started.thread.join();
            return Err(Error::Shutdown);
        };
        let mut threads: Vec<ThreadId> = old.member.rank.rank_threads.0.to_vec();
        threads.push(tid);
        // Every rank's live driver, this one's new.
        let mut drivers: Vec<Arc<Driver>> = lock(&self.current)
            .iter()
            .map(|c| c.member.rank.driver.clone())
            .collect();
        if let Some(slot) = drivers.get_mut(r) {
            *slot = driver.clone();
        }
        let boards = self.parts.boards.clone().map(|b| {
            b.restarted(r, driver.boards.signal.clone());
            b as Arc<dyn BoardSource>
        });
        let shared = assemble(Birth {
            rank: r,
            world: self.comms.len() + self.standbys.len(),
            standbys: self.standbys.len(),
            incarnation: old.incarnation().saturating_add(1),
            driver: driver.clone(),
            actor: (Some(addr), Spawner::Arbiter(arbiter), tid),
            threads,
            links: local::links(r, drivers.clone().into()),
            store: self.parts.store.clone(),
            hub: Some(self.parts.hub.clone()),
            boards,
            settle: crate::assemble::SETTLE_IN_PROCESS,
        });
        let comm = Communicator::new(shared, info);
        if let Some(slot) = lock(&self.current).get_mut(r) {
            *slot = comm.clone();
        }
        for (p, d) in drivers.iter().enumerate() {
            if p != r {
                d.relink(r, local::link(p, d, driver.clone()));
            }
        }
        lock(&self.restarted).push((comm.clone(), started.system, started.thread));
        tracing::info!(
            rank = r,
            incarnation = comm.incarnation(),
            "restarted a rank"
        );
        Ok(comm)
    }

    /// Stops every rank and joins every thread. `Err` with the pending error of the lowest
    /// rank that has one (each is also logged): a failure no call returned, such as a
    /// mismatch that only the peers of an early-finished call saw. `Ok` means every failure
    /// on every rank was returned by some call.
    pub fn shutdown(mut self) -> Result<()> {
        match self.stop().into_iter().next() {
            Some((_, e)) => Err(e),
            None => Ok(()),
        }
    }

    /// Stops the ranks; returns the pending errors they held, by rank.
    fn stop(&mut self) -> Vec<(usize, Error)> {
        // On one of this world's own rank threads (a user's waker, callback or `Deserialize`
        // impl dropping the world) that rank cannot answer or stop while this runs: nothing
        // here may wait for it, and the joining is left to a thread of its own.
        let me = std::thread::current().id();
        let on_rank = self
            .comms
            .first()
            .is_some_and(|c| c.member.rank.rank_threads.0.contains(&me));
        // First every rank fails its waiting calls with `Shutdown` and stops listening; only
        // then does any rank stop (else a rank could see a peer's stop as a lost peer).
        let (tx, rx) = mpsc::channel();
        let mut wait_for: usize = 0;
        let restarted = std::mem::take(&mut *lock(&self.restarted));
        for c in self.comms.iter().chain(restarted.iter().map(|(c, _, _)| c)) {
            if let Some(addr) = c.member.rank.addr.as_ref().filter(|a| a.connected()) {
                addr.do_send(Quiesce(tx.clone()));
                // The ranks whose thread this is answer only after this returns.
                if c.member.rank.thread != me {
                    wait_for += 1;
                }
            }
        }
        drop(tx);
        let mut pending = Vec::new();
        for _ in 0..wait_for {
            // A rank that is already gone drops its sender; never wait long for one.
            match rx.recv_timeout(std::time::Duration::from_secs(5)) {
                Ok((rank, errors)) => pending.extend(errors.into_iter().map(|e| (rank, e))),
                Err(_) => break,
            }
        }
        pending.sort_by_key(|(rank, _)| *rank);
        let systems = restarted
            .into_iter()
            .map(|(_, system, thread)| (system, thread))
            .chain(self.system.take().zip(self.thread.take()));
        for (system, thread) in systems {
            system.stop();
            if on_rank {
                let _ = std::thread::Builder::new()
                    .name("collectix-join".into())
                    .spawn(move || {
                        let _ = thread.join();
                    });
            } else {
                let _ = thread.join();
            }
        }
        pending
    }
}

impl Drop for World {
    fn drop(&mut self) {
        for (rank, e) in self.stop() {
            tracing::error!(rank, error = %e, "a world dropped without shutdown() swallowed this failure");
        }
    }
}

/// How many threads the ranks of a world share unless told: `COLLECTIX_RANK_THREADS`, else
/// the cores this process may run on (so a world of at most that many ranks has a thread per
/// rank).
fn rank_threads_from_env(cores: usize) -> usize {
    std::env::var("COLLECTIX_RANK_THREADS")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&t| t > 0)
        .unwrap_or(cores)
}

/// A world's settings given in code ([`World::builder`]).
#[derive(Clone, Debug)]
#[must_use = "a builder does nothing until `start`"]
pub struct WorldBuilder {
    n: usize,
    standbys: usize,
    options: GroupOptions,
    threads: Option<usize>,
}

impl WorldBuilder {
    /// `k` hot standbys besides the ranks (see [`World::local_with_standbys`]).
    pub fn standbys(mut self, k: usize) -> Self {
        self.standbys = k;
        self
    }

    /// The world group's options.
    pub fn options(mut self, options: GroupOptions) -> Self {
        self.options = options;
        self
    }

    /// The threads the ranks' actors share (at least one; rank `r` runs on thread
    /// `r % threads`). By default `COLLECTIX_RANK_THREADS`, else the cores this process may
    /// run on: a world of at most that many ranks has a thread per rank, a bigger one shares
    /// them, as actors share an arbiter. The threads a rank's actor runs on are not the
    /// callers': see [`World::run`] (a thread per rank body) and [`World::spawn`] (async rank
    /// bodies on these threads).
    pub fn threads(mut self, threads: usize) -> Self {
        self.threads = Some(threads.max(1));
        self
    }

    /// Starts the world.
    pub fn start(self) -> Result<World> {
        World::start(self)
    }
}

/// The group of its own a standby of global rank `r` is in until it replaces a lost rank.
pub(crate) fn standby_group(r: usize) -> collectix_runtime::GroupId {
    collectix_runtime::GroupId::derive(collectix_runtime::GroupId::WORLD, u64::MAX - 1, &[r as u64])
}

#[cfg(test)]
mod tests {
    use super::World;
    use collectix_runtime::wire::{Header, Message};
    use collectix_runtime::{DType, Error, GroupId, Tensor, TensorSpec};
    use std::time::Duration;

    #[test]
    fn a_peer_lost_event_from_the_transport_fails_the_calls_that_need_that_peer() {
        let w = World::local(3).unwrap_or_else(|e| panic!("{e}"));
        let c = w.communicators();
        let r = c[1].recv(TensorSpec::new(&[1], DType::I64), Some(0), 1);
        c[1].member.rank.driver.peer_lost(0);
        let got = r.wait_timeout(Duration::from_secs(30));
        assert!(
            matches!(got, Some(Err(Error::PeerLost { rank: 0 }))),
            "{got:?}"
        );
    }

    #[test]
    fn the_source_of_a_message_is_the_link_it_came_on_not_its_own_claim() {
        let w = World::local(3).unwrap_or_else(|e| panic!("{e}"));
        let c = w.communicators();
        let r = c[1].recv(TensorSpec::new(&[1], DType::I64), None, 5);
        let data = Tensor::from_vec(vec![7i64]);
        // Rank 0's link delivers a message that claims to come from rank 2.
        c[1].member.rank.driver.deliver(
            0,
            Message {
                src: 2,
                header: Header::P2p {
                    group: GroupId::WORLD,
                    tag: 5,
                    seq: 0,
                    dtype: DType::I64,
                    count: 1,
                    eager: true,
                    path: collectix_runtime::DataPath::Engine,
                },
                payload: vec![data.bytes().clone()],
            },
        );
        let got = r.wait_timeout(Duration::from_secs(30));
        assert!(matches!(&got, Some(Ok((t, 0))) if *t == data), "{got:?}");
    }
}
