//! Extreme arguments and values get a clear answer, never a panic or a silent wrap (issue 31):
//! `Duration::MAX` as a timeout everywhere one is taken, a store value over the frame limit,
//! a store counter that would overflow, a receive from any source with nobody to send.

use collectix::runtime::collective::TensorSpec;
use collectix::{
    init, CallOptions, DType, Error, FileStore, InitArgs, MemoryStore, ReduceOp, Store, TcpStore,
    TcpStoreServer, Tensor, Transport, World,
};
use std::net::TcpListener;
use std::time::{Duration, Instant};

fn ok<T>(r: collectix::Result<T>, what: &str) -> T {
    r.unwrap_or_else(|e| panic!("{what}: {e}"))
}

#[test]
fn duration_max_as_a_timeout_waits_without_end_instead_of_panicking() {
    // Stores: the key is there, so each call returns at once.
    let m = MemoryStore::new();
    ok(m.set("k", b"v".to_vec()), "memory set");
    assert_eq!(m.get("k", Duration::MAX), Ok(b"v".to_vec()));
    assert_eq!(m.wait(&["k"], Duration::MAX), Ok(()));
    let dir = std::env::temp_dir().join(format!("cx-extreme-{}", std::process::id()));
    let f = ok(FileStore::new(&dir), "file store");
    ok(f.set("k", b"v".to_vec()), "file set");
    assert_eq!(f.get("k", Duration::MAX), Ok(b"v".to_vec()));
    assert_eq!(f.wait(&["k"], Duration::MAX), Ok(()));
    let _ = std::fs::remove_file(&dir);
    let server = ok(TcpStoreServer::bind("127.0.0.1:0"), "store server");
    let t = ok(
        TcpStore::connect(server.connect_addr().to_string(), Duration::MAX),
        "connect",
    );
    ok(t.set("k", b"v".to_vec()), "tcp set");
    assert_eq!(t.get("k", Duration::MAX), Ok(b"v".to_vec()));
    // A call's timeout.
    let world = ok(World::local(2), "world");
    let forever = CallOptions {
        algorithm: None,
        timeout: Some(Duration::MAX),
    };
    let works: Vec<_> = world
        .communicators()
        .iter()
        .map(|c| c.all_reduce_with(Tensor::from_vec(vec![1.0f32, 2.0]), ReduceOp::Sum, &forever))
        .collect();
    for w in works {
        let t = ok(w.wait(), "all_reduce");
        assert_eq!(t.to_vec::<f32>(), Ok(vec![2.0, 4.0]));
    }
    // Joining a job.
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_or(29_998, |a| a.port());
    let args = InitArgs {
        init_method: Some(format!("tcp://127.0.0.1:{port}")),
        rank: Some(0),
        world_size: Some(1),
        transport: Some(Transport::Tcp),
        ..InitArgs::default()
    };
    let p = ok(
        init(&args, collectix::GroupOptions::default(), Duration::MAX),
        "init",
    );
    let r = ok(
        p.communicator()
            .all_reduce(Tensor::from_vec(vec![3i32]), ReduceOp::Sum)
            .wait(),
        "job all_reduce",
    );
    assert_eq!(r.to_vec::<i32>(), Ok(vec![3]));
}

#[test]
fn a_store_value_over_the_frame_limit_is_refused_before_it_is_sent() {
    let server = ok(TcpStoreServer::bind("127.0.0.1:0"), "store server");
    let t = ok(
        TcpStore::connect(server.connect_addr().to_string(), Duration::from_secs(10)),
        "connect",
    );
    let t0 = Instant::now();
    let r = t.set("big", vec![7u8; (64 << 20) + 1]);
    let Err(e) = r else {
        panic!("a value of 64 MiB + 1 was taken");
    };
    let text = e.to_string();
    assert!(text.len() < 400, "an error text of {} bytes", text.len());
    assert!(text.contains("67108864"), "the limit is not named: {text}");
    assert!(t0.elapsed() < Duration::from_secs(5));
    // The connection is still good.
    ok(t.set("small", b"ok".to_vec()), "set after");
    assert_eq!(t.get("small", Duration::from_secs(5)), Ok(b"ok".to_vec()));
}

#[test]
fn a_store_counter_that_would_overflow_is_an_error_and_stays() {
    let server = ok(TcpStoreServer::bind("127.0.0.1:0"), "store server");
    let t = ok(
        TcpStore::connect(server.connect_addr().to_string(), Duration::from_secs(10)),
        "connect",
    );
    let m = MemoryStore::new();
    for s in [&t as &dyn Store, &m as &dyn Store] {
        assert_eq!(s.add("n", i64::MAX), Ok(i64::MAX));
        assert!(
            matches!(s.add("n", 1), Err(Error::InvalidArgument(_))),
            "i64::MAX + 1 was taken"
        );
        assert_eq!(s.add("n", 0), Ok(i64::MAX));
        assert_eq!(s.add("m", i64::MIN), Ok(i64::MIN));
        assert!(s.add("m", -1).is_err(), "i64::MIN - 1 was taken");
    }
}

#[test]
fn a_receive_from_any_source_on_a_world_of_one_is_refused_at_once() {
    let world = ok(World::local(1), "world");
    let c = &world.communicators()[0];
    let t0 = Instant::now();
    let r = c
        .recv(TensorSpec::new(&[1], DType::F32), None, 0)
        .wait_timeout(Duration::from_secs(5));
    assert!(
        matches!(r, Some(Err(Error::InvalidArgument(_)))),
        "got {r:?} after {:?}",
        t0.elapsed()
    );
    // The group goes on.
    let t = ok(
        c.all_reduce(Tensor::from_vec(vec![1u8]), ReduceOp::Sum)
            .wait(),
        "all_reduce after",
    );
    assert_eq!(t.to_vec::<u8>(), Ok(vec![1]));
}
