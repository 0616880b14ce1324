//! The `collectix` program's tests, in one binary: one module per file, so that a fresh
//! build compiles and links one test crate instead of one per file (`cargo test -p
//! collectix-cli --test suite launch::` runs one file's tests).

#[path = "../common/mod.rs"]
mod common;

mod chaos;
mod check;
mod deploy;
mod doctor;
mod elastic;
mod launch;
mod launchers;
mod multiprocess;
mod network;
mod service;
mod store;
mod torch;
