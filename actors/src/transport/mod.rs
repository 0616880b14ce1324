//! Transports: how a rank's messages reach its peers, behind the runtime's link seam
//! ([`collectix_runtime::wire::link`]). A rank actor holds one [`Link`] per peer (global
//! rank) and an [`Outbox`](collectix_runtime::wire::Outbox) in front of each: a link may say
//! "would block", and the transport then sends the rank [`Flush`] once it can take more. A
//! link that is gone makes the rank treat the peer as lost; a transport that notices a loss
//! by itself (a closed connection) sends the rank [`PeerLost`]. Messages arrive as
//! [`Deliver`], whose source the *receiving* side of the link stamps: never the message's own
//! field.
//!
//! - [`local`]: the in-process transport (payloads are shared `Bytes`, moved into the peer
//!   actor's mailbox, never serialized).
//! - [`tcp`]: one connection per pair of ranks, with a handshake, the core's frames and a
//!   bounded queue per link; [`mesh`]: a process's connections to its peers (an acceptor,
//!   a slot per peer, eager or lazy connection). Shared memory comes later behind the same
//!   seam.

pub mod local;
pub mod mesh;
pub mod tcp;

use actix::Message as ActixMessage;
use collectix_runtime::wire::Message;
pub use collectix_runtime::wire::{Link, LinkError};

/// A message for a rank actor, from global rank `src` (stamped by the link it came on).
#[derive(ActixMessage)]
#[rtype(result = "()")]
pub struct Deliver {
    /// The sender, as the link knows it.
    pub src: usize,
    /// The message (its own `src` field is overwritten with the link's).
    pub msg: Message,
}

/// The link to global rank `.0` can take messages again: the rank sends what waits for it.
#[derive(ActixMessage, Clone, Copy, Debug)]
#[rtype(result = "()")]
pub struct Flush(pub usize);

/// Global rank `.0` is gone (its connection closed, its process died): the rank fails the
/// calls that need it and aborts the groups it belongs to.
#[derive(ActixMessage, Clone, Copy, Debug)]
#[rtype(result = "()")]
pub struct PeerLost(pub usize);

/// A rank's links, one per global rank (its own included, unused).
pub type Links = Vec<Box<dyn Link<Message> + Send>>;
