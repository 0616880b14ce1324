//! torch's protocol between collectix's own client and server: the semantics every store
//! has, the keys shared with collectix's clients, and a wrong protocol told apart at once.
//! (Against torch itself: `cli/tests/suite/torch.rs`.)

use super::*;
use crate::security::Security;
use crate::store::tests::semantics_refusing;
use crate::store::{TcpStore, TcpStoreServer};
use std::net::TcpListener;
use std::time::Instant;

fn open_server() -> TcpStoreServer {
    TcpStoreServer::open_to_torch("127.0.0.1:0", Security::loopback_only())
        .unwrap_or_else(|e| panic!("{e}"))
}

fn torch_client(server: &TcpStoreServer) -> TorchStore {
    TorchStore::connect(server.connect_addr().to_string(), Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn a_torch_client_of_a_store_open_to_torch_has_torchs_semantics() {
    let server = open_server();
    let s = torch_client(&server);
    semantics_refusing(
        &s,
        |e| matches!(e, Error::Store(m) if m.contains("closed the connection")),
    );
    // The connection the refusal closed was opened again.
    assert_eq!(s.add("n", 1), Ok(-2));
}

#[test]
fn torchs_clients_and_collectixs_share_the_keys() {
    let server = open_server();
    let torch = torch_client(&server);
    let ours = TcpStore::connect(server.connect_addr().to_string(), Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("{e}"));
    torch
        .set("from/torch", b"t".to_vec())
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        ours.get("from/torch", Duration::from_secs(1)),
        Ok(b"t".to_vec())
    );
    assert_eq!(ours.add("count", 2), Ok(2));
    assert_eq!(torch.add("count", 3), Ok(5));
    assert_eq!(ours.get("count", Duration::ZERO), Ok(b"5".to_vec()));
    // A torch client's wait ends when a collectix client sets the key.
    std::thread::scope(|sc| {
        let waiter = sc.spawn(|| torch.get("late", Duration::from_secs(10)));
        std::thread::sleep(Duration::from_millis(100));
        ours.set("late", b"here".to_vec()).unwrap_or(());
        assert_eq!(waiter.join().ok(), Some(Ok(b"here".to_vec())));
    });
    assert_eq!(torch.num_keys(), ours.num_keys());
}

#[test]
fn a_torch_client_of_a_collectix_only_store_is_told_at_once() {
    let server = TcpStoreServer::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
    let t0 = Instant::now();
    let e = TorchStore::connect(server.connect_addr().to_string(), Duration::from_secs(20))
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        e.contains("does not speak torch's TCPStore protocol")
            && e.contains("COLLECTIX_STORE_PROTOCOL=collectix"),
        "{e}"
    );
    // A hang guard, not a measure: told at once, not at the gate's 10 s deadline or the
    // client's 20 s timeout.
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
}

/// A server that speaks torch's protocol only, as torch's libuv server does with a client
/// of another protocol: silent until its hello; answers torch's.
fn torch_only_server() -> (std::net::SocketAddr, std::thread::JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
    let addr = l.local_addr().unwrap_or_else(|e| panic!("{e}"));
    let t = std::thread::spawn(move || {
        // The collectix client's connection (silent), then its probe's (torch's hello).
        let mut held = Vec::new();
        for _ in 0..2 {
            let Ok((mut s, _)) = l.accept() else { return };
            let _ = s.set_read_timeout(Some(Duration::from_millis(1500)));
            let mut first = [0u8; 10];
            if s.read_exact(&mut first).is_ok() && first[..5] == wire::VALIDATE {
                let _ = s.write_all(&first[6..10]);
            }
            held.push(s);
        }
    });
    (addr, t)
}

#[test]
fn a_collectix_client_of_a_store_that_speaks_torchs_protocol_is_told_within_seconds() {
    let (addr, t) = torch_only_server();
    let t0 = Instant::now();
    let e = TcpStore::connect(addr.to_string(), Duration::from_secs(30))
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    let took = t0.elapsed();
    assert!(
        e.contains("speaks torch's TCPStore protocol")
            && e.contains("COLLECTIX_STORE_PROTOCOL=torch"),
        "{e}"
    );
    // A hang guard, not a measure: told after the 1 s probe, not at the 30 s the handshake
    // waited before.
    assert!(took < Duration::from_secs(10), "{took:?}");
    let _ = t.join();
}

#[test]
fn a_cancel_that_comes_in_the_same_read_as_its_wait_is_answered() {
    let server = open_server();
    let mut s = TcpStream::connect(server.connect_addr()).unwrap_or_else(|e| panic!("{e}"));
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let mut first = wire::VALIDATE.to_vec();
    first.extend_from_slice(&Out::query(kind::PING).u32(7).0);
    s.write_all(&first).unwrap_or_else(|e| panic!("{e}"));
    let mut echo = [0u8; 4];
    s.read_exact(&mut echo).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(u32::from_le_bytes(echo), 7);
    // A WAIT for a key nobody sets and its CANCEL_WAIT, in one write.
    let mut both = Out::query(kind::WAIT).keys(["/never"].into_iter()).0;
    both.push(kind::CANCEL_WAIT);
    s.write_all(&both).unwrap_or_else(|e| panic!("{e}"));
    let mut answer = [0u8; 1];
    let got = s.read_exact(&mut answer).map(|()| answer[0]);
    assert_eq!(
        got.ok(),
        Some(wire::WAIT_CANCELED),
        "no WAIT_CANCELED in 5 s"
    );
}
