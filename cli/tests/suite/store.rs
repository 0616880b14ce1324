//! `collectix store`: a standalone TCP store server that clients in other processes use.

use collectix::{Store, TcpStore};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Starts `cmd` (a `collectix store` on port 0, perhaps behind other programs) with its
/// stdout piped; the child and the address it serves on, from its first line
/// ("collectix store: serving on 127.0.0.1:PORT").
fn serving(cmd: &mut Command) -> (Child, String) {
    let mut child = cmd
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start collectix store: {e}"));
    let mut line = String::new();
    if let Some(out) = child.stdout.take() {
        let _ = BufReader::new(out).read_line(&mut line);
    }
    let addr = line.trim().rsplit(' ').next().unwrap_or("").to_string();
    (child, addr)
}

/// `collectix store` on a free port of 127.0.0.1.
fn store_command() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_collectix"));
    c.args(["store", "--host", "127.0.0.1", "--port", "0"]);
    c
}

#[test]
fn the_standalone_store_serves_clients() {
    let (mut child, addr) = serving(&mut store_command());
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
    let (mut child, addr) = serving(
        store_command()
            .env_remove("RUST_LOG")
            .stderr(Stdio::piped()),
    );
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

/// Whether this process can run a program as `nobody` under a thread limit (root, with
/// util-linux's `prlimit` and `setpriv`): `RLIMIT_NPROC` does not bind root itself.
fn can_limit_threads() -> bool {
    let root = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false);
    let have = |p: &str| {
        Command::new(p)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    root && have("prlimit") && have("setpriv")
}

#[test]
fn a_store_limited_to_200_threads_serves_a_client_past_300_idle_connections() {
    if !can_limit_threads() {
        eprintln!("SKIPPED: needs root, prlimit and setpriv (to run the store as nobody under a thread limit)");
        return;
    }
    // The store as `nobody`, at most 200 threads (RLIMIT_NPROC counts a user's threads).
    let (mut child, addr) = serving(
        Command::new("prlimit")
            .args(["--nproc=200:200", "--nofile=4096:4096", "--"])
            .args([
                "setpriv",
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "--",
            ])
            .arg(env!("CARGO_BIN_EXE_collectix"))
            .args(["store", "--host", "127.0.0.1", "--port", "0"])
            .env_remove("RUST_LOG")
            .stderr(Stdio::null()),
    );
    // 300 connections that say nothing (a thread each once cost more than the limit).
    let idle: Vec<_> = (0..300)
        .filter_map(|_| std::net::TcpStream::connect(&addr).ok())
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let t0 = std::time::Instant::now();
    let served = (|| -> collectix::Result<Vec<u8>> {
        let c = TcpStore::connect(addr.clone(), Duration::from_secs(5))?;
        c.set("k", b"v".to_vec())?;
        c.get("k", Duration::from_secs(5))
    })();
    let took = t0.elapsed();
    drop(idle);
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(
        served,
        Ok(b"v".to_vec()),
        "store at {addr:?}, after {took:?}"
    );
}
