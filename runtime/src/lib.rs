//! # collectix-runtime: the sans-IO protocol core of collectix
//!
//! Everything that decides what a rank sends, when, and what it makes of what it receives —
//! and nothing else: no threads, no sockets, no actix or tokio, no clock (time is a [`Time`]
//! the driver passes in). That is what lets one implementation run under a seeded simulator
//! (`testing::sim`, feature `testing`), under loom (build with `--cfg collectix_loom`), in the in-process actor world
//! and, later, over TCP and NCCL.
//!
//! ```text
//!   Request ──Plan::new──▶ Plan ──Engine::submit──▶ ┌────────── Engine ──────────┐
//!   (torch args)   validate, fingerprint,           │ groups · calls · matcher    │──poll_transmit──▶ Transmit
//!                  choose algorithm, schedule,      │ schedules over chunks       │──poll_event────▶ Event (Output | Error)
//!                  cut inputs into chunks           │ timeouts · aborts           │──poll_timeout──▶ Time
//!                                                   └──▲────────────▲────────────┘
//!                                    handle_message(Message, now)   handle_timeout(now), handle_peer_lost(rank, now)
//! ```
//!
//! The layout, one concern per folder:
//!
//! - [`ids`]: what names a group and what every rank's call must agree on ([`Fingerprint`]),
//!   with explicit wire codes; a leaf, so [`error`] describes calls without importing any
//!   protocol module.
//! - [`tensor`]: host tensors over shared, aligned `Bytes`; [`tensor::dtype`] (the thirteen
//!   dtypes), [`tensor::reduce`] ([`ReduceOp`] with torch's dtype rules and the kernels;
//!   numerics documented there), [`tensor::local_ops`] (torch's local `scatter_`/`gather`).
//! - [`collective`]: each collective as a spec in a file of its own — argument checks,
//!   sizes, fingerprint, [`Plan`].
//! - [`schedule`], [`algorithm`]: a schedule is steps of sends and receives over chunks; one
//!   file per algorithm (ring, halving-doubling, recursive doubling, binomial tree, direct,
//!   dissemination, pairwise), each with its diagram and source.
//! - [`engine`]: the per-rank state machine, split by concern (groups, the call interpreter,
//!   point-to-point matching, flow control, failures, output assembly).
//! - [`data_plane`]: where chunks live and how they are combined (host memory today);
//!   [`landing`]: where a message's payload goes, named before a transport reads it.
//! - [`wire`]: what travels ([`wire::message`]), the frames it travels in on byte streams
//!   ([`wire::codec`]), and the per-peer link seam every transport sits behind
//!   ([`wire::link`]).
//! - `testing` (feature `testing`): the deterministic simulator (`testing::sim`) and the
//!   cases and reference results shared by tests and benchmarks.

//! ## Example: three ranks, no threads
//! ```
//! use collectix_runtime::testing::sim::Sim;
//! use collectix_runtime::{CallOptions, GroupId, Output, ReduceOp, Request, Tensor};
//!
//! let mut sim = Sim::new(3, 42); // 3 engines, messages delivered in seeded random order
//! let ops: Vec<_> = (0..3)
//!     .map(|r| {
//!         let t = Tensor::from_vec(vec![r as i32, 10]);
//!         sim.submit(r, GroupId::WORLD, Request::AllReduce { tensor: t, op: ReduceOp::Sum }, &CallOptions::default())
//!     })
//!     .collect::<Result<_, _>>()?;
//! sim.run_no_timeouts(10_000).expect("settles");
//! for (r, op) in ops.into_iter().enumerate() {
//!     let Some(Ok(Output::Tensor(t))) = sim.take(r, op) else { panic!("rank {r}") };
//!     assert_eq!(t.to_vec::<i32>()?, vec![3, 30]);
//! }
//! # Ok::<(), collectix_runtime::Error>(())
//! ```
#![deny(unsafe_code)]

pub mod algorithm;
pub mod board;
pub mod collective;
#[doc(hidden)]
pub mod completion;
pub mod data_plane;
pub mod device_agreement;
pub mod device_lanes;
pub mod doctor;
pub mod engine;
pub mod error;
pub mod fast_hash;
pub mod group;
pub mod ids;
pub mod issuers;
pub mod join;
pub mod landing;
pub mod lateness;
#[cfg(all(test, collectix_loom))]
mod loom_models;
mod op;
pub mod progress;
pub mod recovery;
pub mod schedule;
mod sync;
pub mod tensor;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
mod time;
pub mod verdict;
pub mod wire;

pub use collective::{CheckedCall, Destination, Output, Plan, Request, TensorSpec};
pub use engine::{BoardEvent, Engine, Event, OpId};
pub use error::{DeviceError, Error, LinkFailure, LinkStep, RankCall, Result};
pub use group::{CallOptions, GroupId, GroupInfo, GroupOptions, Locality};
pub use ids::{DataPath, Fingerprint};
pub use op::{Algorithm, CodeError, OpKind, ReduceKind};
pub use tensor::buffer::Buffer;
pub use tensor::dtype::{bf16, f16, DType, Element};
pub use tensor::reduce::ReduceOp;
pub use tensor::{Device, DeviceStorage, Tensor};
pub use time::Time;
