//! `collectix doctor` on 16 processes of this host: with nothing wrong, every pair's link
//! carries data both ways (over shared memory, and over TCP) and there are no findings; a
//! setting that differs is named by rank and field; a link cut between two ranks (nftables,
//! as root) is named by its pair, and nothing else; a frozen rank is named, with its links.
//! The checks use 64 KiB messages and 250 ms rounds: debug builds of 16 processes on two
//! cores (the default, 1 MiB in 80 ms rounds, is a release build's; docs/deployment.md).

use crate::chaos::Cut;
use crate::common::{free_port, heavy_or_timed};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const W: &str = "16";
const SECRET: &str = "the doctor test's secret, long enough to pass";

/// `collectix doctor --nproc-per-node 16` with the test's sizes, `extra` arguments and `env`;
/// whether it succeeded, and what it printed.
fn doctor(extra: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_collectix"))
        .args([
            "doctor",
            "--nproc-per-node",
            W,
            "--bytes",
            "65536",
            "--slot-ms",
            "250",
        ])
        .args(extra)
        .env("COLLECTIX_SECRET", SECRET)
        .envs(env.iter().copied())
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    println!("{text}");
    (out.status.success(), text)
}

/// The findings rank 0 printed (the lines after `findings:`), without the rank prefix.
fn findings(text: &str) -> Vec<String> {
    text.lines()
        .skip_while(|l| !l.ends_with("] findings:"))
        .skip(1)
        .map_while(|l| l.strip_prefix("[rank 0]   "))
        .map(str::to_string)
        .collect()
}

#[test]
fn every_link_of_16_processes_carries_data_both_ways_over_shared_memory_and_tcp() {
    let _turn = heavy_or_timed();
    for (transport, summary) in [
        ("shm", "120 pairs over shared memory, 0 over TCP"),
        ("tcp", "0 pairs over shared memory, 120 over TCP"),
    ] {
        let (ok, text) = doctor(&[], &[("COLLECTIX_TRANSPORT", transport)]);
        assert!(ok, "{transport}: {text}");
        assert!(text.contains(summary), "{transport}: {text}");
        assert!(
            text.contains("no findings: every link carried data both ways"),
            "{text}"
        );
        // Both matrices, a row per rank, a number in every cell but the diagonal.
        for r in 0..16 {
            let rows: Vec<&str> = text
                .lines()
                .filter_map(|l| l.strip_prefix("[rank 0] "))
                .filter(|l| {
                    let w: Vec<&str> = l.split_whitespace().collect();
                    w.len() == 17 && w[0] == r.to_string()
                })
                .collect();
            assert_eq!(rows.len(), 2, "{text}");
            for row in rows {
                let cells: Vec<&str> = row.split_whitespace().skip(1).collect();
                assert_eq!(cells.len(), 16, "{row}");
                for (c, cell) in cells.iter().enumerate() {
                    assert_eq!(*cell == ".", c == r, "{row}");
                }
            }
        }
    }
}

/// Rank 5 with another link timeout and rank 9 with another spin: each named, by field, with
/// its value and the others'; no link is blamed.
#[test]
fn a_setting_that_differs_is_named_by_rank_and_field() {
    let _turn = heavy_or_timed();
    let exe = env!("CARGO_BIN_EXE_collectix");
    let script = r#"if [ "$RANK" = 5 ]; then export COLLECTIX_LINK_TIMEOUT=7; fi
if [ "$RANK" = 9 ]; then export COLLECTIX_SPIN_US=0; fi
exec "$0" doctor --rank --bytes 65536 --slot-ms 250"#;
    let port = free_port().to_string();
    let out = Command::new(exe)
        .args([
            "launch",
            "--nproc-per-node",
            W,
            "--master-port",
            &port,
            "--",
        ])
        .args(["sh", "-c", script, exe])
        .env("COLLECTIX_SECRET", SECRET)
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    println!("{text}");
    assert!(!out.status.success(), "{text}");
    assert_eq!(
        findings(&text),
        vec![
            "setting link_timeout: rank 5 has 7, the others default".to_string(),
            "setting spin_us: rank 9 has 0, the others default".to_string(),
        ],
        "{text}"
    );
}

/// The process id of each rank of the check whose store is on `port` (from `/proc`: its
/// command line, its `MASTER_PORT` and its `RANK`; other tests' checks run beside it).
fn rank_pids(port: &str) -> Vec<(usize, i32)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let cmd = String::from_utf8_lossy(&cmd);
        if !(cmd.contains("doctor") && cmd.contains("--rank")) {
            continue;
        }
        let env = std::fs::read(e.path().join("environ")).unwrap_or_default();
        let vars: Vec<&str> = env
            .split(|&b| b == 0)
            .filter_map(|kv| std::str::from_utf8(kv).ok())
            .collect();
        if !vars.contains(&format!("MASTER_PORT={port}").as_str()) {
            continue;
        }
        let rank = vars
            .iter()
            .find_map(|kv| kv.strip_prefix("RANK=")?.parse().ok());
        if let Some(r) = rank {
            out.push((r, pid));
        }
    }
    out
}

/// A check of two passes under way: the child, the first pass's lines, the ranks' pids, and
/// the thread reading the rest of its output (the pipe must not fill).
struct TwoPasses {
    child: Child,
    first: Vec<String>,
    pids: Vec<(usize, i32)>,
    rest: std::thread::JoinHandle<Vec<String>>,
}

/// Starts a check of two passes, 4.5 s apart, over `transport` on `port`, and returns once
/// the first pass's report is out.
fn two_passes(transport: &str, port: &str) -> TwoPasses {
    let mut child = Command::new(env!("CARGO_BIN_EXE_collectix"))
        .args([
            "doctor",
            "--nproc-per-node",
            W,
            "--bytes",
            "65536",
            "--slot-ms",
            "250",
        ])
        .args([
            "--passes",
            "2",
            "--interval-ms",
            "4500",
            "--master-port",
            port,
        ])
        .env("COLLECTIX_SECRET", SECRET)
        .env("COLLECTIX_TRANSPORT", transport)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("{e}"));
    let mut first = Vec::new();
    let stdout = child.stdout.take().unwrap_or_else(|| panic!("no stdout"));
    let mut lines = BufReader::new(stdout).lines();
    for line in lines.by_ref() {
        let line = line.unwrap_or_default();
        let end = line.contains("no findings") || line.contains("findings:");
        first.push(line);
        if end {
            break;
        }
    }
    let rest = std::thread::spawn(move || lines.map_while(|l| l.ok()).collect::<Vec<_>>());
    TwoPasses {
        child,
        first,
        pids: rank_pids(port),
        rest,
    }
}

impl TwoPasses {
    /// The second pass's output, once the check ended.
    fn second(mut self) -> String {
        let _ = self.child.wait();
        self.rest.join().unwrap_or_default().join("\n")
    }
}

/// The link between ranks 3 and 7 cut (every TCP segment between the two processes dropped,
/// their store connections spared) between two checks over TCP: the second names that pair,
/// with both ends' word, and nothing else, within 2 s of its start.
#[test]
fn a_cut_link_is_named_by_its_pair() {
    let _turn = heavy_or_timed();
    if !Cut::available() {
        println!("SKIPPED: cutting a link needs root and nftables");
        assert!(std::env::var_os("CI").is_none(), "CI has root and nftables");
        return;
    }
    let port = free_port().to_string();
    let check = two_passes("tcp", &port);
    let first = &check.first;
    println!("{}", first.join("\n"));
    assert!(first.iter().any(|l| l.contains("no findings")), "{first:?}");
    let pids = check.pids.clone();
    let pid = |r: usize| pids.iter().find(|(x, _)| *x == r).map(|(_, p)| *p);
    let (Some(a), Some(b)) = (pid(3), pid(7)) else {
        panic!("no pids of ranks 3 and 7: {pids:?}");
    };
    let store_port: u16 = port.parse().unwrap_or(0);
    let cut = Cut::between(&[a], &[b], store_port);
    assert!(cut.is_some(), "could not cut the link");
    let cut_at = Instant::now();
    let second = check.second();
    drop(cut);
    println!("{second}\n(cut {:?} before the end)", cut_at.elapsed());
    let found = findings(&second);
    assert_eq!(found.len(), 1, "{second}");
    assert!(
        found[0]
            .starts_with("link 3 <-> 7 (tcp): rank 3: no answer from rank 7 within the round's ")
            && found[0].contains("; rank 7: no answer from rank 3 within the round's "),
        "{second}"
    );
    let took = second
        .lines()
        .find_map(|l| {
            l.split_once("checked in ")
                .map(|(_, t)| t.trim_end_matches(" s").to_string())
        })
        .and_then(|t| t.parse::<f64>().ok());
    println!("the second check took {took:?} s");
}

/// Rank 7 frozen (SIGSTOP) between two checks over shared memory: the second names it as not
/// reporting, and every link to it, by pair; no other link.
#[test]
fn a_frozen_rank_is_named_with_its_links() {
    let _turn = heavy_or_timed();
    let port = free_port().to_string();
    let check = two_passes("shm", &port);
    let first = &check.first;
    println!("{}", first.join("\n"));
    assert!(first.iter().any(|l| l.contains("no findings")), "{first:?}");
    let Some(&(_, seven)) = check.pids.iter().find(|(r, _)| *r == 7) else {
        panic!("no pid of rank 7: {:?}", check.pids);
    };
    let signal = |sig: &str| {
        let _ = Command::new("kill")
            .args([sig, &seven.to_string()])
            .status();
    };
    signal("-STOP");
    // Thawed once the second check is over, so that the job can end.
    let thaw = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(6));
        let _ = Command::new("kill")
            .args(["-CONT", &seven.to_string()])
            .status();
    });
    let second = check.second();
    let _ = thaw.join();
    println!("{second}");
    let found = findings(&second);
    assert!(
        found.iter().any(|f| f.starts_with("rank 7 did not report")),
        "{second}"
    );
    let links: Vec<&String> = found.iter().filter(|f| f.starts_with("link ")).collect();
    assert_eq!(links.len(), 15, "{second}");
    for l in links {
        assert!(
            l.contains(" <-> 7 (shm): ") || l.starts_with("link 7 <-> "),
            "{second}"
        );
        assert!(l.contains("rank 7 did not start the check"), "{l}");
    }
}
