//! # collectix-actors: rank actors, transports and the public API
//!
//! Each rank's [`Engine`](collectix_runtime::Engine) sits behind a lock in the rank's
//! driver, which its communicators, its actor and its transports share. Callers issue their
//! calls on it directly, and a caller waiting for a call drives the rank itself for a short
//! while (it takes the rank's arrivals and runs the engine); when no caller drives, the
//! rank's actix actor (on its own `Arbiter` thread) does, woken by the transport once per
//! burst. The actor also owns the rank's timer and its shutdown. No protocol decision lives
//! here (see `docs/architecture.md`, "The hot path").
//!
//! ```text
//!   World::local(n)
//!     ├─ Driver per rank: { Engine, links + outboxes, waiting Works } behind a lock, + Inbox
//!     └─ "collectix-system" thread: actix System
//!          ├─ Arbiter thread 0: RankActor (background driver of rank 0, its timer)
//!          └─ …
//!   Communicator (Send + Sync + Clone) ──submit, on the caller's thread──▶ Driver
//!   Driver ──LocalLink: deliver(src, Message)──▶ peer Driver's Inbox
//!                                  (payloads moved, never serialized; src stamped by the link)
//!   Work::wait / .await ──drives the rank while it waits, then parks──▶ completion slot
//! ```
//!
//! The actix `System` runs on a thread of its own, so a [`World`] can be made from plain
//! `fn main`, from inside `#[tokio::main]` and from tests; handles are `Send + Sync` and
//! [`Work`] is an ordinary `Future` (any executor) with a blocking `wait()` besides. Messages
//! between ranks are one-way; nothing waits for a peer while it holds a rank's lock.
//!
//! ```
//! use collectix_actors::World;
//! use collectix_runtime::{ReduceOp, Tensor};
//!
//! let world = World::local(3)?;
//! let works: Vec<_> = world.communicators().iter()
//!     .map(|c| c.all_reduce(Tensor::from_vec(vec![c.rank() as i64]), ReduceOp::Max))
//!     .collect();
//! for w in works {
//!     assert_eq!(w.wait()?.to_vec::<i64>()?, vec![2]);
//! }
//! # Ok::<(), collectix_runtime::Error>(())
//! ```

#![deny(unsafe_code)]

mod addr;
mod assemble;
mod backend;
mod board;
mod buffers;
mod builder;
mod comm;
pub mod device;
pub mod doctor;
#[cfg(test)]
mod fuzz;
mod gate;
mod job;
mod member;
mod mesh2d;
pub mod metrics;
mod object;
mod process;
mod rank;
mod recovery;
mod security;
mod seeded;
mod shared;
mod site;
mod status;
mod store;
mod supervise;
mod sync;
#[cfg(test)]
mod test_support;
mod transport;
mod work;
mod world;

pub use backend::p2p::FIRST_RESERVED_TAG;
pub use backend::DeviceBackend;
pub use buffers::{BufferCalls, BufferWork, Failed};
pub use builder::{ProcessBuilder, DEFAULT_JOIN_TIMEOUT};
pub use comm::{Communicator, P2POp};
pub use job::{parse_nodelist, InitArgs, JobConfig, Launcher, Rendezvous};
pub use mesh2d::Mesh2d;
pub use process::{init, Process};
pub use recovery::Recovered;
pub use security::{Secret, Security, MAX_SECRET_BYTES};
pub use seeded::{Fault, Run, Seeded, Step, SEED_VARIABLE};
pub use shared::SharedBuffer;
pub use status::{job_status, CallRecord, CallState, JobStatus, RankStatus, CALLS_KEPT};
pub use store::{
    FileStore, MemoryStore, PrefixStore, Store, StoreProtocol, TcpStore, TcpStoreServer, TorchStore,
};
pub use supervise::Policy;
pub use transport::mesh::Connect;
pub use transport::tcp::Liveness;
pub use transport::Transport;
pub use work::Work;
pub use world::{World, WorldBuilder};
