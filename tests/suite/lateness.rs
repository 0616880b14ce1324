//! Who is late, through `Communicator::lateness`: one rank of four sleeps before each
//! all_reduce (a slow step of its own), and the members' views together name it in at least
//! 95 % of the calls, late by its sleep within 5 ms; in one process (through the engine and
//! on the group's board) and over TCP. With `COLLECTIX_STRAGGLER_STEPS=300` the board's run is
//! 300 steps of 200 ms (the target run: by hand, on a quiet machine; on CI's two cores shared
//! with the other tests, the waiting members' own delays took 5.5 ms off the mean once); the
//! runs as processes are in the cli's suite
//! (`multiprocess::a_rank_with_a_slow_step_is_named_the_late_comer_as_processes`).

use crate::common::{free_port, tcp_args};
use collectix::runtime::lateness::LatenessSummary;
use collectix::{Communicator, GroupOptions, ReduceOp, Tensor, World};
use std::time::Duration;

const SLOW: usize = 2;

/// How late the slow rank is to each call, and how many calls.
#[derive(Clone, Copy)]
struct Run {
    late: Duration,
    steps: u64,
}

const SHORT: Run = Run {
    late: Duration::from_millis(50),
    steps: 40,
};

/// The target run when `COLLECTIX_STRAGGLER_STEPS` asks for it (that many steps of 200 ms),
/// else the short one.
fn target_or_short() -> Run {
    match std::env::var("COLLECTIX_STRAGGLER_STEPS")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        Some(steps) => Run {
            late: Duration::from_millis(200),
            steps,
        },
        None => SHORT,
    }
}

/// Through the engine: larger than a board slot.
const ENGINE: usize = 256;

/// Each rank's part: `run.steps` all_reduces of `count` floats, rank `SLOW` sleeping
/// `run.late` before each; its view after.
fn steps(c: &Communicator, count: usize, run: Run) -> LatenessSummary {
    for _ in 0..run.steps {
        if c.rank() == SLOW {
            std::thread::sleep(run.late);
        }
        let t = Tensor::from_vec(vec![1.0f32; count]);
        let out = c.all_reduce(t, ReduceOp::Sum).wait();
        assert!(out.is_ok(), "rank {}: {out:?}", c.rank());
    }
    c.lateness()
}

fn check(views: &[LatenessSummary], run: Run) {
    let Run { late, steps } = run;
    for (r, v) in views.iter().enumerate() {
        println!("rank {r}: {v}");
    }
    let all = LatenessSummary::combined(views);
    println!("group: {all}");
    let (m, rec) = all
        .most_often_last()
        .unwrap_or_else(|| panic!("nobody named: {views:?}"));
    assert_eq!(m, SLOW, "{views:?}");
    assert!(
        rec.last * 100 >= steps * 95,
        "named in {} of {steps}: {views:?}",
        rec.last
    );
    let off = (rec.mean().as_secs_f64() - late.as_secs_f64()).abs();
    assert!(
        off < 0.005,
        "late by {:?} on average: {views:?}",
        rec.mean()
    );
}

fn in_one_process(count: usize, run: Run) {
    let world = World::local(4).unwrap_or_else(|e| panic!("{e}"));
    let views: Vec<LatenessSummary> = std::thread::scope(|s| {
        let hs: Vec<_> = world
            .communicators()
            .iter()
            .map(|c| s.spawn(move || steps(c, count, run)))
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| panic!("a rank panicked")))
            .collect()
    });
    check(&views, run);
}

#[test]
fn a_rank_with_a_slow_step_is_named_the_late_comer_in_one_process() {
    in_one_process(ENGINE, SHORT);
}

/// A 4-byte all_reduce runs on the group's board: no messages; the members that wait for
/// the slow rank's slot name it.
#[test]
fn a_rank_with_a_slow_step_is_named_the_late_comer_on_a_board() {
    in_one_process(1, target_or_short());
}

#[test]
fn a_rank_with_a_slow_step_is_named_the_late_comer_over_tcp() {
    let port = free_port();
    let w = 4;
    let views: Vec<LatenessSummary> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..w)
            .map(|r| {
                s.spawn(move || {
                    let args = tcp_args(port, r, w, "the lateness test's secret", false);
                    let p =
                        collectix::init(&args, GroupOptions::default(), Duration::from_secs(20))
                            .unwrap_or_else(|e| panic!("rank {r}: {e}"));
                    let view = steps(p.communicator(), ENGINE, SHORT);
                    let _ = p.shutdown();
                    view
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| panic!("a rank panicked")))
            .collect()
    });
    check(&views, SHORT);
}
