//! Two threads of each rank on one group: a trainer thread and a checkpoint thread, each
//! making its own calls, in an order that differs from rank to rank (each thread of each
//! rank pauses at its own moments).
//!
//! On two lanes of the group (`Communicator::lane`), every call of 1,000 per thread
//! completes with its own stream's data: no hang, nothing mixed. On the group itself, the
//! first call made while the other thread's call is in flight fails with
//! `Error::ConcurrentCalls`, naming both call sites; the group is aborted, and every thread
//! of every rank stops with an error within its timeout. (Calls that crossed before, each
//! alone in flight on its rank, look to every rank like a hand-off from one thread to the
//! other and may return the other stream's data: counted and printed, not asserted; see
//! `collectix_runtime::issuers`.) In one process (through the engine and on the group's
//! board) and over TCP.

use crate::common::{free_port, tcp_args};
use collectix::{CallOptions, Communicator, Error, GroupOptions, ReduceOp, Tensor, World};
use std::time::{Duration, Instant};

const ITERATIONS: usize = 1000;
const W: usize = 4;

/// How a thread's calls ended: how many completed, how many of those returned another
/// stream's data, and the error that stopped them.
#[derive(Debug)]
struct Ended {
    done: usize,
    crossed: usize,
    error: Option<Error>,
}

/// A small pseudo-random pause, different for every (rank, stream, step).
fn pause(rank: usize, stream: u64, step: usize) {
    let x = (rank as u64 * 7919 + stream * 104_729 + step as u64 * 31).wrapping_mul(0x9e37_79b9);
    if (x >> 7).is_multiple_of(5) {
        std::thread::sleep(Duration::from_micros((x >> 12) % 200));
    } else if (x >> 7) % 5 == 1 {
        std::thread::yield_now();
    }
}

/// One stream's calls on `c`: all_reduces of `count` values of `scale * (rank + 1)`, each
/// result checked (the sum of the stream's own values, never the other stream's).
fn stream(c: &Communicator, stream: u64, scale: f32, count: usize) -> Ended {
    let want = scale * (W * (W + 1) / 2) as f32;
    let opts = CallOptions {
        timeout: Some(Duration::from_secs(10)),
        ..CallOptions::default()
    };
    let mut crossed = 0;
    for i in 0..ITERATIONS {
        pause(c.rank(), stream, i);
        let t = Tensor::from_vec(vec![scale * (c.rank() + 1) as f32; count]);
        match c.all_reduce_with(t, ReduceOp::Sum, &opts).wait() {
            Ok(t) => {
                let v = t.to_vec::<f32>().unwrap_or_default();
                if v.len() != count || v.iter().any(|&x| x != want) {
                    println!(
                        "rank {} stream {stream} call {i}: {:?} instead of {want}",
                        c.rank(),
                        v.first()
                    );
                    crossed += 1;
                }
            }
            Err(e) => {
                return Ended {
                    done: i,
                    crossed,
                    error: Some(e),
                }
            }
        }
    }
    Ended {
        done: ITERATIONS,
        crossed,
        error: None,
    }
}

/// A rank's two threads: the trainer on `trainer`, the checkpoint on `checkpoint`.
fn two_threads(trainer: &Communicator, checkpoint: &Communicator, count: usize) -> [Ended; 2] {
    std::thread::scope(|s| {
        let t = std::thread::Builder::new()
            .name("trainer".into())
            .spawn_scoped(s, || stream(trainer, 1, 1.0, count))
            .unwrap_or_else(|e| panic!("{e}"));
        let k = std::thread::Builder::new()
            .name("checkpoint".into())
            .spawn_scoped(s, || stream(checkpoint, 2, 100.0, count))
            .unwrap_or_else(|e| panic!("{e}"));
        let join = |h: std::thread::ScopedJoinHandle<'_, Ended>| {
            h.join().unwrap_or_else(|_| panic!("a thread panicked"))
        };
        [join(t), join(k)]
    })
}

/// Every rank's two threads, in one process.
fn in_one_process(count: usize, lanes: bool) -> Vec<[Ended; 2]> {
    let world = World::local(W).unwrap_or_else(|e| panic!("{e}"));
    std::thread::scope(|s| {
        let hs: Vec<_> = world
            .communicators()
            .iter()
            .map(|c| {
                s.spawn(move || {
                    if lanes {
                        two_threads(&c.lane("trainer"), &c.lane("checkpoint"), count)
                    } else {
                        two_threads(c, c, count)
                    }
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| panic!("a rank panicked")))
            .collect()
    })
}

/// Every rank's two threads, each rank a job's process over TCP (threads here).
fn over_tcp(lanes: bool) -> Vec<[Ended; 2]> {
    let port = free_port();
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..W)
            .map(|r| {
                s.spawn(move || {
                    let args = tcp_args(port, r, W, "the lanes test's secret", false);
                    let p =
                        collectix::init(&args, GroupOptions::default(), Duration::from_secs(20))
                            .unwrap_or_else(|e| panic!("rank {r}: {e}"));
                    let c = p.communicator();
                    let ended = if lanes {
                        two_threads(&c.lane("trainer"), &c.lane("checkpoint"), 256)
                    } else {
                        two_threads(c, c, 256)
                    };
                    if lanes {
                        let _ = p.shutdown();
                    } else {
                        p.abort();
                    }
                    ended
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| panic!("a rank panicked")))
            .collect()
    })
}

fn all_complete(ended: &[[Ended; 2]]) {
    for (r, e) in ended.iter().enumerate() {
        for t in e {
            assert!(
                t.done == ITERATIONS && t.crossed == 0 && t.error.is_none(),
                "rank {r}: {ended:?}"
            );
        }
    }
}

/// Without lanes: some thread got `ConcurrentCalls` naming this file twice (both call
/// sites) and the two threads; every thread stopped with an error.
fn refused(ended: &[[Ended; 2]], took: Duration) {
    let mut named = 0;
    for (r, e) in ended.iter().enumerate() {
        for t in e {
            let Some(err) = &t.error else {
                panic!("rank {r}: a thread finished every call: {ended:?}");
            };
            if let Error::ConcurrentCalls { .. } = err {
                let text = err.to_string();
                println!("rank {r} after {} calls: {text}", t.done);
                assert_eq!(text.matches("tests/suite/lanes.rs:").count(), 2, "{text}");
                assert!(
                    text.contains("thread 'trainer'") && text.contains("thread 'checkpoint'"),
                    "{text}"
                );
                named += 1;
            }
        }
    }
    assert!(
        named >= 1,
        "nobody was told of the concurrent calls: {ended:?}"
    );
    // A hang guard well above the calls' own timeouts: every thread stopped on the abort.
    assert!(took < Duration::from_secs(30), "{took:?}");
}

#[test]
fn two_threads_on_two_lanes_of_a_group_complete_every_call_in_one_process() {
    all_complete(&in_one_process(256, true));
}

#[test]
fn two_threads_on_two_lanes_of_a_group_complete_every_call_on_a_board() {
    all_complete(&in_one_process(1, true));
}

#[test]
fn two_threads_on_two_lanes_of_a_group_complete_every_call_over_tcp() {
    all_complete(&over_tcp(true));
}

#[test]
fn two_threads_on_one_group_are_refused_at_the_first_concurrent_call_in_one_process() {
    let start = Instant::now();
    let ended = in_one_process(256, false);
    refused(&ended, start.elapsed());
}

#[test]
fn two_threads_on_one_group_are_refused_at_the_first_concurrent_call_on_a_board() {
    let start = Instant::now();
    let ended = in_one_process(1, false);
    refused(&ended, start.elapsed());
}

#[test]
fn two_threads_on_one_group_are_refused_at_the_first_concurrent_call_over_tcp() {
    let start = Instant::now();
    let ended = over_tcp(false);
    refused(&ended, start.elapsed());
}

/// A lane is the same lane by name, on every rank; different names are different orders;
/// a lane's calls and its parent's do not meet.
#[test]
fn a_lane_is_found_by_its_name_and_keeps_an_order_of_its_own() {
    let world = World::local(2).unwrap_or_else(|e| panic!("{e}"));
    std::thread::scope(|s| {
        for c in world.communicators() {
            s.spawn(move || {
                let (a, b) = (c.lane("a"), c.lane("a"));
                assert_eq!(a.group_id(), b.group_id());
                assert_ne!(a.group_id(), c.lane("b").group_id());
                assert_ne!(a.group_id(), c.group_id());
                assert_eq!((a.rank(), a.size()), (c.rank(), c.size()));
                // Rank 0 calls on the lane first, rank 1 on the group first: each order is
                // its own, so both complete.
                let x = || Tensor::from_vec(vec![1.0f32]);
                let (first, second) = if c.rank() == 0 { (&a, c) } else { (c, &a) };
                let w1 = first.all_reduce(x(), ReduceOp::Sum);
                let w2 = second.all_reduce(x(), ReduceOp::Sum);
                for w in [w1, w2] {
                    assert_eq!(w.wait().ok(), Some(Tensor::from_vec(vec![2.0f32])));
                }
            });
        }
    });
}
