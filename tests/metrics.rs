//! Metrics through the `metrics` facade (`collectix::actors::metrics`), read back from a
//! Prometheus recorder as an application would export them: calls, bytes and latencies per
//! collective and group, errors by kind, peers lost, connections refused. The calls are
//! issued and waited for on the test's thread, under a recorder local to it. Two tests read
//! the binary's global recorder instead, each its own series: the store's gate's (it runs on
//! a thread of its own), and the calls made of others (object collectives, `split`,
//! `shrink`), whose parts must not be counted on the ranks' threads.

use collectix::{Error, GroupOptions, ReduceOp, Secret, Security, TcpStoreServer, Tensor, World};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle, PrometheusRecorder};
use std::io::Write;
use std::time::{Duration, Instant};

fn recorder() -> (PrometheusRecorder, PrometheusHandle) {
    let r = PrometheusBuilder::new().build_recorder();
    let h = r.handle();
    (r, h)
}

/// The value of the series `name` whose labels include every one of `labels`.
fn value(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
        .find(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[test]
fn calls_bytes_and_latencies_are_counted_per_collective_and_group() {
    let (rec, handle) = recorder();
    metrics::with_local_recorder(&rec, || -> Result<(), Error> {
        let world = World::local(2)?;
        let c = world.communicators();
        for _ in 0..3 {
            let w: Vec<_> = c
                .iter()
                .map(|c| c.all_reduce(Tensor::from_vec(vec![1.0f32; 256]), ReduceOp::Sum))
                .collect();
            for w in w {
                w.wait()?;
            }
        }
        let b: Vec<_> = c.iter().map(|c| c.barrier()).collect();
        for b in b {
            b.wait()?;
        }
        // A group of its own: counted under its id.
        let g: Vec<_> = c.iter().map(|c| c.new_group(&[0, 1])).collect();
        let groups: Vec<_> = g
            .into_iter()
            .map(|g| g.wait())
            .collect::<Result<Vec<_>, _>>()?;
        let w: Vec<_> = groups
            .iter()
            .flatten()
            .map(|g| g.all_reduce(Tensor::from_vec(vec![1i32; 2]), ReduceOp::Sum))
            .collect();
        for w in w {
            w.wait()?;
        }
        world.shutdown()
    })
    .unwrap_or_else(|e| panic!("{e}"));
    let text = handle.render();
    let world = [("op", "all_reduce"), ("group", "world")];
    assert_eq!(
        value(&text, "collectix_calls_total", &world),
        Some(6.0),
        "{text}"
    );
    assert_eq!(
        value(&text, "collectix_call_bytes_total", &world),
        Some(6.0 * 1024.0),
        "{text}"
    );
    assert_eq!(
        value(&text, "collectix_call_seconds_count", &world),
        Some(6.0),
        "{text}"
    );
    let barrier = [("op", "barrier"), ("group", "world")];
    assert_eq!(
        value(&text, "collectix_calls_total", &barrier),
        Some(2.0),
        "{text}"
    );
    // The subgroup's all_reduces: 2 calls of 8 bytes under another group id.
    let sub: Vec<&str> = text
        .lines()
        .filter(|l| {
            l.starts_with("collectix_call_bytes_total{")
                && l.contains("op=\"all_reduce\"")
                && !l.contains("group=\"world\"")
        })
        .collect();
    assert_eq!(sub.len(), 1, "{text}");
    assert!(sub[0].ends_with(" 16"), "{text}");
    // new_group: one call on each rank, under the parent group.
    assert_eq!(
        value(
            &text,
            "collectix_calls_total",
            &[("op", "new_group"), ("group", "world")]
        ),
        Some(2.0),
        "{text}"
    );
    assert!(!text.contains("collectix_call_errors_total"), "{text}");
}

/// A call on device tensors through the host-staged backend is one call: counted once, as
/// itself, not again for the host call that carries it.
/// Rank 1's part of each all_reduce is issued 20 ms after rank 0's: rank 0's view counts it
/// late in every call (`collectix_late_calls_total`), and its lateness is about 20 ms (the
/// engine's clock is coarse: a few milliseconds either way).
#[test]
fn a_member_that_comes_late_is_counted_with_its_lateness() {
    let (rec, handle) = recorder();
    metrics::with_local_recorder(&rec, || -> Result<(), Error> {
        let world = World::local(2)?;
        let c = world.communicators();
        for _ in 0..5 {
            let first = c[0].all_reduce(Tensor::from_vec(vec![1.0f32; 256]), ReduceOp::Sum);
            std::thread::sleep(Duration::from_millis(20));
            let second = c[1].all_reduce(Tensor::from_vec(vec![1.0f32; 256]), ReduceOp::Sum);
            first.wait()?;
            second.wait()?;
        }
        Ok(())
    })
    .unwrap_or_else(|e| panic!("{e}"));
    let text = handle.render();
    let by_zero = [("group", "world"), ("rank", "0"), ("peer", "1")];
    assert_eq!(
        value(&text, "collectix_late_calls_total", &by_zero),
        Some(5.0),
        "{text}"
    );
    let late = value(&text, "collectix_peer_lateness_seconds", &by_zero).unwrap_or(0.0);
    assert!((0.012..0.030).contains(&late), "{late}\n{text}");
    // Rank 0 was never the late-comer.
    let zero = [("group", "world"), ("peer", "0")];
    assert_eq!(
        value(&text, "collectix_late_calls_total", &zero),
        None,
        "{text}"
    );
}

#[test]
fn a_host_staged_device_call_counts_once() {
    use collectix::device::StandIn;
    use collectix::{Device, DeviceBackend};
    let (rec, handle) = recorder();
    metrics::with_local_recorder(&rec, || -> Result<(), Error> {
        let world = World::local(2)?;
        let w: Vec<_> = world
            .communicators()
            .iter()
            .map(|c| {
                let t = StandIn::tensor(&Tensor::from_vec(vec![1.0f32; 4]), Device::Cuda(0))?;
                Ok(c.with_device_backend(DeviceBackend::HostStaged)
                    .all_reduce(t, ReduceOp::Sum))
            })
            .collect::<Result<_, Error>>()?;
        for w in w {
            w.wait()?;
        }
        world.shutdown()
    })
    .unwrap_or_else(|e| panic!("{e}"));
    let text = handle.render();
    let world = [("op", "all_reduce"), ("group", "world")];
    assert_eq!(
        value(&text, "collectix_calls_total", &world),
        Some(2.0),
        "one call per rank: {text}"
    );
}

#[test]
fn errors_are_counted_by_kind_and_a_cut_link_as_peers_lost() {
    let (rec, handle) = recorder();
    metrics::with_local_recorder(&rec, || -> Result<(), Error> {
        let world = World::local_with(
            2,
            GroupOptions::default().with_timeout(Duration::from_secs(20)),
        )?;
        let c = world.communicators();
        // Refused at once on both ranks: a root outside the group.
        for c in c {
            assert!(c.broadcast(Tensor::from_vec(vec![1u8]), 7).wait().is_err());
        }
        // The ranks disagree on the dtype: a mismatch on both.
        let a = c[0].all_reduce(Tensor::from_vec(vec![1.0f32; 4]), ReduceOp::Sum);
        let b = c[1].all_reduce(Tensor::from_vec(vec![1i32; 4]), ReduceOp::Sum);
        assert!(a.wait().is_err() && b.wait().is_err());
        world.cut(0, 1)?;
        let _ = world.shutdown();
        Ok(())
    })
    .unwrap_or_else(|e| panic!("{e}"));
    let text = handle.render();
    let errors = |kind: &str| {
        text.lines()
            .filter(|l| {
                l.starts_with("collectix_call_errors_total{")
                    && l.contains(&format!("kind=\"{kind}\""))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
    };
    assert_eq!(errors("invalid_argument"), 2.0, "{text}");
    assert!(
        errors("mismatch") + errors("size_mismatch") >= 2.0,
        "{text}"
    );
    // Each side of the cut lost the other.
    assert!(
        value(&text, "collectix_peers_lost_total", &[]).is_some_and(|n| n >= 2.0),
        "{text}"
    );
}

/// The binary's global recorder, installed by the first test that needs it: for what is
/// reported on threads other than the test's (the store's gate; the parts of a call that is
/// made of others, if they were counted on their own, would be too).
fn global() -> &'static PrometheusHandle {
    static GLOBAL: std::sync::OnceLock<PrometheusHandle> = std::sync::OnceLock::new();
    GLOBAL.get_or_init(|| {
        PrometheusBuilder::new()
            .install_recorder()
            .unwrap_or_else(|e| panic!("{e}"))
    })
}

#[test]
fn object_collectives_group_making_and_recovery_count_once_each_as_themselves() {
    // Under the global recorder: a part issued inside (the sizes' broadcast or all_gather,
    // split's gather) is taken on a rank's thread; were it measured on its own, it would be
    // counted there as a call (`broadcast`, `all_gather_into_tensor`). Only this test makes
    // object calls, splits or shrinks, and the other tests' calls go to their local
    // recorders.
    let handle = global();
    let run = || -> Result<(), Error> {
        let world = World::local(2)?;
        let c = world.communicators();
        let w: Vec<_> = c
            .iter()
            .map(|c| c.all_gather_object(&format!("rank {}", c.rank())))
            .collect();
        for w in w {
            assert_eq!(w.wait()?, ["rank 0", "rank 1"]);
        }
        let w: Vec<_> = c
            .iter()
            .map(|c| c.broadcast_object((c.rank() == 0).then(|| vec![1u32, 2, 3]), 0))
            .collect();
        for w in w {
            assert_eq!(w.wait()?, [1, 2, 3]);
        }
        let w: Vec<_> = c
            .iter()
            .map(|c| c.split(Some(0), c.rank() as i64))
            .collect();
        for w in w {
            assert!(w.wait()?.is_some());
        }
        let w: Vec<_> = c.iter().map(|c| c.shrink()).collect();
        for w in w {
            w.wait()?;
        }
        let _ = world.shutdown();
        Ok(())
    };
    run().unwrap_or_else(|e| panic!("{e}"));
    let text = handle.render();
    let count = |op: &str| value(&text, "collectix_calls_total", &[("op", op)]);
    let bytes = |op: &str| value(&text, "collectix_call_bytes_total", &[("op", op)]);
    assert_eq!(count("all_gather_object"), Some(2.0), "{text}");
    // bincode: a length byte and 6 bytes, from each rank.
    assert_eq!(bytes("all_gather_object"), Some(14.0), "{text}");
    assert_eq!(count("broadcast_object_list"), Some(2.0), "{text}");
    // A length byte and three one-byte integers, from the source.
    assert_eq!(bytes("broadcast_object_list"), Some(4.0), "{text}");
    assert_eq!(count("split"), Some(2.0), "{text}");
    assert_eq!(count("shrink"), Some(2.0), "{text}");
    for part in ["broadcast", "all_gather_into_tensor"] {
        assert_eq!(count(part), None, "{part} counted on its own:\n{text}");
    }
}

#[test]
fn connections_refused_by_the_stores_gate_are_counted() {
    let handle = global();
    let secret = Secret::new("the metrics test's secret").unwrap_or_else(|e| panic!("{e}"));
    let server = TcpStoreServer::bind_secured("127.0.0.1:0", Security::with_secret(secret))
        .unwrap_or_else(|e| panic!("{e}"));
    let addr = server.local_addr();
    for _ in 0..3 {
        let mut s = std::net::TcpStream::connect(addr).unwrap_or_else(|e| panic!("{e}"));
        let _ = s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    }
    let start = Instant::now();
    let refused = || {
        value(
            &handle.render(),
            "collectix_connections_refused_total",
            &[("listener", "store"), ("reason", "handshake")],
        )
    };
    while refused() != Some(3.0) && start.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(refused(), Some(3.0), "{}", handle.render());
}

/// `JobStatus::explain` (what `collectix status --explain` prints) sets the gauge
/// `collectix_verdict{group, rank}` to each verdict's code: here the answers of a job of three
/// where rank 0 waits in group a's call #0 (a = {0, 1, 2}) for rank 1, which waits in group
/// b's call #0 (b = {0, 1}) for rank 0 (a wait cycle: 5 for each in its own group, 1 "slow"
/// in the other's), and rank 2 did not answer (dead: 4).
#[test]
fn each_verdict_is_a_gauge_of_its_code() {
    let (rec, handle) = recorder();
    let rank = |r: usize, calls: Option<Vec<&str>>| collectix::RankStatus {
        rank: r,
        calls: calls.map(|c| c.into_iter().map(str::to_string).collect()),
        // Each group's members, as a rank's view of who came last names them.
        lateness: vec![
            "a 0 0:0:0:0:0 1:0:0:0:0 2:0:0:0:0".into(),
            "b 0 0:0:0:0:0 1:0:0:0:0".into(),
        ],
        now_us: Some(1_600_000),
    };
    let status = collectix::JobStatus {
        ranks: vec![
            rank(
                0,
                Some(vec!["a 0 pending 100.0 all_reduce group a #0 all_reduce"]),
            ),
            rank(
                1,
                Some(vec!["b 0 pending 100.0 all_reduce group b #0 all_reduce"]),
            ),
            rank(2, None),
        ],
        findings: Vec::new(),
    };
    let verdicts = metrics::with_local_recorder(&rec, || status.explain(Duration::from_secs(1)));
    for v in &verdicts {
        println!("{v}");
    }
    let text = handle.render();
    let gauge = |g: &str, r: &str| value(&text, "collectix_verdict", &[("group", g), ("rank", r)]);
    assert_eq!(gauge("a", "0"), Some(5.0), "{text}");
    assert_eq!(gauge("b", "1"), Some(5.0), "{text}");
    assert_eq!(gauge("b", "0"), Some(1.0), "{text}");
    assert_eq!(gauge("a", "1"), Some(1.0), "{text}");
    assert_eq!(gauge("a", "2"), Some(4.0), "{text}");
}
