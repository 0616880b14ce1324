//! What the tests that run examples as processes share.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;

/// The example's binary, built if needed (same profile and target directory as this test).
pub(crate) fn example(name: &str) -> PathBuf {
    let status = Command::new(env!("CARGO"))
        // The test profile and the whole workspace: what `cargo test --workspace` built
        // already. (The dev profile would rebuild every dependency unoptimized; `-p
        // collectix` alone resolves nix's and proptest's features otherwise, and rebuilt
        // them and both collectix crates: 23 s, cold.)
        .args([
            "build",
            "-q",
            "--workspace",
            "--profile",
            "test",
            "--example",
            name,
        ])
        .status()
        .unwrap_or_else(|e| panic!("cannot run cargo: {e}"));
    assert!(status.success(), "cannot build the example {name}");
    // target/<profile>/deps/<this test> -> target/<profile>/examples/<name>
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("{e}"));
    let profile_dir = exe
        .parent()
        .and_then(|d| d.parent())
        .unwrap_or_else(|| panic!("no target directory above {exe:?}"));
    profile_dir.join("examples").join(name)
}

/// The example's lines, as one process per rank prints them.
pub(crate) const ALL_REDUCE_LINES: [&str; 8] = [
    "rank 0: sum [10, 20]",
    "rank 1: sum [10, 20]",
    "rank 2: sum [10, 20]",
    "rank 3: sum [10, 20]",
    "rank 1: group_min [2, 4]",
    "rank 1: group_max [4, 8]",
    "rank 3: group_min [2, 4]",
    "rank 3: group_max [4, 8]",
];

/// Asserts that `out` holds every line of the README example, each after `[rank R] ` when
/// `prefixed` (as `collectix launch` prints a rank's lines); `context` goes with a failure.
pub(crate) fn assert_example_lines(out: &str, prefixed: bool, context: &str) {
    for line in ALL_REDUCE_LINES {
        let want = if prefixed {
            format!("[rank {}] {line}", &line[5..6])
        } else {
            line.to_string()
        };
        assert!(
            out.lines().any(|l| l == want),
            "no {want:?} in:\n{out}\n{context}"
        );
    }
}

/// Runs `cmd` (a launcher starting the README's example) and asserts that it succeeds and
/// prints the example's lines ([`assert_example_lines`]).
pub(crate) fn assert_runs_the_example(cmd: &mut std::process::Command, prefixed: bool) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{e}"));
    let so = String::from_utf8_lossy(&out.stdout);
    let se = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{so}\n{se}");
    assert_example_lines(&so, prefixed, &se);
}

/// Held by the tests that load this machine with many processes (`collectix doctor` on 16) and
/// by those that measure time (the late-comer's lateness within 5 ms): on two cores the one
/// skews the other, so they take turns.
pub(crate) fn heavy_or_timed() -> std::sync::MutexGuard<'static, ()> {
    static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());
    TURN.lock().unwrap_or_else(|e| e.into_inner())
}

/// A port that is free on loopback (and on every address) at the moment, and stays free
/// until a test binds it, unless another program takes it by number.
pub(crate) fn free_port() -> u16 {
    free_ports(1)
}

/// The first of `n` ports in a row that are free as [`free_port`]'s is; no later call of
/// this process returns any of them.
pub(crate) fn free_ports(n: u16) -> u16 {
    // Below the kernel's ephemeral range (`/proc/sys/net/ipv4/ip_local_port_range`, from
    // 32768 by default): the kernel never hands one of these to another test's listener on
    // port 0, or to an outgoing connection, between this check and the job's bind; and
    // below 20000, where the launcher tests derive ports from job ids. The tests of one
    // binary take them in turn (a per-process sequence, started at a place of
    // the process's own).
    const LOW: u32 = 10_000;
    const SPAN: u32 = 10_000;
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n32 = u32::from(n.max(1));
    let start = std::process::id().wrapping_mul(7_919) % SPAN;
    for _ in 0..SPAN {
        let step = NEXT.fetch_add(n32, std::sync::atomic::Ordering::Relaxed);
        let first = (start + step) % SPAN;
        if first + n32 > SPAN {
            continue;
        }
        let free = |port: u32, ip: &str| std::net::TcpListener::bind((ip, port as u16)).is_ok();
        if (LOW + first..LOW + first + n32).all(|p| free(p, "127.0.0.1") && free(p, "0.0.0.0")) {
            return (LOW + first) as u16;
        }
    }
    panic!(
        "no {n} free ports in a row from {LOW} to {}",
        LOW + SPAN - 1
    )
}

/// The target directory (`target/`), above this test's binary.
pub(crate) fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("{e}"));
    exe.ancestors()
        .nth(3)
        .map(PathBuf::from)
        .unwrap_or_else(|| panic!("no target directory above {exe:?}"))
}
