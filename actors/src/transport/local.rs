//! The in-process transport: one link per (rank, peer) that hands a message to the peer
//! rank's driver (`Driver`) on the sending caller's thread: into the peer's inbox,
//! where a caller of the peer waiting for a call takes it, or the peer's actor if none does
//! (woken by the sender only if nobody came for it within a short grace: `Driver::settle`).
//! Payloads are shared `Bytes`, moved, never serialized. The inbox is unbounded, so a local
//! link never says "would block"; it is closed once the peer's actor has stopped.

use super::{Link, LinkError};
use crate::rank::driver::{BoxedLink, LinkTable};
use crate::rank::driver::{Driver, Owed};
use collectix_runtime::wire::Message;
use std::sync::Arc;

/// The link from global rank `src` to one peer rank.
pub(crate) struct LocalLink {
    src: usize,
    peer: Arc<Driver>,
    /// The sending rank's list of peers it owes a second look (`Driver::settle`).
    owed: Owed,
}

impl Link<Message> for LocalLink {
    fn try_send(&mut self, msg: Message) -> Result<(), LinkError<Message>> {
        if self.peer.is_closed() {
            return Err(LinkError::Closed);
        }
        self.peer.deliver_from_peer(self.src, msg, &self.owed);
        Ok(())
    }
}

/// The links of rank `src` to `peers` (indexed by global rank, shared by every rank of the
/// world), each made when first used.
pub(crate) fn links(src: usize, peers: Arc<[Arc<Driver>]>) -> LinkTable {
    let owed = peers.get(src).map(|d| d.owed()).unwrap_or_default();
    LinkTable::lazy(Box::new(move |p| {
        let peer = peers.get(p)?.clone();
        Some(Box::new(LocalLink {
            src,
            peer,
            owed: owed.clone(),
        }) as BoxedLink)
    }))
}

/// The link from global rank `src` (whose driver is `from`) to the driver `to` of one peer
/// (a restarted rank's new driver, say).
pub(crate) fn link(src: usize, from: &Driver, to: Arc<Driver>) -> BoxedLink {
    Box::new(LocalLink {
        src,
        peer: to,
        owed: from.owed(),
    })
}

/// A link that a network fault cut ([`World::cut`](crate::World::cut)): it takes nothing.
struct CutLink;

impl Link<Message> for CutLink {
    fn try_send(&mut self, _: Message) -> Result<(), LinkError<Message>> {
        Err(LinkError::Closed)
    }
}

/// A link that takes nothing, as a cut one.
pub(crate) fn cut() -> BoxedLink {
    Box::new(CutLink)
}
