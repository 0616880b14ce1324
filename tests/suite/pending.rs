//! No swallowed mismatch, at actor level: calls that complete early return `Ok`
//! even when their peers were in another call; the failure reaches each rank as its group's
//! pending error, returned by the next call that needs a peer, by `monitored_barrier`, by
//! `destroy`, or by `World::shutdown`.

use crate::common;

use collectix::{Error, GroupOptions, OpKind, ReduceOp, Tensor, World};
use common::{root, wait_all};
use std::time::{Duration, Instant};

fn world_with_grace(n: usize, grace: Duration) -> World {
    let opts = GroupOptions {
        desync_grace: grace,
        ..GroupOptions::default()
    };
    World::local_with(n, opts).unwrap_or_else(|e| panic!("{e}"))
}

fn names(e: &Error, m: usize) -> bool {
    matches!(e, Error::Mismatch { ours, theirs, .. } if ours.rank == m || theirs.rank == m)
}

/// Rank 0 broadcasts from 0 and its call completes (the root finishes early: `Ok`); then
/// rank 1 gathers to 0 and finds rank 0's broadcast data (a mismatch, which aborts the group),
/// then rank 2 broadcasts into the aborted group. Only rank 0 has not heard: the mismatch is
/// its pending error. (Each step waits for the one before, so this is deterministic; the
/// simulator's tests cover every interleaving of the three calls at once.)
fn early_finished_call(w: &World) {
    let c = w.communicators();
    let data = Tensor::from_vec(vec![1i32, 2, 3]);
    let t = Duration::from_secs(30);
    let a = c[0].broadcast(data.clone(), 0).wait_timeout(t);
    assert!(matches!(a, Some(Ok(_))), "the root finishes early: {a:?}");
    let b = c[1].gather(data.clone(), 0).wait_timeout(t);
    assert!(
        matches!(&b, Some(Err(e)) if names(e, 1)),
        "rank 1 finds the mismatch: {b:?}"
    );
    let d = c[2].broadcast(data, 0).wait_timeout(t);
    assert!(
        matches!(&d, Some(Err(e)) if names(root(e), 1)),
        "rank 2 calls into the aborted group: {d:?}"
    );
}

#[test]
fn a_monitored_barrier_after_an_early_finished_call_fails_on_every_rank() {
    let w = world_with_grace(3, Duration::from_millis(200));
    early_finished_call(&w);
    let c = w.communicators();
    let works: Vec<_> = c
        .iter()
        .map(|c| c.monitored_barrier(Duration::from_secs(5)))
        .collect();
    for (r, res) in wait_all(works, 30).into_iter().enumerate() {
        match res {
            Err(e) => assert!(names(root(&e), 1), "rank {r}: {e}"),
            Ok(()) => panic!("rank {r}: Ok from a call after a failure it should have heard of"),
        }
    }
    assert_eq!(
        w.shutdown(),
        Ok(()),
        "every rank heard: nothing left pending"
    );
}

#[test]
fn shutdown_returns_what_no_call_returned() {
    let w = world_with_grace(3, Duration::from_millis(200));
    early_finished_call(&w);
    // Nobody calls again: the world's shutdown is where rank 0's pending error comes out.
    let got = w.shutdown();
    assert!(
        matches!(&got, Err(Error::GroupAborted { cause, .. }) if names(cause, 1)),
        "{got:?}"
    );
}

#[test]
fn destroy_returns_the_pending_error_and_ends_the_group_here() {
    let w = world_with_grace(2, Duration::from_millis(200));
    let c = w.communicators();
    // The root broadcasts 3 elements, rank 1 expects 4: rank 1 fails, the root's call
    // completed.
    let a = c[0].broadcast(Tensor::from_vec(vec![1i32, 2, 3]), 0);
    let b = c[1].broadcast(Tensor::from_vec(vec![0i32; 4]), 0);
    assert!(b.wait().is_err_and(|e| names(root(&e), 1)));
    assert!(a.wait().is_ok());
    // Rank 1's abort left before its call failed, so rank 0 has it now.
    let got = c[0].destroy().wait();
    assert!(
        matches!(&got, Err(Error::GroupAborted { cause, .. }) if names(cause, 1)),
        "{got:?}"
    );
    let later = c[0].barrier().wait();
    assert!(matches!(later, Err(Error::InvalidArgument(_))), "{later:?}");
    assert_eq!(
        c[1].destroy().wait(),
        Ok(()),
        "rank 1 heard it from its call"
    );
    assert_eq!(w.shutdown(), Ok(()));
}

#[test]
fn a_monitored_barrier_names_the_rank_that_did_not_come_on_every_rank() {
    let grace = Duration::from_millis(200);
    let timeout = Duration::from_millis(300);
    let w = world_with_grace(4, grace);
    let c = w.communicators();
    let start = Instant::now();
    let works: Vec<_> = c[..3]
        .iter()
        .map(|c| c.monitored_barrier(timeout))
        .collect();
    let results = wait_all(works, 30);
    let elapsed = start.elapsed();
    let verdict = match &results[0] {
        Err(
            e @ Error::Timeout {
                op: OpKind::MonitoredBarrier,
                waiting_for,
                ..
            },
        ) if *waiting_for == vec![3] => e.clone(),
        other => panic!("rank 0: {other:?}"),
    };
    for (r, res) in results.iter().enumerate() {
        match res {
            Err(e) => assert_eq!(root(e), &verdict, "rank {r}: the same verdict"),
            Ok(()) => panic!("rank {r}: Ok"),
        }
    }
    // Rank 0's verdict: at the timeout, plus at most the grace (everyone answers at once
    // here), plus scheduling slack.
    assert!(
        elapsed < timeout + grace + Duration::from_secs(2),
        "{elapsed:?}"
    );
    // Rank 3 never called; the world's shutdown returns what it holds.
    let got = w.shutdown();
    assert!(matches!(&got, Err(e) if root(e) == &verdict), "{got:?}");
}

#[test]
fn a_monitored_barrier_everyone_reaches_succeeds_even_when_skewed() {
    let w = world_with_grace(3, Duration::from_millis(200));
    let c = w.communicators();
    let first: Vec<_> = c[..2]
        .iter()
        .map(|c| c.monitored_barrier(Duration::from_secs(10)))
        .collect();
    std::thread::sleep(Duration::from_millis(50));
    let mut works = first;
    works.push(c[2].monitored_barrier(Duration::from_secs(10)));
    for (r, res) in wait_all(works, 30).into_iter().enumerate() {
        assert_eq!(res, Ok(()), "rank {r}");
    }
    // And the group goes on.
    let sums: Vec<_> = c
        .iter()
        .map(|c| c.all_reduce(Tensor::from_vec(vec![1i64]), ReduceOp::Sum))
        .collect();
    for res in wait_all(sums, 30) {
        assert_eq!(res, Ok(Tensor::from_vec(vec![3i64])));
    }
    assert_eq!(w.shutdown(), Ok(()));
}
