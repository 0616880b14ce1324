//! Every disagreement between the ranks of a group on a small call (at most 28 bytes: the
//! calls that run on the board, `collectix::runtime::board`) ends in a typed error: on at
//! least one rank at the call, and on every rank by its next call. Never `Ok` everywhere.
//!
//! The programs: every ordered pair (A, B) of different calls among a barrier, all_reduce,
//! broadcast(root r) and reduce(dst r) that differ in kind, root, op, dtype or count; the
//! ranks of a non-empty proper subset holding rank 0 call A, the others B; 2, 3 and 4 ranks.
//! Each program runs on a fresh group of all ranks (every group of one process has a
//! board), issued two ways: by every rank at once from its own thread, and by one thread
//! in rank order before anyone waits (a broadcast's root, first, finishes before its peers
//! publish). The default run takes every program of 2 ranks and a sample of 3 and 4 (one
//! subset per pair); `COLLECTIX_LONG_TESTS=1` takes them all (docs/testing.md).
//!
//! Between processes of one host (the shared-memory board of a job's world group: each rank
//! here a thread that joins a job of its own, as a process would), each program needs a job
//! of its own: `the_same_disagreements_between_{2,3,4}_shm_ranks_are_errors` run every
//! program of 2 ranks and a sample of 3, and with `COLLECTIX_LONG_TESTS=1` every program of 2
//! and 3 and a sample of 4.

use crate::common;

use collectix::{Communicator, Error, GroupOptions, ReduceOp, Result, Tensor, Work, World};
use std::time::{Duration, Instant};

/// The calls' timeout: a program that takes half of it waited for a timeout instead of
/// hearing of the mismatch.
const TIMEOUT: Duration = Duration::from_secs(20);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dt {
    F32,
    I32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Sum,
    Max,
}

/// A small call, as one rank makes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Call {
    Barrier,
    AllReduce(Op, Dt, usize),
    Broadcast(usize, Dt, usize),
    Reduce(usize, Op, Dt, usize),
}

/// The calls of a group of `w`: each differs from some other in exactly one of kind, root,
/// op, dtype or count (28 bytes at most).
fn calls(w: usize) -> Vec<Call> {
    use Call::*;
    let mut v = vec![
        Barrier,
        AllReduce(Op::Sum, Dt::F32, 1),
        AllReduce(Op::Max, Dt::F32, 1),
        AllReduce(Op::Sum, Dt::I32, 1),
        AllReduce(Op::Sum, Dt::F32, 7),
        Broadcast(0, Dt::I32, 1),
        Broadcast(0, Dt::F32, 7),
        Reduce(0, Op::Max, Dt::F32, 1),
        Reduce(0, Op::Sum, Dt::I32, 1),
    ];
    for r in 0..w {
        v.push(Broadcast(r, Dt::F32, 1));
        v.push(Reduce(r, Op::Sum, Dt::F32, 1));
    }
    v
}

fn tensor(dt: Dt, n: usize, rank: usize) -> Tensor {
    match dt {
        Dt::F32 => Tensor::from_vec(vec![rank as f32 + 1.0; n]),
        Dt::I32 => Tensor::from_vec(vec![rank as i32 + 1; n]),
    }
}

fn op(o: Op) -> ReduceOp {
    match o {
        Op::Sum => ReduceOp::Sum,
        Op::Max => ReduceOp::Max,
    }
}

enum Issued {
    Unit(Work<()>),
    Tensor(Work<Tensor>),
}

impl Issued {
    fn wait(self, what: &str) -> Result<()> {
        let d = Duration::from_secs(60);
        let got = match self {
            Issued::Unit(w) => w.wait_timeout(d),
            Issued::Tensor(w) => w.wait_timeout(d).map(|r| r.map(drop)),
        };
        got.unwrap_or_else(|| panic!("{what}: no result within 60 s"))
    }
}

fn issue(c: &Communicator, call: Call) -> Issued {
    let r = c.rank();
    match call {
        Call::Barrier => Issued::Unit(c.barrier()),
        Call::AllReduce(o, dt, n) => Issued::Tensor(c.all_reduce(tensor(dt, n, r), op(o))),
        Call::Broadcast(root, dt, n) => Issued::Tensor(c.broadcast(tensor(dt, n, r), root)),
        Call::Reduce(dst, o, dt, n) => Issued::Tensor(c.reduce(tensor(dt, n, r), dst, op(o))),
    }
}

/// How the ranks issue their calls.
#[derive(Clone, Copy, Debug)]
enum Issue {
    /// Every rank from its own thread, at once.
    Together,
    /// One thread, in rank order, before any is waited for.
    InTurn,
}

/// Each rank's call's result and its next call's (a barrier), in rank order.
fn run(comms: &[Communicator], program: &[Call], how: Issue) -> Vec<(Result<()>, Result<()>)> {
    match how {
        Issue::Together => std::thread::scope(|s| {
            let hs: Vec<_> = comms
                .iter()
                .zip(program)
                .map(|(c, &call)| {
                    s.spawn(move || {
                        let first = issue(c, call).wait("the call");
                        (first, Issued::Unit(c.barrier()).wait("the next call"))
                    })
                })
                .collect();
            hs.into_iter()
                .map(|h| h.join().unwrap_or_else(|_| panic!("a rank panicked")))
                .collect()
        }),
        Issue::InTurn => {
            let works: Vec<_> = comms
                .iter()
                .zip(program)
                .map(|(c, &k)| issue(c, k))
                .collect();
            let first: Vec<_> = works.into_iter().map(|w| w.wait("the call")).collect();
            let next: Vec<_> = comms.iter().map(|c| Issued::Unit(c.barrier())).collect();
            first
                .into_iter()
                .zip(next)
                .map(|(f, n)| (f, n.wait("the next call")))
                .collect()
        }
    }
}

/// The programs of `w` ranks: (A, B, the ranks that call A); with `all`, every non-empty
/// proper subset that holds rank 0, else one per pair (rotating with the pair).
fn programs(w: usize, all: bool) -> Vec<Vec<Call>> {
    let cs = calls(w);
    let subsets: Vec<u32> = (1..(1u32 << w) - 1).filter(|s| s & 1 == 1).collect();
    let mut out = Vec::new();
    let mut k = 0;
    for &a in &cs {
        for &b in &cs {
            if a == b {
                continue;
            }
            let chosen: Vec<u32> = if all {
                subsets.clone()
            } else {
                k += 1;
                vec![subsets[k % subsets.len()]]
            };
            for s in chosen {
                out.push(
                    (0..w)
                        .map(|r| if s >> r & 1 == 1 { a } else { b })
                        .collect(),
                );
            }
        }
    }
    out
}

/// A new group of `members` (every rank of `comms`), made by all of them at once.
fn fresh_group(comms: &[Communicator], members: &[usize]) -> Vec<Communicator> {
    std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .map(|c| s.spawn(|| c.new_group(members).wait()))
            .collect();
        hs.into_iter()
            .map(|h| match h.join() {
                Ok(Ok(Some(g))) => g,
                other => panic!("new_group: {other:?}"),
            })
            .collect()
    })
}

fn long() -> bool {
    std::env::var("COLLECTIX_LONG_TESTS").is_ok_and(|v| v == "1")
}

/// What is wrong with the outcome of `program`, if anything: `Ok` everywhere, a rank with
/// no error at its call nor its next, or an error that is a timeout (a mismatch must be
/// heard of, not waited out).
fn judge(program: &[Call], how: Issue, got: &[(Result<()>, Result<()>)]) -> Option<String> {
    let at_call = got.iter().filter(|(f, _)| f.is_err()).count();
    let unheard: Vec<usize> = (0..got.len())
        .filter(|&r| got[r].0.is_ok() && got[r].1.is_ok())
        .collect();
    let timed_out = got.iter().flat_map(|(f, n)| [f, n]).find_map(|r| match r {
        Err(e) if matches!(e.root_cause(), Error::Timeout { .. }) => Some(e.to_string()),
        _ => None,
    });
    if at_call == 0 || !unheard.is_empty() || timed_out.is_some() {
        return Some(format!(
            "{program:?} ({how:?}): errors at the call {at_call}, ranks that heard of none {unheard:?}, a timeout: {timed_out:?}; got {got:?}"
        ));
    }
    None
}

fn in_one_process(w: usize) {
    let opts = GroupOptions {
        desync_grace: Duration::from_millis(500),
        ..GroupOptions::default().with_timeout(TIMEOUT)
    };
    let world = World::local_with(w, opts).unwrap_or_else(|e| panic!("{e}"));
    let comms = world.communicators();
    let everyone: Vec<usize> = (0..w).collect();
    let mut wrong = Vec::new();
    let mut n = 0;
    for program in programs(w, w == 2 || long()) {
        for how in [Issue::Together, Issue::InTurn] {
            let groups = fresh_group(comms, &everyone);
            let t0 = Instant::now();
            let got = run(&groups, &program, how);
            n += 1;
            wrong.extend(judge(&program, how, &got));
            // Heard of, not waited out: far below the calls' timeout (a mismatch reaches
            // every member as the group's abort).
            if t0.elapsed() > TIMEOUT / 2 {
                wrong.push(format!(
                    "{program:?} ({how:?}): took {:?}, the calls' timeout is {TIMEOUT:?}; got {got:?}",
                    t0.elapsed()
                ));
            }
            for g in &groups {
                let _ = g.destroy().wait();
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {n} programs of {w} ranks:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
    eprintln!("{n} programs of {w} ranks: a typed error in each");
    assert_eq!(world.shutdown(), Ok(()));
}

#[test]
fn every_small_disagreement_between_2_ranks_is_an_error() {
    in_one_process(2);
}

#[test]
fn every_small_disagreement_between_3_ranks_is_an_error() {
    in_one_process(3);
}

#[test]
fn every_small_disagreement_between_4_ranks_is_an_error() {
    in_one_process(4);
}

#[test]
fn broadcasts_that_each_name_their_own_rank_as_root_fail() {
    // The probe as a new user tried it: a fresh world, a 1-element tensor, rank r names
    // itself the root; then monitored_barrier and shutdown.
    for how in [Issue::Together, Issue::InTurn] {
        let world = World::local(2).unwrap_or_else(|e| panic!("{e}"));
        let comms = world.communicators();
        let program: Vec<Call> = (0..2).map(|r| Call::Broadcast(r, Dt::F32, 1)).collect();
        let works: Vec<_> = match how {
            Issue::Together => std::thread::scope(|s| {
                let hs: Vec<_> = comms
                    .iter()
                    .zip(&program)
                    .map(|(c, &k)| s.spawn(move || issue(c, k).wait("the call")))
                    .collect();
                hs.into_iter()
                    .map(|h| h.join().unwrap_or_else(|_| panic!("a rank panicked")))
                    .collect()
            }),
            Issue::InTurn => {
                let w: Vec<_> = comms
                    .iter()
                    .zip(&program)
                    .map(|(c, &k)| issue(c, k))
                    .collect();
                w.into_iter().map(|w| w.wait("the call")).collect()
            }
        };
        assert!(
            works
                .iter()
                .any(|r| matches!(r, Err(Error::Mismatch { .. }))),
            "{how:?}: {works:?}"
        );
        let next: Vec<_> = comms
            .iter()
            .map(|c| c.monitored_barrier(Duration::from_secs(10)))
            .collect();
        for (r, n) in common::wait_all(next, 30).into_iter().enumerate() {
            let Err(e) = n else {
                panic!("{how:?} rank {r}: monitored_barrier after the mismatch returned Ok");
            };
            assert!(
                matches!(e.root_cause(), Error::Mismatch { .. }),
                "{how:?} rank {r}: {e}"
            );
        }
        let _ = world.shutdown();
    }
}

#[test]
fn a_mismatch_one_rank_sees_reaches_a_rank_waiting_on_the_board_at_once() {
    // Rank 1 sees the mismatch (rank 0's broadcast, a root's, ends at once); rank 0's next
    // call waits on the board for rank 1's slot, which never comes: the group's abort must
    // end it, not its timeout. Many runs: the abort may come at any point of that call.
    let runs = if long() { 10_000 } else { 2_000 };
    let opts = GroupOptions {
        desync_grace: Duration::from_millis(500),
        ..GroupOptions::default().with_timeout(Duration::from_secs(5))
    };
    let world = World::local_with(2, opts).unwrap_or_else(|e| panic!("{e}"));
    let comms = world.communicators();
    let program = [
        Call::Broadcast(0, Dt::F32, 7),
        Call::Broadcast(0, Dt::F32, 1),
    ];
    let mut slow = Vec::new();
    for k in 0..runs {
        let groups = fresh_group(comms, &[0, 1]);
        let t0 = Instant::now();
        let got = run(&groups, &program, Issue::Together);
        if let Some(w) = judge(&program, Issue::Together, &got) {
            panic!("run {k}: {w}");
        }
        if t0.elapsed() > Duration::from_secs(2) {
            slow.push((k, t0.elapsed()));
        }
        for g in &groups {
            let _ = g.destroy().wait();
        }
    }
    assert!(slow.is_empty(), "runs that waited for a timeout: {slow:?}");
    assert_eq!(world.shutdown(), Ok(()));
}

/// Each rank's call's result and its next call's, in rank order.
type Outcome = Vec<(Result<()>, Result<()>)>;

/// `program` on the world group of a job of ranks that share memory (each rank a process
/// of its own to collectix: its own segment, its lane of the board in it), rank `r` making
/// its call `skew * r` after the job started: each rank's call's result and its next
/// call's, and when each rank's call, next call and shutdown returned (for a slow job's
/// report).
fn over_shared_memory(program: &[Call], skew: Duration) -> (Outcome, Vec<String>) {
    let w = program.len();
    let got = std::sync::Mutex::new(vec![None; w]);
    let times = std::sync::Mutex::new(vec![String::new(); w]);
    let ends = common::job(
        collectix::Transport::Shm,
        w,
        "the board mismatch tests' secret",
        TIMEOUT,
        |r, p| {
            let t0 = Instant::now();
            let c = p.communicator();
            std::thread::sleep(skew * r as u32);
            let first = issue(c, program[r]).wait("the call");
            let called = t0.elapsed();
            let next = Issued::Unit(c.barrier()).wait("the next call");
            let nexted = t0.elapsed();
            if let Ok(mut g) = got.lock() {
                g[r] = Some((first, next));
            }
            let _ = p.shutdown();
            if let Ok(mut t) = times.lock() {
                t[r] = format!(
                    "rank {r}: call {called:?}, next {nexted:?}, shutdown {:?}",
                    t0.elapsed()
                );
            }
            Ok(())
        },
    );
    for (r, e) in ends.into_iter().enumerate() {
        if let Err(e) = e {
            panic!("rank {r} of {program:?}: {e}");
        }
    }
    let got = got
        .into_inner()
        .unwrap_or_else(|e| panic!("{e}"))
        .into_iter()
        .enumerate()
        .map(|(r, g)| g.unwrap_or_else(|| panic!("rank {r} of {program:?} reported nothing")))
        .collect();
    (got, times.into_inner().unwrap_or_else(|e| panic!("{e}")))
}

/// Jobs of `w` ranks over shared memory, one per program (every program where `all`, else
/// one subset per pair), every `step`th, its ranks at once and 2 ms apart: a typed error in
/// each.
fn disagreements_between_shm_ranks(w: usize, all: bool, step: usize) {
    let mut wrong = Vec::new();
    let mut n = 0;
    for program in programs(w, all).into_iter().step_by(step) {
        for skew in [Duration::ZERO, Duration::from_millis(2)] {
            let t0 = Instant::now();
            let (got, times) = over_shared_memory(&program, skew);
            n += 1;
            let how = Issue::Together;
            wrong.extend(judge(&program, how, &got).map(|e| format!("skew {skew:?}: {e}")));
            if t0.elapsed() > TIMEOUT / 2 {
                wrong.push(format!(
                    "{program:?}: took {:?} ({})",
                    t0.elapsed(),
                    times.join("; ")
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {n} programs:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
    eprintln!("{n} programs of {w} ranks over shared memory: a typed error in each");
}

// The same disagreements between ranks over shared memory: every program of 2 ranks and a
// quarter of those of 3 (one subset per pair); with COLLECTIX_LONG_TESTS=1 every program of
// 2 and 3 ranks, and of 4 one subset per pair. A test per size, so that the harness runs
// them side by side.

#[test]
fn the_same_disagreements_between_2_shm_ranks_are_errors() {
    disagreements_between_shm_ranks(2, true, 1);
}

#[test]
fn the_same_disagreements_between_3_shm_ranks_are_errors() {
    if long() {
        disagreements_between_shm_ranks(3, true, 1);
    } else {
        disagreements_between_shm_ranks(3, false, 4);
    }
}

#[test]
fn the_same_disagreements_between_4_shm_ranks_are_errors() {
    if long() {
        disagreements_between_shm_ranks(4, false, 1);
    } else {
        eprintln!("4 shm ranks: with COLLECTIX_LONG_TESTS=1 only");
    }
}
