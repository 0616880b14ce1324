//! `examples/elastic.rs` under `collectix launch --on-failure shrink`: a rank killed mid-run
//! (from outside with SIGKILL, or crashing by itself; rank 0 included, whose loss the store
//! survives since the launcher serves it) leaves the others to finish with one rank fewer,
//! and their final lines are byte for byte those of a run with no fault.

mod common;
use common::example;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const STEPS: &str = "60";

fn launch(extra: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_collectix"));
    c.args(["launch", "--nproc-per-node", "4", "--master-port", "0"])
        .args(["--on-failure", "shrink", "--"])
        .arg(example("elastic"))
        .args(["--steps", STEPS])
        .args(extra);
    c
}

/// Each rank's final line, without its "[rank R] " prefix, by rank.
fn finals(out: &str) -> Vec<(usize, String)> {
    let mut v: Vec<(usize, String)> = out
        .lines()
        .filter(|l| l.contains(": final loss "))
        .filter_map(|l| {
            let (_, line) = l.split_once("] ")?;
            let r = line
                .strip_prefix("rank ")?
                .split(':')
                .next()?
                .parse()
                .ok()?;
            Some((r, line.to_string()))
        })
        .collect();
    v.sort();
    v
}

fn clean_run() -> Vec<(usize, String)> {
    let out = launch(&[]).output().unwrap_or_else(|e| panic!("{e}"));
    let so = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{so}");
    let f = finals(&so);
    assert_eq!(f.len(), 4, "{so}");
    f
}

/// The survivors' final lines are the clean run's lines of the same ranks, and they said
/// they went on with 3 ranks.
fn check_survivors(clean: &[(usize, String)], out: &str, victim: usize) {
    let got = finals(out);
    let want: Vec<(usize, String)> = clean
        .iter()
        .filter(|(r, _)| *r != victim)
        .cloned()
        .collect();
    assert_eq!(got, want, "{out}");
    for (r, _) in &want {
        let said = format!("rank {r}: going on with 3 ranks from step");
        assert!(out.contains(&said), "rank {r} did not say so:\n{out}");
    }
}

#[test]
fn a_rank_that_crashes_is_survived_with_the_same_result() {
    let clean = clean_run();
    for victim in ["0", "2"] {
        let out = launch(&["--crash-rank", victim, "--crash-at-step", "9"])
            .output()
            .unwrap_or_else(|e| panic!("{e}"));
        let so = String::from_utf8_lossy(&out.stdout);
        let se = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{so}\n{se}");
        check_survivors(&clean, &so, victim.parse().unwrap_or(9));
        assert!(
            se.contains(&format!(
                "rank {victim} was killed by signal 6 (SIGABRT); the job went on without it"
            )),
            "{se}"
        );
    }
}

#[test]
fn a_rank_killed_from_outside_mid_run_is_survived_with_the_same_result() {
    let clean = clean_run();
    let mut child = launch(&["--step-ms", "20"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{e}"));
    let stdout = child.stdout.take().unwrap_or_else(|| panic!("no stdout"));
    let mut lines = BufReader::new(stdout).lines();
    let mut seen = String::new();
    let mut pid = None;
    let start = Instant::now();
    while let Some(Ok(l)) = lines.next() {
        seen.push_str(&l);
        seen.push('\n');
        if let Some(p) = l.strip_prefix("[rank 1] rank 1: pid ") {
            pid = p.trim().parse::<i32>().ok();
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "{seen}");
    }
    let pid = pid.unwrap_or_else(|| panic!("no pid line:\n{seen}"));
    // A few steps in (60 steps of at least 20 ms each: the job is mid-run).
    std::thread::sleep(Duration::from_millis(300));
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    );
    for l in lines.map_while(Result::ok) {
        seen.push_str(&l);
        seen.push('\n');
    }
    let status = child.wait().unwrap_or_else(|e| panic!("{e}"));
    assert!(status.success(), "{seen}");
    check_survivors(&clean, &seen, 1);
}
