//! Who is late: one rank of a job does extra work before each all_reduce (a slow step of its
//! own), and the ranks' views of who came last to each call, put together, name it.
//!
//! Every rank runs `STEPS` all_reduces (environment, default 300) of `COUNT` floats (default
//! 1: a 4-byte call), rank `LATE_RANK` (default the last) sleeping `LATE_MS` (default 200)
//! before each. Then the ranks gather their views (`Communicator::lateness`) and rank 0
//! combines them. Each rank prints `rank R: <its view>`; rank 0 then prints
//! `group: <the combined view>` and
//! `culprit: rank L, last in N of S calls (P %), late by M ms on average` (or
//! `culprit: none`).
//!
//! ```text
//! collectix launch --nproc-per-node 4 -- target/debug/examples/straggler
//! ```

mod common;
use collectix::runtime::lateness::{LatenessSummary, MemberLateness};
use collectix::{DType, ReduceOp, Tensor, TensorSpec};
use std::time::Duration;

fn main() -> common::Main {
    common::Main(body())
}

/// An environment variable's number, or `default`.
fn var(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

/// Numbers per member in a flattened view: calls last, total, max and recent lateness (ns).
const PER_MEMBER: usize = 4;

/// `view` as `1 + PER_MEMBER * w` numbers (its calls judged first).
fn flatten(view: &LatenessSummary, w: usize) -> Vec<i64> {
    let ns = |d: Duration| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX);
    let mut v = vec![i64::try_from(view.calls).unwrap_or(i64::MAX)];
    for m in 0..w {
        let r = view.members.get(m).cloned().unwrap_or_default();
        let last = i64::try_from(r.last).unwrap_or(i64::MAX);
        v.extend([last, ns(r.total), ns(r.max), ns(r.recent)]);
    }
    v
}

/// The view [`flatten`] made.
fn unflatten(v: &[i64]) -> LatenessSummary {
    let n = |x: i64| u64::try_from(x).unwrap_or(0);
    let d = |x: i64| Duration::from_nanos(n(x));
    LatenessSummary {
        calls: v.first().map_or(0, |&c| n(c)),
        members: v
            .get(1..)
            .unwrap_or_default()
            .chunks_exact(PER_MEMBER)
            .map(|m| MemberLateness {
                last: n(m[0]),
                total: d(m[1]),
                max: d(m[2]),
                recent: d(m[3]),
            })
            .collect(),
        last: None,
    }
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
    let steps = var("STEPS", 300);
    let count = usize::try_from(var("COUNT", 1)).unwrap_or(1).max(1);
    let late = Duration::from_millis(var("LATE_MS", 200));
    let late_rank = usize::try_from(var("LATE_RANK", w as u64 - 1)).unwrap_or(0);
    for _ in 0..steps {
        if r == late_rank {
            std::thread::sleep(late);
        }
        let out = c
            .all_reduce(Tensor::from_vec(vec![1.0f32; count]), ReduceOp::Sum)
            .wait()?;
        if out.to_vec::<f32>()?.iter().any(|&x| x != w as f32) {
            return Err(collectix::Error::internal(format!("rank {r}: wrong sum")));
        }
    }
    let view = c.lateness();
    println!("rank {r}: {view}");
    let width = 1 + PER_MEMBER * w;
    let all = c
        .all_gather_into_tensor(
            TensorSpec::new(&[w, width], DType::I64),
            Tensor::from_vec(flatten(&view, w)),
        )
        .wait()?
        .to_vec::<i64>()?;
    if r == 0 {
        let views: Vec<LatenessSummary> = all.chunks_exact(width).map(unflatten).collect();
        let group = LatenessSummary::combined(&views);
        println!("group: {group}");
        match group.culprit() {
            Some((m, rec)) => println!(
                "culprit: rank {m}, last in {} of {steps} calls ({:.1} %), late by {:.1} ms on average",
                rec.last,
                rec.last as f64 * 100.0 / steps.max(1) as f64,
                rec.mean().as_secs_f64() * 1e3
            ),
            None => println!("culprit: none"),
        }
    }
    p.shutdown()
}
