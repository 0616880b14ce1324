//! # collectix
//!
//! Collective communication for Rust — what `torch.distributed` (c10d) gives Python — built as
//! an actor runtime. Each rank is an actix actor that holds its tensors and exchanges tagged
//! messages with its peers; every c10d collective is an algorithm's schedule of sends and
//! receives that the rank actors execute.
//!
//! ```text
//!   your code ──(Communicator: Send + Sync + Clone)──┐  calls return Work at once
//!                                                    ▼
//!   ┌──────────── rank actor (own Arbiter thread) ─────────────┐
//!   │  Engine (collectix-runtime, sans-IO, deterministic)       │
//!   │    submit / handle_message / handle_timeout               │
//!   │    poll_transmit / poll_event / poll_timeout              │
//!   └──────────────┬───────────────────────────────────────────┘
//!                  │ Transport (in-process mailboxes now; TCP next)
//!   ┌──────────────▼───────────────────────────────────────────┐
//!   │ peer rank actors …                                        │
//!   └───────────────────────────────────────────────────────────┘
//! ```
//!
//! - [`runtime`] (`collectix-runtime`) is the protocol: tensors, dtypes, reduce kernels,
//!   algorithm schedules, message tags and matching, timeouts, aborts. No threads, no IO, no
//!   clock, so the same code runs under the seeded simulator (`runtime::testing::sim`, with
//!   the `testing` feature), loom, the in-process world and, later, TCP.
//! - [`actors`] (`collectix-actors`) drives it: one actor per rank, the transports, the
//!   [`World`], and the public API on [`Communicator`].
//!
//! ## Example
//! ```
//! use collectix::{ReduceOp, Tensor, World};
//!
//! let world = World::local(4)?;
//! // Every call returns a Work at once; the call is issued in call order.
//! let works: Vec<_> = world
//!     .communicators()
//!     .iter()
//!     .map(|c| {
//!         let r = c.rank() as f32;
//!         c.all_reduce(Tensor::from_vec(vec![r + 1.0, 2.0 * (r + 1.0)]), ReduceOp::Sum)
//!     })
//!     .collect();
//! for w in works {
//!     assert_eq!(w.wait()?.to_vec::<f32>()?, vec![10.0, 20.0]);
//! }
//! # Ok::<(), collectix::Error>(())
//! ```
//!
//! See `docs/architecture.md` for the layers, the life of one all_reduce message by message,
//! and the table that maps each torch.distributed call to its collectix equivalent.

pub use collectix_actors as actors;
pub use collectix_runtime as runtime;

pub use collectix_actors::device;
pub use collectix_actors::{
    Communicator, DeviceBackend, MemoryStore, P2POp, Store, TensorDeviceExt, Work, World,
};
pub use collectix_runtime::collective::TensorSpec;
pub use collectix_runtime::{
    Algorithm, CallOptions, DType, Device, DeviceError, Element, Error, GroupId, GroupOptions,
    OpKind, ReduceOp, Result, Tensor,
};
