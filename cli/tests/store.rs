//! `collectix store`: a standalone TCP store server that clients in other processes use.

use collectix::{Store, TcpStore};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

#[test]
fn the_standalone_store_serves_clients() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_collectix"))
        .args(["store", "--host", "127.0.0.1", "--port", "0"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start collectix store: {e}"));
    let mut line = String::new();
    if let Some(out) = child.stdout.take() {
        let _ = BufReader::new(out).read_line(&mut line);
    }
    // "collectix store: serving on 127.0.0.1:PORT"
    let addr = line.trim().rsplit(' ').next().unwrap_or("").to_string();
    let result = (|| -> collectix::Result<Vec<u8>> {
        let a = TcpStore::connect(addr.clone(), Duration::from_secs(10))?;
        let b = TcpStore::connect(addr.clone(), Duration::from_secs(10))?;
        a.set("master", b"10.0.0.1:29400".to_vec())?;
        assert_eq!(b.add("joined", 1)?, 1);
        b.get("master", Duration::from_secs(5))
    })();
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(result, Ok(b"10.0.0.1:29400".to_vec()), "store at {addr:?}");
}

#[test]
fn the_standalone_store_logs_the_clients_it_drops() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_collectix"))
        .args(["store", "--host", "127.0.0.1", "--port", "0"])
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start collectix store: {e}"));
    let mut line = String::new();
    if let Some(out) = child.stdout.take() {
        let _ = BufReader::new(out).read_line(&mut line);
    }
    let addr = line.trim().rsplit(' ').next().unwrap_or("").to_string();
    // Not the protocol: the server drops the client, and says so (warn is on by default).
    if let Ok(mut s) = std::net::TcpStream::connect(&addr) {
        use std::io::{Read, Write};
        let _ = s.write_all(b"GET / HTTP/1.1\r\n\r\n");
        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
        let mut sink = Vec::new();
        let _ = s.read_to_end(&mut sink);
    }
    std::thread::sleep(Duration::from_millis(200));
    let _ = child.kill();
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        use std::io::Read;
        let _ = e.read_to_string(&mut err);
    }
    let _ = child.wait();
    assert!(err.contains("client dropped"), "stderr: {err:?}");
}
