//! The hot path's hand-offs, driven as users drive ranks (docs/architecture.md, "The hot
//! path"): callers that park before their peers come, several threads of one rank parked at
//! once, calls awaited from one tokio task, and long calls whose callers parked. Every call must complete with the right value;
//! no timing is asserted.

use collectix::{DType, ReduceOp, Tensor, TensorSpec, World};
use std::time::Duration;

/// Two threads of rank 0 wait on two receives; rank 1 sends long after both parked, the
/// second tag first. Both are woken with their own message, whichever parked caller ran the
/// rank.
#[test]
fn two_callers_of_one_rank_parked_on_different_calls_both_get_their_results() {
    let world = World::local(2).unwrap_or_else(|e| panic!("{e}"));
    let c = world.communicators();
    let (tx, rx) = std::sync::mpsc::channel();
    for tag in [1u32, 2] {
        let (c0, tx) = (c[0].clone(), tx.clone());
        std::thread::spawn(move || {
            let got = c0
                .recv(TensorSpec::new(&[1], DType::I64), Some(1), tag)
                .wait()
                .and_then(|(t, src)| Ok((src, t.to_vec::<i64>()?)));
            let _ = tx.send((tag, got));
        });
    }
    std::thread::sleep(Duration::from_millis(100));
    for tag in [2u32, 1] {
        c[1].send(Tensor::from_vec(vec![i64::from(tag) * 10]), 0, tag)
            .wait()
            .unwrap_or_else(|e| panic!("{e}"));
    }
    for _ in 0..2 {
        // A parked caller left asleep is a failure here, not a hang of the suite.
        let (tag, got) = rx
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("a parked caller was never woken"));
        assert_eq!(got.ok(), Some((1, vec![i64::from(tag) * 10])), "tag {tag}");
    }
}

/// Each rank on its own thread, one rank late by much more than the spin budget, and long
/// all_reduces (many segments) back to back: the callers that parked drive their ranks again
/// when the late rank's segments come. Results exact on every rank and call.
#[test]
fn long_calls_whose_callers_parked_complete_exactly() {
    let w = 3;
    let world = World::local(w).unwrap_or_else(|e| panic!("{e}"));
    let n = 3 << 20; // 12 MiB of f32: a dozen segments per block.
    std::thread::scope(|s| {
        for (r, c) in world.communicators().iter().enumerate() {
            s.spawn(move || {
                for k in 0..4u32 {
                    if r == (k as usize) % w {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    let t = Tensor::from_vec(vec![(r + 1) as f32; n]);
                    let got = c
                        .all_reduce(t, ReduceOp::Sum)
                        .wait()
                        .unwrap_or_else(|e| panic!("rank {r} call {k}: {e}"));
                    let v = got.to_vec::<f32>().unwrap_or_default();
                    assert_eq!(v.len(), n);
                    assert!(v.iter().all(|&x| x == 6.0), "rank {r} call {k}");
                }
            });
        }
    });
}

/// Every rank's calls awaited together from one task of a current-thread runtime: a first
/// poll drives its rank only for the spin budget, the others' progress comes from their
/// actors, and every result arrives.
#[test]
fn calls_of_every_rank_awaited_from_one_task_complete() {
    let world = World::local(4).unwrap_or_else(|e| panic!("{e}"));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let results = rt.block_on(async {
        let mut out = Vec::new();
        for round in 0..20i64 {
            let works: Vec<_> = world
                .communicators()
                .iter()
                .map(|c| {
                    c.all_reduce(
                        Tensor::from_vec(vec![c.rank() as i64 + round]),
                        ReduceOp::Sum,
                    )
                })
                .collect();
            for wk in works {
                out.push((round, wk.await.unwrap_or_else(|e| panic!("{e}"))));
            }
        }
        out
    });
    for (round, t) in results {
        assert_eq!(t.to_vec::<i64>().unwrap_or_default(), vec![6 + 4 * round]);
    }
}
