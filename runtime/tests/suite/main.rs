//! The runtime's integration tests, in one binary: one module per file, so that a fresh
//! build compiles and links one test crate instead of one per file (`cargo test -p
//! collectix-runtime --test suite engine::` runs one file's tests).

#[path = "../common/mod.rs"]
mod common;

mod buffers;
mod check;
mod coalesce;
mod codec;
mod engine;
mod engine_fuzz;
mod failed_calls;
mod fault_matrix;
mod flow;
mod hierarchical;
mod lateness;
mod liveness;
mod mail;
mod matrix;
mod pending;
mod revoke;
mod schedules;
mod sim_faults;
mod sim_properties;
mod taxonomy;
mod wait_cycles;
