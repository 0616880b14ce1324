//! Hot standbys in one process (`World::local_with_standbys`): a standby is connected to
//! every rank and stays out of the world group; when a rank is lost and the survivors
//! `regrow`, the standby takes the lost rank's place in that same agreement, the group is
//! whole again without a restart, and the survivors send it the state.
//!
//! `STANDBY_TRIALS=1000 cargo test --release --test suite standby:: -- --nocapture` gives the figures
//! of `docs/errors.md` (time from the kill to the first completed call of the rebuilt group;
//! printed, never asserted: the tests assert what happened, not how fast).

use crate::common;
use collectix::{Communicator, Error, GroupOptions, Recovered, ReduceOp, Tensor, World};
use common::wait_all;
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(30);

fn world(n: usize, standbys: usize) -> World {
    World::local_with_standbys(
        n,
        standbys,
        GroupOptions::default().with_timeout(Duration::from_secs(20)),
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

/// Each of `comms` all_reduces its world rank plus one; what each got.
fn sums(comms: &[Communicator]) -> Vec<collectix::Result<Vec<i64>>> {
    let works = comms
        .iter()
        .map(|c| {
            c.all_reduce(
                Tensor::from_vec(vec![c.global_rank() as i64 + 1]),
                ReduceOp::Sum,
            )
        })
        .collect();
    wait_all(works, 60)
        .into_iter()
        .map(|r| r.and_then(|t| t.to_vec::<i64>()))
        .collect()
}

/// The survivors regrow (each on a thread) while the standbys wait; everyone's outcome, the
/// survivors' first.
fn regrow_with(survivors: &[&Communicator], standbys: &[Communicator]) -> Vec<Recovered> {
    std::thread::scope(|s| {
        let waiting: Vec<_> = standbys
            .iter()
            .map(|c| s.spawn(move || c.stand_by(WAIT).wait()))
            .collect();
        let hs: Vec<_> = survivors
            .iter()
            .map(|c| s.spawn(move || c.regrow(WAIT).wait()))
            .collect();
        hs.into_iter()
            .chain(waiting)
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| panic!("panicked"))
                    .unwrap_or_else(|e| panic!("{e}"))
            })
            .collect()
    })
}

#[test]
fn a_standby_takes_a_lost_rank_s_place_in_the_same_round() {
    let w = world(4, 1);
    let c = w.communicators().to_vec();
    assert_eq!((c[0].world_size(), w.standbys().len()), (4, 1));
    assert_eq!(w.standbys()[0].global_rank(), 4);
    for (r, s) in sums(&c).into_iter().enumerate() {
        assert_eq!(s, Ok(vec![10]), "rank {r}");
    }
    w.kill(2).unwrap_or_else(|e| panic!("{e}"));
    let start = Instant::now();
    let got = regrow_with(&[&c[0], &c[1], &c[3]], w.standbys());
    for (i, r) in got.iter().enumerate() {
        assert_eq!(
            r.communicator.members(),
            &[0, 1, 4, 3],
            "{i}: the standby in rank 2's place"
        );
        assert_eq!(r.communicator.size(), 4);
        assert_eq!(r.joined, vec![4], "{i}");
        assert_eq!(r.completed, 1, "{i}");
    }
    assert_eq!(
        got[3].communicator.rank(),
        2,
        "the standby has rank 2's group rank"
    );
    assert_eq!(got[0].left_out, vec![2]);
    assert!(
        start.elapsed() < WAIT / 2,
        "the survivors waited for a restart: {:?}",
        start.elapsed()
    );
    let next: Vec<Communicator> = got.into_iter().map(|r| r.communicator).collect();
    // The state goes to the standby (a broadcast from group rank 0), then all go on.
    let state = wait_all(
        next.iter()
            .map(|c| {
                let t = if c.rank() == 0 { vec![42i64] } else { vec![0] };
                c.broadcast(Tensor::from_vec(t), 0)
            })
            .collect(),
        60,
    );
    for s in state {
        assert_eq!(s.and_then(|t| t.to_vec::<i64>()), Ok(vec![42]));
    }
    for (r, s) in sums(&next).into_iter().enumerate() {
        assert_eq!(
            s,
            Ok(vec![1 + 2 + 5 + 4]),
            "member {r} of the rebuilt group"
        );
    }
    drop(w);
}

/// A regrow with no lost member to replace leaves the standby waiting; a shrink never takes
/// it; a rank that is not a standby cannot stand by.
#[test]
fn a_standby_waits_until_a_regrow_needs_it() {
    let w = world(3, 1);
    let c = w.communicators().to_vec();
    assert!(matches!(
        c[0].stand_by(WAIT).wait(),
        Err(Error::InvalidArgument(_))
    ));
    let standby = w.standbys()[0].clone();
    let waiting = standby.stand_by(WAIT);
    // Everyone alive: a regrow makes the same group, without the standby.
    let regrown = wait_all(
        c.iter().map(|c| c.regrow(Duration::from_secs(5))).collect(),
        60,
    );
    for r in &regrown {
        let r = r.as_ref().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.communicator.members(), &[0, 1, 2]);
        assert!(r.joined.is_empty());
    }
    assert!(!waiting.is_completed(), "the standby is still waiting");
    // A rank dies; the others shrink: the standby is not taken.
    w.kill(1).unwrap_or_else(|e| panic!("{e}"));
    let next: Vec<Communicator> = regrown
        .into_iter()
        .flatten()
        .map(|r| r.communicator)
        .collect();
    let shrunk = wait_all(vec![next[0].shrink(), next[2].shrink()], 60);
    for r in &shrunk {
        let r = r.as_ref().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.communicator.members(), &[0, 2]);
    }
    assert!(
        !waiting.is_completed(),
        "a shrink does not take the standby"
    );
    drop(w);
    assert!(matches!(
        waiting.wait_timeout(Duration::from_secs(20)),
        Some(Err(Error::Shutdown))
    ));
}

/// Eight ranks and a standby train (an all_reduce per step); a random rank is killed; the
/// survivors regrow and the standby takes its place; the rebuilt group's first all_reduce
/// completes, exact. Timed from the kill to that call's completion, the slowest member's.
#[test]
fn eight_ranks_and_a_standby_are_eight_again_after_a_kill() {
    let trials = std::env::var("STANDBY_TRIALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10usize);
    let mut times = Vec::with_capacity(trials);
    for trial in 0..trials {
        let w = world(8, 1);
        let c = w.communicators().to_vec();
        for s in sums(&c) {
            assert_eq!(s, Ok(vec![36]), "trial {trial}");
        }
        let victim = trial % 8;
        let survivors: Vec<&Communicator> = c.iter().filter(|c| c.rank() != victim).collect();
        let start = Instant::now();
        w.kill(victim).unwrap_or_else(|e| panic!("{e}"));
        let got = regrow_with(&survivors, w.standbys());
        let next: Vec<Communicator> = got.into_iter().map(|r| r.communicator).collect();
        let want: i64 = next.iter().map(|c| c.global_rank() as i64 + 1).sum();
        for (r, s) in sums(&next).into_iter().enumerate() {
            assert_eq!(s, Ok(vec![want]), "trial {trial}, member {r}");
        }
        times.push(start.elapsed());
        assert!(next.iter().all(|c| c.size() == 8), "trial {trial}");
        drop(w);
    }
    times.sort();
    let q = |p: f64| times[((times.len() - 1) as f64 * p).round() as usize].as_secs_f64() * 1e3;
    println!(
        "8 ranks + 1 standby, a rank killed: back to 8 in {trials} of {trials}; kill to the rebuilt group's first call p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        q(0.5),
        q(0.99),
        q(1.0)
    );
}
