//! Data-parallel training that survives the loss of any rank: a linear model fitted by
//! gradient descent, one all_reduce of the gradient per step. When a step fails (a rank
//! died, the group was revoked), the survivors shrink the group (`Communicator::shrink`),
//! roll back to the last step that completed on all of them (`Recovered::completed`) and go on
//! with one rank fewer (or, where the launcher restarts
//! the rank that died, regrow the group with it).
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
//! Kill any rank's process while it runs (`kill -9`): the others say so and finish with one
//! rank fewer. Under `--max-restarts 1` instead of `--on-failure shrink`, the launcher
//! restarts the killed rank, which rejoins (`Process::rejoin`); the survivors wait for it
//! (`Communicator::regrow`), send it the parameters and the step, and all four finish. Under
//! `torchrun --max-restarts 1`, torchrun restarts every worker instead (the store's keys of
//! the last attempt set apart): the job starts over and ends with the same lines as a run
//! without the fault. Flags:
//! `--steps N` (default 100), `--step-ms M` (extra time per step, default 0), and for tests
//! `--crash-rank R --crash-at-step S` (rank R aborts itself at step S) and `--bad-call-rank R
//! --bad-call-at-step S` (rank R's all_reduce of step S fails its argument checks: every rank's
//! step fails at once, and all make it again, with no rank lost). After a recovery, each rank
//! says when its first step on the rebuilt group is done. Under `collectix launch
//! --nproc-per-node 8 --standby 1`, a ninth process waits as a hot standby: kill a rank and
//! the survivors regrow with the standby in its place (`Process::stand_by`), which takes the
//! state and finishes with the others; a standby the job never needs says so and exits.

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

/// One step on `comm`: the summed gradient, applied to `w`. With `bad`, the all_reduce is
/// given an op that integers do not take (`Avg`), as a program with a bug on one rank would:
/// it fails its checks on this rank, and the other ranks' parts of it fail at once.
fn step_on(comm: &Communicator, w: &[f64; D], step: u64, bad: bool) -> Result<[f64; D]> {
    let g = local_gradient(w, step, comm.rank(), comm.size());
    let op = if bad { ReduceOp::Avg } else { ReduceOp::Sum };
    let sum = comm
        .all_reduce(Tensor::from_vec(g), op)
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
    bad_call: Option<(usize, u64)>,
}

fn flags() -> std::result::Result<Flags, String> {
    let mut f = Flags {
        steps: 100,
        step_ms: 0,
        crash: None,
        bad_call: None,
    };
    let (mut crash_rank, mut crash_step) = (None, None);
    let (mut bad_rank, mut bad_step) = (None, None);
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
            "--bad-call-rank" => bad_rank = Some(value("--bad-call-rank")? as usize),
            "--bad-call-at-step" => bad_step = Some(value("--bad-call-at-step")?),
            other => return Err(format!("unknown flag {other:?}")),
        }
    }
    f.crash = crash_rank.zip(crash_step);
    f.bad_call = bad_rank.zip(bad_step);
    Ok(f)
}

/// How long the survivors wait for a restarted rank (`--max-restarts`), and a restarted
/// rank for the survivors.
const REGROW_WAIT: Duration = Duration::from_secs(30);
/// How long a standby waits to be called (the job's end releases it sooner).
const STANDBY_WAIT: Duration = Duration::from_secs(3600);

/// Where a rank stands: its group, its parameters (and those before its last step, for a
/// rollback), the step it is at, and how the group's calls map to steps.
struct Training {
    comm: Communicator,
    w: [f64; D],
    before: [f64; D],
    step: u64,
    /// The step of the group's first step call.
    first: u64,
    /// Calls of the group that are not steps: the state sent to a restarted rank, and calls
    /// that failed on every rank (`--bad-call-rank`).
    skip: u64,
}

/// Gives the group's restarted members (`joined`) the state: the parameters and the step,
/// broadcast from the first member that is not one of them.
fn share_state(t: &mut Training, joined: &[usize]) -> Result<()> {
    let members = t.comm.members().to_vec();
    let Some(src) = members.iter().position(|m| !joined.contains(m)) else {
        return Err(Error::invalid(
            "every member is a restarted process: no state is left",
        ));
    };
    let mut state = t.w.to_vec();
    state.push(t.step as f64);
    let got = t
        .comm
        .broadcast(Tensor::from_vec(state), src)
        .wait()?
        .to_vec::<f64>()?;
    t.w.copy_from_slice(&got[..D]);
    t.before = t.w;
    t.step = got[D] as u64;
    t.first = t.step;
    t.skip = 1;
    Ok(())
}

/// A step failed: agree with the survivors (shrink, or regrow under `--max-restarts`), roll
/// back to the step that completed everywhere, and give restarted members the state.
fn recover(t: &mut Training, me: usize, restart: bool) -> Result<()> {
    let r = if restart {
        t.comm.regrow(REGROW_WAIT).wait()?
    } else {
        t.comm.shrink().wait()?
    };
    let committed = t.first + r.completed.saturating_sub(t.skip);
    if committed + 1 == t.step {
        // This rank applied a step that did not complete everywhere.
        t.w = t.before;
    } else if committed != t.step {
        return Err(Error::invalid(format!(
            "the survivors agreed on step {committed}, this rank is at {}",
            t.step
        )));
    }
    t.step = committed;
    t.first = committed;
    t.skip = 0;
    t.comm = r.communicator;
    if !r.joined.is_empty() {
        share_state(t, &r.joined)?;
    }
    println!(
        "rank {me}: going on with {} ranks from step {} (lost: {:?}, restarted: {:?})",
        t.comm.size(),
        t.step,
        r.left_out,
        r.joined
    );
    Ok(())
}

fn main() -> common::Main {
    common::Main(body())
}

/// What `main` does.
fn body() -> collectix::Result<()> {
    common::init_tracing();
    let f = flags().map_err(Error::invalid)?;
    let p = collectix::init(
        &collectix::InitArgs::default(),
        GroupOptions::default().with_timeout(Duration::from_secs(30)),
        Duration::from_secs(120),
    )?;
    let me = p.communicator().global_rank();
    println!("rank {me}: pid {}", std::process::id());
    // Under `--max-restarts` or `--standby`, the survivors regrow: a restarted process or a
    // standby takes the lost rank's place.
    let restart =
        std::env::var("COLLECTIX_ON_FAILURE").is_ok_and(|v| v == "restart" || v == "standby");
    let mut t = Training {
        comm: p.communicator().clone(),
        w: [0.0; D],
        before: [0.0; D],
        step: 0,
        first: 0,
        skip: 0,
    };
    if p.incarnation() > 0 {
        // A restarted process: join the survivors and take the state from them.
        let joined = p.rejoin(REGROW_WAIT).wait().and_then(|r| {
            t.comm = r.communicator;
            share_state(&mut t, &r.joined)
        });
        if let Err(e) = joined {
            println!("rank {me}: cannot rejoin: {e}");
            p.abort();
            std::process::exit(1);
        }
        println!(
            "rank {me}: rejoined at step {} (incarnation {})",
            t.step,
            p.incarnation()
        );
    }
    // Whether a step on a rebuilt group is still to be reported, and whether the bad call
    // (`--bad-call-rank`) was made.
    let (mut report_next, mut bad_made) = (false, false);
    if p.is_standby() {
        // A hot standby (`--standby`): it waits, connected, to take a lost rank's place, and
        // takes the state from the others when it does.
        let called = p.stand_by(STANDBY_WAIT).wait().and_then(|r| {
            t.comm = r.communicator;
            share_state(&mut t, &r.joined)
        });
        match called {
            Ok(()) => {
                println!("rank {me}: took a lost rank's place at step {}", t.step);
                report_next = true;
            }
            Err(Error::Shutdown) => {
                println!("rank {me}: a standby the job did not need");
                return p.shutdown();
            }
            Err(e) => {
                println!("rank {me}: cannot stand by: {e}");
                p.abort();
                std::process::exit(1);
            }
        }
    }
    // The faults asked for happen in the job's first run only: not in a restarted rank, nor
    // in a job torchrun started again (`--max-restarts`: torchrun restarts every worker, and
    // the job starts over).
    let first_run = p.incarnation() == 0
        && std::env::var("TORCHELASTIC_RESTART_COUNT").map_or(true, |c| c.trim() == "0");
    while t.step < f.steps {
        if f.crash == Some((me, t.step)) && first_run {
            eprintln!("rank {me}: crashing at step {}, as asked", t.step);
            std::process::abort();
        }
        if f.step_ms > 0 {
            std::thread::sleep(Duration::from_millis(f.step_ms));
        }
        let bad = !bad_made && f.bad_call == Some((me, t.step)) && first_run;
        bad_made |= bad;
        match step_on(&t.comm, &t.w, t.step, bad) {
            Ok(next) => {
                t.before = t.w;
                t.w = next;
                t.step += 1;
                if std::mem::take(&mut report_next) {
                    println!("rank {me}: step {} done on the rebuilt group", t.step - 1);
                }
            }
            Err(e @ (Error::InvalidArgument(_) | Error::CallFailed { .. })) => {
                // One rank's part failed its checks: the call failed on every rank, and the
                // group goes on. The step is made again; the failed call took a sequence
                // number, which is no step.
                t.skip += 1;
                println!(
                    "rank {me}: step {} failed ({e}); the group goes on, making it again",
                    t.step
                );
            }
            Err(e) => {
                println!(
                    "rank {me}: step {} failed ({e}); agreeing with the survivors",
                    t.step
                );
                if let Err(e) = recover(&mut t, me, restart) {
                    println!("rank {me}: cannot go on: {e}");
                    p.abort();
                    std::process::exit(1);
                }
                report_next = true;
            }
        }
    }
    println!(
        "rank {me}: final loss {:.9} params {}",
        loss(&t.w),
        digest(&t.w)
    );
    p.shutdown()
}
