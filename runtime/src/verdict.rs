//! One verdict per rank and group of a job, from what its ranks answered to a status request
//! (`collectix status --explain`): each rank's recent calls with how they stand, its clock,
//! and the group's late-comers (`crate::lateness`).
//!
//! The verdict of rank `r` on group `g`, the first that holds:
//! - **dead**: `r` did not answer (dead, frozen, or not started);
//! - **mismatch**: `r`'s latest call on `g` failed because the ranks disagreed about it;
//! - **cycle**: `r` is stuck (below) in a call of `g` and on a wait cycle across groups:
//!   following "stuck in a call, waiting for a member that has not reached it and is stuck
//!   in a call of its own" from `r` comes back to `r` (the cycle that, once a call on it times
//!   out, fails with `Error::WaitCycle`; shown here while it forms);
//! - **stuck**: `r`'s latest call on `g` has been in flight for at least the threshold,
//!   waiting for the members that have not reached it (or did not answer);
//! - **failed**: `r`'s latest call on `g` failed otherwise (a timeout, a lost peer, ...);
//! - **slow**: a member is stuck in a call of `g` that `r` has not reached, or `r` is the
//!   group's late-comer (`LatenessSummary::culprit` of the members' views together);
//! - **healthy** otherwise.
//!

use crate::lateness::{LatenessSummary, MemberLateness};
use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

/// How one of a rank's recent calls stands.
#[derive(Clone, Debug, PartialEq)]
pub enum Standing {
    /// In flight.
    Pending,
    /// Completed.
    Completed,
    /// Failed: its error's kind (`Error::kind_name` of the root cause) and text.
    Failed {
        /// The kind, as `Error::kind_name` says it (`mismatch`, `timeout`, ...).
        kind: String,
        /// The error's text.
        text: String,
    },
}

/// One of a rank's recent collective calls on a group.
#[derive(Clone, Debug, PartialEq)]
pub struct RecentCall {
    /// The group, as its id prints.
    pub group: String,
    /// The call's sequence number in the group.
    pub seq: u64,
    /// What it is (`all_reduce`).
    pub what: String,
    /// When it started, in milliseconds of the rank's clock.
    pub started_ms: f64,
    /// How it stands.
    pub standing: Standing,
}

/// What one rank answered.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Answer {
    /// Its clock when it answered, in milliseconds.
    pub now_ms: f64,
    /// Its recent collective calls, oldest first.
    pub calls: Vec<RecentCall>,
}

/// One group of the job.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GroupView {
    /// Its members, global ranks in group order.
    pub members: Vec<usize>,
    /// Its late-comers, the members' views together (`LatenessSummary::combined`).
    pub lateness: LatenessSummary,
}

/// One wait of a cycle as the answers show it: `rank` is stuck in call `seq` of `group`,
/// which `peer` has not reached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CycleWait {
    /// The waiting rank.
    pub rank: usize,
    /// The group of its call.
    pub group: String,
    /// The call.
    pub seq: u64,
    /// The rank it waits for.
    pub peer: usize,
}

impl fmt::Display for CycleWait {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "rank {} waits in group {} #{} for rank {}",
            self.rank, self.group, self.seq, self.peer
        )
    }
}

/// A cycle's waits in words, joined by ", ".
pub fn cycle_text(cycle: &[CycleWait]) -> String {
    let waits: Vec<String> = cycle.iter().map(ToString::to_string).collect();
    waits.join(", ")
}

/// A verdict on one rank in one group.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// Nothing wrong seen.
    Healthy,
    /// The group's late-comer: it came last in most calls (its record), or it has not
    /// reached a call other members are stuck in (`holding`: the call and who waits in it).
    Slow {
        /// Its record as the late-comer, and the calls judged.
        late: Option<(MemberLateness, u64)>,
        /// The call it has not reached, and the members stuck in it.
        holding: Option<(u64, Vec<usize>)>,
    },
    /// Stuck in a call, on a wait cycle across groups.
    Cycle {
        /// The call.
        seq: u64,
        /// What it is.
        what: String,
        /// How long it has been in it.
        waited: Duration,
        /// The waits around the cycle, from this rank's.
        cycle: Vec<CycleWait>,
    },
    /// In a call for at least the threshold.
    Stuck {
        /// The call.
        seq: u64,
        /// What it is.
        what: String,
        /// How long it has been in it.
        waited: Duration,
        /// The members that have not reached it or did not answer.
        waiting_for: Vec<usize>,
    },
    /// Its latest call failed because the ranks disagreed about it.
    Mismatch {
        /// The call.
        seq: u64,
        /// The error's text.
        text: String,
    },
    /// Its latest call failed otherwise.
    Failed {
        /// The call.
        seq: u64,
        /// The error's kind.
        kind: String,
        /// The error's text.
        text: String,
    },
    /// It did not answer.
    Dead,
}

impl Verdict {
    /// The verdict in one word: `healthy`, `slow`, `stuck`, `cycle`, `mismatch`, `failed`,
    /// `dead`.
    pub fn word(&self) -> &'static str {
        match self {
            Verdict::Healthy => "healthy",
            Verdict::Slow { .. } => "slow",
            Verdict::Stuck { .. } => "stuck",
            Verdict::Cycle { .. } => "cycle",
            Verdict::Mismatch { .. } => "mismatch",
            Verdict::Failed { .. } => "failed",
            Verdict::Dead => "dead",
        }
    }

    /// The verdict as a gauge's value: 0 healthy, 1 slow, 2 stuck, 3 mismatch, 4 dead, 5 a
    /// wait cycle, 6 failed.
    pub fn code(&self) -> u8 {
        match self {
            Verdict::Healthy => 0,
            Verdict::Slow { .. } => 1,
            Verdict::Stuck { .. } => 2,
            Verdict::Mismatch { .. } => 3,
            Verdict::Dead => 4,
            Verdict::Cycle { .. } => 5,
            Verdict::Failed { .. } => 6,
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        match self {
            Verdict::Healthy => f.write_str("healthy"),
            Verdict::Slow {
                holding: Some((seq, waiters)),
                ..
            } => write!(
                f,
                "slow: has not reached call #{seq}, which ranks {waiters:?} wait in"
            ),
            Verdict::Slow {
                late: Some((r, calls)),
                ..
            } => write!(
                f,
                "slow: came last in {} of {calls} calls, {:.1} ms late on average ({:.1} ms the last time)",
                r.last,
                ms(r.mean()),
                ms(r.recent)
            ),
            Verdict::Slow { .. } => f.write_str("slow"),
            Verdict::Stuck {
                seq,
                what,
                waited,
                waiting_for,
            } => {
                write!(
                    f,
                    "stuck in call #{seq} ({what}) for {:.1} s",
                    waited.as_secs_f64()
                )?;
                if waiting_for.is_empty() {
                    f.write_str(", every member in it")
                } else {
                    write!(f, ", waiting for ranks {waiting_for:?}")
                }
            }
            Verdict::Cycle {
                seq,
                what,
                waited,
                cycle,
            } => {
                write!(
                    f,
                    "wait cycle: stuck in call #{seq} ({what}) for {:.1} s; ",
                    waited.as_secs_f64()
                )?;
f.write_str(&cycle_text(cycle))
            }
            Verdict::Mismatch { seq, text } => write!(f, "mismatch at call #{seq}: {text}"),
            Verdict::Failed { seq, kind, text } => {
                write!(f, "failed at call #{seq} ({kind}): {text}")
            }
            Verdict::Dead => f.write_str("dead: did not answer"),
        }
    }
}

/// One verdict.
#[derive(Clone, Debug, PartialEq)]
pub struct Explained {
    /// The rank (global).
    pub rank: usize,
    /// The group, as its id prints.
    pub group: String,
    /// The verdict.
    pub verdict: Verdict,
}

impl fmt::Display for Explained {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "rank {}, group {}: {}",
            self.rank, self.group, self.verdict
        )
    }
}

/// Each rank's latest call on a group, if it made one.
fn latest<'a>(a: &'a Answer, group: &str) -> Option<&'a RecentCall> {
    a.calls
        .iter()
        .filter(|c| c.group == group)
        .max_by_key(|c| c.seq)
}

/// The verdicts of every member of every group (module doc): `answers[r]` is rank `r`'s
/// answer (`None`: it did not answer), `groups` the job's groups by name; a call in flight
/// for `stuck_after` or more is stuck. In group order, then rank order.
pub fn explain(
    answers: &[Option<Answer>],
    groups: &BTreeMap<String, GroupView>,
    stuck_after: Duration,
) -> Vec<Explained> {
    let cycles = wait_cycles(answers, groups, stuck_after);
    let mut out = Vec::new();
    for (g, view) in groups {
        // Each member's latest call on the group, and who is stuck in which call.
        let latest_of = |m: usize| {
            answers
                .get(m)
                .and_then(Option::as_ref)
                .map(|a| latest(a, g))
        };
        let stuck: Vec<(usize, u64)> = view
            .members
            .iter()
            .filter_map(|&m| {
                let a = answers.get(m)?.as_ref()?;
                let c = latest(a, g)?;
                let waited = a.now_ms - c.started_ms;
                (c.standing == Standing::Pending && waited >= stuck_after.as_secs_f64() * 1e3)
                    .then_some((m, c.seq))
            })
            .collect();
        let culprit = view.lateness.culprit().map(|(i, r)| (i, r.clone()));
        for (i, &m) in view.members.iter().enumerate() {
            let on_cycle = cycles
                .get(&m)
                .filter(|c| c.first().is_some_and(|w| w.group == *g));
            let verdict = match (answers.get(m).and_then(Option::as_ref), on_cycle) {
                (None, _) => Verdict::Dead,
                (Some(a), Some(cycle)) => {
                    let c = latest(a, g);
                    Verdict::Cycle {
                        seq: c.map_or(0, |c| c.seq),
                        what: c.map(|c| c.what.clone()).unwrap_or_default(),
                        waited: Duration::from_secs_f64(
                            c.map_or(0.0, |c| (a.now_ms - c.started_ms).max(0.0) / 1e3),
                        ),
                        cycle: cycle.clone(),
                    }
                }
                (Some(a), None) => {
                    let here = Member { m, i, view };
                    judge(
                        a,
                        latest(a, g),
                        here,
                        &stuck,
                        &culprit,
                        &latest_of,
                        stuck_after,
                    )
                }
            };
            out.push(Explained {
                rank: m,
                group: g.clone(),
                verdict,
            });
        }
    }
    out
}

/// The wait cycles the answers show, by rank on one: the waits around it from that rank's
/// (module doc). A rank is taken as waiting for a member of a group it is stuck in that has
/// not reached its call and is stuck in a call itself.
fn wait_cycles(
    answers: &[Option<Answer>],
    groups: &BTreeMap<String, GroupView>,
    stuck_after: Duration,
) -> BTreeMap<usize, Vec<CycleWait>> {
    let threshold = stuck_after.as_secs_f64() * 1e3;
    // Each rank's stuck calls: (group, seq).
    let stuck: BTreeMap<usize, Vec<(&str, u64)>> = answers
        .iter()
        .enumerate()
        .filter_map(|(r, a)| {
            let a = a.as_ref()?;
            let calls: Vec<(&str, u64)> = groups
                .keys()
                .filter_map(|g| {
                    let c = latest(a, g)?;
                    (c.standing == Standing::Pending && a.now_ms - c.started_ms >= threshold)
                        .then_some((g.as_str(), c.seq))
                })
                .collect();
            (!calls.is_empty()).then_some((r, calls))
        })
        .collect();
    let not_reached = |o: usize, g: &str, seq: u64| {
        answers
            .get(o)
            .and_then(Option::as_ref)
            .is_some_and(|a| latest(a, g).is_none_or(|l| l.seq < seq))
    };
    // The waits out of each stuck rank.
    let edges: BTreeMap<usize, Vec<CycleWait>> = stuck
        .iter()
        .map(|(&r, calls)| {
            let out = calls
                .iter()
                .flat_map(|&(g, seq)| {
                    let members = groups.get(g).map(|v| v.members.clone()).unwrap_or_default();
                    members
                        .into_iter()
                        .filter(move |&o| o != r)
                        .map(move |o| (g, seq, o))
                })
                .filter(|&(g, seq, o)| stuck.contains_key(&o) && not_reached(o, g, seq))
                .map(|(g, seq, o)| CycleWait {
                    rank: r,
                    group: g.to_string(),
                    seq,
                    peer: o,
                })
                .collect();
            (r, out)
        })
        .collect();
    // From each rank, a breadth-first search for a way back to it.
    let mut found = BTreeMap::new();
    for &start in edges.keys() {
        let mut via: BTreeMap<usize, CycleWait> = BTreeMap::new();
        let mut queue = std::collections::VecDeque::from([start]);
        let mut closing = None;
        while let Some(r) = queue.pop_front() {
            for w in edges.get(&r).into_iter().flatten() {
                if w.peer == start {
                    closing = Some(w.clone());
                    break;
                }
                if let std::collections::btree_map::Entry::Vacant(e) = via.entry(w.peer) {
                    e.insert(w.clone());
                    queue.push_back(w.peer);
                }
            }
            if closing.is_some() {
                break;
            }
        }
        let Some(last) = closing else {
            continue;
        };
        let mut cycle = vec![last];
        while let Some(w) = cycle.last().and_then(|w| via.get(&w.rank)) {
            if w.rank == start || cycle.len() > edges.len() {
                cycle.push(w.clone());
                break;
            }
            cycle.push(w.clone());
        }
        cycle.reverse();
        found.insert(start, cycle);
    }
    found
}

/// A member being judged: its global rank `m`, its group rank `i`, its group.
struct Member<'v> {
    m: usize,
    i: usize,
    view: &'v GroupView,
}

/// The verdict of a member, which answered `a`, its latest call on the group `last`; `stuck`
/// are the members stuck in a call of the group, and which (module doc).
fn judge<'a>(
    a: &Answer,
    last: Option<&RecentCall>,
    Member { m, i, view }: Member<'_>,
    stuck: &[(usize, u64)],
    culprit: &Option<(usize, MemberLateness)>,
    latest_of: &impl Fn(usize) -> Option<Option<&'a RecentCall>>,
    stuck_after: Duration,
) -> Verdict {
    if let Some(c) = last {
        match &c.standing {
            Standing::Failed { kind, text } if kind == "mismatch" || kind == "size_mismatch" => {
                return Verdict::Mismatch {
                    seq: c.seq,
                    text: text.clone(),
                }
            }
            Standing::Pending => {
                let waited_ms = (a.now_ms - c.started_ms).max(0.0);
                if waited_ms >= stuck_after.as_secs_f64() * 1e3 {
                    let waiting_for = view
                        .members
                        .iter()
                        .copied()
                        .filter(|&o| o != m)
                        .filter(|&o| match latest_of(o) {
                            None => true,
                            Some(l) => l.is_none_or(|l| l.seq < c.seq),
                        })
                        .collect();
                    return Verdict::Stuck {
                        seq: c.seq,
                        what: c.what.clone(),
                        waited: Duration::from_secs_f64(waited_ms / 1e3),
                        waiting_for,
                    };
                }
            }
            Standing::Failed { kind, text } => {
                return Verdict::Failed {
                    seq: c.seq,
                    kind: kind.clone(),
                    text: text.clone(),
                }
            }
            Standing::Completed => {}
        }
    }
    // A call others are stuck in that this member has not reached.
    let mine = last.map(|c| c.seq);
    if let Some(&(_, seq)) = stuck
        .iter()
        .filter(|(o, s)| *o != m && mine.is_none_or(|x| x < *s))
        .min_by_key(|(_, s)| *s)
    {
        let waiters = stuck
            .iter()
            .filter(|(_, s)| *s == seq)
            .map(|(o, _)| *o)
            .collect();
        return Verdict::Slow {
            late: None,
            holding: Some((seq, waiters)),
        };
    }
    match culprit {
        Some((c, r)) if *c == i => Verdict::Slow {
            late: Some((r.clone(), view.lateness.calls)),
            holding: None,
        },
        _ => Verdict::Healthy,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(seq: u64, started_ms: f64, standing: Standing) -> RecentCall {
        RecentCall {
            group: "world".into(),
            seq,
            what: "barrier".into(),
            started_ms,
            standing,
        }
    }

    fn world(n: usize) -> BTreeMap<String, GroupView> {
        BTreeMap::from([(
            "world".to_string(),
            GroupView {
                members: (0..n).collect(),
                lateness: LatenessSummary::default(),
            },
        )])
    }

    fn words(v: &[Explained]) -> Vec<&'static str> {
        v.iter().map(|e| e.verdict.word()).collect()
    }

    #[test]
    fn ranks_whose_calls_completed_are_healthy_and_one_that_did_not_answer_is_dead() {
        let done = Answer {
            now_ms: 10.0,
            calls: vec![call(0, 1.0, Standing::Completed)],
        };
        let v = explain(
            &[Some(done.clone()), Some(done), None],
            &world(3),
            Duration::from_secs(1),
        );
        assert_eq!(words(&v), ["healthy", "healthy", "dead"]);
        assert_eq!(
            v[2].to_string(),
            "rank 2, group world: dead: did not answer"
        );
    }

    #[test]
    fn ranks_in_a_call_one_has_not_reached_are_stuck_and_it_is_slow() {
        let waiting = Answer {
            now_ms: 2_500.0,
            calls: vec![
                call(1, 1.0, Standing::Completed),
                call(2, 1_000.0, Standing::Pending),
            ],
        };
        let behind = Answer {
            now_ms: 2_500.0,
            calls: vec![call(1, 1.0, Standing::Completed)],
        };
        let v = explain(
            &[Some(waiting.clone()), Some(waiting.clone()), Some(behind)],
            &world(3),
            Duration::from_secs(1),
        );
        assert_eq!(words(&v), ["stuck", "stuck", "slow"]);
        assert_eq!(
            v[0].to_string(),
            "rank 0, group world: stuck in call #2 (barrier) for 1.5 s, waiting for ranks [2]"
        );
        assert_eq!(
            v[2].to_string(),
            "rank 2, group world: slow: has not reached call #2, which ranks [0, 1] wait in"
        );
        // Under the threshold, a call in flight is not stuck.
        let v = explain(
            &[Some(waiting.clone()), Some(waiting), None],
            &world(3),
            Duration::from_secs(2),
        );
        assert_eq!(words(&v), ["healthy", "healthy", "dead"]);
    }

    #[test]
    fn a_mismatched_call_and_another_failure_are_told_apart() {
        let failed = |kind: &str| Answer {
            now_ms: 5.0,
            calls: vec![call(
                3,
                1.0,
                Standing::Failed {
                    kind: kind.into(),
                    text: format!("a {kind}"),
                },
            )],
        };
        let v = explain(
            &[Some(failed("mismatch")), Some(failed("timeout"))],
            &world(2),
            Duration::from_secs(1),
        );
        assert_eq!(words(&v), ["mismatch", "failed"]);
        assert_eq!(
            v[0].to_string(),
            "rank 0, group world: mismatch at call #3: a mismatch"
        );
    }

    #[test]
    fn the_groups_late_comer_is_slow_with_its_lateness() {
        let done = Answer {
            now_ms: 10.0,
            calls: vec![call(9, 1.0, Standing::Completed)],
        };
        let mut groups = world(3);
        if let Some(g) = groups.get_mut("world") {
            g.lateness = LatenessSummary {
                calls: 10,
                members: vec![
                    MemberLateness::default(),
                    MemberLateness {
                        last: 10,
                        total: Duration::from_millis(300),
                        max: Duration::from_millis(32),
                        recent: Duration::from_millis(28),
                    },
                    MemberLateness::default(),
                ],
                last: None,
            };
        }
        let v = explain(
            &[Some(done.clone()), Some(done.clone()), Some(done)],
            &groups,
            Duration::from_secs(1),
        );
        assert_eq!(words(&v), ["healthy", "slow", "healthy"]);
        assert_eq!(
            v[1].to_string(),
            "rank 1, group world: slow: came last in 10 of 10 calls, 30.0 ms late on average (28.0 ms the last time)"
        );
        assert_eq!(v[1].verdict.code(), 1);
    }

    /// Rank 0 stuck in group a's call #0, which rank 1 has not reached; rank 1 stuck in group
    /// b's call #0, which rank 0 has not reached: both on the cycle in their own calls' group,
    /// slow in the other (each holds the other's call). Rank 2, stuck in a's next call
    /// waiting for both, is stuck, not on the cycle. Before the threshold, no cycle.
    #[test]
    fn ranks_stuck_waiting_for_each_other_across_groups_are_on_a_cycle() {
        let on = |g: &str, seq: u64, standing: Standing| RecentCall {
            group: g.into(),
            seq,
            what: "all_reduce".into(),
            started_ms: 100.0,
            standing,
        };
        let a0 = Answer {
            now_ms: 1_600.0,
            calls: vec![on("a", 0, Standing::Pending)],
        };
        let a1 = Answer {
            now_ms: 1_600.0,
            calls: vec![on("b", 0, Standing::Pending)],
        };
        let a2 = Answer {
            now_ms: 1_600.0,
            calls: vec![
                on("a", 0, Standing::Completed),
                on("a", 1, Standing::Pending),
            ],
        };
        let view = |members: Vec<usize>| GroupView {
            members,
            lateness: LatenessSummary::default(),
        };
        let groups = BTreeMap::from([
            ("a".to_string(), view(vec![0, 1, 2])),
            ("b".to_string(), view(vec![0, 1])),
        ]);
        let answers = [Some(a0), Some(a1), Some(a2)];
        let v = explain(&answers, &groups, Duration::from_secs(1));
        let by = |rank: usize, g: &str| {
            v.iter()
                .find(|e| e.rank == rank && e.group == g)
                .map(|e| e.verdict.clone())
                .unwrap_or(Verdict::Dead)
        };
        let (c0, c1) = (by(0, "a"), by(1, "b"));
        assert_eq!((c0.word(), c1.word(), c0.code()), ("cycle", "cycle", 5));
        assert_eq!(
            c0.to_string(),
            "wait cycle: stuck in call #0 (all_reduce) for 1.5 s; rank 0 waits in group a #0 for rank 1, rank 1 waits in group b #0 for rank 0"
        );
        assert!(
            c1.to_string().ends_with(
                "rank 1 waits in group b #0 for rank 0, rank 0 waits in group a #0 for rank 1"
            ),
            "{c1}"
        );
        assert_eq!((by(0, "b").word(), by(1, "a").word()), ("slow", "slow"));
        assert_eq!(by(2, "a").word(), "stuck");
        let early = explain(&answers, &groups, Duration::from_secs(2));
        assert!(
            early.iter().all(|e| e.verdict.word() != "cycle"),
            "{early:?}"
        );
    }
}
