//! Seeded runs: the same seed gives the same steps, results and error texts every time, and
//! other seeds other interleavings; timeouts fire in virtual time; the script's faults (a
//! kill at a rank's i-th call, a cut, a delayed link, a straggler, a stopped rank) end as
//! they would in a world, deterministically; a seed search finds an ordering bug that only
//! some interleavings show, and its seed replays it.
//!
//! Wall-time bounds below are hang guards (a run that waited out its 30 s timeout in real
//! time would take 30 s).

use collectix::{
    Communicator, DType, Error, Fault, GroupOptions, ReduceOp, Run, Seeded, Step, Tensor,
    TensorSpec,
};
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_secs(30);

fn seeded(n: usize, seed: u64) -> Seeded {
    Seeded::new(n)
        .seed(seed)
        .options(GroupOptions::default().with_timeout(TIMEOUT))
}

/// A few collectives and a ring of sends: what every rank returns.
async fn program(c: Communicator) -> collectix::Result<Vec<i64>> {
    let (r, w) = (c.rank(), c.size());
    let mut out = c
        .all_reduce(Tensor::from_vec(vec![r as i64 + 1]), ReduceOp::Sum)
        .await?
        .to_vec::<i64>()?;
    c.barrier().await?;
    let sent = c.send(Tensor::from_vec(vec![r as i64]), (r + 1) % w, 3);
    let (t, _) = c
        .recv(TensorSpec::new(&[1], DType::I64), Some((r + w - 1) % w), 3)
        .await?;
    sent.await?;
    out.extend(t.to_vec::<i64>()?);
    let b = c.broadcast(Tensor::from_vec(vec![r as i64 * 7]), 2).await?;
    out.extend(b.to_vec::<i64>()?);
    Ok(out)
}

#[test]
fn the_same_seed_gives_the_same_trace_100_times_out_of_100() {
    let first = seeded(5, 42).run(program);
    for (r, got) in first.results.iter().enumerate() {
        assert_eq!(got, &Ok(vec![15, ((r + 4) % 5) as i64, 14]), "rank {r}");
    }
    assert!(first.trace.len() > 20, "{} steps", first.trace.len());
    for i in 0..99 {
        let again = seeded(5, 42).run(program);
        assert_eq!(again.trace, first.trace, "run {i} took other steps");
        assert_eq!(again.results, first.results);
    }
}

#[test]
fn other_seeds_take_other_interleavings_to_the_same_results() {
    let traces: Vec<Vec<Step>> = (0..20)
        .map(|seed| {
            let run = seeded(4, seed).run(program);
            for (r, got) in run.results.iter().enumerate() {
                assert_eq!(got, &Ok(vec![10, ((r + 3) % 4) as i64, 14]), "seed {seed}");
            }
            run.trace
        })
        .collect();
    let mut distinct = traces.clone();
    distinct.sort_by_key(|t| format!("{t:?}"));
    distinct.dedup();
    assert!(
        distinct.len() >= 15,
        "{} distinct traces of 20",
        distinct.len()
    );
}

#[test]
fn a_30_s_timeout_fires_in_virtual_time_with_the_same_error_text_each_time() {
    let body = |c: Communicator| async move {
        if c.rank() == 2 {
            // Never joins: the others time out.
            return Ok(());
        }
        c.all_reduce(Tensor::from_vec(vec![1.0f32]), ReduceOp::Sum)
            .await
            .map(|_| ())
    };
    let t0 = Instant::now();
    let run = seeded(3, 9).run(body);
    let wall = t0.elapsed();
    assert!(run.elapsed >= TIMEOUT, "virtual {:?}", run.elapsed);
    assert!(wall < Duration::from_secs(10), "took {wall:?} of wall time");
    let texts: Vec<String> = run.results.iter().map(|r| format!("{r:?}")).collect();
    assert!(
        matches!(&run.results[0], Err(Error::Timeout { .. })),
        "{:?}",
        run.results[0]
    );
    assert_eq!(run.results[2], Ok(()));
    let again = seeded(3, 9).run(body);
    let texts_again: Vec<String> = again.results.iter().map(|r| format!("{r:?}")).collect();
    assert_eq!(texts, texts_again);
}

#[test]
fn a_rank_killed_at_its_second_call_is_a_lost_peer_to_the_others() {
    let run = seeded(4, 3)
        .fault(Fault::Kill {
            rank: 1,
            at_call: 2,
        })
        .run(|c| async move {
            let mut done = 0;
            for _ in 0..3 {
                c.all_reduce(Tensor::from_vec(vec![1i64]), ReduceOp::Sum)
                    .await?;
                done += 1;
            }
            Ok(done)
        });
    assert_eq!(run.results[1], Err(Error::Shutdown));
    for r in [0, 2, 3] {
        let e = run.results[r].as_ref().err();
        let lost = |e: &Error| matches!(e, Error::PeerLost { rank: 1 });
        assert!(
            e.is_some_and(
                |e| lost(e) || matches!(e, Error::GroupAborted { cause, .. } if lost(cause))
            ),
            "rank {r}: {:?}",
            run.results[r]
        );
    }
    assert!(run.trace.contains(&Step::Fault(Fault::Kill {
        rank: 1,
        at_call: 2
    })));
}

#[test]
fn a_cut_link_fails_the_calls_that_need_it_on_both_ends() {
    // Both bodies are slow (2 s between steps): the link is cut between their barrier and
    // their all_reduce.
    let slow = |rank| Fault::Straggler {
        rank,
        by: Duration::from_secs(2),
    };
    let run = seeded(2, 5)
        .fault(Fault::Cut {
            a: 0,
            b: 1,
            at: Duration::from_secs(1),
        })
        .fault(slow(0))
        .fault(slow(1))
        .run(|c| async move {
            c.barrier().await?;
            c.all_reduce(Tensor::from_vec(vec![1i64]), ReduceOp::Sum)
                .await
                .map(|_| ())
        });
    for (r, got) in run.results.iter().enumerate() {
        let lost = |e: &Error| matches!(e, Error::PeerLost { rank } if *rank == 1 - r);
        assert!(
            got.as_ref().err().is_some_and(
                |e| lost(e) || matches!(e, Error::GroupAborted { cause, .. } if lost(cause))
            ),
            "rank {r}: {got:?}"
        );
    }
    assert!(run.trace.contains(&Step::Fault(Fault::Cut {
        a: 0,
        b: 1,
        at: Duration::from_secs(1)
    })));
}

#[test]
fn delayed_links_stragglers_and_a_short_stop_still_give_exact_results() {
    let run = seeded(4, 11)
        .fault(Fault::Delay {
            a: 0,
            b: 3,
            by: Duration::from_millis(200),
        })
        .fault(Fault::Straggler {
            rank: 2,
            by: Duration::from_millis(50),
        })
        .fault(Fault::Stop {
            rank: 1,
            at: Duration::ZERO,
            pause: Duration::from_secs(5),
        })
        .run(program);
    for (r, got) in run.results.iter().enumerate() {
        assert_eq!(got, &Ok(vec![10, ((r + 3) % 4) as i64, 14]), "rank {r}");
    }
    assert!(run.elapsed >= Duration::from_secs(5), "{:?}", run.elapsed);
}

#[test]
fn a_stop_longer_than_the_timeout_times_the_others_out() {
    let run = seeded(3, 2)
        .fault(Fault::Stop {
            rank: 0,
            at: Duration::ZERO,
            pause: Duration::from_secs(120),
        })
        .run(|c| async move {
            c.all_reduce(Tensor::from_vec(vec![1i64]), ReduceOp::Sum)
                .await
                .map(|_| ())
        });
    for r in [1, 2] {
        let got = &run.results[r];
        let timed_out = |e: &Error| matches!(e, Error::Timeout { .. });
        assert!(
            got.as_ref().err().is_some_and(|e| timed_out(e)
                || matches!(e, Error::GroupAborted { cause, .. } if timed_out(cause))),
            "rank {r}: {got:?}"
        );
    }
}

/// A planted ordering bug: each rank sends its value to every other and adds what it
/// receives in the order it arrives (`recv` from any source); float addition is not
/// associative, so ranks can end with different bits, but only in some interleavings.
async fn arrival_order_sum(c: Communicator) -> collectix::Result<Vec<f64>> {
    let (r, w) = (c.rank(), c.size());
    let values = [1e16, 1.0, -1e16, 1.0];
    let mine = values[r % values.len()];
    let sends: Vec<_> = (0..w)
        .filter(|&p| p != r)
        .map(|p| c.send(Tensor::from_vec(vec![mine]), p, 0))
        .collect();
    let mut sum = mine;
    for _ in 1..w {
        let (t, _) = c.recv(TensorSpec::new(&[1], DType::F64), None, 0).await?;
        sum += t.to_vec::<f64>()?[0];
    }
    for s in sends {
        s.await?;
    }
    Ok(vec![sum])
}

fn agree(run: &Run<Vec<f64>>) -> bool {
    let Some(Ok(first)) = run.results.first() else {
        return false;
    };
    run.results.iter().all(|r| r.as_ref().ok() == Some(first))
}

#[test]
fn a_seed_search_finds_an_ordering_bug_and_its_seed_replays_it() {
    let t0 = Instant::now();
    let found = seeded(4, 0)
        .search(0..1000, arrival_order_sum, agree)
        .unwrap_or_else(|| panic!("no seed of 1000 showed the bug"));
    assert!(
        t0.elapsed() < Duration::from_secs(120),
        "{:?}",
        t0.elapsed()
    );
    // Not every interleaving shows it: seed 0's may or may not, but some seed agrees.
    assert!(
        (0..200).any(|s| agree(&seeded(4, s).run(arrival_order_sum))),
        "every interleaving showed the bug"
    );
    let replay = seeded(4, found.seed).run(arrival_order_sum);
    assert!(!agree(&replay));
    assert_eq!(replay.trace, found.trace);
    assert_eq!(
        format!("{:?}", replay.results),
        format!("{:?}", found.results)
    );
}

#[test]
fn faults_drawn_by_the_seed_end_every_run_with_exact_results_or_typed_errors() {
    let mut kinds = std::collections::BTreeSet::new();
    let mut clean = 0;
    for seed in 0..200 {
        let run = seeded(4, seed).random_faults(2).run(program);
        assert_eq!(run.faults.len(), 2, "seed {seed}");
        for f in &run.faults {
            kinds.insert(
                format!("{f:?}")
                    .split_whitespace()
                    .next()
                    .map(str::to_string),
            );
        }
        let mut all_ok = true;
        for (r, got) in run.results.iter().enumerate() {
            match got {
                Ok(v) => assert_eq!(v, &vec![10, ((r + 3) % 4) as i64, 14], "seed {seed}"),
                Err(e) => {
                    all_ok = false;
                    assert!(
                        !matches!(e, Error::Internal(_) | Error::Panic(_)),
                        "seed {seed}, rank {r}: {e} (faults {:?})",
                        run.faults
                    );
                }
            }
        }
        clean += usize::from(all_ok);
        if seed % 50 == 0 {
            let again = seeded(4, seed).random_faults(2).run(program);
            assert_eq!(again.faults, run.faults);
            assert_eq!(again.trace, run.trace);
        }
    }
    // Every kind of fault was drawn, and some runs survived theirs.
    assert_eq!(kinds.len(), 5, "{kinds:?}");
    assert!(
        clean > 0 && clean < 200,
        "{clean} of 200 runs without an error"
    );
}
