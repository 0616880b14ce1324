//! The full matrix through the deterministic simulator (no threads): every collective ×
//! algorithm × group size {1,2,3,4,5,7,8} × count {0, 1, n−1, n, 1000, 65 539} × dtype × op,
//! messages delivered in seeded random order, results compared bit for bit with the
//! sequential reference on every rank.

use collectix_runtime::group::{CallOptions, GroupId, GroupOptions};
use collectix_runtime::testing::sim::Sim;
use collectix_runtime::testing::{reduces, rooted, Case, COLLECTIVES};
use collectix_runtime::OpKind;
use collectix_runtime::{DType, Output, ReduceOp};

const SIZES: [usize; 7] = [1, 2, 3, 4, 5, 7, 8];

/// Runs `case`; returns the number of "would block" refusals its links made.
fn run(case: &Case, seed: u64) -> Result<u64, String> {
    let opts = GroupOptions {
        segment_bytes: 4096,
        ..GroupOptions::default()
    };
    let mut sim = Sim::with_options(case.size, seed, opts);
    let call = CallOptions {
        algorithm: case.algorithm,
        timeout: None,
    };
    let mut ids = Vec::new();
    for r in 0..case.size {
        let id = sim
            .submit(r, GroupId::WORLD, case.request(r), &call)
            .map_err(|e| format!("{case:?}: rank {r}: {e}"))?;
        ids.push(id);
    }
    sim.run_no_timeouts(10_000_000)
        .map_err(|e| format!("{case:?} seed {seed}: {e:?}\n{}", sim.trace_text()))?;
    for (r, id) in ids.into_iter().enumerate() {
        let got = sim
            .take(r, id)
            .ok_or_else(|| format!("{case:?}: rank {r} has no result"))?;
        let got = got.map_err(|e| format!("{case:?} seed {seed}: rank {r} failed: {e}"))?;
        let want = case.expected(r);
        if got != want {
            return Err(format!(
                "{case:?} seed {seed}: rank {r} got {got:?}, want {want:?}"
            ));
        }
    }
    // Every message went through the wire codec (the seams carry real traffic).
    let stats = sim.link_stats();
    if case.size > 1 && stats.frames == 0 {
        return Err(format!("{case:?}: no frame went through the codec"));
    }
    Ok(stats.would_block)
}

fn ops_for(kind: OpKind, dtype: DType) -> Vec<ReduceOp> {
    if !reduces(kind) {
        return vec![ReduceOp::Sum];
    }
    ReduceOp::ALL
        .into_iter()
        .filter(|op| op.check(dtype).is_ok())
        .collect()
}

/// Runs every case of the sweep whose place in it is `part` modulo `parts` (the parts of a
/// long sweep are tests of their own, which the harness runs side by side), each with the
/// seed it has in the whole sweep; returns the cases run.
fn sweep(
    kinds: &[OpKind],
    counts_of: impl Fn(usize) -> Vec<usize>,
    dtypes: &[DType],
    (part, parts): (usize, usize),
) -> usize {
    let mut n = 0;
    let mut place = 0usize;
    let mut refused = 0;
    let mut seed = 1u64;
    for &kind in kinds {
        for &alg in kind.algorithms() {
            for w in SIZES {
                for count in counts_of(w) {
                    for &dtype in dtypes {
                        for op in ops_for(kind, dtype) {
                            let root = if rooted(kind) { (count + w / 2) % w } else { 0 };
                            let case = Case {
                                kind,
                                size: w,
                                count,
                                dtype,
                                op,
                                root,
                                algorithm: Some(alg),
                            };
                            seed = seed
                                .wrapping_mul(6364136223846793005)
                                .wrapping_add(1442695040888963407);
                            place += 1;
                            if place % parts != part {
                                continue;
                            }
                            match run(&case, seed) {
                                Ok(r) => refused += r,
                                Err(e) => panic!("{e}"),
                            }
                            n += 1;
                        }
                    }
                }
            }
        }
    }
    assert!(refused > 0, "no link ever said \"would block\"");
    n
}

#[test]
fn matrix_small_counts_every_dtype_and_op() {
    let n = sweep(
        &COLLECTIVES,
        |w| vec![0, 1, w - 1, w, 1000],
        &DType::ALL,
        (0, 1),
    );
    assert!(n > 5000, "{n} cases");
}

/// The dtypes of the large-count sweeps: all 13 where `COLLECTIX_LONG_TESTS=1` (as `.ci/run`
/// sets it), else one of each element width and kind (half, float, double, byte, integer,
/// bool), which keeps the default `cargo test --workspace` within its 10 minutes
/// (`docs/testing.md`, "The default run and the long one"). Every dtype still runs at the
/// small counts.
fn large_count_dtypes() -> Vec<DType> {
    if std::env::var_os("COLLECTIX_LONG_TESTS").is_some_and(|v| v == "1") {
        DType::ALL.to_vec()
    } else {
        vec![
            DType::BF16,
            DType::F32,
            DType::F64,
            DType::U8,
            DType::I32,
            DType::Bool,
        ]
    }
}

#[test]
fn matrix_large_count_every_dtype_and_op_part1() {
    let dtypes = large_count_dtypes();
    let n = sweep(&COLLECTIVES, |_| vec![65_539], &dtypes, (0, 2));
    assert!(n > 40 * dtypes.len(), "{n} cases");
}

#[test]
fn matrix_large_count_every_dtype_and_op_part2() {
    let dtypes = large_count_dtypes();
    let n = sweep(&COLLECTIVES, |_| vec![65_539], &dtypes, (1, 2));
    assert!(n > 40 * dtypes.len(), "{n} cases");
}

#[test]
fn results_do_not_depend_on_the_seed() {
    for seed in 0..20 {
        let case = Case {
            kind: OpKind::AllReduce,
            size: 7,
            count: 100,
            dtype: DType::F32,
            op: ReduceOp::Sum,
            root: 0,
            algorithm: None,
        };
        assert!(run(&case, seed).is_ok());
    }
}

#[test]
fn several_calls_in_flight_on_one_group() {
    // Every rank submits three all_reduces and a broadcast before any message moves.
    for seed in 0..10 {
        let w = 5;
        let mut sim = Sim::new(w, seed);
        let cases: Vec<Case> = [
            (OpKind::AllReduce, 10),
            (OpKind::Broadcast, 3),
            (OpKind::AllReduce, 2000),
            (OpKind::AllGather, 4),
        ]
        .into_iter()
        .map(|(kind, count)| Case {
            kind,
            size: w,
            count,
            dtype: DType::I32,
            op: ReduceOp::Sum,
            root: 2,
            algorithm: None,
        })
        .collect();
        let mut ids = vec![];
        for r in 0..w {
            for c in &cases {
                ids.push((
                    r,
                    c,
                    sim.submit(r, GroupId::WORLD, c.request(r), &CallOptions::default())
                        .unwrap_or_else(|e| panic!("{e}")),
                ));
            }
        }
        sim.run_no_timeouts(1_000_000)
            .unwrap_or_else(|e| panic!("{e:?}"));
        for (r, c, id) in ids {
            let got = sim.take(r, id).and_then(Result::ok);
            assert_eq!(got, Some(c.expected(r)), "seed {seed} rank {r} {c:?}");
        }
    }
}

#[test]
fn barrier_output_is_none() {
    let mut sim = Sim::new(3, 9);
    let ids: Vec<_> = (0..3)
        .map(|r| {
            sim.submit(
                r,
                GroupId::WORLD,
                collectix_runtime::Request::Barrier,
                &CallOptions::default(),
            )
        })
        .collect();
    assert_eq!(sim.run_no_timeouts(1000), Ok(()));
    for (r, id) in ids.into_iter().enumerate() {
        let id = id.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(sim.take(r, id), Some(Ok(Output::None)));
    }
}
