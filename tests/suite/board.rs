//! Small calls on the board (shared memory, no engine): the ranks of one process run every
//! barrier, and every all_reduce or broadcast of at most 28 bytes, on their group's board.
//! These tests drive the board the ways users drive ranks — all at once, one at a time,
//! skewed, in batches far ahead of the peers, as futures, detached, polled — and through its
//! failures: mismatches (on the board, and between a call on the board and one on the
//! engine), a rank that never calls, a killed rank, a revoke.

use crate::common;

use collectix::{Error, GroupOptions, ReduceOp, Tensor, World};
use common::wait_all;
use std::time::{Duration, Instant};

fn world(n: usize) -> World {
    World::local(n).unwrap_or_else(|e| panic!("{e}"))
}

fn short(n: usize, timeout_ms: u64) -> World {
    let opts = GroupOptions {
        desync_grace: Duration::from_millis(200),
        ..GroupOptions::default().with_timeout(Duration::from_millis(timeout_ms))
    };
    World::local_with(n, opts).unwrap_or_else(|e| panic!("{e}"))
}

fn f32s(t: &Tensor) -> Vec<f32> {
    t.to_vec::<f32>().unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn batches_far_ahead_of_the_peers_complete_in_order() {
    // Every rank issues DEPTH + 50 calls of each kind before it waits for any: more than
    // twice the board's depth, so ranks publish as their peers finish, whoever drives.
    let calls = collectix::runtime::board::DEPTH + 50;
    for n in [2, 3, 5] {
        let w = world(n);
        let c = w.communicators();
        let mut works = Vec::new();
        for (r, c) in c.iter().enumerate() {
            let mut mine = Vec::new();
            for k in 0..calls {
                let x = Tensor::from_vec(vec![(r * k) as f32, 1.0]);
                mine.push(c.all_reduce(x, ReduceOp::Sum));
                let root = k % n;
                let y = Tensor::from_vec(vec![if r == root { k as f32 } else { -1.0 }]);
                mine.push(c.broadcast(y, root));
            }
            works.push(mine);
        }
        for (r, mine) in works.into_iter().enumerate() {
            // Waited for from the last: the earlier ones are finished on the way.
            let got = wait_all(mine.into_iter().rev().collect(), 60);
            for (i, g) in got.into_iter().rev().enumerate() {
                let t = g.unwrap_or_else(|e| panic!("n {n} rank {r} call {i}: {e}"));
                let k = i / 2;
                if i % 2 == 0 {
                    let sum = (0..n).map(|q| (q * k) as f32).sum::<f32>();
                    assert_eq!(f32s(&t), vec![sum, n as f32], "n {n} rank {r} call {i}");
                } else {
                    assert_eq!(f32s(&t), vec![k as f32], "n {n} rank {r} call {i}");
                }
            }
        }
        assert_eq!(w.shutdown(), Ok(()));
    }
}

#[test]
fn a_root_far_ahead_waits_for_nobody_and_the_late_ranks_catch_up() {
    // The root issues and waits for 2 DEPTH + 50 broadcasts before the others make any (a root
    // finishes at once on the board, as on the engine). Then the other two leapfrog, one
    // thread driving both: each finishes up to `DEPTH` calls beyond the other's last (the
    // root publishes a slot once both finished the call that was in it: `board::DEPTH`).
    let w = world(3);
    let c = w.communicators();
    let depth = collectix::runtime::board::DEPTH;
    let n = 2 * depth + 50;
    for k in 0..n {
        let t = c[0]
            .broadcast(Tensor::from_vec(vec![k as f32]), 0)
            .wait_timeout(Duration::from_secs(30));
        assert!(matches!(t, Some(Ok(_))), "root call {k}: {t:?}");
    }
    let check = |r: usize, from: usize, works: Vec<collectix::Work<Tensor>>| {
        for (k, t) in wait_all(works, 30).into_iter().enumerate() {
            let t = t.unwrap_or_else(|e| panic!("rank {r} call {}: {e}", from + k));
            assert_eq!(f32s(&t), vec![(from + k) as f32]);
        }
    };
    let bcast = |r: usize, k: usize| {
        (0..k)
            .map(|_| c[r].broadcast(Tensor::from_vec(vec![0.0f32]), 0))
            .collect::<Vec<_>>()
    };
    let mut done = [0usize; 3];
    for r in [1, 2, 1, 2, 1, 2] {
        let other = 3 - r;
        let upto = (done[other] + depth).min(n);
        check(r, done[r], bcast(r, upto - done[r]));
        done[r] = upto;
    }
    assert_eq!(done, [0, n, n]);
}

#[test]
fn skewed_ranks_wake_the_parked_ones() {
    // Each rank waits for its barrier in turn, 30 ms apart: the early ones spin, park, and
    // are woken by the last one's slot.
    let w = world(4);
    let c = w.communicators();
    for round in 0..3 {
        let start = Instant::now();
        std::thread::scope(|s| {
            for (r, c) in c.iter().enumerate() {
                s.spawn(move || {
                    std::thread::sleep(Duration::from_millis(30 * r as u64));
                    let got = c
                        .all_reduce(Tensor::from_vec(vec![r as f32]), ReduceOp::Max)
                        .wait_timeout(Duration::from_secs(30));
                    match got {
                        Some(Ok(t)) => assert_eq!(f32s(&t), vec![3.0], "round {round}"),
                        other => panic!("rank {r} round {round}: {other:?}"),
                    }
                });
            }
        });
        assert!(start.elapsed() < Duration::from_secs(20));
    }
}

#[test]
fn futures_complete_when_their_peers_come_late() {
    let w = world(2);
    let c = w.communicators();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let (a, b) = (c[0].clone(), c[1].clone());
    let got = rt.block_on(async move {
        let early = tokio::spawn(async move {
            let x = a
                .all_reduce(Tensor::from_vec(vec![1.0f32]), ReduceOp::Sum)
                .await;
            let y = a.barrier().await;
            (x, y)
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        let x = b
            .all_reduce(Tensor::from_vec(vec![2.0f32]), ReduceOp::Sum)
            .await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        let y = b.barrier().await;
        (early.await, x, y)
    });
    let (early, x, y) = got;
    let (ex, ey) = early.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(ex.map(|t| f32s(&t)), Ok(vec![3.0]));
    assert_eq!(ey, Ok(()));
    assert_eq!(x.map(|t| f32s(&t)), Ok(vec![3.0]));
    assert_eq!(y, Ok(()));
}

#[test]
fn detached_calls_keep_the_group_in_step_and_polling_finishes_a_call() {
    let w = world(3);
    let c = w.communicators();
    // Dropped handles: the calls still take their places.
    for c in c {
        for _ in 0..20 {
            drop(c.barrier());
        }
    }
    let works: Vec<_> = c
        .iter()
        .enumerate()
        .map(|(r, c)| c.all_reduce(Tensor::from_vec(vec![r as f32]), ReduceOp::Sum))
        .collect();
    // Polled, never waited for.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !works.iter().all(|w| w.is_completed()) {
        assert!(
            Instant::now() < deadline,
            "polling never finished the calls"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    for w in wait_all(works, 1) {
        assert_eq!(w.map(|t| f32s(&t)), Ok(vec![3.0]));
    }
}

#[test]
fn board_and_engine_calls_interleave_in_the_groups_order() {
    // Small (board) and large (engine) calls issued together, waited for in any order.
    let w = world(3);
    let c = w.communicators();
    let mut works = Vec::new();
    for (r, c) in c.iter().enumerate() {
        let mut mine = Vec::new();
        for k in 0..20 {
            let n = if k % 3 == 0 { 4096 } else { 3 };
            mine.push((
                n,
                k,
                c.all_reduce(Tensor::from_vec(vec![(r + k) as f32; n]), ReduceOp::Sum),
            ));
        }
        works.push(mine);
    }
    for mine in works {
        for (n, k, w) in mine.into_iter().rev() {
            let t = w.wait().unwrap_or_else(|e| panic!("call {k}: {e}"));
            let want = (0..3).map(|r| (r + k) as f32).sum::<f32>();
            assert_eq!(f32s(&t), vec![want; n], "call {k}");
        }
    }
}

#[test]
fn a_mismatch_on_the_board_is_named_at_once_on_every_rank() {
    let w = world(3);
    let c = w.communicators();
    let start = Instant::now();
    let works: Vec<_> = c
        .iter()
        .enumerate()
        .map(|(r, c)| {
            let n = if r == 2 { 3 } else { 2 };
            c.all_reduce(Tensor::from_vec(vec![1i64; n]), ReduceOp::Sum)
        })
        .collect();
    for (r, got) in wait_all(works, 30).into_iter().enumerate() {
        match got {
            Err(e) => assert!(
                matches!(e.root_cause(), Error::Mismatch { ours, theirs, .. }
                    if ours.rank == 2 || theirs.rank == 2),
                "rank {r}: {e}"
            ),
            Ok(_) => panic!("rank {r}: Ok from a mismatched call"),
        }
    }
    // Found from the slots, not at the timeout (five minutes).
    assert!(start.elapsed() < Duration::from_secs(20));
    // The group is aborted: later calls fail at once.
    let later = c[0].barrier().wait_timeout(Duration::from_secs(5));
    assert!(
        matches!(later, Some(Err(Error::GroupAborted { .. }))),
        "{later:?}"
    );
}

#[test]
fn a_call_on_the_board_and_one_on_the_engine_are_a_mismatch() {
    // Rank 1's all_reduce is too large for the board: the ranks take different paths for
    // the same call. Rank 0's slot is there when rank 1 issues (found at once), or rank 1's
    // messages come (found on arrival), or the desync report finds it.
    for late in [0, 1] {
        let w = short(2, 300);
        let c = w.communicators();
        let small = || c[0].all_reduce(Tensor::from_vec(vec![1.0f32]), ReduceOp::Sum);
        let large = || c[1].all_reduce(Tensor::from_vec(vec![1.0f32; 1024]), ReduceOp::Sum);
        let (a, b) = if late == 0 {
            let a = small();
            std::thread::sleep(Duration::from_millis(20));
            (a, large())
        } else {
            let b = large();
            std::thread::sleep(Duration::from_millis(20));
            (small(), b)
        };
        for (r, got) in [
            a.wait_timeout(Duration::from_secs(10)),
            b.wait_timeout(Duration::from_secs(10)),
        ]
        .into_iter()
        .enumerate()
        {
            match got {
                Some(Err(e)) => assert!(
                    matches!(e.root_cause(), Error::Mismatch { .. }),
                    "late {late} rank {r}: {e}"
                ),
                other => panic!("late {late} rank {r}: {other:?}"),
            }
        }
    }
}

#[test]
fn a_rank_that_never_calls_is_named_by_the_timeout() {
    let w = short(3, 300);
    let c = w.communicators();
    let a = c[0].barrier();
    let b = c[1].barrier();
    for (r, got) in [a, b].into_iter().enumerate() {
        match got.wait_timeout(Duration::from_secs(10)) {
            Some(Err(e)) => match e.root_cause() {
                Error::Timeout { waiting_for, .. } => {
                    assert_eq!(waiting_for, &vec![2], "rank {r}: {e}")
                }
                other => panic!("rank {r}: {other}"),
            },
            other => panic!("rank {r}: {other:?}"),
        }
    }
}

#[test]
fn a_killed_rank_ends_the_calls_waiting_for_it() {
    let w = world(3);
    let c = w.communicators();
    let a = c[0].barrier();
    let b = c[1].all_reduce(Tensor::from_vec(vec![1.0f32]), ReduceOp::Sum);
    std::thread::sleep(Duration::from_millis(50));
    let start = Instant::now();
    w.kill(2).unwrap_or_else(|e| panic!("{e}"));
    assert!(a
        .wait_timeout(Duration::from_secs(10))
        .is_some_and(|r| r.is_err()));
    assert!(b
        .wait_timeout(Duration::from_secs(10))
        .is_some_and(|r| r.is_err()));
    assert!(start.elapsed() < Duration::from_secs(10));
}

#[test]
fn a_revoke_ends_a_call_waiting_on_the_board() {
    let w = world(3);
    let c = w.communicators();
    let a = c[0].barrier();
    std::thread::sleep(Duration::from_millis(20));
    c[1].revoke().unwrap_or_else(|e| panic!("{e}"));
    match a.wait_timeout(Duration::from_secs(10)) {
        Some(Err(e)) => assert!(
            matches!(e.root_cause(), Error::Revoked { by: 1, .. }),
            "{e}"
        ),
        other => panic!("{other:?}"),
    }
}

#[test]
fn threads_sharing_a_communicator_at_once_are_refused_never_hang() {
    // Two threads per rank call on the same communicator at once. A rank's calls on a group
    // come from one thread at a time (`collectix_runtime::issuers`): a call made while the
    // other thread's is in flight fails with `ConcurrentCalls` and aborts the group, so
    // every thread stops with an error; every call that completed before got the sum. Each
    // thread pauses before every third call (the other thread's call is then in flight:
    // without pauses two threads of two ranks may make all their calls before the other
    // two run, on two cores).
    let w = world(2);
    let c = w.communicators();
    let ended: Vec<(usize, Option<Error>)> = std::thread::scope(|s| {
        let hs: Vec<_> = c
            .iter()
            .flat_map(|c| (0..2).map(move |t| (c, t)))
            .map(|(c, t)| {
                s.spawn(move || {
                    for k in 0..300 {
                        if (k + t) % 3 == 0 {
                            std::thread::sleep(Duration::from_micros(100));
                        }
                        let got = c
                            .all_reduce(Tensor::from_vec(vec![1.0f32]), ReduceOp::Sum)
                            .wait_timeout(Duration::from_secs(30));
                        match got {
                            Some(Ok(x)) => assert_eq!(f32s(&x), vec![2.0], "thread {t} call {k}"),
                            Some(Err(e)) => return (k, Some(e)),
                            None => panic!("rank {} thread {t} call {k}: a hang", c.rank()),
                        }
                    }
                    (300, None)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| panic!("a thread panicked")))
            .collect()
    });
    assert!(ended.iter().all(|(_, e)| e.is_some()), "{ended:?}");
    assert!(
        ended
            .iter()
            .any(|(_, e)| matches!(e, Some(Error::ConcurrentCalls { .. }))),
        "{ended:?}"
    );
}

/// Every rank of `c` calls `f` on its own thread at once; their results in rank order.
fn at_once<T: Send>(
    c: &[collectix::Communicator],
    f: impl Fn(&collectix::Communicator) -> collectix::Result<T> + Sync,
) -> Vec<collectix::Result<T>> {
    let go = std::sync::Barrier::new(c.len());
    std::thread::scope(|s| {
        let hs: Vec<_> = c
            .iter()
            .map(|c| {
                let (f, go) = (&f, &go);
                s.spawn(move || {
                    go.wait();
                    f(c)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| panic!("a rank's thread panicked"))
            })
            .collect()
    })
}

#[test]
fn ranks_that_call_at_once_in_an_aborted_group_all_fail() {
    // Callers that find every slot there finish on their own thread, without the engine's
    // lock: they must still see that the group was aborted (here by a mismatch every rank
    // heard of), even when every rank publishes its slot at the same moment.
    let w = world(2);
    let c = w.communicators();
    let mismatched = at_once(c, |c| {
        let n = if c.rank() == 1 { 3 } else { 2 };
        c.all_reduce(Tensor::from_vec(vec![1i64; n]), ReduceOp::Sum)
            .wait()
            .map(|_| ())
    });
    assert!(mismatched.iter().all(Result::is_err), "{mismatched:?}");
    for round in 0..50 {
        let got = at_once(c, |c| c.barrier().wait());
        for (r, g) in got.into_iter().enumerate() {
            assert!(
                matches!(g, Err(Error::GroupAborted { .. })),
                "round {round} rank {r}: {g:?}"
            );
        }
    }
}

#[test]
fn calls_that_finish_at_once_are_on_the_record() {
    // Ranks in step finish their calls on their own threads, and the engine hears of them
    // in batches: the flight record still lists each one, finished, in order, and an
    // engine call after them (whose flow control counts them) runs.
    let w = world(2);
    let c = w.communicators();
    let calls = 300;
    for _ in 0..calls {
        let got = at_once(c, |c| c.barrier().wait());
        assert!(got.iter().all(Result::is_ok), "{got:?}");
    }
    for (r, c) in c.iter().enumerate() {
        let record = c.flight_record();
        let last = record
            .last()
            .unwrap_or_else(|| panic!("rank {r}: an empty flight record"));
        assert_eq!(last.seq, Some(calls - 1), "rank {r}: {last}");
        let seqs: Vec<_> = record.iter().filter_map(|x| x.seq).collect();
        assert!(
            seqs.windows(2).all(|p| p[1] == p[0] + 1),
            "rank {r}: {seqs:?}"
        );
        for x in &record {
            assert_eq!(x.op, collectix::OpKind::Barrier, "rank {r}: {x}");
            assert_eq!(x.state, collectix::CallState::Completed, "rank {r}: {x}");
        }
    }
    let big = at_once(c, |c| {
        c.all_reduce(Tensor::from_vec(vec![1.0f32; 4096]), ReduceOp::Sum)
            .wait()
    });
    for (r, t) in big.into_iter().enumerate() {
        let t = t.unwrap_or_else(|e| panic!("rank {r}: {e}"));
        assert!(f32s(&t).iter().all(|&x| x == 2.0), "rank {r}");
    }
}

#[test]
fn destroy_fails_the_ranks_own_calls_in_flight_on_the_board_with_shutdown() {
    // Rank 0's barrier and small all_reduce wait on the board for rank 1, which never
    // calls; rank 0 destroys the group: its calls in flight end with `Shutdown`, as its
    // engine calls do (`docs/errors.md`), and a call made after it is refused.
    let w = world(2);
    let c = w.communicators();
    let barrier = c[0].barrier();
    let small = c[0].all_reduce(Tensor::from_vec(vec![1.0f32]), ReduceOp::Sum);
    let large = c[0].all_reduce(Tensor::from_vec(vec![1.0f32; 10_000]), ReduceOp::Sum);
    assert_eq!(c[0].destroy().wait(), Ok(()));
    let d = Duration::from_secs(10);
    assert_eq!(
        barrier.wait_timeout(d),
        Some(Err(Error::Shutdown)),
        "the barrier"
    );
    assert_eq!(
        small.wait_timeout(d).map(|r| r.map(|t| f32s(&t))),
        Some(Err(Error::Shutdown)),
        "the small all_reduce"
    );
    assert_eq!(
        large.wait_timeout(d).map(|r| r.map(|t| f32s(&t))),
        Some(Err(Error::Shutdown)),
        "the engine's all_reduce"
    );
    let after = c[0].barrier().wait_timeout(d);
    assert!(
        matches!(after, Some(Err(Error::InvalidArgument(_)))),
        "a call after destroy: {after:?}"
    );
}
