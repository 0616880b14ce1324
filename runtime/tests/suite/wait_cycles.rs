//! Wait cycles across groups under the seeded simulator: ranks that each wait in a call of
//! one group for a rank that waits in another group's call for them. Every rank on the cycle
//! fails with `Error::WaitCycle` naming it (ranks, groups, calls) within its timeout plus
//! one second, on the engine and on the board; the other members of the groups on it fail
//! with that cycle as their root cause. Calls that merely wait (a rank that is not in any
//! call, or a chain that ends at one) time out as before, and valid programs complete.

use collectix_runtime::error::Wait;
use collectix_runtime::group::{CallOptions, GroupId, GroupOptions};
use collectix_runtime::testing::sim::Sim;
use collectix_runtime::testing::Case;
use collectix_runtime::{Algorithm, DType, Error, OpId, OpKind, ReduceOp, Time};
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_millis(50);

fn gid(index: u64, members: &[usize]) -> GroupId {
    let words: Vec<u64> = members.iter().map(|&m| m as u64).collect();
    GroupId::derive(GroupId::WORLD, index, &words)
}

/// An all_reduce of `size` ranks (4 elements: small enough for the board when boards are on
/// and no algorithm is forced).
fn case(size: usize, algorithm: Option<Algorithm>) -> Case {
    Case {
        kind: OpKind::AllReduce,
        size,
        count: 4,
        dtype: DType::I32,
        op: ReduceOp::Sum,
        root: 0,
        algorithm,
    }
}

fn sim(world: usize, seed: u64, boards: bool, groups: &[(GroupId, Vec<usize>)]) -> Sim {
    let mut sim = Sim::with_options(world, seed, GroupOptions::default());
    if boards {
        sim = sim.with_boards();
    }
    for (g, members) in groups {
        sim.add_group_everywhere(*g, members, GroupOptions::default());
    }
    sim
}

/// Submits an all_reduce on group `g` (of `members`) at global rank `rank`.
fn call(sim: &mut Sim, rank: usize, g: GroupId, members: &[usize], alg: Option<Algorithm>) -> OpId {
    let local = members.iter().position(|&m| m == rank).unwrap_or(0);
    let c = case(members.len(), alg);
    let opts = CallOptions {
        algorithm: alg,
        timeout: Some(TIMEOUT),
    };
    match sim.submit(rank, g, c.request(local), &opts) {
        Ok(id) => id,
        Err(e) => panic!("rank {rank}: {e}"),
    }
}

/// The cycle of `e`, if it is a wait cycle (as itself or as an aborted group's cause).
fn cycle_of(e: &Error) -> Option<&Vec<Wait>> {
    match e.root_cause() {
        Error::WaitCycle { cycle } => Some(cycle),
        _ => None,
    }
}

/// The result of `id` on `rank`: an error, by the deadline of a timeout plus one second.
fn failed(sim: &Sim, rank: usize, id: OpId) -> Error {
    let bound = Time::ZERO + TIMEOUT + Duration::from_secs(1);
    let at = sim.completed_at(rank, id);
    assert!(
        at.is_some_and(|t| t <= bound),
        "rank {rank}: ended at {at:?}, later than {bound:?}\n{}",
        sim.trace_text()
    );
    match sim.result(rank, id) {
        Some(Err(e)) => e.clone(),
        other => panic!("rank {rank}: {other:?}\n{}", sim.trace_text()),
    }
}

/// The ranks around a cycle, each once, in order from the lowest.
fn ranks_of(cycle: &[Wait]) -> Vec<usize> {
    let mut r: Vec<usize> = cycle.iter().map(|w| w.rank).collect();
    let low = r
        .iter()
        .enumerate()
        .min_by_key(|(_, &x)| x)
        .map_or(0, |(i, _)| i);
    r.rotate_left(low);
    r
}

/// Rank 0 calls on group A, rank 1 on group B (both groups are ranks 0 and 1): each waits for
/// the other, which is in the other group's call. Both fail with the cycle, as themselves.
#[test]
fn two_ranks_in_two_groups_name_their_cycle() {
    for boards in [false, true] {
        for seed in 0..8 {
            let (a, b) = (gid(1, &[0, 1]), gid(2, &[0, 1]));
            let mut s = sim(2, seed, boards, &[(a, vec![0, 1]), (b, vec![0, 1])]);
            let x = call(&mut s, 0, a, &[0, 1], None);
            let y = call(&mut s, 1, b, &[0, 1], None);
            assert_eq!((s.off_the_engine(x), s.off_the_engine(y)), (boards, boards));
            assert_eq!(s.run(1_000_000), Ok(()), "{}", s.trace_text());
            for (rank, id, group) in [(0, x, a), (1, y, b)] {
                let e = failed(&s, rank, id);
                let Error::WaitCycle { cycle } = &e else {
                    panic!(
                        "boards {boards}, seed {seed}, rank {rank}: {e}\n{}",
                        s.trace_text()
                    );
                };
                assert_eq!(ranks_of(cycle), vec![0, 1], "{e}");
                assert!(cycle.iter().all(|w| !w.reached), "{e}");
                let mine: Vec<&Wait> = cycle.iter().filter(|w| w.rank == rank).collect();
                assert_eq!(mine.len(), 1, "{e}");
                assert_eq!(
                    (mine[0].group, mine[0].seq, mine[0].op),
                    (group, 0, OpKind::AllReduce)
                );
                let text = e.to_string();
                assert!(text.starts_with("wait cycle across groups: rank"), "{text}");
            }
        }
    }
}

/// Three ranks, three groups of two (A = {0, 1}, B = {1, 2}, C = {2, 0}), each rank in the
/// call of the group whose other member waits elsewhere: a cycle of three.
#[test]
fn three_groups_of_two_name_a_cycle_of_three() {
    for boards in [false, true] {
        for seed in 0..8 {
            let groups = [
                (gid(1, &[0, 1]), vec![0, 1]),
                (gid(2, &[1, 2]), vec![1, 2]),
                (gid(3, &[2, 0]), vec![2, 0]),
            ];
            let mut s = sim(3, seed, boards, &groups);
            let ids: Vec<OpId> = (0..3)
                .map(|r| call(&mut s, r, groups[r].0, &groups[r].1, None))
                .collect();
            assert_eq!(s.run(1_000_000), Ok(()), "{}", s.trace_text());
            for (rank, &id) in ids.iter().enumerate() {
                let e = failed(&s, rank, id);
                let Error::WaitCycle { cycle } = &e else {
                    panic!(
                        "boards {boards}, seed {seed}, rank {rank}: {e}\n{}",
                        s.trace_text()
                    );
                };
                assert_eq!(ranks_of(cycle), vec![0, 1, 2], "{e}");
                let groups_on: Vec<GroupId> = cycle.iter().map(|w| w.group).collect();
                for (g, _) in &groups {
                    assert!(groups_on.contains(g), "{e}");
                }
            }
        }
    }
}

/// Four ranks in a ring all_reduce on the world, but rank 3 first calls on group B = {0, 3},
/// which rank 0 has not made: rank 0 waits in the ring for rank 3 (directly or through the
/// ring), rank 3 in B for rank 0. Ranks 0 and 3 fail with the cycle; ranks 1 and 2, which
/// wait in the ring without being on the cycle, fail with it as the world's abort's cause.
#[test]
fn a_ring_and_a_pair_name_the_two_ranks_on_the_cycle() {
    for seed in 0..8 {
        let world = (GroupId::WORLD, vec![0, 1, 2, 3]);
        let b = (gid(1, &[0, 3]), vec![0, 3]);
        let mut s = sim(4, seed, false, std::slice::from_ref(&b));
        let ring = Some(Algorithm::Ring);
        let mut ids = Vec::new();
        for r in 0..3 {
            ids.push(call(&mut s, r, world.0, &world.1, ring));
        }
        ids.push(call(&mut s, 3, b.0, &b.1, None));
        assert_eq!(s.run(1_000_000), Ok(()), "{}", s.trace_text());
        for (rank, &id) in ids.iter().enumerate() {
            let e = failed(&s, rank, id);
            let Some(cycle) = cycle_of(&e) else {
                panic!("seed {seed}, rank {rank}: {e}\n{}", s.trace_text());
            };
            assert!(
                cycle.iter().any(|w| w.rank == 0) && cycle.iter().any(|w| w.rank == 3),
                "{e}"
            );
            let on_cycle = cycle.iter().any(|w| w.rank == rank);
            assert_eq!(
                matches!(e, Error::WaitCycle { .. }),
                on_cycle,
                "rank {rank}: {e}"
            );
            // A wait for a rank that has made its call (the ring's) is progress; the cycle
            // holds at least one for a rank that has not.
            assert!(cycle.iter().any(|w| !w.reached), "{e}");
        }
    }
}

/// No cycle, only waiting: rank 0 waits in A for rank 1, which waits in B for rank 2, which
/// never calls (it is computing). Rank 0 and rank 1 time out naming whom they wait for,
/// within the timeout plus the desync report's grace; nobody reports a cycle.
#[test]
fn a_chain_of_waits_that_ends_at_an_idle_rank_is_a_timeout() {
    for boards in [false, true] {
        for seed in 0..8 {
            let (a, b) = ((gid(1, &[0, 1]), vec![0, 1]), (gid(2, &[1, 2]), vec![1, 2]));
            let mut s = sim(3, seed, boards, &[a.clone(), b.clone()]);
            let x = call(&mut s, 0, a.0, &a.1, None);
            let y = call(&mut s, 1, b.0, &b.1, None);
            assert_eq!(s.run(1_000_000), Ok(()), "{}", s.trace_text());
            for (rank, id, waits_for) in [(0, x, 1), (1, y, 2)] {
                let e = failed(&s, rank, id);
                match e.root_cause() {
                    Error::Timeout { waiting_for, .. } => {
                        assert!(waiting_for.contains(&waits_for), "rank {rank}: {e}");
                    }
                    other => panic!(
                        "boards {boards}, seed {seed}, rank {rank}: {other}\n{}",
                        s.trace_text()
                    ),
                }
            }
        }
    }
}

/// Valid programs across groups complete: every rank calls A, then B, then A, each call made
/// by its ranks skewed in time; and two ranks that issue calls on A and B in opposite orders
/// without waiting in between (async work) complete too: nothing waits in a cycle.
#[test]
fn calls_on_two_groups_complete_in_one_order_or_issued_together() {
    for boards in [false, true] {
        for seed in 0..8 {
            let (a, b) = (
                (gid(1, &[0, 1, 2]), vec![0, 1, 2]),
                (gid(2, &[0, 2]), vec![0, 2]),
            );
            let mut s = sim(3, seed, boards, &[a.clone(), b.clone()]);
            for g in [&a, &b, &a] {
                let mut ids = Vec::new();
                for &r in &g.1 {
                    ids.push((r, call(&mut s, r, g.0, &g.1, None)));
                    s.run_for(Duration::from_millis(2));
                }
                assert_eq!(s.run(1_000_000), Ok(()), "{}", s.trace_text());
                for (local, (r, id)) in ids.into_iter().enumerate() {
                    let want = case(g.1.len(), None).expected(local);
                    assert_eq!(
                        s.result(r, id),
                        Some(&Ok(want)),
                        "rank {r}\n{}",
                        s.trace_text()
                    );
                }
            }

            let (a, b) = ((gid(3, &[0, 1]), vec![0, 1]), (gid(4, &[0, 1]), vec![0, 1]));
            let mut s = sim(2, seed, boards, &[a.clone(), b.clone()]);
            let first = [
                call(&mut s, 0, a.0, &a.1, None),
                call(&mut s, 0, b.0, &b.1, None),
            ];
            let second = [
                call(&mut s, 1, b.0, &b.1, None),
                call(&mut s, 1, a.0, &a.1, None),
            ];
            assert_eq!(s.run(1_000_000), Ok(()), "{}", s.trace_text());
            for (r, ids) in [(0, first), (1, second)] {
                for id in ids {
                    let want = case(2, None).expected(r);
                    assert_eq!(
                        s.result(r, id),
                        Some(&Ok(want)),
                        "rank {r}\n{}",
                        s.trace_text()
                    );
                }
            }
        }
    }
}
