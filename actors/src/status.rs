//! A running job's status, on demand: each rank's flight record (its last calls, see
//! [`CallRecord`]) read by [`Communicator::flight_record`] in the program, or asked of every
//! rank of a TCP job through its store ([`job_status`], which `collectix status` prints):
//! a rank of a TCP job answers on a thread of its own, with a store connection of its own,
//! that waits for the next request key.
//!
//! Through the store: the asker takes a request number `n` (`collectix/status/requests`, an
//! add) and sets `collectix/status/request/n`; each rank, waiting for that key, writes its
//! record under `collectix/status/n/rank/R`: its clock (`now ms`), one call a line (`group
//! seq state started_ms op text`, the state `pending`, `completed` or `failed:KIND`), then a
//! line per group of who came last to its calls (`collectix_runtime::lateness`): `late group
//! calls` and, for each member in group order, `global:last:total:max:recent` (times in
//! nanoseconds). The asker combines the members' views of each group
//! (`LatenessSummary::combined`) and names the member that came last most often; from all
//! of it, [`JobStatus::explain`] gives a verdict per rank and group
//! (`collectix_runtime::verdict`).

use crate::comm::Communicator;
pub use crate::rank::driver::recorder::{CallRecord, CallState, CALLS_KEPT};
use crate::rank::driver::Driver;
use crate::store::Store;
use collectix_runtime::lateness::{LatenessSummary, MemberLateness};
use collectix_runtime::verdict::{Answer, Explained, GroupView, RecentCall, Standing, Verdict};
use collectix_runtime::{Error, GroupId, Result};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

impl Communicator {
    /// This rank's flight record: its last [`CALLS_KEPT`] calls on any group, oldest first,
    /// each with its group, sequence number, collective, size, times and how it stands.
    pub fn flight_record(&self) -> Vec<CallRecord> {
        self.member.rank.driver.flight_record()
    }

    /// Who came last to this group's calls, as this rank saw them: per member, how often and
    /// by how much it came last (`collectix_runtime::lateness`), over the calls that went
    /// through the engine (not yet those on a board: a small call on a board is judged by
    /// nobody). One rank hears only the peers its schedules receive from;
    /// [`LatenessSummary::combined`] makes the group's view from every member's.
    pub fn lateness(&self) -> LatenessSummary {
        self.member
            .rank
            .driver
            .lateness(self.group_id())
            .map(|(_, s)| s)
            .unwrap_or_default()
    }
}

const REQUESTS: &str = "collectix/status/requests";

fn request_key(n: i64) -> String {
    format!("collectix/status/request/{n}")
}

fn answer_key(n: i64, rank: usize) -> String {
    format!("collectix/status/{n}/rank/{rank}")
}

/// The thread that answers status requests for one rank of a TCP job; it stops within a
/// second of being dropped.
pub(crate) struct Responder {
    stop: Arc<AtomicBool>,
}

impl Drop for Responder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

impl Responder {
    /// Starts answering for rank `rank` (whose engine `driver` has), through `store` (a
    /// connection of the responder's own: its waits hold the connection).
    pub(crate) fn start(rank: usize, driver: Arc<Driver>, store: Box<dyn Store>) -> Responder {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let _ = std::thread::Builder::new()
            .name(format!("collectix-status-{rank}"))
            .spawn(move || {
                // Requests made before this rank came are not for it.
                let mut next = store.add(REQUESTS, 0).unwrap_or(0) + 1;
                while !flag.load(Ordering::SeqCst) {
                    let key = request_key(next);
                    match store.wait(&[key.as_str()], Duration::from_secs(1)) {
                        Ok(()) => {
                            let now_us = driver.now().as_nanos() / 1000;
                            let mut text = format!("{NOW}{now_us}\n");
                            for r in driver.flight_record() {
                                let seq = r.seq.map_or("-".to_string(), |s| s.to_string());
                                let state = match r.state {
                                    CallState::Pending => "pending".to_string(),
                                    CallState::Completed => "completed".to_string(),
                                    CallState::Failed(_) => {
                                        format!("failed:{}", r.error_kind.unwrap_or("unknown"))
                                    }
                                };
                                text.push_str(&format!(
                                    "{} {seq} {state} {:.1} {} {r}\n",
                                    r.group, r.started_ms, r.op
                                ));
                            }
                            for (g, members, s) in driver.lateness_all() {
                                text.push_str(&late_line(g, &members, &s));
                            }
                            if store
                                .set(&answer_key(next, rank), text.into_bytes())
                                .is_err()
                            {
                                return;
                            }
                            next += 1;
                        }
                        Err(Error::StoreTimeout { .. }) => {}
                        Err(_) => return,
                    }
                }
            });
        Responder { stop }
    }
}

const LATE: &str = "late ";
const NOW: &str = "now ";

/// A rank's view of who came last to group `g`'s calls, as a line of its status answer.
fn late_line(g: GroupId, members: &[usize], s: &LatenessSummary) -> String {
    let mut line = format!("{LATE}{g} {}", s.calls);
    for (i, &global) in members.iter().enumerate() {
        let m = s.members.get(i).cloned().unwrap_or_default();
        let ns = |d: Duration| d.as_nanos();
        line.push_str(&format!(
            " {global}:{}:{}:{}:{}",
            m.last,
            ns(m.total),
            ns(m.max),
            ns(m.recent)
        ));
    }
    line.push('\n');
    line
}

/// A view read back from [`late_line`]'s text (after `late `): the group, its members (global
/// ranks, in group order) and the summary; `None` if the line does not parse.
fn parse_late(line: &str) -> Option<(String, Vec<usize>, LatenessSummary)> {
    let mut w = line.split(' ');
    let group = w.next()?.to_string();
    let calls = w.next()?.parse().ok()?;
    let mut members = Vec::new();
    let mut records = Vec::new();
    for tok in w {
        let f: Vec<u64> = tok
            .split(':')
            .map(str::parse)
            .collect::<std::result::Result<_, _>>()
            .ok()?;
        let [global, last, total, max, recent] = f[..] else {
            return None;
        };
        members.push(usize::try_from(global).ok()?);
        records.push(MemberLateness {
            last,
            total: Duration::from_nanos(total),
            max: Duration::from_nanos(max),
            recent: Duration::from_nanos(recent),
        });
    }
    Some((
        group,
        members,
        LatenessSummary {
            calls,
            members: records,
            last: None,
        },
    ))
}

/// One rank's answer to a status request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankStatus {
    /// The rank.
    pub rank: usize,
    /// Its last calls, a line each, oldest first (`None`: it did not answer in time: dead,
    /// frozen, or not started).
    pub calls: Option<Vec<String>>,
    /// Its view of who came last to each group's calls, a line each (the answer's `late`
    /// lines, without the word).
    pub lateness: Vec<String>,
    /// Its clock when it answered, in microseconds (the calls' times are on it).
    pub now_us: Option<u64>,
}

/// A job's status: each rank's last calls, and who is behind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobStatus {
    /// Each rank's answer, in rank order.
    pub ranks: Vec<RankStatus>,
    /// Findings, a line each: ranks behind the others in a group's calls, ranks that did not
    /// answer.
    pub findings: Vec<String>,
}

/// Asks every rank of a job of `world` ranks (through its `store`) for its flight record,
/// waits at most `within` for the answers, and says who is behind in which call.
pub fn job_status(store: &dyn Store, world: usize, within: Duration) -> Result<JobStatus> {
    let n = store.add(REQUESTS, 1)?;
    store.set(&request_key(n), Vec::new())?;
    let deadline = crate::sync::deadline_after(within);
    let mut answers: BTreeMap<usize, String> = BTreeMap::new();
    while answers.len() < world && Instant::now() < deadline {
        let missing: Vec<usize> = (0..world).filter(|r| !answers.contains_key(r)).collect();
        for r in missing {
            let key = answer_key(n, r);
            if store.check(&[key.as_str()])? {
                let text = store.get(&key, Duration::from_secs(1))?;
                answers.insert(r, String::from_utf8_lossy(&text).into_owned());
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let ranks: Vec<RankStatus> = (0..world)
        .map(|rank| {
            let lines = answers.get(&rank).map(|t| t.lines());
            RankStatus {
                rank,
                calls: lines.clone().map(|l| {
                    l.filter(|l| !l.starts_with(LATE) && !l.starts_with(NOW))
                        .map(str::to_string)
                        .collect()
                }),
                now_us: lines
                    .clone()
                    .into_iter()
                    .flatten()
                    .find_map(|l| l.strip_prefix(NOW)?.parse().ok()),
                lateness: lines
                    .into_iter()
                    .flatten()
                    .filter_map(|l| l.strip_prefix(LATE))
                    .map(str::to_string)
                    .collect(),
            }
        })
        .collect();
    let members: BTreeMap<String, Vec<usize>> = group_views(&ranks)
        .into_iter()
        .map(|(g, (m, _))| (g, m))
        .collect();
    let mut status = JobStatus {
        findings: findings(&ranks, &members),
        ranks,
    };
    status.findings.extend(late_findings(&status.ranks));
    status.findings.extend(cycle_findings(&status));
    Ok(status)
}

/// How long a call must have been in flight for plain `collectix status` to count it stuck
/// on a wait cycle (`--explain` takes `--stuck-ms`).
const CYCLE_STUCK_AFTER: Duration = Duration::from_secs(1);

/// The wait cycles across groups that the verdicts find, once each: `wait cycle: rank 0 waits
/// in group A #0 for rank 2, rank 2 waits in group B #0 for rank 0`.
fn cycle_findings(status: &JobStatus) -> Vec<String> {
    let mut seen: Vec<Vec<(usize, String, u64)>> = Vec::new();
    let mut out = Vec::new();
    for v in status.verdicts(CYCLE_STUCK_AFTER) {
        let Verdict::Cycle { cycle, .. } = &v.verdict else {
            continue;
        };
        let mut key: Vec<(usize, String, u64)> = cycle
            .iter()
            .map(|w| (w.rank, w.group.clone(), w.seq))
            .collect();
        key.sort();
        if seen.contains(&key) {
            continue;
        }
        seen.push(key);
        out.push(format!(
            "wait cycle: {}",
            collectix_runtime::verdict::cycle_text(cycle)
        ));
    }
    out
}

impl JobStatus {
    /// One verdict per rank and group (`collectix_runtime::verdict`): healthy, slow, stuck
    /// (in a call for `stuck_after` or more), on a wait cycle, mismatch, failed or dead; also
    /// set as the gauge `collectix_verdict{group, rank}` (0 healthy, 1 slow, 2 stuck, 3
    /// mismatch, 4 dead, 5 a wait cycle, 6 failed) where a metrics recorder is installed.
    pub fn explain(&self, stuck_after: Duration) -> Vec<Explained> {
        let verdicts = self.verdicts(stuck_after);
        for v in &verdicts {
            metrics::gauge!("collectix_verdict", "group" => v.group.clone(), "rank" => v.rank.to_string())
                .set(f64::from(v.verdict.code()));
        }
        verdicts
    }

    /// [`explain`](Self::explain) without setting the gauge.
    fn verdicts(&self, stuck_after: Duration) -> Vec<Explained> {
        let answers: Vec<Option<Answer>> = self
            .ranks
            .iter()
            .map(|r| {
                let calls = r.calls.as_ref()?;
                Some(Answer {
                    now_ms: r.now_us.unwrap_or(0) as f64 / 1e3,
                    calls: calls.iter().filter_map(|l| recent_call(l)).collect(),
                })
            })
            .collect();
        let mut groups: BTreeMap<String, GroupView> = group_views(&self.ranks)
            .into_iter()
            .map(|(g, (members, views))| {
                let lateness = LatenessSummary::combined(&views);
                (g, GroupView { members, lateness })
            })
            .collect();
        // A group no rank listed (aborted, or destroyed): the world is every rank; another,
        // the ranks whose calls name it.
        for (r, a) in answers.iter().enumerate() {
            for c in a.iter().flat_map(|a| &a.calls) {
                let g = groups.entry(c.group.clone()).or_insert_with(|| GroupView {
                    members: if c.group == GroupId::WORLD.to_string() {
                        (0..self.ranks.len()).collect()
                    } else {
                        Vec::new()
                    },
                    lateness: LatenessSummary::default(),
                });
                if !g.members.contains(&r) {
                    g.members.push(r);
                    g.members.sort_unstable();
                }
            }
        }
        collectix_runtime::verdict::explain(&answers, &groups, stuck_after)
    }
}

/// A call line of an answer (`group seq state started_ms op text`), if it is a collective's.
fn recent_call(line: &str) -> Option<RecentCall> {
    let mut w = line.splitn(6, ' ');
    let group = w.next()?.to_string();
    let seq = w.next()?.parse().ok()?;
    let state = w.next()?;
    let started_ms = w.next()?.parse().ok()?;
    let what = w.next()?.to_string();
    let text = w.next().unwrap_or_default();
    let standing = match state {
        "pending" => Standing::Pending,
        "completed" => Standing::Completed,
        s => Standing::Failed {
            kind: s.strip_prefix("failed:").unwrap_or(s).to_string(),
            // The record's text: "group G #S op ... : failed ...: <error>".
            text: text
                .split_once(": failed")
                .and_then(|(_, e)| e.split_once(": "))
                .map_or(text, |(_, e)| e)
                .to_string(),
        },
    };
    Some(RecentCall {
        group,
        seq,
        what,
        started_ms,
        standing,
    })
}

/// Each group's members and their views of who came last, from the ranks' `late` lines: group
/// → (members, views by group rank).
fn group_views(ranks: &[RankStatus]) -> BTreeMap<String, (Vec<usize>, Vec<LatenessSummary>)> {
    let mut groups: BTreeMap<String, (Vec<usize>, Vec<LatenessSummary>)> = BTreeMap::new();
    for r in ranks {
        for line in &r.lateness {
            let Some((g, members, view)) = parse_late(line) else {
                continue;
            };
            let Some(at) = members.iter().position(|&m| m == r.rank) else {
                continue;
            };
            let e = groups
                .entry(g)
                .or_insert_with(|| (members.clone(), Vec::new()));
            if e.0 != members {
                continue;
            }
            if e.1.len() < members.len() {
                e.1.resize(members.len(), LatenessSummary::default());
            }
            e.1[at] = view;
        }
    }
    groups
}

/// Who came last most often to each group's calls, from every rank's view (by at least
/// `lateness::NOTABLE`): `group world: rank 2 came last in 40 of 40 calls, 50.1 ms late on
/// average (48.0 ms the last time)`; only the group's culprit
/// ([`LatenessSummary::culprit`]: late in more than one call and in more than half).
fn late_findings(ranks: &[RankStatus]) -> Vec<String> {
    let mut out = Vec::new();
    for (g, (members, views)) in group_views(ranks) {
        let all = LatenessSummary::combined(&views);
        if let Some((m, rec)) = all.culprit() {
            let ms = |d: Duration| d.as_secs_f64() * 1e3;
            out.push(format!(
                "group {g}: rank {} came last in {} of {} calls, {:.1} ms late on average ({:.1} ms the last time)",
                members.get(m).copied().unwrap_or(m),
                rec.last,
                all.calls,
                ms(rec.mean()),
                ms(rec.recent)
            ));
        }
    }
    out
}

/// Who is behind: for each group, each rank's latest call (the highest sequence number in
/// its record); a rank whose latest is below another's is behind, and a call in flight on a
/// rank that another has not reached waits for it.
fn findings(ranks: &[RankStatus], members: &BTreeMap<String, Vec<usize>>) -> Vec<String> {
    // group → rank → (latest seq, its state)
    let mut latest: BTreeMap<String, BTreeMap<usize, (u64, String)>> = BTreeMap::new();
    let mut out = Vec::new();
    for r in ranks {
        let Some(calls) = &r.calls else {
            out.push(format!(
                "rank {} did not answer (dead, frozen, or not started)",
                r.rank
            ));
            continue;
        };
        for line in calls {
            let mut w = line.split(' ');
            let (Some(g), Some(seq), Some(state)) = (w.next(), w.next(), w.next()) else {
                continue;
            };
            let Ok(seq) = seq.parse::<u64>() else {
                continue;
            };
            let e = latest.entry(g.to_string()).or_default();
            let slot = e.entry(r.rank).or_insert((seq, state.to_string()));
            if seq >= slot.0 {
                *slot = (seq, state.to_string());
            }
        }
    }
    for (g, per_rank) in &latest {
        let Some(top) = per_rank.values().map(|(s, _)| *s).max() else {
            continue;
        };
        let mut behind: Vec<String> = per_rank
            .iter()
            .filter(|(_, (s, _))| *s < top)
            .map(|(r, (s, st))| format!("rank {r} (at #{s}, {st})"))
            .collect();
        // A member that answered with no call on the group is behind too (every rank is in
        // the world; another group's members are known from the members' answers).
        let world = *g == GroupId::WORLD.to_string();
        let member = |r: usize| world || members.get(g).is_some_and(|m| m.contains(&r));
        behind.extend(
            ranks
                .iter()
                .filter(|r| r.calls.is_some() && !per_rank.contains_key(&r.rank) && member(r.rank))
                .map(|r| format!("rank {} (no call yet)", r.rank)),
        );
        if !behind.is_empty() {
            let waiting: Vec<usize> = per_rank
                .iter()
                .filter(|(_, (s, st))| *s == top && st == "pending")
                .map(|(r, _)| *r)
                .collect();
            out.push(format!(
                "group {g}: behind call #{top}: {}; waiting in it: ranks {waiting:?}",
                behind.join(", ")
            ));
        }
    }
    out
}
