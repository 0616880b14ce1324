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
