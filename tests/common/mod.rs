//! Helpers shared by the integration tests.
#![allow(dead_code, unreachable_pub)]

use collectix::{Error, Result, Work};
use std::time::Duration;

/// Waits for every handle, at most `secs` seconds each; a hang is a test failure.
pub fn wait_all<T>(works: Vec<Work<T>>, secs: u64) -> Vec<Result<T>> {
    works
        .into_iter()
        .enumerate()
        .map(|(r, w)| match w.wait_timeout(Duration::from_secs(secs)) {
            Some(v) => v,
            None => panic!("rank {r}: no result within {secs} s"),
        })
        .collect()
}

/// A port that is free on loopback at the moment.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_or(29_995, |a| a.port())
}

/// Rank `r` of `w` joining a TCP job through `tcp://127.0.0.1:PORT`, every connection
/// proving `secret`; with `launcher_store`, the store is served apart (rank 0 connects to it
/// instead of serving it).
pub fn tcp_args(
    port: u16,
    r: usize,
    w: usize,
    secret: &str,
    launcher_store: bool,
) -> collectix::InitArgs {
    let secret = collectix::Secret::new(secret).unwrap_or_else(|e| panic!("{e}"));
    collectix::InitArgs {
        init_method: Some(format!("tcp://127.0.0.1:{port}")),
        rank: Some(r),
        world_size: Some(w),
        security: Some(collectix::Security::with_secret(secret)),
        launcher_store: Some(launcher_store),
        ..collectix::InitArgs::default()
    }
}

/// The failure at the root of an error.
pub fn root(e: &Error) -> &Error {
    e.root_cause()
}

/// A waker whose `wake` panics with "my executor is broken" (a broken executor).
pub fn panicking_waker() -> std::task::Waker {
    struct Boom;
    impl std::task::Wake for Boom {
        fn wake(self: std::sync::Arc<Self>) {
            panic!("my executor is broken");
        }
    }
    std::task::Waker::from(std::sync::Arc::new(Boom))
}

pub mod device;
