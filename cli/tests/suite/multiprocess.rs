//! Separate OS processes over TCP loopback: the README's main example under
//! `collectix launch` and under `mpirun`, and a rank killed with SIGKILL in the middle of an
//! all_reduce loop. The examples' binaries are built here (a no-op after `cargo test
//! --workspace`, which builds them). Elapsed-time bounds are hang guards, not timings.

use crate::common;
use common::{assert_example_lines, assert_runs_the_example, example, free_port, heavy_or_timed};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn the_readme_example_runs_as_four_processes_under_collectix_launch() {
    let (ok, so, se) = launch(4, &example("all_reduce"));
    assert!(ok, "{so}\n{se}");
    assert_example_lines(&so, true, &se);
}

#[test]
fn the_readme_example_runs_under_mpirun() {
    if Command::new("mpirun").arg("--version").output().is_err() {
        assert!(
            std::env::var_os("CI").is_none(),
            "mpirun is missing in CI: .ci/run installs openmpi-bin"
        );
        eprintln!("SKIPPED: no mpirun here (Debian: apt-get install openmpi-bin)");
        return;
    }
    assert_runs_the_example(
        Command::new("mpirun")
            .args(["--allow-run-as-root", "--oversubscribe", "-np", "4"])
            .arg(example("all_reduce")),
        false,
    );
}

/// What `/dev/shm` holds whose name says collectix (nothing, ever: the segments are memfds).
fn collectix_in_dev_shm() -> Vec<String> {
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.contains("collectix"))
                .collect()
        })
        .unwrap_or_default()
}

/// Whether process `pid` maps a collectix segment, and as what (`/proc/PID/maps`): a
/// memfd, named in no file system.
fn maps_a_memfd_segment(pid: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/maps")).is_ok_and(|m| {
        m.lines()
            .any(|l| l.contains("/memfd:collectix-shm (deleted)"))
    })
}

#[test]
fn a_rank_killed_mid_all_reduce_is_named_by_every_other_rank() {
    for transport in ["shm", "tcp"] {
        killed_mid_all_reduce(transport);
    }
}

/// Rank 1 of 3 is killed with SIGKILL mid-loop over `transport`: both others name it, soon;
/// over shared memory, nothing is left in `/dev/shm` (the segments are memfds, mapped by
/// every rank while it runs).
fn killed_mid_all_reduce(transport: &str) {
    let exe = example("multiprocess");
    let (w, port) = (3, free_port());
    let mut children: Vec<_> = (0..w)
        .map(|r| {
            Command::new(&exe)
                .env("COLLECTIX_TRANSPORT", transport)
                .env("RANK", r.to_string())
                .env("WORLD_SIZE", w.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", port.to_string())
                .env("ITERS", "100000000")
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| panic!("{e}"))
        })
        .collect();
    // Each says its pid once it has joined.
    let mut outs: Vec<_> = children
        .iter_mut()
        .map(|c| BufReader::new(c.stdout.take().unwrap_or_else(|| panic!("no stdout"))))
        .collect();
    let peers = if transport == "shm" { w - 1 } else { 0 };
    for (o, out) in outs.iter_mut().enumerate() {
        let mut l = String::new();
        let _ = out.read_line(&mut l);
        assert!(l.starts_with(&format!("rank {o}: pid ")), "{l:?}");
        assert!(
            l.trim_end()
                .ends_with(&format!(", {peers} shared-memory peers")),
            "{transport}: {l:?}"
        );
        let pid = l["rank 0: pid ".len()..].split(',').next().unwrap_or("");
        assert_eq!(
            maps_a_memfd_segment(pid),
            transport == "shm",
            "{transport}: rank {o}'s segments"
        );
    }
    assert_eq!(collectix_in_dev_shm(), Vec::<String>::new());
    // Let them run a little, then kill rank 1 mid-loop.
    std::thread::sleep(Duration::from_millis(300));
    let _ = children[1].kill();
    let killed_at = Instant::now();
    let _ = children[1].wait();
    for r in [0, 2] {
        let mut rest = String::new();
        let _ = std::io::Read::read_to_string(&mut outs[r], &mut rest);
        let status = children[r].wait().unwrap_or_else(|e| panic!("{e}"));
        let took = killed_at.elapsed();
        assert!(!status.success(), "rank {r}: {rest}");
        assert!(
            rest.contains(&format!("rank {r}: error:")) && rest.contains("rank 1"),
            "{transport}: rank {r} does not name rank 1: {rest:?}"
        );
        assert!(
            took < Duration::from_secs(5),
            "{transport}: rank {r} heard after {took:?}"
        );
    }
    assert_eq!(collectix_in_dev_shm(), Vec::<String>::new());
}

/// Runs `exe` under `collectix launch --nproc-per-node w`; (success, stdout, stderr).
fn launch(w: usize, exe: &std::path::Path) -> (bool, String, String) {
    launch_with(w, exe, &[])
}

/// [`launch`] with arguments for the program.
fn launch_with(w: usize, exe: &std::path::Path, args: &[&str]) -> (bool, String, String) {
    launch_env(w, exe, args, &[])
}

/// [`launch_with`] with environment variables for the job.
fn launch_env(
    w: usize,
    exe: &std::path::Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_collectix"))
        .envs(env.iter().copied())
        .args(["launch", "--nproc-per-node"])
        .arg(w.to_string())
        .arg("--master-port")
        .arg(free_port().to_string())
        .arg("--")
        .arg(exe)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn every_collective_checks_out_across_2_3_4_processes() {
    let exe = example("check_job");
    // Shared memory with single-copy large payloads for rooted calls and point-to-point (the
    // default, auto), for every call ("shm1": COLLECTIX_SHM_SINGLE_COPY=1) and for none
    // ("shm0").
    for (w, transport) in [
        (2, "shm"),
        (3, "shm"),
        (4, "shm"),
        (3, "shm1"),
        (2, "shm0"),
        (2, "tcp"),
        (4, "tcp"),
    ] {
        let single = match transport {
            "shm1" => "1",
            "shm0" => "0",
            _ => "auto",
        };
        let env = [
            ("COLLECTIX_TRANSPORT", &transport[..3]),
            ("COLLECTIX_SHM_SINGLE_COPY", single),
        ];
        let (ok, so, se) = launch_env(w, &exe, &[], &env);
        assert!(ok, "W={w} {transport}:\n{so}\n{se}");
        // Every rank ran the whole matrix: the same count everywhere, and more cases than
        // there are collectives (12).
        let counts: Vec<usize> = (0..w)
            .map(|r| {
                let head = format!("[rank {r}] rank {r}: ");
                so.lines()
                    .find_map(|l| {
                        l.strip_prefix(&head)?
                            .strip_suffix(" cases ok")?
                            .parse()
                            .ok()
                    })
                    .unwrap_or_else(|| {
                        panic!("W={w} {transport}: rank {r} did not finish:\n{so}\n{se}")
                    })
            })
            .collect();
        assert!(
            counts.iter().all(|&n| n == counts[0] && n > 12),
            "W={w} {transport}: {counts:?}"
        );
    }
}

/// `step S: loss L` lines, as `(S, L)`, after `prefix`.
fn losses(text: &str, prefix: &str) -> Vec<f64> {
    text.lines()
        .filter_map(|l| l.strip_prefix(prefix)?.strip_prefix("step "))
        .filter_map(|l| l.split_once(": loss ")?.1.parse().ok())
        .collect()
}

#[test]
fn the_ddp_example_under_collectix_launch_matches_single_process_training() {
    let exe = example("ddp");
    let single = Command::new(&exe)
        .arg("--single")
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(single.status.success());
    let want = losses(&String::from_utf8_lossy(&single.stdout), "");
    assert_eq!(want.len(), 40, "{single:?}");
    let (ok, so, se) = launch(4, &exe);
    assert!(ok, "{so}\n{se}");
    for r in 0..4 {
        let got = losses(&so, &format!("[rank {r}] "));
        assert_eq!(got.len(), want.len(), "rank {r}:\n{so}\n{se}");
        for (s, (a, b)) in got.iter().zip(&want).enumerate() {
            // Printed to 6 decimals; the sums differ in their order of additions only.
            assert!((a - b).abs() <= 1e-5, "rank {r}, step {s}: {a} against {b}");
        }
    }
}

/// `fsdp` under `collectix launch`, one rank per process, as FSDP over 4 and HSDP over 2 × 2:
/// every rank's losses are `--single`'s, printed the same to the last digit (f32's shortest
/// round trip), and each rank held a quarter (FSDP) or a half (HSDP) of the model and two
/// gathered layers.
#[test]
fn the_fsdp_example_under_collectix_launch_matches_single_process_training_exactly() {
    let exe = example("fsdp");
    for (replicas, peak) in [("1", 4352), ("2", 6528)] {
        let single = Command::new(&exe)
            .args(["--single", "--ranks", "4", "--replicas", replicas])
            .output()
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(single.status.success(), "{single:?}");
        let want: Vec<String> = String::from_utf8_lossy(&single.stdout)
            .lines()
            .filter_map(|l| l.strip_prefix("single: ").map(str::to_string))
            .collect();
        assert_eq!(want.len(), 20, "{single:?}");
        let (ok, so, se) = launch_with(4, &exe, &["--replicas", replicas]);
        assert!(ok, "{so}\n{se}");
        for r in 0..4 {
            let prefix = format!("[rank {r}] rank {r}: ");
            let got: Vec<String> = so
                .lines()
                .filter_map(|l| l.strip_prefix(&prefix))
                .filter(|l| l.starts_with("step "))
                .map(str::to_string)
                .collect();
            assert_eq!(got, want, "replicas {replicas}, rank {r}:\n{so}\n{se}");
            let held = format!("{prefix}param bytes held peak {peak} of 8704");
            assert!(so.lines().any(|l| l == held), "{held}:\n{so}");
        }
    }
}

#[test]
fn a_rank_killed_mid_all_reduce_under_collectix_launch_stops_the_job_and_is_named() {
    let exe = example("multiprocess");
    let mut launcher = Command::new(env!("CARGO_BIN_EXE_collectix"))
        .args(["launch", "--nproc-per-node", "3", "--master-port"])
        .arg(free_port().to_string())
        .arg("--")
        .arg(&exe)
        .env("ITERS", "100000000")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{e}"));
    let mut out = BufReader::new(
        launcher
            .stdout
            .take()
            .unwrap_or_else(|| panic!("no stdout")),
    );
    // "[rank 1] rank 1: pid P, joined in T ms"
    let mut pid = None;
    let mut seen = String::new();
    while pid.is_none() {
        let mut l = String::new();
        if out.read_line(&mut l).unwrap_or(0) == 0 {
            break;
        }
        seen.push_str(&l);
        pid = l
            .strip_prefix("[rank 1] rank 1: pid ")
            .and_then(|r| r.split(',').next())
            .and_then(|p| p.trim().parse::<i32>().ok());
    }
    let pid = pid.unwrap_or_else(|| panic!("rank 1 never said its pid:\n{seen}"));
    std::thread::sleep(Duration::from_millis(300));
    let killed = Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(killed.success());
    let killed_at = Instant::now();
    let mut rest = String::new();
    let _ = std::io::Read::read_to_string(&mut out, &mut rest);
    let status = launcher.wait().unwrap_or_else(|e| panic!("{e}"));
    let took = killed_at.elapsed();
    let mut se = String::new();
    if let Some(mut e) = launcher.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut se);
    }
    assert!(!status.success(), "{rest}\n{se}");
    assert!(
        se.contains("rank 1 was killed by signal 9 (SIGKILL)"),
        "{rest}\n{se}"
    );
    // A hang guard: the others stopped (by their own error naming rank 1, or by the
    // launcher's SIGTERM, whichever came first), and the launcher exited.
    assert!(took < Duration::from_secs(10), "took {took:?}:\n{se}");
    for r in [0, 2] {
        assert!(
            se.contains(&format!("rank {r} exited with status 1"))
                || se.contains(&format!("rank {r} was killed by signal 15 (SIGTERM)")),
            "rank {r}:\n{rest}\n{se}"
        );
    }
}

/// A job of `examples/multiprocess` as 3 ranks under `collectix launch` over shared memory:
/// the launcher, its output, each rank's pid (from its first line, which must say it has 2
/// shared-memory peers), and what was read, once every rank also printed a line with `also`.
struct ShmJob {
    launcher: std::process::Child,
    /// The launcher's stdout, kept open (the ranks may print more).
    _out: BufReader<std::process::ChildStdout>,
    pids: Vec<String>,
    seen: String,
}

fn shm_job(env: &[(&str, &str)], also: &str) -> ShmJob {
    let exe = example("multiprocess");
    let mut launcher = Command::new(env!("CARGO_BIN_EXE_collectix"))
        .args(["launch", "--nproc-per-node", "3", "--master-port"])
        .arg(free_port().to_string())
        .arg("--")
        .arg(&exe)
        .env("COLLECTIX_TRANSPORT", "shm")
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("{e}"));
    let mut out = BufReader::new(
        launcher
            .stdout
            .take()
            .unwrap_or_else(|| panic!("no stdout")),
    );
    // "[rank R] rank R: pid P, joined in T ms, at A, 2 shared-memory peers", from each rank.
    let (mut pids, mut also_seen, mut seen) = (Vec::new(), 0, String::new());
    while pids.len() < 3 || also_seen < 3 {
        let mut l = String::new();
        if out.read_line(&mut l).unwrap_or(0) == 0 {
            break;
        }
        seen.push_str(&l);
        if let Some(pid) = l
            .split_once(": pid ")
            .and_then(|(_, r)| r.split(',').next())
        {
            assert!(l.contains(", 2 shared-memory peers"), "{l:?}");
            pids.push(pid.trim().to_owned());
        }
        also_seen += usize::from(l.contains(also));
    }
    assert_eq!((pids.len(), also_seen), (3, 3), "{seen}");
    ShmJob {
        launcher,
        _out: out,
        pids,
        seen,
    }
}

/// `kill -9` of the launcher of a job over shared memory: its ranks die with it (the
/// launcher's death signal), and nothing of theirs is left in `/dev/shm` (their segments were
/// memfds, which they mapped while they ran).
#[test]
fn killing_the_launcher_of_a_shared_memory_job_leaves_nothing_behind() {
    let ShmJob {
        mut launcher,
        _out,
        pids,
        ..
    } = shm_job(&[("ITERS", "100000000")], ": pid ");
    std::thread::sleep(Duration::from_millis(300));
    assert!(pids.iter().all(|p| maps_a_memfd_segment(p)), "{pids:?}");
    let _ = launcher.kill();
    let _ = launcher.wait();
    // A hang guard: the ranks are gone within seconds.
    let start = Instant::now();
    while pids
        .iter()
        .any(|p| std::path::Path::new(&format!("/proc/{p}")).exists())
    {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "ranks {pids:?} outlived their launcher"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(collectix_in_dev_shm(), Vec::<String>::new());
}

/// CPU time (user + system, clock ticks) process `pid` has used, from `/proc/PID/stat`.
fn cpu_ticks(pid: &str) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command's closing parenthesis: state is field 3, utime 14, stime 15.
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

/// A job over shared memory that sits idle uses no CPU: its progress threads park on their
/// futex, its callers are gone, its connections only send a heartbeat a second. Over one
/// idle second each of 3 ranks uses at most 5 ticks (50 ms at 100 Hz; a spinning thread would
/// use the whole second).
#[test]
fn an_idle_job_over_shared_memory_uses_no_cpu() {
    let ShmJob {
        mut launcher,
        _out,
        pids,
        seen,
    } = shm_job(&[("ITERS", "50"), ("IDLE_MS", "3000")], ": idle for ");
    // Let the last calls' spinning end, then count one second's CPU.
    std::thread::sleep(Duration::from_millis(300));
    let before: Vec<Option<u64>> = pids.iter().map(|p| cpu_ticks(p)).collect();
    std::thread::sleep(Duration::from_secs(1));
    let after: Vec<Option<u64>> = pids.iter().map(|p| cpu_ticks(p)).collect();
    let status = launcher.wait().unwrap_or_else(|e| panic!("{e}"));
    assert!(status.success(), "{seen}");
    for (r, (b, a)) in before.iter().zip(&after).enumerate() {
        let used = a.zip(*b).map(|(a, b)| a.saturating_sub(b));
        eprintln!("rank {r}: {used:?} ticks in an idle second");
        assert!(
            used.is_some_and(|t| t <= 5),
            "rank {r} used {used:?} ticks of CPU in an idle second"
        );
    }
}

/// A job whose ranks all finish and leave in order logs no warning: a peer that closes its
/// links after leaving is no lost peer, and no group is aborted (each such job logged
/// "link lost" and often "group aborted … peer rank N was lost"). Three runs, since which
/// rank leaves first varies.
#[test]
fn a_clean_job_logs_no_warning() {
    let exe = example("multiprocess");
    for run in 0..3 {
        let out = Command::new(env!("CARGO_BIN_EXE_collectix"))
            .args(["launch", "--nproc-per-node", "3", "--master-port"])
            .arg(free_port().to_string())
            .arg("--")
            .arg(&exe)
            .env("RUST_LOG", "collectix=warn")
            .env("NO_COLOR", "1")
            .output()
            .unwrap_or_else(|e| panic!("{e}"));
        let so = String::from_utf8_lossy(&out.stdout);
        let se = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "run {run}:\n{so}\n{se}");
        let warned: Vec<&str> = so
            .lines()
            .chain(se.lines())
            .filter(|l| l.contains("WARN") || l.contains("ERROR"))
            .collect();
        assert!(warned.is_empty(), "run {run}: {warned:#?}");
    }
}

/// `examples/straggler` as 4 processes over shared memory: rank 3 sleeps 200 ms before each
/// all_reduce, and the ranks' views together name it the late-comer in at least 95 % of the
/// calls, late by 200 ms within 5 ms in the target run (15 ms in the suite's default run,
/// beside other tests); 4-byte calls (on the group's board) and 1 KiB calls (through the
/// engine). 30 steps of 4 bytes, or `COLLECTIX_STRAGGLER_STEPS` (the target run, 300: by
/// hand, on a quiet machine, as docs/deployment.md shows). It takes turns with the doctor's
/// tests.
#[test]
fn a_rank_with_a_slow_step_is_named_the_late_comer_as_processes() {
    let exe = example("straggler");
    let _turn = heavy_or_timed();
    let target_run = std::env::var_os("COLLECTIX_STRAGGLER_STEPS").is_some();
    let board_steps =
        std::env::var("COLLECTIX_STRAGGLER_STEPS").unwrap_or_else(|_| "30".to_string());
    let board_steps = board_steps.as_str();
    for (count, steps) in [("1", board_steps), ("256", "30")] {
        let env = [
            ("COLLECTIX_TRANSPORT", "shm"),
            ("STEPS", steps),
            ("COUNT", count),
            ("LATE_MS", "200"),
        ];
        let (ok, so, se) = launch_env(4, &exe, &[], &env);
        assert!(ok, "{so}\n{se}");
        println!("{count} floats, {steps} steps:\n{so}");
        let line = so
            .lines()
            .find_map(|l| l.split_once("culprit: ").map(|(_, r)| r))
            .unwrap_or_else(|| panic!("no culprit line:\n{so}\n{se}"));
        // "rank 3, last in N of S calls (P %), late by M ms on average"
        let words: Vec<&str> = line.split([' ', ',']).filter(|w| !w.is_empty()).collect();
        let number = |i: usize| -> f64 {
            words
                .get(i)
                .and_then(|w| w.parse().ok())
                .unwrap_or_else(|| panic!("word {i} of {line:?}"))
        };
        assert_eq!(words.first(), Some(&"rank"), "{line}");
        assert_eq!(number(1), 3.0, "{so}");
        let (last, of) = (number(4), number(6));
        assert!(last * 100.0 >= of * 95.0, "{so}");
        // The target (within 5 ms) holds for the target run, by hand on a quiet machine; in
        // the suite's 30 steps, other multi-process tests load the two cores, and the waiting
        // members' own delays shorten what they measure (194-195 ms seen in CI): 15 ms there.
        let within = if target_run { 5.0 } else { 15.0 };
        assert!((number(12) - 200.0).abs() < within, "{so}");
    }
}

/// `collectix status --explain` of a job whose rank 3 does 6 s of work before its first
/// all_reduce: ranks 0-2 are stuck in call #0 waiting for rank 3, and rank 3 is slow (it has
/// not reached the call); plain `collectix status` names it behind (no call yet).
#[test]
fn status_explain_names_the_ranks_stuck_and_the_one_they_wait_for() {
    let exe = example("straggler");
    let port = free_port().to_string();
    let secret = "the status explain test's secret";
    let mut job = Command::new(env!("CARGO_BIN_EXE_collectix"))
        .args([
            "launch",
            "--nproc-per-node",
            "4",
            "--master-port",
            &port,
            "--",
        ])
        .arg(&exe)
        .envs([
            ("COLLECTIX_TRANSPORT", "shm"),
            ("COLLECTIX_SECRET", secret),
            ("STEPS", "1"),
            ("LATE_MS", "6000"),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("{e}"));
    std::thread::sleep(Duration::from_secs(3));
    let status = |args: &[&str]| collectix_status(&port, secret, args);
    let explained = status(&["--explain"]);
    let plain = status(&[]);
    let _ = job.wait();
    println!("{explained}{plain}");
    let lines: Vec<&str> = explained.lines().collect();
    assert_eq!(lines.len(), 4, "{explained}");
    for (r, l) in lines[..3].iter().enumerate() {
        assert!(
            l.starts_with(&format!(
                "rank {r}, group world: stuck in call #0 (all_reduce) for "
            )) && l.ends_with(" s, waiting for ranks [3]"),
            "{explained}"
        );
    }
    assert_eq!(
        lines[3],
        "rank 3, group world: slow: has not reached call #0, which ranks [0, 1, 2] wait in"
    );
    assert!(
        plain.contains(
            "group world: behind call #0: rank 3 (no call yet); waiting in it: ranks [0, 1, 2]"
        ),
        "{plain}"
    );
}

/// `examples/wait_cycle` as 4 processes over shared memory: ranks 0 and 1 call on group A then
/// B, ranks 2 and 3 on B then A, each waiting for its call (2 s timeout). While they wait,
/// `collectix status --explain` gives each rank the verdict "wait cycle" on the group it is
/// stuck in, and plain `collectix status` names the cycles; then every rank fails with the
/// cycle (`Error::WaitCycle`, or an aborted group whose cause it is).
#[test]
fn ranks_in_a_wait_cycle_across_groups_are_told_and_status_shows_it_as_processes() {
    let exe = example("wait_cycle");
    let port = free_port().to_string();
    let secret = "the wait cycle test's secret, long enough";
    let job = Command::new(env!("CARGO_BIN_EXE_collectix"))
        .args([
            "launch",
            "--nproc-per-node",
            "4",
            "--master-port",
            &port,
            "--",
        ])
        .arg(&exe)
        .envs([
            ("COLLECTIX_TRANSPORT", "shm"),
            ("COLLECTIX_SECRET", secret),
            ("TIMEOUT_MS", "4000"),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{e}"));
    std::thread::sleep(Duration::from_millis(2500));
    let status = |args: &[&str]| collectix_status(&port, secret, args);
    let explained = status(&["--explain"]);
    let plain = status(&[]);
    let out = job.wait_with_output().unwrap_or_else(|e| panic!("{e}"));
    let so = String::from_utf8_lossy(&out.stdout);
    println!("{explained}{plain}{so}");
    assert!(!out.status.success(), "{so}");
    let cycles: Vec<&str> = explained
        .lines()
        .filter(|l| l.contains(": wait cycle: stuck in call #0 (all_reduce) for "))
        .collect();
    assert_eq!(cycles.len(), 4, "{explained}");
    for r in 0..4 {
        assert!(
            cycles
                .iter()
                .any(|l| l.starts_with(&format!("rank {r}, group "))),
            "{explained}"
        );
    }
    assert!(plain.contains("\nwait cycle: rank "), "{plain}");
    for r in 0..4 {
        let line = so
            .lines()
            .find(|l| l.starts_with(&format!("[rank {r}] rank {r}: ")))
            .unwrap_or_else(|| panic!("rank {r} said nothing:\n{so}"));
        assert!(line.contains("wait cycle across groups: rank "), "{line}");
    }
}

/// What `collectix status ARGS` printed for the job whose store is on `port`.
fn collectix_status(port: &str, secret: &str, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_collectix"))
        .arg("status")
        .args(args)
        .args(["--master-port", port])
        .env("COLLECTIX_SECRET", secret)
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    String::from_utf8_lossy(&out.stdout).into_owned()
}
