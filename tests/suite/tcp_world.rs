//! The process world over TCP loopback: ranks join through `init` with
//! `tcp://127.0.0.1:PORT` (rank 0 serves the store), connect to each other with the link's
//! handshake, and run the matrix (`testing::matrix`: every collective × algorithm, several
//! dtypes and ops), with values checked exactly; then they leave in order and none sees
//! another's exit as a failure. Each rank is a thread of this test process with its own
//! actor system and its own sockets: what crosses between ranks goes through the TCP links.
//! The same matrix runs across separate OS processes in `cli/tests/suite/multiprocess.rs` (the
//! `check_job` example).

#[allow(clippy::duplicate_mod)]
#[path = "../../examples/check_job.rs"]
mod check_job;

use crate::common;

use collectix::runtime::testing::matrix;
use collectix::{
    init, CallOptions, Connect, Error, GroupOptions, InitArgs, Secret, Security, Transport,
};
use common::free_port;
use std::time::{Duration, Instant};

/// The job's secret in these tests (every connection passes the secret handshake).
fn secured(text: &str) -> Security {
    Security::with_secret(Secret::new(text).unwrap_or_else(|e| panic!("{e}")))
}

/// Rank `r` of `w` joining through `tcp://127.0.0.1:PORT`.
fn args(port: u16, r: usize, w: usize, connect: Option<Connect>) -> InitArgs {
    args_over(port, r, w, connect, Transport::Tcp)
}

/// [`args`] over `transport`.
fn args_over(
    port: u16,
    r: usize,
    w: usize,
    connect: Option<Connect>,
    transport: Transport,
) -> InitArgs {
    InitArgs {
        init_method: Some(format!("tcp://127.0.0.1:{port}")),
        rank: Some(r),
        world_size: Some(w),
        connect,
        security: Some(secured("the tcp_world tests' secret")),
        transport: Some(transport),
        ..InitArgs::default()
    }
}

/// Every rank joins, runs the matrix (`examples/check_job.rs`: one call after another, each
/// waited for and checked), and leaves.
fn run(w: usize, connect: Connect) -> Vec<Result<(), String>> {
    run_over(w, connect, Transport::Tcp)
}

/// [`run`] over `transport`; each rank checks that it reaches every peer through shared
/// memory with `Shm`, and none with `Tcp`.
fn run_over(w: usize, connect: Connect, transport: Transport) -> Vec<Result<(), String>> {
    run_with(w, connect, transport, false)
}

/// [`run_over`], every input a tensor in shared memory when `shared` (then every rank must
/// have read payloads straight from its peers' shared heaps).
fn run_with(
    w: usize,
    connect: Connect,
    transport: Transport,
    shared: bool,
) -> Vec<Result<(), String>> {
    let port = free_port();
    std::thread::scope(|sc| {
        let handles: Vec<_> = (0..w)
            .map(|r| {
                sc.spawn(move || -> Result<(), String> {
                    let args = args_over(port, r, w, Some(connect), transport);
                    let p = init(&args, check_job::options(), Duration::from_secs(60))
                        .map_err(|e| format!("rank {r} cannot join: {e}"))?;
                    let shm = if transport == Transport::Shm {
                        w - 1
                    } else {
                        0
                    };
                    if p.shm_peers() != shm {
                        return Err(format!("rank {r}: {} shared-memory peers", p.shm_peers()));
                    }
                    let c = p.communicator();
                    assert_eq!((c.rank(), c.size()), (r, w));
                    let n = check_job::check_with(c, shared).map_err(|e| format!("rank {r}: {e}"))?;
                    if n != matrix(w).len() {
                        return Err(format!("rank {r}: {n} cases"));
                    }
                    // The large cells' received chunks were read straight into their outputs
                    // (and checked exact with the rest).
                    if p.landed() == 0 {
                        return Err(format!("rank {r}: no message landed in place"));
                    }
                    let from_heaps = p.read_from_shared_heaps();
                    if shared != (from_heaps > 0) {
                        return Err(format!(
                            "rank {r}: {from_heaps} parts read from shared heaps (shared inputs: {shared})"
                        ));
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
        for (r, res) in run(w, Connect::Eager).into_iter().enumerate() {
            assert_eq!(res, Ok(()), "W={w} rank {r}");
        }
    }
}

#[test]
fn every_collective_over_shared_memory_on_2_3_4_ranks() {
    for w in [2, 3, 4] {
        for (r, res) in run_over(w, Connect::Eager, Transport::Shm)
            .into_iter()
            .enumerate()
        {
            assert_eq!(res, Ok(()), "W={w} rank {r}");
        }
    }
}

#[test]
fn every_collective_on_shared_tensors_over_shared_memory_on_2_3_4_ranks() {
    for w in [2, 3, 4] {
        for (r, res) in run_with(w, Connect::Eager, Transport::Shm, true)
            .into_iter()
            .enumerate()
        {
            assert_eq!(res, Ok(()), "W={w} rank {r}");
        }
    }
}

/// Two "hosts" of two ranks each (host identities given by the program): each rank shares
/// memory with the other of its host and talks TCP to the others; the world is on several
/// hosts (`Hosts`), a sub-group of one host's ranks on one (`Host`); the matrix checks out,
/// and the world's all_reduce (hierarchical by default: reduce over shared memory, the leaders
/// over TCP, broadcast over shared memory) gives exact sums at every size.
#[test]
fn two_hosts_of_two_ranks_share_memory_inside_and_go_hierarchical_across() {
    let (w, port) = (4usize, free_port());
    let results: Vec<Result<(), String>> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..w)
            .map(|r| {
                sc.spawn(move || -> Result<(), String> {
                    let args = InitArgs {
                        host_id: Some(if r < 2 { "host-a" } else { "host-b" }.to_owned()),
                        ..args_over(port, r, w, Some(Connect::Eager), Transport::Auto)
                    };
                    let p = init(&args, check_job::options(), Duration::from_secs(60))
                        .map_err(|e| format!("rank {r} cannot join: {e}"))?;
                    let c = p.communicator();
                    if p.shm_peers() != 1 || c.locality() != collectix::Locality::Hosts {
                        return Err(format!(
                            "rank {r}: {} shared-memory peers, {:?}",
                            p.shm_peers(),
                            c.locality()
                        ));
                    }
                    for n in [1usize, 1000, 300_000] {
                        let mine: Vec<f32> = (0..n).map(|k| ((r + k) % 5) as f32).collect();
                        let got = c
                            .all_reduce(collectix::Tensor::from_vec(mine), collectix::ReduceOp::Sum)
                            .wait()
                            .map_err(|e| format!("rank {r}: {e}"))?;
                        let want: Vec<f32> = (0..n)
                            .map(|k| (0..w).map(|q| ((q + k) % 5) as f32).sum())
                            .collect();
                        if got.to_vec::<f32>().ok() != Some(want) {
                            return Err(format!("rank {r}: wrong sum of {n}"));
                        }
                    }
                    let sub = c.new_subgroups(2).wait().map_err(|e| e.to_string())?;
                    if sub.locality() != collectix::Locality::Host {
                        return Err(format!(
                            "rank {r}: its host's group is {:?}",
                            sub.locality()
                        ));
                    }
                    let n = check_job::check(c).map_err(|e| format!("rank {r}: {e}"))?;
                    if n != matrix(w).len() {
                        return Err(format!("rank {r}: {n} cases"));
                    }
                    p.shutdown().map_err(|e| format!("rank {r} left with {e}"))
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("panicked".into())))
            .collect()
    });
    for (r, res) in results.into_iter().enumerate() {
        assert_eq!(res, Ok(()), "rank {r}");
    }
}

#[test]
fn every_collective_over_lazy_connections_on_3_and_4_ranks() {
    for w in [3, 4] {
        for (r, res) in run(w, Connect::Lazy).into_iter().enumerate() {
            assert_eq!(res, Ok(()), "W={w} rank {r}");
        }
    }
}

/// Lazy connection: nothing is connected at join; a send from rank 0 to rank 1 connects that
/// pair only; an all_to_all connects every pair.
#[test]
fn lazy_connections_are_made_by_the_first_message_between_two_ranks() {
    let (w, port) = (3usize, free_port());
    let results: Vec<Result<Vec<usize>, String>> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..w)
            .map(|r| {
                sc.spawn(move || -> Result<Vec<usize>, String> {
                    let args = args(port, r, w, Some(Connect::Lazy));
                    let p = init(&args, GroupOptions::default(), Duration::from_secs(60))
                        .map_err(|e| e.to_string())?;
                    let c = p.communicator();
                    // A round through the store (not the links): every rank is at `label`.
                    let sync = |label: &str| -> Result<(), String> {
                        let store = p.store();
                        store
                            .set(&format!("test/{label}/{r}"), Vec::new())
                            .map_err(|e| e.to_string())?;
                        let keys: Vec<String> =
                            (0..w).map(|j| format!("test/{label}/{j}")).collect();
                        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
                        store
                            .wait(&keys, Duration::from_secs(30))
                            .map_err(|e| e.to_string())
                    };
                    let mut seen = vec![p.connected_peers()];
                    sync("joined")?;
                    let t = collectix::Tensor::from_vec(vec![7i32; 4]);
                    match r {
                        0 => c.send(t, 1, 0).wait().map_err(|e| e.to_string())?,
                        1 => {
                            let spec = collectix::TensorSpec::new(&[4], collectix::DType::I32);
                            let (got, _) =
                                c.recv(spec, Some(0), 0).wait().map_err(|e| e.to_string())?;
                            if got != t {
                                return Err(format!("received {got}"));
                            }
                        }
                        _ => {}
                    }
                    sync("sent")?;
                    seen.push(p.connected_peers());
                    sync("counted")?;
                    let blocks: Vec<_> = (0..w)
                        .map(|j| collectix::Tensor::from_vec(vec![(10 * r + j) as i32; 2]))
                        .collect();
                    let specs = vec![collectix::TensorSpec::new(&[2], collectix::DType::I32); w];
                    let out = c
                        .all_to_all(specs, blocks)
                        .wait()
                        .map_err(|e| e.to_string())?;
                    for (j, b) in out.iter().enumerate() {
                        if *b != collectix::Tensor::from_vec(vec![(10 * j + r) as i32; 2]) {
                            return Err(format!("block {j}: {b}"));
                        }
                    }
                    seen.push(p.connected_peers());
                    p.shutdown().map_err(|e| e.to_string())?;
                    Ok(seen)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("panicked".into())))
            .collect()
    });
    let seen: Vec<Vec<usize>> = results
        .into_iter()
        .enumerate()
        .map(|(r, res)| res.unwrap_or_else(|e| panic!("rank {r}: {e}")))
        .collect();
    assert_eq!(seen[0][..2], [0, 1], "rank 0: {seen:?}");
    assert_eq!(seen[1][..2], [0, 1], "rank 1: {seen:?}");
    assert_eq!(seen[2][..2], [0, 0], "rank 2: {seen:?}");
    for (r, s) in seen.iter().enumerate() {
        assert_eq!(s[2], w - 1, "rank {r}: {seen:?}");
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
                    let args = args(port, r, 3, None);
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

/// A rank whose secret differs cannot join (it is told so at once, naming the store), and
/// the others are told which rank never came.
#[test]
fn a_rank_with_another_secret_is_refused_and_named_by_the_others() {
    let port = free_port();
    let results: Vec<_> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..3)
            .map(|r| {
                sc.spawn(move || {
                    let mut args = args(port, r, 3, None);
                    if r == 2 {
                        args.security = Some(secured("not the job's secret"));
                    }
                    init(&args, GroupOptions::default(), Duration::from_secs(3)).map(|_| ())
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join()).collect()
    });
    for (r, res) in results.into_iter().enumerate() {
        match (r, res) {
            (2, Ok(Err(Error::Unauthenticated { peer, reason }))) => {
                assert!(peer.contains(&port.to_string()), "{peer}: {reason}")
            }
            (0 | 1, Ok(Err(Error::StoreTimeout { what, .. }))) => {
                assert!(what.contains("addr/2"), "rank {r}: {what}")
            }
            (r, other) => panic!("rank {r}: {other:?}"),
        }
    }
}

/// Intruders at a running job's doors — a rank's listener and the store — without the secret:
/// one with a wrong secret, one that skips the handshake and sends a frame, one that sends
/// HTTP. Each is refused before anything it sends is read, and the job runs on, exact.
#[test]
fn intruders_without_the_secret_are_refused_and_the_job_runs_on() {
    use std::io::{Read, Write};
    let (w, port) = (2usize, free_port());
    let (addr_tx, addr_rx) = std::sync::mpsc::channel::<String>();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let done_rx = std::sync::Mutex::new(done_rx);
    let results: Vec<Result<(), String>> = std::thread::scope(|sc| {
        let intruder = sc.spawn(move || -> Result<(), String> {
            let rank1 = addr_rx
                .recv_timeout(Duration::from_secs(60))
                .map_err(|e| e.to_string())?;
            let store = format!("127.0.0.1:{port}");
            for door in [&rank1, &store] {
                // A wrong secret: the secret handshake (through the public store client,
                // which opens every connection with it) fails at either door.
                let guess = secured("a guess at the secret");
                match collectix::TcpStore::connect_secured(
                    door.as_str(),
                    Duration::from_secs(20),
                    guess,
                ) {
                    Err(Error::Unauthenticated { .. }) => {}
                    other => {
                        let got = other.map(|_| "a connection");
                        return Err(format!("{door}: a wrong secret got {got:?}"));
                    }
                }
                // No handshake: a frame, or HTTP; the door closes without an answer.
                let frame =
                    collectix::runtime::wire::codec::encode(&collectix::runtime::wire::Message {
                        src: 0,
                        header: collectix::runtime::wire::Header::Abort {
                            group: collectix::GroupId::WORLD,
                            reason: Box::new(collectix::runtime::wire::AbortReason::PeerLost {
                                rank: 1,
                            }),
                        },
                        payload: Vec::new(),
                    })
                    .to_contiguous();
                for bytes in [&frame[..], &[0u8; 40][..], b"GET / HTTP/1.1\r\n\r\n"] {
                    let mut s = std::net::TcpStream::connect(door).map_err(|e| e.to_string())?;
                    let _ = s.write_all(bytes);
                    let _ = s.shutdown(std::net::Shutdown::Write);
                    let _ = s.set_read_timeout(Some(Duration::from_secs(20)));
                    let mut answer = Vec::new();
                    let _ = s.read_to_end(&mut answer);
                    if !answer.is_empty() {
                        return Err(format!(
                            "{door} answered {} bytes to an intruder",
                            answer.len()
                        ));
                    }
                }
            }
            let _ = done_tx.send(());
            Ok(())
        });
        let ranks: Vec<_> = (0..w)
            .map(|r| {
                let (addr_tx, done_rx) = (addr_tx.clone(), &done_rx);
                sc.spawn(move || -> Result<(), String> {
                    let p = init(
                        &args(port, r, w, None),
                        GroupOptions::default(),
                        Duration::from_secs(60),
                    )
                    .map_err(|e| format!("rank {r} cannot join: {e}"))?;
                    let c = p.communicator();
                    let round = |k: i64| -> Result<(), String> {
                        let got = c
                            .all_reduce(
                                collectix::Tensor::from_vec(vec![k + r as i64; 4]),
                                collectix::ReduceOp::Sum,
                            )
                            .wait()
                            .map_err(|e| format!("rank {r}: {e}"))?;
                        if got != collectix::Tensor::from_vec(vec![2 * k + 1; 4]) {
                            return Err(format!("rank {r}: {got}"));
                        }
                        Ok(())
                    };
                    round(1)?;
                    if r == 1 {
                        let _ = addr_tx.send(p.address().to_string());
                    }
                    // Both ranks wait for the intruder to be done, then carry on.
                    if r == 1 {
                        done_rx
                            .lock()
                            .map_err(|e| e.to_string())?
                            .recv_timeout(Duration::from_secs(120))
                            .map_err(|e| format!("the intruder never finished: {e}"))?;
                    }
                    for k in 2..50 {
                        round(k)?;
                    }
                    p.shutdown().map_err(|e| format!("rank {r} left with {e}"))
                })
            })
            .collect();
        let mut out: Vec<Result<(), String>> = ranks
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("panicked".into())))
            .collect();
        out.push(intruder.join().unwrap_or_else(|_| Err("panicked".into())));
        out
    });
    for (who, res) in results.into_iter().enumerate() {
        assert_eq!(
            res,
            Ok(()),
            "{}",
            if who < w {
                format!("rank {who}")
            } else {
                "intruder".into()
            }
        );
    }
}

/// Two groups share every connection: the world, and `b` (all three ranks, in another order).
/// Rank 0 issues 40 all_reduces on `b` and does not wait for them; nobody else touches `b`
/// until the world has run 200 all_reduces, each waited for and checked. `b`'s messages,
/// far beyond its window and its byte budget, wait in rank 0 — they never hold up the world's
/// on the shared connections — and then `b` catches up, every value exact.
#[test]
fn a_group_far_behind_never_blocks_another_on_the_same_connections() {
    let (w, port) = (3usize, free_port());
    let results: Vec<Result<(), String>> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..w)
            .map(|r| {
                sc.spawn(move || -> Result<(), String> {
                    let args = args(port, r, w, None);
                    // A budget of 1 MiB, segments of 64 KiB: `b`'s calls of 256 KiB each
                    // exceed it four calls ahead.
                    let opts = GroupOptions {
                        peer_budget_bytes: 1 << 20,
                        segment_bytes: 64 << 10,
                        ..GroupOptions::default()
                    };
                    let p = init(&args, opts, Duration::from_secs(60))
                        .map_err(|e| format!("rank {r} cannot join: {e}"))?;
                    let c = p.communicator();
                    let b = c
                        .new_group(&[2, 0, 1])
                        .wait()
                        .map_err(|e| e.to_string())?
                        .ok_or("not a member of b")?;
                    let big =
                        |k: usize| collectix::Tensor::from_vec(vec![(r + k) as f32; 64 << 10]);
                    let behind = |k: usize| b.all_reduce(big(k), collectix::ReduceOp::Sum);
                    let mut b_calls = Vec::new();
                    if r == 0 {
                        b_calls = (0..40).map(behind).collect();
                    }
                    let opts = CallOptions {
                        algorithm: None,
                        timeout: Some(Duration::from_secs(30)),
                    };
                    for k in 0..200 {
                        let x = collectix::Tensor::from_vec(vec![(r * k) as i64; 8]);
                        let got = c
                            .all_reduce_with(x, collectix::ReduceOp::Sum, &opts)
                            .wait()
                            .map_err(|e| format!("rank {r}, world call {k}: {e}"))?;
                        let want = collectix::Tensor::from_vec(vec![(3 * k) as i64; 8]);
                        if got != want {
                            return Err(format!("rank {r}, world call {k}: {got}"));
                        }
                    }
                    if r != 0 {
                        b_calls = (0..40).map(behind).collect();
                    }
                    for (k, work) in b_calls.into_iter().enumerate() {
                        let got = work
                            .wait()
                            .map_err(|e| format!("rank {r}, b call {k}: {e}"))?;
                        let want = collectix::Tensor::from_vec(vec![(3 + 3 * k) as f32; 64 << 10]);
                        if got != want {
                            return Err(format!("rank {r}, b call {k}: wrong values"));
                        }
                    }
                    p.shutdown().map_err(|e| format!("rank {r} left with {e}"))
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("panicked".into())))
            .collect()
    });
    for (r, res) in results.into_iter().enumerate() {
        assert_eq!(res, Ok(()), "rank {r}");
    }
}

/// Device calls across ranks that only share TCP links (stand-in device memory: no GPU
/// needed): host-staged collectives, and sends on the NCCL backend's protocol — the ticket,
/// the receiver's go and the data each cross as frames — taken in the reverse of the order
/// they were sent.
#[test]
fn device_calls_over_tcp_with_stand_in_memory() {
    use collectix::device::StandIn;
    use collectix::{DType, Device, DeviceBackend, ReduceOp, Tensor, TensorDeviceExt, TensorSpec};
    const GPU: Device = Device::Cuda(0);
    let w = 3;
    let port = free_port();
    let data = |from: usize, tag: u32| -> Vec<f32> {
        let n = if tag == 1 { 5 } else { 200_000 };
        (0..n)
            .map(|i| (from * 10 + tag as usize + i) as f32)
            .collect()
    };
    let results: Vec<Result<(), String>> = std::thread::scope(|sc| {
        let handles: Vec<_> = (0..w)
            .map(|r| {
                sc.spawn(move || -> Result<(), String> {
                    let p = init(
                        &args(port, r, w, Some(Connect::Eager)),
                        check_job::options(),
                        Duration::from_secs(60),
                    )
                    .map_err(|e| format!("rank {r} cannot join: {e}"))?;
                    let c = p.communicator();
                    let dev = |v: Vec<f32>| StandIn::tensor(&Tensor::from_vec(v), GPU);
                    let host = |t: Tensor| t.to_host().and_then(|h| h.to_vec::<f32>());
                    let sum = c
                        .with_device_backend(DeviceBackend::HostStaged)
                        .all_reduce(
                            dev(vec![r as f32, 1.0]).map_err(|e| e.to_string())?,
                            ReduceOp::Sum,
                        )
                        .wait()
                        .map_err(|e| format!("rank {r} all_reduce: {e}"))?;
                    if host(sum).ok() != Some(vec![3.0, 3.0]) {
                        return Err(format!("rank {r}: wrong all_reduce"));
                    }
                    let right = (r + 1) % w;
                    let left = (r + w - 1) % w;
                    let sends = [1, 2]
                        .iter()
                        .map(|&tag| Ok(c.send(dev(data(r, tag))?, right, tag)))
                        .collect::<collectix::Result<Vec<_>>>()
                        .map_err(|e| e.to_string())?;
                    for tag in [2, 1] {
                        let n = data(left, tag).len();
                        let (t, src) = c
                            .recv(TensorSpec::new(&[n], DType::F32).on(GPU), Some(left), tag)
                            .wait()
                            .map_err(|e| format!("rank {r} recv tag {tag}: {e}"))?;
                        if src != left || t.device() != GPU || host(t).ok() != Some(data(left, tag))
                        {
                            return Err(format!("rank {r}: wrong data on tag {tag}"));
                        }
                    }
                    for s in sends {
                        s.wait().map_err(|e| format!("rank {r} send: {e}"))?;
                    }
                    p.shutdown().map_err(|e| format!("rank {r} left with {e}"))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("panicked".into())))
            .collect()
    });
    for (r, res) in results.into_iter().enumerate() {
        assert_eq!(res, Ok(()), "rank {r}");
    }
}

/// A rank started with another WORLD_SIZE than the job's is told at once which rank said
/// which size, rather than waiting for peers that will never connect.
#[test]
fn a_rank_with_another_world_size_is_told_which_rank_said_what() {
    let port = free_port();
    let (joined_tx, joined_rx) = std::sync::mpsc::channel::<()>();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let done_rx = std::sync::Mutex::new(done_rx);
    std::thread::scope(|sc| {
        for r in 0..3 {
            let (joined, done) = (joined_tx.clone(), &done_rx);
            sc.spawn(move || {
                let p = init(
                    &args(port, r, 3, Some(Connect::Eager)),
                    check_job::options(),
                    Duration::from_secs(60),
                )
                .unwrap_or_else(|e| panic!("rank {r} cannot join: {e}"));
                let _ = joined.send(());
                // Stay in the job (rank 0 holds the store) until the stranger has been told.
                let _ = done.lock().map(|d| d.recv_timeout(Duration::from_secs(60)));
                drop(p);
            });
        }
        for _ in 0..3 {
            joined_rx
                .recv_timeout(Duration::from_secs(60))
                .unwrap_or_else(|e| panic!("the job of 3 did not form: {e}"));
        }
        let start = Instant::now();
        let stranger = init(
            &args(port, 3, 4, Some(Connect::Eager)),
            check_job::options(),
            Duration::from_secs(20),
        );
        let took = start.elapsed();
        for _ in 0..3 {
            let _ = done_tx.send(());
        }
        match stranger {
            Err(Error::InvalidArgument(text)) => {
                // Whichever rank of the job of 3 recorded its size first.
                let named = (0..3).any(|r| text.contains(&format!("rank {r} says 3,")));
                assert!(text.contains("WORLD_SIZE") && named, "{text}");
                assert!(text.contains("this rank (3) was started with 4"), "{text}");
            }
            Err(e) => panic!("after {took:?}: {e}"),
            Ok(_) => panic!("a rank of a world of 4 joined a job of 3"),
        }
        assert!(took < Duration::from_secs(10), "told only after {took:?}");
    });
}
