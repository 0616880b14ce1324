//! Faults under the seeded simulator: a rank lost mid-collective (isolated with a failure
//! detector, killed, or partitioned with none), a rank that never calls, and a mismatch. The
//! promise checked: every other rank ends — never a hang — with the right result or an error
//! that names the culprit, within the time the failure takes to be noticed and propagated.
//!
//! Which error: a rank whose remaining schedule talks to the lost rank gets
//! `PeerLost { rank }`; the others get `GroupAborted` whose root cause is that `PeerLost`.
//! "Remaining schedule" is judged by the simulator's own model of each call (its schedule and
//! the messages delivered to it: [`Sim::talks_to`], [`Sim::awaited`]), not by the engine.
//!
//! Each failure message carries the case and the trace (seed first): rerunning the case with
//! that seed replays it.

use collectix_runtime::group::{CallOptions, GroupId, GroupOptions};
use collectix_runtime::testing::sim::{Rng, Sim, SimOptions, TraceEvent};
use collectix_runtime::testing::{reduces, rooted, Case, COLLECTIVES};
use collectix_runtime::OpKind;
use collectix_runtime::{DType, Error, OpId, ReduceOp, Time};
use proptest::prelude::*;
use proptest::test_runner::{FileFailurePersistence, TestCaseError};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// The calls' timeout (virtual time costs nothing, so it is long next to the network's).
const TIMEOUT: Duration = Duration::from_millis(50);

/// How long a rank whose call timed out waits for the desync report's answers (the group's
/// default `desync_grace`).
fn grace() -> Duration {
    GroupOptions::default().desync_grace
}
const MAX_STEPS: usize = 1_000_000;

/// How the victim is lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    /// [`Sim::isolate`]: cut off, and detected after the detection delay.
    Isolate,
    /// [`Sim::kill`]: dead, detected at once.
    Kill,
    /// [`Sim::partition`]: cut off silently; only timeouts notice.
    Partition,
}

/// One collective on one group, and, optionally, one on another group that does not contain
/// the victim (it must not notice anything).
#[derive(Clone, Debug)]
struct Setup {
    world: usize,
    /// Members of the group of `case`, in group-rank order.
    members: Vec<usize>,
    case: Case,
    /// A bystander call on a group without the victim: its members and case.
    other: Option<(Vec<usize>, Case)>,
    /// Global rank of the victim (a member of `members`).
    victim: usize,
    seed: u64,
    net: SimOptions,
}

fn gid_of(members: &[usize], index: u64) -> GroupId {
    let words: Vec<u64> = members.iter().map(|&m| m as u64).collect();
    GroupId::derive(GroupId::WORLD, index, &words)
}

/// A started simulation: calls submitted, nothing delivered.
struct Started {
    sim: Sim,
    /// The main call, then the bystander's.
    calls: Vec<Submitted>,
}

/// A call submitted on every member of a group (but an absent one).
struct Submitted {
    members: Vec<usize>,
    case: Case,
    /// The call of each group rank; `None` for the absent one.
    ids: Vec<Option<OpId>>,
}

fn call_options(case: &Case) -> CallOptions {
    CallOptions {
        algorithm: case.algorithm,
        timeout: Some(TIMEOUT),
    }
}

/// Registers the groups and submits the calls on every member except `absent`.
fn start(s: &Setup, absent: Option<usize>) -> Result<Started, String> {
    let gopts = GroupOptions {
        segment_bytes: 64,
        ..GroupOptions::default()
    };
    let mut sim = Sim::with_config(s.world, s.seed, gopts.clone(), s.net.clone());
    let mut groups = vec![(s.members.clone(), s.case.clone())];
    groups.extend(s.other.clone());
    let mut calls = Vec::new();
    for (i, (members, case)) in groups.into_iter().enumerate() {
        let gid = gid_of(&members, i as u64 + 1);
        sim.add_group_everywhere(gid, &members, gopts.clone());
        let mut ids = Vec::new();
        for (local, &g) in members.iter().enumerate() {
            if absent == Some(g) {
                ids.push(None);
                continue;
            }
            let id = sim
                .submit(g, gid, case.request(local), &call_options(&case))
                .map_err(|e| format!("{s:?}: rank {g} could not submit: {e}"))?;
            ids.push(Some(id));
        }
        calls.push(Submitted { members, case, ids });
    }
    Ok(Started { sim, calls })
}

fn deliveries(sim: &Sim) -> usize {
    sim.trace()
        .iter()
        .filter(|t| matches!(t.event, TraceEvent::Delivered { .. }))
        .count()
}

/// Loses the victim after a random number of deliveries and checks every rank's outcome.
fn lose_mid_collective(s: &Setup, fault: Fault) -> Result<(), String> {
    // A fault-free run with the same seed tells how many deliveries there are; the faulty run
    // replays its first `k` exactly.
    let mut clean = start(s, None)?;
    clean
        .sim
        .run(MAX_STEPS)
        .map_err(|e| format!("{s:?}: fault-free run: {e:?}\n{}", clean.sim.trace_text()))?;
    let total = deliveries(&clean.sim);
    let k = Rng::new(s.seed ^ 0x5eed).below(total + 1);

    let Started { mut sim, calls } = start(s, None)?;
    for _ in 0..k {
        sim.step();
    }
    let t_lost = sim.now();
    let done_before: BTreeSet<(usize, OpId)> = calls
        .iter()
        .flat_map(|c| c.members.iter().zip(&c.ids))
        .filter_map(|(&g, id)| id.map(|id| (g, id)))
        .filter(|&(g, id)| sim.result(g, id).is_some())
        .collect();
    match fault {
        Fault::Isolate => sim.isolate(s.victim),
        Fault::Kill => sim.kill(s.victim),
        Fault::Partition => sim.partition(s.victim),
    }
    let ctx = |sim: &Sim, what: String| {
        format!(
            "{fault:?} rank {} after {k} of {total} deliveries (t={}ns): {what}\n{s:?}\n{}",
            s.victim,
            t_lost.as_nanos(),
            sim.trace_text()
        )
    };
    if let Err(e) = sim.run(MAX_STEPS) {
        return Err(ctx(&sim, format!("did not settle: {e:?}")));
    }
    let detection = match fault {
        Fault::Isolate => sim.max_detection(),
        Fault::Kill => Duration::ZERO,
        Fault::Partition => TIMEOUT,
    };
    // The bound is the op's timeout plus one propagation delay (plus, here, the
    // detection delay) after the loss; what holds is tighter: with a detector every rank has
    // failed once it noticed, and without one the calls time out at their deadline (they were
    // submitted at time zero) and the aborts take one propagation delay.
    // A timeout first asks the group which call each rank is in and waits up to the grace.
    let promised = t_lost + TIMEOUT + grace() + sim.max_propagation() + sim.max_detection();
    let bound = match fault {
        Fault::Isolate | Fault::Kill => t_lost + detection,
        Fault::Partition => Time::ZERO + TIMEOUT + grace() + sim.max_propagation(),
    };
    assert!(bound <= promised);
    let mut timeouts = BTreeMap::new();
    for (ci, Submitted { members, case, ids }) in calls.iter().enumerate() {
        for (local, (&g, id)) in members.iter().zip(ids).enumerate() {
            let Some(id) = *id else { continue };
            let at = sim.completed_at(g, id).unwrap_or(Time::ZERO);
            let fail = |what: String| ctx(&sim, format!("call {ci}, rank {g}: {what}"));
            let result = match sim.result(g, id) {
                Some(r) => r.clone(),
                None if g == s.victim => continue,
                None => return Err(fail("no result".into())),
            };
            match result {
                Ok(out) => {
                    if out != case.expected(local) {
                        return Err(fail(format!("wrong result {out:?}")));
                    }
                    // Ok is right only for a call that could finish without the victim
                    // before its loss was noticed (or, partitioned, without it at all).
                    let noticed = t_lost + detection;
                    if ci == 0 && g != s.victim && fault != Fault::Partition && at > noticed {
                        return Err(fail(format!("Ok at {at:?}, after the loss was noticed")));
                    }
                }
                Err(e) if g == s.victim || done_before.contains(&(g, id)) => {
                    if g != s.victim {
                        return Err(fail(format!("failed before the fault: {e}")));
                    }
                }
                Err(e) => {
                    if ci == 1 {
                        return Err(fail(format!("a call on a group without the victim: {e}")));
                    }
                    if at > bound {
                        return Err(fail(format!("{e} at {at:?}, later than {bound:?}")));
                    }
                    if fault == Fault::Partition {
                        check_timeout(&sim, g, id, &e).map_err(fail)?;
                        timeouts.insert(g, e);
                        continue;
                    }
                    let direct = sim.talks_to(g, id, s.victim).unwrap_or(true);
                    let lost = Error::PeerLost { rank: s.victim };
                    match &e {
                        _ if direct && e == lost => {}
                        Error::GroupAborted { cause, .. } if !direct && **cause == lost => {}
                        _ => {
                            return Err(fail(format!(
                                "{e:?}, but its remaining schedule {} the victim",
                                if direct {
                                    "talks to"
                                } else {
                                    "does not talk to"
                                }
                            )))
                        }
                    }
                }
            }
        }
    }
    if fault == Fault::Partition {
        check_wait_graph(&timeouts, s.victim).map_err(|e| ctx(&sim, e))?;
    }
    Ok(())
}

/// A timeout with a desync report names exactly the ranks that said they have not made the
/// call (never one that has) and those that did not answer whose messages it waits for;
/// without a report (nobody to ask) it names the ranks the call
/// was waiting for in its current step (as the simulator's model of the call sees it). Or it
/// is the group abort another rank's timeout caused.
fn check_timeout(sim: &Sim, g: usize, id: OpId, e: &Error) -> Result<(), String> {
    match e.root_cause() {
        Error::Timeout {
            rank,
            waiting_for,
            report,
            ..
        } if *rank == g && !report.is_empty() => {
            // Those that said they have not made it, and those that did not answer whose
            // messages the call waits for (as the simulator's model of the call sees it).
            let awaited = sim.awaited(g, id).unwrap_or_default();
            let behind: Vec<usize> = report
                .iter()
                .filter_map(|r| match r {
                    collectix_runtime::RankCall::NotReached { rank, .. } => Some(*rank),
                    collectix_runtime::RankCall::NoAnswer { rank } if awaited.contains(rank) => {
                        Some(*rank)
                    }
                    _ => None,
                })
                .collect();
            if *waiting_for != behind {
                return Err(format!("{e}: names {waiting_for:?}, the report {behind:?}"));
            }
            Ok(())
        }
        Error::Timeout {
            rank, waiting_for, ..
        } if *rank == g => {
            let mut named = waiting_for.clone();
            named.sort_unstable();
            named.dedup();
            let awaited = sim.awaited(g, id).unwrap_or_default();
            if named != awaited || matches!(e, Error::GroupAborted { .. }) {
                return Err(format!("{e}: the call was waiting for {awaited:?}"));
            }
            Ok(())
        }
        Error::Timeout { rank, .. } if matches!(e, Error::GroupAborted { .. }) && *rank != g => {
            Ok(())
        }
        _ => Err(format!("{e:?} is not a timeout")),
    }
}

/// The ranks that timed out, each waiting for others: following "waits for" from any of them
/// must lead to the culprit, through ranks that timed out themselves, without a cycle.
fn check_wait_graph(errors: &BTreeMap<usize, Error>, culprit: usize) -> Result<(), String> {
    let edges = |g: usize| -> Vec<usize> {
        match errors.get(&g) {
            // With a desync report: the ranks that have not made the call or did not answer.
            Some(Error::Timeout { report, .. }) if !report.is_empty() => report
                .iter()
                .filter_map(|r| match r {
                    collectix_runtime::RankCall::NotReached { rank, .. }
                    | collectix_runtime::RankCall::NoAnswer { rank }
                    | collectix_runtime::RankCall::Late { rank, .. } => Some(*rank),
                    collectix_runtime::RankCall::Made { .. } => None,
                })
                .collect(),
            Some(Error::Timeout { waiting_for, .. }) => waiting_for.clone(),
            Some(Error::GroupAborted { cause, .. }) => match &**cause {
                Error::Timeout { rank, .. } => vec![*rank],
                _ => Vec::new(),
            },
            _ => Vec::new(),
        }
    };
    for &start in errors.keys() {
        // Depth-first, with the path on the stack to find cycles.
        let mut reached_culprit = false;
        let mut stack = vec![(start, 0usize)];
        let mut path = vec![start];
        let mut seen = BTreeSet::new();
        while let Some((g, next)) = stack.pop() {
            let out = edges(g);
            if next < out.len() {
                stack.push((g, next + 1));
                let h = out[next];
                if h == culprit {
                    reached_culprit = true;
                } else if path.contains(&h) {
                    return Err(format!(
                        "ranks wait for each other in a cycle: {path:?} -> {h}"
                    ));
                } else if !errors.contains_key(&h) {
                    return Err(format!(
                        "rank {g} waits for rank {h}, which neither timed out nor is the culprit"
                    ));
                } else if seen.insert(h) {
                    path.push(h);
                    stack.push((h, 0));
                }
            } else {
                path.pop();
            }
        }
        if !reached_culprit {
            return Err(format!(
                "rank {start}'s wait does not lead to rank {culprit}"
            ));
        }
    }
    Ok(())
}

/// A case of `kind` for a group of `size`, with the count, dtype, op and root drawn from
/// `pick`.
fn case_for(kind: OpKind, size: usize, alg: collectix_runtime::Algorithm, pick: &mut Rng) -> Case {
    let counts = [0, 1, size.saturating_sub(1), size + 1, 37];
    let count = counts[pick.below(counts.len())];
    let dtype = [DType::F32, DType::I64, DType::BF16, DType::U8][pick.below(4)];
    let op = if reduces(kind) {
        [ReduceOp::Sum, ReduceOp::Max][pick.below(2)]
    } else {
        ReduceOp::Sum
    };
    Case {
        kind,
        size,
        count,
        dtype,
        op,
        root: if rooted(kind) { pick.below(size) } else { 0 },
        algorithm: Some(alg),
    }
}

/// Every collective and algorithm, groups of 2, 3, 4, 5 and 8, a few seeds: the victim is
/// isolated (detected after one latency, or with a detection jitter so that some ranks hear
/// of it from another rank's abort first), killed, or partitioned, after a random number of
/// deliveries.
#[test]
fn losing_a_rank_mid_collective_ends_every_other_rank() {
    let mut n = 0;
    for kind in COLLECTIVES {
        for &alg in kind.algorithms() {
            for w in [2, 3, 4, 5, 8] {
                for seed in 0..8u64 {
                    let seed = seed * 1_000_003 + w as u64 * 101 + kind as u64 * 7;
                    let mut pick = Rng::new(seed);
                    let case = case_for(kind, w, alg, &mut pick);
                    let (fault, net) = match n % 4 {
                        0 => (Fault::Isolate, SimOptions::default()),
                        1 => (
                            Fault::Isolate,
                            SimOptions::default().with_detection(
                                Duration::from_micros(10),
                                Duration::from_micros(100),
                            ),
                        ),
                        2 => (Fault::Kill, SimOptions::default()),
                        _ => (Fault::Partition, SimOptions::default()),
                    };
                    let setup = Setup {
                        world: w,
                        members: (0..w).collect(),
                        victim: pick.below(w),
                        case,
                        other: None,
                        seed,
                        net,
                    };
                    if let Err(e) = lose_mid_collective(&setup, fault) {
                        panic!("{e}");
                    }
                    n += 1;
                }
            }
        }
    }
    // 25 (collective, algorithm) pairs, 5 world sizes, 8 seeds.
    assert_eq!(n, 25 * 5 * 8);
}

prop_compose! {
    /// A world of 2–9 ranks, a random group of at least two with the victim in it, and a
    /// bystander group of the ranks left (when there are any) running its own call.
    fn random_setup()(world in 2..=9usize)(
        world in Just(world),
        members in proptest::sample::subsequence((0..world).collect::<Vec<_>>(), 2..=world)
            .prop_shuffle(),
        victim in 0..world,
        kind in 0..COLLECTIVES.len(),
        other_kind in 0..COLLECTIVES.len(),
        alg in 0..3usize,
        seed in any::<u64>(),
        jitter in prop_oneof![Just(0u64), Just(100)],
    ) -> Setup {
        let victim = members[victim % members.len()];
        let mut pick = Rng::new(seed);
        let kind = COLLECTIVES[kind];
        let algs = kind.algorithms();
        let case = case_for(kind, members.len(), algs[alg % algs.len()], &mut pick);
        let rest: Vec<usize> = (0..world).filter(|&r| r != victim).collect();
        let other_kind = COLLECTIVES[other_kind];
        let other_alg = other_kind.algorithms()[0];
        let other = Some((rest.clone(), case_for(other_kind, rest.len(), other_alg, &mut pick)));
        let net = SimOptions::default()
            .with_detection(Duration::from_micros(10), Duration::from_micros(jitter));
        Setup { world, members, case, other, victim, seed, net }
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 2000,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))),
        ..ProptestConfig::default()
    })]

    /// Random groups: isolating a member mid-collective fails the group's other members with
    /// `PeerLost` or the abort that names it, and leaves a concurrent call on a group without
    /// it untouched.
    #[test]
    fn isolating_a_member_of_a_random_group(s in random_setup(), fault in 0..3u8) {
        let fault = [Fault::Isolate, Fault::Kill, Fault::Partition][fault as usize];
        lose_mid_collective(&s, fault).map_err(TestCaseError::fail)?;
    }
}

/// A rank that never calls: every rank that needs it times out naming the ranks its current
/// step waits for, and those waits lead to the absent rank; ranks that do not need it finish
/// with the right result. All within the timeout plus one propagation delay.
#[test]
fn a_rank_that_never_calls_is_named_by_the_timeouts() {
    for kind in COLLECTIVES {
        for &alg in kind.algorithms() {
            for w in [2, 3, 5, 8] {
                let seed = w as u64 * 31 + kind as u64;
                let mut pick = Rng::new(seed);
                let setup = Setup {
                    world: w,
                    members: (0..w).collect(),
                    case: case_for(kind, w, alg, &mut pick),
                    other: None,
                    victim: pick.below(w),
                    seed,
                    net: SimOptions::default(),
                };
                if let Err(e) = never_calls(&setup) {
                    panic!("{e}");
                }
            }
        }
    }
}

fn never_calls(s: &Setup) -> Result<(), String> {
    let Started { mut sim, calls } = start(s, Some(s.victim))?;
    let ctx = |sim: &Sim, what: String| {
        format!(
            "rank {} never calls: {what}\n{s:?}\n{}",
            s.victim,
            sim.trace_text()
        )
    };
    if let Err(e) = sim.run(MAX_STEPS) {
        return Err(ctx(&sim, format!("did not settle: {e:?}")));
    }
    let bound = Time::ZERO + TIMEOUT + grace() + sim.max_propagation();
    let mut errors = BTreeMap::new();
    let Submitted { members, case, ids } = &calls[0];
    for (local, (&g, id)) in members.iter().zip(ids).enumerate() {
        let Some(id) = *id else { continue };
        let fail = |what: String| ctx(&sim, format!("rank {g}: {what}"));
        let at = sim.completed_at(g, id).unwrap_or(Time::ZERO);
        match sim.result(g, id) {
            None => return Err(fail("no result".into())),
            Some(Ok(out)) if *out == case.expected(local) => {}
            Some(Ok(out)) => return Err(fail(format!("wrong result {out:?}"))),
            Some(Err(e)) => {
                if at > bound {
                    return Err(fail(format!("{e} at {at:?}, later than {bound:?}")));
                }
                check_timeout(&sim, g, id, e).map_err(fail)?;
                errors.insert(g, e.clone());
            }
        }
    }
    check_wait_graph(&errors, s.victim).map_err(|e| ctx(&sim, e))
}

/// The collectives where every rank's result depends on every rank's input, so no rank can
/// finish before meeting a mismatched call.
const ALL_TO_ALL_DEPENDENT: [OpKind; 8] = [
    OpKind::AllReduce,
    OpKind::AllGather,
    OpKind::AllGatherIntoTensor,
    OpKind::ReduceScatter,
    OpKind::ReduceScatterTensor,
    OpKind::AllToAll,
    OpKind::AllToAllSingle,
    OpKind::Barrier,
];

/// How the odd rank's call differs.
#[derive(Clone, Copy, Debug)]
enum Odd {
    Kind(usize),
    DType,
    Op,
    Count,
}

fn mismatch(w: usize, kind: OpKind, odd: Odd, m: usize, seed: u64) -> Result<(), String> {
    let case = Case {
        kind,
        size: w,
        count: 5,
        dtype: DType::I32,
        op: ReduceOp::Sum,
        root: 0,
        algorithm: None,
    };
    let theirs = match odd {
        Odd::Kind(k) => Case {
            kind: ALL_TO_ALL_DEPENDENT[k],
            ..case.clone()
        },
        Odd::DType => Case {
            dtype: DType::F32,
            ..case.clone()
        },
        Odd::Op => Case {
            op: ReduceOp::Max,
            ..case.clone()
        },
        Odd::Count => Case {
            count: 6,
            ..case.clone()
        },
    };
    if theirs == case {
        return Ok(());
    }
    let mut sim = Sim::with_config(w, seed, GroupOptions::default(), SimOptions::default());
    let mut ids = Vec::new();
    for r in 0..w {
        let c = if r == m { &theirs } else { &case };
        let id = sim
            .submit(r, GroupId::WORLD, c.request(r), &call_options(c))
            .map_err(|e| format!("rank {r}: {e}"))?;
        ids.push(id);
    }
    let ctx = |sim: &Sim, what: String| {
        format!(
            "{case:?} with rank {m} calling {theirs:?}: {what}\n{}",
            sim.trace_text()
        )
    };
    if let Err(e) = sim.run(MAX_STEPS) {
        return Err(ctx(&sim, format!("did not settle: {e:?}")));
    }
    let mut first = None;
    let mut last = Time::ZERO;
    for (r, &id) in ids.iter().enumerate() {
        let fail = |what: String| ctx(&sim, format!("rank {r}: {what}"));
        match sim.result(r, id) {
            Some(Err(e)) => match e.root_cause() {
                Error::Mismatch { ours, theirs, .. } if ours.rank == m || theirs.rank == m => {}
                _ => return Err(fail(format!("{e:?} does not name the mismatch with {m}"))),
            },
            other => return Err(fail(format!("{other:?}, not an error"))),
        }
        let at = sim.completed_at(r, id).unwrap_or(Time::ZERO);
        if matches!(sim.result(r, id), Some(Err(Error::Mismatch { .. }))) {
            first = Some(first.map_or(at, |f: Time| f.min(at)));
        }
        last = last.max(at);
    }
    let Some(first) = first else {
        return Err(ctx(&sim, "no rank saw the mismatch itself".into()));
    };
    if last > first + sim.max_propagation() {
        return Err(ctx(
            &sim,
            format!("first detection at {first:?}, last error at {last:?}"),
        ));
    }
    Ok(())
}

/// A mismatch (another collective, dtype, reduce op or count on one rank) ends in an error
/// on every rank that names the odd rank, at most one propagation delay after the first rank
/// noticed.
#[test]
fn a_mismatch_fails_every_rank_within_one_propagation_delay() {
    for (i, kind) in ALL_TO_ALL_DEPENDENT.into_iter().enumerate() {
        for w in [2, 3, 4, 5, 7, 9] {
            let mut odds = vec![Odd::Kind((i + w) % ALL_TO_ALL_DEPENDENT.len()), Odd::DType];
            if reduces(kind) {
                odds.push(Odd::Op);
            }
            if matches!(
                kind,
                OpKind::AllReduce | OpKind::AllGatherIntoTensor | OpKind::ReduceScatterTensor
            ) {
                odds.push(Odd::Count);
            }
            if kind == OpKind::Barrier {
                odds = vec![Odd::Kind((i + w) % 7)];
            }
            for (j, odd) in odds.into_iter().enumerate() {
                let seed = (i * 100 + w * 10 + j) as u64;
                if let Err(e) = mismatch(w, kind, odd, (i + j) % w, seed) {
                    panic!("{e}");
                }
            }
        }
    }
}

/// A lost rank whose calls are all done disturbs nothing; `run` does not spin on the pending
/// calls of a killed rank, and a partitioned rank's own call times out.
#[test]
fn run_ends_when_only_lost_ranks_have_calls() {
    let case = Case {
        kind: OpKind::AllReduce,
        size: 3,
        count: 4,
        dtype: DType::I32,
        op: ReduceOp::Sum,
        root: 0,
        algorithm: Some(collectix_runtime::Algorithm::Ring),
    };
    let mut sim = Sim::new(3, 5);
    let mut ids = Vec::new();
    for r in 0..3 {
        match sim.submit(r, GroupId::WORLD, case.request(r), &call_options(&case)) {
            Ok(id) => ids.push(id),
            Err(e) => panic!("{e}"),
        }
    }
    sim.kill(2);
    assert_eq!(sim.run(100), Ok(()), "{}", sim.trace_text());
    assert_eq!(sim.pending(2), 1);
    assert!(sim.result(2, ids[2]).is_none());
    for (r, &id) in ids.iter().enumerate().take(2) {
        assert_eq!(
            sim.result(r, id),
            Some(&Err(Error::PeerLost { rank: 2 })),
            "{}",
            sim.trace_text()
        );
    }

    let mut sim = Sim::new(3, 5);
    let mut ids = Vec::new();
    for r in 0..3 {
        match sim.submit(r, GroupId::WORLD, case.request(r), &call_options(&case)) {
            Ok(id) => ids.push(id),
            Err(e) => panic!("{e}"),
        }
    }
    sim.partition(2);
    assert_eq!(sim.run(100), Ok(()), "{}", sim.trace_text());
    for (r, id) in ids.into_iter().enumerate() {
        let res = sim.result(r, id);
        assert!(
            matches!(res, Some(Err(e)) if matches!(e.root_cause(), Error::Timeout { .. })),
            "rank {r}: {res:?}\n{}",
            sim.trace_text()
        );
        assert!(
            sim.completed_at(r, id) <= Some(Time::ZERO + TIMEOUT + grace() + sim.max_propagation())
        );
    }
}
