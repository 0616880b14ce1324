//! Partial faults in one process: a fault that leaves every rank alive but some links
//! broken costs as few ranks as it can, and a minority never decides for a live majority.
//!
//! - A cut link (`World::cut`) in a group of 3, 4 or 5: every rank shrinks, and exactly the
//!   link's higher end is left out, told why; the others go on together with exact sums.
//! - One rank of five cut off from every other (the store still reachable): the four go on
//!   together, exactly; the isolated rank is left out.
//! - A partition of five into three and two: the three go on.
//! - Two ranks of four killed (certain death): the two survivors go on.
//!
//! Each case runs [`TRIALS`] times, skewed differently each time (the ranks come to the
//! agreement in varying orders), with the calls before the fault on the board (4 bytes) and
//! through the engine (1 MiB). The time bounds are hang guards: the group's timeout is far
//! above what a rank that was told takes.

use crate::common;
use collectix::{Communicator, Error, GroupOptions, Recovered, ReduceOp, Tensor, World};
use common::{root, wait_all};
use std::time::Duration;

/// Trials per case.
const TRIALS: usize = 100;
const TIMEOUT: Duration = Duration::from_secs(20);

/// The two paths the calls before the fault take: elements per all_reduce.
const PATHS: [(&str, usize); 2] = [("board", 1), ("engine", 256 * 1024)];

fn world(n: usize) -> World {
    World::local_with(n, GroupOptions::default().with_timeout(TIMEOUT))
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Three all_reduces of `elems` ones on every rank, checked.
fn train(c: &[Communicator], elems: usize) {
    for step in 0..3 {
        let works = c
            .iter()
            .map(|c| c.all_reduce(Tensor::from_vec(vec![1.0f32; elems]), ReduceOp::Sum))
            .collect();
        for (r, t) in wait_all(works, 60).into_iter().enumerate() {
            let t = t.unwrap_or_else(|e| panic!("step {step}, rank {r}: {e}"));
            let v = t.to_vec::<f32>().unwrap_or_else(|e| panic!("{e}"));
            assert!(
                v.iter().all(|&x| x == c.len() as f32),
                "step {step}, rank {r}"
            );
        }
    }
}

/// Every rank of `c` shrinks on a thread of its own, rank `r` after a delay that `trial`
/// varies (so that each rank comes first in some trials); what each got.
fn shrink_all(c: &[Communicator], trial: usize) -> Vec<collectix::Result<Recovered>> {
    std::thread::scope(|s| {
        let hs: Vec<_> = c
            .iter()
            .enumerate()
            .map(|(r, c)| {
                let delay = Duration::from_micros(((trial * 7 + r * 13) % 5) as u64 * 400);
                s.spawn(move || {
                    std::thread::sleep(delay);
                    c.shrink()
                        .wait_timeout(TIMEOUT * 2)
                        .unwrap_or_else(|| panic!("rank {r}: the shrink hangs"))
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| panic!("a shrink panicked")))
            .collect()
    })
}

/// Checks that the ranks in `expect_out` were left out (each with [`Error::LeftOut`], naming
/// a peer it lost its link to where `link` says so) and every other rank is in one new
/// group of all of them, which sums exactly, with calls 0..3 completed.
fn check(ctx: &str, got: Vec<collectix::Result<Recovered>>, expect_out: &[usize], link: bool) {
    let w = got.len();
    let want: Vec<usize> = (0..w).filter(|r| !expect_out.contains(r)).collect();
    let mut comms = Vec::new();
    for (r, res) in got.into_iter().enumerate() {
        match res {
            Ok(rec) if !expect_out.contains(&r) => {
                assert_eq!(rec.communicator.members(), &want[..], "{ctx}: rank {r}");
                assert_eq!(rec.left_out, expect_out, "{ctx}: rank {r}");
                assert_eq!(rec.completed, 3, "{ctx}: rank {r}");
                comms.push(rec.communicator);
            }
            Err(Error::LeftOut { link_to, .. }) if expect_out.contains(&r) => {
                assert_eq!(link_to.is_some(), link, "{ctx}: rank {r}: {link_to:?}");
            }
            other => panic!("{ctx}: rank {r}: {:?}", other.map(|r| r.left_out)),
        }
    }
    let works = comms
        .iter()
        .map(|c| {
            c.all_reduce(
                Tensor::from_vec(vec![c.global_rank() as f32 + 1.0]),
                ReduceOp::Sum,
            )
        })
        .collect();
    let exact: f32 = want.iter().map(|&r| r as f32 + 1.0).sum();
    for (i, t) in wait_all(works, 60).into_iter().enumerate() {
        let v = t
            .and_then(|t| t.to_vec::<f32>())
            .unwrap_or_else(|e| panic!("{ctx}: member {i} of the new group: {e}"));
        assert_eq!(v, vec![exact], "{ctx}: member {i}");
    }
}

#[test]
fn a_cut_link_costs_exactly_its_higher_end() {
    for w in 3..=5 {
        for (path, elems) in PATHS {
            for trial in 0..TRIALS {
                let (a, b) = (trial % w, (trial + 1 + trial / w) % w);
                let (a, b) = if a == b { (a, (a + 1) % w) } else { (a, b) };
                let world = world(w);
                let c = world.communicators();
                train(c, elems);
                world.cut(a, b).unwrap_or_else(|e| panic!("{e}"));
                let got = shrink_all(c, trial);
                let ctx = format!("{w} ranks, {path}, trial {trial}, link {a}-{b} cut");
                check(&ctx, got, &[a.max(b)], true);
                drop(world);
            }
        }
    }
}

#[test]
fn one_rank_of_five_cut_off_never_decides_for_the_four() {
    for (path, elems) in PATHS {
        for trial in 0..TRIALS {
            let v = trial % 5;
            let world = world(5);
            let c = world.communicators();
            train(c, elems);
            for r in (0..5).filter(|&r| r != v) {
                world.cut(v, r).unwrap_or_else(|e| panic!("{e}"));
            }
            let got = shrink_all(c, trial);
            let ctx = format!("{path}, trial {trial}, rank {v} cut off");
            check(&ctx, got, &[v], true);
            drop(world);
        }
    }
}

#[test]
fn of_a_partition_into_three_and_two_the_three_go_on() {
    for trial in 0..TRIALS / 4 {
        let world = world(5);
        let c = world.communicators();
        train(c, 1);
        for a in 0..3 {
            for b in 3..5 {
                world.cut(a, b).unwrap_or_else(|e| panic!("{e}"));
            }
        }
        let got = shrink_all(c, trial);
        check(&format!("trial {trial}"), got, &[3, 4], true);
        drop(world);
    }
}

#[test]
fn two_ranks_of_four_killed_the_two_survivors_go_on() {
    for trial in 0..TRIALS / 4 {
        let world = world(4);
        let c = world.communicators();
        train(c, 1);
        world.kill(2).unwrap_or_else(|e| panic!("{e}"));
        world.kill(3).unwrap_or_else(|e| panic!("{e}"));
        let got = shrink_all(&c[..2], trial);
        for (r, res) in got.iter().enumerate() {
            let rec = res
                .as_ref()
                .unwrap_or_else(|e| panic!("trial {trial}, rank {r}: {e}"));
            assert_eq!(rec.communicator.members(), &[0, 1]);
            assert_eq!(rec.left_out, vec![2, 3]);
        }
        drop(world);
    }
}

/// A rank that counts no majority alive or dead decides nothing: three ranks of five
/// silent (cut off from the other two, and never joining the agreement), the two give up
/// at the group's timeout with `NoMajority` rather than go on as the group.
#[test]
fn two_ranks_of_five_cut_off_from_three_silent_ones_decide_nothing() {
    let world = World::local_with(
        5,
        GroupOptions::default().with_timeout(Duration::from_millis(500)),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let c = world.communicators();
    train(c, 1);
    for a in 0..2 {
        for b in 2..5 {
            world.cut(a, b).unwrap_or_else(|e| panic!("{e}"));
        }
    }
    let got = shrink_all(&c[..2], 0);
    for (r, res) in got.iter().enumerate() {
        let e = res.as_ref().err();
        assert!(
            matches!(
                e.map(root),
                Some(Error::NoMajority {
                    counted: 2,
                    members: 5,
                    ..
                })
            ),
            "rank {r}: {e:?}"
        );
    }
    drop(world);
}

/// A rank left out for a cut link comes back once the link heals: it calls `rejoin` while
/// the others `regrow`, and the group is whole again (the returned rank after the others,
/// among the joined, given the state), with exact sums.
#[test]
fn a_rank_left_out_for_a_cut_link_comes_back_when_it_heals() {
    for (path, elems) in PATHS {
        let world = world(4);
        let c = world.communicators();
        train(c, elems);
        world.cut(1, 3).unwrap_or_else(|e| panic!("{e}"));
        let got = shrink_all(c, 0);
        let out = got[3].as_ref().err().cloned();
        assert!(
            matches!(
                out,
                Some(Error::LeftOut {
                    link_to: Some(1),
                    ..
                })
            ),
            "{path}: {out:?}"
        );
        let shrunk: Vec<Communicator> = got.into_iter().flatten().map(|r| r.communicator).collect();
        assert_eq!(shrunk.len(), 3);
        world.heal(1, 3).unwrap_or_else(|e| panic!("{e}"));
        // The returning rank asks first; then the others regrow.
        let back = c[3].rejoin(TIMEOUT);
        std::thread::sleep(Duration::from_millis(20));
        let regrown = wait_all(shrunk.iter().map(|c| c.regrow(TIMEOUT)).collect(), 60);
        let back = back
            .wait_timeout(TIMEOUT * 2)
            .unwrap_or_else(|| panic!("{path}: the returning rank hangs"));
        let mut all: Vec<Recovered> = regrown
            .into_iter()
            .map(|r| r.unwrap_or_else(|e| panic!("{path}: {e}")))
            .collect();
        all.push(back.unwrap_or_else(|e| panic!("{path}: the returning rank: {e}")));
        for r in &all {
            assert_eq!(r.communicator.members(), &[0, 1, 2, 3], "{path}");
            assert_eq!(r.joined, vec![3], "{path}");
        }
        let next: Vec<Communicator> = all.into_iter().map(|r| r.communicator).collect();
        let works = next
            .iter()
            .map(|c| {
                c.all_reduce(
                    Tensor::from_vec(vec![c.global_rank() as f32 + 1.0]),
                    ReduceOp::Sum,
                )
            })
            .collect();
        for (i, t) in wait_all(works, 60).into_iter().enumerate() {
            let v = t.and_then(|t| t.to_vec::<f32>());
            assert_eq!(v, Ok(vec![10.0]), "{path}: member {i}");
        }
        drop(world);
    }
}
