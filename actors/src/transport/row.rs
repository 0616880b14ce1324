//! What a transport of a job is to the table of transports (`transport::table`): a [`Row`]
//! that says which pairs it can carry and starts on the pairs given to it, and what it
//! leaves [`Running`].

use super::mesh::{Connect, Mesh};
use super::{Links, Transport};
use crate::board::BoardSource;
use crate::rank::driver::Driver;
use crate::security::Security;
use crate::store::Store;
use collectix_runtime::join::CanConnect;
use collectix_runtime::wire::codec::Limits;
use collectix_runtime::Result;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One transport of the table.
pub(crate) struct Row {
    /// Its name, as `Process` reports it and the log says it.
    pub(crate) name: &'static str,
    /// Whether it can carry a pair, from what both ranks published.
    pub(crate) can_connect: CanConnect,
    /// Starts it for the peers it was given (in rank order, none when it was given none):
    /// sets their links in [`Starting::links`] and returns the peers it reached.
    pub(crate) start: fn(&mut Starting<'_>, &[usize]) -> Result<Started>,
}

/// What a row started.
pub(crate) struct Started {
    /// The peers it carries now: of those it was given, the ones it reached.
    pub(crate) reached: Vec<usize>,
    /// What keeps it running (threads, mappings), kept by the process until the rank leaves;
    /// `None` if it needs nothing kept.
    pub(crate) running: Option<Box<dyn Running>>,
}

/// A transport that runs while the rank is in the job; dropping it stops it.
pub(crate) trait Running: Send {
    /// Its row's name.
    fn name(&self) -> &'static str;
    /// How many peers it carries.
    fn peers(&self) -> usize;
    /// Where the rank's groups get boards, if this transport gives them memory to share.
    fn boards(&self) -> Option<Arc<dyn BoardSource>> {
        None
    }
    /// Payload parts the rank read straight from a peer's shared heap (one copy each).
    fn heap_reads(&self) -> u64 {
        0
    }
    /// Large payload parts the rank read out of a peer's memory with several threads.
    fn split_reads(&self) -> u64 {
        0
    }
}

/// What the rows start from: the rank, what every rank published, and the rank's driver,
/// links and connections.
pub(crate) struct Starting<'a> {
    pub(crate) job: u64,
    pub(crate) rank: usize,
    pub(crate) world: usize,
    /// Which process of its rank this is (0, one more for each restart).
    pub(crate) incarnation: u32,
    /// Each rank's shared-memory socket, as published ("-": none).
    pub(crate) sockets: &'a [String],
    /// Where this rank takes shared-memory peers, if it offered shared memory (the shared
    /// memory row takes it).
    #[cfg(target_os = "linux")]
    pub(crate) listener: Option<super::shm::Listener>,
    /// What this rank was told to use.
    pub(crate) transport: Transport,
    pub(crate) connect: Connect,
    pub(crate) security: &'a Security,
    pub(crate) store: &'a Arc<dyn Store>,
    pub(crate) limits: Limits,
    pub(crate) deadline: Instant,
    pub(crate) timeout: Duration,
    pub(crate) driver: &'a Arc<Driver>,
    /// The rank's links, one per peer: the connections' at first, each replaced by the row
    /// that carries its pair.
    pub(crate) links: &'a mut Links,
    /// The connections to every peer.
    pub(crate) mesh: &'a Mesh,
}
