//! Data-parallel training that survives the loss of any rank: a linear model fitted by
//! gradient descent, one all_reduce of the gradient per step. When a step fails (a rank
//! died, the group was revoked), the survivors shrink the group (`Communicator::shrink`),
//! roll back to the last step that completed on all of them (`Shrunk::completed`) and go on
//! with one rank fewer.
//!
//! The result does not depend on how many ranks there are or which died: every step uses
//! the same global batch, split among the ranks that are left, and the gradient is summed in
//! fixed point (integers add up exactly in any order), so the final parameters are the same
//! bits as a run with no fault. Each rank's first line is `rank R: pid P`; its last line is
//! `rank R: final loss <L> params <digest>` (the digest covers every parameter's bits).
//!
//! ```text
//! collectix launch --nproc-per-node 4 --on-failure shrink -- target/debug/examples/elastic --steps 200 --step-ms 20
//! ```
//!
//! Kill any rank's process while it runs (`kill -9`): the others say so and finish. Flags:
//! `--steps N` (default 100), `--step-ms M` (extra time per step, default 0), and for tests
//! `--crash-rank R --crash-at-step S` (rank R aborts itself at step S).

mod common;
use collectix::{Communicator, Error, GroupOptions, ReduceOp, Result, Tensor};
use std::time::Duration;

/// Features of the model.
const D: usize = 8;
/// Samples in each step's global batch.
const BATCH: usize = 48;
/// The gradient's fixed point: units of 2^-24.
const SCALE: f64 = (1u64 << 24) as f64;
/// The learning rate.
const LR: f64 = 0.2;

/// splitmix64: the data, the same on every rank.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A number in [-1, 1) from `key`.
fn uniform(key: u64) -> f64 {
    (mix(key) >> 11) as f64 / (1u64 << 52) as f64 - 1.0
}

/// Sample `i` of step `step` (`step` = `u64::MAX`: the evaluation set): features and target.
fn sample(step: u64, i: usize) -> ([f64; D], f64) {
    let base = step.wrapping_mul(1_000_003).wrapping_add(i as u64 * 97);
    let mut x = [0.0; D];
    for (j, v) in x.iter_mut().enumerate() {
        *v = uniform(base.wrapping_mul(31).wrapping_add(j as u64));
    }
    let truth: f64 = x
        .iter()
        .enumerate()
        .map(|(j, v)| v * (j as f64 - 3.5) / 2.0)
        .sum();
    (x, truth + 0.01 * uniform(base ^ 0x5eed))
}

fn predict(w: &[f64; D], x: &[f64; D]) -> f64 {
    w.iter().zip(x).map(|(a, b)| a * b).sum()
}

/// This rank's share of step `step`'s gradient, in fixed point: samples `i` with
/// `i % size == rank`.
fn local_gradient(w: &[f64; D], step: u64, rank: usize, size: usize) -> Vec<i64> {
    let mut g = vec![0i64; D];
    for i in (rank..BATCH).step_by(size) {
        let (x, y) = sample(step, i);
        let err = predict(w, &x) - y;
        for j in 0..D {
            g[j] += (err * x[j] * SCALE).round() as i64;
        }
    }
    g
}

/// The mean squared error on a fixed evaluation set.
fn loss(w: &[f64; D]) -> f64 {
    let n = 256;
    (0..n)
        .map(|i| {
            let (x, y) = sample(u64::MAX, i);
            (predict(w, &x) - y).powi(2)
        })
        .sum::<f64>()
        / n as f64
}

/// FNV-1a over the parameters' bits.
fn digest(w: &[f64; D]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for v in w {
        for b in v.to_bits().to_le_bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    format!("{h:016x}")
}

/// One step on `comm`: the summed gradient, applied to `w`.
fn step_on(comm: &Communicator, w: &[f64; D], step: u64) -> Result<[f64; D]> {
    let g = local_gradient(w, step, comm.rank(), comm.size());
    let sum = comm
        .all_reduce(Tensor::from_vec(g), ReduceOp::Sum)
        .wait()?
        .to_vec::<i64>()?;
    let mut next = *w;
    for j in 0..D {
        next[j] -= LR * (sum[j] as f64 / SCALE) / BATCH as f64;
    }
    Ok(next)
}

struct Flags {
    steps: u64,
    step_ms: u64,
    crash: Option<(usize, u64)>,
}

fn flags() -> std::result::Result<Flags, String> {
    let mut f = Flags {
        steps: 100,
        step_ms: 0,
        crash: None,
    };
    let (mut crash_rank, mut crash_step) = (None, None);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = |name: &str| -> std::result::Result<u64, String> {
            args.next()
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| format!("{name} needs a number"))
        };
        match a.as_str() {
            "--steps" => f.steps = value("--steps")?,
            "--step-ms" => f.step_ms = value("--step-ms")?,
            "--crash-rank" => crash_rank = Some(value("--crash-rank")? as usize),
            "--crash-at-step" => crash_step = Some(value("--crash-at-step")?),
            other => return Err(format!("unknown flag {other:?}")),
        }
    }
    f.crash = crash_rank.zip(crash_step);
    Ok(f)
}

fn main() -> Result<()> {
    common::init_tracing();
    let f = flags().map_err(Error::invalid)?;
    let p = collectix::init(
        &collectix::InitArgs::default(),
        GroupOptions::default().with_timeout(Duration::from_secs(30)),
        Duration::from_secs(120),
    )?;
    let me = p.communicator().global_rank();
    println!("rank {me}: pid {}", std::process::id());
    let mut comm = p.communicator().clone();
    let mut w = [0.0f64; D];
    // The parameters before the last step this rank applied: a step that completed here but
    // not on every survivor is rolled back to them.
    let mut before = w;
    // Steps are calls: step `first + k` is call `k` of `comm`.
    let (mut first, mut step) = (0u64, 0u64);
    while step < f.steps {
        if f.crash == Some((me, step)) {
            eprintln!("rank {me}: crashing at step {step}, as asked");
            std::process::abort();
        }
        if f.step_ms > 0 {
            std::thread::sleep(Duration::from_millis(f.step_ms));
        }
        match step_on(&comm, &w, step) {
            Ok(next) => {
                before = w;
                w = next;
                step += 1;
            }
            Err(e) => {
                println!("rank {me}: step {step} failed ({e}); agreeing with the survivors");
                let shrunk = match comm.shrink().wait() {
                    Ok(s) => s,
                    Err(e) => {
                        println!("rank {me}: cannot go on: {e}");
                        p.abort();
                        std::process::exit(1);
                    }
                };
                let committed = first + shrunk.completed;
                if committed + 1 == step {
                    // This rank applied a step that did not complete everywhere.
                    w = before;
                } else if committed != step {
                    println!("rank {me}: the survivors agreed on step {committed}, this rank is at {step}");
                    p.abort();
                    std::process::exit(1);
                }
                step = committed;
                first = committed;
                comm = shrunk.communicator;
                println!(
                    "rank {me}: going on with {} ranks from step {step} (lost: {:?})",
                    comm.size(),
                    shrunk.left_out
                );
            }
        }
    }
    println!(
        "rank {me}: final loss {:.9} params {}",
        loss(&w),
        digest(&w)
    );
    p.shutdown()
}
