//! The fault matrix ([`collectix::runtime::testing::faults`]) at actor level: real
//! rank actors in one process, each rank's program run by a thread of its own the way users
//! drive ranks, for groups of 2, 3 and 5 ranks, on the engine (`Scenario::all`: every base
//! case forces an algorithm) and on the board of small calls (`Scenario::board`: 4-byte
//! calls with no algorithm forced); in a job over shared memory, the engine's matrix also
//! with 64 Ki-element calls whose every input is a tensor in shared memory
//! (`Communicator::to_shared`), read straight out of the sender's heap. One call at a time (each waits for the one
//! before, on in-process links, which keep their order: the closing `monitored_barrier` must
//! return the fault); every call at once for the scenarios where that changes the outcome.
//! After the programs, each rank destroys its groups: what `destroy` returns is the rank's
//! pending error. Each call must end within its timeout, the desync grace (twice for a
//! `monitored_barrier` that is not rank 0's) and a slack for scheduling on a loaded machine.

use crate::common;

use collectix::runtime::testing::faults::{Fault, On, Outcome, Scenario};
use collectix::{CallOptions, Communicator, Error, GroupOptions, Transport, World};
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
    shared: bool,
) -> Vec<Timed> {
    let limit = TIMEOUT + GRACE * 2 + SLACK * 4;
    let issue = |c: &collectix::runtime::testing::faults::Call| {
        let opts = CallOptions {
            timeout: Some(TIMEOUT),
            algorithm: c.algorithm,
        };
        let comm = comm_for(c.on, a, b);
        let req = if shared {
            // A tensor the heap has no room for stays where it is (the count of reads from
            // the heaps says whether any were).
            c.req
                .clone()
                .try_map(|t| comm.to_shared(&t), |s| s)
                .unwrap_or_else(|e| panic!("rank {r}: to_shared: {e}"))
        } else {
            c.req.clone()
        };
        (Instant::now(), comm.submit(req, &opts))
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

/// What one rank's calls did, and its pending errors.
type Rank = (Vec<Timed>, Vec<Error>);

/// Where a scenario runs: the ranks of an in-process world, or a job whose ranks (threads
/// here, each joined as a process would) talk over `Transport`, or such a job over shared
/// memory whose every input is a tensor in the rank's shared heap.
#[derive(Clone, Copy, Debug)]
enum Path {
    OneProcess,
    Job(Transport),
    SharedTensors,
}

fn options() -> GroupOptions {
    GroupOptions {
        desync_grace: GRACE,
        ..GroupOptions::default()
    }
}

/// Each rank's program on its group A (and B, made by new_group, a collective over A, if the
/// scenario uses it), then, once every rank's program is over (`done`), its `destroy`s:
/// what each call did, and the pending errors.
fn rank(
    s: &Scenario,
    r: usize,
    a: &Communicator,
    all_at_once: bool,
    done: &std::sync::Barrier,
    shared: bool,
) -> Result<Rank, String> {
    let b = if s.uses_b() {
        let ranks: Vec<usize> = (0..s.w).collect();
        a.new_group(&ranks).wait()
    } else {
        Ok(None)
    };
    let calls = b
        .as_ref()
        .map(|b| run_rank(s, r, a, b.as_ref(), all_at_once, shared));
    done.wait();
    let (calls, b) = (calls.map_err(|e| e.to_string())?, b.ok().flatten());
    let mut pending = Vec::new();
    for c in std::iter::once(a).chain(b.as_ref()) {
        if let Some(Err(e)) = c.destroy().wait_timeout(SLACK) {
            pending.push(e);
        }
    }
    Ok((calls, pending))
}

/// Runs one scenario and judges every rank; how many payload parts the ranks read out of
/// their peers' shared heaps.
fn check(s: &Scenario, path: Path, all_at_once: bool) -> Result<u64, String> {
    let ctx = |what: String| format!("{s:?} {path:?} all_at_once={all_at_once}\n{what}");
    let origin = Instant::now();
    let done = std::sync::Barrier::new(s.w);
    let done = &done;
    let heap_reads = std::sync::atomic::AtomicU64::new(0);
    let results: Vec<Result<Rank, String>> = match path {
        Path::OneProcess => {
            let world = World::local_with(s.w, options()).map_err(|e| e.to_string())?;
            let comms = world.communicators().to_vec();
            let got = std::thread::scope(|sc| {
                let handles: Vec<_> = (0..s.w)
                    .map(|r| {
                        let a = &comms[r];
                        sc.spawn(move || rank(s, r, a, all_at_once, done, false))
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().unwrap_or_else(|_| Err("panicked".into())))
                    .collect()
            });
            // Every pending error was returned by `destroy`: nothing is left for the
            // shutdown.
            world
                .shutdown()
                .map_err(|e| ctx(format!("shutdown: {e}")))?;
            got
        }
        Path::Job(_) | Path::SharedTensors => {
            let (transport, shared) = match path {
                Path::Job(t) => (t, false),
                _ => (Transport::Shm, true),
            };
            let got = std::sync::Mutex::new((0..s.w).map(|_| None).collect::<Vec<_>>());
            let ends = common::job_with(transport, s.w, "the fault matrix", options(), |r, p| {
                let out = rank(s, r, p.communicator(), all_at_once, done, shared);
                heap_reads.fetch_add(
                    p.read_from_shared_heaps(),
                    std::sync::atomic::Ordering::Relaxed,
                );
                if let Ok(mut g) = got.lock() {
                    g[r] = Some(out);
                }
                p.shutdown().map_err(|e| format!("shutdown: {e}"))
            });
            if let Some(Err(e)) = ends.into_iter().find(Result::is_err) {
                return Err(ctx(e));
            }
            got.into_inner()
                .map_err(|e| e.to_string())?
                .into_iter()
                .map(|g| g.unwrap_or_else(|| Err("no report".into())))
                .collect()
        }
    };
    for (r, got) in results.into_iter().enumerate() {
        let (calls, pending) = got.map_err(|e| ctx(format!("rank {r}: {e}")))?;
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
        s.check_rank(r, &outcomes, &pending, all_at_once, !all_at_once)
            .map_err(|e| {
                let got: Vec<_> = outcomes.iter().map(|o| &o.result).collect();
                ctx(format!(
                    "{e}: its calls {got:?}, its pending errors {pending:?}"
                ))
            })?;
    }
    Ok(heap_reads.into_inner())
}

/// Runs the scenarios, `PARALLEL` at a time; returns the failures and the payload parts
/// read out of peers' shared heaps, over all the runs.
fn run_all(runs: Vec<(Scenario, bool)>, path: Path) -> (Vec<String>, u64) {
    let (tx, rx) = mpsc::channel();
    let queue = std::sync::Mutex::new(runs.into_iter());
    std::thread::scope(|sc| {
        for _ in 0..PARALLEL {
            let (tx, queue) = (tx.clone(), &queue);
            sc.spawn(move || loop {
                let next = queue.lock().unwrap_or_else(|e| e.into_inner()).next();
                let Some((s, all)) = next else { break };
                let _ = tx.send(check(&s, path, all));
            });
        }
    });
    drop(tx);
    let (mut failures, mut reads) = (Vec::new(), 0);
    for got in rx {
        match got {
            Ok(n) => reads += n,
            Err(e) => failures.push(e),
        }
    }
    (failures, reads)
}

/// Runs the matrix on `path`; the payload parts read out of peers' shared heaps.
fn matrix(all: Vec<Scenario>, path: Path) -> u64 {
    let w = all.first().map_or(0, |s| s.w);
    let mut runs: Vec<(Scenario, bool)> = all.iter().map(|s| (s.clone(), false)).collect();
    // All at once where it changes the outcome (the opposite-order program completes) or
    // the order of failures (a rank calling twice).
    runs.extend(
        all.iter()
            .filter(|s| matches!(s.fault, Fault::Opposite | Fault::Twice))
            .map(|s| (s.clone(), true)),
    );
    let n = runs.len();
    let (failures, reads) = run_all(runs, path);
    assert!(
        failures.is_empty(),
        "{} of {n} runs failed at W={w} ({path:?}); the first:\n{}",
        failures.len(),
        failures.join("\n")
    );
    reads
}

#[test]
fn fault_matrix_on_the_engine_in_one_process_w2() {
    matrix(Scenario::all(2), Path::OneProcess);
}

#[test]
fn fault_matrix_on_the_engine_in_one_process_w3() {
    matrix(Scenario::all(3), Path::OneProcess);
}

#[test]
fn fault_matrix_on_the_engine_in_one_process_w5() {
    matrix(Scenario::all(5), Path::OneProcess);
}

#[test]
fn fault_matrix_on_the_board_in_one_process_w2() {
    matrix(Scenario::board(2), Path::OneProcess);
}

#[test]
fn fault_matrix_on_the_board_in_one_process_w3() {
    matrix(Scenario::board(3), Path::OneProcess);
}

#[test]
fn fault_matrix_on_the_board_in_one_process_w5() {
    matrix(Scenario::board(5), Path::OneProcess);
}

/// The board's scenarios for a job: less the rank that never calls. Its only word of the
/// fault is the others' abort, sent when their calls end; in a job it is read by the
/// missing rank's transport (a socket's reader, a ring's poller) some time after, and this
/// harness destroys the group when every rank's program is over, which may come first
/// (about one run in five: no call, no pending error). In one process a link delivers as
/// it sends, and the in-process runs keep the missing rank.
fn for_a_job(all: Vec<Scenario>) -> Vec<Scenario> {
    all.into_iter()
        .filter(|s| !matches!(s.fault, Fault::Missing))
        .collect()
}

fn over_shared_memory(w: usize) -> Vec<Scenario> {
    for_a_job(Scenario::board(w))
}

#[test]
fn fault_matrix_on_the_board_over_shared_memory_w2() {
    matrix(over_shared_memory(2), Path::Job(Transport::Shm));
}

#[test]
fn fault_matrix_on_the_board_over_shared_memory_w3() {
    matrix(over_shared_memory(3), Path::Job(Transport::Shm));
}

/// The board's scenarios as they run over TCP, where there is no board and every call goes
/// to the engine: less those whose odd call only forces an algorithm, which may be the one
/// the table picks for the others (a 4-byte broadcast between 2 ranks goes direct either
/// way), and then is no disagreement at all.
fn over_tcp(w: usize) -> Vec<Scenario> {
    for_a_job(Scenario::board(w))
        .into_iter()
        .filter(|s| {
            !matches!(&s.fault, Fault::Differ(c)
                if c.kind == s.case.kind && c.algorithm.is_some() && s.case.algorithm.is_none())
        })
        .collect()
}

#[test]
fn fault_matrix_of_small_calls_over_tcp_w2() {
    matrix(over_tcp(2), Path::Job(Transport::Tcp));
}

#[test]
fn fault_matrix_of_small_calls_over_tcp_w3() {
    matrix(over_tcp(3), Path::Job(Transport::Tcp));
}

/// The engine's matrix over shared memory with every input a tensor in shared memory, each
/// call 64 Ki elements per rank (256 KiB of `i32`): the payloads are read straight out of
/// the sender's heap, and every fault still ends as it does on ordinary tensors. Without the
/// rank that never calls (see [`for_a_job`]).
fn on_shared_tensors(w: usize) {
    let reads = matrix(
        for_a_job(Scenario::all_of(w, 64 << 10)),
        Path::SharedTensors,
    );
    assert!(reads > 0, "no payload was read out of a peer's heap");
}

#[test]
fn fault_matrix_on_shared_tensors_over_shared_memory_w2() {
    on_shared_tensors(2);
}

#[test]
fn fault_matrix_on_shared_tensors_over_shared_memory_w3() {
    on_shared_tensors(3);
}
