//! The flight recorder and `job_status` (what `collectix status` prints): every rank of a TCP
//! job answers through the store within the wait, with its last calls, and the rank that is
//! behind is named with the call the others wait in. `JobStatus::explain` (`collectix status
//! --explain`) gives each rank and group its verdict, each provoked here: healthy and dead
//! (a rank that shut down), stuck and slow (a rank that has not reached the others' call),
//! slow by its lateness (a rank that comes last to every call), mismatch, and a wait cycle
//! across groups while it forms (before any call on it has timed out).

use collectix::{
    init, job_status, CallState, GroupOptions, ReduceOp, Secret, Security, TcpStore, Tensor, World,
};
use std::time::Duration;

use crate::common;
use common::{free_port, tcp_args};

const SECRET: &str = "the status test's secret";

#[test]
fn each_rank_records_its_last_calls() {
    let w = World::local(2).unwrap_or_else(|e| panic!("{e}"));
    let c = w.communicators();
    for _ in 0..3 {
        let works: Vec<_> = c
            .iter()
            .map(|c| c.all_reduce(Tensor::from_vec(vec![1.0f32; 4]), ReduceOp::Sum))
            .collect();
        for wk in works {
            wk.wait().unwrap_or_else(|e| panic!("{e}"));
        }
    }
    let rec = c[0].flight_record();
    assert_eq!(rec.len(), 3);
    for (i, r) in rec.iter().enumerate() {
        assert_eq!(r.seq, Some(i as u64));
        assert_eq!(r.count, Some(4));
        assert_eq!(r.state, CallState::Completed);
        assert!(r.ended_ms.is_some());
    }
    let line = rec[2].to_string();
    assert!(
        line.starts_with("group world #2 all_reduce float32 x4 @ "),
        "{line}"
    );
    assert!(line.contains(": completed in "), "{line}");
    drop(w);
}

#[test]
fn the_rank_that_is_behind_is_named_within_a_second() {
    let port = free_port();
    let secret = || Secret::new(SECRET).unwrap_or_else(|e| panic!("{e}"));
    let w = 3;
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let rx = std::sync::Mutex::new(rx);
    std::thread::scope(|s| {
        for r in 0..w {
            let rx = &rx;
            s.spawn(move || {
                let args = tcp_args(port, r, w, SECRET, false);
                let p = init(&args, GroupOptions::default(), Duration::from_secs(20))
                    .unwrap_or_else(|e| panic!("{e}"));
                let c = p.communicator();
                for _ in 0..2 {
                    c.barrier().wait().unwrap_or_else(|e| panic!("{e}"));
                }
                // Rank 2 stays behind until the test has looked; the others wait in call #2.
                if r == 2 {
                    let _ = rx.lock().unwrap_or_else(|e| e.into_inner()).recv();
                }
                c.barrier().wait().unwrap_or_else(|e| panic!("{e}"));
                p.shutdown().unwrap_or_else(|e| panic!("{e}"));
            });
        }
        std::thread::sleep(Duration::from_millis(300));
        let store = TcpStore::connect_secured(
            format!("127.0.0.1:{port}"),
            Duration::from_secs(5),
            Security::with_secret(secret()),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let start = std::time::Instant::now();
        let status =
            job_status(&store, w, Duration::from_secs(1)).unwrap_or_else(|e| panic!("{e}"));
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "took {:?}",
            start.elapsed()
        );
        let _ = tx.send(());
        for r in &status.ranks {
            let calls = r
                .calls
                .as_ref()
                .unwrap_or_else(|| panic!("rank {} did not answer", r.rank));
            assert!(calls.len() >= 2, "rank {}: {calls:?}", r.rank);
        }
        assert_eq!(
            status.findings,
            vec!["group world: behind call #2: rank 2 (at #1, completed); waiting in it: ranks [0, 1]".to_string()],
            "{status:?}"
        );
        let verdicts = explained(&status, Duration::from_millis(100));
        for v in &verdicts {
            println!("{v}");
        }
        assert_eq!(words(&verdicts), ["stuck", "stuck", "slow"], "{verdicts:?}");
        for v in &verdicts[..2] {
            assert!(
                v.ends_with("stuck in call #2 (barrier), waiting for ranks [2]"),
                "{v}"
            );
        }
        assert_eq!(
            verdicts[2],
            "rank 2, group world: slow: has not reached call #2, which ranks [0, 1] wait in"
        );
    });
}

/// The verdicts' lines, the time a call has waited taken out (`for 0.3 s`).
fn explained(status: &collectix::JobStatus, stuck_after: Duration) -> Vec<String> {
    status
        .explain(stuck_after)
        .iter()
        .map(|v| {
            let line = v.to_string();
            match (line.find(" for "), line.find(" s, ")) {
                (Some(a), Some(b)) if a < b => format!("{}{}", &line[..a], &line[b + 2..]),
                _ => line,
            }
        })
        .collect()
}

/// Each verdict's word (`rank R, group G: WORD...`).
fn words(lines: &[String]) -> Vec<&str> {
    lines
        .iter()
        .map(|l| {
            l.split(": ")
                .nth(1)
                .and_then(|v| v.split([' ', ':']).next())
                .unwrap_or("")
        })
        .collect()
}

/// Asks `port`'s job (of `w` ranks) for its status.
fn status_of(port: u16, w: usize) -> collectix::JobStatus {
    let secret = Secret::new(SECRET).unwrap_or_else(|e| panic!("{e}"));
    let store = TcpStore::connect_secured(
        format!("127.0.0.1:{port}"),
        Duration::from_secs(5),
        Security::with_secret(secret),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    job_status(&store, w, Duration::from_secs(1)).unwrap_or_else(|e| panic!("{e}"))
}

/// Ranks 0 and 1 completed their calls and wait (healthy); rank 2 shut down (dead: its
/// answerer stopped with it).
#[test]
fn a_rank_that_shut_down_is_dead_and_the_others_healthy() {
    let port = free_port();
    let w = 3;
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let (gone_tx, gone_rx) = std::sync::mpsc::channel::<()>();
    let rx = std::sync::Mutex::new(rx);
    std::thread::scope(|s| {
        for r in 0..w {
            let (rx, gone_tx) = (&rx, gone_tx.clone());
            s.spawn(move || {
                let args = tcp_args(port, r, w, SECRET, false);
                let p = init(&args, GroupOptions::default(), Duration::from_secs(20))
                    .unwrap_or_else(|e| panic!("{e}"));
                p.communicator()
                    .barrier()
                    .wait()
                    .unwrap_or_else(|e| panic!("{e}"));
                if r == 2 {
                    p.abort();
                    let _ = gone_tx.send(());
                } else {
                    let _ = rx.lock().unwrap_or_else(|e| e.into_inner()).recv();
                    p.abort();
                }
            });
        }
        let _ = gone_rx.recv();
        // Its answerer stops within a second of the process going.
        std::thread::sleep(Duration::from_millis(1500));
        let status = status_of(port, w);
        let _ = tx.send(());
        let _ = tx.send(());
        let verdicts = explained(&status, Duration::from_secs(1));
        for v in &verdicts {
            println!("{v}");
        }
        assert_eq!(
            verdicts,
            [
                "rank 0, group world: healthy",
                "rank 1, group world: healthy",
                "rank 2, group world: dead: did not answer"
            ],
            "{status:?}"
        );
    });
}

/// Two ranks of a TCP job, two groups of both: rank 0 calls on A, rank 1 on B, and each waits
/// for the other (a wait cycle). Before the calls time out (their timeout is 20 s), the
/// verdict of each on the group it is stuck in is the cycle, naming both waits; on the other
/// group, slow (it holds the other rank's call).
#[test]
fn ranks_waiting_for_each_other_across_groups_are_a_cycle_while_it_forms() {
    let port = free_port();
    let w = 2;
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let (made_tx, made_rx) = std::sync::mpsc::channel::<()>();
    let rx = std::sync::Mutex::new(rx);
    std::thread::scope(|s| {
        for r in 0..w {
            let (rx, made_tx) = (&rx, made_tx.clone());
            s.spawn(move || {
                let args = tcp_args(port, r, w, SECRET, false);
                let p = init(&args, GroupOptions::default(), Duration::from_secs(20))
                    .unwrap_or_else(|e| panic!("{e}"));
                let c = p.communicator();
                let a = c.new_group(&[0, 1]).wait().ok().flatten();
                let b = c.new_group(&[0, 1]).wait().ok().flatten();
                let (Some(a), Some(b)) = (a, b) else {
                    panic!("rank {r}: no groups");
                };
                let first = if r == 0 { &a } else { &b };
                let t = Tensor::from_vec(vec![1.0f32; 4096]);
                let work = first.all_reduce(t, ReduceOp::Sum);
                let _ = made_tx.send(());
                let _ = rx.lock().unwrap_or_else(|e| e.into_inner()).recv();
                p.abort();
                drop(work);
            });
        }
        for _ in 0..w {
            let _ = made_rx.recv();
        }
        std::thread::sleep(Duration::from_millis(300));
        let status = status_of(port, w);
        for _ in 0..w {
            let _ = tx.send(());
        }
        let verdicts: Vec<String> = status
            .explain(Duration::from_millis(100))
            .iter()
            .map(|v| v.to_string())
            .collect();
        for v in &verdicts {
            println!("{v}");
        }
        let cycles: Vec<&String> = verdicts
            .iter()
            .filter(|v| v.contains(": wait cycle: "))
            .collect();
        assert_eq!(cycles.len(), 2, "{verdicts:?}");
        for (r, v) in [0, 1].into_iter().zip(&cycles) {
            let _ = r;
            assert!(
                v.contains("stuck in call #0 (all_reduce)")
                    && v.contains("rank 0 waits in group ")
                    && v.contains("rank 1 waits in group "),
                "{v}"
            );
        }
        let slow = verdicts
            .iter()
            .filter(|v| v.contains(": slow: has not reached call #0"))
            .count();
        assert_eq!(slow, 2, "{verdicts:?}");
    });
}

/// Two ranks of a TCP job make different calls at one sequence number: both are told
/// (`Error::Mismatch`), and their verdict says so.
#[test]
fn ranks_whose_calls_did_not_match_are_a_mismatch() {
    let port = free_port();
    let w = 2;
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let (failed_tx, failed_rx) = std::sync::mpsc::channel::<()>();
    let rx = std::sync::Mutex::new(rx);
    std::thread::scope(|s| {
        for r in 0..w {
            let (rx, failed_tx) = (&rx, failed_tx.clone());
            s.spawn(move || {
                let args = tcp_args(port, r, w, SECRET, false);
                let p = init(&args, GroupOptions::default(), Duration::from_secs(20))
                    .unwrap_or_else(|e| panic!("{e}"));
                let t = Tensor::from_vec(vec![1.0f32; 3 + r]);
                let got = p.communicator().all_reduce(t, ReduceOp::Sum).wait();
                assert!(got.is_err(), "rank {r}: {got:?}");
                let _ = failed_tx.send(());
                let _ = rx.lock().unwrap_or_else(|e| e.into_inner()).recv();
                p.abort();
            });
        }
        for _ in 0..w {
            let _ = failed_rx.recv();
        }
        let status = status_of(port, w);
        for _ in 0..w {
            let _ = tx.send(());
        }
        let verdicts = explained(&status, Duration::from_secs(1));
        for v in &verdicts {
            println!("{v}");
        }
        assert_eq!(words(&verdicts), ["mismatch", "mismatch"], "{status:?}");
        for v in &verdicts {
            assert!(
                v.contains(": mismatch at call #0: ")
                    && v.contains("mismatched calls on group world"),
                "{v}"
            );
        }
    });
}

/// Rank 2 of a TCP job sleeps 30 ms before each of 10 all_reduces: `job_status` (what
/// `collectix status` prints) names it from the ranks' views of who came last.
#[test]
fn the_rank_that_comes_last_to_the_calls_is_named() {
    let port = free_port();
    let secret = || Secret::new(SECRET).unwrap_or_else(|e| panic!("{e}"));
    let w = 3;
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let rx = std::sync::Mutex::new(rx);
    std::thread::scope(|s| {
        for r in 0..w {
            let (rx, done_tx) = (&rx, done_tx.clone());
            s.spawn(move || {
                let args = tcp_args(port, r, w, SECRET, false);
                let p = init(&args, GroupOptions::default(), Duration::from_secs(20))
                    .unwrap_or_else(|e| panic!("{e}"));
                let c = p.communicator();
                for _ in 0..10 {
                    if r == 2 {
                        std::thread::sleep(Duration::from_millis(30));
                    }
                    let t = Tensor::from_vec(vec![1.0f32; 256]);
                    c.all_reduce(t, ReduceOp::Sum)
                        .wait()
                        .unwrap_or_else(|e| panic!("{e}"));
                }
                let _ = done_tx.send(());
                // Every rank stays until the test has looked.
                if r == 0 {
                    let _ = rx.lock().unwrap_or_else(|e| e.into_inner()).recv();
                }
                c.barrier().wait().unwrap_or_else(|e| panic!("{e}"));
                p.shutdown().unwrap_or_else(|e| panic!("{e}"));
            });
        }
        for _ in 0..w {
            let _ = done_rx.recv();
        }
        let store = TcpStore::connect_secured(
            format!("127.0.0.1:{port}"),
            Duration::from_secs(5),
            Security::with_secret(secret()),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let status =
            job_status(&store, w, Duration::from_secs(2)).unwrap_or_else(|e| panic!("{e}"));
        let _ = tx.send(());
        let late: Vec<&String> = status
            .findings
            .iter()
            .filter(|f| f.contains("came last"))
            .collect();
        assert_eq!(late.len(), 1, "{status:?}");
        assert!(
            late[0].starts_with("group world: rank 2 came last in "),
            "{status:?}"
        );
        let verdicts = explained(&status, Duration::from_secs(1));
        for v in &verdicts {
            println!("{v}");
        }
        assert_eq!(
            words(&verdicts),
            ["healthy", "healthy", "slow"],
            "{verdicts:?}"
        );
        assert!(
            verdicts[2].starts_with("rank 2, group world: slow: came last in "),
            "{verdicts:?}"
        );
        for r in &status.ranks {
            assert_eq!(r.lateness.len(), 1, "rank {}: {:?}", r.rank, r.lateness);
            assert!(r
                .calls
                .as_ref()
                .is_some_and(|c| c.iter().all(|l| !l.starts_with("late "))));
        }
        println!("{}", late[0]);
    });
}
