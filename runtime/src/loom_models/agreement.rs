//! Model group 7: the survivors' agreement ([`crate::recovery::agreement`]) on loom threads
//! sharing one store (a loom `Mutex` over a map: linearizable, as the real stores are). A
//! rank fails by stopping after a given number of its steps and marking itself lost in the
//! store's failure detector, which the others read as certain death; loom has no clock, so
//! no deadline ever passes and only detection ends a wait (a waiting rank sleeps until the
//! store changes). Partial faults are each rank's own view: the peers it suspects (a cut
//! link, a partition). Every model checks, whatever the interleaving: every live rank ends
//! (loom reports a rank spinning forever), all decisions are one, its members published,
//! and a live rank is left out only where the fault cuts it off (one end of a cut link, the
//! smaller side of a partition), never for a report.

use super::{check, must_fail};
use crate::error::Result;
use crate::ids::GroupId;
use crate::recovery::agreement::{proposal_key, Agreement, Ask, Decision};
use crate::recovery::Evidence;
use crate::time::Time;
use loom::sync::{Arc, Condvar, Mutex};
use std::collections::{BTreeMap, BTreeSet};

/// The store's compare-and-set, or (a deliberate bug) a plain overwrite.
#[derive(Clone, Copy)]
enum Decide {
    CompareAndSet,
    Overwrite,
}

/// The shared store and the failure detector: the map, a version that every write and
/// every failure raises, and who failed. A rank that looks and must look again waits on
/// the condition variable for the next version (loom has no clock to sleep on, and a spin
/// would be an endless model); loom reports it if every rank waits at once.
#[derive(Default)]
struct Shared {
    map: BTreeMap<String, Vec<u8>>,
    version: u64,
    lost: BTreeSet<usize>,
}

type Store = Arc<(Mutex<Shared>, Condvar)>;

fn write(store: &Store, f: impl FnOnce(&mut Shared)) {
    let mut s = crate::sync::lock(&store.0);
    f(&mut s);
    s.version += 1;
    store.1.notify_all();
}

/// Runs one rank's agreement to its end, or to its failure after `fail_after` steps.
fn rank(
    me: usize,
    w: usize,
    store: &Store,
    fail_after: Option<usize>,
    decide: Decide,
    view: &Evidence,
) -> Option<Result<Decision>> {
    let members: Vec<usize> = (0..w).collect();
    let never = Time::from_nanos(u64::MAX);
    // Loom has no clock: the evidence is whole from the start, and nothing settles.
    let ag = Agreement::new(GroupId::WORLD, me, members, me as u64 + 1, never)
        .with_evidence(view)
        .settling_for(std::time::Duration::ZERO);
    drive(ag, store, me, fail_after, decide, view)
}

/// Runs rank `me`'s agreement `ag` against the store to its end, or to its failure after
/// `fail_after` steps (it then marks itself lost and gives `None`); `view` is its own
/// evidence besides the detector's.
fn drive(
    mut ag: Agreement,
    store: &Store,
    me: usize,
    fail_after: Option<usize>,
    decide: Decide,
    view: &Evidence,
) -> Option<Result<Decision>> {
    let mut steps = 0;
    loop {
        if fail_after == Some(steps) {
            write(store, |s| {
                s.lost.insert(me);
            });
            return None;
        }
        steps += 1;
        match ag.poll() {
            Ask::Publish { key, value } => write(store, |s| {
                s.map.insert(key, value);
            }),
            Ask::Look { keys } => {
                let mut s = crate::sync::lock(&store.0);
                let values = keys.iter().map(|k| s.map.get(k).cloned()).collect();
                let mut e = view.clone();
                e.dead.extend(s.lost.iter().copied());
                ag.looked(values, Time::ZERO, &e);
                if ag.is_looking() {
                    let seen = s.version;
                    while s.version == seen {
                        s = store.1.wait(s).unwrap_or_else(|e| e.into_inner());
                    }
                }
            }
            Ask::Decide { key, value } => {
                let mut current = Vec::new();
                write(store, |s| {
                    current = match decide {
                        Decide::CompareAndSet => s.map.entry(key).or_insert(value).clone(),
                        Decide::Overwrite => {
                            s.map.insert(key, value.clone());
                            value
                        }
                    };
                });
                ag.decided(&current);
            }
            // The model's evidence is given whole: a probe finds nothing new.
            Ask::Probe { .. } => {}
            Ask::Done => return ag.outcome().cloned(),
        }
    }
}

/// `w` ranks (rank `r` fails after `fails[r]` steps, if given); checks the promise.
fn agree(w: usize, fails: Vec<Option<usize>>, decide: Decide) {
    agree_with(w, fails, decide, vec![Evidence::default(); w], &[]);
}

/// [`agree`], each rank `r` with its own evidence `views[r]`; the live ranks the fault cuts
/// off, `out`, are left out, and no other live rank is.
fn agree_with(
    w: usize,
    fails: Vec<Option<usize>>,
    decide: Decide,
    views: Vec<Evidence>,
    out: &[usize],
) {
    let store: Store = Arc::new((Mutex::new(Shared::default()), Condvar::new()));
    let threads: Vec<_> = (1..w)
        .map(|r| {
            let (store, fail, view) = (store.clone(), fails[r], views[r].clone());
            loom::thread::spawn(move || rank(r, w, &store, fail, decide, &view))
        })
        .collect();
    let mut results = vec![rank(0, w, &store, fails[0], decide, &views[0])];
    for t in threads {
        results.push(t.join().unwrap_or_else(|_| panic!("a rank panicked")));
    }
    let decisions: Vec<&Decision> = results.iter().flatten().flatten().collect();
    for d in &decisions {
        assert_eq!(*d, decisions[0], "two decisions: {results:?}");
    }
    let published: BTreeSet<usize> = {
        let s = crate::sync::lock(&store.0);
        (0..w)
            .filter(|&r| s.map.contains_key(&proposal_key(GroupId::WORLD, r)))
            .collect()
    };
    for (r, res) in results.iter().enumerate() {
        match res {
            None => assert!(fails[r].is_some(), "rank {r} ended without an outcome"),
            Some(Ok(d)) => {
                assert!(d.members.iter().all(|m| published.contains(m)));
                assert!(d.members.contains(&r));
                assert!(!out.contains(&r), "rank {r}, cut off, is in the decision");
            }
            Some(Err(crate::Error::LeftOut { .. })) if out.contains(&r) => {}
            Some(Err(e)) => panic!("live rank {r} failed: {e}"),
        }
    }
}

/// Rank `r`'s view in a fault where the links `cuts` broke: the peers across them.
fn cut_views(w: usize, cuts: &[(usize, usize)]) -> Vec<Evidence> {
    (0..w)
        .map(|r| Evidence {
            suspected: cuts
                .iter()
                .filter_map(|&(a, b)| match r {
                    _ if r == a => Some(b),
                    _ if r == b => Some(a),
                    _ => None,
                })
                .collect(),
            ..Evidence::default()
        })
        .collect()
}

/// A link cut between ranks 1 and 2 of three: exactly rank 2 (the higher end) is left out,
/// in one decision, whoever comes first.
#[test]
fn agreement_cut_link() {
    check("agreement: link 1-2 cut", || {
        agree_with(
            3,
            vec![None; 3],
            Decide::CompareAndSet,
            cut_views(3, &[(1, 2)]),
            &[2],
        )
    });
}

/// Rank 0 cut off from both others (a partition of one and two), the store reachable from
/// all: the two go on together, and rank 0 never decides for them.
#[test]
fn agreement_partition() {
    check("agreement: rank 0 partitioned off", || {
        agree_with(
            3,
            vec![None; 3],
            Decide::CompareAndSet,
            cut_views(3, &[(0, 1), (0, 2)]),
            &[0],
        )
    });
}

/// Rank 1 is live, but rank 0 was told it was lost (another member's report). A report is
/// no evidence: rank 0's agreement is the one of [`agreement_three_ranks_no_failure`], which
/// waits for rank 1 and leaves nobody out. Taking the report for death (a deliberate bug)
/// leaves a live rank out, and the model sees it.
#[test]
fn agreement_falsely_reported_live_rank() {
    let (msg, _) = must_fail("agreement bug: a report taken for death", || {
        let mut views = vec![Evidence::default(); 3];
        views[0].dead.insert(1);
        agree_with(3, vec![None; 3], Decide::CompareAndSet, views, &[])
    });
    assert!(msg.contains("live rank 1 failed"), "{msg}");
}

#[test]
fn agreement_three_ranks_no_failure() {
    check("agreement: 3 ranks, no failure", || {
        agree(3, vec![None, None, None], Decide::CompareAndSet)
    });
}

/// Rank 1 fails before publishing, after publishing, and after its first look.
#[test]
fn agreement_one_failure_at_each_step() {
    for k in 0..3 {
        check(
            &format!("agreement: rank 1 fails after {k} steps"),
            move || agree(3, vec![None, Some(k), None], Decide::CompareAndSet),
        );
    }
}

/// Ranks 1 and 2 both fail, at different steps: rank 0 alone goes on, with one decision.
#[test]
fn agreement_second_failure() {
    for (a, b) in [(0, 1), (1, 2), (2, 0)] {
        check(
            &format!("agreement: ranks 1 and 2 fail after {a} and {b} steps"),
            move || agree(3, vec![None, Some(a), Some(b)], Decide::CompareAndSet),
        );
    }
}

/// A store whose decision is overwritten, not compare-and-set: two ranks can end with two
/// decisions (one saw the failed rank's proposal, one did not), and the model sees it.
#[test]
fn agreement_bug_overwritten_decision_splits() {
    let (msg, _) = must_fail("agreement bug: overwritten decision", || {
        agree(3, vec![None, Some(1), None], Decide::Overwrite)
    });
    assert!(msg.contains("two decisions"), "{msg}");
}

/// A regrow: rank 2 was lost (the store's detector says so from the start), ranks 0 and 1
/// wait for everyone, and rank 2's new incarnation joins as a newcomer, all three racing:
/// one decision, with every rank, naming rank 2 as joined, whatever the interleaving.
#[test]
fn agreement_regrow_with_a_newcomer() {
    check("agreement: regrow, rank 2's new incarnation joins", || {
        let store: Store = Arc::new((Mutex::new(Shared::default()), Condvar::new()));
        crate::sync::lock(&store.0).lost.insert(2);
        let never = Time::from_nanos(u64::MAX);
        let members = vec![0, 1, 2];
        let threads: Vec<_> = (0..2)
            .map(|r| {
                let (store, members) = (store.clone(), members.clone());
                loom::thread::spawn(move || {
                    let ag = Agreement::new(GroupId::WORLD, r, members, 3 + r as u64, never)
                        .waiting_for_everyone();
                    drive(
                        ag,
                        &store,
                        r,
                        None,
                        Decide::CompareAndSet,
                        &Evidence::default(),
                    )
                })
            })
            .collect();
        let newcomer = drive(
            Agreement::newcomer(GroupId::WORLD, 2, members.clone(), never),
            &store,
            2,
            None,
            Decide::CompareAndSet,
            &Evidence::default(),
        );
        let mut all = vec![newcomer];
        for t in threads {
            all.push(t.join().unwrap_or_else(|_| panic!("a rank panicked")));
        }
        for r in &all {
            match r {
                Some(Ok(d)) => {
                    assert_eq!(d.members, members);
                    assert_eq!(d.joined, vec![2]);
                    assert_eq!(
                        d.completed, 3,
                        "the survivors' least; the newcomer's counts nothing"
                    );
                }
                other => panic!("{other:?}"),
            }
        }
    });
}

/// A regrow with a hot standby: rank 2 was lost (the store's detector says so from the
/// start), ranks 0 and 1 regrow taking standby 3, which joins the agreement, all three racing:
/// one decision, with the standby in rank 2's place, whatever the interleaving.
#[test]
fn agreement_regrow_with_a_standby() {
    check("agreement: regrow, standby 3 takes rank 2's place", || {
        let store: Store = Arc::new((Mutex::new(Shared::default()), Condvar::new()));
        crate::sync::lock(&store.0).lost.insert(2);
        let never = Time::from_nanos(u64::MAX);
        let members = vec![0, 1, 2];
        let threads: Vec<_> = (0..2)
            .map(|r| {
                let (store, members) = (store.clone(), members.clone());
                loom::thread::spawn(move || {
                    let ag = Agreement::new(GroupId::WORLD, r, members, 3 + r as u64, never)
                        .waiting_for_everyone()
                        .with_standbys(&[3])
                        .settling_for(std::time::Duration::ZERO);
                    drive(
                        ag,
                        &store,
                        r,
                        None,
                        Decide::CompareAndSet,
                        &Evidence::default(),
                    )
                })
            })
            .collect();
        let standby = drive(
            Agreement::standby(GroupId::WORLD, 3, members.clone(), never),
            &store,
            3,
            None,
            Decide::CompareAndSet,
            &Evidence::default(),
        );
        let mut all = vec![standby];
        for t in threads {
            all.push(t.join().unwrap_or_else(|_| panic!("a rank panicked")));
        }
        for r in &all {
            match r {
                Some(Ok(d)) => {
                    assert_eq!(d.members, vec![0, 1, 3]);
                    assert_eq!(
                        (d.joined.clone(), d.replaced.clone()),
                        (vec![3], vec![(2, 3)])
                    );
                    assert_eq!(d.completed, 3);
                }
                other => panic!("{other:?}"),
            }
        }
    });
}
