//! A long all_reduce loop for multi-process jobs, each result checked: every rank adds
//! `[rank + 1; 1024]` for `ITERS` rounds (environment, default 200), and the sum is
//! `W(W+1)/2` everywhere. Prints `rank R: pid P` first (so that a test can kill a chosen rank)
//! and `rank R: ok ITERS` at the end, or `rank R: error: …` when a call fails, then exits 1.
//!
//! ```text
//! collectix launch --nproc-per-node 3 -- target/debug/examples/multiprocess
//! ```

mod common;
use collectix::{ReduceOp, Result, Tensor};

fn main() -> Result<()> {
    common::init_tracing();
    let p = collectix::init(
        &collectix::InitArgs::default(),
        collectix::GroupOptions::default(),
        std::time::Duration::from_secs(120),
    )?;
    let c = p.communicator();
    let (r, w) = (c.rank(), c.size());
    println!("rank {r}: pid {}", std::process::id());
    let iters: usize = std::env::var("ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let want = (w * (w + 1) / 2) as f32;
    for i in 0..iters {
        let x = Tensor::from_vec(vec![(r + 1) as f32; 1024]);
        match c.all_reduce(x, ReduceOp::Sum).wait() {
            Ok(t) if t.to_vec::<f32>()?.iter().all(|&v| v == want) => {}
            Ok(_) => {
                println!("rank {r}: wrong sum in round {i}");
                std::process::exit(1);
            }
            Err(e) => {
                println!("rank {r}: error: {e}");
                std::process::exit(1);
            }
        }
    }
    println!("rank {r}: ok {iters}");
    p.shutdown()
}
