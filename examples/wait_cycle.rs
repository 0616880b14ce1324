//! A wait cycle across groups, as a job makes one: two groups of every rank, A and B; the
//! first half of the ranks call all_reduce on A and then on B, the second half on B and then
//! on A, each waiting for its call before the next (torch deadlocks here: torchrec#4149).
//!
//! Each call times out after `TIMEOUT_MS` (environment, default 5000); every rank prints
//! `rank R: <what its first call returned>`: the wait cycle, naming its ranks, groups and
//! calls. The job fails (each rank exits with the error). While the ranks wait,
//! `collectix status --explain` shows the cycle forming.
//!
//! ```text
//! collectix launch --nproc-per-node 4 -- target/debug/examples/wait_cycle
//! ```

mod common;
use collectix::{CallOptions, ReduceOp, Tensor};
use std::time::Duration;

fn main() -> common::Main {
    common::Main(body())
}

/// What `main` does.
fn body() -> collectix::Result<()> {
    common::init_tracing();
    let p = collectix::init(
        &collectix::InitArgs::default(),
        collectix::GroupOptions::default(),
        Duration::from_secs(120),
    )?;
    let c = p.communicator().clone();
    let (r, w) = (c.rank(), c.size());
    let all: Vec<usize> = (0..w).collect();
    let not_a_member = || collectix::Error::internal("a rank is not in a group of every rank");
    let a = c.new_group(&all).wait()?.ok_or_else(not_a_member)?;
    let b = c.new_group(&all).wait()?.ok_or_else(not_a_member)?;
    let ms = std::env::var("TIMEOUT_MS")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(5000);
    let opts = CallOptions {
        timeout: Some(Duration::from_millis(ms)),
        ..CallOptions::default()
    };
    let (first, second) = if r < w / 2 { (&a, &b) } else { (&b, &a) };
    let x = || Tensor::from_vec(vec![1.0f32; 1024]);
    let got = first.all_reduce_with(x(), ReduceOp::Sum, &opts).wait();
    match &got {
        Ok(_) => println!("rank {r}: completed"),
        Err(e) => println!("rank {r}: {e}"),
    }
    got?;
    second.all_reduce_with(x(), ReduceOp::Sum, &opts).wait()?;
    p.shutdown()
}
