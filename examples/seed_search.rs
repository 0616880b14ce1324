//! Finding an ordering bug in your own algorithm with seeded runs: a hand-written ring
//! all-reduce over `send`/`recv` on 4 ranks, with a planted bug that only some interleavings
//! show. Rank 2 tells rank 0 when it is done, on the tag the ring uses, and the ring
//! receives from any source: a rank 0 still in the ring when the report comes takes it for
//! its neighbour's chunk. `Seeded::search` runs the program under 1,000 seeds and stops at the
//! first whose results are wrong; that seed replays the failure exactly (in your tests:
//! `COLLECTIX_SEED=<seed> cargo test ...`). The fixed ring (the receive names its source)
//! passes every seed.
//!
//! Prints (the same on every machine: a run depends on nothing but its seed; rank 0 waits
//! out the default 300 s timeout in virtual time, in no wall time):
//! ```text
//! buggy ring: 293 of 1000 seeds fail; the first, seed 1, after 300s (virtual):
//!   rank 0: recv (point-to-point on group world) timed out on rank 0, still waiting for ranks [2]
//!   rank 1: [10.0, 20.0, 30.0, 2.0], want [10.0, 20.0, 30.0, 40.0]
//!   rank 2: [10.0, 20.0, 30.0, 40.0]
//!   rank 3: [10.0, 20.0, 30.0, 40.0]
//! replay of seed 1: the same steps (81) and the same results
//! fixed ring: 1000 seeds, no failure
//! ```

mod common;
use collectix::{Communicator, DType, Result, Run, Seeded, Tensor, TensorSpec};

const RANKS: usize = 4;
/// The tag the ring's messages and the report share (the bug's accomplice).
const TAG: u32 = 0;
/// The rank that reports to rank 0 (not a neighbour of rank 0's, whose messages to it
/// come in order on one link).
const REPORTER: usize = 2;

/// A ring all-reduce (sum) of `data` (one element per rank): a reduce-scatter around the
/// ring, then an all-gather. With `buggy`, receives take a message from any source.
async fn ring_all_reduce(c: &Communicator, mut data: Vec<f64>, buggy: bool) -> Result<Vec<f64>> {
    let (r, w) = (c.rank(), c.size());
    let (right, left) = ((r + 1) % w, (r + w - 1) % w);
    let from = if buggy { None } else { Some(left) };
    let one = TensorSpec::new(&[1], DType::F64);
    // Reduce-scatter: after w - 1 steps, rank r holds the sum of chunk (r + 1) % w.
    for s in 0..w - 1 {
        let out = (r + w - s) % w;
        let into = (r + w - s - 1) % w;
        let sent = c.send(Tensor::from_vec(vec![data[out]]), right, TAG);
        let (t, _) = c.recv(one.clone(), from, TAG).await?;
        data[into] += t.to_vec::<f64>()?[0];
        sent.await?;
    }
    // All-gather: each chunk's sum goes around the ring.
    for s in 0..w - 1 {
        let out = (r + 1 + w - s) % w;
        let into = (r + w - s) % w;
        let sent = c.send(Tensor::from_vec(vec![data[out]]), right, TAG);
        let (t, _) = c.recv(one.clone(), from, TAG).await?;
        data[into] = t.to_vec::<f64>()?[0];
        sent.await?;
    }
    // Done: rank 2 reports to rank 0, which takes the report.
    if r == REPORTER {
        c.send(Tensor::from_vec(vec![r as f64]), 0, TAG).await?;
    }
    if r == 0 && w > REPORTER {
        c.recv(one, Some(REPORTER), TAG).await?;
    }
    Ok(data)
}

/// Rank r's input: chunk i holds (r + 1)(i + 1); summed over the 4 ranks, 10 (i + 1).
fn input(r: usize) -> Vec<f64> {
    (0..RANKS).map(|i| ((r + 1) * (i + 1)) as f64).collect()
}

fn want() -> Vec<f64> {
    (0..RANKS).map(|i| (10 * (i + 1)) as f64).collect()
}

fn correct(run: &Run<Vec<f64>>) -> bool {
    run.results.iter().all(|r| r.as_ref().ok() == Some(&want()))
}

/// The example's output.
pub(crate) fn lines() -> Result<Vec<String>> {
    let buggy = |c: Communicator| async move { ring_all_reduce(&c, input(c.rank()), true).await };
    let fixed = |c: Communicator| async move { ring_all_reduce(&c, input(c.rank()), false).await };
    let mut out = Vec::new();
    let Some(failed) = Seeded::new(RANKS).search(0..1000, buggy, correct) else {
        return Ok(vec!["buggy ring: no seed of 1000 failed".into()]);
    };
    let failing = (0..1000)
        .filter(|&seed| !correct(&Seeded::new(RANKS).seed(seed).run(buggy)))
        .count();
    out.push(format!(
        "buggy ring: {failing} of 1000 seeds fail; the first, seed {}, after {:?} (virtual):",
        failed.seed, failed.elapsed
    ));
    for (r, got) in failed.results.iter().enumerate() {
        match got {
            Ok(v) if v == &want() => out.push(format!("  rank {r}: {v:?}")),
            Ok(v) => out.push(format!("  rank {r}: {v:?}, want {:?}", want())),
            Err(e) => out.push(format!("  rank {r}: {e}")),
        }
    }
    let replay = Seeded::new(RANKS).seed(failed.seed).run(buggy);
    let same = replay.trace == failed.trace
        && format!("{:?}", replay.results) == format!("{:?}", failed.results);
    out.push(format!(
        "replay of seed {}: {} ({}) and {}",
        failed.seed,
        if same {
            "the same steps"
        } else {
            "other steps"
        },
        replay.trace.len(),
        if same {
            "the same results"
        } else {
            "other results"
        },
    ));
    out.push(match Seeded::new(RANKS).search(0..1000, fixed, correct) {
        None => "fixed ring: 1000 seeds, no failure".into(),
        Some(run) => format!("fixed ring: fails at seed {}", run.seed),
    });
    Ok(out)
}

#[allow(dead_code)]
fn main() -> common::Main {
    common::Main(body())
}

/// What `main` does.
fn body() -> collectix::Result<()> {
    common::print(&lines()?);
    Ok(())
}
