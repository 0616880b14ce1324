//! Model group 3: failures end in an error on every rank that is still waiting, never in a
//! deadlock (loom would report one): a mismatch (all_reduce against broadcast), a timeout
//! (an explicit clock tick racing the messages) and a lost peer (a rank that stops and
//! whose peers are told, as a closed connection would tell them).

use super::{
    assert_failed, assert_output, case_plan, check, far_future, run_world, world, Results, Script,
};
use crate::error::Error;
use crate::group::GroupId;
use crate::op::{Algorithm, OpKind};
use crate::tensor::dtype::DType;
use crate::tensor::reduce::ReduceOp;
use crate::testing::Case;

/// A 1-element i32 case of `kind` over `size` ranks, rooted at 0, with `alg` forced.
fn case(kind: OpKind, size: usize, alg: Algorithm) -> Case {
    Case {
        kind,
        size,
        count: 1,
        dtype: DType::I32,
        op: ReduceOp::Sum,
        root: 0,
        algorithm: Some(alg),
    }
}

/// Checks the outcome of a mismatch: every rank failed, the root cause everywhere is a
/// [`Error::Mismatch`] naming the two kinds, at least one rank saw it itself (the
/// detecting rank), and the others failed with [`Error::GroupAborted`] carrying it.
fn assert_mismatch(res: &[Results], kinds: &[OpKind]) {
    let mut detected = 0;
    for (r, rr) in res.iter().enumerate() {
        let what = format!("rank {r} ({:?})", kinds[r]);
        assert_failed(&what, &rr[0], |e| match e {
            Error::Mismatch { ours, theirs, .. } => {
                ours.call.kind != theirs.call.kind
                    && kinds.contains(&ours.call.kind)
                    && kinds.contains(&theirs.call.kind)
            }
            _ => false,
        });
        match &rr[0] {
            Some(Err(Error::Mismatch { ours, .. })) => {
                assert_eq!(
                    ours.rank, r,
                    "{what}: the detecting rank describes its own call"
                );
                assert_eq!(
                    ours.call.kind, kinds[r],
                    "{what}: its own call is {:?}",
                    kinds[r]
                );
                detected += 1;
            }
            Some(Err(Error::GroupAborted { group, .. })) => {
                assert_eq!(
                    *group,
                    GroupId::WORLD,
                    "{what}: the world group was aborted"
                );
            }
            other => panic!("{what}: expected Mismatch or GroupAborted, got {other:?}"),
        }
    }
    assert!(detected >= 1, "no rank detected the mismatch: {res:?}");
}

/// 2 ranks: rank 0 calls all_reduce, rank 1 broadcast from rank 0.
#[test]
fn mismatch_2() {
    check("mismatch all_reduce vs broadcast (2 ranks)", || {
        let kinds = [OpKind::AllReduce, OpKind::Broadcast];
        let cases = [
            case(OpKind::AllReduce, 2, Algorithm::RecursiveDoubling),
            case(OpKind::Broadcast, 2, Algorithm::BinomialTree),
        ];
        let scripts = (0..2)
            .map(|r| {
                let info = world(2, r);
                let p = case_plan(&cases[r], &info);
                Script::new(r).group(info).call(GroupId::WORLD, 0, p)
            })
            .collect();
        let res = run_world(scripts, Vec::new());
        assert_mismatch(&res, &kinds);
    });
}

/// 3 ranks: ranks 0 and 1 call a ring all_reduce, rank 2 a broadcast from rank 0 (which
/// only receives, so it learns of the mismatch from rank 1's all_reduce message).
#[test]
fn mismatch_3() {
    check("mismatch all_reduce vs broadcast (3 ranks)", || {
        let kinds = [OpKind::AllReduce, OpKind::AllReduce, OpKind::Broadcast];
        let scripts = (0..3)
            .map(|r| {
                let info = world(3, r);
                let c = if r == 2 {
                    case(OpKind::Broadcast, 3, Algorithm::Direct)
                } else {
                    case(OpKind::AllReduce, 3, Algorithm::Ring)
                };
                let p = case_plan(&c, &info);
                Script::new(r).group(info).call(GroupId::WORLD, 0, p)
            })
            .collect();
        let res = run_world(scripts, Vec::new());
        assert_mismatch(&res, &kinds);
    });
}

/// 2 ranks run an all_reduce while the clock tells rank 0 its deadline passed, at a point
/// loom chooses. Either rank 0 finished first (the tick finds nothing due, and both ranks
/// have the right sum) or it timed out waiting for rank 1; then rank 1 has the sum (rank
/// 0's data had reached it) or fails with the abort rank 0 sent. Nobody hangs.
#[test]
fn timeout_tick_2() {
    check("timeout tick racing all_reduce (2 ranks)", || {
        let c = case(OpKind::AllReduce, 2, Algorithm::RecursiveDoubling);
        let scripts = (0..2)
            .map(|r| {
                let info = world(2, r);
                let p = case_plan(&c, &info);
                Script::new(r).group(info).call(GroupId::WORLD, 0, p)
            })
            .collect();
        let res = run_world(scripts, vec![(0, far_future())]);
        let want = c.expected(0);
        match &res[0][0] {
            Some(Ok(_)) => {
                assert_output("rank 0", &res[0][0], &want);
                assert_output("rank 1 (rank 0 finished)", &res[1][0], &c.expected(1));
            }
            Some(Err(Error::Timeout {
                rank, waiting_for, ..
            })) => {
                assert_eq!((*rank, waiting_for.as_slice()), (0, &[1usize][..]));
                match &res[1][0] {
                    Some(Ok(out)) => assert_eq!(out, &c.expected(1), "rank 1"),
                    other => assert_failed("rank 1 after rank 0 timed out", other, |e| {
                        matches!(e, Error::Timeout { rank: 0, .. })
                    }),
                }
            }
            other => panic!("rank 0: expected the sum or a timeout, got {other:?}"),
        }
    });
}

/// 3 ranks, rank 2 a straggler that never makes its call: ranks 0 and 1 run a ring
/// all_reduce, and the clock tells rank 0 (only) that its deadline passed. Rank 0 fails
/// with a timeout naming rank 2, the rank it was waiting for; rank 1 — never told of any
/// deadline — fails with the group abort rank 0 sent, whose root cause is that timeout.
#[test]
fn timeout_straggler_3() {
    check("timeout, straggler never calls (3 ranks)", || {
        let c = case(OpKind::AllReduce, 3, Algorithm::Ring);
        // One clock tick reaches rank 0, and rank 2 runs no call (its thread ends): the
        // desync report (an exchange of plain messages, tested by the engine tests and the
        // simulator) is off here, so the tick ends the call at once.
        let opts = crate::group::GroupOptions {
            desync_grace: std::time::Duration::ZERO,
            ..crate::group::GroupOptions::default()
        };
        let scripts = (0..3)
            .map(|r| {
                let info = super::world_with(3, r, opts.clone());
                if r == 2 {
                    Script::new(r).group(info)
                } else {
                    let p = case_plan(&c, &info);
                    Script::new(r).group(info).call(GroupId::WORLD, 0, p)
                }
            })
            .collect();
        let res = run_world(scripts, vec![(0, far_future())]);
        match &res[0][0] {
            Some(Err(Error::Timeout {
                rank: 0,
                waiting_for,
                seq: Some(0),
                op: OpKind::AllReduce,
                ..
            })) => assert_eq!(waiting_for, &vec![2], "rank 0 waits for rank 2"),
            other => panic!("rank 0: expected a timeout waiting for rank 2, got {other:?}"),
        }
        assert!(
            matches!(&res[1][0], Some(Err(Error::GroupAborted { .. }))),
            "rank 1: {:?}",
            res[1][0]
        );
        assert_failed("rank 1", &res[1][0], |e| {
            matches!(e, Error::Timeout { rank: 0, .. })
        });
    });
}

/// 3 ranks run a ring all_reduce; rank 2 handles `crash_after` messages and stops, and
/// its peers are told it is lost. Ranks 0 and 1 cannot finish (every step of the ring
/// needs rank 2), so both must fail — with `PeerLost` naming rank 2 where the rest of
/// their schedule talks to it, or with the group abort whose root cause names it — and
/// neither may hang.
fn peer_lost(crash_after: usize) {
    let c = case(OpKind::AllReduce, 3, Algorithm::Ring);
    let scripts = (0..3)
        .map(|r| {
            let info = world(3, r);
            let p = case_plan(&c, &info);
            let s = Script::new(r).group(info).call(GroupId::WORLD, 0, p);
            if r == 2 {
                s.crash_after(crash_after)
            } else {
                s
            }
        })
        .collect();
    let res = run_world(scripts, Vec::new());
    assert!(res[2][0].is_none(), "rank 2 crashed before finishing");
    for (r, rr) in res.iter().enumerate().take(2) {
        assert_failed(&format!("rank {r}"), &rr[0], |e| {
            matches!(e, Error::PeerLost { rank: 2 })
        });
        assert!(
            matches!(
                &rr[0],
                Some(Err(Error::PeerLost { .. } | Error::GroupAborted { .. }))
            ),
            "rank {r}: {:?}",
            rr[0]
        );
    }
    // Both ranks' schedules talk to rank 2 later (rank 0 receives from it, rank 1 sends to
    // it), so the first of them to hear of the loss fails with PeerLost itself.
    assert!(
        res.iter()
            .take(2)
            .any(|rr| matches!(&rr[0], Some(Err(Error::PeerLost { rank: 2 })))),
        "nobody saw PeerLost directly: {res:?}"
    );
}

/// [`peer_lost`], rank 2 stopping right after its first send.
#[test]
fn peer_lost_3() {
    check(
        "peer lost during ring all_reduce, at once (3 ranks)",
        || peer_lost(0),
    );
}

/// [`peer_lost`], rank 2 stopping after one step of the ring.
#[test]
fn peer_lost_after_a_step_3() {
    check(
        "peer lost during ring all_reduce, after a step (3 ranks)",
        || peer_lost(1),
    );
}

/// 3 ranks run a ring all_reduce while the clock tells rank 0 its deadline passed, at a
/// point loom chooses: rank 0 has the sum or a timeout; the others have the sum or fail
/// with the abort rank 0 sent; and if rank 0 finished, nobody failed.
#[test]
fn timeout_tick_3() {
    check("timeout tick racing ring all_reduce (3 ranks)", || {
        let c = case(OpKind::AllReduce, 3, Algorithm::Ring);
        let scripts = (0..3)
            .map(|r| {
                let info = world(3, r);
                let p = case_plan(&c, &info);
                Script::new(r).group(info).call(GroupId::WORLD, 0, p)
            })
            .collect();
        let res = run_world(scripts, vec![(0, far_future())]);
        let rank0_done = matches!(&res[0][0], Some(Ok(_)));
        for (r, rr) in res.iter().enumerate() {
            match &rr[0] {
                Some(Ok(_)) => assert_output(&format!("rank {r}"), &rr[0], &c.expected(r)),
                other => {
                    assert!(
                        !rank0_done,
                        "rank {r} failed though rank 0 finished: {other:?}"
                    );
                    assert_failed(&format!("rank {r}"), other, |e| {
                        matches!(e, Error::Timeout { rank: 0, .. })
                    });
                }
            }
        }
    });
}

/// 2 ranks make two calls: the first agrees (all_reduce), the second does not (rank 0
/// all_reduce, rank 1 broadcast from 0). The first completes with the right sum on both
/// ranks (its messages precede the second's on every link); the second fails on both.
#[test]
fn mismatch_on_second_call_2() {
    check("mismatch on the second of two calls (2 ranks)", || {
        let first = case(OpKind::AllReduce, 2, Algorithm::RecursiveDoubling);
        let second = [
            case(OpKind::AllReduce, 2, Algorithm::RecursiveDoubling),
            case(OpKind::Broadcast, 2, Algorithm::BinomialTree),
        ];
        let scripts = (0..2)
            .map(|r| {
                let info = world(2, r);
                let a = case_plan(&first, &info);
                let b = case_plan(&second[r], &info);
                Script::new(r)
                    .group(info)
                    .call(GroupId::WORLD, 0, a)
                    .call(GroupId::WORLD, 1, b)
            })
            .collect();
        let res = run_world(scripts, Vec::new());
        for (r, rr) in res.iter().enumerate() {
            assert_output(&format!("rank {r} call #0"), &rr[0], &first.expected(r));
            assert_failed(&format!("rank {r} call #1"), &rr[1], |e| {
                matches!(e, Error::Mismatch { seq: Some(1), .. })
            });
        }
    });
}

/// 3 ranks run a ring all_reduce; rank 1 revokes the group after handling `revoke_after`
/// inputs, and (a second failure) rank 2 crashes after `crash_after`, if given. Nobody
/// hangs; rank 1's own call fails with its revoke (or the loss); every other live rank has the sum (its
/// call completed before the revoke reached it) or fails with the revoke or the loss.
fn revoke(revoke_after: usize, crash_after: Option<usize>) {
    let c = case(OpKind::AllReduce, 3, Algorithm::Ring);
    let want: Vec<_> = (0..3).map(|r| c.expected(r)).collect();
    let scripts = (0..3)
        .map(|r| {
            let info = world(3, r);
            let p = case_plan(&c, &info);
            let s = Script::new(r).group(info).call(GroupId::WORLD, 0, p);
            match (r, crash_after) {
                (1, _) => s.revoke_after(revoke_after),
                (2, Some(k)) => s.crash_after(k),
                _ => s,
            }
        })
        .collect();
    let res = run_world(scripts, Vec::new());
    // Rank 1 fails with its own revoke, or with the loss if that reached it first.
    assert_failed("rank 1", &res[1][0], |e| match e {
        Error::Revoked { by: 1, .. } => true,
        Error::PeerLost { rank: 2 } => crash_after.is_some(),
        _ => false,
    });
    let live = if crash_after.is_some() { 1 } else { 2 };
    for r in [0, 2].into_iter().take(live) {
        if let Some(Ok(out)) = &res[r][0] {
            assert_eq!(out, &want[r], "rank {r}: wrong result");
            continue;
        }
        assert_failed(&format!("rank {r}"), &res[r][0], |e| {
            matches!(
                e,
                Error::Revoked { by: 1, .. } | Error::PeerLost { rank: 2 }
            )
        });
    }
}

/// [`revoke`], rank 1 revoking at once, and after one message.
#[test]
fn revoke_3() {
    for k in 0..2 {
        check(
            &format!("revoke during ring all_reduce after {k} inputs (3 ranks)"),
            move || revoke(k, None),
        );
    }
}

/// [`revoke`] with a second failure: rank 2 crashes at once, or after one message.
#[test]
fn revoke_with_a_crash_3() {
    for (k, j) in [(0, 0), (1, 0), (0, 1)] {
        check(
            &format!("revoke after {k} inputs, rank 2 crashed after {j} (3 ranks)"),
            move || revoke(k, Some(j)),
        );
    }
}
