//! Transports: how a rank's messages reach its peers. The rank actor only sees the
//! [`Transport`] trait; the in-process one moves messages (payloads are shared `Bytes`, never
//! serialized) into the peer actor's mailbox. TCP comes next behind the same trait.

use actix::{Message as ActixMessage, Recipient};
use collectix_runtime::message::Message;

/// A message delivered to a rank actor.
#[derive(ActixMessage)]
#[rtype(result = "()")]
pub struct Deliver(pub Message);

/// The peer cannot be reached any more (its mailbox or connection closed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerGone(pub usize);

/// Sends messages to peers by global rank.
pub trait Transport: Send + 'static {
    /// Hands `msg` to rank `dst`, or reports that the peer is gone.
    fn send(&mut self, dst: usize, msg: Message) -> Result<(), PeerGone>;
}

/// In-process transport: one actix mailbox per peer.
pub struct LocalTransport {
    peers: Vec<Recipient<Deliver>>,
}

impl LocalTransport {
    /// A transport to `peers`, indexed by global rank.
    pub fn new(peers: Vec<Recipient<Deliver>>) -> Self {
        LocalTransport { peers }
    }
}

impl Transport for LocalTransport {
    fn send(&mut self, dst: usize, msg: Message) -> Result<(), PeerGone> {
        match self.peers.get(dst) {
            Some(p) if p.connected() => {
                p.do_send(Deliver(msg));
                Ok(())
            }
            _ => Err(PeerGone(dst)),
        }
    }
}
