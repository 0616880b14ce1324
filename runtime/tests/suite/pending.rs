//! Pending errors, `monitored_barrier` and `destroy_group`, in the seeded simulator: no
//! swallowed mismatch. A call that completes early (a broadcast root, a gather non-root)
//! returns `Ok` even when its peers were in another call; the failure they find reaches this
//! rank as the group's pending error, which its next call on the group, a
//! `monitored_barrier` or `destroy_group` returns.

use crate::common;
use collectix_runtime::group::{GroupId, GroupOptions};
use collectix_runtime::testing::sim::Sim;
use collectix_runtime::testing::Case;
use collectix_runtime::{DType, Error, OpId, OpKind, Request, Time};
use common::{opts, run, TIMEOUT};

fn case(kind: OpKind, w: usize) -> Case {
    common::case(kind, w, DType::I32)
}

fn submit(sim: &mut Sim, r: usize, req: Request) -> OpId {
    sim.submit(r, GroupId::WORLD, req, &opts())
        .unwrap_or_else(|e| panic!("rank {r}: {e}"))
}

/// The root cause of a result, or a panic naming what was there instead.
fn cause(sim: &Sim, r: usize, id: OpId) -> Error {
    match sim.result(r, id) {
        Some(Err(e)) => e.root_cause().clone(),
        other => panic!("rank {r}: {other:?}, not an error\n{}", sim.trace_text()),
    }
}

fn names(e: &Error, m: usize) -> bool {
    matches!(e, Error::Mismatch { ours, theirs, .. } if ours.rank == m || theirs.rank == m)
}

/// Rank 1 gathers where ranks 0 and 2 broadcast from 0: the root's broadcast and rank 1's
/// contribution complete early with `Ok`; each learns of the mismatch as a pending error,
/// which its next call returns, once, and which then no longer counts as pending.
#[test]
fn an_early_finished_call_hears_of_the_mismatch_from_its_next_call() {
    let w = 3;
    let mut sim = Sim::new(w, 7);
    let bc = case(OpKind::Broadcast, w);
    let ga = case(OpKind::Gather, w);
    let ids: Vec<OpId> = (0..w)
        .map(|r| {
            let req = if r == 1 { ga.request(r) } else { bc.request(r) };
            submit(&mut sim, r, req)
        })
        .collect();
    run(&mut sim);
    assert!(
        matches!(sim.result(0, ids[0]), Some(Ok(_))),
        "the root finishes early: {:?}",
        sim.result(0, ids[0])
    );
    for (r, &id) in ids.iter().enumerate() {
        let pending = sim.engine(r).and_then(|e| e.pending_error(GroupId::WORLD));
        let heard = matches!(sim.result(r, id), Some(Err(_)));
        match (&pending, heard) {
            (None, true) => {}
            (Some(e), false) => assert!(names(e.root_cause(), 1), "rank {r}: {e}"),
            _ => panic!(
                "rank {r}: pending {pending:?}, call {:?}",
                sim.result(r, id)
            ),
        }
        let next = submit(&mut sim, r, case(OpKind::AllReduce, w).request(r));
        run(&mut sim);
        assert!(
            matches!(sim.result(r, next), Some(Err(Error::GroupAborted { .. }))),
            "rank {r}: {:?}",
            sim.result(r, next)
        );
        assert!(names(&cause(&sim, r, next), 1));
        assert_eq!(
            sim.engine(r).and_then(|e| e.pending_error(GroupId::WORLD)),
            None,
            "rank {r}: returned once, no longer pending"
        );
    }
}

/// `destroy_group` returns the pending error of a rank whose calls all completed.
#[test]
fn destroying_a_group_returns_its_pending_error() {
    let w = 2;
    let mut sim = Sim::new(w, 3);
    // Rank 0 sends (a broadcast root), rank 1 expects a different count: rank 1 fails at
    // once, rank 0's call completed and never hears unless it asks.
    let bc = case(OpKind::Broadcast, w);
    let odd = Case {
        count: 5,
        ..bc.clone()
    };
    let a = submit(&mut sim, 0, bc.request(0));
    let b = submit(&mut sim, 1, odd.request(1));
    run(&mut sim);
    assert!(matches!(sim.result(0, a), Some(Ok(_))));
    assert!(names(&cause(&sim, 1, b), 1));
    let got = sim.destroy_group(0, GroupId::WORLD);
    assert!(
        matches!(&got, Err(Error::GroupAborted { cause, .. }) if names(cause, 1)),
        "{got:?}"
    );
    // Rank 1 heard it from its call: nothing pending there.
    assert_eq!(sim.destroy_group(1, GroupId::WORLD), Ok(()));
    // Nothing of the group stays behind for the transports' readers.
    for r in 0..w {
        let marked = sim.engine(r).map(|e| e.landings().groups_marked());
        assert_eq!(marked, Some(0), "rank {r}");
    }
    // Later calls on a destroyed group are the caller's mistake, said so.
    let info_gone = sim.submit(0, GroupId::WORLD, bc.request(0), &opts());
    assert!(info_gone.is_err());
    assert!(matches!(
        sim.destroy_group(0, GroupId::WORLD),
        Err(Error::InvalidArgument(_))
    ));
}

/// A group destroyed on a rank with nothing in flight: the peers in a call that needs that
/// rank are told at once (they waited out their timeout before), naming it.
#[test]
fn destroying_a_group_with_nothing_in_flight_tells_the_peers() {
    let w = 3;
    for seed in 0..20 {
        let mut sim = Sim::new(w, seed);
        let ar = case(OpKind::AllReduce, w);
        let ids: Vec<OpId> = (0..2).map(|r| submit(&mut sim, r, ar.request(r))).collect();
        assert_eq!(sim.destroy_group(2, GroupId::WORLD), Ok(()));
        run(&mut sim);
        for (r, &id) in ids.iter().enumerate() {
            let e = cause(&sim, r, id);
            assert_eq!(
                e,
                Error::PeerShutdown {
                    rank: 2,
                    undelivered: 0
                },
                "rank {r}\n{}",
                sim.trace_text()
            );
            let at = sim.completed_at(r, id).unwrap_or(Time::ZERO);
            assert!(at < Time::ZERO + TIMEOUT / 10, "told at {at:?}");
        }
    }
}

/// A rank whose calls completed early (a broadcast root) destroys the group at once: the
/// calls it took part in still complete on its peers, whatever order its messages arrive
/// in; only the next call, which needs it, fails, at once.
#[test]
fn a_member_that_left_after_its_calls_lets_them_complete() {
    let w = 3;
    for seed in 0..20 {
        let mut sim = Sim::new(w, seed);
        let bc = case(OpKind::Broadcast, w);
        let first: Vec<OpId> = (0..w).map(|r| submit(&mut sim, r, bc.request(r))).collect();
        assert!(
            matches!(sim.result(0, first[0]), Some(Ok(_))),
            "the root is done"
        );
        assert_eq!(sim.destroy_group(0, GroupId::WORLD), Ok(()));
        let ar = case(OpKind::AllReduce, w);
        let next: Vec<OpId> = (1..w).map(|r| submit(&mut sim, r, ar.request(r))).collect();
        run(&mut sim);
        for r in 1..w {
            assert!(
                matches!(sim.result(r, first[r]), Some(Ok(_))),
                "rank {r}: {:?}\n{}",
                sim.result(r, first[r]),
                sim.trace_text()
            );
            assert_eq!(
                cause(&sim, r, next[r - 1]),
                Error::PeerShutdown {
                    rank: 0,
                    undelivered: 0
                }
            );
            // Not an abort: nothing is pending on the group.
            assert_eq!(sim.destroy_group(r, GroupId::WORLD), Ok(()), "rank {r}");
        }
    }
}

/// A group destroyed while one of its calls is in flight: the call fails with `Shutdown`
/// and the peers in it are told at once (not at their timeout).
#[test]
fn destroying_a_group_with_a_call_in_flight_tells_the_peers() {
    let w = 3;
    let mut sim = Sim::new(w, 11);
    let ar = case(OpKind::AllReduce, w);
    let ids: Vec<OpId> = (0..2).map(|r| submit(&mut sim, r, ar.request(r))).collect();
    // Rank 2 has not called yet; rank 0 destroys the group with its call waiting.
    let _ = sim.destroy_group(0, GroupId::WORLD);
    run(&mut sim);
    assert_eq!(sim.result(0, ids[0]), Some(&Err(Error::Shutdown)));
    let e = cause(&sim, 1, ids[1]);
    assert!(
        matches!(e, Error::PeerShutdown { rank: 0, .. }),
        "{e}\n{}",
        sim.trace_text()
    );
    let at = sim.completed_at(1, ids[1]).unwrap_or(Time::ZERO);
    assert!(
        at < Time::ZERO + TIMEOUT,
        "told at {at:?}, not at the timeout"
    );
}

/// Every rank comes: `Ok` everywhere, however skewed (rank 2 comes late, within the
/// timeout).
#[test]
fn a_monitored_barrier_that_everyone_reaches_succeeds() {
    for w in [1, 2, 3, 5] {
        let mut sim = Sim::new(w, w as u64);
        let mut ids = Vec::new();
        for r in 0..w {
            if r == 2 {
                continue;
            }
            ids.push((r, submit(&mut sim, r, Request::MonitoredBarrier)));
        }
        if w > 2 {
            sim.run_for(TIMEOUT / 2);
            ids.push((2, submit(&mut sim, 2, Request::MonitoredBarrier)));
        }
        run(&mut sim);
        for (r, id) in ids {
            assert_eq!(
                sim.result(r, id).map(Result::is_ok),
                Some(true),
                "w={w} rank {r}: {:?}\n{}",
                sim.result(r, id),
                sim.trace_text()
            );
        }
    }
}

/// Ranks 3 and 4 never come: rank 0 names exactly them, after the timeout and at most the
/// grace; every other rank returns the same verdict (as the group's abort), and no rank
/// waits longer than the timeout, the grace and a message's way.
#[test]
fn a_monitored_barrier_names_every_rank_that_did_not_come() {
    let w = 5;
    let mut sim = Sim::new(w, 5);
    let ids: Vec<OpId> = (0..3)
        .map(|r| submit(&mut sim, r, Request::MonitoredBarrier))
        .collect();
    run(&mut sim);
    let grace = GroupOptions::default().desync_grace;
    let bound = Time::ZERO + TIMEOUT + grace + sim.max_propagation() * 2;
    let verdict = cause(&sim, 0, ids[0]);
    assert!(
        matches!(&verdict, Error::Timeout { rank: 0, waiting_for, op: OpKind::MonitoredBarrier, .. } if *waiting_for == vec![3, 4]),
        "{verdict}"
    );
    for (r, &id) in ids.iter().enumerate() {
        assert_eq!(cause(&sim, r, id), verdict, "rank {r}");
        let at = sim.completed_at(r, id).unwrap_or(Time::ZERO);
        assert!(at <= bound, "rank {r} at {at:?}, bound {bound:?}");
    }
    // The missing ranks hear of it too: as a pending error now, from their next call later.
    for r in 3..w {
        let p = sim.engine(r).and_then(|e| e.pending_error(GroupId::WORLD));
        assert_eq!(
            p.as_ref().map(Error::root_cause),
            Some(&verdict),
            "rank {r}"
        );
    }
}

/// Rank 0 itself never comes: every other rank times out naming it.
#[test]
fn a_monitored_barrier_without_rank_0_names_rank_0() {
    let w = 3;
    let mut sim = Sim::new(w, 9);
    let ids: Vec<OpId> = (1..w)
        .map(|r| submit(&mut sim, r, Request::MonitoredBarrier))
        .collect();
    run(&mut sim);
    for (i, &id) in ids.iter().enumerate() {
        let e = cause(&sim, i + 1, id);
        assert!(
            matches!(&e, Error::Timeout { waiting_for, .. } if *waiting_for == vec![0]),
            "rank {}: {e}",
            i + 1
        );
    }
}

/// On links that keep their order, a program that ends with `monitored_barrier` hears of
/// every mismatch its early-finished calls left behind, on every rank, however the messages
/// are timed. The hard case is traffic between two ranks other than rank 0: rank 2 scatters
/// (a root: done at once), rank 1 gathers to 2 (a non-root: done at once), rank 0 receives
/// its part of the scatter. Without the barrier's first step (every rank exchanges a marker
/// with every other), rank 0 could collect the reports and release everyone before rank 1 or
/// 2 found the other's data, and return `Ok`.
#[test]
fn a_monitored_barrier_on_ordered_links_hears_of_every_mismatch_before_it() {
    use collectix_runtime::testing::sim::{Delivery, SimOptions};
    let w = 3;
    let sc = Case {
        root: 2,
        ..case(OpKind::Scatter, w)
    };
    let ga = Case {
        root: 2,
        ..case(OpKind::Gather, w)
    };
    for seed in 0..200 {
        let net = SimOptions::default().with_delivery(Delivery::Fifo);
        let mut sim = Sim::with_config(w, seed, GroupOptions::default(), net);
        let mut last = Vec::new();
        for r in 0..w {
            let req = if r == 1 { ga.request(r) } else { sc.request(r) };
            submit(&mut sim, r, req);
        }
        for r in [1, 2] {
            // The early finishers go on to the barrier at once.
            last.push((r, submit(&mut sim, r, Request::MonitoredBarrier)));
        }
        // Rank 0 once its scatter has its data.
        while sim.pending(0) > 0 && sim.step() {}
        last.push((0, submit(&mut sim, 0, Request::MonitoredBarrier)));
        run(&mut sim);
        for (r, id) in last {
            assert!(
                matches!(sim.result(r, id), Some(Err(e)) if names(e.root_cause(), 1)),
                "seed {seed}, rank {r}: {:?}\n{}",
                sim.result(r, id),
                sim.trace_text()
            );
        }
    }
}
