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
