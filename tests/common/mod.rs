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

/// A port that is free on loopback (and on every address) at the moment, and stays free
/// until a test binds it, unless another program takes it by number.
pub fn free_port() -> u16 {
    // Below the kernel's ephemeral range (`/proc/sys/net/ipv4/ip_local_port_range`, from
    // 32768 by default): the kernel never hands one of these to another test's listener on
    // port 0, or to an outgoing connection, between this check and the job's bind; and
    // below 20000, where the launcher tests derive ports from job ids. The tests of one
    // binary take them in turn (a per-process sequence, started at a place of
    // the process's own).
    const LOW: u32 = 10_000;
    const SPAN: u32 = 10_000;
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let start = std::process::id().wrapping_mul(7_919) % SPAN;
    for _ in 0..SPAN {
        let step = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let port = (LOW + (start + step) % SPAN) as u16;
        let free = |ip: &str| std::net::TcpListener::bind((ip, port)).is_ok();
        if free("127.0.0.1") && free("0.0.0.0") {
            return port;
        }
    }
    panic!("no free port from {LOW} to {}", LOW + SPAN - 1)
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
    let protocol = collectix::StoreProtocol::Collectix;
    job_speaking(protocol, transport, w, secret, options, body)
}

/// [`job_with`] whose ranks speak `protocol` to the store rank 0 serves.
pub fn job_speaking(
    protocol: collectix::StoreProtocol,
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
                        store_protocol: Some(protocol),
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
