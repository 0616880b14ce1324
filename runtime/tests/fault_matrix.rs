//! The fault matrix of issue 9, in the seeded simulator, for groups of 2, 3 and 5 ranks: one
//! rank (`m`) departs from what the others do —
//! - it makes another collective (every ordered pair of the twelve), or the same one with
//!   another dtype, count, root, reduce op or algorithm;
//! - it never calls;
//! - it calls twice;
//! - it takes two groups in the opposite order
//!
//! — and then every rank that takes part ends with a `monitored_barrier`, the call a careful
//! program ends with. Ranks run their calls one at a time (each waits for the one before, as
//! torch's blocking calls do) or submit them all at once (async `Work`s).
//!
//! Checked, for every rank: it gets an error (from a call, or as its group's pending error
//! when it made no call); every error it gets is the right variant and names the right
//! ranks; once a call of it failed on a group, no later call on that group returns `Ok`; no
//! call takes longer than its timeout, the desync grace and two messages' way.

use collectix_runtime::group::{CallOptions, GroupId, GroupOptions};
use collectix_runtime::testing::sim::{Delivery, Sim, SimOptions};
use collectix_runtime::testing::{reduces, rooted, Case, COLLECTIVES};
use collectix_runtime::{Algorithm, DType, Error, OpId, OpKind, ReduceOp, Request, Time};
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_millis(50);
const STEPS: usize = 2_000_000;

fn grace() -> Duration {
    GroupOptions::default().desync_grace
}

/// How rank `m` departs.
#[derive(Clone, Debug)]
enum Fault {
    /// It calls `theirs` where the others call the scenario's case.
    Differ(Box<Case>),
    /// It never calls.
    Missing,
    /// It calls the case twice.
    Twice,
    /// It calls the case on group B, then on A; the others on A, then B.
    Opposite,
}

/// How ranks issue their calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Each call once the one before has completed.
    OneAtATime,
    /// All calls at once.
    AllAtOnce,
}

#[derive(Clone, Debug)]
struct Scenario {
    w: usize,
    m: usize,
    case: Case,
    fault: Fault,
    mode: Mode,
    delivery: Delivery,
    seed: u64,
}

/// A call of a rank's program.
#[derive(Clone)]
struct Call {
    group: GroupId,
    req: Request,
    algorithm: Option<Algorithm>,
    timeout: Duration,
}

/// What happened to one call.
#[derive(Debug)]
struct Ran {
    group: GroupId,
    monitored: bool,
    submitted: Time,
    completed: Time,
    timeout: Duration,
    result: Result<(), Error>,
}

fn group_b(w: usize) -> GroupId {
    GroupId::derive(GroupId::WORLD, 1, &(0..w as u64).collect::<Vec<_>>())
}

fn program(s: &Scenario, r: usize) -> Vec<Call> {
    let call = |group, c: &Case| Call {
        group,
        req: c.request(r),
        algorithm: c.algorithm,
        timeout: TIMEOUT,
    };
    let on_world = |c: &Case| call(GroupId::WORLD, c);
    let mut p = match (&s.fault, r == s.m) {
        (Fault::Missing, true) => return Vec::new(),
        (Fault::Differ(theirs), true) => vec![on_world(theirs)],
        (Fault::Twice, true) => vec![on_world(&s.case), on_world(&s.case)],
        (Fault::Opposite, true) => vec![call(group_b(s.w), &s.case), on_world(&s.case)],
        (Fault::Opposite, false) => vec![on_world(&s.case), call(group_b(s.w), &s.case)],
        _ => vec![on_world(&s.case)],
    };
    p.push(Call {
        group: GroupId::WORLD,
        req: Request::MonitoredBarrier,
        algorithm: None,
        timeout: TIMEOUT,
    });
    p
}

/// A finished scenario: the simulator (for its trace), what each rank's calls did, and each
/// rank's pending errors at the end.
struct Outcome {
    sim: Sim,
    ran: Vec<Vec<Ran>>,
    pending: Vec<Vec<Error>>,
}

/// Runs every rank's program.
fn run(s: &Scenario) -> Result<Outcome, String> {
    let net = SimOptions::default().with_delivery(s.delivery);
    let mut sim = Sim::with_config(s.w, s.seed, GroupOptions::default(), net);
    if matches!(s.fault, Fault::Opposite) {
        sim.add_group_everywhere(
            group_b(s.w),
            &(0..s.w).collect::<Vec<_>>(),
            GroupOptions::default(),
        );
    }
    let programs: Vec<Vec<Call>> = (0..s.w).map(|r| program(s, r)).collect();
    let mut issued: Vec<Vec<(OpId, Time)>> = vec![Vec::new(); s.w];
    let submit = |sim: &mut Sim, r: usize, c: &Call| -> Result<(OpId, Time), String> {
        let opts = CallOptions {
            timeout: Some(c.timeout),
            algorithm: c.algorithm,
        };
        let at = sim.now();
        sim.submit(r, c.group, c.req.clone(), &opts)
            .map(|id| (id, at))
            .map_err(|e| format!("rank {r} cannot submit: {e}"))
    };
    let mut steps = 0;
    loop {
        let mut more = false;
        for r in 0..s.w {
            let next = issued[r].len();
            let Some(c) = programs[r].get(next) else {
                continue;
            };
            let ready = match s.mode {
                Mode::AllAtOnce => true,
                Mode::OneAtATime => issued[r]
                    .last()
                    .is_none_or(|(id, _)| sim.result(r, *id).is_some()),
            };
            if ready {
                let sub = submit(&mut sim, r, c)?;
                issued[r].push(sub);
                more = true;
            }
        }
        // A rank issues its next call as soon as the one before completed (virtual time
        // stands still between the two).
        if !more {
            steps += 1;
            if steps > STEPS {
                return Err("did not settle within the step bound".into());
            }
            if !sim.step() {
                break;
            }
        }
    }
    let mut ran = Vec::new();
    for r in 0..s.w {
        let mut mine = Vec::new();
        for (c, &(id, submitted)) in programs[r].iter().zip(&issued[r]) {
            let Some(result) = sim.result(r, id) else {
                return Err(format!("rank {r}: a call has no result"));
            };
            mine.push(Ran {
                group: c.group,
                monitored: matches!(c.req, Request::MonitoredBarrier),
                submitted,
                completed: sim.completed_at(r, id).unwrap_or(Time::ZERO),
                timeout: c.timeout,
                result: result.clone().map(|_| ()),
            });
        }
        ran.push(mine);
    }
    let pending = (0..s.w)
        .map(|r| {
            sim.engine(r)
                .map(|e| e.pending_errors())
                .unwrap_or_default()
        })
        .collect();
    Ok(Outcome { sim, ran, pending })
}

/// Whether `e` (a root cause, seen on rank `r`) is the right verdict for the scenario.
fn right(s: &Scenario, e: &Error) -> bool {
    let m = s.m;
    match (&s.fault, e) {
        (Fault::Differ(_) | Fault::Twice, Error::Mismatch { ours, theirs, .. }) => {
            ours.rank == m || theirs.rank == m
        }
        // all_to_all's fingerprint has no count (each rank states its own split sizes):
        // sizes that disagree show when a payload arrives, between m and a peer.
        (
            Fault::Differ(theirs),
            Error::SizeMismatch {
                sender, receiver, ..
            },
        ) if theirs.count != s.case.count
            && matches!(s.case.kind, OpKind::AllToAll | OpKind::AllToAllSingle) =>
        {
            *sender == m || *receiver == m
        }
        // The ranks that made the call name m (with, perhaps, ranks stuck in an earlier call
        // behind m, which indeed have not made it).
        (Fault::Missing, Error::Timeout { waiting_for, .. }) => waiting_for.contains(&m),
        (
            Fault::Opposite,
            Error::Timeout {
                rank, waiting_for, ..
            },
        ) => {
            if *rank == m {
                !waiting_for.is_empty() && !waiting_for.contains(&m)
            } else {
                waiting_for.contains(&m)
            }
        }
        _ => false,
    }
}

fn check(s: &Scenario) -> Result<(), String> {
    let Outcome { sim, ran, pending } = run(s)?;
    let ctx = |what: String| format!("{s:?}\n{what}\n{}", sim.trace_text());
    let prop = sim.max_propagation();
    // In collectix a rank's calls on two groups proceed independently: issued all at once,
    // the "opposite order" program completes (where torch's blocking calls deadlock).
    let valid = matches!(s.fault, Fault::Opposite) && s.mode == Mode::AllAtOnce;
    for r in 0..s.w {
        let mut heard = false;
        for (i, c) in ran[r].iter().enumerate() {
            let extra = if c.monitored { grace() } else { Duration::ZERO };
            let bound = c.submitted + c.timeout + extra + grace() + prop * 2;
            if c.completed > bound {
                return Err(ctx(format!(
                    "rank {r} call {i} completed at {:?}, after {bound:?}",
                    c.completed
                )));
            }
            match &c.result {
                Ok(()) if valid => {}
                Ok(()) => {
                    // Ok only before any failure on the group reached this rank; and a
                    // program that waits for each call before the next hears of the fault
                    // by its last call at the latest. (Issued all at once, a later call can
                    // complete before an earlier one fails: the earlier one's error is how
                    // the rank hears.)
                    let failed_before = ran[r].iter().any(|d| {
                        d.group == c.group && d.result.is_err() && d.completed < c.completed
                    });
                    let last = i + 1 == ran[r].len()
                        && s.mode == Mode::OneAtATime
                        && s.delivery == Delivery::Fifo;
                    if failed_before || last {
                        return Err(ctx(format!(
                            "rank {r} call {i}: Ok after a failure it should have heard of"
                        )));
                    }
                }
                Err(e) if valid => return Err(ctx(format!("rank {r} call {i}: {e}"))),
                Err(e) => {
                    heard = true;
                    if !right(s, e.root_cause()) {
                        return Err(ctx(format!("rank {r} call {i}: the wrong verdict: {e}")));
                    }
                }
            }
        }
        for e in &pending[r] {
            heard = true;
            if !right(s, e.root_cause()) {
                return Err(ctx(format!("rank {r}: the wrong pending error: {e}")));
            }
        }
        if !heard && !valid {
            return Err(ctx(format!("rank {r} never heard of the fault")));
        }
    }
    Ok(())
}

fn base(kind: OpKind, w: usize) -> Case {
    Case {
        kind,
        size: w,
        count: 4,
        dtype: DType::I32,
        op: ReduceOp::Sum,
        root: 0,
        algorithm: None,
    }
}

/// Every way the odd rank's call can differ from `case`.
fn differences(case: &Case) -> Vec<Case> {
    let mut out: Vec<Case> = COLLECTIVES
        .into_iter()
        .filter(|&k| k != case.kind)
        .map(|kind| Case {
            kind,
            ..case.clone()
        })
        .collect();
    if case.kind == OpKind::Barrier {
        return out;
    }
    out.push(Case {
        dtype: DType::F32,
        ..case.clone()
    });
    out.push(Case {
        count: case.count + 1,
        ..case.clone()
    });
    if rooted(case.kind) {
        out.push(Case {
            root: 1,
            ..case.clone()
        });
    }
    if reduces(case.kind) {
        out.push(Case {
            op: ReduceOp::Max,
            ..case.clone()
        });
    }
    // The others force the first algorithm (see `scenarios`), m the second.
    if let [_, b, ..] = case.kind.algorithms() {
        out.push(Case {
            algorithm: Some(*b),
            ..case.clone()
        });
    }
    out
}

fn scenarios(w: usize) -> Vec<Scenario> {
    let mut out = Vec::new();
    let mut seed = w as u64 * 1000;
    let mut push = |case: Case, fault: Fault, m: usize| {
        for (mode, delivery) in [
            (Mode::OneAtATime, Delivery::Fifo),
            (Mode::OneAtATime, Delivery::Timed),
            (Mode::AllAtOnce, Delivery::Timed),
        ] {
            seed += 1;
            out.push(Scenario {
                w,
                m,
                case: case.clone(),
                fault: fault.clone(),
                mode,
                delivery,
                seed,
            });
        }
    };
    for (i, kind) in COLLECTIVES.into_iter().enumerate() {
        let mut case = base(kind, w);
        if let [a, _, ..] = kind.algorithms() {
            case.algorithm = Some(*a);
        }
        for (j, theirs) in differences(&case).into_iter().enumerate() {
            let theirs = Case {
                algorithm: if theirs.kind == kind {
                    theirs.algorithm
                } else {
                    None
                },
                ..theirs
            };
            push(case.clone(), Fault::Differ(Box::new(theirs)), (i + j) % w);
        }
        for (k, fault) in [Fault::Missing, Fault::Twice].into_iter().enumerate() {
            push(case.clone(), fault, (i + k) % w);
        }
    }
    for kind in [OpKind::AllReduce, OpKind::Barrier, OpKind::AllGather] {
        push(base(kind, w), Fault::Opposite, w - 1);
    }
    out
}

fn matrix(w: usize) {
    let all = scenarios(w);
    eprintln!("W={w}: {} scenarios", all.len());
    let failures: Vec<String> = all.iter().filter_map(|s| check(s).err()).collect();
    if std::env::var_os("FAULT_MATRIX_LIST").is_some() {
        for f in &failures {
            eprintln!("{}\n", f.lines().take(2).collect::<Vec<_>>().join("\n"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} scenarios failed at W={w}; the first:\n{}",
        failures.len(),
        all.len(),
        failures[0]
    );
}

#[test]
fn fault_matrix_w2() {
    matrix(2);
}

#[test]
fn fault_matrix_w3() {
    matrix(3);
}

#[test]
fn fault_matrix_w5() {
    matrix(5);
}
