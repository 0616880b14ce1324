//! A long all_reduce loop for multi-process jobs, each result checked: every rank adds
//! `[rank + 1; 1024]` for `ITERS` rounds (environment, default 200), and the sum is
//! `W(W+1)/2` everywhere. Prints `rank R: pid P, joined in T ms, at ADDR, N shared-memory
//! peers` first (so that a test can kill a chosen rank; ADDR is where its peers reach it) and `rank R: ok ITERS in T ms (first F ms), N threads` at the end (the
//! loop's time, its first call's, and this process's threads where `/proc` tells), or
//! `rank R: error: …` when a call fails, then exits 1. With `FIRST=all_to_all` the first
//! call is an all_to_all instead (every rank talks to every other: with lazy connection it
//! makes every pair's connection). With `IDLE_MS`, the job then sits idle that long before it
//! leaves (after printing `rank R: idle for N ms`). The timings are what `bench/connect.py` collects to
//! compare eager and lazy connection.
//!
//! ```text
//! collectix launch --nproc-per-node 3 -- target/debug/examples/multiprocess
//! ```

mod common;
use collectix::{DType, ReduceOp, Tensor, TensorSpec};

fn main() -> common::Main {
    common::Main(body())
}

/// What `main` does.
fn body() -> collectix::Result<()> {
    common::init_tracing();
    let start = std::time::Instant::now();
    let p = collectix::init(
        &collectix::InitArgs::default(),
        collectix::GroupOptions::default(),
        std::time::Duration::from_secs(120),
    )?;
    let c = p.communicator().clone();
    let (r, w) = (c.rank(), c.size());
    let joined = start.elapsed();
    println!(
        "rank {r}: pid {}, joined in {:.1} ms, at {}, {} shared-memory peers",
        std::process::id(),
        joined.as_secs_f64() * 1e3,
        p.address(),
        p.shm_peers()
    );
    let iters: usize = std::env::var("ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let want = (w * (w + 1) / 2) as f32;
    let looping = std::time::Instant::now();
    let mut first = None;
    if std::env::var("FIRST").is_ok_and(|v| v == "all_to_all") {
        // Block j of rank r is `[r]`: every rank gets `[0, 1, …, W-1]` back.
        let blocks = vec![Tensor::from_vec(vec![r as f32]); w];
        let out = c.all_to_all(vec![TensorSpec::new(&[1], DType::F32); w], blocks);
        match out.wait() {
            Ok(o)
                if o.iter()
                    .enumerate()
                    .all(|(j, t)| *t == Tensor::from_vec(vec![j as f32])) =>
            {
                first = Some(looping.elapsed());
            }
            Ok(_) => {
                println!("rank {r}: wrong all_to_all");
                std::process::exit(1);
            }
            Err(e) => {
                println!("rank {r}: error: {e}");
                p.abort();
                std::process::exit(1);
            }
        }
    }
    for i in 0..iters {
        let x = Tensor::from_vec(vec![(r + 1) as f32; 1024]);
        match c.all_reduce(x, ReduceOp::Sum).wait() {
            Ok(t) if t.to_vec::<f32>()?.iter().all(|&v| v == want) => {
                first.get_or_insert(looping.elapsed());
            }
            Ok(_) => {
                println!("rank {r}: wrong sum in round {i}");
                std::process::exit(1);
            }
            Err(e) => {
                println!("rank {r}: error: {e}");
                // The abort this rank sent its peers goes out before the process does.
                p.abort();
                std::process::exit(1);
            }
        }
    }
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    let threads = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Threads:")?.trim().parse::<usize>().ok())
        })
        .map_or("? threads".to_string(), |n| format!("{n} threads"));
    println!(
        "rank {r}: ok {iters} in {:.1} ms (first {:.2} ms), {threads}",
        ms(looping.elapsed()),
        ms(first.unwrap_or_default())
    );
    // `IDLE_MS`: the job then sits idle that long (a test reads what CPU it uses meanwhile).
    if let Some(idle) = std::env::var("IDLE_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        c.barrier().wait()?;
        println!("rank {r}: idle for {idle} ms");
        std::thread::sleep(std::time::Duration::from_millis(idle));
    }
    p.shutdown()
}
