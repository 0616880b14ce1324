//! collectix-runtime: the sans-IO core of collectix.
#![deny(unsafe_code)]

pub mod algorithm;
pub mod collective;
pub mod completion;
pub mod dtype;
pub mod engine;
pub mod error;
pub mod group;
pub mod message;
pub mod op;
pub mod reduce;
pub mod schedule;
pub mod sim;
mod sync;
pub mod tensor;
pub mod tensor_ops;
pub mod testing;
pub mod time;

pub use collective::{Fingerprint, Output, Plan, Request, TensorSpec};
pub use dtype::{DType, Element};
pub use engine::{Engine, Event, OpId};
pub use error::{Error, Result};
pub use group::{CallOptions, GroupId, GroupInfo, GroupOptions};
pub use op::{Algorithm, OpKind};
pub use reduce::ReduceOp;
pub use tensor::{Device, Tensor};
pub use time::Time;
