//! The fault matrix ([`collectix_runtime::testing::faults`]) in the seeded
//! simulator, for groups of 2, 3 and 5 ranks, on the engine (every base case forces an
//! algorithm) and on the board (boards on, [`Scenario::board`]'s small calls). Each scenario runs three ways: one call at a
//! time on links that keep their order (then the closing `monitored_barrier` must return the
//! fault), one call at a time on links that reorder, and every call at once. Besides each
//! rank's verdict, no call may take longer than its timeout, the desync grace (twice for a
//! `monitored_barrier` that is not rank 0's) and two messages' way.

use collectix_runtime::group::{CallOptions, GroupId, GroupOptions};
use collectix_runtime::testing::faults::{On, Outcome, Scenario};
use collectix_runtime::testing::sim::{Delivery, Sim, SimOptions};
use collectix_runtime::{Error, OpId, Time};
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_millis(50);
const STEPS: usize = 2_000_000;

fn grace() -> Duration {
    GroupOptions::default().desync_grace
}

/// How ranks issue their calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Each call once the one before has completed.
    OneAtATime,
    /// All calls at once.
    AllAtOnce,
}

const MODES: [(Mode, Delivery); 3] = [
    (Mode::OneAtATime, Delivery::Fifo),
    (Mode::OneAtATime, Delivery::Timed),
    (Mode::AllAtOnce, Delivery::Timed),
];

fn group_b(w: usize) -> GroupId {
    GroupId::derive(GroupId::WORLD, 1, &(0..w as u64).collect::<Vec<_>>())
}

/// Which of a world's paths the calls take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Path {
    /// Every call on the engine (the scenarios force algorithms).
    Engine,
    /// Boards on: a small call with no algorithm forced runs on its group's board.
    Board,
}

/// Runs the scenario: how many of its calls did not run on the engine, or `Err` with what
/// went wrong and the trace.
fn check(
    s: &Scenario,
    path: Path,
    mode: Mode,
    delivery: Delivery,
    seed: u64,
) -> Result<usize, String> {
    let net = SimOptions::default().with_delivery(delivery);
    let mut sim = Sim::with_config(s.w, seed, GroupOptions::default(), net);
    if path == Path::Board {
        sim = sim.with_boards();
    }
    let b = group_b(s.w);
    if s.uses_b() {
        sim.add_group_everywhere(b, &(0..s.w).collect::<Vec<_>>(), GroupOptions::default());
    }
    let gid = |on: On| if on == On::A { GroupId::WORLD } else { b };
    let programs: Vec<_> = (0..s.w).map(|r| s.program(r)).collect();
    let mut issued: Vec<Vec<(OpId, Time)>> = vec![Vec::new(); s.w];
    let mut steps = 0;
    loop {
        let mut more = false;
        for r in 0..s.w {
            let Some(c) = programs[r].get(issued[r].len()) else {
                continue;
            };
            let ready = mode == Mode::AllAtOnce
                || issued[r]
                    .last()
                    .is_none_or(|(id, _)| sim.result(r, *id).is_some());
            if ready {
                let opts = CallOptions {
                    timeout: Some(TIMEOUT),
                    algorithm: c.algorithm,
                };
                let at = sim.now();
                let id = sim
                    .submit(r, gid(c.on), c.req.clone(), &opts)
                    .map_err(|e| format!("rank {r} cannot submit: {e}"))?;
                issued[r].push((id, at));
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
    let ctx = |what: String| {
        format!(
            "{s:?} {mode:?} {delivery:?} seed {seed}\n{what}\n{}",
            sim.trace_text()
        )
    };
    let prop = sim.max_propagation();
    let off = issued
        .iter()
        .flatten()
        .filter(|(id, _)| sim.off_the_engine(*id))
        .count();
    for r in 0..s.w {
        let mut outcomes = Vec::new();
        for (i, (c, &(id, submitted))) in programs[r].iter().zip(&issued[r]).enumerate() {
            let Some(result) = sim.result(r, id) else {
                return Err(ctx(format!("rank {r} call {i} has no result")));
            };
            let completed = sim.completed_at(r, id).unwrap_or(Time::ZERO);
            let extra = if c.is_monitored_barrier() {
                grace()
            } else {
                Duration::ZERO
            };
            let bound = submitted + TIMEOUT + extra + grace() + prop * 2;
            if completed > bound {
                return Err(ctx(format!(
                    "rank {r} call {i} completed at {completed:?}, after {bound:?}"
                )));
            }
            outcomes.push(Outcome {
                on: c.on,
                completed_nanos: completed.as_nanos(),
                result: result.clone().map(|_| ()),
            });
        }
        let pending: Vec<Error> = sim
            .engine(r)
            .map(|e| e.pending_errors())
            .unwrap_or_default();
        let last_must_fail = mode == Mode::OneAtATime && delivery == Delivery::Fifo;
        s.check_rank(
            r,
            &outcomes,
            &pending,
            mode == Mode::AllAtOnce,
            last_must_fail,
        )
        .map_err(ctx)?;
    }
    Ok(off)
}

fn matrix(w: usize, path: Path) {
    let all = match path {
        Path::Engine => Scenario::all(w),
        Path::Board => Scenario::board(w),
    };
    let mut failures = Vec::new();
    let mut seed = w as u64 * 1000;
    let mut off = 0;
    for s in &all {
        for (mode, delivery) in MODES {
            seed += 1;
            match check(s, path, mode, delivery, seed) {
                Ok(n) => off += n,
                Err(e) => failures.push(e),
            }
        }
    }
    match path {
        Path::Engine => assert_eq!(off, 0, "every call on the engine"),
        Path::Board => assert!(
            off >= all.len(),
            "{off} calls off the engine in {} scenarios",
            all.len()
        ),
    }
    eprintln!(
        "W={w} {path:?}: {} scenarios, {off} calls off the engine",
        all.len()
    );
    if std::env::var_os("FAULT_MATRIX_LIST").is_some() {
        for f in &failures {
            eprintln!("{}\n", f.lines().take(2).collect::<Vec<_>>().join("\n"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} runs failed at W={w} ({path:?}); the first:\n{}",
        failures.len(),
        all.len() * MODES.len(),
        failures[0]
    );
}

#[test]
fn fault_matrix_on_the_engine_in_the_simulator_w2() {
    matrix(2, Path::Engine);
}

#[test]
fn fault_matrix_on_the_board_in_the_simulator_w2() {
    matrix(2, Path::Board);
}

#[test]
fn fault_matrix_on_the_engine_in_the_simulator_w3() {
    matrix(3, Path::Engine);
}

#[test]
fn fault_matrix_on_the_board_in_the_simulator_w3() {
    matrix(3, Path::Board);
}

#[test]
fn fault_matrix_on_the_engine_in_the_simulator_w5() {
    matrix(5, Path::Engine);
}

#[test]
fn fault_matrix_on_the_board_in_the_simulator_w5() {
    matrix(5, Path::Board);
}
