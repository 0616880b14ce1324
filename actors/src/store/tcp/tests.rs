use super::*;
use std::io::Write;

fn server() -> TcpStoreServer {
    TcpStoreServer::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"))
}

fn client(s: &TcpStoreServer) -> TcpStore {
    TcpStore::connect(s.connect_addr().to_string(), Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn the_tcp_store_has_torch_semantics() {
    let s = server();
    super::super::tests::semantics(&client(&s));
}

#[test]
fn many_clients_adding_concurrently_end_exact() {
    let s = server();
    let (clients, adds) = (32, 10_000);
    std::thread::scope(|sc| {
        for _ in 0..clients {
            sc.spawn(|| {
                let c = client(&s);
                for _ in 0..adds {
                    assert!(c.add("counter", 1).is_ok());
                }
            });
        }
    });
    assert_eq!(client(&s).add("counter", 0), Ok(clients * adds));
}

#[test]
fn a_client_sending_garbage_is_dropped_and_the_others_carry_on() {
    let s = server();
    let good = client(&s);
    good.set("k", b"v".to_vec()).unwrap_or(());
    // Random bytes, a hello with the wrong magic, a 4 GiB length, half a frame then a close.
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let garbage: Vec<u8> = (0..4096)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed as u8
        })
        .collect();
    let attacks: Vec<Vec<u8>> = vec![
        garbage,
        {
            let mut v = Vec::new();
            let hello = Request::Hello {
                magic: *b"not-ours",
                version: VERSION,
            };
            proto::write(&mut v, &hello).unwrap_or(());
            v
        },
        vec![0xff, 0xff, 0xff, 0xff, 0, 0, 0],
        vec![200, 0, 0, 0, 1, 2, 3],
    ];
    for bytes in attacks {
        let mut raw = TcpStream::connect(s.connect_addr()).unwrap_or_else(|e| panic!("{e}"));
        let _ = raw.write_all(&bytes);
        let _ = raw.shutdown(Shutdown::Write);
        // The server closes it (read sees the end or a reset), never answers garbage.
        let _ = raw.set_read_timeout(Some(Duration::from_secs(10)));
        let mut buf = [0u8; 64];
        let n = std::io::Read::read(&mut raw, &mut buf).unwrap_or(0);
        assert_eq!(n, 0, "answered garbage with {:?}", &buf[..n]);
        // And the good client is served as before.
        assert_eq!(good.get("k", Duration::from_secs(1)), Ok(b"v".to_vec()));
    }
    // A client of another version is told why.
    let mut raw = TcpStream::connect(s.connect_addr()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(Security::default().client(&mut raw, b"store"), Ok(()));
    let hello = Request::Hello {
        magic: MAGIC,
        version: VERSION + 1,
    };
    proto::write(&mut raw, &hello).unwrap_or(());
    let got = proto::read::<Response>(&mut raw).ok().flatten();
    assert!(
        matches!(&got, Some(Response::Failed(Failure::Invalid(m))) if m.contains("version")),
        "{got:?}"
    );
    assert_eq!(good.num_keys(), Ok(1));
}

fn secret(text: &str) -> Security {
    match crate::security::Secret::new(text) {
        Ok(k) => Security::with_secret(k),
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn only_clients_with_the_secret_are_served_and_the_others_carry_on() {
    let s = TcpStoreServer::bind_secured("127.0.0.1:0", secret("the job's secret"))
        .unwrap_or_else(|e| panic!("{e}"));
    let addr = s.connect_addr().to_string();
    let good = TcpStore::connect_secured(&addr, Duration::from_secs(5), secret("the job's secret"))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(good.set("k", b"v".to_vec()).is_ok());
    for who in [secret("another secret!!"), Security::default()] {
        let got = TcpStore::connect_secured(&addr, Duration::from_secs(5), who);
        assert!(
            matches!(&got, Err(Error::Unauthenticated { peer, .. }) if peer.contains(&addr)),
            "{:?}",
            got.err()
        );
    }
    // A client with a secret does not talk to a server without one either.
    let open = server();
    let got = TcpStore::connect_secured(
        open.connect_addr().to_string(),
        Duration::from_secs(5),
        secret("the job's secret"),
    );
    assert!(
        matches!(&got, Err(Error::Unauthenticated { .. })),
        "{:?}",
        got.err()
    );
    assert_eq!(good.get("k", Duration::from_secs(1)), Ok(b"v".to_vec()));
    assert_eq!(good.num_keys(), Ok(1));
}

#[test]
fn without_a_secret_the_store_listens_on_loopback_only() {
    for addr in ["0.0.0.0:0", "[::]:0"] {
        let got = TcpStoreServer::bind(addr);
        assert!(
            matches!(&got, Err(Error::InvalidArgument(m)) if m.contains("COLLECTIX_SECRET")),
            "{addr}: {:?}",
            got.err().map(|e| e.to_string())
        );
    }
    assert!(TcpStoreServer::bind_secured("0.0.0.0:0", secret("the job's secret")).is_ok());
    assert!(TcpStoreServer::bind_secured("0.0.0.0:0", Security::insecure()).is_ok());
}

#[test]
fn a_client_reconnects_after_its_connection_broke() {
    let s = server();
    let c = client(&s);
    c.set("a", b"1".to_vec()).unwrap_or(());
    // Break the connection under the client.
    if let Some(conn) = c.conn.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
        let _ = conn.shutdown(Shutdown::Both);
    }
    assert_eq!(c.get("a", Duration::from_secs(1)), Ok(b"1".to_vec()));
    // An add whose connection breaks after it was sent is not repeated: its effect is
    // unknown, and the error says so. (Broken before sending, it goes on a new one.)
    if let Some(conn) = c.conn.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
        let _ = conn.shutdown(Shutdown::Both);
    }
    let got = c.add("n", 1);
    assert!(
        got == Ok(1) || matches!(&got, Err(Error::Store(m)) if m.contains("unknown")),
        "{got:?}"
    );
}

#[test]
fn a_client_waits_for_a_server_that_starts_late_and_times_out_on_none() {
    // Nothing listens: the connect timeout names the address.
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
        l.local_addr().map(|a| a.port()).unwrap_or(1)
    };
    let got = TcpStore::connect(format!("127.0.0.1:{port}"), Duration::from_millis(200));
    assert!(
        matches!(&got, Err(Error::StoreTimeout { what, .. }) if what.contains(&port.to_string())),
        "{:?}",
        got.err()
    );
    // A server that comes up while the client is trying.
    let t = std::thread::spawn(move || {
        TcpStore::connect(format!("127.0.0.1:{port}"), Duration::from_secs(20))
    });
    std::thread::sleep(Duration::from_millis(200));
    let s = TcpStoreServer::bind(("127.0.0.1", port)).unwrap_or_else(|e| panic!("{e}"));
    let c = t.join().ok().and_then(Result::ok);
    assert!(c.is_some_and(|c| c.set("x", vec![1]).is_ok()));
    s.shutdown();
}

#[test]
fn a_dual_stack_server_takes_ipv4_and_ipv6_clients() {
    let Ok(s) = TcpStoreServer::bind_secured("[::]:0", Security::insecure()) else {
        eprintln!("SKIPPED: no IPv6 on this machine");
        return;
    };
    let port = s.local_addr().port();
    let v6 = TcpStore::connect(format!("[::1]:{port}"), Duration::from_secs(5));
    let v4 = TcpStore::connect(format!("127.0.0.1:{port}"), Duration::from_secs(5));
    match (v6, v4) {
        (Ok(a), Ok(b)) => {
            a.set("k", b"6".to_vec()).unwrap_or(());
            assert_eq!(b.get("k", Duration::from_secs(1)), Ok(b"6".to_vec()));
        }
        (a, b) => eprintln!(
            "SKIPPED: dual stack unavailable: {:?} {:?}",
            a.err(),
            b.err()
        ),
    }
}

#[test]
fn a_connection_whose_thread_cannot_start_is_closed_at_once() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
    let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
    let mut client = TcpStream::connect(addr).unwrap_or_else(|e| panic!("{e}"));
    let (server_side, _) = listener.accept().unwrap_or_else(|e| panic!("{e}"));
    let conns = Arc::new(Mutex::new(HashMap::new()));
    start_conn(
        server_side,
        7,
        &conns,
        |_| panic!("served without a thread"),
        |_job| Err(std::io::Error::other("no thread for you")),
    );
    assert!(
        lock(&conns).is_empty(),
        "the connection is still registered"
    );
    // The client hears the close at once (it waited out its timeout before).
    let _ = client.set_read_timeout(Some(Duration::from_secs(2)));
    let mut b = [0u8; 1];
    let t0 = Instant::now();
    let got = std::io::Read::read(&mut client, &mut b);
    assert!(
        matches!(got, Ok(0)) || got.is_err() && t0.elapsed() < Duration::from_secs(1),
        "read gave {got:?} after {:?}",
        t0.elapsed()
    );
}

#[test]
fn a_client_that_trickles_its_handshake_is_dropped_within_the_hello_timeout() {
    // One byte every 500 ms of a well-formed start: each read is quick, the whole is not.
    // (A timeout per read kept such a client for as long as it kept sending: 20 s here.)
    // The server's deadline is 2 s here (10 s in use, `gate::HELLO_TIMEOUT`); the client's
    // 40 bytes would take 8 s.
    let hello = Duration::from_secs(2);
    let limits = Limits {
        hello,
        ..Limits::default()
    };
    let s = TcpStoreServer::bind_with("127.0.0.1:0", Security::loopback_only(), limits, false)
        .unwrap_or_else(|e| panic!("{e}"));
    let mut bytes = b"cx-auth1".to_vec();
    bytes.resize(40, 0);
    let took = crate::sync::trickle(s.connect_addr(), &bytes, Duration::from_millis(200));
    assert!(
        took.is_some_and(
            |t| t >= hello - Duration::from_millis(500) && t < hello + Duration::from_secs(2)
        ),
        "closed after {took:?}"
    );
}

#[test]
fn a_server_owes_answers_to_changes_only() {
    // What the rank serving a job's store waits for before it closes (`Process::shutdown`):
    // a change others can see may not have its answer written yet. A wait the server holds
    // (a status responder's, up to a second) is not waited for.
    let s = server();
    assert!(
        s.wait_answered(Duration::ZERO),
        "nothing read, nothing owed"
    );
    let waiter = client(&s);
    let held = std::thread::spawn(move || waiter.wait(&["k"], Duration::from_secs(20)));
    std::thread::sleep(Duration::from_millis(50));
    assert!(s.wait_answered(Duration::ZERO), "a held wait is not owed");
    let c = client(&s);
    assert_eq!(c.set("k", Vec::new()), Ok(()));
    assert!(s.wait_answered(Duration::from_secs(10)));
    assert_eq!(held.join().unwrap_or_else(|_| panic!("panicked")), Ok(()));
    let changes = |r: &Request| r.changes();
    assert!(changes(&Request::Set {
        key: "k".into(),
        value: Vec::new()
    }));
    assert!(changes(&Request::Add {
        key: "k".into(),
        delta: 1
    }));
    assert!(changes(&Request::Delete { key: "k".into() }));
    assert!(!changes(&Request::Check { keys: Vec::new() }));
    assert!(!changes(&Request::NumKeys));
}
