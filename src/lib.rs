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
//!                  │ Transport (in-process mailboxes, or TCP between processes)
//!   ┌──────────────▼───────────────────────────────────────────┐
//!   │ peer rank actors …                                        │
//!   └───────────────────────────────────────────────────────────┘
//! ```
//!
//! - [`runtime`] (`collectix-runtime`) is the protocol: tensors, dtypes, reduce kernels,
//!   algorithm schedules, message tags and matching, timeouts, aborts. No threads, no IO, no
//!   clock, so the same code runs under the seeded simulator (`runtime::testing::sim`, with
//!   the `testing` feature), loom, the in-process world and processes over TCP.
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
//! ## When things go wrong
//!
//! A wrong program ends with a typed [`Error`] on every rank, within the call's timeout plus
//! the group's `desync_grace`: ranks that disagree about a call get [`Error::Mismatch`]
//! naming both calls; a call that times out first asks every member which call it is in, and
//! its [`Error::Timeout`] names exactly the ranks that have not made it. A call that
//! finishes early (a broadcast root, a gather non-root, a send) returns `Ok` even when its
//! peers were in another call; what the rank learns afterwards is the group's *pending
//! error*, returned by its next call on the group, by
//! [`monitored_barrier`](Communicator::monitored_barrier), by
//! [`destroy`](Communicator::destroy) and by [`World::shutdown`] (a world dropped without
//! `shutdown` logs it). End a program, or a phase, with `monitored_barrier` to hear of
//! everything. `docs/errors.md` shows the real texts and what each means.
//!
//! ```
//! use collectix::{Error, Tensor, World};
//!
//! let world = World::local(2)?;
//! let c = world.communicators();
//! // The root's broadcast completes at once: Ok, although rank 1 expects 4 elements.
//! assert!(c[0].broadcast(Tensor::from_vec(vec![1i32, 2, 3]), 0).wait().is_ok());
//! assert!(c[1].broadcast(Tensor::from_vec(vec![0i32; 4]), 0).wait().is_err());
//! // Rank 0 hears of it from the shutdown.
//! let e = world.shutdown().unwrap_err();
//! assert!(matches!(e.root_cause(), Error::Mismatch { .. }));
//! # Ok::<(), collectix::Error>(())
//! ```
//!
//! See `docs/architecture.md` for the layers, the life of one all_reduce message by message,
//! and the table that maps each torch.distributed call to its collectix equivalent.

pub use collectix_actors as actors;
pub use collectix_runtime as runtime;

pub use collectix_actors::device;
pub use collectix_actors::device::TensorDeviceExt;
pub use collectix_actors::doctor;
pub use collectix_actors::{
    init, job_status, BufferCalls, BufferWork, CallRecord, CallState, Communicator, Connect,
    DeviceBackend, Failed, Fault, FileStore, InitArgs, JobConfig, JobStatus, Launcher, Liveness,
    MemoryStore, Mesh2d, P2POp, Policy, PrefixStore, Process, ProcessBuilder, RankStatus,
    Recovered, Rendezvous, Run, Secret, Security, Seeded, SharedBuffer, Step, Store, StoreProtocol,
    TcpStore, TcpStoreServer, TorchStore, Transport, Work, World, WorldBuilder, CALLS_KEPT,
    DEFAULT_JOIN_TIMEOUT, FIRST_RESERVED_TAG, SEED_VARIABLE,
};
pub use collectix_runtime::collective::TensorSpec;
pub use collectix_runtime::{
    Algorithm, Buffer, CallOptions, DType, Device, DeviceError, Element, Error, GroupId,
    GroupOptions, Locality, OpKind, ReduceOp, Request, Result, Tensor,
};
