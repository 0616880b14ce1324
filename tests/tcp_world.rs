//! The process world over TCP loopback (issue 11, first part): ranks join through `init`
//! with `tcp://127.0.0.1:PORT` (rank 0 serves the store), connect to each other with the
//! link's handshake, and run the matrix (`testing::matrix`: every collective × algorithm,
//! several dtypes and ops), with values checked exactly; then they leave in order and none sees another's exit as a
//! failure. Each rank is a thread of this test process with its own actor system and its
//! own sockets: what crosses between ranks goes through the TCP links. The same matrix runs
//! across separate OS processes in `cli/tests/multiprocess.rs` (the `check_job` example).

use collectix::runtime::testing::matrix;
use collectix::{init, CallOptions, Error, GroupOptions, InitArgs};
use std::net::TcpListener;
use std::time::Duration;

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_or(29_999, |a| a.port())
}

/// Every rank joins, runs `cases` one after another (each waited for), and leaves.
fn run(w: usize) -> Vec<Result<(), String>> {
    let port = free_port();
    let cases = matrix(w);
    std::thread::scope(|sc| {
        let handles: Vec<_> = (0..w)
            .map(|r| {
                let cases = &cases;
                sc.spawn(move || -> Result<(), String> {
                    let args = InitArgs {
                        init_method: Some(format!("tcp://127.0.0.1:{port}")),
                        rank: Some(r),
                        world_size: Some(w),
                    };
                    let opts = GroupOptions {
                        segment_bytes: 1024,
                        ..GroupOptions::default()
                    };
                    let p = init(&args, opts, Duration::from_secs(60))
                        .map_err(|e| format!("rank {r} cannot join: {e}"))?;
                    let c = p.communicator();
                    assert_eq!((c.rank(), c.size()), (r, w));
                    for case in cases {
                        let opts = CallOptions {
                            algorithm: case.algorithm,
                            timeout: Some(Duration::from_secs(60)),
                        };
                        let got = c
                            .submit(case.request(r), &opts)
                            .wait()
                            .map_err(|e| format!("{case:?} rank {r}: {e}"))?;
                        if got != case.expected(r) {
                            return Err(format!("{case:?} rank {r}: wrong result"));
                        }
                    }
                    // A hang guard, not a timing: leaving in order needs no timeout to run out
                    // (it once waited one out when the store's owner closed it too early).
                    let start = std::time::Instant::now();
                    p.shutdown()
                        .map_err(|e| format!("rank {r} left with {e}"))?;
                    let took = start.elapsed();
                    if took > Duration::from_secs(8) {
                        return Err(format!(
                            "rank {r}: leaving took {took:?}, a timeout ran out"
                        ));
                    }
                    Ok(())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("panicked".into())))
            .collect()
    })
}

#[test]
fn every_collective_over_tcp_on_2_3_4_ranks() {
    for w in [2, 3, 4] {
        for (r, res) in run(w).into_iter().enumerate() {
            assert_eq!(res, Ok(()), "W={w} rank {r}");
        }
    }
}

#[test]
fn a_rank_that_never_joins_is_named() {
    let port = free_port();
    // Ranks 0 and 1 of 3 join; rank 2 never comes.
    let results: Vec<_> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..2)
            .map(|r| {
                sc.spawn(move || {
                    let args = InitArgs {
                        init_method: Some(format!("tcp://127.0.0.1:{port}")),
                        rank: Some(r),
                        world_size: Some(3),
                    };
                    init(&args, GroupOptions::default(), Duration::from_millis(1500)).map(|_| ())
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join()).collect()
    });
    for (r, res) in results.into_iter().enumerate() {
        match res {
            Ok(Err(Error::StoreTimeout { what, .. })) => {
                assert!(
                    what.contains("addr/2") && !what.contains("addr/0"),
                    "rank {r}: {what}"
                )
            }
            other => panic!("rank {r}: {other:?}"),
        }
    }
}
