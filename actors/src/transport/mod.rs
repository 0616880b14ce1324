//! Transports: how a rank's messages reach its peers, behind the runtime's link seam
//! ([`collectix_runtime::wire::link`]). A rank holds one [`Link`] per peer (global rank) and
//! an [`Outbox`](collectix_runtime::wire::Outbox) in front of each: a link may say "would
//! block", and the transport then tells the rank's driver once it can take more
//! ([`tcp::Inbound::flush`]). A link that is gone makes the rank treat the peer as lost; a
//! transport that notices a loss by itself (a closed connection) tells the driver
//! ([`tcp::Inbound::lost`]). Every transport hands arrivals to the receiving rank's driver
//! the same way, into its inbox, with the source the *receiving* side of the link stamps:
//! never the message's own field (see `docs/architecture.md`, "The hot path").
//!
//! - [`local`]: the in-process transport (payloads are shared `Bytes`, moved into the peer
//!   rank's inbox on the sender's thread, never serialized).
//! - [`tcp`]: one connection per pair of ranks, with a handshake, the core's frames and a
//!   bounded queue per link; [`mesh`]: a process's connections to its peers (an acceptor,
//!   a slot per peer, eager or lazy connection). Shared memory comes later behind the same
//!   seam.

pub(crate) mod local;
pub(crate) mod mesh;
pub(crate) mod tcp;

pub(crate) use crate::rank::driver::Links;
pub(crate) use collectix_runtime::wire::{Link, LinkError};
