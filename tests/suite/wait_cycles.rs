//! Wait cycles across groups, as users make them: ranks that issue blocking collectives on
//! two or more groups in orders that can never complete (the production incident of
//! torchrec#4149: ranks 0 and 1 call on group A then B, ranks 2 and 3 on B then A). Every
//! rank gets `Error::WaitCycle` naming the cycle (its ranks, groups and calls) within its
//! call's timeout plus one second, instead of separate timeouts: as itself on the ranks on
//! the cycle, as the cause of an aborted group on the others. Small calls (on the board in
//! one process and over shared memory) and large ones (the engine), in one process, over
//! shared memory and over TCP.

use crate::common::job;
use collectix::{CallOptions, Communicator, Error, ReduceOp, Tensor, Transport, World};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

/// The calls' timeout.
const TIMEOUT: Duration = Duration::from_millis(500);

/// Sizes of the calls: one float (the board where there is one), 64 Ki floats (the engine).
const COUNTS: [usize; 2] = [1, 64 << 10];

/// How one rank's call ended: its error, and how long after it was made.
type Ended = Result<(Error, Duration), String>;

/// All-reduces `count` ones on `c`, timing out after [`TIMEOUT`]; it must fail.
fn blocked(c: &Communicator, count: usize) -> Ended {
    let opts = CallOptions {
        timeout: Some(TIMEOUT),
        ..CallOptions::default()
    };
    let start = Instant::now();
    match c
        .all_reduce_with(Tensor::from_vec(vec![1.0f32; count]), ReduceOp::Sum, &opts)
        .wait()
    {
        Ok(_) => Err("the call completed".into()),
        Err(e) => Ok((e, start.elapsed())),
    }
}

/// The two-groups pattern on one rank of four: groups A and B of every rank; ranks 0 and 1
/// call on A first, ranks 2 and 3 on B first.
fn opposite_orders(r: usize, world: &Communicator, count: usize) -> Ended {
    let a = world
        .new_group(&[0, 1, 2, 3])
        .wait()
        .map_err(|e| e.to_string())?;
    let b = world
        .new_group(&[0, 1, 2, 3])
        .wait()
        .map_err(|e| e.to_string())?;
    let (a, b) = (a.ok_or("not in A")?, b.ok_or("not in B")?);
    blocked(if r < 2 { &a } else { &b }, count)
}

/// Three groups of two (A = {0, 1}, B = {1, 2}, C = {0, 2}): rank 0 calls on A first, rank 1
/// on B, rank 2 on C; each waits for a rank that waits elsewhere. Rank 3 looks on.
fn three_ways(r: usize, world: &Communicator, count: usize) -> Ended {
    let mut mine = Vec::new();
    for members in [[0, 1], [1, 2], [0, 2]] {
        mine.push(
            world
                .new_group(&members)
                .wait()
                .map_err(|e| e.to_string())?,
        );
    }
    let first = match r {
        0 => mine[0].as_ref(),
        1 => mine[1].as_ref(),
        2 => mine[2].as_ref(),
        _ => return Err("no call".into()),
    };
    blocked(first.ok_or("not in its group")?, count)
}

/// Checks what every rank that called got: a wait cycle whose ranks `through` accepts (as
/// itself on the ranks on it, as an aborted group's cause on the others), within the timeout
/// plus one second.
fn named(ended: &[Ended], through: fn(&BTreeSet<usize>) -> bool, what: &str) {
    let bound = TIMEOUT + Duration::from_secs(1);
    for (r, e) in ended.iter().enumerate() {
        if e.as_ref().is_err_and(|e| e == "no call") {
            continue;
        }
        let (e, took) = match e {
            Ok(x) => x,
            Err(e) => panic!("{what}: rank {r}: {e}"),
        };
        let Error::WaitCycle { cycle } = e.root_cause() else {
            panic!("{what}: rank {r}: {e}");
        };
        let ranks: BTreeSet<usize> = cycle.iter().map(|w| w.rank).collect();
        assert!(through(&ranks), "{what}: rank {r}: {e}");
        if ranks.contains(&r) {
            assert!(
                matches!(e, Error::WaitCycle { .. }),
                "{what}: rank {r}: {e}"
            );
        }
        assert!(*took <= bound, "{what}: rank {r}: after {took:?}: {e}");
    }
    if let Ok((e, _)) = &ended[0] {
        println!("{what}: {e}");
    }
}

/// A cycle of the two-groups pattern: a rank that calls on A first and one that calls on B
/// first (which ones depends on whose probe comes back first).
fn across(ranks: &BTreeSet<usize>) -> bool {
    ranks.iter().any(|&r| r < 2) && ranks.iter().any(|&r| r >= 2)
}

/// The cycle of the three groups of two: ranks 0, 1 and 2.
fn all_three(ranks: &BTreeSet<usize>) -> bool {
    ranks.iter().copied().eq([0, 1, 2])
}

fn in_one_process(f: fn(usize, &Communicator, usize) -> Ended, count: usize) -> Vec<Ended> {
    let world = World::local(4).unwrap_or_else(|e| panic!("{e}"));
    let ended = std::thread::scope(|s| {
        let hs: Vec<_> = world
            .communicators()
            .iter()
            .enumerate()
            .map(|(r, c)| s.spawn(move || f(r, c, count)))
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("panicked".into())))
            .collect()
    });
    let _ = world.shutdown();
    ended
}

fn as_a_job(
    transport: Transport,
    f: fn(usize, &Communicator, usize) -> Ended,
    count: usize,
) -> Vec<Ended> {
    let ended = std::sync::Mutex::new(vec![Err("no result".to_string()); 4]);
    let _ = job(
        transport,
        4,
        "the wait cycles test's secret",
        TIMEOUT,
        |r, p| {
            let e = f(r, p.communicator(), count);
            if let Ok(mut all) = ended.lock() {
                all[r] = e;
            }
            p.abort();
            Ok(())
        },
    );
    ended.into_inner().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn two_groups_in_opposite_orders_name_their_cycle_in_one_process() {
    for count in COUNTS {
        let ended = in_one_process(opposite_orders, count);
        named(&ended, across, &format!("one process, {count} floats"));
    }
}

#[test]
fn three_groups_of_two_name_their_cycle_in_one_process() {
    for count in COUNTS {
        let ended = in_one_process(three_ways, count);
        named(&ended, all_three, &format!("one process, {count} floats"));
    }
}

#[test]
fn two_groups_in_opposite_orders_name_their_cycle_over_shared_memory() {
    for count in COUNTS {
        let ended = as_a_job(Transport::Shm, opposite_orders, count);
        named(&ended, across, &format!("shared memory, {count} floats"));
    }
}

#[test]
fn three_groups_of_two_name_their_cycle_over_tcp() {
    for count in COUNTS {
        let ended = as_a_job(Transport::Tcp, three_ways, count);
        named(&ended, all_three, &format!("tcp, {count} floats"));
    }
}
