//! The threads a world's ranks share: a world of many ranks starts the threads it is told
//! (`World::builder(n).threads(t)`) and no thread per rank, async bodies on them start none
//! either, and a world dropped on one of them (which runs many ranks) returns without waiting
//! for the answers that thread's ranks cannot give while it is busy.
//!
//! The thread counts are the process's actor threads (`/proc/self/task`, by name), so this
//! file's tests run one after another (a lock), apart from every other test binary.

use collectix::{Policy, ReduceOp, Tensor, World};
use std::future::Future;
use std::pin::Pin;
use std::sync::{mpsc, Arc, Mutex};
use std::task::{Context, Wake, Waker};
use std::time::{Duration, Instant};

/// This file's tests count the process's threads: one at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// The process's threads that run actors (arbiters and actor systems, by their names as the
/// kernel keeps them, cut to 15 bytes): the test harness starts threads of its own for other
/// tests at any moment, so the process's whole count would not do.
fn threads_now() -> usize {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .filter_map(Result::ok)
        .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
        .filter(|name| name.starts_with("actix-rt|") || name.starts_with("collectix-syst"))
        .count()
}

#[test]
fn a_world_of_512_ranks_on_3_threads_starts_4_threads_and_its_async_bodies_none() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    if !std::path::Path::new("/proc/self/task").exists() {
        assert!(
            std::env::var_os("CI").is_none(),
            "no /proc/self/task under CI"
        );
        eprintln!("SKIPPED: no /proc/self/task to count threads");
        return;
    }
    // The world the other test dropped may still be stopping its threads: wait for them to
    // go (a bound for a hang, not a timing), so that none of them leaves during the count.
    let t0 = std::time::Instant::now();
    while threads_now() > 0 && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let before = threads_now();
    let world = World::builder(512)
        .threads(3)
        .start()
        .unwrap_or_else(|e| panic!("{e}"));
    // The rank threads and the actor system's own.
    let started = threads_now().saturating_sub(before);
    assert!(
        (3..=4).contains(&started),
        "{started} threads for 512 ranks"
    );
    let peak = Arc::new(Mutex::new(0usize));
    let seen = peak.clone();
    let results = world.spawn(Policy::Stop, move |c| {
        let seen = seen.clone();
        async move {
            let t = c
                .all_reduce(Tensor::from_vec(vec![1i64]), ReduceOp::Sum)
                .await?;
            let mut p = seen.lock().unwrap_or_else(|p| p.into_inner());
            *p = (*p).max(threads_now());
            t.to_vec::<i64>()
        }
    });
    assert!(results.iter().all(|r| r == &Ok(vec![512])));
    let during = *peak.lock().unwrap_or_else(|p| p.into_inner());
    assert!(
        during <= before + 4,
        "{during} threads while the bodies ran ({before} before the world)"
    );
    world.shutdown().unwrap_or_else(|e| panic!("{e}"));
}

struct DropWorld {
    world: Mutex<Option<World>>,
    done: Mutex<Option<mpsc::Sender<Duration>>>,
}

impl Wake for DropWorld {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        let w = self.world.lock().ok().and_then(|mut g| g.take());
        let t0 = Instant::now();
        drop(w); // on a thread that runs half the world's ranks
        if let Some(tx) = self.done.lock().ok().and_then(|mut g| g.take()) {
            let _ = tx.send(t0.elapsed());
        }
    }
}

#[test]
fn dropping_a_world_on_a_thread_its_ranks_share_does_not_wait_for_them() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let world = World::builder(16)
        .threads(2)
        .start()
        .unwrap_or_else(|e| panic!("{e}"));
    let comms = world.communicators().to_vec();
    let (tx, rx) = mpsc::channel();
    let state = Arc::new(DropWorld {
        world: Mutex::new(Some(world)),
        done: Mutex::new(Some(tx)),
    });
    let waker = Waker::from(state.clone());
    let mut work = comms[0].all_reduce(Tensor::from_vec(vec![1.0f32]), ReduceOp::Sum);
    assert!(Pin::new(&mut work)
        .poll(&mut Context::from_waker(&waker))
        .is_pending());
    let others: Vec<_> = comms[1..]
        .iter()
        .map(|c| c.all_reduce(Tensor::from_vec(vec![1.0f32]), ReduceOp::Sum))
        .collect();
    let took = rx
        .recv_timeout(Duration::from_secs(30))
        .unwrap_or_else(|_| panic!("the drop hung"));
    // A drop that waited for the ranks of its own thread would give up on them only after
    // 5 s; the others answer in milliseconds.
    assert!(took < Duration::from_secs(4), "the drop took {took:?}");
    drop(others);
}
