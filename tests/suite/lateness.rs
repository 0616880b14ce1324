//! Who is late, through `Communicator::lateness`: one rank of four sleeps before each
//! all_reduce (a slow step of its own), and the members' views together name it in at least
//! 95 % of the calls, late by its sleep within 5 ms; in one process (through the engine and
//! on the group's board) and over TCP.

use crate::common::{free_port, tcp_args};
use collectix::runtime::lateness::LatenessSummary;
use collectix::{Communicator, GroupOptions, ReduceOp, Tensor, World};
use std::time::Duration;

const LATE: Duration = Duration::from_millis(50);
const STEPS: u64 = 40;
const SLOW: usize = 2;

/// Through the engine: larger than a board slot.
const ENGINE: usize = 256;

/// Each rank's part: `STEPS` all_reduces of `count` floats, rank `SLOW` sleeping `LATE`
/// before each; its view after.
fn steps(c: &Communicator, count: usize) -> LatenessSummary {
    for _ in 0..STEPS {
        if c.rank() == SLOW {
            std::thread::sleep(LATE);
        }
        let t = Tensor::from_vec(vec![1.0f32; count]);
        let out = c.all_reduce(t, ReduceOp::Sum).wait();
        assert!(out.is_ok(), "rank {}: {out:?}", c.rank());
    }
    c.lateness()
}

fn check(views: &[LatenessSummary]) {
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
        rec.last * 100 >= STEPS * 95,
        "named in {} of {STEPS}: {views:?}",
        rec.last
    );
    let off = (rec.mean().as_secs_f64() - LATE.as_secs_f64()).abs();
    assert!(
        off < 0.005,
        "late by {:?} on average: {views:?}",
        rec.mean()
    );
}

fn in_one_process(count: usize) {
    let world = World::local(4).unwrap_or_else(|e| panic!("{e}"));
    let views: Vec<LatenessSummary> = std::thread::scope(|s| {
        let hs: Vec<_> = world
            .communicators()
            .iter()
            .map(|c| s.spawn(move || steps(c, count)))
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| panic!("a rank panicked")))
            .collect()
    });
    check(&views);
}

#[test]
fn a_rank_with_a_slow_step_is_named_the_late_comer_in_one_process() {
    in_one_process(ENGINE);
}

/// A 4-byte all_reduce runs on the group's board: no messages; the members that wait for
/// the slow rank's slot name it.
#[test]
fn a_rank_with_a_slow_step_is_named_the_late_comer_on_a_board() {
    in_one_process(1);
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
                    let view = steps(p.communicator(), ENGINE);
                    let _ = p.shutdown();
                    view
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| panic!("a rank panicked")))
            .collect()
    });
    check(&views);
}
