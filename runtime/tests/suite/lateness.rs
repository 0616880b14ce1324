//! Who is late, in the seeded simulator: one rank of four makes each all_reduce 200 ms after
//! the others; the members' views (`Engine::lateness`) together name it in every call, late
//! by 200 ms, for every algorithm and seed, with nothing sent for it.

use collectix_runtime::group::{CallOptions, GroupId};
use collectix_runtime::lateness::LatenessSummary;
use collectix_runtime::testing::sim::Sim;
use collectix_runtime::testing::Case;
use collectix_runtime::{DType, OpKind, ReduceOp};
use std::time::Duration;

const LATE: Duration = Duration::from_millis(200);
const STEPS: u64 = 20;

#[test]
fn a_rank_that_makes_its_calls_200_ms_late_is_named_by_the_group_in_every_call() {
    let w = 4;
    let slow = 2;
    let opts = CallOptions {
        timeout: Some(Duration::from_secs(30)),
        ..Default::default()
    };
    for &alg in OpKind::AllReduce.algorithms() {
        for seed in 0..3 {
            let mut sim = Sim::new(w, seed);
            let case = Case {
                kind: OpKind::AllReduce,
                size: w,
                count: 64,
                dtype: DType::F32,
                op: ReduceOp::Sum,
                root: 0,
                algorithm: Some(alg),
            };
            for _ in 0..STEPS {
                let mut ops = Vec::new();
                for r in (0..w).filter(|&r| r != slow) {
                    let id = sim.submit(r, GroupId::WORLD, case.request(r), &opts);
                    ops.push((r, id.unwrap_or_else(|e| panic!("{e}"))));
                }
                sim.run_for(LATE);
                let id = sim.submit(slow, GroupId::WORLD, case.request(slow), &opts);
                ops.push((slow, id.unwrap_or_else(|e| panic!("{e}"))));
                if let Err(e) = sim.run(1_000_000) {
                    panic!("{alg:?} seed {seed}: {e:?}");
                }
                for (r, id) in ops {
                    assert!(
                        matches!(sim.result(r, id), Some(Ok(_))),
                        "{alg:?} seed {seed} rank {r}: {:?}",
                        sim.result(r, id)
                    );
                }
            }
            let views: Vec<LatenessSummary> = (0..w)
                .map(|r| {
                    sim.engine(r)
                        .and_then(|e| e.lateness(GroupId::WORLD))
                        .cloned()
                        .unwrap_or_default()
                })
                .collect();
            let all = LatenessSummary::combined(&views);
            let (m, rec) = all
                .most_often_last()
                .unwrap_or_else(|| panic!("{alg:?} seed {seed}: nobody named: {views:?}"));
            assert_eq!(m, slow, "{alg:?} seed {seed}: {views:?}");
            assert_eq!(rec.last, STEPS, "{alg:?} seed {seed}: {views:?}");
            let off = |d: Duration| (d.as_secs_f64() - LATE.as_secs_f64()).abs();
            assert!(
                off(rec.mean()) < 0.005 && off(rec.max) < 0.005,
                "{alg:?} seed {seed}: {rec:?}"
            );
            // Nobody else is counted late: the on-time members' offsets are the messages'
            // flight, below the floor.
            for (other, r) in all.members.iter().enumerate() {
                if other != slow {
                    assert_eq!(r.last, 0, "{alg:?} seed {seed} member {other}: {views:?}");
                }
            }
        }
    }
}
