//! Shared memory's row in the table of transports (`transport::table`): it carries the pairs
//! of one host whose ranks both listen for it (`collectix_runtime::join::shm_can_connect`),
//! and starts the rank's [`Hub`] with them.

use super::*;
use crate::transport::mesh::Connect;
use crate::transport::row::{Row, Running, Started, Starting};
use crate::transport::Transport;
use collectix_runtime::join::shm_can_connect;

/// Shared memory, tried before TCP.
pub(crate) const ROW: Row = Row {
    name: "shm",
    can_connect: shm_can_connect,
    start,
};

/// Sets up shared memory with the peers given (the ranks of this host that offered it): the
/// rings and the world's board, their links in place of TCP's. With
/// `COLLECTIX_TRANSPORT=shm`, a peer that could not be reached so is an error; otherwise it
/// falls to TCP, with a warning.
fn start(st: &mut Starting<'_>, pairs: &[usize]) -> Result<Started> {
    let none = Started {
        reached: Vec::new(),
        running: None,
    };
    let Some(listener) = st.listener.take() else {
        return Ok(none);
    };
    if pairs.is_empty() {
        return Ok(none);
    }
    // The ranks of this host that take shared memory, this one with them.
    let mut local = BTreeMap::new();
    for &r in pairs.iter().chain([&st.rank]) {
        let socket = st
            .sockets
            .get(r)
            .ok_or_else(|| Error::internal(format!("no socket published by rank {r}")))?;
        local.insert(r, socket.clone());
    }
    let setup = Setup {
        job: st.job,
        rank: st.rank,
        local,
        listener,
        security: st.security,
        store: st.store.as_ref(),
        world: st.world,
        ring: ring_from_env()?,
        single_copy: single_copy_from_env()?,
        heap: heap_from_env()?,
        limits: st.limits,
        deadline: st.deadline,
    };
    let (hub, peers) = Hub::start(setup, st.driver, st.links, st.mesh.incarnations())?;
    let missing: Vec<usize> = (pairs.iter().copied())
        .filter(|r| !peers.contains(r))
        .collect();
    if st.transport == Transport::Shm && !missing.is_empty() {
        return Err(Error::Resource(format!(
            "COLLECTIX_TRANSPORT=shm, but shared memory could not be set up with ranks \
             {missing:?} of this host (see the log)"
        )));
    }
    if !missing.is_empty() {
        tracing::warn!(rank = st.rank, ?missing, "TCP to these ranks of this host");
    }
    // Their messages come through the rings: callers need not read their connections.
    let readers = st.mesh.readers();
    for &p in &peers {
        readers.elsewhere(p);
    }
    // A lazy job still connects the pairs that share memory at once: their connections tell
    // when one of them is lost.
    if st.connect == Connect::Lazy && !peers.is_empty() {
        st.mesh.connect_among(&peers, st.deadline, st.timeout)?;
    }
    Ok(Started {
        reached: peers,
        running: hub.map(|h| Box::new(h) as Box<dyn Running>),
    })
}

impl Running for Hub {
    fn name(&self) -> &'static str {
        ROW.name
    }

    fn peers(&self) -> usize {
        Hub::peers(self)
    }

    fn boards(&self) -> Option<Arc<dyn BoardSource>> {
        Hub::boards(self)
    }

    fn heap_reads(&self) -> u64 {
        Hub::heap_reads(self)
    }

    fn split_reads(&self) -> u64 {
        Hub::split_reads(self)
    }
}
