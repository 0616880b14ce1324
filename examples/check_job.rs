//! Checks a job end to end: every collective × every algorithm, with several dtypes and ops
//! and moving roots (`collectix::runtime::testing::matrix`), each result compared element for
//! element with a sequential reference, then a 4 MiB all_reduce cut into 1 KiB segments
//! (thousands of messages per call). Each rank prints `rank R: N cases ok`, or `rank R:
//! error: …` and exits 1 at the first call that fails or is wrong.
//!
//! Run it as the processes of a job, to check the transport between them:
//! ```text
//! collectix launch --nproc-per-node 4 -- target/debug/examples/check_job
//! mpirun -np 4 target/debug/examples/check_job
//! ```
//! or on its own, where it checks a world of 4 in-process ranks.

mod common;
use collectix::runtime::testing::matrix;
use collectix::{CallOptions, Communicator, GroupOptions, World};
use std::time::Duration;

/// Small segments: many messages per call, so that queues and flow control are exercised.
pub(crate) fn options() -> GroupOptions {
    GroupOptions {
        segment_bytes: 1024,
        ..GroupOptions::default()
    }
}

/// Runs the matrix on this rank; `Err` with the first failure, named. (`tests/suite/tcp_world.rs`
/// runs it too.)
pub(crate) fn check(c: &Communicator) -> std::result::Result<usize, String> {
    check_with(c, false)
}

/// [`check`], every input a tensor in shared memory when `shared`
/// (`Communicator::to_shared`).
pub(crate) fn check_with(c: &Communicator, shared: bool) -> std::result::Result<usize, String> {
    let (r, w) = (c.rank(), c.size());
    let cases = matrix(w);
    for case in &cases {
        let opts = CallOptions {
            algorithm: case.algorithm,
            timeout: Some(Duration::from_secs(60)),
        };
        let mut req = case.request(r);
        if shared {
            req = req
                .try_map(|t| c.to_shared(&t), |s| s)
                .map_err(|e| format!("{case:?}: {e}"))?;
        }
        let got = c
            .submit(req, &opts)
            .wait()
            .map_err(|e| format!("{case:?}: {e}"))?;
        if got != case.expected(r) {
            return Err(format!("{case:?}: wrong result"));
        }
    }
    Ok(cases.len())
}

#[allow(dead_code)]
fn report(r: usize, res: std::result::Result<usize, String>) -> bool {
    match res {
        Ok(n) => {
            println!("rank {r}: {n} cases ok");
            true
        }
        Err(e) => {
            println!("rank {r}: error: {e}");
            false
        }
    }
}

#[allow(dead_code)]
fn main() -> common::Main {
    common::Main(body())
}

/// What `main` does.
fn body() -> collectix::Result<()> {
    common::init_tracing();
    let ok = if common::launched() {
        let p = collectix::init(
            &collectix::InitArgs::default(),
            options(),
            Duration::from_secs(120),
        )?;
        let c = p.communicator().clone();
        println!(
            "rank {}: at {}, {} shared-memory peers, locality {:?}",
            c.rank(),
            p.address(),
            p.shm_peers(),
            c.locality()
        );
        let ok = report(c.rank(), check(&c));
        p.shutdown()?;
        ok
    } else {
        let world = World::local_with(4, options())?;
        let threads: Vec<_> = world
            .communicators()
            .iter()
            .cloned()
            .map(|c| std::thread::spawn(move || (c.rank(), check(&c))))
            .collect();
        let mut ok = true;
        for t in threads {
            let (r, res) = t
                .join()
                .unwrap_or((usize::MAX, Err("the rank's thread panicked".into())));
            ok &= report(r, res);
        }
        world.shutdown()?;
        ok
    };
    if !ok {
        std::process::exit(1);
    }
    Ok(())
}
