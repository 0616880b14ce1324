//! The fault matrix ([`collectix::runtime::testing::faults`]) at actor level: real
//! rank actors in one process, each rank's program run by a thread of its own the way users
//! drive ranks, for groups of 2, 3 and 5 ranks. One call at a time (each waits for the one
//! before, on in-process links, which keep their order: the closing `monitored_barrier` must
//! return the fault); every call at once for the scenarios where that changes the outcome.
//! After the programs, each rank destroys its groups: what `destroy` returns is the rank's
//! pending error. Each call must end within its timeout, the desync grace (twice for a
//! `monitored_barrier` that is not rank 0's) and a slack for scheduling on a loaded machine.

use collectix::runtime::testing::faults::{Fault, On, Outcome, Scenario};
use collectix::{CallOptions, Communicator, Error, GroupOptions, World};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_millis(300);
const GRACE: Duration = Duration::from_millis(150);
/// Scheduling slack on a loaded 2-core machine (the bounds are about hangs, not speed).
const SLACK: Duration = Duration::from_secs(3);
/// Scenarios run at once.
const PARALLEL: usize = 6;

/// What one call did: its group, when it started and ended, and its result.
struct Timed {
    on: On,
    monitored: bool,
    started: Instant,
    ended: Instant,
    result: Result<(), Error>,
}

fn comm_for(on: On, a: &Communicator, b: Option<&Communicator>) -> Communicator {
    match (on, b) {
        (On::B, Some(b)) => b.clone(),
        _ => a.clone(),
    }
}

/// Rank `r`'s program, run one call at a time or all at once.
fn run_rank(
    s: &Scenario,
    r: usize,
    a: &Communicator,
    b: Option<&Communicator>,
    all_at_once: bool,
) -> Vec<Timed> {
    let limit = TIMEOUT + GRACE * 2 + SLACK * 4;
    let issue = |c: &collectix::runtime::testing::faults::Call| {
        let opts = CallOptions {
            timeout: Some(TIMEOUT),
            algorithm: c.algorithm,
        };
        (
            Instant::now(),
            comm_for(c.on, a, b).submit(c.req.clone(), &opts),
        )
    };
    let wait = |w: collectix::Work<collectix::runtime::Output>| -> Result<(), Error> {
        match w.wait_timeout(limit) {
            Some(res) => res.map(|_| ()),
            None => Err(Error::internal(format!(
                "rank {r}: no result within {limit:?}"
            ))),
        }
    };
    let finish = |c: &collectix::runtime::testing::faults::Call, started, w| {
        let result = wait(w);
        Timed {
            on: c.on,
            monitored: c.is_monitored_barrier(),
            started,
            ended: Instant::now(),
            result,
        }
    };
    let program = s.program(r);
    if all_at_once {
        let works: Vec<_> = program.iter().map(|c| (c, issue(c))).collect();
        works
            .into_iter()
            .map(|(c, (started, w))| finish(c, started, w))
            .collect()
    } else {
        program
            .iter()
            .map(|c| {
                let (started, w) = issue(c);
                finish(c, started, w)
            })
            .collect()
    }
}

fn check(s: &Scenario, all_at_once: bool) -> Result<(), String> {
    let opts = GroupOptions {
        desync_grace: GRACE,
        ..GroupOptions::default()
    };
    let world = World::local_with(s.w, opts).map_err(|e| e.to_string())?;
    let comms = world.communicators().to_vec();
    // Group B: every rank, made by new_group (a collective over the world).
    let bs: Vec<Option<Communicator>> = if s.uses_b() {
        let ranks: Vec<usize> = (0..s.w).collect();
        let works: Vec<_> = comms.iter().map(|c| c.new_group(&ranks)).collect();
        works
            .into_iter()
            .map(|w| w.wait().map_err(|e| e.to_string()))
            .collect::<Result<Vec<_>, _>>()?
    } else {
        vec![None; s.w]
    };
    let origin = Instant::now();
    let results: Vec<Vec<Timed>> = std::thread::scope(|sc| {
        let handles: Vec<_> = (0..s.w)
            .map(|r| {
                let (a, b) = (&comms[r], bs[r].as_ref());
                sc.spawn(move || run_rank(s, r, a, b, all_at_once))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_default())
            .collect()
    });
    let ctx = |what: String| format!("{s:?} all_at_once={all_at_once}\n{what}");
    for (r, calls) in results.iter().enumerate() {
        let mut outcomes = Vec::new();
        for (i, c) in calls.iter().enumerate() {
            let extra = if c.monitored { GRACE } else { Duration::ZERO };
            let took = c.ended - c.started;
            if took > TIMEOUT + extra + GRACE + SLACK {
                return Err(ctx(format!("rank {r} call {i} took {took:?}")));
            }
            outcomes.push(Outcome {
                on: c.on,
                completed_nanos: u64::try_from((c.ended - origin).as_nanos()).unwrap_or(u64::MAX),
                result: c.result.clone(),
            });
        }
        let mut pending = Vec::new();
        for c in std::iter::once(&comms[r]).chain(bs[r].as_ref()) {
            if let Some(Err(e)) = c.destroy().wait_timeout(SLACK) {
                pending.push(e);
            }
        }
        s.check_rank(r, &outcomes, &pending, all_at_once, !all_at_once)
            .map_err(ctx)?;
    }
    // Every pending error was returned by `destroy`: nothing is left for the shutdown.
    world.shutdown().map_err(|e| ctx(format!("shutdown: {e}")))
}

/// Runs the scenarios, `PARALLEL` at a time; returns the failures.
fn run_all(runs: Vec<(Scenario, bool)>) -> Vec<String> {
    let (tx, rx) = mpsc::channel();
    let queue = std::sync::Mutex::new(runs.into_iter());
    std::thread::scope(|sc| {
        for _ in 0..PARALLEL {
            let (tx, queue) = (tx.clone(), &queue);
            sc.spawn(move || loop {
                let next = queue.lock().unwrap_or_else(|e| e.into_inner()).next();
                let Some((s, all)) = next else { break };
                if let Err(e) = check(&s, all) {
                    let _ = tx.send(e);
                }
            });
        }
    });
    drop(tx);
    rx.into_iter().collect()
}

fn matrix(w: usize) {
    let all = Scenario::all(w);
    let mut runs: Vec<(Scenario, bool)> = all.iter().map(|s| (s.clone(), false)).collect();
    // All at once where it changes the outcome (the opposite-order program completes) or
    // the order of failures (a rank calling twice).
    runs.extend(
        all.iter()
            .filter(|s| matches!(s.fault, Fault::Opposite | Fault::Twice))
            .map(|s| (s.clone(), true)),
    );
    let n = runs.len();
    let failures = run_all(runs);
    assert!(
        failures.is_empty(),
        "{} of {n} runs failed at W={w}; the first:\n{}",
        failures.len(),
        failures.first().map_or("", String::as_str)
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
