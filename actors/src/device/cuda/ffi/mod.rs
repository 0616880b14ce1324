//! The audited FFI of collectix-actors: one of the crate's two modules allowed `unsafe`
//! (with `transport::shm::os`; `#![deny(unsafe_code)]` everywhere else). Every block has a `// SAFETY:` line.
//!
//! - [`nccl`]: libnccl, loaded at run time, and safe calls over checked spans of device
//!   memory ([`nccl::Enqueue`], [`nccl::DevMem`]): the code that plans and launches NCCL
//!   operations holds no raw pointer.
//! - [`driver`]: the few CUDA driver calls cudarc marks unsafe (whether the driver library
//!   is present, a memory pool's release threshold, collectix's own pool and its allocations).
//! - [`fold`]: the device-local backend's reduction kernel (PTX, loaded at run time), launched
//!   over checked spans of device memory.
#![allow(unsafe_code)]

pub(crate) mod driver;
pub(crate) mod fold;
pub mod nccl;
