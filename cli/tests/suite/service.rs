//! The `service` example: an async tokio HTTP service embedding a communicator,
//! run as three processes under `collectix launch`, driven with real HTTP requests, and
//! stopped with SIGTERM (it must stop gracefully: every rank leaves in order and exits 0).

use crate::common;
use common::example;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::Duration;

/// One HTTP/1.1 request on a connection of its own: (status code, body).
fn http(port: u16, method: &str, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap_or_else(|e| panic!("{e}"));
    let _ = s.set_read_timeout(Some(Duration::from_secs(60)));
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    s.write_all(req.as_bytes())
        .unwrap_or_else(|e| panic!("{e}"));
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    let code = answer
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {answer:?}"));
    let body = answer
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .trim()
        .to_string();
    (code, body)
}

#[test]
fn the_service_answers_http_with_sums_over_the_ranks_and_stops_gracefully_on_sigterm() {
    let exe = example("service");
    let (w, base) = (3u16, common::free_ports(3));
    let mut launcher = Command::new(env!("CARGO_BIN_EXE_collectix"))
        .args(["launch", "--nproc-per-node", "3", "--master-port"])
        .arg(common::free_port().to_string())
        .arg("--")
        .arg(&exe)
        .env("SERVICE_PORT", base.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run collectix launch: {e}"));
    let mut out = BufReader::new(
        launcher
            .stdout
            .take()
            .unwrap_or_else(|| panic!("no stdout")),
    );
    let mut seen = String::new();
    let mut serving = 0;
    while serving < w {
        let mut line = String::new();
        if out.read_line(&mut line).unwrap_or(0) == 0 {
            let mut err = String::new();
            if let Some(mut e) = launcher.stderr.take() {
                let _ = e.read_to_string(&mut err);
            }
            panic!("the job ended before serving:\n{seen}\n{err}");
        }
        serving += u16::from(line.contains(": serving on 127.0.0.1:"));
        seen += &line;
    }
    let port = |r: u16| base + r;
    assert_eq!(http(port(1), "GET", "/"), (200, "rank 1 of 3".into()));
    // Each rank's counter: 10, 20, 30.
    for r in 0..w {
        let n = 10 * (i64::from(r) + 1);
        assert_eq!(
            http(port(r), "POST", &format!("/add?n={n}")),
            (200, n.to_string())
        );
    }
    assert_eq!(http(port(0), "GET", "/sum"), (200, "60".into()));
    // Eight requests at once: they take turns, and every one gets the sum.
    let sums: Vec<(u16, String)> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..8)
            .map(|_| sc.spawn(|| http(port(0), "GET", "/sum")))
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| panic!("a client panicked")))
            .collect()
    });
    assert!(
        sums.iter().all(|s| *s == (200, "60".to_string())),
        "{sums:?}"
    );
    assert_eq!(http(port(2), "POST", "/add?n=-5"), (200, "25".into()));
    assert_eq!(http(port(0), "GET", "/sum"), (200, "55".into()));
    // Rank 0 made 10 sums: 10 broadcasts and 10 all_reduces, each of 8 bytes, all counted.
    let (status, text) = http(port(0), "GET", "/metrics");
    assert_eq!(status, 200, "{text}");
    let value = |name: &str, op: &str| -> f64 {
        text.lines()
            .find(|l| {
                l.starts_with(&format!("{name}{{"))
                    && l.contains(&format!("op=\"{op}\""))
                    && l.contains("group=\"world\"")
            })
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name} for {op} in:\n{text}"))
    };
    assert_eq!(value("collectix_calls_total", "all_reduce"), 10.0);
    assert_eq!(value("collectix_calls_total", "broadcast"), 10.0);
    assert_eq!(value("collectix_call_bytes_total", "all_reduce"), 80.0);
    assert_eq!(value("collectix_call_seconds_count", "all_reduce"), 10.0);
    assert!(!text.contains("collectix_call_errors_total"), "{text}");
    assert_eq!(http(port(1), "GET", "/sum").0, 421);
    assert_eq!(http(port(1), "POST", "/add?n=x").0, 400);
    // SIGTERM to the launcher, which forwards it to every rank.
    let pid = nix::unistd::Pid::from_raw(launcher.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM)
        .unwrap_or_else(|e| panic!("{e}"));
    let mut rest = String::new();
    let _ = out.read_to_string(&mut rest);
    let mut err = String::new();
    if let Some(mut e) = launcher.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    let _ = launcher.wait();
    for r in 0..w {
        assert!(
            rest.contains(&format!("[rank {r}] rank {r}: stopped cleanly")),
            "rank {r} did not stop cleanly:\n{seen}{rest}\n{err}"
        );
        assert!(
            err.contains(&format!("rank {r} exited with status 0")),
            "rank {r}:\n{err}"
        );
    }
}
