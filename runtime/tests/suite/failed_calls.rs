//! A call that fails its argument checks on one rank, in the seeded simulator: the rank still
//! takes the call's sequence number and tells the others, whose parts fail at once with
//! `Error::CallFailed` naming it (they used to wait out their timeout); the group goes on,
//! and the next call completes everywhere with the right values. Skewed (the bad rank first
//! or last), in batches, and beyond the flow-control window.

use crate::common;
use collectix_runtime::group::{GroupId, GroupOptions};
use collectix_runtime::testing::sim::Sim;
use collectix_runtime::testing::Case;
use collectix_runtime::{DType, Error, OpId, OpKind, ReduceOp, Request, Tensor, Time};
use common::{opts, run, TIMEOUT};

fn all_reduce(w: usize) -> Case {
    common::case(OpKind::AllReduce, w, DType::I32)
}

/// An all_reduce that fails its checks: `Avg` of integers.
fn bad() -> Request {
    Request::AllReduce {
        tensor: Tensor::from_vec(vec![1i32; 4]),
        op: ReduceOp::Avg,
    }
}

/// Submits `req` on rank `r`: the call's id, or the error it got at once.
fn submit(sim: &mut Sim, r: usize, req: Request) -> Result<OpId, Error> {
    sim.submit(r, GroupId::WORLD, req, &opts())
}

/// Submits a call that must be taken.
fn good(sim: &mut Sim, r: usize, req: Request) -> OpId {
    submit(sim, r, req).unwrap_or_else(|e| panic!("rank {r}: {e}"))
}

fn engine(sim: &Sim, r: usize) -> &collectix_runtime::Engine {
    sim.engine(r).unwrap_or_else(|| panic!("no rank {r}"))
}

/// Rank `r`'s call `id` failed with `CallFailed` naming `bad` at `seq`, well before the
/// timeout.
fn assert_told(sim: &Sim, r: usize, id: OpId, bad: usize, seq: u64) {
    match sim.result(r, id) {
        Some(Err(Error::CallFailed {
            group,
            seq: s,
            rank,
            reason,
        })) => {
            assert_eq!((*group, *s, *rank), (GroupId::WORLD, seq, bad), "rank {r}");
            assert!(reason.starts_with("invalid argument"), "{reason}");
        }
        other => panic!("rank {r}: {other:?}, not CallFailed\n{}", sim.trace_text()),
    }
    let at = sim.completed_at(r, id).unwrap_or(Time::ZERO);
    assert!(at < Time::ZERO + TIMEOUT / 10, "rank {r} told at {at:?}");
}

/// The good all_reduce completed on every rank with the right values.
fn assert_good(sim: &Sim, case: &Case, ids: &[OpId]) {
    for (r, &id) in ids.iter().enumerate() {
        match sim.result(r, id) {
            Some(Ok(out)) => assert_eq!(out, &case.expected(r), "rank {r}"),
            other => panic!("rank {r}: {other:?}\n{}", sim.trace_text()),
        }
    }
}

#[test]
fn a_bad_argument_on_one_rank_fails_the_call_at_once_everywhere_and_the_group_goes_on() {
    for w in [2, 3, 4] {
        for bad_rank in [0, w - 1] {
            for bad_first in [true, false] {
                for seed in 0..10 {
                    let mut sim = Sim::new(w, seed);
                    let ar = all_reduce(w);
                    let mut ids = vec![None; w];
                    let order: Vec<usize> = if bad_first {
                        std::iter::once(bad_rank)
                            .chain((0..w).filter(|&r| r != bad_rank))
                            .collect()
                    } else {
                        (0..w)
                            .filter(|&r| r != bad_rank)
                            .chain([bad_rank])
                            .collect()
                    };
                    for r in order {
                        if r == bad_rank {
                            let got = submit(&mut sim, r, bad());
                            assert!(matches!(got, Err(Error::InvalidArgument(_))), "{got:?}");
                            if bad_first {
                                // Skewed: the others make the call after the marker came.
                                run(&mut sim);
                            }
                        } else {
                            ids[r] = Some(good(&mut sim, r, ar.request(r)));
                        }
                    }
                    run(&mut sim);
                    for (r, id) in ids.iter().enumerate() {
                        if let Some(id) = id {
                            assert_told(&sim, r, *id, bad_rank, 0);
                        }
                    }
                    // The next call is call #1 everywhere, and completes.
                    let next: Vec<OpId> =
                        (0..w).map(|r| good(&mut sim, r, ar.request(r))).collect();
                    run(&mut sim);
                    assert_good(&sim, &ar, &next);
                    for r in 0..w {
                        let e = engine(&sim, r);
                        assert_eq!(e.pending_error(GroupId::WORLD), None, "rank {r}");
                        assert_eq!(e.completed_calls(GroupId::WORLD), Some(2), "rank {r}");
                    }
                }
            }
        }
    }
}

/// Calls issued in a batch, where one rank's first and third fail their checks: those fail
/// everywhere, the second and fourth complete everywhere.
#[test]
fn in_a_batch_only_the_calls_that_failed_somewhere_fail() {
    let w = 3;
    for seed in 0..20 {
        let mut sim = Sim::new(w, seed);
        let ar = all_reduce(w);
        let mut ids: Vec<Vec<Option<OpId>>> = vec![Vec::new(); w];
        for (r, calls) in ids.iter_mut().enumerate() {
            for k in 0..4 {
                let req = if r == 1 && k % 2 == 0 {
                    bad()
                } else {
                    ar.request(r)
                };
                calls.push(submit(&mut sim, r, req).ok());
            }
        }
        run(&mut sim);
        for k in 0..4 {
            let of = |r: usize| ids.get(r).and_then(|calls| calls.get(k)).copied().flatten();
            if k % 2 == 0 {
                assert!(of(1).is_none());
                for r in [0, 2] {
                    let id = of(r).unwrap_or_else(|| panic!("rank {r}: call {k} refused"));
                    assert_told(&sim, r, id, 1, k as u64);
                }
            } else {
                let calls: Vec<OpId> = (0..w).filter_map(of).collect();
                assert_eq!(calls.len(), w);
                assert_good(&sim, &ar, &calls);
            }
        }
    }
}

/// A rank whose calls fail their checks runs ahead of its peers by more than the window:
/// its markers wait in its flow control like data would (no protocol violation at the
/// peers), and every one of the peers' calls hears of its own.
#[test]
fn failed_calls_far_ahead_respect_the_window() {
    let w = 2;
    let opts = GroupOptions {
        window: 2,
        ..GroupOptions::default()
    };
    for seed in 0..10 {
        let mut sim = Sim::with_options(w, seed, opts.clone());
        for _ in 0..7 {
            assert!(submit(&mut sim, 0, bad()).is_err());
        }
        run(&mut sim);
        assert!(engine(&sim, 0).held() > 0, "markers held for credit");
        let ar = all_reduce(w);
        for k in 0..7 {
            let id = good(&mut sim, 1, ar.request(1));
            run(&mut sim);
            assert_told(&sim, 1, id, 0, k);
        }
        let next: Vec<OpId> = (0..w).map(|r| good(&mut sim, r, ar.request(r))).collect();
        run(&mut sim);
        assert_good(&sim, &ar, &next);
    }
}

/// A call of a group that completed early on one rank (a broadcast root needs nothing from
/// the others) keeps its result there; the rank whose part failed and the rank that needed
/// it fail, and nothing is pending anywhere afterwards.
#[test]
fn a_root_that_completed_keeps_its_result() {
    let w = 2;
    for seed in 0..10 {
        let mut sim = Sim::new(w, seed);
        let bc = Case {
            kind: OpKind::Broadcast,
            ..all_reduce(w)
        };
        let root = good(&mut sim, 0, bc.request(0));
        let bad_bc = Request::Broadcast {
            tensor: Tensor::from_vec(vec![0i32; 4]),
            root: 9,
        };
        assert!(submit(&mut sim, 1, bad_bc).is_err());
        run(&mut sim);
        assert!(matches!(sim.result(0, root), Some(Ok(_))));
        for r in 0..w {
            assert_eq!(
                engine(&sim, r).pending_error(GroupId::WORLD),
                None,
                "rank {r}\n{}",
                sim.trace_text()
            );
        }
        let ar = all_reduce(w);
        let next: Vec<OpId> = (0..w).map(|r| good(&mut sim, r, ar.request(r))).collect();
        run(&mut sim);
        assert_good(&sim, &ar, &next);
    }
}
