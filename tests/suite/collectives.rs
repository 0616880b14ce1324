//! Actor-level tests: every collective × algorithm on worlds of 1, 3, 4 and 8 in-process ranks,
//! a few counts, and each dtype × op once, compared with the shared reference.

use crate::common;
use collectix::runtime::testing::{reduces, rooted, Case, COLLECTIVES};
use collectix::{CallOptions, DType, GroupOptions, OpKind, ReduceOp, World};
use common::wait_all;

fn run_cases(w: usize, cases: &[Case]) {
    let world = World::local_with(
        w,
        GroupOptions {
            segment_bytes: 256,
            ..GroupOptions::default()
        },
    )
    .unwrap_or_else(|e| panic!("{e}"));
    // Issue every case on every rank before waiting on any: many calls in flight at once.
    let mut works = Vec::new();
    for case in cases {
        let opts = CallOptions {
            algorithm: case.algorithm,
            timeout: None,
        };
        for (r, c) in world.communicators().iter().enumerate() {
            works.push((case, r, c.submit(case.request(r), &opts)));
        }
    }
    for (case, r, work) in works {
        let got = work
            .wait()
            .unwrap_or_else(|e| panic!("{case:?} rank {r}: {e}"));
        assert_eq!(got, case.expected(r), "{case:?} rank {r}");
    }
}

#[test]
fn every_collective_and_algorithm_on_1_3_4_8_ranks() {
    for w in [1, 3, 4, 8] {
        let mut cases = Vec::new();
        for kind in COLLECTIVES {
            for &alg in kind.algorithms() {
                for count in [0, 5, 1000] {
                    let root = if rooted(kind) { (count + 1) % w } else { 0 };
                    let op = if reduces(kind) && count == 5 {
                        ReduceOp::Max
                    } else {
                        ReduceOp::Sum
                    };
                    cases.push(Case {
                        kind,
                        size: w,
                        count,
                        dtype: DType::F32,
                        op,
                        root,
                        algorithm: Some(alg),
                    });
                }
            }
        }
        run_cases(w, &cases);
    }
}

#[test]
fn each_dtype_and_op_once() {
    let mut cases = Vec::new();
    for dtype in DType::ALL {
        for op in ReduceOp::ALL {
            if op.check(dtype).is_ok() {
                cases.push(Case {
                    kind: OpKind::AllReduce,
                    size: 3,
                    count: 17,
                    dtype,
                    op,
                    root: 0,
                    algorithm: None,
                });
            }
        }
    }
    assert!(cases.len() > 40);
    run_cases(3, &cases);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn works_inside_a_tokio_runtime() {
    let world = World::local(4).unwrap_or_else(|e| panic!("{e}"));
    let comms = world.communicators().to_vec();
    let mut tasks = Vec::new();
    for c in comms {
        tasks.push(tokio::spawn(async move {
            let t = collectix::Tensor::from_vec(vec![c.rank() as i64; 3]);
            c.all_reduce(t, ReduceOp::Sum).await
        }));
    }
    for t in tasks {
        let r = t
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.to_vec::<i64>().ok(), Some(vec![6, 6, 6]));
    }
    // Dropping a world inside the runtime joins its threads without blocking forever.
    tokio::task::spawn_blocking(move || drop(world))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn results_are_identical_on_every_rank_and_call_order_defines_the_collective() {
    let world = World::local(5).unwrap_or_else(|e| panic!("{e}"));
    let cs = world.communicators();
    // Each rank issues a broadcast then an all_reduce; their Works are awaited in reverse.
    let mut b = Vec::new();
    let mut a = Vec::new();
    for c in cs {
        b.push(c.broadcast(
            collectix::Tensor::from_vec(vec![c.rank() as f64 * 1.5; 4]),
            2,
        ));
        a.push(c.all_reduce(
            collectix::Tensor::from_vec(vec![0.1f64 * c.rank() as f64; 1000]),
            ReduceOp::Sum,
        ));
    }
    let a = wait_all(a, 30);
    let b = wait_all(b, 30);
    let first = a[0]
        .as_ref()
        .map(|t| t.bytes().clone())
        .unwrap_or_else(|e| panic!("{e}"));
    for r in a
        .iter()
        .chain(b.iter())
        .map(|r| r.as_ref().unwrap_or_else(|e| panic!("{e}")))
    {
        let _ = r;
    }
    for r in &a {
        assert_eq!(
            r.as_ref().map(|t| t.bytes().clone()).ok(),
            Some(first.clone()),
            "bit-identical on every rank"
        );
    }
    for r in &b {
        assert_eq!(
            r.as_ref().ok().and_then(|t| t.to_vec::<f64>().ok()),
            Some(vec![3.0; 4])
        );
    }
}

#[test]
fn a_root_far_ahead_of_its_peers_is_throttled_and_everything_arrives() {
    // A window of 2 calls; rank 0 issues 200 broadcasts before the others make any.
    let opts = GroupOptions {
        window: 2,
        ..GroupOptions::default()
    };
    let world = World::local_with(3, opts).unwrap_or_else(|e| panic!("{e}"));
    let cs = world.communicators();
    let n = 200;
    let roots: Vec<_> = (0..n)
        .map(|k| cs[0].broadcast(collectix::Tensor::from_vec(vec![k as i64, -k as i64]), 0))
        .collect();
    std::thread::sleep(std::time::Duration::from_millis(20));
    let mut others = Vec::new();
    for c in &cs[1..] {
        others.push(
            (0..n)
                .map(|_| c.broadcast(collectix::Tensor::from_vec(vec![0i64; 2]), 0))
                .collect::<Vec<_>>(),
        );
    }
    for r in wait_all(roots, 60) {
        assert!(r.is_ok());
    }
    for works in others {
        for (k, r) in wait_all(works, 60).into_iter().enumerate() {
            assert_eq!(
                r.ok().and_then(|t| t.to_vec::<i64>().ok()),
                Some(vec![k as i64, -(k as i64)])
            );
        }
    }
}

/// The list-form all_gather lets ranks contribute blocks of different sizes. The default
/// algorithm must be chosen from what every rank agrees on (the output list), not from the
/// rank's own block: blocks of 16 B, 1 KiB and 128 KiB straddle the table's thresholds (and
/// the 64 KiB one of the table before it), so ranks choosing by their own input picked
/// different algorithms and the call failed with a mismatch.
#[test]
fn an_all_gather_whose_blocks_straddle_a_selection_threshold_completes() {
    let world = World::local(3).unwrap_or_else(|e| panic!("{e}"));
    let sizes = [4usize, 256, 32 << 10]; // f32 elements: 16 B, 1 KiB, 128 KiB
    let specs: Vec<collectix::TensorSpec> = sizes
        .iter()
        .map(|&n| collectix::TensorSpec::new(&[n], DType::F32))
        .collect();
    let works: Vec<_> = world
        .communicators()
        .iter()
        .map(|c| {
            let r = c.rank();
            let t = collectix::Tensor::from_vec(vec![r as f32; sizes[r]]);
            c.all_gather(specs.clone(), t)
        })
        .collect();
    for (r, w) in works.into_iter().enumerate() {
        let got = w.wait().unwrap_or_else(|e| panic!("rank {r}: {e}"));
        for (k, t) in got.iter().enumerate() {
            assert_eq!(
                t.to_vec::<f32>().ok(),
                Some(vec![k as f32; sizes[k]]),
                "rank {r}, block {k}"
            );
        }
    }
}
