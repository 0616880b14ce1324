//! Surviving a failure, in one process: a revoke reaches every rank at once; a rank that
//! destroys a group with nothing in flight is heard at once; the survivors of a killed rank
//! shrink to a smaller group (together, skewed, or with a second rank killed during the
//! agreement), agree on what completed, and go on with exact results.
//!
//! The time bounds below are hang guards, not timings: the groups' timeout is 30 s, and a
//! rank that is told of a failure hears within milliseconds; a bound of a few seconds tells
//! one from the other on any machine.

use crate::common;
use collectix::{
    Communicator, DType, Error, GroupOptions, Recovered, ReduceOp, Tensor, TensorSpec, World,
};
use common::{free_port, root, tcp_args, wait_all};
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_secs(30);
/// Far below [`TIMEOUT`]: what a rank that was told takes, with room for a slow machine.
const TOLD: Duration = Duration::from_secs(5);

fn world(n: usize) -> World {
    World::local_with(n, GroupOptions::default().with_timeout(TIMEOUT))
        .unwrap_or_else(|e| panic!("{e}"))
}

fn ones(n: usize) -> Tensor {
    Tensor::from_vec(vec![1.0f32; n])
}

/// Each of `comms` all_reduces `[rank + 1]`; returns what each got.
fn sums(comms: &[Communicator]) -> Vec<collectix::Result<Vec<f32>>> {
    let works = comms
        .iter()
        .map(|c| c.all_reduce(Tensor::from_vec(vec![c.rank() as f32 + 1.0]), ReduceOp::Sum))
        .collect();
    wait_all(works, 60)
        .into_iter()
        .map(|r| r.and_then(|t| t.to_vec::<f32>()))
        .collect()
}

#[test]
fn a_revoke_reaches_every_rank_at_once_and_names_the_revoker() {
    let w = world(4);
    let c = w.communicators();
    let start = Instant::now();
    let waiting: Vec<_> = [0, 2, 3]
        .iter()
        .map(|&r| c[r].all_reduce(ones(8), ReduceOp::Sum))
        .collect();
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(c[1].revoke(), Ok(()));
    for (r, res) in [0, 2, 3].into_iter().zip(wait_all(waiting, 60)) {
        let e = res.err().unwrap_or_else(|| panic!("rank {r} completed"));
        assert_eq!(
            root(&e),
            &Error::Revoked {
                group: c[0].group_id(),
                by: 1
            },
            "rank {r}: {e}"
        );
    }
    assert!(start.elapsed() < TOLD, "told after {:?}", start.elapsed());
    // Later calls fail the same way, on every rank, the revoker's included.
    for (r, res) in sums(c).into_iter().enumerate() {
        let e = res
            .err()
            .unwrap_or_else(|| panic!("rank {r}: a later call completed"));
        assert!(matches!(root(&e), Error::Revoked { by: 1, .. }), "{e}");
    }
    drop(w);
}

/// A rank's thread that panics while it holds its communicator (no supervisor) revokes the
/// group as it unwinds: the others' calls fail at once, naming it (they used to wait out
/// their timeout).
/// The program's own code failing while it holds a handle.
fn fail(held: Communicator) {
    let _held = held;
    panic!("a bug in the program's own code");
}

/// [`fail`], caught; whether it panicked.
fn caught(held: Communicator) -> bool {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| fail(held))).is_err()
}

/// A panic that a program catches, or that ends a helper thread of its own, with a handle of
/// the group held there, revokes nothing: the rank goes on, and the group with it. Caught
/// with `catch_unwind` on a thread of the user's and on the calling thread, in a thread
/// pool's job (the pool catches it and keeps its worker), in a tokio task, for a handle of a
/// sub-group, and a panic that ends a thread of the user's: after each, every rank's next
/// all_reduce completes on the group. (A panic on a rank's own thread revokes its group:
/// `actors/src/comm.rs`; a body under `World::run` that panics is handled by its policy.)
#[test]
fn a_panic_the_program_catches_or_that_ends_its_own_thread_revokes_nothing() {
    let w = world(3);
    let c = w.communicators().to_vec();
    let sub = wait_all(c.iter().map(|c| c.new_group(&[0, 1])).collect(), 60);
    let sub0 = sub[0]
        .as_ref()
        .ok()
        .and_then(|s| s.clone())
        .unwrap_or_else(|| panic!("no sub-group: {sub:?}"));
    // On a thread of the user's.
    let held = c[0].clone();
    assert_eq!(
        std::thread::spawn(move || caught(held)).join().ok(),
        Some(true)
    );
    // On this thread.
    assert!(caught(c[0].clone()));
    // A pool's job: a worker that runs jobs and catches what they throw (as rayon and
    // threadpool do), then takes the next one.
    let (jobs, queue) = std::sync::mpsc::channel::<Box<dyn FnOnce() + Send>>();
    let worker = std::thread::spawn(move || {
        let mut caught = 0;
        for job in queue {
            caught +=
                usize::from(std::panic::catch_unwind(std::panic::AssertUnwindSafe(job)).is_err());
        }
        caught
    });
    let held = c[0].clone();
    let _ = jobs.send(Box::new(move || fail(held)));
    drop(jobs);
    assert_eq!(worker.join().ok(), Some(1));
    // A tokio task.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let held = c[0].clone();
    let task = rt.block_on(async move { tokio::spawn(async move { fail(held) }).await });
    assert!(task.is_err_and(|e| e.is_panic()));
    drop(rt);
    // A sub-group's handle.
    assert!(caught(sub0.clone()));
    // A panic that ends a helper thread of the program's.
    let held = c[0].clone();
    assert!(std::thread::spawn(move || fail(held)).join().is_err());
    for (r, res) in sums(&c).into_iter().enumerate() {
        assert_eq!(res, Ok(vec![6.0]), "rank {r}: the world group goes on");
    }
    let on_sub: Vec<_> = sub.iter().flatten().flatten().cloned().collect();
    for (r, res) in sums(&on_sub).into_iter().enumerate() {
        assert_eq!(res, Ok(vec![3.0]), "rank {r}: the sub-group goes on");
    }
}

#[test]
fn a_rank_that_destroys_a_group_with_nothing_in_flight_is_heard_at_once() {
    let w = world(3);
    let c = w.communicators();
    assert_eq!(c[2].destroy().wait(), Ok(()));
    let start = Instant::now();
    let got = wait_all(
        c[..2]
            .iter()
            .map(|c| c.all_reduce(ones(4), ReduceOp::Sum))
            .collect(),
        60,
    );
    for (r, res) in got.into_iter().enumerate() {
        let e = res.err().unwrap_or_else(|| panic!("rank {r} completed"));
        assert_eq!(
            root(&e),
            &Error::PeerShutdown {
                rank: 2,
                undelivered: 0
            },
            "rank {r}: {e}"
        );
    }
    assert!(start.elapsed() < TOLD, "heard after {:?}", start.elapsed());
    // Leaving a group is no failure: nothing is pending on the others.
    assert_eq!(w.shutdown(), Ok(()));
}

/// Every survivor shrinks; checks the agreement and returns the new handles, in old rank
/// order.
fn shrink_all(survivors: &[&Communicator], delay_of: impl Fn(usize) -> Duration) -> Vec<Recovered> {
    std::thread::scope(|s| {
        let hs: Vec<_> = survivors
            .iter()
            .map(|c| {
                let d = delay_of(c.rank());
                s.spawn(move || {
                    std::thread::sleep(d);
                    c.shrink().wait()
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| panic!("a shrink panicked"))
                    .unwrap_or_else(|e| panic!("shrink failed: {e}"))
            })
            .collect()
    })
}

/// Four ranks train (an all_reduce per step); rank 2 is killed after step 3 while the
/// others are in step 4. The survivors fail, shrink to three ranks numbered 0, 1, 2 in the
/// order of their old ranks, agree that calls 0..3 completed everywhere, and go on with
/// exact sums. Skewed: one survivor comes to the agreement late.
#[test]
fn the_survivors_of_a_killed_rank_shrink_and_go_on() {
    for late in [None, Some(3usize)] {
        let w = world(4);
        let c = w.communicators();
        for step in 0..3 {
            for (r, s) in sums(c).into_iter().enumerate() {
                assert_eq!(s, Ok(vec![10.0]), "step {step}, rank {r}");
            }
        }
        let survivors: Vec<&Communicator> = [0, 1, 3].iter().map(|&r| &c[r]).collect();
        let step4: Vec<_> = survivors
            .iter()
            .map(|c| c.all_reduce(ones(1), ReduceOp::Sum))
            .collect();
        w.kill(2).unwrap_or_else(|e| panic!("{e}"));
        let start = Instant::now();
        for res in wait_all(step4, 60) {
            let e = res.err().unwrap_or_else(|| panic!("step 4 completed"));
            assert_eq!(root(&e), &Error::PeerLost { rank: 2 }, "{e}");
        }
        assert!(start.elapsed() < TOLD);
        let shrunk = shrink_all(&survivors, |r| {
            if Some(r) == late {
                Duration::from_millis(300)
            } else {
                Duration::ZERO
            }
        });
        for (i, s) in shrunk.iter().enumerate() {
            assert_eq!(s.completed, 3, "calls 0, 1 and 2 completed everywhere");
            assert_eq!(s.left_out, vec![2]);
            assert_eq!(
                (s.communicator.rank(), s.communicator.size()),
                (i, 3),
                "renumbered in order"
            );
            assert_eq!(s.communicator.members(), &[0, 1, 3]);
        }
        let next: Vec<Communicator> = shrunk.into_iter().map(|s| s.communicator).collect();
        for (r, s) in sums(&next).into_iter().enumerate() {
            assert_eq!(s, Ok(vec![6.0]), "rank {r} of the survivors");
        }
        // The new group does everything the old one did: an all_gather, for one.
        let works = next
            .iter()
            .map(|c| {
                c.all_gather_into_tensor(
                    TensorSpec::new(&[3], DType::I32),
                    Tensor::from_vec(vec![c.global_rank() as i32]),
                )
            })
            .collect();
        for t in wait_all(works, 60) {
            let t = t.unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(t.to_vec::<i32>(), Ok(vec![0, 1, 3]));
        }
        assert_eq!(w.shutdown(), Ok(()));
    }
}

/// Rank 3 is killed, and rank 1 dies during the survivors' agreement, at a point that
/// varies from run to run: the survivors never split. They end in one group (whichever
/// decision stood), and if the dead rank 1 is in it, its first call fails with the loss
/// and they shrink again, down to ranks 0 and 2.
#[test]
fn a_second_failure_during_the_agreement_never_splits_the_survivors() {
    for delay_ms in [0u64, 1, 3, 10] {
        let w = world(4);
        let c = w.communicators();
        w.kill(3).unwrap_or_else(|e| panic!("{e}"));
        let alive = [&c[0], &c[2]];
        let (mut groups, killer) = std::thread::scope(|s| {
            let killer = s.spawn(|| {
                std::thread::sleep(Duration::from_millis(delay_ms));
                w.kill(1)
            });
            // Rank 1 starts its part too (it may publish before it dies, or not).
            let _ghost = c[1].shrink();
            (shrink_all(&alive, |_| Duration::ZERO), killer.join())
        });
        assert!(matches!(killer, Ok(Ok(()))));
        assert_eq!(
            groups[0].communicator.group_id(),
            groups[1].communicator.group_id()
        );
        let mut rounds = 0;
        loop {
            rounds += 1;
            assert!(rounds <= 3, "still no working group after {rounds} rounds");
            let comms: Vec<Communicator> = groups.iter().map(|s| s.communicator.clone()).collect();
            let got = sums(&comms);
            if got.iter().all(Result::is_ok) {
                assert_eq!(comms[0].members(), &[0, 2]);
                for s in got {
                    assert_eq!(s, Ok(vec![3.0]));
                }
                break;
            }
            for s in &got {
                let e = s
                    .as_ref()
                    .err()
                    .unwrap_or_else(|| panic!("one ok, one not: {got:?}"));
                assert_eq!(root(e), &Error::PeerLost { rank: 1 }, "{e}");
            }
            let refs: Vec<&Communicator> = comms.iter().collect();
            groups = shrink_all(&refs, |_| Duration::ZERO);
        }
        drop(w);
    }
}

/// A rank that comes to the agreement after the group's timeout (a frozen process, say)
/// is left out: the others decided without it, and it is told so, naming the decider.
#[test]
fn a_rank_that_comes_after_the_timeout_is_left_out() {
    let w = World::local_with(
        3,
        GroupOptions::default().with_timeout(Duration::from_millis(300)),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let c = w.communicators();
    let shrunk = shrink_all(&[&c[0], &c[1]], |_| Duration::ZERO);
    assert_eq!(shrunk[0].communicator.members(), &[0, 1]);
    assert_eq!(shrunk[1].left_out, vec![2]);
    let e = c[2].shrink().wait().err();
    assert!(
        matches!(
            e,
            Some(Error::LeftOut {
                decided_by: 0 | 1,
                ..
            })
        ),
        "{e:?}"
    );
    drop(w);
}

/// `w` ranks over TCP loopback running `body` (`common::tcp_job`), with this file's secret
/// and timeout.
fn tcp_job(
    w: usize,
    body: impl Fn(usize, collectix::Process) -> Result<(), String> + Sync,
) -> Vec<Result<(), String>> {
    common::tcp_job(w, "the survive tests' secret", TIMEOUT, body)
}

/// [`tcp_job`] over `transport` (with `Shm`, the ranks share memory, TCP beside it).
fn job_over(
    transport: collectix::Transport,
    w: usize,
    body: impl Fn(usize, collectix::Process) -> Result<(), String> + Sync,
) -> Vec<Result<(), String>> {
    common::job(transport, w, "the survive tests' secret", TIMEOUT, body)
}

/// The body of a child process of
/// [`a_join_that_times_out_names_the_missing_rank_though_the_store_s_rank_exited`]: does
/// nothing unless `SURVIVE_CHILD` (`RANK PORT`) is set; then joins a job of 3 with a 2 s
/// timeout, prints the outcome, and the process ends (with the test harness).
#[test]
fn child_that_joins_a_job_of_three() {
    let Ok(spec) = std::env::var("SURVIVE_CHILD") else {
        return;
    };
    let mut words = spec.split(' ').filter_map(|w| w.parse::<usize>().ok());
    let (Some(r), Some(port)) = (words.next(), words.next()) else {
        return;
    };
    let world = words.next().unwrap_or(3);
    let secret = std::env::var("SURVIVE_CHILD_SECRET");
    let secret = secret.as_deref().unwrap_or("the survive tests' secret");
    let args = tcp_args(port as u16, r, world, secret, false);
    let options = GroupOptions::default().with_timeout(TIMEOUT);
    let start = Instant::now();
    match collectix::init(&args, options, Duration::from_secs(2)) {
        Ok(p) => {
            println!("CHILD {r}: joined");
            let _ = p.shutdown();
        }
        Err(e) => println!("CHILD {r}: {e}"),
    }
    println!("TOOK {r}: {} ms", start.elapsed().as_millis());
}

/// Rank 2 of a job of 3 never starts. Rank 0 (which serves the store) and rank 1, started a
/// second later, each time out in their join; rank 0's process then ends. Rank 1's error
/// still names rank 2: the store stayed up for it. (Rank 0 used to leave the store to a
/// thread that died with its process, and rank 1 got "Connection reset".)
#[test]
fn a_join_that_times_out_names_the_missing_rank_though_the_store_s_rank_exited() {
    let port = free_port();
    let child = |r: usize| {
        std::process::Command::new(std::env::current_exe().unwrap_or_else(|e| panic!("{e}")))
            .args([
                "--exact",
                "survive::child_that_joins_a_job_of_three",
                "--nocapture",
            ])
            .env("SURVIVE_CHILD", format!("{r} {port}"))
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{e}"))
    };
    let zero = child(0);
    std::thread::sleep(Duration::from_secs(1));
    let one = child(1);
    let said = |c: std::process::Child| {
        let out = c.wait_with_output().unwrap_or_else(|e| panic!("{e}"));
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .find(|l| l.starts_with("CHILD "))
            .unwrap_or_default()
            .to_string()
    };
    let (zero, one) = (said(zero), said(one));
    for (r, line) in [(0, &zero), (1, &one)] {
        assert!(
            line.starts_with(&format!("CHILD {r}: ")) && line.contains("waiting for addr/2"),
            "rank {r} said {line:?} (rank 0 said {zero:?})"
        );
    }
}

/// With lazy connections, rank 1 revokes the world and aborts its process at once (as a
/// program that gives up does), before it ever talked with rank 0: the revoke still reaches
/// rank 0, whose call fails at once naming rank 1, not at its timeout naming a rank it waits
/// for. (The revoke waited in front of a connection still being made, and `abort` dropped
/// it.)
#[test]
fn with_lazy_connections_an_abort_right_after_a_revoke_still_tells_the_peers() {
    let port = free_port();
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let rx = std::sync::Mutex::new(rx);
    let results: Vec<Result<(), String>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..3)
            .map(|r| {
                let tx = tx.clone();
                let rx = &rx;
                s.spawn(move || -> Result<(), String> {
                    let mut args = tcp_args(port, r, 3, "the survive tests' secret", false);
                    args.connect = Some(collectix::Connect::Lazy);
                    let options = GroupOptions::default().with_timeout(TIMEOUT);
                    let p = collectix::init(&args, options, Duration::from_secs(20))
                        .map_err(|e| e.to_string())?;
                    let c = p.communicator().clone();
                    match r {
                        0 => {
                            // Waits for rank 2, which never sends: only the revoke ends it.
                            let start = Instant::now();
                            let got = c.recv(TensorSpec::new(&[1], DType::F32), Some(2), 9);
                            let _ = tx.send(());
                            let e = got.wait().err().ok_or("the recv completed")?;
                            if !matches!(root(&e), Error::Revoked { by: 1, .. }) {
                                return Err(format!("rank 0 got {e}"));
                            }
                            if start.elapsed() > TOLD {
                                return Err(format!("rank 0 heard after {:?}", start.elapsed()));
                            }
                            p.abort();
                        }
                        1 => {
                            let _ = rx.lock().map_err(|e| e.to_string())?.recv();
                            c.revoke().map_err(|e| e.to_string())?;
                            p.abort();
                        }
                        _ => {
                            // Rank 2 stays until rank 0 is done, then goes.
                            std::thread::sleep(Duration::from_secs(1));
                            let _ = c
                                .recv(TensorSpec::new(&[1], DType::F32), Some(0), 9)
                                .wait_timeout(TOLD);
                            p.abort();
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        drop(tx);
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("panicked".into())))
            .collect()
    });
    assert_eq!(results[0], Ok(()), "{results:?}");
    assert_eq!(results[1], Ok(()), "{results:?}");
}

/// Rank `r` leaves (`Process::shutdown`, which must be `Ok` where `clean`) within 8 s: a hang
/// guard, not a timing (a leave that waits out a timeout takes 20 s or more here).
fn leave_in_time(r: usize, p: collectix::Process, clean: bool) -> Result<(), String> {
    let start = Instant::now();
    let left = p.shutdown();
    if clean {
        left.map_err(|e| format!("rank {r} left with {e}"))?;
    }
    if start.elapsed() > Duration::from_secs(8) {
        return Err(format!("rank {r}: leaving took {:?}", start.elapsed()));
    }
    Ok(())
}

/// Over TCP: a call whose arguments fail their checks on rank 0 is heard by rank 1 at once
/// (`CallFailed`, naming rank 0 and why; it used to wait out the 30 s timeout), and the next
/// call completes on both with the exact sum.
#[test]
fn over_tcp_a_bad_argument_on_one_rank_is_heard_at_once() {
    bad_argument_heard_at_once(collectix::Transport::Tcp);
}

/// The same over shared memory.
#[test]
fn over_shm_a_bad_argument_on_one_rank_is_heard_at_once() {
    bad_argument_heard_at_once(collectix::Transport::Shm);
}

fn bad_argument_heard_at_once(transport: collectix::Transport) {
    let results = job_over(transport, 2, |r, p| {
        let c = p.communicator();
        let start = Instant::now();
        let root_of = if r == 0 { 7 } else { 0 };
        let got = c.broadcast(ones(4), root_of).wait();
        match (&got, r) {
            (Err(Error::InvalidArgument(_)), 0) => {}
            (
                Err(Error::CallFailed {
                    rank: 0,
                    seq: 0,
                    reason,
                    ..
                }),
                1,
            ) if reason.contains("root 7") => {}
            _ => return Err(format!("rank {r}: {got:?}")),
        }
        if start.elapsed() > TOLD {
            return Err(format!("rank {r}: heard after {:?}", start.elapsed()));
        }
        let sum = sums(std::slice::from_ref(c)).remove(0);
        if sum != Ok(vec![3.0]) {
            return Err(format!("rank {r}: then {sum:?}"));
        }
        leave_in_time(r, p, true)
    });
    for (r, res) in results.into_iter().enumerate() {
        assert_eq!(res, Ok(()), "rank {r}");
    }
}

/// Over TCP: rank 2's process aborts; the survivors' next call fails naming it, they
/// shrink through the store, agree that the two calls before completed everywhere, go on
/// with an exact sum over the new group, and leave without waiting for the dead rank.
#[test]
fn over_tcp_the_survivors_of_an_aborted_process_shrink_and_go_on() {
    survivors_shrink(collectix::Transport::Tcp);
}

/// The same over shared memory: the loss comes from the TCP connection beside the rings.
#[test]
fn over_shm_the_survivors_of_an_aborted_process_shrink_and_go_on() {
    survivors_shrink(collectix::Transport::Shm);
}

#[test]
fn over_torchs_store_protocol_the_survivors_of_an_aborted_process_shrink_and_go_on() {
    // Rank 0 serves the store open to torch's clients; every rank speaks torch's protocol
    // to it, the survivors' agreement included.
    survivors_shrink_speaking(collectix::StoreProtocol::Torch, collectix::Transport::Tcp);
}

fn survivors_shrink(transport: collectix::Transport) {
    survivors_shrink_speaking(collectix::StoreProtocol::Collectix, transport);
}

fn survivors_shrink_speaking(protocol: collectix::StoreProtocol, transport: collectix::Transport) {
    let secret = "the survive tests' secret";
    let options = collectix::GroupOptions::default().with_timeout(TIMEOUT);
    let results = common::job_speaking(protocol, transport, 4, secret, options, |r, p| {
        let c = p.communicator();
        let first = c
            .all_reduce(ones(2), ReduceOp::Sum)
            .wait()
            .map_err(|e| e.to_string())?;
        if first.to_vec::<f32>() != Ok(vec![4.0, 4.0]) {
            return Err(format!("rank {r}: {first:?}"));
        }
        c.barrier().wait().map_err(|e| e.to_string())?;
        if r == 2 {
            p.abort();
            return Ok(());
        }
        match c.all_reduce(ones(2), ReduceOp::Sum).wait() {
            Err(e) if *root(&e) == Error::PeerLost { rank: 2 } => {}
            other => return Err(format!("rank {r}: {other:?}")),
        }
        let shrunk = c.shrink().wait().map_err(|e| format!("rank {r}: {e}"))?;
        if (shrunk.completed, shrunk.left_out.as_slice()) != (2, &[2][..]) {
            return Err(format!("rank {r}: {shrunk:?}"));
        }
        let next = shrunk.communicator;
        let mine = Tensor::from_vec(vec![r as f32]);
        let sum = next
            .all_reduce(mine, ReduceOp::Sum)
            .wait()
            .map_err(|e| e.to_string())?;
        if sum.to_vec::<f32>() != Ok(vec![4.0]) {
            return Err(format!("rank {r}: sum {sum:?}"));
        }
        leave_in_time(r, p, true)
    });
    for (r, res) in results.into_iter().enumerate() {
        assert_eq!(res, Ok(()), "rank {r}");
    }
}

/// Rank 0, which serves the store, dies: the others leave without waiting out the store's
/// timeout (each of leaving's three store requests waited it out: 60 s with a 20 s timeout).
#[test]
fn leaving_after_the_store_s_rank_died_waits_out_no_timeout() {
    let results = tcp_job(3, |r, p| {
        let c = p.communicator();
        c.barrier().wait().map_err(|e| e.to_string())?;
        if r == 0 {
            p.abort();
            return Ok(());
        }
        match c.barrier().wait() {
            Err(e) if *root(&e) == Error::PeerLost { rank: 0 } => {}
            other => return Err(format!("rank {r}: {other:?}")),
        }
        leave_in_time(r, p, false)
    });
    for (r, res) in results.into_iter().enumerate() {
        assert_eq!(res, Ok(()), "rank {r}");
    }
}

/// Supervised ranks (`World::run`): a rank whose code panics mid-training is handled at once
/// by the policy. `Stop`: every other rank's call fails at once (unsupervised, they waited
/// out the 30 s timeout). `Shrink`: the others hear of it as of a killed process, shrink, and
/// finish with exact sums over the survivors.
#[test]
fn a_rank_that_panics_is_handled_by_the_policy_at_once() {
    use collectix::Policy;
    let body = |comm: Communicator| -> collectix::Result<i64> {
        let mut comm = comm;
        let mut done = 0;
        while done < 5 {
            if comm.global_rank() == 1 && done == 2 {
                panic!("rank 1's code gave up");
            }
            let mine = Tensor::from_vec(vec![comm.global_rank() as i64 + 1]);
            match comm.all_reduce(mine, ReduceOp::Sum).wait() {
                Ok(t) => {
                    done += 1;
                    if done == 5 {
                        return Ok(t.to_vec::<i64>()?[0]);
                    }
                }
                Err(e) => {
                    let r = comm.shrink().wait().map_err(|_| e)?;
                    comm = r.communicator;
                }
            }
        }
        Ok(0)
    };
    let w = world(3);
    let start = Instant::now();
    let got = w.run(Policy::Shrink, body);
    assert!(matches!(&got[1], Err(Error::Panic(_))), "{:?}", got[1]);
    assert_eq!(
        (got[0].clone(), got[2].clone()),
        (Ok(4), Ok(4)),
        "1 + 3 over the survivors"
    );
    assert!(start.elapsed() < TOLD, "took {:?}", start.elapsed());
    drop(w);
    let w = world(3);
    let start = Instant::now();
    let got = w.run(Policy::Stop, body);
    assert!(got.iter().all(Result::is_err), "{got:?}");
    assert!(start.elapsed() < TOLD, "took {:?}", start.elapsed());
    drop(w);
}

/// `Policy::Restart`: rank 1's code panics at step 3 of 8; the world starts it again as a
/// new incarnation, which rejoins while the others regrow the group; they send it the step,
/// and all three finish every step on the full group (each step's sum is exactly 6), with
/// the same count of steps. A rank that fails again once its restarts are spent is handled
/// as by `Shrink`.
#[test]
fn a_rank_that_panics_is_restarted_and_rejoins() {
    use collectix::Policy;
    const STEPS: i64 = 8;
    let body = |comm: Communicator| -> collectix::Result<(u32, i64, i64)> {
        let wait = Duration::from_secs(20);
        let mut step = 0i64;
        let (mut comm, mut base, mut skip) = if comm.incarnation() > 0 {
            // A restart: rejoin, and take the step from the others.
            let r = comm.rejoin(wait).wait()?;
            let from = first_not_joined(&r);
            let got = r
                .communicator
                .broadcast(Tensor::from_vec(vec![0i64]), from)
                .wait()?
                .to_vec::<i64>()?;
            step = got[0];
            (r.communicator, step, 1u64)
        } else {
            (comm, 0, 0)
        };
        let mut sums = 0i64;
        while step < STEPS {
            if comm.global_rank() == 1 && step == 3 && comm.incarnation() == 0 {
                panic!("rank 1's code gave up");
            }
            let mine = Tensor::from_vec(vec![comm.global_rank() as i64 + 1]);
            match comm.all_reduce(mine, ReduceOp::Sum).wait() {
                Ok(t) => {
                    sums += t.to_vec::<i64>()?[0];
                    step += 1;
                }
                Err(e) => {
                    let r = comm.regrow(wait).wait().map_err(|_| e)?;
                    // The steps that completed everywhere; the rest are made again.
                    let done = base + r.completed.saturating_sub(skip) as i64;
                    sums -= 6 * (step - done);
                    step = done;
                    let from = first_not_joined(&r);
                    comm = r.communicator;
                    comm.broadcast(Tensor::from_vec(vec![step]), from).wait()?;
                    (base, skip) = (step, 1);
                }
            }
        }
        Ok((comm.incarnation(), step, sums))
    };
    let w = world(3);
    let got = w.run(Policy::Restart(1), body);
    assert_eq!(got[0], Ok((0, STEPS, 6 * STEPS)), "{got:?}");
    assert_eq!(got[2], Ok((0, STEPS, 6 * STEPS)), "{got:?}");
    // The restarted rank made the steps from where it joined, each summing to 6.
    match &got[1] {
        Ok((1, STEPS, sums)) => assert!(sums % 6 == 0 && *sums > 0, "{sums}"),
        other => panic!("rank 1: {other:?}"),
    }
    assert_eq!(w.shutdown(), Ok(()));
}

/// The rank whose state the others send a restarted rank: the first member of the new group
/// that is not restarted (its group rank).
fn first_not_joined(r: &Recovered) -> usize {
    r.communicator
        .members()
        .iter()
        .position(|m| !r.joined.contains(m))
        .unwrap_or(0)
}
