//! Every algorithm, for every group size 1..=9 (and every root), pairs each send with exactly
//! one receive: same (source, destination, tag), same chunk sizes on both sides.

use collectix_runtime::group::{CallOptions, GroupInfo, GroupOptions};
use collectix_runtime::testing::{rooted, Case, COLLECTIVES};
use collectix_runtime::{DType, Plan, ReduceOp};
use std::collections::HashMap;

type Key = (usize, usize, u32); // (src, dst, tag)

fn check(case: &Case) -> Result<(), String> {
    let w = case.size;
    let mut sends: HashMap<Key, Vec<usize>> = HashMap::new();
    let mut recvs: HashMap<Key, Vec<usize>> = HashMap::new();
    for r in 0..w {
        let info = GroupInfo::world(
            w,
            r,
            GroupOptions {
                segment_bytes: 8,
                ..GroupOptions::default()
            },
        )
        .map_err(|e| e.to_string())?;
        let opts = CallOptions {
            algorithm: case.algorithm,
            timeout: None,
        };
        let plan =
            Plan::new(case.request(r), &info, &opts).map_err(|e| format!("{case:?}: {e}"))?;
        let Some(s) = plan.schedule() else { continue };
        for step in &s.steps {
            for x in &step.sends {
                let sizes = s.layout.chunk_elems[x.chunks.clone()].to_vec();
                if sends.insert((r, x.peer, x.tag), sizes).is_some() {
                    return Err(format!(
                        "{case:?}: rank {r} sends twice to {} with tag {}",
                        x.peer, x.tag
                    ));
                }
            }
            for x in &step.recvs {
                let sizes = s.layout.chunk_elems[x.chunks.clone()].to_vec();
                if recvs.insert((x.peer, r, x.tag), sizes).is_some() {
                    return Err(format!(
                        "{case:?}: rank {r} receives twice from {} with tag {}",
                        x.peer, x.tag
                    ));
                }
            }
        }
    }
    if sends.len() != recvs.len() {
        return Err(format!(
            "{case:?}: {} sends but {} receives",
            sends.len(),
            recvs.len()
        ));
    }
    for (k, sz) in &sends {
        match recvs.get(k) {
            None => return Err(format!("{case:?}: send {k:?} has no receive")),
            Some(rz) if rz != sz => {
                return Err(format!(
                    "{case:?}: send {k:?} carries {sz:?}, receive expects {rz:?}"
                ))
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// Every case of the matrix for group size `w`: each collective, algorithm, root and count.
fn cases(w: usize) -> Vec<Case> {
    let mut all = Vec::new();
    for kind in COLLECTIVES {
        for &alg in kind.algorithms() {
            let roots = if rooted(kind) { w } else { 1 };
            for root in 0..roots {
                for count in [0, 1, w.saturating_sub(1), w, 7, 33] {
                    all.push(Case {
                        kind,
                        size: w,
                        count,
                        dtype: DType::F32,
                        op: ReduceOp::Sum,
                        root,
                        algorithm: Some(alg),
                    });
                }
            }
        }
    }
    all
}

#[test]
fn every_send_has_exactly_one_matching_receive() {
    let mut checked = 0;
    for w in 1usize..=9 {
        for case in cases(w) {
            if let Err(e) = check(&case) {
                panic!("{e}");
            }
            checked += 1;
        }
    }
    assert!(checked > 1000, "only {checked} cases checked");
}

/// A communicator's schedule cache never changes a plan: every case, planned through one
/// cache per group member (shared by every collective, algorithm, root and count, so that
/// entries are reused, collide in shape and get evicted), gives the schedule and fingerprint
/// that planning afresh gives, the first time and again from the cache.
#[test]
fn cached_schedules_are_the_schedules_planned_afresh() {
    use collectix_runtime::schedule::ScheduleCache;
    let mut checked = 0;
    for w in 1usize..=9 {
        let caches: Vec<ScheduleCache> = (0..w).map(|_| ScheduleCache::default()).collect();
        for round in 0..2 {
            for case in cases(w) {
                let opts = CallOptions {
                    algorithm: case.algorithm,
                    timeout: None,
                };
                for (r, cache) in caches.iter().enumerate() {
                    let info = GroupInfo::world(w, r, GroupOptions::default())
                        .unwrap_or_else(|e| panic!("{e}"));
                    let fresh = Plan::new(case.request(r), &info, &opts);
                    let cached = Plan::new_cached(case.request(r), &info, &opts, cache);
                    match (fresh, cached) {
                        (Ok(f), Ok(c)) => {
                            assert_eq!(
                                f.schedule(),
                                c.schedule(),
                                "{case:?} rank {r} round {round}"
                            );
                            assert_eq!(f.fingerprint(), c.fingerprint());
                        }
                        (Err(f), Err(c)) => assert_eq!(f, c),
                        (f, c) => panic!(
                            "{case:?} rank {r}: afresh {:?}, cached {:?}",
                            f.err(),
                            c.err()
                        ),
                    }
                    checked += 1;
                }
            }
        }
    }
    assert!(checked > 5000, "only {checked} cases checked");
}
