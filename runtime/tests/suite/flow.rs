//! Flow control: a rank that runs far ahead cannot grow a peer's queues without limit; what it
//! sends waits in its own engine until the peer makes the calls, and then everything completes.

use collectix_runtime::group::{CallOptions, GroupId, GroupOptions};
use collectix_runtime::testing::sim::Sim;
use collectix_runtime::{Output, Request, Tensor};

/// Rank 0 makes `calls` broadcasts as root of `data(k)`, without waiting, and the simulator
/// runs until nothing moves.
fn root_broadcasts(
    sim: &mut Sim,
    calls: u64,
    data: &dyn Fn(u64) -> Tensor,
) -> Vec<collectix_runtime::OpId> {
    let mut roots = Vec::new();
    for k in 0..calls {
        let req = Request::Broadcast {
            tensor: data(k),
            root: 0,
        };
        roots.push(
            sim.submit(0, GroupId::WORLD, req, &CallOptions::default())
                .unwrap_or_else(|e| panic!("{e}")),
        );
    }
    sim.run_no_timeouts(1_000_000)
        .unwrap_or_else(|e| panic!("{e:?}"));
    roots
}

/// A non-root's broadcast call of `n` elements of `dtype`.
fn receive_broadcast(n: usize, dtype: collectix_runtime::DType) -> Request {
    Request::Broadcast {
        tensor: Tensor::zeros(&[n], dtype).unwrap_or_else(|e| panic!("{e}")),
        root: 0,
    }
}

#[test]
fn a_root_far_ahead_is_held_to_the_window() {
    for seed in 0..5 {
        let window = 4;
        let mut sim = Sim::with_options(
            3,
            seed,
            GroupOptions {
                window,
                ..GroupOptions::default()
            },
        );
        let calls = 50u64;
        let data = |k: u64| Tensor::from_vec(vec![k as i64; 3]);
        let roots = root_broadcasts(&mut sim, calls, &data);
        let peer = |sim: &Sim, r| sim.engine(r).map_or(usize::MAX, |e| e.buffered());
        // Ranks 1 and 2 made no call: each buffers at most `window` calls' messages.
        assert!(
            peer(&sim, 1) <= window as usize && peer(&sim, 2) <= window as usize,
            "seed {seed}"
        );
        assert!(sim.engine(0).map_or(0, |e| e.held()) >= 2 * (calls - window) as usize);
        // The root's calls completed (a root's broadcast completes once its part is done).
        for id in &roots {
            assert!(matches!(sim.take(0, *id), Some(Ok(_))));
        }
        // Now the others make the calls: everything arrives, in order, and nothing is left.
        let mut others = Vec::new();
        for k in 0..calls {
            for r in 1..3 {
                let req = receive_broadcast(3, collectix_runtime::DType::I64);
                others.push((
                    r,
                    k,
                    sim.submit(r, GroupId::WORLD, req, &CallOptions::default())
                        .unwrap_or_else(|e| panic!("{e}")),
                ));
            }
        }
        sim.run_no_timeouts(1_000_000)
            .unwrap_or_else(|e| panic!("{e:?}\n{}", sim.trace_text()));
        for (r, k, id) in others {
            assert_eq!(
                sim.take(r, id),
                Some(Ok(Output::Tensor(data(k)))),
                "seed {seed} rank {r} call {k}"
            );
        }
        for r in 0..3 {
            assert_eq!(
                sim.engine(r).map(|e| (e.held(), e.buffered())),
                Some((0, 0)),
                "rank {r}"
            );
        }
    }
}

/// Rank 0 sends `n` messages of `len` i32s (`[k; len]`) to rank 1 on one tag, with no
/// receive posted; `between` checks the state then; then rank 1 posts its receives, and every
/// message arrives, in order.
fn sends_then_receives(sim: &mut Sim, n: usize, len: usize, between: &dyn Fn(&Sim)) {
    use collectix_runtime::collective::TensorSpec;
    use collectix_runtime::DType;
    for k in 0..n {
        let req = Request::Send {
            tensor: Tensor::from_vec(vec![k as i32; len]),
            dst: 1,
            tag: 9,
        };
        sim.submit(0, GroupId::WORLD, req, &CallOptions::default())
            .unwrap_or_else(|e| panic!("{e}"));
    }
    sim.run_no_timeouts(100_000)
        .unwrap_or_else(|e| panic!("{e:?}"));
    between(sim);
    let mut recvs = Vec::new();
    for _ in 0..n {
        let req = Request::Recv {
            spec: TensorSpec::new(&[len], DType::I32),
            src: Some(0),
            tag: 9,
        };
        recvs.push(
            sim.submit(1, GroupId::WORLD, req, &CallOptions::default())
                .unwrap_or_else(|e| panic!("{e}")),
        );
    }
    sim.run_no_timeouts(100_000)
        .unwrap_or_else(|e| panic!("{e:?}\n{}", sim.trace_text()));
    for (k, id) in recvs.into_iter().enumerate() {
        let want = Output::Received {
            tensor: Tensor::from_vec(vec![k as i32; len]),
            src: 0,
        };
        assert_eq!(sim.take(1, id), Some(Ok(want)), "message {k}");
    }
}

/// The default window lets a root run 256 calls ahead of its peers (it asks for credit once
/// per 128), while point-to-point keeps its own window of 16 eager messages, each up to
/// 4 MiB: a larger window of calls does not turn 1 MiB messages into rendezvous. (Before, the
/// default window was 16: a root 200 calls ahead held 184 of them.)
#[test]
fn the_default_window_lets_a_root_run_far_ahead_and_keeps_point_to_point_eager() {
    let mut sim = Sim::with_options(2, 5, GroupOptions::default());
    let data = |k: u64| Tensor::from_vec(vec![k as i64; 2]);
    let roots = root_broadcasts(&mut sim, 200, &data);
    assert_eq!(sim.engine(0).map(|e| e.held()), Some(0), "nothing held");
    assert!(sim.engine(1).is_some_and(|e| e.buffered() <= 256));
    for id in &roots {
        assert!(matches!(sim.take(0, *id), Some(Ok(_))));
    }
    // 1 MiB messages (i32 × 262 144) with no receive posted: 16 go eager, the rest wait.
    let mut p2p = Sim::with_options(2, 6, GroupOptions::default());
    let n = 20;
    sends_then_receives(&mut p2p, n, 1 << 18, &|sim| {
        let arrived = sim.engine(1).map_or(usize::MAX, |e| e.p2p_buffered());
        assert_eq!(arrived, 16, "eager messages buffered by the receiver");
        assert_eq!(sim.engine(0).map(|e| e.held()), Some(n - 16));
    });
    assert_eq!(p2p.engine(0).map(|e| e.held()), Some(0));
}

#[test]
fn an_isend_loop_without_receives_is_held_to_the_window() {
    let window = 3;
    let mut sim = Sim::with_options(
        2,
        11,
        GroupOptions {
            window,
            ..GroupOptions::default()
        },
    );
    let n = 40;
    sends_then_receives(&mut sim, n, 1, &|sim| {
        let arrived = sim.engine(1).map_or(usize::MAX, |e| e.p2p_buffered());
        assert!(
            arrived <= window as usize,
            "receiver buffers {arrived} messages"
        );
        assert_eq!(sim.engine(0).map(|e| e.held()), Some(n - window as usize));
    });
    assert_eq!(sim.engine(0).map(|e| e.held()), Some(0));
}

#[test]
fn an_aborted_group_drops_what_it_held() {
    let window = 2;
    let mut sim = Sim::with_options(
        2,
        3,
        GroupOptions {
            window,
            ..GroupOptions::default()
        },
    );
    for k in 0..10i64 {
        let req = Request::Broadcast {
            tensor: Tensor::from_vec(vec![k]),
            root: 0,
        };
        sim.submit(0, GroupId::WORLD, req, &CallOptions::default())
            .unwrap_or_else(|e| panic!("{e}"));
    }
    sim.settle(100_000).unwrap_or_else(|e| panic!("{e:?}"));
    assert!(sim.engine(0).is_some_and(|e| e.held() > 0));
    // Rank 1 is lost: the group aborts on rank 0, and nothing stays held for it.
    sim.isolate(1);
    let _ = sim.run(100_000);
    assert!(sim
        .engine(0)
        .is_some_and(|e| e.aborted(GroupId::WORLD).is_some()));
    assert_eq!(sim.engine(0).map(|e| e.held()), Some(0));
}

#[test]
fn receives_for_one_peer_grant_no_credit_to_another() {
    // Rank 0 posts 200 receives from rank 2 (which sends nothing yet); rank 1 sends 200
    // messages to rank 0 on the same tag, none of which those receives match. Rank 0 may
    // buffer at most a window of rank 1's messages; the rest wait in rank 1.
    let window = 4u64;
    let mut sim = Sim::with_options(
        3,
        11,
        GroupOptions {
            window,
            ..GroupOptions::default()
        },
    );
    let spec = || collectix_runtime::TensorSpec::new(&[1], collectix_runtime::DType::I64);
    let mut from2 = Vec::new();
    for _ in 0..200 {
        let req = Request::Recv {
            spec: spec(),
            src: Some(2),
            tag: 5,
        };
        from2.push(sim.submit(0, GroupId::WORLD, req, &CallOptions::default()));
    }
    for k in 0..200i64 {
        let req = Request::Send {
            tensor: Tensor::from_vec(vec![k]),
            dst: 0,
            tag: 5,
        };
        sim.submit(1, GroupId::WORLD, req, &CallOptions::default())
            .unwrap_or_else(|e| panic!("{e}"));
    }
    sim.settle(1_000_000).unwrap_or_else(|e| panic!("{e:?}"));
    let buffered = sim.engine(0).map_or(usize::MAX, |e| e.p2p_buffered());
    assert!(
        buffered <= window as usize,
        "rank 0 buffers {buffered} of rank 1's messages"
    );
    assert!(sim
        .engine(1)
        .is_some_and(|e| e.held() >= 200 - window as usize));
    // Now everything is received, in order, from both peers.
    let mut from1 = Vec::new();
    for _ in 0..200 {
        let req = Request::Recv {
            spec: spec(),
            src: Some(1),
            tag: 5,
        };
        from1.push(sim.submit(0, GroupId::WORLD, req, &CallOptions::default()));
    }
    for k in 0..200i64 {
        let req = Request::Send {
            tensor: Tensor::from_vec(vec![1000 + k]),
            dst: 0,
            tag: 5,
        };
        sim.submit(2, GroupId::WORLD, req, &CallOptions::default())
            .unwrap_or_else(|e| panic!("{e}"));
    }
    sim.run_no_timeouts(10_000_000)
        .unwrap_or_else(|e| panic!("{e:?}"));
    for (k, id) in from1.into_iter().enumerate() {
        let id = id.unwrap_or_else(|e| panic!("{e}"));
        let want = Output::Received {
            tensor: Tensor::from_vec(vec![k as i64]),
            src: 1,
        };
        assert_eq!(sim.take(0, id), Some(Ok(want)), "from 1, #{k}");
    }
    for (k, id) in from2.into_iter().enumerate() {
        let id = id.unwrap_or_else(|e| panic!("{e}"));
        let want = Output::Received {
            tensor: Tensor::from_vec(vec![1000 + k as i64]),
            src: 2,
        };
        assert_eq!(sim.take(0, id), Some(Ok(want)), "from 2, #{k}");
    }
}

/// Rank 1 sends rank 0 one message on each of `tags` tags before rank 0 posts any receive;
/// then rank 0 receives them in reverse tag order (`any_source`: from any source), one call
/// at a time (each receive waits until the one before it completed).
fn many_tags(window: u64, tags: u32, any_source: bool, seed: u64) {
    let mut sim = Sim::with_options(
        2,
        seed,
        GroupOptions {
            window,
            ..GroupOptions::default()
        },
    );
    for t in 0..tags {
        let req = Request::Send {
            tensor: Tensor::from_vec(vec![i64::from(t)]),
            dst: 0,
            tag: t,
        };
        sim.submit(1, GroupId::WORLD, req, &CallOptions::default())
            .unwrap_or_else(|e| panic!("{e}"));
    }
    sim.settle(1_000_000).unwrap_or_else(|e| panic!("{e:?}"));
    let buffered = sim.engine(0).map_or(usize::MAX, |e| e.p2p_buffered());
    assert!(
        buffered <= window as usize,
        "window {window}: rank 0 buffers {buffered} of rank 1's messages on {tags} tags"
    );
    assert_eq!(
        sim.engine(1).map(|e| e.held()),
        Some(tags as usize - buffered),
        "what rank 0 does not buffer waits in rank 1"
    );
    for t in (0..tags).rev() {
        let req = Request::Recv {
            spec: collectix_runtime::TensorSpec::new(&[1], collectix_runtime::DType::I64),
            src: (!any_source).then_some(1),
            tag: t,
        };
        let id = sim
            .submit(0, GroupId::WORLD, req, &CallOptions::default())
            .unwrap_or_else(|e| panic!("{e}"));
        sim.run_no_timeouts(1_000_000)
            .unwrap_or_else(|e| panic!("tag {t}: {e:?}"));
        let want = Output::Received {
            tensor: Tensor::from_vec(vec![i64::from(t)]),
            src: 1,
        };
        assert_eq!(sim.take(0, id), Some(Ok(want)), "tag {t}");
        let buffered = sim.engine(0).map_or(usize::MAX, |e| e.p2p_buffered());
        assert!(buffered <= window as usize, "tag {t}: {buffered} buffered");
    }
    for r in 0..2 {
        assert_eq!(
            sim.engine(r).map(|e| (e.held(), e.p2p_buffered())),
            Some((0, 0)),
            "rank {r}"
        );
    }
}

#[test]
fn one_peer_on_many_tags_is_held_to_the_window() {
    // The bound is per sending peer, whatever tags it uses (it used to be a window per
    // tag, so 300 tags made rank 0 buffer 300 messages).
    for (window, seed) in [(1, 1), (2, 2), (4, 3), (16, 4)] {
        many_tags(window, 300, false, seed);
    }
}

#[test]
fn receives_from_any_source_release_a_peer_held_beyond_the_window() {
    for (window, seed) in [(1, 5), (4, 6)] {
        many_tags(window, 100, true, seed);
    }
}

/// Rank 0 of 2 broadcasts `calls` times as root (each completes at once), then shuts down
/// with `linger`; rank 1 then makes its calls one at a time, at once (`late` false: every
/// call settles without any deadline firing) or after the linger time has passed. Returns
/// rank 1's results, with how long each took.
fn root_shuts_down_early(
    linger: std::time::Duration,
    late: bool,
) -> (
    Sim,
    Vec<(collectix_runtime::Result<Output>, std::time::Duration)>,
) {
    let calls = 10i64;
    let mut sim = Sim::with_options(
        2,
        7,
        GroupOptions {
            window: 2,
            ..GroupOptions::default()
        },
    );
    for k in 0..calls {
        let req = Request::Broadcast {
            tensor: Tensor::from_vec(vec![k]),
            root: 0,
        };
        let id = sim
            .submit(0, GroupId::WORLD, req, &CallOptions::default())
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            matches!(sim.take(0, id), Some(Ok(_))),
            "the root's call {k}"
        );
    }
    sim.settle(100_000).unwrap_or_else(|e| panic!("{e:?}"));
    assert!(sim.engine(0).is_some_and(|e| e.held() > 0));
    sim.shutdown(0, linger);
    if late {
        // Nothing but rank 0's linger time is pending: it passes.
        sim.run(1_000_000).unwrap_or_else(|e| panic!("{e:?}"));
        assert!(sim.now().saturating_since(collectix_runtime::Time::ZERO) >= linger);
    }
    let mut results = Vec::new();
    for _ in 0..calls {
        let req = Request::Broadcast {
            tensor: Tensor::from_vec(vec![-1i64]),
            root: 0,
        };
        let start = sim.now();
        let id = sim
            .submit(1, GroupId::WORLD, req, &CallOptions::default())
            .unwrap_or_else(|e| panic!("{e}"));
        if late {
            sim.run(1_000_000).unwrap_or_else(|e| panic!("{e:?}"));
        } else {
            sim.settle(1_000_000).unwrap_or_else(|e| panic!("{e:?}"));
        }
        let took = sim
            .completed_at(1, id)
            .map_or(std::time::Duration::MAX, |t| t.saturating_since(start));
        let r = sim.take(1, id).unwrap_or_else(|| panic!("no result"));
        results.push((r, took));
    }
    (sim, results)
}

#[test]
fn a_root_that_shuts_down_sends_what_it_held_within_its_linger() {
    let linger = std::time::Duration::from_secs(5);
    let (sim, results) = root_shuts_down_early(linger, false);
    for (k, (r, _)) in results.into_iter().enumerate() {
        assert_eq!(
            r,
            Ok(Output::Tensor(Tensor::from_vec(vec![k as i64]))),
            "call {k}"
        );
    }
    assert!(sim.engine(0).is_some_and(|e| e.is_drained()));
}

#[test]
fn a_root_that_shuts_down_past_its_linger_fails_its_peers_at_once() {
    // The held messages used to be dropped, and rank 1 waited for its whole timeout.
    let linger = std::time::Duration::from_millis(10);
    let (sim, results) = root_shuts_down_early(linger, true);
    assert!(sim.engine(0).is_some_and(|e| e.is_drained()));
    let timeout = GroupOptions::default().timeout;
    for (k, (r, took)) in results.into_iter().enumerate() {
        assert!(took < timeout / 10, "call {k} took {took:?}");
        let e = r.err().unwrap_or_else(|| panic!("call {k} succeeded"));
        assert!(
            matches!(e.root_cause(), collectix_runtime::Error::PeerShutdown { rank: 0, undelivered } if *undelivered > 0),
            "call {k}: {e}"
        );
    }
}

#[test]
fn point_to_point_messages_held_at_shutdown_fail_the_receiver_at_once() {
    // Window 2: rank 0 sends 6 messages on one tag and shuts down with a short linger;
    // rank 1 receives later. The first 2 went eagerly; the rest were held, and rank 1 hears
    // that they never will come instead of waiting for its timeout.
    let mut sim = Sim::with_options(
        2,
        21,
        GroupOptions {
            window: 2,
            ..GroupOptions::default()
        },
    );
    for k in 0..6i64 {
        let req = Request::Send {
            tensor: Tensor::from_vec(vec![k]),
            dst: 1,
            tag: 4,
        };
        sim.submit(0, GroupId::WORLD, req, &CallOptions::default())
            .unwrap_or_else(|e| panic!("{e}"));
    }
    sim.settle(100_000).unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(sim.engine(0).map(|e| e.held()), Some(4));
    sim.shutdown(0, std::time::Duration::from_millis(1));
    sim.run(100_000).unwrap_or_else(|e| panic!("{e:?}"));
    assert!(sim.engine(0).is_some_and(|e| e.is_drained()));
    let start = sim.now();
    let req = Request::Recv {
        spec: collectix_runtime::TensorSpec::new(&[1], collectix_runtime::DType::I64),
        src: Some(0),
        tag: 4,
    };
    let id = sim
        .submit(1, GroupId::WORLD, req, &CallOptions::default())
        .unwrap_or_else(|e| panic!("{e}"));
    sim.run(100_000).unwrap_or_else(|e| panic!("{e:?}"));
    let e = sim.take(1, id).and_then(|r| r.err());
    assert!(
        matches!(
            e.as_ref().map(collectix_runtime::Error::root_cause),
            Some(collectix_runtime::Error::PeerShutdown {
                rank: 0,
                undelivered: 4
            })
        ),
        "{e:?}"
    );
    assert_eq!(
        sim.completed_at(1, id).map(|t| t.saturating_since(start)),
        Some(std::time::Duration::ZERO),
        "fails at once"
    );
}

#[test]
fn a_rank_that_shuts_down_in_a_call_tells_every_member_at_once() {
    // Ranks 0 and 1 are in an all_reduce, rank 2 has not made it yet; rank 0 shuts down.
    let mut sim = Sim::new(3, 5);
    let call = |r: usize| Request::AllReduce {
        tensor: Tensor::from_vec(vec![r as i64]),
        op: collectix_runtime::ReduceOp::Sum,
    };
    let a = sim
        .submit(0, GroupId::WORLD, call(0), &CallOptions::default())
        .unwrap_or_else(|e| panic!("{e}"));
    let b = sim
        .submit(1, GroupId::WORLD, call(1), &CallOptions::default())
        .unwrap_or_else(|e| panic!("{e}"));
    sim.settle(100_000).unwrap_or_else(|e| panic!("{e:?}"));
    sim.shutdown(0, std::time::Duration::from_secs(5));
    assert_eq!(
        sim.take(0, a),
        Some(Err(collectix_runtime::Error::Shutdown))
    );
    sim.settle(100_000).unwrap_or_else(|e| panic!("{e:?}"));
    let c = sim
        .submit(2, GroupId::WORLD, call(2), &CallOptions::default())
        .unwrap_or_else(|e| panic!("{e}"));
    sim.settle(100_000).unwrap_or_else(|e| panic!("{e:?}"));
    for (r, id) in [(1, b), (2, c)] {
        let e = sim.take(r, id).and_then(|r| r.err());
        assert!(
            matches!(
                e.as_ref().map(collectix_runtime::Error::root_cause),
                Some(collectix_runtime::Error::PeerShutdown { rank: 0, .. })
            ),
            "rank {r}: {e:?}"
        );
    }
}

#[test]
fn an_aborted_group_drops_the_point_to_point_messages_it_held() {
    let mut sim = Sim::with_options(
        2,
        8,
        GroupOptions {
            window: 1,
            ..GroupOptions::default()
        },
    );
    for k in 0..5i64 {
        let req = Request::Send {
            tensor: Tensor::from_vec(vec![k]),
            dst: 1,
            tag: 0,
        };
        sim.submit(0, GroupId::WORLD, req, &CallOptions::default())
            .unwrap_or_else(|e| panic!("{e}"));
    }
    sim.settle(100_000).unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(sim.engine(0).map(|e| e.held()), Some(4));
    sim.isolate(1);
    let _ = sim.run(100_000);
    assert_eq!(sim.engine(0).map(|e| e.held()), Some(0));
}

#[test]
fn a_root_far_ahead_is_held_to_the_byte_budget_and_everything_arrives() {
    // 40 broadcasts of 1200 bytes from a root far ahead; budget 4 KiB, window 16: the window
    // alone would let 16 calls (19 200 bytes) pile up in each peer.
    let budget = 4096u64;
    for seed in 0..5 {
        let mut sim = Sim::with_options(
            3,
            seed,
            GroupOptions {
                peer_budget_bytes: budget,
                ..GroupOptions::default()
            },
        );
        let data = |k: u64| Tensor::from_vec(vec![k as f32; 300]);
        root_broadcasts(&mut sim, 40, &data);
        for r in 1..3 {
            let b = sim.engine(r).map_or(u64::MAX, |e| e.buffered_bytes());
            assert!(
                b > 0 && b <= budget,
                "seed {seed}: rank {r} buffers {b} bytes"
            );
        }
        // The peers catch up one call at a time, checking each value; the budget never
        // breaks (a breach would abort the group with ProtocolError::Budget).
        for k in 0..40 {
            let mut ids = Vec::new();
            for r in 1..3 {
                let req = receive_broadcast(300, collectix_runtime::DType::F32);
                ids.push((
                    r,
                    sim.submit(r, GroupId::WORLD, req, &CallOptions::default())
                        .unwrap_or_else(|e| panic!("{e}")),
                ));
            }
            sim.run_no_timeouts(1_000_000)
                .unwrap_or_else(|e| panic!("{e:?}"));
            for (r, id) in ids {
                assert_eq!(
                    sim.take(r, id),
                    Some(Ok(Output::Tensor(data(k)))),
                    "seed {seed} rank {r} call {k}"
                );
                let b = sim.engine(r).map_or(u64::MAX, |e| e.buffered_bytes());
                assert!(b <= budget, "seed {seed}: rank {r} buffers {b} bytes");
            }
        }
    }
}

#[test]
fn large_sends_without_receives_wait_in_the_sender() {
    // Budget 4 KiB over a window of 16: messages above 256 bytes wait for their receive.
    let mut sim = Sim::with_options(
        2,
        3,
        GroupOptions {
            peer_budget_bytes: 4096,
            ..GroupOptions::default()
        },
    );
    sends_then_receives(&mut sim, 20, 100, &|sim| {
        assert_eq!(sim.engine(1).map(|e| e.buffered_bytes()), Some(0));
        assert_eq!(sim.engine(0).map(|e| e.held()), Some(20));
    });
}

/// A send of a ticket (`Plan::nccl_ticket`) is matched like any send, and only by a receive
/// on the same data path: that one gets the ticket's bytes; a receive on the engine's path,
/// or one of another count, is a mismatch (and an engine send met by an NCCL receive too).
#[test]
fn tickets_match_only_receives_on_their_path() {
    use collectix_runtime::collective::TensorSpec;
    use collectix_runtime::group::GroupInfo;
    use collectix_runtime::{DType, DataPath, Error, Plan};
    let info = GroupInfo::new(GroupId::WORLD, vec![0, 1], 0, GroupOptions::default())
        .unwrap_or_else(|e| panic!("{e}"));
    let opts = CallOptions::default();
    let ticket = |count: u64, bytes: Vec<u8>| {
        Plan::nccl_ticket(&info, &opts, 1, 4, DType::F32, count, bytes)
            .unwrap_or_else(|e| panic!("{e}"))
    };
    assert!(Plan::nccl_ticket(&info, &opts, 1, 4, DType::F32, 1, vec![0; 65]).is_err());
    let recv = |path: DataPath, n: usize| {
        let req = Request::Recv {
            spec: TensorSpec::new(&[n], DType::F32),
            src: None,
            tag: 4,
        };
        let info1 = GroupInfo::new(GroupId::WORLD, vec![0, 1], 1, GroupOptions::default())
            .unwrap_or_else(|e| panic!("{e}"));
        Plan::new(req, &info1, &CallOptions::default())
            .unwrap_or_else(|e| panic!("{e}"))
            .with_path(path)
    };
    // Matched: the receiver gets the ticket, and who sent it.
    let mut sim = Sim::new(2, 1);
    sim.submit_plan(0, GroupId::WORLD, ticket(1000, vec![7, 8, 9]))
        .unwrap_or_else(|e| panic!("{e}"));
    let r = sim
        .submit_plan(1, GroupId::WORLD, recv(DataPath::Nccl, 1000))
        .unwrap_or_else(|e| panic!("{e}"));
    sim.run_no_timeouts(10_000)
        .unwrap_or_else(|e| panic!("{e:?}"));
    let want = Output::Received {
        tensor: Tensor::from_vec(vec![7u8, 8, 9]),
        src: 0,
    };
    assert_eq!(sim.take(1, r), Some(Ok(want)));
    // Every other pairing is a mismatch on the receiver.
    let engine_send = || Request::Send {
        tensor: Tensor::from_vec(vec![1.0f32; 1000]),
        dst: 1,
        tag: 4,
    };
    for case in 0..3 {
        let mut sim = Sim::new(2, 1);
        let recv_plan = match case {
            0 => {
                sim.submit_plan(0, GroupId::WORLD, ticket(1000, vec![1]))
                    .unwrap_or_else(|e| panic!("{e}"));
                recv(DataPath::Engine, 1000)
            }
            1 => {
                sim.submit_plan(0, GroupId::WORLD, ticket(999, vec![1]))
                    .unwrap_or_else(|e| panic!("{e}"));
                recv(DataPath::Nccl, 1000)
            }
            _ => {
                sim.submit(0, GroupId::WORLD, engine_send(), &CallOptions::default())
                    .unwrap_or_else(|e| panic!("{e}"));
                recv(DataPath::Nccl, 1000)
            }
        };
        let r = sim
            .submit_plan(1, GroupId::WORLD, recv_plan)
            .unwrap_or_else(|e| panic!("{e}"));
        sim.run_no_timeouts(10_000)
            .unwrap_or_else(|e| panic!("{e:?}"));
        match sim.take(1, r) {
            Some(Err(Error::Mismatch { .. })) => {}
            other => panic!("case {case}: {other:?}"),
        }
    }
}

/// Receives posted before their small messages come send no grant (the messages go eager):
/// one frame per message, not two.
#[test]
fn receives_that_wait_for_small_messages_send_no_grant() {
    use collectix_runtime::collective::TensorSpec;
    use collectix_runtime::DType;
    let mut sim = Sim::new(2, 5);
    let mut recvs = Vec::new();
    for _ in 0..5 {
        let req = Request::Recv {
            spec: TensorSpec::new(&[2], DType::I32),
            src: Some(0),
            tag: 4,
        };
        recvs.push(
            sim.submit(1, GroupId::WORLD, req, &CallOptions::default())
                .unwrap_or_else(|e| panic!("{e}")),
        );
    }
    sim.settle(100_000).unwrap_or_else(|e| panic!("{e:?}"));
    for k in 0..5 {
        let req = Request::Send {
            tensor: Tensor::from_vec(vec![k, k]),
            dst: 1,
            tag: 4,
        };
        sim.submit(0, GroupId::WORLD, req, &CallOptions::default())
            .unwrap_or_else(|e| panic!("{e}"));
    }
    sim.run_no_timeouts(100_000)
        .unwrap_or_else(|e| panic!("{e:?}"));
    for (k, id) in recvs.into_iter().enumerate() {
        let want = Output::Received {
            tensor: Tensor::from_vec(vec![k as i32, k as i32]),
            src: 0,
        };
        assert_eq!(sim.take(1, id), Some(Ok(want)), "message {k}");
    }
    let trace = sim.trace_text();
    assert_eq!(trace.matches("p2p-grant").count(), 0, "{trace}");
    assert_eq!(trace.matches("p2p-ask").count(), 0, "{trace}");
}

/// A send too large to go eager, met by a receive whose spec is small enough to go eager:
/// the sender asks for it, the receive grants it, and the receive fails at once with a typed
/// error (it would otherwise wait for its timeout).
#[test]
fn a_large_send_to_a_small_receive_is_asked_for_and_fails_the_receive_at_once() {
    use collectix_runtime::collective::TensorSpec;
    use collectix_runtime::DType;
    // Budget 4 KiB over a window of 16: messages above 256 bytes wait for their receive.
    let mut sim = Sim::with_options(
        2,
        3,
        GroupOptions {
            peer_budget_bytes: 4096,
            ..GroupOptions::default()
        },
    );
    let req = Request::Recv {
        spec: TensorSpec::new(&[2], DType::I32),
        src: Some(0),
        tag: 1,
    };
    let id = sim
        .submit(1, GroupId::WORLD, req, &CallOptions::default())
        .unwrap_or_else(|e| panic!("{e}"));
    let req = Request::Send {
        tensor: Tensor::from_vec(vec![7i32; 100]),
        dst: 1,
        tag: 1,
    };
    sim.submit(0, GroupId::WORLD, req, &CallOptions::default())
        .unwrap_or_else(|e| panic!("{e}"));
    sim.run_no_timeouts(100_000)
        .unwrap_or_else(|e| panic!("{e:?}\n{}", sim.trace_text()));
    let got = sim.take(1, id);
    assert!(matches!(got, Some(Err(_))), "{got:?}");
    let trace = sim.trace_text();
    assert_eq!(trace.matches("p2p-ask").count(), 1, "{trace}");
    assert_eq!(trace.matches("p2p-grant").count(), 1, "{trace}");
}
