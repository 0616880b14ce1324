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
/// instead of serving it). Every pair talks over TCP (no shared memory).
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
        transport: Some(collectix::Transport::Tcp),
        ..collectix::InitArgs::default()
    }
}

/// Runs `f` on every rank of a world of `w` in-process ranks (groups timing out after
/// `timeout`), each on a thread of its own; what each returned, in rank order.
pub fn on_every_rank(
    w: usize,
    timeout: Duration,
    f: impl Fn(&collectix::Communicator) -> std::result::Result<(), String> + Sync,
) -> Vec<std::result::Result<(), String>> {
    let world =
        collectix::World::local_with(w, collectix::GroupOptions::default().with_timeout(timeout))
            .unwrap_or_else(|e| panic!("{e}"));
    let comms = world.communicators();
    let f = &f;
    std::thread::scope(|s| {
        let hs: Vec<_> = comms.iter().map(|c| s.spawn(move || f(c))).collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("panicked".into())))
            .collect()
    })
}

/// Runs `w` ranks over TCP loopback, each a thread of this process with its own actor
/// system and sockets, joined through rank 0's store (init timeout: 20 s) with `secret` and
/// groups timing out after `timeout`, each running `body`; returns what each returned.
pub fn tcp_job(
    w: usize,
    secret: &str,
    timeout: Duration,
    body: impl Fn(usize, collectix::Process) -> std::result::Result<(), String> + Sync,
) -> Vec<std::result::Result<(), String>> {
    job(collectix::Transport::Tcp, w, secret, timeout, body)
}

/// [`tcp_job`] over `transport`: with `Shm`, the ranks (threads of one process, so of one
/// host) talk through shared memory, beside the TCP connections that tell a loss.
pub fn job(
    transport: collectix::Transport,
    w: usize,
    secret: &str,
    timeout: Duration,
    body: impl Fn(usize, collectix::Process) -> std::result::Result<(), String> + Sync,
) -> Vec<std::result::Result<(), String>> {
    let options = collectix::GroupOptions::default().with_timeout(timeout);
    job_with(transport, w, secret, options, body)
}

/// [`job`] with the groups' `options`.
pub fn job_with(
    transport: collectix::Transport,
    w: usize,
    secret: &str,
    options: collectix::GroupOptions,
    body: impl Fn(usize, collectix::Process) -> std::result::Result<(), String> + Sync,
) -> Vec<std::result::Result<(), String>> {
    let port = free_port();
    let (body, options) = (&body, &options);
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..w)
            .map(|r| {
                s.spawn(move || -> std::result::Result<(), String> {
                    let args = collectix::InitArgs {
                        transport: Some(transport),
                        ..tcp_args(port, r, w, secret, false)
                    };
                    let p = collectix::init(&args, options.clone(), Duration::from_secs(20))
                        .map_err(|e| e.to_string())?;
                    body(r, p)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("panicked".into())))
            .collect()
    })
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
