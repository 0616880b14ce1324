//! A flood of connections that never authenticate (issue 31): 1 000 idle and 100 trickling
//! connections against a job's store and one of its ranks cost no thread each, keep no
//! client with the secret out, and lose none of the job's calls.

use collectix::{
    init, GroupOptions, InitArgs, ReduceOp, Secret, Security, Store, TcpStore, Tensor, Transport,
};
use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::channel;
use std::time::{Duration, Instant};

fn secured() -> Security {
    Security::with_secret(Secret::new("the flood test's secret").unwrap_or_else(|e| panic!("{e}")))
}

/// This process's threads now.
fn threads() -> usize {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Threads:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// Descriptors enough for the flood (both ends live in this process): the soft limit raised
/// to the hard one, and the hard one too where this process may (root).
fn enough_descriptors(want: u64) -> bool {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let Ok((_, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return false;
    };
    if hard >= want {
        return setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok();
    }
    setrlimit(Resource::RLIMIT_NOFILE, want, want).is_ok()
}

#[test]
fn a_flood_of_unauthenticated_connections_costs_no_threads_and_keeps_nobody_out() {
    if !enough_descriptors(8192) {
        eprintln!("SKIPPED: fewer than 8 192 descriptors allowed here");
        return;
    }
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_or(29_997, |a| a.port());
    let stop = AtomicBool::new(false);
    let flood_stop = AtomicBool::new(false);
    let calls = AtomicUsize::new(0);
    let (tx, rx) = channel::<String>();
    std::thread::scope(|sc| {
        let ranks: Vec<_> = (0..2)
            .map(|r| {
                let (tx, stop, calls) = (tx.clone(), &stop, &calls);
                sc.spawn(move || -> Result<usize, String> {
                    let args = InitArgs {
                        init_method: Some(format!("tcp://127.0.0.1:{port}")),
                        rank: Some(r),
                        world_size: Some(2),
                        security: Some(secured()),
                        transport: Some(Transport::Tcp),
                        ..InitArgs::default()
                    };
                    let p = init(&args, GroupOptions::default(), Duration::from_secs(60))
                        .map_err(|e| format!("rank {r}: {e}"))?;
                    if r == 1 {
                        let addr = p
                            .store()
                            .get("addr/1", Duration::from_secs(10))
                            .map_err(|e| e.to_string())?;
                        let _ = tx.send(String::from_utf8_lossy(&addr).into_owned());
                    }
                    let c = p.communicator();
                    // Calls until rank 0 says stop, in the call itself (both end together).
                    let mut n = 0usize;
                    loop {
                        let last = r == 0 && stop.load(Ordering::SeqCst) && n >= 10;
                        let mut mine = vec![r as f32 + 1.0; 4];
                        mine.push(if last { 1.0 } else { 0.0 });
                        let got = c
                            .all_reduce(Tensor::from_vec(mine), ReduceOp::Sum)
                            .wait()
                            .and_then(|t| t.to_vec::<f32>())
                            .map_err(|e| format!("rank {r} call {n}: {e}"))?;
                        if got[..4] != [3.0; 4] {
                            return Err(format!("rank {r} call {n}: {got:?}"));
                        }
                        n += 1;
                        if r == 0 {
                            calls.fetch_add(1, Ordering::SeqCst);
                        }
                        if got[4] != 0.0 {
                            break;
                        }
                    }
                    let most = n;
                    Ok(most)
                })
            })
            .collect();
        drop(tx);
        let rank1 = rx
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|e| panic!("rank 1's address: {e}"));
        let store = format!("127.0.0.1:{port}");
        let before = threads();
        // The flood: per target, 500 idle connections and 50 that send a plausible start one
        // byte at a time.
        let mut idle = Vec::new();
        let mut trickling = Vec::new();
        for target in [&store, &rank1] {
            for i in 0..550 {
                match TcpStream::connect(target.as_str()) {
                    Ok(s) if i < 500 => idle.push(s),
                    Ok(s) => trickling.push(s),
                    Err(e) => panic!("connection {i} to {target}: {e}"),
                }
            }
        }
        let start = b"cx-auth1 trickling nonce...................".to_vec();
        let flood_stopped = &flood_stop;
        let trickler = sc.spawn(move || {
            let mut at = 0;
            while !flood_stopped.load(Ordering::SeqCst) {
                for s in &mut trickling {
                    let _ = s.write_all(&start[at % start.len()..at % start.len() + 1]);
                }
                at += 1;
                std::thread::sleep(Duration::from_millis(200));
            }
        });
        std::thread::sleep(Duration::from_millis(500));
        let during = threads();
        let calls_before = calls.load(Ordering::SeqCst);
        // A client with the secret gets in, and is served.
        let t0 = Instant::now();
        let client = TcpStore::connect_secured(store.clone(), Duration::from_secs(5), secured());
        let took = t0.elapsed();
        let served = client.and_then(|c| {
            c.set("flood/ok", b"yes".to_vec())?;
            c.get("flood/ok", Duration::from_secs(5))
        });
        std::thread::sleep(Duration::from_millis(300));
        let calls_during = calls.load(Ordering::SeqCst) - calls_before;
        flood_stop.store(true, Ordering::SeqCst);
        let _ = trickler.join();
        drop(idle);
        stop.store(true, Ordering::SeqCst);
        let results: Vec<_> = ranks
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a rank panicked".into())))
            .collect();
        eprintln!(
            "threads: {before} before the flood, {during} during it; the client with the secret \
             in {took:?}; {calls_during} calls completed in the 300 ms after it"
        );
        assert!(
            during < before + 40,
            "{before} threads before the flood, {during} during it"
        );
        assert_eq!(
            served,
            Ok(b"yes".to_vec()),
            "the client with the secret, after {took:?}"
        );
        assert!(calls_during > 0, "no call completed during the flood");
        for r in &results {
            assert!(r.is_ok(), "{results:?}");
        }
        assert_eq!(results[0], results[1]);
    });
}
