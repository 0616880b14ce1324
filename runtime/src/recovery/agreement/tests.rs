//! The survivors' agreement ([`Agreement`]) under a seeded scheduler: every rank's
//! steps against one linearizable store, interleaved at random, with one or two ranks failing
//! at every step of the agreement (before publishing, after, between a look and the decision)
//! and detected late or never. The promise checked, on every schedule:
//!
//! - every rank that did not fail ends (no hang), within the deadline plus a few steps;
//! - there is one decision: every rank that ends with one ends with the same;
//! - its members all published, and it is the least of their completed counts;
//! - a live rank is left out only if the decision was taken at the deadline (nobody took a
//!   live rank for dead here); a rank that is in the decision gets it, one that is not gets
//!   `LeftOut` naming the decider.

use crate::recovery::agreement::SETTLE;
use crate::recovery::evidence::Proposal;
use crate::recovery::{proposal_key, Agreement, Ask, Decision, Evidence};
use crate::testing::sim::Rng;
use crate::{Error, GroupId, Time};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// Virtual time per scheduler tick.
const TICK: Duration = Duration::from_micros(10);
/// The agreements' deadline, in ticks.
const DEADLINE_TICKS: u64 = 2_000;

/// One rank's failure: it stops after `after` of its own steps; the others learn of it
/// `detected` ticks later (`None`: never, only the deadline ends their wait).
#[derive(Clone, Copy, Debug)]
struct Failure {
    rank: usize,
    after: usize,
    detected: Option<u64>,
}

struct Outcome {
    /// Each rank's result (`None`: it failed).
    results: Vec<Option<Result<Decision, Error>>>,
    published: BTreeSet<usize>,
    completed: Vec<u64>,
    /// The tick of the first decision written.
    decided_at: Option<u64>,
}

fn run(w: usize, failures: &[Failure], seed: u64) -> Outcome {
    run_cut(w, failures, &[], seed)
}

/// [`run`], with the links `cuts` broken from the start (each end suspects the other).
fn run_cut(w: usize, failures: &[Failure], cuts: &[(usize, usize)], seed: u64) -> Outcome {
    let mut rng = Rng::new(seed);
    let group = GroupId::derive(GroupId::WORLD, 4, &[seed]);
    let members: Vec<usize> = (0..w).collect();
    let completed: Vec<u64> = (0..w).map(|_| rng.below(6) as u64).collect();
    let deadline = Time::ZERO + TICK * DEADLINE_TICKS as u32;
    // Each end of a cut link suspects the other from the start.
    let suspects = |r: usize| -> BTreeSet<usize> {
        cuts.iter()
            .filter_map(|&(a, b)| match r {
                _ if r == a => Some(b),
                _ if r == b => Some(a),
                _ => None,
            })
            .collect()
    };
    let mut ags: Vec<Agreement> = (0..w)
        .map(|r| {
            let e = Evidence {
                suspected: suspects(r),
                ..Evidence::default()
            };
            Agreement::new(group, r, members.clone(), completed[r], deadline)
                .with_evidence(&e)
                .settling_for(TICK * 50)
        })
        .collect();
    let mut store: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let mut steps = vec![0usize; w];
    let mut dead: BTreeMap<usize, u64> = BTreeMap::new();
    let mut decided_at = None;
    let mut tick = 0u64;
    loop {
        tick += 1;
        assert!(
            tick < DEADLINE_TICKS * 4,
            "hang: seed {seed}, failures {failures:?}"
        );
        let now = Time::ZERO + TICK * tick as u32;
        let live: Vec<usize> = (0..w)
            .filter(|r| !dead.contains_key(r) && ags[*r].outcome().is_none())
            .collect();
        if live.is_empty() {
            break;
        }
        let r = live[rng.below(live.len())];
        if let Some(f) = failures.iter().find(|f| f.rank == r && f.after == steps[r]) {
            dead.insert(r, f.detected.map_or(u64::MAX, |d| tick + d));
            continue;
        }
        steps[r] += 1;
        let lost = Evidence {
            dead: dead
                .iter()
                .filter(|(_, &at)| at <= tick)
                .map(|(&d, _)| d)
                .collect(),
            suspected: suspects(r),
        };
        match ags[r].poll() {
            Ask::Publish { key, value } => {
                store.insert(key, value);
            }
            Ask::Look { keys } => {
                let values = keys.iter().map(|k| store.get(k).cloned()).collect();
                ags[r].looked(values, now, &lost);
            }
            Ask::Decide { key, value } => {
                if !store.contains_key(&key) {
                    decided_at = Some(tick);
                }
                let current = store.entry(key).or_insert(value).clone();
                ags[r].decided(&current);
            }
            // Every rank's evidence is whole from the start: a probe finds nothing new.
            Ask::Probe { .. } | Ask::Done => {}
        }
    }
    let published = (0..w)
        .filter(|&r| store.contains_key(&proposal_key(group, r)))
        .collect();
    Outcome {
        results: (0..w)
            .map(|r| {
                if dead.contains_key(&r) {
                    None
                } else {
                    ags[r].outcome().cloned()
                }
            })
            .collect(),
        published,
        completed,
        decided_at,
    }
}

fn check(w: usize, failures: &[Failure], seed: u64) {
    let o = run(w, failures, seed);
    let ctx = format!("seed {seed}, {w} ranks, failures {failures:?}");
    let decisions: Vec<&Decision> = o.results.iter().flatten().flatten().collect();
    let Some(first) = decisions.first() else {
        // Nobody live is in a decision: only possible if every live rank was left out, or
        // the live ranks were no majority (a minority never decides).
        let live = o.results.iter().flatten().count();
        assert!(
            live < w / 2 + 1
                || o.results
                    .iter()
                    .flatten()
                    .all(|r| matches!(r, Err(Error::LeftOut { .. }))),
            "{ctx}: a live majority and no decision: {:?}",
            o.results
        );
        for r in o.results.iter().flatten() {
            assert!(
                matches!(r, Err(Error::LeftOut { .. } | Error::NoMajority { .. })),
                "{ctx}: {r:?}"
            );
        }
        return;
    };
    for d in &decisions {
        assert_eq!(d, first, "{ctx}: two decisions");
    }
    assert!(
        first.members.iter().all(|m| o.published.contains(m)),
        "{ctx}: a member that never published: {first:?}"
    );
    let least = first.members.iter().map(|&m| o.completed[m]).min();
    assert_eq!(Some(first.completed), least, "{ctx}");
    let before_deadline = o.decided_at.is_some_and(|t| t < DEADLINE_TICKS);
    for (r, res) in o.results.iter().enumerate() {
        let Some(res) = res else { continue };
        if first.members.contains(&r) {
            assert_eq!(res.as_ref().ok(), Some(*first), "{ctx}: rank {r}");
        } else {
            assert!(
                !before_deadline,
                "{ctx}: live rank {r} left out before the deadline"
            );
            assert_eq!(
                res.as_ref().err(),
                Some(&Error::LeftOut {
                    group: GroupId::derive(GroupId::WORLD, 4, &[seed]),
                    decided_by: first.decided_by,
                    link_to: None,
                }),
                "{ctx}: rank {r}"
            );
        }
    }
}

/// Nobody fails: one decision, with everyone, whatever the interleaving.
#[test]
fn with_no_failure_every_rank_is_in_the_one_decision() {
    for w in 1..=5 {
        for seed in 0..200 {
            let o = run(w, &[], seed);
            for (r, res) in o.results.iter().enumerate() {
                match res {
                    Some(Ok(d)) => {
                        assert_eq!(d.members, (0..w).collect::<Vec<_>>(), "seed {seed}");
                        assert_eq!(Some(d.completed), o.completed.iter().copied().min());
                    }
                    other => panic!("seed {seed}, rank {r}: {other:?}"),
                }
            }
        }
    }
}

/// One rank fails at each step of its agreement (before publishing, after, after each look,
/// before its compare-and-set), detected soon, late, or never.
#[test]
fn one_failure_at_every_step() {
    for w in 2..=5 {
        for victim in 0..w {
            for after in 0..6 {
                for detected in [Some(1), Some(50), None] {
                    for seed in 0..30 {
                        let f = Failure {
                            rank: victim,
                            after,
                            detected,
                        };
                        check(w, &[f], seed);
                    }
                }
            }
        }
    }
}

/// A second failure during the agreement, at every pair of steps: the survivors still end
/// with one decision.
#[test]
fn a_second_failure_during_the_agreement() {
    for w in 3..=5 {
        for a in 0..5 {
            for b in 0..5 {
                for detected in [Some(1), Some(80), None] {
                    for seed in 0..12 {
                        let fs = [
                            Failure {
                                rank: 0,
                                after: a,
                                detected,
                            },
                            Failure {
                                rank: w - 1,
                                after: b,
                                detected: Some(3),
                            },
                        ];
                        check(w, &fs, seed);
                    }
                }
            }
        }
    }
}

/// What the store hands back is data from outside: anything but a well-formed decision over
/// the failed group's members is an error, never a panic or a huge allocation.
#[test]
fn a_malformed_decision_is_an_error() {
    let old = [0usize, 1, 2];
    let good = Decision {
        members: vec![0, 2],
        completed: 7,
        decided_by: 2,
        joined: vec![2],
        cut_off: vec![(1, 0)],
        replaced: Vec::new(),
        returned: Vec::new(),
    };
    let bytes = good.encode();
    assert_eq!(Decision::decode(&bytes, &old), Ok(good.clone()));
    for cut in 0..bytes.len() {
        assert!(
            Decision::decode(&bytes[..cut], &old).is_err(),
            "cut at {cut}"
        );
    }
    let mut huge = bytes.clone();
    huge[20..24].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(Decision::decode(&huge, &old).is_err());
    let outsider = Decision {
        members: vec![0, 5],
        ..good.clone()
    };
    assert!(Decision::decode(&outsider.encode(), &old).is_err());
    let unordered = Decision {
        members: vec![2, 0],
        ..good.clone()
    };
    assert!(Decision::decode(&unordered.encode(), &old).is_err());
    let stranger_joined = Decision {
        joined: vec![1],
        ..good.clone()
    };
    assert!(Decision::decode(&stranger_joined.encode(), &old).is_err());
    for cut_off in [vec![(0, 1)], vec![(1, 7)]] {
        let wrong = Decision {
            cut_off,
            ..good.clone()
        };
        let e = Decision::decode(&wrong.encode(), &old);
        assert!(
            matches!(&e, Err(Error::Store(m)) if m.contains("cut-off")),
            "{e:?}"
        );
    }
    // Shorter than a header with both counts: that, and nothing else, is what is wrong.
    for cut in 0..28 {
        let e = Decision::decode(&bytes[..cut.min(bytes.len())], &old);
        assert!(
            matches!(&e, Err(Error::Store(m)) if m.contains("no decision header")),
            "cut at {cut}: {e:?}"
        );
    }
    // A whole header with no member: the header is not what is wrong.
    let empty = Decision {
        members: Vec::new(),
        joined: Vec::new(),
        ..good.clone()
    };
    let e = Decision::decode(&empty.encode(), &old);
    assert!(
        matches!(&e, Err(Error::Store(m)) if m.contains("member count")),
        "{e:?}"
    );
    // More members than the failed group had: refused by the count, before anything is
    // read or allocated.
    let crowd = Decision {
        members: vec![0, 1, 2, 3],
        joined: Vec::new(),
        ..empty.clone()
    };
    let e = Decision::decode(&crowd.encode(), &old);
    assert!(
        matches!(&e, Err(Error::Store(m)) if m.contains("member count")),
        "{e:?}"
    );
    // A byte more than the lists hold.
    let mut long = bytes.clone();
    long.push(0);
    assert!(Decision::decode(&long, &old).is_err());
    // A member twice.
    let twice = Decision {
        members: vec![0, 0, 2],
        joined: Vec::new(),
        ..empty.clone()
    };
    assert!(Decision::decode(&twice.encode(), &old).is_err());
    // A larger group round-trips too.
    let big = Decision {
        members: vec![0, 1, 3, 4, 6],
        completed: u64::MAX - 1,
        decided_by: 6,
        joined: vec![1, 4],
        cut_off: vec![(2, 1), (5, 6)],
        replaced: Vec::new(),
        returned: Vec::new(),
    };
    let wide: Vec<usize> = (0..8).collect();
    assert_eq!(Decision::decode(&big.encode(), &wide), Ok(big));
    let _ = good;
    let mut rng = Rng::new(1);
    for _ in 0..2_000 {
        let n = rng.below(64);
        let junk: Vec<u8> = (0..n).map(|_| rng.below(256) as u8).collect();
        let _ = Decision::decode(&junk, &old);
    }
}

/// What a regrow gave: the survivors' outcomes, the newcomer's, and each rank's completed
/// count.
type Regrown = (
    Vec<Result<Decision, Error>>,
    Option<Result<Decision, Error>>,
    Vec<u64>,
);

/// A regrow: rank `v` of `w` died (its old incarnation published a proposal first or not,
/// `old_published`), the survivors wait for everyone, and `v`'s new incarnation starts after
/// `arrives` ticks (`None`: never). Returns the survivors' and the newcomer's outcomes.
fn regrow(w: usize, v: usize, old_published: bool, arrives: Option<u64>, seed: u64) -> Regrown {
    let mut rng = Rng::new(seed);
    let group = GroupId::derive(GroupId::WORLD, 5, &[seed]);
    let members: Vec<usize> = (0..w).collect();
    let completed: Vec<u64> = (0..w).map(|_| 3 + rng.below(3) as u64).collect();
    let deadline = Time::ZERO + TICK * DEADLINE_TICKS as u32;
    let mut ags: Vec<Option<Agreement>> = (0..w)
        .map(|r| {
            (r != v).then(|| {
                Agreement::new(group, r, members.clone(), completed[r], deadline)
                    .waiting_for_everyone()
            })
        })
        .collect();
    let mut store: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    if old_published {
        let mut old = Agreement::new(group, v, members.clone(), completed[v], deadline);
        if let Ask::Publish { key, value } = old.poll() {
            store.insert(key, value);
        }
    }
    let mut newcomer: Option<Agreement> = None;
    let lost = Evidence {
        dead: [v].into(),
        ..Evidence::default()
    };
    let mut tick = 0u64;
    loop {
        tick += 1;
        assert!(tick < DEADLINE_TICKS * 4, "hang: seed {seed}");
        if arrives == Some(tick) {
            newcomer = Some(Agreement::newcomer(group, v, members.clone(), deadline));
        }
        let now = Time::ZERO + TICK * tick as u32;
        let mut live: Vec<&mut Agreement> = ags
            .iter_mut()
            .flatten()
            .chain(newcomer.iter_mut())
            .filter(|a| a.outcome().is_none())
            .collect();
        if live.is_empty() && (arrives.is_none_or(|a| a < tick)) {
            break;
        }
        if live.is_empty() {
            continue;
        }
        let i = rng.below(live.len());
        let ag = &mut live[i];
        match ag.poll() {
            Ask::Publish { key, value } => {
                store.insert(key, value);
            }
            Ask::Look { keys } => {
                let values = keys.iter().map(|k| store.get(k).cloned()).collect();
                ag.looked(values, now, &lost);
            }
            Ask::Decide { key, value } => {
                let current = store.entry(key).or_insert(value).clone();
                ag.decided(&current);
            }
            // Every rank's evidence is whole from the start: a probe finds nothing new.
            Ask::Probe { .. } | Ask::Done => {}
        }
    }
    let survivors = ags
        .iter()
        .flatten()
        .filter_map(|a| a.outcome().cloned())
        .collect();
    (
        survivors,
        newcomer.and_then(|a| a.outcome().cloned()),
        completed,
    )
}

/// The lost rank's new incarnation comes before the deadline: one decision with everyone,
/// naming it as joined, with the survivors' least completed count (the newcomer's count
/// nothing).
#[test]
fn a_new_incarnation_that_comes_in_time_joins() {
    for w in 2..=5 {
        for seed in 0..100 {
            let v = seed as usize % w;
            let (s, n, completed) = regrow(w, v, false, Some(1 + seed % 400), seed);
            let least = (0..w).filter(|&r| r != v).map(|r| completed[r]).min();
            let want = |d: &Decision| {
                d.members == (0..w).collect::<Vec<_>>()
                    && d.joined == vec![v]
                    && Some(d.completed) == least
            };
            for r in s.iter().chain(n.iter()) {
                assert!(matches!(r, Ok(d) if want(d)), "seed {seed}: {r:?}");
            }
        }
    }
}

/// It never comes, or comes after the deadline: the survivors go on without it, and a late
/// newcomer is told it was left out.
#[test]
fn a_new_incarnation_that_comes_late_is_left_out() {
    for seed in 0..50 {
        let (s, n, _) = regrow(4, 1, false, None, seed);
        for r in &s {
            assert!(matches!(r, Ok(d) if d.members == vec![0, 2, 3] && d.joined.is_empty()));
        }
        assert!(n.is_none());
        let (s, n, _) = regrow(4, 1, false, Some(DEADLINE_TICKS + 50), seed);
        assert!(s
            .iter()
            .all(|r| matches!(r, Ok(d) if d.members == vec![0, 2, 3])));
        assert!(matches!(n, Some(Err(Error::LeftOut { .. }))), "{n:?}");
    }
}

/// The old incarnation published before it died: the survivors, who know it lost, do not
/// count that proposal and wait for the new incarnation, which joins (never taken for a
/// survivor with the group's state).
#[test]
fn a_new_incarnation_is_never_taken_for_its_old_one() {
    for seed in 0..300 {
        let (s, n, _) = regrow(3, 2, true, Some(1 + seed % 40), seed);
        let d = s[0].clone().unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        assert!(s.iter().all(|r| r.as_ref().ok() == Some(&d)), "seed {seed}");
        assert_eq!(n, Some(Ok(d.clone())), "seed {seed}");
        assert_eq!(d.joined, vec![2]);
    }
}

/// Where the survivors do not know the lost rank lost yet, its old proposal may count: the
/// newcomer is then left out rather than taken for a survivor with the group's state.
#[test]
fn a_newcomer_counted_as_its_old_incarnation_is_left_out() {
    let group = GroupId::WORLD;
    let members = vec![0, 1];
    let t = Time::ZERO;
    let mut s = Agreement::new(group, 0, members.clone(), 4, t).waiting_for_everyone();
    let mut old = Agreement::new(group, 1, members.clone(), 4, t);
    let mut store: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    for a in [&mut s, &mut old] {
        if let Ask::Publish { key, value } = a.poll() {
            store.insert(key, value);
        }
    }
    let Ask::Look { keys } = s.poll() else {
        panic!("not looking")
    };
    s.looked(
        keys.iter().map(|k| store.get(k).cloned()).collect(),
        t,
        &Evidence::default(),
    );
    let Ask::Decide { key, value } = s.poll() else {
        panic!("not deciding")
    };
    store.insert(key, value.clone());
    s.decided(&value);
    let mut n = Agreement::newcomer(group, 1, members, t);
    let _ = n.poll();
    let Ask::Look { keys } = n.poll() else {
        panic!("not looking")
    };
    n.looked(
        keys.iter().map(|k| store.get(k).cloned()).collect(),
        t,
        &Evidence::default(),
    );
    assert!(matches!(
        n.outcome(),
        Some(Err(Error::LeftOut { decided_by: 0, .. }))
    ));
    assert!(matches!(s.outcome(), Some(Ok(d)) if d.members == vec![0, 1] && d.joined.is_empty()));
}

#[test]
fn each_group_has_its_own_decision_and_each_rank_its_own_proposal() {
    let (a, b) = (GroupId::WORLD, GroupId::derive(GroupId::WORLD, 1, &[0, 1]));
    assert_ne!(
        crate::recovery::decision_key(a),
        crate::recovery::decision_key(b)
    );
    assert_ne!(proposal_key(a, 0), proposal_key(a, 1));
    assert_ne!(proposal_key(a, 0), proposal_key(b, 0));
    for k in [crate::recovery::decision_key(a), proposal_key(a, 0)] {
        assert!(k.starts_with("collectix/survivors/"), "{k}");
    }
    assert_ne!(crate::recovery::decision_key(a), proposal_key(a, 0));
    let ag = Agreement::new(a, 0, vec![0, 1], 3, Time::ZERO);
    assert_eq!(ag.decision_key(), crate::recovery::decision_key(a));
    assert_eq!(ag.proposal_key(1), proposal_key(a, 1));
}

/// A new incarnation waits for every member, one it knows lost included (its own new
/// incarnation may come), until the deadline; a survivor's plain agreement does not wait for
/// a member it knows lost.
#[test]
fn a_newcomer_waits_for_every_member_until_the_deadline() {
    let g = GroupId::WORLD;
    let deadline = Time::ZERO + Duration::from_secs(1);
    let lost = Evidence {
        dead: [2].into(),
        ..Evidence::default()
    };
    let proposal = |fresh: bool, c: u64| {
        let p = Proposal {
            completed: (!fresh).then_some(c),
            evidence: Evidence::default(),
        };
        Some(p.encode())
    };
    let values = || vec![None, proposal(false, 5), proposal(true, 0), None];
    let mut newcomer = Agreement::newcomer(g, 1, vec![0, 1, 2], deadline).with_evidence(&lost);
    assert!(matches!(newcomer.poll(), Ask::Publish { .. }));
    assert!(matches!(newcomer.poll(), Ask::Look { .. }));
    newcomer.looked(values(), Time::ZERO, &lost);
    assert!(
        matches!(newcomer.poll(), Ask::Look { .. }),
        "it waits for member 2 before the deadline"
    );
    newcomer.looked(values(), deadline, &lost);
    assert!(
        matches!(newcomer.poll(), Ask::Decide { .. }),
        "at the deadline it decides"
    );
    let mut survivor = Agreement::new(g, 0, vec![0, 1, 2], 5, deadline).with_evidence(&lost);
    let _ = survivor.poll();
    let _ = survivor.poll();
    survivor.looked(values(), Time::ZERO, &lost);
    assert!(
        matches!(survivor.poll(), Ask::Decide { .. }),
        "a survivor does not wait for a member it knows lost"
    );
}

/// An agreement whose own proposal never shows in the store ends at its deadline with a
/// store error; one whose store fails ends with that failure.
#[test]
fn an_agreement_ends_with_an_error_when_its_own_proposal_never_shows() {
    let g = GroupId::WORLD;
    let deadline = Time::ZERO + Duration::from_secs(1);
    let none = Evidence::default();
    let mut ag = Agreement::new(g, 0, vec![0, 1], 3, deadline);
    let _ = ag.poll();
    let _ = ag.poll();
    ag.looked(vec![None, None, None], Time::ZERO, &none);
    assert!(ag.outcome().is_none(), "before the deadline it looks again");
    ag.looked(vec![None, None, None], deadline, &none);
    assert!(
        matches!(ag.outcome(), Some(Err(Error::Store(_)))),
        "{:?}",
        ag.outcome()
    );
    assert_eq!(ag.poll(), Ask::Done);
    let mut broken = Agreement::new(g, 0, vec![0, 1], 3, deadline);
    broken.fail(Error::Store("the store is gone".into()));
    assert_eq!(broken.poll(), Ask::Done);
    assert!(matches!(broken.outcome(), Some(Err(Error::Store(m))) if m == "the store is gone"));
}

/// Every rank's outcome of a run with the links `cuts` broken and nobody dead: each rank in
/// the one decision, or left out naming the decider and the peer its link to broke.
fn cut_run(w: usize, cuts: &[(usize, usize)], seed: u64) -> (Decision, Vec<usize>) {
    let o = run_cut(w, &[], cuts, seed);
    let ctx = format!("seed {seed}, {w} ranks, cuts {cuts:?}");
    one_decision(&o, cuts, &ctx)
}

/// The one decision of a run with the links `cuts` broken, and the ranks it left out: each
/// rank is in it, or left out naming the decider and a peer its link to broke.
fn one_decision(o: &Outcome, cuts: &[(usize, usize)], ctx: &str) -> (Decision, Vec<usize>) {
    let d = o
        .results
        .iter()
        .flatten()
        .find_map(|r| r.as_ref().ok())
        .cloned()
        .unwrap_or_else(|| panic!("{ctx}: no decision: {:?}", o.results));
    let mut out = Vec::new();
    for (r, res) in o.results.iter().enumerate() {
        match res {
            Some(Ok(got)) => assert_eq!(got, &d, "{ctx}: rank {r}"),
            Some(Err(Error::LeftOut {
                decided_by,
                link_to: Some(peer),
                ..
            })) => {
                assert_eq!(*decided_by, d.decided_by, "{ctx}");
                assert!(
                    cuts.contains(&(r, *peer)) || cuts.contains(&(*peer, r)),
                    "{ctx}: rank {r} left out for a link to {peer} that is not cut"
                );
                out.push(r);
            }
            other => panic!("{ctx}: rank {r}: {other:?}"),
        }
    }
    (d, out)
}

/// One cut link, in groups of 3 to 5, whoever comes first: exactly its higher end is left
/// out, on every schedule, and told why; the rest go on together, before the deadline.
#[test]
fn a_cut_link_costs_exactly_its_higher_end() {
    for w in 3..=5 {
        for a in 0..w {
            for b in a + 1..w {
                for seed in 0..40 {
                    let (d, out) = cut_run(w, &[(a, b)], seed);
                    assert_eq!(out, vec![b], "seed {seed}, {w} ranks, cut {a}-{b}");
                    let rest: Vec<usize> = (0..w).filter(|&r| r != b).collect();
                    assert_eq!(d.members, rest);
                    assert_eq!(d.cut_off, vec![(b, a)]);
                }
            }
        }
    }
}

/// Connections made on a link's first message: rank `v` is cut off from every other rank
/// and from the store until tick `HEAL`, and only rank `n` ever had a connection to it, so
/// only `n` (and `v`) saw a link break. Each other rank has no evidence of its own: it probes
/// `v` when it sees `n` suspect it (the probe, `within` long, fails while the cut lasts);
/// `v` publishes once its cut heals, suspecting `n` alone.
fn lazy_run(w: usize, v: usize, n: usize, seed: u64) -> Outcome {
    const HEAL: u64 = 400;
    let mut rng = Rng::new(seed);
    let group = GroupId::derive(GroupId::WORLD, 5, &[seed]);
    let members: Vec<usize> = (0..w).collect();
    let deadline = Time::ZERO + TICK * DEADLINE_TICKS as u32;
    let mut evidence: Vec<Evidence> = (0..w)
        .map(|r| Evidence {
            suspected: match r {
                _ if r == v => [n].into(),
                _ if r == n => [v].into(),
                _ => BTreeSet::new(),
            },
            ..Evidence::default()
        })
        .collect();
    let mut ags: Vec<Agreement> = (0..w)
        .map(|r| {
            Agreement::new(group, r, members.clone(), 7, deadline)
                .with_evidence(&evidence[r])
                .settling_for(TICK * 50)
        })
        .collect();
    let mut store: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    // A rank probing is busy until its probes' time is up.
    let mut busy_until = vec![0u64; w];
    let mut decided_at = None;
    let mut tick = 0u64;
    loop {
        tick += 1;
        assert!(tick < DEADLINE_TICKS * 4, "hang: seed {seed}");
        let now = Time::ZERO + TICK * tick as u32;
        let live: Vec<usize> = (0..w).filter(|&r| ags[r].outcome().is_none()).collect();
        if live.is_empty() {
            break;
        }
        let r = live[rng.below(live.len())];
        if tick < busy_until[r] || (r == v && tick < HEAL) {
            continue;
        }
        match ags[r].poll() {
            Ask::Publish { key, value } => {
                store.insert(key, value);
            }
            Ask::Look { keys } => {
                let values = keys.iter().map(|k| store.get(k).cloned()).collect();
                ags[r].looked(values, now, &evidence[r]);
            }
            Ask::Probe { peers, within } => {
                let ticks = (within.as_nanos() / TICK.as_nanos()) as u64;
                busy_until[r] = tick + ticks;
                for p in peers {
                    let cut = (p == v || r == v) && tick + ticks < HEAL;
                    if cut {
                        evidence[r].suspected.insert(p);
                    }
                }
            }
            Ask::Decide { key, value } => {
                if !store.contains_key(&key) {
                    decided_at = Some(tick);
                }
                let current = store.entry(key).or_insert(value).clone();
                ags[r].decided(&current);
            }
            Ask::Done => {}
        }
    }
    Outcome {
        results: ags.iter().map(|a| a.outcome().cloned()).collect(),
        published: (0..w).collect(),
        completed: vec![7; w],
        decided_at,
    }
}

/// Lazy connections: a rank cut off from all, that a single member had a connection to, is
/// left out alone, on every schedule; the one member that saw its link break goes on. (With
/// nothing but their own links to go by, the two ends of that link would look alike, and
/// the higher would go.)
#[test]
fn a_member_another_suspects_is_probed_by_the_ranks_that_had_no_link_to_it() {
    for w in 3..=5 {
        for v in 0..w {
            for n in (0..w).filter(|&n| n != v) {
                let cuts: Vec<(usize, usize)> =
                    (0..w).filter(|&r| r != v).map(|r| (v, r)).collect();
                for seed in 0..20 {
                    let ctx = format!("seed {seed}, {w} ranks, {v} cut off, known to {n}");
                    let (d, out) = one_decision(&lazy_run(w, v, n, seed), &cuts, &ctx);
                    assert_eq!(out, vec![v], "{ctx}");
                    assert_eq!(d.members.len(), w - 1, "{ctx}");
                }
            }
        }
    }
}

/// One rank cut off from every other (but not from the store) never decides for the rest:
/// the others go on together, whoever comes first, and the isolated one is left out.
#[test]
fn an_isolated_rank_never_decides_for_the_rest() {
    for w in 3..=5 {
        for v in 0..w {
            let cuts: Vec<(usize, usize)> = (0..w).filter(|&r| r != v).map(|r| (v, r)).collect();
            for seed in 0..60 {
                let (d, out) = cut_run(w, &cuts, seed);
                assert_eq!(out, vec![v], "seed {seed}, {w} ranks, {v} isolated");
                assert_eq!(d.members.len(), w - 1);
            }
        }
    }
}

/// A partition of five into three and two: the three go on, on every schedule.
#[test]
fn of_two_sides_the_larger_goes_on() {
    let cuts: Vec<(usize, usize)> = (0..3).flat_map(|a| (3..5).map(move |b| (a, b))).collect();
    for seed in 0..100 {
        let (d, out) = cut_run(5, &cuts, seed);
        assert_eq!(d.members, vec![0, 1, 2], "seed {seed}");
        assert_eq!(out, vec![3, 4]);
    }
}

/// A rank that counts no majority alive or dead never decides: two ranks of five left, the
/// three others gone without a trace (stopped, say): they give up at the deadline with
/// `NoMajority`. The same with the three known dead for certain: the two go on.
#[test]
fn a_minority_never_decides_unless_the_rest_are_certainly_dead() {
    for detected in [None, Some(5)] {
        for seed in 0..30 {
            let fs: Vec<Failure> = (2..5)
                .map(|rank| Failure {
                    rank,
                    after: 0,
                    detected,
                })
                .collect();
            let o = run(5, &fs, seed);
            for r in o.results.iter().flatten() {
                match detected {
                    None => assert!(
                        matches!(
                            r,
                            Err(Error::NoMajority {
                                counted: 2,
                                members: 5,
                                ..
                            })
                        ),
                        "seed {seed}: {r:?}"
                    ),
                    Some(_) => {
                        assert!(matches!(r, Ok(d) if d.members == vec![0, 1]), "{r:?}")
                    }
                }
            }
        }
    }
}

/// One member of four dead, another cut off from the other two and silent (its store
/// connection cut too): the two that suspect it are a majority of the members still alive,
/// and go on at once, on every schedule, rather than wait for it until the deadline.
#[test]
fn a_rank_cut_off_after_another_died_is_not_waited_for() {
    for seed in 0..40 {
        let fs = [
            Failure {
                rank: 2,
                after: 0,
                detected: Some(5),
            },
            Failure {
                rank: 1,
                after: 0,
                detected: None,
            },
        ];
        let o = run_cut(4, &fs, &[(0, 1), (1, 3)], seed);
        for r in [0, 3] {
            assert!(
                matches!(&o.results[r], Some(Ok(d)) if d.members == vec![0, 3]),
                "seed {seed}: rank {r}: {:?}",
                o.results[r]
            );
        }
        assert!(
            o.decided_at.is_some_and(|t| t < DEADLINE_TICKS),
            "seed {seed}: decided at {:?}, the deadline is {DEADLINE_TICKS}",
            o.decided_at
        );
    }
}

/// A rank publishes again when its evidence grows, so the others decide from it.
#[test]
fn a_rank_publishes_again_when_its_evidence_grows() {
    let g = GroupId::WORLD;
    let deadline = Time::ZERO + Duration::from_secs(1);
    let mut ag = Agreement::new(g, 0, vec![0, 1, 2], 3, deadline);
    let Ask::Publish { value, .. } = ag.poll() else {
        panic!("not publishing")
    };
    assert_eq!(
        Proposal::decode(&value, &[0, 1, 2]).map(|p| p.evidence),
        Some(Evidence::default())
    );
    let _ = ag.poll();
    let e = Evidence {
        suspected: [2].into(),
        ..Evidence::default()
    };
    ag.looked(vec![None, None, None, None], Time::ZERO, &e);
    let Ask::Publish { value, .. } = ag.poll() else {
        panic!("not publishing again")
    };
    assert_eq!(
        Proposal::decode(&value, &[0, 1, 2]).map(|p| p.evidence),
        Some(e.clone())
    );
    assert!(matches!(ag.poll(), Ask::Look { .. }));
    ag.looked(vec![None, None, None, None], Time::ZERO, &e);
    assert!(
        matches!(ag.poll(), Ask::Look { .. }),
        "unchanged: no publish"
    );
}

/// A proposal in the store: 3 calls completed, suspecting `suspected`.
fn proposal(suspected: &[usize]) -> Option<Vec<u8>> {
    let p = Proposal {
        completed: Some(3),
        evidence: Evidence {
            suspected: suspected.iter().copied().collect(),
            ..Evidence::default()
        },
    };
    Some(p.encode())
}

/// A broken link between two members: a rank waits `SETTLE` for the rest of the evidence
/// (the other links of a rank cut off break a moment apart), then decides from all of it.
#[test]
fn a_broken_link_waits_a_moment_for_the_rest_of_the_evidence() {
    let g = GroupId::WORLD;
    let members = vec![0, 1, 2];
    let deadline = Time::ZERO + Duration::from_secs(10);
    let mut ag = Agreement::new(g, 0, members.clone(), 3, deadline);
    let _ = ag.poll();
    let _ = ag.poll();
    // Rank 2 is cut off from both: first only its link to rank 1 shows broken.
    let values =
        |zero: &[usize], two: &[usize]| vec![None, proposal(zero), proposal(&[2]), proposal(two)];
    ag.looked(values(&[], &[1]), Time::ZERO, &Evidence::default());
    assert!(
        matches!(ag.poll(), Ask::Probe { peers, .. } if peers == vec![1, 2]),
        "it probes the ends of the broken link"
    );
    assert!(matches!(ag.poll(), Ask::Look { .. }), "it waits");
    // Then its link to rank 0 too, in both ends' evidence.
    let zero = Evidence {
        suspected: [2].into(),
        ..Evidence::default()
    };
    ag.looked(values(&[2], &[0, 1]), Time::ZERO + SETTLE / 2, &zero);
    assert!(
        matches!(ag.poll(), Ask::Publish { .. }),
        "it publishes its evidence"
    );
    assert!(matches!(ag.poll(), Ask::Look { .. }));
    ag.looked(values(&[2], &[0, 1]), Time::ZERO + SETTLE / 2, &zero);
    assert!(matches!(ag.poll(), Ask::Look { .. }), "still within SETTLE");
    ag.looked(values(&[2], &[0, 1]), Time::ZERO + SETTLE, &zero);
    let Ask::Decide { value, .. } = ag.poll() else {
        panic!("no decision")
    };
    let d = Decision::decode(&value, &members).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((d.members, d.cut_off), (vec![0, 1], vec![(2, 0)]));
}

/// A rank that asks for a probe decides nothing before it has the outcome, even with nothing
/// to settle: rank 0 sees rank 1 suspect rank 2 (the one cut off), probes both, and decides
/// at its next look, from what its probe found.
#[test]
fn a_rank_decides_only_with_its_probes_outcome() {
    let g = GroupId::WORLD;
    let members = vec![0, 1, 2];
    let deadline = Time::ZERO + Duration::from_secs(10);
    let mut ag = Agreement::new(g, 0, members.clone(), 3, deadline).settling_for(Duration::ZERO);
    let _ = ag.poll();
    let _ = ag.poll();
    let values = || vec![None, proposal(&[]), proposal(&[2]), proposal(&[1])];
    ag.looked(values(), Time::ZERO, &Evidence::default());
    assert!(!ag.is_looking(), "a probe to hand out: no wait");
    assert!(matches!(ag.poll(), Ask::Probe { peers, .. } if peers == vec![1, 2]));
    assert!(
        matches!(ag.poll(), Ask::Look { .. }),
        "no decision without the outcome"
    );
    // Its probe could not reach rank 2.
    let found = Evidence {
        suspected: [2].into(),
        ..Evidence::default()
    };
    ag.looked(values(), Time::ZERO, &found);
    let Ask::Decide { value, .. } = ag.poll() else {
        panic!("no decision")
    };
    let d = Decision::decode(&value, &members).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((d.members, d.cut_off), (vec![0, 1], vec![(2, 0)]));
}

/// A regrow with a standby: the dead member's place goes to the standby in the same round,
/// on every schedule, and the standby is told it is in; with no standby there, the survivors
/// wait for the dead member's new incarnation until the deadline.
#[test]
fn a_standby_takes_a_dead_member_s_place_in_the_same_round() {
    for seed in 0..100 {
        let mut rng = Rng::new(seed);
        let group = GroupId::derive(GroupId::WORLD, 6, &[seed]);
        let members = vec![0, 1, 2, 3];
        let deadline = Time::ZERO + TICK * DEADLINE_TICKS as u32;
        let dead = Evidence {
            dead: [2].into(),
            ..Evidence::default()
        };
        let mut ags: Vec<Agreement> = [0, 1, 3]
            .iter()
            .map(|&r| {
                Agreement::new(group, r, members.clone(), 5, deadline)
                    .waiting_for_everyone()
                    .with_standbys(&[4])
                    .with_evidence(&dead)
            })
            .collect();
        ags.push(Agreement::standby(group, 4, members.clone(), deadline));
        let mut store: BTreeMap<String, Vec<u8>> = BTreeMap::new();
        let mut tick = 0u64;
        while ags.iter().any(|a| a.outcome().is_none()) {
            tick += 1;
            assert!(
                tick < DEADLINE_TICKS,
                "seed {seed}: no decision before the deadline"
            );
            let now = Time::ZERO + TICK * tick as u32;
            let live: Vec<usize> = (0..ags.len())
                .filter(|&i| ags[i].outcome().is_none())
                .collect();
            let ag = &mut ags[live[rng.below(live.len())]];
            match ag.poll() {
                Ask::Publish { key, value } => {
                    store.insert(key, value);
                }
                Ask::Look { keys } => {
                    let values = keys.iter().map(|k| store.get(k).cloned()).collect();
                    ag.looked(values, now, &dead);
                }
                Ask::Decide { key, value } => {
                    let current = store.entry(key).or_insert(value).clone();
                    ag.decided(&current);
                }
                // Every rank's evidence is whole from the start: a probe finds nothing new.
                Ask::Probe { .. } | Ask::Done => {}
            }
        }
        for a in &ags {
            let d = a
                .outcome()
                .cloned()
                .unwrap_or_else(|| panic!("seed {seed}: none"));
            let d = d.unwrap_or_else(|e| panic!("seed {seed}: {e}"));
            assert_eq!(d.members, vec![0, 1, 4, 3], "seed {seed}");
            assert_eq!(
                (d.joined, d.replaced, d.completed),
                (vec![4], vec![(2, 4)], 5)
            );
        }
    }
}

/// A decision's replacements are checked like the rest: a standby that was a member, a lost
/// member still in the group, a standby twice, or an odd list is malformed.
#[test]
fn a_malformed_replacement_is_an_error() {
    let old = [0usize, 1, 2];
    let good = Decision {
        members: vec![0, 7, 2],
        completed: 1,
        decided_by: 0,
        joined: vec![7],
        cut_off: Vec::new(),
        replaced: vec![(1, 7)],
        returned: Vec::new(),
    };
    assert_eq!(Decision::decode(&good.encode(), &old), Ok(good.clone()));
    for replaced in [vec![(1, 2)], vec![(0, 7)], vec![(1, 7), (1, 7)]] {
        let bad = Decision {
            replaced,
            ..good.clone()
        };
        assert!(Decision::decode(&bad.encode(), &old).is_err(), "{bad:?}");
    }
    let unreplaced = Decision {
        replaced: Vec::new(),
        ..good.clone()
    };
    assert!(Decision::decode(&unreplaced.encode(), &old).is_err());
    let mut odd = good.encode();
    let n = odd.len();
    odd[n - 20..n - 16].copy_from_slice(&3u32.to_le_bytes());
    odd.truncate(n - 8);
    assert!(Decision::decode(&odd, &old).is_err());
}

/// A rank coming back is a new member after the ones that go on; a returned rank that was a
/// member, or is not in the group, is malformed.
#[test]
fn a_returned_rank_is_checked_like_the_rest() {
    let old = [0usize, 1];
    let good = Decision {
        members: vec![0, 1, 2],
        completed: 4,
        decided_by: 0,
        joined: vec![2],
        cut_off: Vec::new(),
        replaced: Vec::new(),
        returned: vec![2],
    };
    assert_eq!(Decision::decode(&good.encode(), &old), Ok(good.clone()));
    for returned in [vec![1], vec![3], vec![2, 2]] {
        let bad = Decision {
            returned,
            ..good.clone()
        };
        assert!(Decision::decode(&bad.encode(), &old).is_err(), "{bad:?}");
    }
    let unannounced = Decision {
        returned: Vec::new(),
        ..good
    };
    assert!(Decision::decode(&unannounced.encode(), &old).is_err());
}
