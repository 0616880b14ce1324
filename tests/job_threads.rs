//! A job's process that shut down leaves no thread of its behind for long: its status
//! responder, whose store connection breaks as the job's store closes, gives up within
//! seconds rather than trying to reconnect for the whole connect timeout. This file holds a
//! single test, so that the threads it counts are its own job's.

mod common;

use std::time::{Duration, Instant};

/// Threads of this process whose names start with `collectix-status`.
fn status_threads() -> usize {
    let Ok(d) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    d.filter_map(|t| t.ok())
        .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
        .filter(|name| name.starts_with("collectix-statu"))
        .count()
}

#[test]
fn the_status_responders_of_a_job_stop_soon_after_it_shuts_down() {
    if !std::path::Path::new("/proc/self/task").exists() {
        eprintln!("SKIPPED: no /proc/self/task on this system");
        return;
    }
    // A connect timeout of 20 s: a responder that tried to reconnect for it would still be
    // there after 10.
    let ends = common::job(
        collectix::Transport::Tcp,
        3,
        "the job threads test's secret",
        Duration::from_secs(20),
        |_, p| {
            p.communicator()
                .barrier()
                .wait()
                .map_err(|e| e.to_string())?;
            // Each responder holds a wait on the store most of the time: the store's close
            // breaks it.
            std::thread::sleep(Duration::from_millis(50));
            p.shutdown().map_err(|e| e.to_string())
        },
    );
    assert!(ends.iter().all(Result::is_ok), "{ends:?}");
    let t0 = Instant::now();
    while status_threads() > 0 && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        status_threads(),
        0,
        "status responders still running {:?} after the job shut down",
        t0.elapsed()
    );
    eprintln!(
        "the status responders were gone {:?} after the job shut down",
        t0.elapsed()
    );
}
