//! Many ranks in one process on a few threads: a world of more ranks than threads
//! ([`World::builder`]`.threads(t)`) runs blocking bodies (a thread each, `World::run`) and
//! async bodies (tasks on the ranks' threads, `World::spawn`) to exact results, all at once,
//! skewed and in batches; a body that panics or fails is its rank's failure and the policy
//! applies; a mismatch is a typed error on every rank; blocking on a rank's thread is refused.
//!
//! The time bounds are hang guards: the groups' timeout is 30 s.

use collectix::{
    Communicator, DType, Error, GroupOptions, Policy, ReduceOp, Request, Tensor, TensorSpec, World,
};
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(30);

fn world(n: usize, threads: usize) -> World {
    World::builder(n)
        .threads(threads)
        .options(GroupOptions::default().with_timeout(TIMEOUT))
        .start()
        .unwrap_or_else(|e| panic!("{e}"))
}

/// What rank `r` of `w` checks after a few collectives, awaited one after another.
async fn a_few_calls(c: Communicator) -> collectix::Result<Vec<i64>> {
    let (r, w) = (c.rank() as i64, c.size() as i64);
    let sum = c
        .all_reduce(Tensor::from_vec(vec![r, 1]), ReduceOp::Sum)
        .await?
        .to_vec::<i64>()?;
    c.barrier().await?;
    let b = c
        .broadcast(Tensor::from_vec(vec![r * 10]), (w - 1) as usize)
        .await?
        .to_vec::<i64>()?;
    // A ring of sends: every rank to the next, from the previous.
    let next = ((r + 1) % w) as usize;
    let prev = ((r + w - 1) % w) as usize;
    let sent = c.send(Tensor::from_vec(vec![r]), next, 7);
    let got = c.recv(TensorSpec::new(&[1], DType::I64), Some(prev), 7);
    sent.await?;
    let (t, from) = got.await?;
    assert_eq!(from, prev);
    let mut out = sum;
    out.extend(b);
    out.extend(t.to_vec::<i64>()?);
    Ok(out)
}

fn expected(r: usize, w: usize) -> Vec<i64> {
    let w64 = w as i64;
    vec![
        w64 * (w64 - 1) / 2,
        w64,
        (w64 - 1) * 10,
        ((r + w - 1) % w) as i64,
    ]
}

#[test]
fn async_bodies_of_many_ranks_on_two_threads_get_exact_results() {
    let w = 256;
    let world = world(w, 2);
    let results = world.spawn(Policy::Stop, a_few_calls);
    for (r, got) in results.into_iter().enumerate() {
        assert_eq!(got, Ok(expected(r, w)), "rank {r}");
    }
    world.shutdown().unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn async_bodies_skewed_and_in_batches_complete() {
    let w = 64;
    let world = world(w, 3);
    let results = world.spawn(Policy::Stop, |c| async move {
        // Skewed: rank r lets the others run r times before it starts.
        for _ in 0..c.rank() {
            Yield(false).await;
        }
        // In a batch: several calls issued before any is awaited.
        let works: Vec<_> = (0..8i64)
            .map(|k| c.all_reduce(Tensor::from_vec(vec![k]), ReduceOp::Sum))
            .collect();
        let mut sums = Vec::new();
        for wk in works {
            sums.push(wk.await?.to_vec::<i64>()?[0]);
        }
        Ok(sums)
    });
    let want: Vec<i64> = (0..8).map(|k| k * w as i64).collect();
    for (r, got) in results.into_iter().enumerate() {
        assert_eq!(got, Ok(want.clone()), "rank {r}");
    }
    world.shutdown().unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn blocking_bodies_of_more_ranks_than_threads_get_exact_results() {
    let w = 48;
    let world = world(w, 2);
    let results = world.run(Policy::Stop, |c| {
        let mut out = Vec::new();
        for k in 0..5i64 {
            let t = c
                .all_reduce(Tensor::from_vec(vec![k, c.rank() as i64]), ReduceOp::Max)
                .wait()?;
            out.extend(t.to_vec::<i64>()?);
        }
        Ok(out)
    });
    let want: Vec<i64> = (0..5).flat_map(|k| [k, w as i64 - 1]).collect();
    for (r, got) in results.into_iter().enumerate() {
        assert_eq!(got, Ok(want.clone()), "rank {r}");
    }
    world.shutdown().unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn a_panic_in_an_async_body_is_that_ranks_failure_and_the_others_shrink() {
    let w = 32;
    let world = world(w, 2);
    let results = world.spawn(Policy::Shrink, |c| async move {
        if c.rank() == 5 {
            panic!("rank 5 gives up");
        }
        let mut c = c;
        loop {
            match c
                .all_reduce(Tensor::from_vec(vec![1i64]), ReduceOp::Sum)
                .await
            {
                Ok(t) if c.size() == 31 => return t.to_vec::<i64>(),
                Ok(_) => Yield(false).await,
                Err(_) => c = c.shrink().await?.communicator,
            }
        }
    });
    for (r, got) in results.into_iter().enumerate() {
        if r == 5 {
            assert!(
                matches!(&got, Err(Error::Panic(m)) if m.contains("rank 5 gives up")),
                "{got:?}"
            );
        } else {
            assert_eq!(got, Ok(vec![31]), "rank {r}");
        }
    }
    world.shutdown().unwrap_or_default();
}

#[test]
fn an_async_body_that_fails_is_restarted_as_a_new_incarnation() {
    let w = 16;
    let world = world(w, 2);
    let results = world.spawn(Policy::Restart(1), |c| async move {
        if c.incarnation() == 0 && c.rank() == 3 {
            return Err(Error::invalid("rank 3 fails once"));
        }
        if c.incarnation() > 0 {
            let back = c.rejoin(TIMEOUT).await?;
            return Ok((back.communicator.size(), c.incarnation()));
        }
        // The others hear of the loss and regrow with the new incarnation.
        let mut c = c;
        loop {
            match c
                .all_reduce(Tensor::from_vec(vec![1i64]), ReduceOp::Sum)
                .await
            {
                Ok(_) => Yield(false).await,
                Err(_) => {
                    c = c.regrow(TIMEOUT).await?.communicator;
                    return Ok((c.size(), c.incarnation()));
                }
            }
        }
    });
    for (r, got) in results.into_iter().enumerate() {
        let want = (w, u32::from(r == 3));
        assert_eq!(got, Ok(want), "rank {r}");
    }
    world.shutdown().unwrap_or_default();
}

#[test]
fn a_mismatch_among_many_async_ranks_is_a_typed_error_on_every_rank() {
    let w = 128;
    let world = world(w, 2);
    let results = world.spawn(Policy::Stop, |c| async move {
        // Rank 77 reduces two elements, the others one.
        let n = if c.rank() == 77 { 2 } else { 1 };
        let got = c
            .all_reduce(Tensor::from_vec(vec![1.0f32; n]), ReduceOp::Sum)
            .await;
        Ok(got.err())
    });
    // Rank 0 (the reduction's root) sees the mismatch; the others hear of it as their
    // group's abort, with its cause.
    for (r, got) in results.into_iter().enumerate() {
        let cause = match &got {
            Ok(Some(Error::GroupAborted { cause, .. })) => Some(cause.as_ref()),
            Ok(Some(e)) => Some(e),
            _ => None,
        };
        assert!(
            matches!(cause, Some(Error::Mismatch { theirs, .. }) if theirs.rank == 77),
            "rank {r}: {got:?}"
        );
    }
    world.shutdown().unwrap_or_default();
}

#[test]
fn blocking_on_a_ranks_thread_is_refused_not_a_deadlock() {
    // One thread: the bodies run one after another, so only the last rank's call can have
    // finished when it is waited for (with two threads, two ranks can finish theirs at once).
    let world = world(8, 1);
    let results = world.spawn(Policy::Stop, |c| async move {
        let refused = c.barrier().wait();
        // The call itself still runs: awaited it completes on every rank.
        let again = c.barrier().await;
        Ok((refused, again))
    });
    let mut refusals = 0;
    for got in results {
        let (refused, again) = got.unwrap_or_else(|e| panic!("{e}"));
        // Refused, unless the call had finished when it was asked (the last rank's).
        match refused {
            Err(Error::WouldDeadlock) => refusals += 1,
            other => assert_eq!(other, Ok(())),
        }
        assert_eq!(again, Ok(()));
    }
    assert!(refusals >= 7, "{refusals} of 8 refused");
    world.shutdown().unwrap_or_default();
}

#[test]
fn running_bodies_from_a_ranks_own_thread_is_refused_not_a_deadlock() {
    let world = std::sync::Arc::new(world(6, 2));
    let inner = world.clone();
    let results = world.spawn(Policy::Stop, move |c| {
        let inner = inner.clone();
        async move {
            if c.rank() != 0 {
                return Ok(None);
            }
            // On rank 0's thread, which ranks 2 and 4 share: neither may block it.
            let spawned = inner.spawn(Policy::Stop, |_| async { Ok(()) });
            let ran = inner.run(Policy::Stop, |_| Ok(()));
            Ok(Some((spawned, ran)))
        }
    });
    let Ok(Some((spawned, ran))) = &results[0] else {
        panic!("{:?}", results[0]);
    };
    assert!(spawned.iter().all(|r| r == &Err(Error::WouldDeadlock)));
    assert!(ran.iter().all(|r| r == &Err(Error::WouldDeadlock)));
}

#[test]
fn a_submitted_request_is_awaited_like_a_call() {
    let world = world(5, 1);
    let results = world.spawn(Policy::Stop, |c| async move {
        let q = Request::AllReduce {
            tensor: Tensor::from_vec(vec![2.0f64]),
            op: ReduceOp::Product,
        };
        let out = c.submit(q, &Default::default()).await?;
        Ok(format!("{out:?}"))
    });
    let first = results[0].clone();
    assert!(first.as_ref().is_ok_and(|s| s.contains("32")), "{first:?}");
    assert!(results.iter().all(|r| r == &first));
    world.shutdown().unwrap_or_default();
}

/// Lets the other tasks of this thread run once (`Yield(false)`), as `tokio::task::yield_now`.
struct Yield(bool);

impl std::future::Future for Yield {
    type Output = ();
    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        if self.0 {
            return std::task::Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        std::task::Poll::Pending
    }
}
