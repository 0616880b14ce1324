//! The facade's integration tests, in one binary: one module per file, so that a fresh
//! build compiles and links one test crate instead of one per file (`cargo test -p collectix
//! --test suite board::` runs one file's tests). The tests that measure the whole process
//! (threads, allocations, descriptors, a global recorder or subscriber) and the device tests
//! keep binaries of their own (`tests/*.rs`).

#[path = "../common/mod.rs"]
mod common;

mod board;
mod board_mismatch;
mod buffers;
mod builder;
mod chaos;
mod coalesce;
mod collectives;
mod drop_on_rank_thread;
mod empty;
mod error_texts;
mod examples;
mod extreme_args;
mod failures;
mod fault_matrix;
mod hot_path;
mod join_settings;
mod lanes;
mod lateness;
mod liveness;
mod many_ranks;
mod mesh2d;
mod p2p_groups_objects;
mod p2p_mail;
mod partial;
mod pending;
mod seeded;
mod shared_output;
mod shared_tensors;
mod sizes;
mod standby;
mod status;
mod survive;
mod tcp_world;
mod torch_differential;
mod wait_cycles;
