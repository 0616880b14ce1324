//! # collectix-actors: rank actors, transports and the public API
//!
//! Each rank is an actix actor on its own `Arbiter` thread that owns one
//! [`Engine`](collectix_runtime::Engine) and drives it: handlers feed the engine (a call, a
//! peer's message, a timer), then one `drive()` drains its outputs to its per-peer links
//! ([`transport`]: a link may say "would block"; what it refuses waits in an outbox), to the
//! callers' [`Work`] handles and to the next timer. No protocol decision lives here.
//!
//! ```text
//!   World::local(n)
//!     └─ "collectix-system" thread: actix System
//!          ├─ Arbiter thread 0: RankActor { Engine, links + outboxes, waiting Works, timer }
//!          ├─ Arbiter thread 1: RankActor …
//!          └─ …
//!   Communicator (Send + Sync + Clone) ──Submit──▶ RankActor mailbox
//!   RankActor ──LocalLink: Deliver { src, Message }──▶ peer RankActor mailbox
//!                                  (payloads moved, never serialized; src stamped by the link)
//! ```
//!
//! The actix `System` runs on a thread of its own, so a [`World`] can be made from plain
//! `fn main`, from inside `#[tokio::main]` and from tests; handles are `Send + Sync` and
//! [`Work`] is an ordinary `Future` (any executor) with a blocking `wait()` besides. Messages
//! between ranks are one-way (`do_send`); no handler waits for a peer.
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

pub mod comm;
pub mod device;
pub mod init;
pub mod object;
pub mod process;
pub(crate) mod rank;
pub mod security;
pub mod store;
mod system;
pub mod transport;
pub mod work;
pub mod world;

pub use comm::{Communicator, P2POp};
pub use device::{DeviceBackend, TensorDeviceExt};
pub use init::{InitArgs, JobConfig, Launcher, Rendezvous};
pub use process::{init, Process};
pub use security::{Secret, Security};
pub use store::{FileStore, MemoryStore, PrefixStore, Store, TcpStore, TcpStoreServer};
pub use transport::mesh::Connect;
pub use work::Work;
pub use world::World;
