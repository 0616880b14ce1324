//! Wrong inputs end in a typed error on every rank, within the timeout plus one propagation
//! delay: never a hang, never a panic, never silently wrong data.

use crate::common;
use collectix::runtime::collective::Request;
use collectix::{
    Algorithm, CallOptions, Communicator, DType, Error, GroupOptions, OpKind, ReduceOp, Tensor,
    TensorSpec, Work, World,
};
use common::{root, wait_all};
use std::time::Duration;

fn world(n: usize) -> World {
    World::local_with(
        n,
        GroupOptions::default().with_timeout(Duration::from_secs(20)),
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

/// Every rank issues `call(rank)`, then a barrier, then another barrier. The last must fail
/// with `GroupAborted` on every rank; the first error each rank saw (on whichever call) must
/// have a mismatch naming two different ranks at its root. (A rank whose first two calls
/// completed before the abort reached it legitimately learns of it on the third.)
fn assert_mismatch_everywhere(
    n: usize,
    call: impl Fn(&Communicator) -> Work<collectix::runtime::Output>,
) {
    let w = world(n);
    let mut firsts = Vec::new();
    let mut barriers = Vec::new();
    for c in w.communicators() {
        firsts.push(call(c));
        barriers.push(c.barrier());
    }
    let firsts = wait_all(firsts, 30);
    let barriers = wait_all(barriers, 30);
    let laters = wait_all(
        w.communicators()
            .iter()
            .map(Communicator::barrier)
            .collect(),
        30,
    );
    let mut saw_mismatch = 0;
    for r in 0..n {
        assert!(
            matches!(laters[r], Err(Error::GroupAborted { .. })),
            "rank {r}: {:?}",
            laters[r]
        );
        let err = [
            &firsts[r].as_ref().err(),
            &barriers[r].as_ref().err(),
            &laters[r].as_ref().err(),
        ]
        .into_iter()
        .find_map(|e| e.cloned())
        .unwrap_or_else(|| panic!("rank {r} saw no error"));
        match root(&err) {
            Error::Mismatch { ours, theirs, .. } => {
                assert_ne!(ours.rank, theirs.rank);
                assert_ne!(ours.call, theirs.call);
                if matches!(err, Error::Mismatch { .. }) {
                    saw_mismatch += 1;
                }
            }
            other => panic!("rank {r}: expected a mismatch, got {other}"),
        }
    }
    assert!(
        saw_mismatch >= 1,
        "at least one rank detects the mismatch itself"
    );
}

fn f32s(n: usize, v: f32) -> Tensor {
    Tensor::from_vec(vec![v; n])
}

#[test]
fn different_collectives() {
    assert_mismatch_everywhere(4, |c| {
        if c.rank() == 1 {
            c.submit(
                Request::Broadcast {
                    tensor: f32s(8, 1.0),
                    root: 0,
                },
                &CallOptions::default(),
            )
        } else {
            c.submit(
                Request::AllReduce {
                    tensor: f32s(8, 1.0),
                    op: ReduceOp::Sum,
                },
                &CallOptions::default(),
            )
        }
    });
}

#[test]
fn different_dtypes() {
    assert_mismatch_everywhere(3, |c| {
        let t = if c.rank() == 2 {
            Tensor::from_vec(vec![1.0f64; 8])
        } else {
            f32s(8, 1.0)
        };
        c.submit(
            Request::AllReduce {
                tensor: t,
                op: ReduceOp::Sum,
            },
            &CallOptions::default(),
        )
    });
}

#[test]
fn different_counts() {
    assert_mismatch_everywhere(4, |c| {
        let n = if c.rank() == 0 { 9 } else { 8 };
        c.submit(
            Request::AllReduce {
                tensor: f32s(n, 1.0),
                op: ReduceOp::Sum,
            },
            &CallOptions::default(),
        )
    });
}

#[test]
fn different_roots() {
    assert_mismatch_everywhere(3, |c| {
        let root = if c.rank() == 2 { 1 } else { 0 };
        c.submit(
            Request::Broadcast {
                tensor: f32s(4, c.rank() as f32),
                root,
            },
            &CallOptions::default(),
        )
    });
}

#[test]
fn different_reduce_ops() {
    assert_mismatch_everywhere(2, |c| {
        let op = if c.rank() == 0 {
            ReduceOp::Max
        } else {
            ReduceOp::Min
        };
        c.submit(
            Request::AllReduce {
                tensor: f32s(4, 1.0),
                op,
            },
            &CallOptions::default(),
        )
    });
}

#[test]
fn different_premul_scalars() {
    assert_mismatch_everywhere(2, |c| {
        let op = ReduceOp::PremulSum(if c.rank() == 0 { 0.5 } else { 0.25 });
        c.submit(
            Request::AllReduce {
                tensor: f32s(4, 1.0),
                op,
            },
            &CallOptions::default(),
        )
    });
}

#[test]
fn different_algorithms() {
    assert_mismatch_everywhere(4, |c| {
        let alg = if c.rank() == 3 {
            Algorithm::Ring
        } else {
            Algorithm::RecursiveDoubling
        };
        let opts = CallOptions {
            algorithm: Some(alg),
            timeout: None,
        };
        c.submit(
            Request::AllReduce {
                tensor: f32s(64, 1.0),
                op: ReduceOp::Sum,
            },
            &opts,
        )
    });
}

#[test]
fn different_new_group_member_lists() {
    let w = world(3);
    let works: Vec<_> = w
        .communicators()
        .iter()
        .map(|c| c.new_group(if c.rank() == 0 { &[0, 1] } else { &[1, 2] }))
        .collect();
    for (r, res) in wait_all(works, 30).into_iter().enumerate() {
        let e = res
            .err()
            .unwrap_or_else(|| panic!("rank {r} created a group"));
        assert!(matches!(root(&e), Error::Mismatch { .. }), "rank {r}: {e}");
    }
}

#[test]
fn point_to_point_size_mismatch() {
    let w = world(2);
    let c = w.communicators();
    let s = c[0].send(f32s(3, 1.0), 1, 7);
    let r = c[1].recv(TensorSpec::new(&[4], DType::F32), Some(0), 7);
    assert!(s.wait().is_ok());
    let e = r
        .wait()
        .err()
        .unwrap_or_else(|| panic!("recv of the wrong size succeeded"));
    assert!(matches!(e, Error::Mismatch { .. }), "{e}");
    // The sender's next call on the group fails too: the receiver aborted it.
    let later = c[0].barrier().wait_timeout(Duration::from_secs(10));
    assert!(
        matches!(later, Some(Err(Error::GroupAborted { .. }))),
        "{later:?}"
    );
}

#[test]
fn a_rank_that_never_calls_is_named_by_the_timeout() {
    let w = World::local(3).unwrap_or_else(|e| panic!("{e}"));
    let c = w.communicators();
    // Timeouts are per call and need not agree: rank 0's fires first and aborts the group.
    let ring = |ms| CallOptions {
        algorithm: Some(Algorithm::Ring),
        timeout: Some(Duration::from_millis(ms)),
    };
    let a = c[0].all_reduce_with(f32s(6, 1.0), ReduceOp::Sum, &ring(200));
    let b = c[1].all_reduce_with(f32s(6, 1.0), ReduceOp::Sum, &ring(20_000));
    // Rank 2 never calls. Ring: rank 0 waits for rank 2, rank 1 for rank 0.
    let res = wait_all(vec![a, b], 30);
    let e0 = res[0]
        .as_ref()
        .err()
        .unwrap_or_else(|| panic!("rank 0 completed"));
    match e0 {
        Error::Timeout {
            op,
            waiting_for,
            rank,
            ..
        } => {
            assert_eq!(
                (*op, waiting_for.as_slice(), *rank),
                (OpKind::AllReduce, &[2][..], 0)
            );
        }
        other => panic!("rank 0: {other}"),
    }
    assert!(e0.to_string().contains("waiting for ranks [2]"), "{e0}");
    // Rank 1 learns of it through the abort, long before its own 20 s.
    match &res[1] {
        Err(Error::GroupAborted { cause, .. }) => assert_eq!(**cause, e0.clone()),
        other => panic!("rank 1: {other:?}"),
    }
}

/// A call whose arguments fail their checks on one rank fails there at once with
/// `InvalidArgument`, and it still takes its place in the group's order: the other rank's
/// part of the same call fails at once with `CallFailed` naming it (it used to wait out the
/// group's timeout, 20 s here), whether it called first or second. The group goes on: the
/// next call works on both ranks. Point-to-point calls stay local (a send to oneself has no
/// peer to tell).
#[test]
fn a_bad_argument_on_one_rank_fails_that_call_on_every_rank_at_once() {
    type Call = Box<dyn Fn(&Communicator) -> Work<collectix::runtime::Output>>;
    let submit = |req: fn() -> Request| -> Call {
        Box::new(move |c: &Communicator| c.submit(req(), &CallOptions::default()))
    };
    // (what rank 0 calls, which fails its checks; what rank 1 calls, which is fine)
    let pairs: Vec<(Call, Call)> = vec![
        (
            submit(|| Request::Broadcast {
                tensor: f32s(2, 1.0),
                root: 2,
            }),
            submit(|| Request::Broadcast {
                tensor: f32s(2, 1.0),
                root: 0,
            }),
        ),
        (
            submit(|| Request::AllReduce {
                tensor: f32s(2, 1.0),
                op: ReduceOp::BAnd,
            }),
            submit(|| Request::AllReduce {
                tensor: f32s(2, 1.0),
                op: ReduceOp::Sum,
            }),
        ),
        (
            submit(|| Request::AllReduce {
                tensor: Tensor::from_vec(vec![1i32]),
                op: ReduceOp::Avg,
            }),
            submit(|| Request::AllReduce {
                tensor: Tensor::from_vec(vec![1i32]),
                op: ReduceOp::Sum,
            }),
        ),
        (
            submit(|| Request::ReduceScatter {
                inputs: vec![f32s(1, 1.0)],
                op: ReduceOp::Sum,
            }),
            submit(|| Request::ReduceScatter {
                inputs: vec![f32s(1, 1.0), f32s(1, 1.0)],
                op: ReduceOp::Sum,
            }),
        ),
        (
            submit(|| Request::AllGatherIntoTensor {
                output: TensorSpec::new(&[3], DType::F32),
                input: f32s(2, 1.0),
            }),
            submit(|| Request::AllGatherIntoTensor {
                output: TensorSpec::new(&[4], DType::F32),
                input: f32s(2, 1.0),
            }),
        ),
        (
            submit(|| Request::Scatter {
                output: TensorSpec::new(&[2], DType::F32),
                inputs: Some(vec![f32s(2, 1.0)]),
                root: 0,
            }),
            submit(|| Request::Scatter {
                output: TensorSpec::new(&[2], DType::F32),
                inputs: None,
                root: 0,
            }),
        ),
    ];
    let w = world(2);
    let c = w.communicators();
    for (k, (bad, good)) in pairs.iter().enumerate() {
        // Each pair is one call of the group: call #k.
        let seq = k as u64;
        // Skewed both ways: the good rank first, then the bad one first.
        let (theirs, ours) = if k % 2 == 0 {
            let t = good(&c[1]);
            (t, bad(&c[0]))
        } else {
            let o = bad(&c[0]);
            (good(&c[1]), o)
        };
        let ours = ours.wait_timeout(Duration::from_millis(100));
        assert!(
            matches!(ours, Some(Err(Error::InvalidArgument(_)))),
            "pair {k}: {ours:?}"
        );
        match theirs.wait_timeout(Duration::from_secs(5)) {
            Some(Err(Error::CallFailed {
                seq: s,
                rank: 0,
                reason,
                ..
            })) if s == seq => assert!(reason.starts_with("invalid argument"), "{reason}"),
            other => panic!("pair {k}: rank 1 got {other:?}"),
        }
    }
    let send_self = c[0]
        .send(f32s(1, 1.0), 0, 0)
        .wait_timeout(Duration::from_millis(100));
    assert!(matches!(send_self, Some(Err(Error::InvalidArgument(_)))));
    // The group is healthy: the next collective works on both ranks.
    let works: Vec<_> = c
        .iter()
        .map(|c| c.all_reduce(f32s(2, 1.0), ReduceOp::Sum))
        .collect();
    for r in wait_all(works, 30) {
        assert_eq!(
            r.ok().and_then(|t| t.to_vec::<f32>().ok()),
            Some(vec![2.0, 2.0])
        );
    }
}

/// Group creation with arguments that cannot work fails on the rank that passed them, and
/// the rank that passed good ones hears at once; the parent group goes on.
#[test]
fn bad_group_arguments_fail_at_once_everywhere() {
    let w = world(2);
    let c = w.communicators();
    // Rank 1's good call is made first; rank 0's bad one fails at once; rank 1 hears.
    let check = |bad: collectix::Result<()>, good: Option<collectix::Result<()>>| {
        assert!(matches!(bad, Err(Error::InvalidArgument(_))), "{bad:?}");
        assert!(
            matches!(good, Some(Err(Error::CallFailed { rank: 0, .. }))),
            "{good:?}"
        );
    };
    let five = Duration::from_secs(5);
    let good = c[1].new_group(&[0, 1]);
    let bad = c[0].new_group(&[0, 0]).wait().map(|_| ());
    check(bad, good.wait_timeout(five).map(|r| r.map(|_| ())));
    let good = c[1].new_subgroups(1);
    let bad = c[0].new_subgroups(3).wait().map(|_| ());
    check(bad, good.wait_timeout(five).map(|r| r.map(|_| ())));
    let works: Vec<_> = c.iter().map(|c| c.barrier()).collect();
    for r in wait_all(works, 30) {
        assert_eq!(r, Ok(()));
    }
}

/// A waker that panics (a broken executor) is called on the rank's thread when the call
/// completes: the panic does not unwind through the rank; the call reports it as
/// `Error::Panic`, and the rank goes on serving calls.
#[test]
fn a_panicking_waker_fails_its_call_not_the_rank() {
    use std::future::Future;
    use std::task::Context;

    let w = world(2);
    let c = w.communicators();
    let mut work = c[0].barrier();
    let waker = common::panicking_waker();
    let mut cx = Context::from_waker(&waker);
    assert!(Future::poll(std::pin::Pin::new(&mut work), &mut cx).is_pending());
    // Rank 1 joins: rank 0's barrier completes, and its thread wakes the panicking waker.
    assert_eq!(c[1].barrier().wait(), Ok(()));
    let got = work.wait_timeout(Duration::from_secs(30));
    assert!(
        matches!(&got, Some(Err(Error::Panic(m))) if m.contains("waker") && m.contains("my executor is broken")),
        "{got:?}"
    );
    // The rank carries on.
    let works: Vec<_> = c.iter().map(|c| c.barrier()).collect();
    for r in wait_all(works, 30) {
        assert_eq!(r, Ok(()));
    }
}
