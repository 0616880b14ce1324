//! `collectix launch`: torchrun's environment, rank-prefixed output, a failing or killed rank
//! stopping the job with a summary, and SIGTERM forwarded. The bounds on elapsed time are
//! hang guards (a job that should stop at once must not wait for its 30 s sleeps), not
//! performance assertions.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn launch(n: &str, script: &str) -> (Output, Duration) {
    let start = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_collectix"))
        .args([
            "launch",
            "--nproc-per-node",
            n,
            "--master-port",
            "0",
            "--grace",
            "5",
            "--",
            "sh",
            "-c",
            script,
        ])
        .output()
        .unwrap_or_else(|e| panic!("cannot run collectix launch: {e}"));
    (out, start.elapsed())
}

/// `collectix launch` of two ranks running `script`, not started yet.
fn two_ranks(script: &str) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_collectix"));
    c.args([
        "launch",
        "--nproc-per-node",
        "2",
        "--master-port",
        "0",
        "--",
        "sh",
        "-c",
        script,
    ]);
    c
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn each_process_gets_torchruns_environment_and_its_output_is_prefixed() {
    let (out, _) = launch(
        "3",
        r#"echo "hi $RANK of $WORLD_SIZE, local $LOCAL_RANK of $LOCAL_WORLD_SIZE, $MASTER_ADDR:$MASTER_PORT, store by launcher: $TORCHELASTIC_USE_AGENT_STORE"; echo "to stderr" >&2"#,
    );
    let (so, se) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{so}\n{se}");
    // `--master-port 0`: the port the launcher's store got, the same for every rank.
    let port = so
        .split("127.0.0.1:")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .and_then(|p| p.parse::<u16>().ok())
        .filter(|&p| p != 0)
        .unwrap_or_else(|| panic!("no port in:\n{so}"));
    for r in 0..3 {
        let want = format!(
            "[rank {r}] hi {r} of 3, local {r} of 3, 127.0.0.1:{port}, store by launcher: True"
        );
        assert!(so.lines().any(|l| l == want), "no {want:?} in:\n{so}");
        assert!(se.contains(&format!("[rank {r}] to stderr")), "{se}");
    }
}

#[test]
fn a_failing_rank_stops_the_others_and_is_named() {
    let (out, took) = launch(
        "3",
        r#"if [ "$RANK" = 1 ]; then echo "rank one gives up" >&2; exit 3; fi; exec sleep 30"#,
    );
    let se = text(&out.stderr);
    assert!(!out.status.success());
    assert!(took < Duration::from_secs(20), "took {took:?}");
    assert!(se.contains("[rank 1] rank one gives up"), "{se}");
    assert!(
        se.contains("rank 1 exited with status 3; the job stopped"),
        "{se}"
    );
    assert!(
        se.contains("rank 0 was killed by signal 15 (SIGTERM)"),
        "{se}"
    );
}

#[test]
fn a_rank_killed_by_sigkill_is_named() {
    let (out, took) = launch(
        "2",
        r#"if [ "$RANK" = 1 ]; then kill -9 $$; fi; exec sleep 30"#,
    );
    let se = text(&out.stderr);
    assert!(!out.status.success());
    assert!(took < Duration::from_secs(20), "took {took:?}");
    assert!(
        se.contains("rank 1 was killed by signal 9 (SIGKILL)"),
        "{se}"
    );
}

/// A job of 2 running `script` (which says "ready" once it has set its trap), sent SIGTERM
/// once both ranks are ready: the launcher, its stdout, and what it printed so far.
fn terminated(
    script: &str,
) -> (
    std::process::Child,
    std::io::BufReader<std::process::ChildStdout>,
    String,
) {
    let mut child = two_ranks(script)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run collectix launch: {e}"));
    // Both processes have set their trap once they said "ready".
    let mut stdout =
        std::io::BufReader::new(child.stdout.take().unwrap_or_else(|| panic!("no stdout")));
    let mut so = String::new();
    while so.matches("ready").count() < 2 {
        let mut line = String::new();
        if std::io::BufRead::read_line(&mut stdout, &mut line).unwrap_or(0) == 0 {
            panic!("the job ended before both ranks were ready:\n{so}");
        }
        so.push_str(&line);
    }
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap_or(0));
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    (child, stdout, so)
}

#[test]
fn sigterm_to_the_launcher_reaches_every_process() {
    let (child, mut stdout, mut so) = terminated(
        r#"trap 'echo "rank $RANK got TERM"; exit 7' TERM; echo ready; sleep 30 & wait"#,
    );
    let start = Instant::now();
    let _ = std::io::Read::read_to_string(&mut stdout, &mut so);
    let out = child.wait_with_output().unwrap_or_else(|e| panic!("{e}"));
    let se = text(&out.stderr);
    assert!(start.elapsed() < Duration::from_secs(20));
    assert!(!out.status.success());
    for r in 0..2 {
        assert!(
            so.contains(&format!("[rank {r}] rank {r} got TERM")),
            "{so}\n{se}"
        );
        assert!(
            se.contains(&format!("rank {r} exited with status 7")),
            "{se}"
        );
    }
    assert!(se.contains("the launcher got SIGTERM"), "{se}");
}

/// `collectix launch` with `args` before `--`, `script` after, the secret variables removed
/// from its environment and `env` added.
fn launch_with(args: &[&str], env: &[(&str, &str)], script: &str) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_collectix"));
    c.arg("launch")
        .args(args)
        .args(["--master-port", "0", "--", "sh", "-c", script])
        .env_remove("COLLECTIX_SECRET")
        .env_remove("COLLECTIX_SECRET_FILE");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output()
        .unwrap_or_else(|e| panic!("cannot run collectix launch: {e}"))
}

#[test]
fn the_launcher_hands_every_process_one_fresh_secret_or_the_one_it_was_given() {
    let secrets = |out: &Output| -> Vec<String> {
        assert!(out.status.success(), "{}", text(&out.stderr));
        let mut s: Vec<String> = text(&out.stdout)
            .lines()
            .filter_map(|l| l.split_once("secret=").map(|(_, s)| s.to_string()))
            .collect();
        s.sort();
        s
    };
    let script = r#"echo "secret=$COLLECTIX_SECRET""#;
    let a = secrets(&launch_with(&["--nproc-per-node", "3"], &[], script));
    let b = secrets(&launch_with(&["--nproc-per-node", "3"], &[], script));
    assert_eq!(a.len(), 3);
    assert!(a.iter().all(|s| s == &a[0]), "one secret per job: {a:?}");
    assert!(
        a[0].len() == 64 && a[0].bytes().all(|c| c.is_ascii_hexdigit()),
        "{a:?}"
    );
    assert_ne!(a[0], b[0], "a fresh secret per job");
    let given = secrets(&launch_with(
        &["--nproc-per-node", "2"],
        &[("COLLECTIX_SECRET", "the user's own secret")],
        script,
    ));
    assert_eq!(given, vec!["the user's own secret"; 2]);
    // Several nodes: each launcher would make its own; it asks for one instead.
    let out = launch_with(
        &["--nproc-per-node", "1", "--nnodes", "2", "--node-rank", "0"],
        &[],
        script,
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("COLLECTIX_SECRET"),
        "{}",
        text(&out.stderr)
    );
}

/// The summary names the rank that failed first, not the lowest rank among those that ended
/// in the same moment: rank 2 is killed, and the others exit with an error a moment later,
/// once they see it gone (as a job's survivors do when a peer dies).
#[test]
fn the_rank_that_failed_first_is_named_first() {
    let dir = std::env::temp_dir().join(format!("cx-launch-first-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
    let d = dir.display();
    // Rank 2 holds a lock until it dies; the others wait for the lock (released when the
    // dead process's files close, before the launcher can reap it) and exit with status 1.
    let script = format!(
        r#"if [ "$RANK" = 2 ]; then exec 9>{d}/lock; flock 9; touch {d}/held; sleep 0.5; kill -9 $$; fi
        while [ ! -e {d}/held ]; do sleep 0.01; done; flock {d}/lock true; exit 1"#
    );
    for _ in 0..3 {
        let _ = std::fs::remove_file(dir.join("held"));
        let (out, took) = launch("3", &script);
        let se = text(&out.stderr);
        assert!(!out.status.success());
        assert!(took < Duration::from_secs(20), "took {took:?}");
        assert!(
            se.contains(
                "collectix launch: rank 2 was killed by signal 9 (SIGKILL); the job stopped"
            ),
            "{se}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A forwarded SIGTERM that every process answers by exiting with status 0 is a clean
/// shutdown: the launcher exits 0 too.
#[test]
fn a_clean_shutdown_on_sigterm_exits_zero() {
    let (child, mut stdout, mut so) =
        terminated(r#"trap 'exit 0' TERM; echo ready; sleep 30 & wait"#);
    let _ = std::io::Read::read_to_string(&mut stdout, &mut so);
    let out = child.wait_with_output().unwrap_or_else(|e| panic!("{e}"));
    assert!(out.status.success(), "{}", text(&out.stderr));
}

/// A launcher killed with SIGKILL (no chance to stop anything) leaves no process of its job
/// running: each gets SIGKILL when the launcher dies.
#[test]
fn no_process_outlives_a_killed_launcher() {
    let dir = std::env::temp_dir().join(format!("cx-launch-orphan-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
    let script = format!(r#"echo $$ > {}/pid.$RANK; exec sleep 30"#, dir.display());
    let mut child = two_ranks(&script)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run collectix launch: {e}"));
    let pids: Vec<i32> = (0..2)
        .map(|r| {
            let file = dir.join(format!("pid.{r}"));
            let start = Instant::now();
            loop {
                if let Some(p) = std::fs::read_to_string(&file)
                    .ok()
                    .and_then(|s| s.trim().parse().ok())
                {
                    return p;
                }
                assert!(
                    start.elapsed() < Duration::from_secs(20),
                    "rank {r} never started"
                );
                std::thread::sleep(Duration::from_millis(10));
            }
        })
        .collect();
    let _ = child.kill();
    let _ = child.wait();
    let alive = |p: i32| nix::sys::signal::kill(nix::unistd::Pid::from_raw(p), None).is_ok();
    let start = Instant::now();
    while pids.iter().any(|&p| alive(p)) && start.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let left: Vec<i32> = pids.iter().copied().filter(|&p| alive(p)).collect();
    for &p in &left {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(p),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        left.is_empty(),
        "still running after the launcher died: {left:?}"
    );
}
