//! One place assembles a rank, wherever it is born: the ranks of a [`World`](crate::World)
//! (threads of one process), a rank of a world restarted, and a process's one rank joining a
//! job (`process/join.rs`). Each birthplace makes the rank's driver (its engine, and how its
//! callers spin), starts its actor on an actix system, and brings its links (the in-process
//! transport for a world; the table of transports, `transport::table`, for a job);
//! [`assemble`] puts the rank together from them, the same way for all three.

use crate::board::BoardSource;
use crate::device::cuda::LocalHub;
use crate::member::{RankShared, Spawner};
use crate::rank::actor::RankActor;
use crate::rank::driver::{Driver, LinkTable};
use crate::store::Store;
use crate::work::RankThreads;
use actix::Addr;
use std::sync::Arc;
use std::thread::ThreadId;
use std::time::Duration;

/// What a birthplace brings to make a rank of.
pub(crate) struct Birth {
    /// The rank in its world, and the world's size (its standbys included).
    pub(crate) rank: usize,
    pub(crate) world: usize,
    /// How many of the world's ranks are hot standbys (the last ones).
    pub(crate) standbys: usize,
    /// Which incarnation of its rank this is: 0 for the first, one more for each restart.
    pub(crate) incarnation: u32,
    /// The rank's driver, with its engine.
    pub(crate) driver: Arc<Driver>,
    /// Its actor, started (`None` in a seeded run), where its tasks run, and their thread.
    pub(crate) actor: (Option<Addr<RankActor>>, Spawner, ThreadId),
    /// The threads of this process that run rank actors (a waiting caller there must not
    /// spin for its peers).
    pub(crate) threads: Vec<ThreadId>,
    /// Its links to the ranks of the world.
    pub(crate) links: LinkTable,
    /// The job's store, where the survivors of a failed group agree.
    pub(crate) store: Arc<dyn Store>,
    /// What the ranks of this process share for device calls on one GPU (`None`: a
    /// process's one rank, whose device calls take NCCL).
    pub(crate) hub: Option<Arc<LocalHub>>,
    /// Where its groups get boards (`None`: every call goes through the engine).
    pub(crate) boards: Option<Arc<dyn BoardSource>>,
    /// How long the survivors' agreement waits, once it sees a link broken, for the rest of
    /// the evidence: what its links need to notice a cut (a heartbeat or two over TCP).
    pub(crate) settle: Duration,
}

/// What a rank of one process waits for the evidence of a cut to settle: `World::cut`
/// breaks both ends at once.
pub(crate) const SETTLE_IN_PROCESS: Duration = Duration::from_millis(20);

/// The rank made of `birth`: its links in place, its board wake-ups routed to its driver.
pub(crate) fn assemble(birth: Birth) -> Arc<RankShared> {
    let Birth {
        rank,
        world,
        standbys,
        incarnation,
        driver,
        actor: (addr, spawner, thread),
        threads,
        links,
        store,
        hub,
        boards,
        settle,
    } = birth;
    driver.set_links(links);
    if boards.is_some() {
        // A peer that finishes a board call wakes this rank's driver.
        driver.boards.signal.attach(&driver);
    }
    Arc::new(RankShared {
        rank,
        world,
        standbys,
        addr,
        driver,
        spawner,
        thread,
        // A copy of its own per rank: every call clones and drops it, and one `Arc` shared
        // by the ranks would move its count between their cores on each.
        rank_threads: RankThreads::shared(&threads),
        store,
        hub,
        incarnation,
        boards,
        settle,
    })
}
