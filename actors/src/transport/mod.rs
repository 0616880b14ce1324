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
//!   a slot per peer, eager or lazy connection).
//! - [`shm`]: rings in shared memory between the processes of one host (Linux), beside the
//!   TCP connections that still tell when a peer is lost.
//! - [`table`]: which of these carries each pair of a job's processes, decided alike on both
//!   ranks of the pair from what they published (a row per transport).

pub(crate) mod local;
pub(crate) mod mesh;
pub(crate) mod row;
#[cfg(target_os = "linux")]
pub(crate) mod shm;
pub(crate) mod table;
pub(crate) mod tcp;

pub(crate) use crate::rank::driver::Links;
pub(crate) use collectix_runtime::wire::{Link, LinkError};

use collectix_runtime::{Error, Result};

/// Which transport the processes of one host use between them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Transport {
    /// Shared memory between processes of one host, TCP between hosts; if shared memory
    /// cannot be set up, TCP (with a warning).
    #[default]
    Auto,
    /// Shared memory between processes of one host (an error if it cannot be set up), TCP
    /// between hosts.
    Shm,
    /// TCP between every pair.
    Tcp,
}

impl Transport {
    /// From `COLLECTIX_TRANSPORT` (`auto`, `shm` or `tcp`; unset is `auto`).
    pub fn from_env() -> Result<Transport> {
        match std::env::var("COLLECTIX_TRANSPORT") {
            Err(_) => Ok(Transport::Auto),
            Ok(v) => match v.trim() {
                "" | "auto" => Ok(Transport::Auto),
                "shm" => Ok(Transport::Shm),
                "tcp" => Ok(Transport::Tcp),
                other => Err(Error::invalid(format!(
                    "COLLECTIX_TRANSPORT is {other:?}; set it to auto, shm or tcp"
                ))),
            },
        }
    }
}
