//! Chaos with real processes: `examples/elastic.rs` under `collectix launch --nproc-per-node 4
//! --on-failure shrink` (four processes on loopback; the launcher serves the store), struck
//! from outside by one random fault per job:
//! - `kill -9` of a rank;
//! - SIGSTOP, then SIGCONT after a short pause (one the job rides out: nobody is lost);
//! - SIGSTOP, then SIGCONT after the link timeout (the others declare it lost and go on);
//! - a cut link: every TCP segment of the rank's connections dropped (nftables), then let
//!   through again after the link timeout;
//! - a delayed link: a quarter of those segments dropped for a second, so that TCP
//!   retransmits them late;
//! - a rank whose call fails its checks (`--bad-call-rank`): every rank's step fails at once,
//!   and all make it again;
//! - and, after a third of the faults that cost a rank, a second `kill -9` during the
//!   recovery.
//!
//! Counted: hangs (a job not over within [`HANG`]), wrong results (a final line that is not
//! the clean run's, byte for byte), ranks that neither finished nor ended with a typed error
//! within [`BOUND`] of the fault, survivors whose first error names another rank than the
//! one the fault struck, false alarms (a pause or a delay that cost a rank), and the
//! recovery time by fault: from the fault to the last survivor's first step done on the
//! rebuilt group (p50, p99, max). Each must-be-zero count is asserted.
//!
//! The link faults need root and nftables (CI has both); without them those faults are
//! skipped and the report says so. `CHAOS_CONNECT=lazy` runs the jobs with lazy
//! connections (`COLLECTIX_CONNECT`). CI runs 12 jobs (2 of each fault). The figures in
//! `docs/errors.md` come from
//! `cargo build --release -p collectix --example elastic && CHAOS_PROCESSES=1000 cargo test --release -p collectix-cli --test chaos -- --nocapture`.

mod common;
use common::example;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const RANKS: usize = 4;
const STEPS: &str = "40";
const STEP_MS: &str = "10";
/// `COLLECTIX_LINK_TIMEOUT`: a rank silent this long is lost (heartbeats every 150 ms).
const LINK_TIMEOUT: Duration = Duration::from_millis(1500);
/// How long after the fault (its end, for a pause or a cut) every rank must have finished or
/// ended with a typed error.
const BOUND: Duration = Duration::from_secs(20);
/// A job not over this long after its start is a hang.
const HANG: Duration = Duration::from_secs(60);

/// splitmix64.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    Kill,
    PauseShort,
    PauseLong,
    CutLink,
    DelayLink,
    BadCall,
}

const FAULTS: [Fault; 6] = [
    Fault::Kill,
    Fault::PauseShort,
    Fault::PauseLong,
    Fault::CutLink,
    Fault::DelayLink,
    Fault::BadCall,
];

impl Fault {
    /// Whether the fault costs the victim its place (the others go on without it).
    fn loses_a_rank(self) -> bool {
        matches!(self, Fault::Kill | Fault::PauseLong | Fault::CutLink)
    }
    fn needs_nft(self) -> bool {
        matches!(self, Fault::CutLink | Fault::DelayLink)
    }
}

#[derive(Clone, Copy, Debug)]
struct Trial {
    fault: Fault,
    victim: usize,
    /// When the fault strikes, after every rank said its pid.
    after_ms: u64,
    /// A second rank killed during the recovery, this many microseconds after the first
    /// survivor said its step failed.
    second: Option<(usize, u64)>,
}

impl Trial {
    fn random(rng: &mut Rng, fault: Fault) -> Trial {
        let victim = rng.below(RANKS as u64) as usize;
        let second = (fault.loses_a_rank() && rng.below(3) == 0).then(|| {
            let v = (victim + 1 + rng.below(RANKS as u64 - 1) as usize) % RANKS;
            (v, rng.below(3000))
        });
        Trial {
            fault,
            victim,
            after_ms: 60 + rng.below(220),
            second,
        }
    }
}

/// A line a rank printed (through the launcher, which prefixes `[rank R] `), and when.
struct Line {
    at: Instant,
    rank: usize,
    text: String,
}

fn parse(l: &str) -> Option<(usize, String)> {
    let rest = l.strip_prefix("[rank ")?;
    let (r, text) = rest.split_once("] ")?;
    Some((r.parse().ok()?, text.to_string()))
}

/// A running job: the launcher, and the lines its ranks print.
struct Job {
    launcher: Child,
    lines: mpsc::Receiver<Line>,
    seen: Vec<Line>,
    pids: BTreeMap<usize, i32>,
}

impl Job {
    fn start(elastic: &Path, extra: &[String]) -> Job {
        let mut c = Command::new(env!("CARGO_BIN_EXE_collectix"));
        c.args([
            "launch",
            "--nproc-per-node",
            "4",
            "--master-port",
            "0",
            "--on-failure",
            "shrink",
            "--",
        ])
        .arg(elastic)
        .args(["--steps", STEPS, "--step-ms", STEP_MS])
        .args(extra)
        .env(
            "COLLECTIX_LINK_TIMEOUT",
            format!("{}", LINK_TIMEOUT.as_secs_f64()),
        )
        .env_remove("RUST_LOG")
        .env(
            "COLLECTIX_CONNECT",
            std::env::var("CHAOS_CONNECT").unwrap_or_else(|_| "eager".into()),
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
        let mut launcher = c.spawn().unwrap_or_else(|e| panic!("cannot launch: {e}"));
        let out = launcher
            .stdout
            .take()
            .unwrap_or_else(|| panic!("no stdout"));
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                if let Some((rank, text)) = parse(&l) {
                    let _ = tx.send(Line {
                        at: Instant::now(),
                        rank,
                        text,
                    });
                }
            }
        });
        Job {
            launcher,
            lines,
            seen: Vec::new(),
            pids: BTreeMap::new(),
        }
    }

    /// Takes lines until `until` holds for one or `deadline` passes; whether one did.
    fn wait_for(&mut self, deadline: Instant, until: impl Fn(&Line) -> bool) -> bool {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    if let Some(pid) = l.text.strip_prefix(&format!("rank {}: pid ", l.rank)) {
                        if let Ok(p) = pid.trim().parse() {
                            self.pids.insert(l.rank, p);
                        }
                    }
                    let hit = until(&l);
                    self.seen.push(l);
                    if hit {
                        return true;
                    }
                }
                Err(_) => return false,
            }
        }
    }

    /// Waits for the launcher to end by `deadline`; `false` (and everything killed) if it
    /// did not.
    fn finish(&mut self, deadline: Instant) -> bool {
        self.finish_by(deadline, true)
    }

    /// [`finish`](Self::finish), killing what is left at the deadline only if `kill`.
    fn finish_by(&mut self, deadline: Instant, kill: bool) -> bool {
        loop {
            if let Ok(Some(_)) = self.launcher.try_wait() {
                // The last lines.
                while self.wait_for(Instant::now() + Duration::from_millis(200), |_| false) {}
                return true;
            }
            if Instant::now() >= deadline {
                if kill {
                    self.kill_all();
                }
                return false;
            }
            while let Ok(l) = self.lines.try_recv() {
                self.seen.push(l);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// [`finish`](Self::finish); if the job hangs, the stacks of the processes still
    /// running (with gdb, where there is one) go to `why` before they are killed.
    fn finish_or_diagnose(&mut self, deadline: Instant, why: &mut String) -> bool {
        if self.finish_by(deadline, false) {
            return true;
        }
        let mut pids: Vec<(String, i32)> = self
            .pids
            .iter()
            .map(|(r, p)| (format!("rank {r}"), *p))
            .collect();
        pids.push(("the launcher".into(), self.launcher.id() as i32));
        for (who, pid) in pids {
            if kill(Pid::from_raw(pid), None).is_err() {
                continue;
            }
            let stacks = Command::new("gdb")
                .args([
                    "-p",
                    &pid.to_string(),
                    "-batch",
                    "-ex",
                    "thread apply all bt",
                ])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_else(|e| format!("no gdb: {e}"));
            let frames: Vec<&str> = stacks
                .lines()
                .filter(|l| {
                    l.starts_with("Thread ") || l.contains("collectix") || l.contains("elastic")
                })
                .collect();
            why.push_str(&format!(
                "--- {who} (pid {pid}) is still running:\n{}\n",
                frames.join("\n")
            ));
        }
        self.kill_all();
        false
    }

    fn kill_all(&mut self) {
        for &p in self.pids.values() {
            let _ = kill(Pid::from_raw(p), Signal::SIGCONT);
            let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
        }
        let _ = self.launcher.kill();
        let _ = self.launcher.wait();
    }

    fn signal(&self, rank: usize, s: Signal) {
        if let Some(&p) = self.pids.get(&rank) {
            let _ = kill(Pid::from_raw(p), s);
        }
    }

    /// Each rank's final line, by rank.
    fn finals(&self) -> BTreeMap<usize, String> {
        self.seen
            .iter()
            .filter(|l| l.text.contains(": final loss "))
            .map(|l| (l.rank, l.text.clone()))
            .collect()
    }

    /// Every line, with its time from `t0` (negative: before it).
    fn transcript(&self, t0: Instant) -> String {
        self.seen
            .iter()
            .map(|l| {
                let ms = if l.at >= t0 {
                    (l.at - t0).as_secs_f64() * 1e3
                } else {
                    -(t0 - l.at).as_secs_f64() * 1e3
                };
                format!("{ms:9.1} ms [rank {}] {}\n", l.rank, l.text)
            })
            .collect()
    }

    /// Lines of rank `r` that contain `what`.
    fn said(&self, r: usize, what: &str) -> bool {
        self.seen
            .iter()
            .any(|l| l.rank == r && l.text.contains(what))
    }
}

/// A table of nftables rules dropping segments of one process's TCP connections on
/// loopback; deleted when dropped.
struct Cut {
    table: String,
}

impl Cut {
    /// Whether this machine lets the test use nftables (`nft` present, and allowed: root).
    fn available() -> bool {
        Command::new("nft")
            .args(["list", "tables"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// Drops `percent` % of the TCP segments from and to the local ports of `pid`'s
    /// sockets (its listener, its links, its store connection), in the output hook (every
    /// loopback segment passes it once).
    fn ports(pid: i32, percent: u32) -> Option<Cut> {
        let out = Command::new("ss").args(["-tnpaH"]).output().ok()?;
        let text = String::from_utf8_lossy(&out.stdout);
        let tag = format!("pid={pid},");
        let mut ports: Vec<String> = text
            .lines()
            .filter(|l| l.contains(&tag))
            .filter_map(|l| l.split_whitespace().nth(3))
            .filter_map(|local| local.rsplit_once(':').map(|(_, p)| p.to_string()))
            .collect();
        ports.sort();
        ports.dedup();
        if ports.is_empty() {
            return None;
        }
        let set = format!("{{ {} }}", ports.join(", "));
        let table = format!("cxchaos{pid}");
        let how = if percent >= 100 {
            "drop".to_string()
        } else {
            format!("numgen random mod 100 < {percent} drop")
        };
        let nft = |args: &[&str]| {
            Command::new("nft")
                .args(args)
                .status()
                .is_ok_and(|s| s.success())
        };
        let ok = nft(&["add", "table", "inet", &table])
            && nft(&[
                "add",
                "chain",
                "inet",
                &table,
                "out",
                "{ type filter hook output priority 0; }",
            ])
            && ["sport", "dport"].iter().all(|way| {
                let rule = format!("tcp {way} {set} {how}");
                nft(&["add", "rule", "inet", &table, "out", &rule])
            });
        let cut = Cut { table };
        ok.then_some(cut)
    }
}

impl Drop for Cut {
    fn drop(&mut self) {
        let _ = Command::new("nft")
            .args(["delete", "table", "inet", &self.table])
            .status();
    }
}

/// What one job gave.
#[derive(Default)]
struct Outcome {
    hang: bool,
    /// What the ranks printed, for a job that went wrong.
    lines: String,
    wrong: Vec<String>,
    unbounded: Vec<String>,
    false_alarm: bool,
    /// Survivors whose first error after the fault did not name the rank the fault struck.
    blame: Vec<String>,
    recovery: Option<Duration>,
}

fn run(elastic: &Path, clean: &BTreeMap<usize, String>, t: Trial) -> Outcome {
    let mut o = Outcome::default();
    let extra: Vec<String> = match t.fault {
        Fault::BadCall => vec![
            "--bad-call-rank".into(),
            t.victim.to_string(),
            "--bad-call-at-step".into(),
            (5 + t.after_ms % 20).to_string(),
        ],
        _ => Vec::new(),
    };
    let start = Instant::now();
    let mut job = Job::start(elastic, &extra);
    let pids_by = start + Duration::from_secs(30);
    while job.pids.len() < RANKS {
        if !job.wait_for(pids_by, |l| l.text.contains(": pid ")) {
            job.kill_all();
            o.hang = true;
            return o;
        }
    }
    std::thread::sleep(Duration::from_millis(t.after_ms));
    let fault_at = Instant::now();
    match t.fault {
        Fault::Kill => job.signal(t.victim, Signal::SIGKILL),
        Fault::PauseShort | Fault::PauseLong => {
            job.signal(t.victim, Signal::SIGSTOP);
            let pause = if t.fault == Fault::PauseShort {
                Duration::from_millis(300)
            } else {
                LINK_TIMEOUT + Duration::from_millis(1000)
            };
            // The lines keep coming while it pauses (a second fault may be due).
            let until = Instant::now() + pause;
            second_fault(&mut job, &t, until);
            std::thread::sleep(until.saturating_duration_since(Instant::now()));
            job.signal(t.victim, Signal::SIGCONT);
        }
        Fault::CutLink | Fault::DelayLink => {
            let pid = job.pids.get(&t.victim).copied().unwrap_or(0);
            let (percent, hold) = if t.fault == Fault::CutLink {
                (100, LINK_TIMEOUT + Duration::from_millis(1000))
            } else {
                (25, Duration::from_millis(1000))
            };
            let cut = Cut::ports(pid, percent);
            if cut.is_none() {
                o.wrong.push(format!("{t:?}: could not cut the links"));
            }
            let until = Instant::now() + hold;
            second_fault(&mut job, &t, until);
            std::thread::sleep(until.saturating_duration_since(Instant::now()));
            drop(cut);
        }
        Fault::BadCall => {}
    }
    if matches!(t.fault, Fault::Kill) {
        second_fault(&mut job, &t, Instant::now() + Duration::from_secs(10));
    }
    let fault_end = Instant::now();
    if !job.finish_or_diagnose(start + HANG, &mut o.lines) {
        o.hang = true;
        o.lines = format!("{}{}", job.transcript(fault_at), o.lines);
        return o;
    }
    // Who was lost: the victim of a fault that costs a rank, the second victim, and (a
    // false alarm) anyone the others went on without.
    let finals = job.finals();
    for (r, line) in &finals {
        if clean.get(r) != Some(line) {
            o.wrong.push(format!(
                "{t:?}: rank {r} ended with {line:?}, not {:?}",
                clean.get(r)
            ));
        }
    }
    let second = t.second.map(|(v, _)| v);
    for r in 0..RANKS {
        if finals.contains_key(&r) {
            continue;
        }
        let killed = (t.fault == Fault::Kill && r == t.victim) || Some(r) == second;
        let gave_up = job.said(r, "cannot go on: ");
        if !killed && !gave_up {
            o.unbounded.push(format!(
                "{t:?}: rank {r} neither finished nor ended with an error"
            ));
        }
        if !killed && !t.fault.loses_a_rank() {
            o.false_alarm = true;
        }
    }
    let ended = job.seen.iter().map(|l| l.at).max().unwrap_or(fault_end);
    if ended.saturating_duration_since(fault_end) > BOUND {
        o.unbounded.push(format!(
            "{t:?}: the last rank ended {:?} after the fault",
            ended - fault_end
        ));
    }
    if t.fault.loses_a_rank() {
        // Each survivor's first error names the rank the fault struck.
        let named = format!("peer rank {} was lost", t.victim);
        for r in (0..RANKS).filter(|r| finals.contains_key(r)) {
            let first = job
                .seen
                .iter()
                .find(|l| l.rank == r && l.text.contains(" failed ("));
            if let Some(l) = first {
                if !l.text.contains(&named) {
                    o.blame.push(format!("{t:?}: rank {r} said {:?}", l.text));
                }
            }
        }
    }
    if t.fault == Fault::BadCall {
        for r in 0..RANKS {
            if !job.said(r, "the group goes on, making it again") {
                o.wrong
                    .push(format!("{t:?}: rank {r} did not make the step again"));
            }
        }
        return o;
    }
    // Recovery: the fault to the last survivor's first step on the rebuilt group (the last
    // rebuild, after a second fault).
    let rebuilt: Vec<Instant> = (0..RANKS)
        .filter(|r| finals.contains_key(r))
        .filter_map(|r| {
            job.seen
                .iter()
                .filter(|l| l.rank == r && l.text.contains("done on the rebuilt group"))
                .map(|l| l.at)
                .max()
        })
        .collect();
    if t.fault.loses_a_rank() || o.false_alarm {
        o.recovery = rebuilt.into_iter().max().map(|at| at - fault_at);
    }
    o
}

/// After a fault that costs a rank, with a second fault planned: waits (until `until` at
/// most) for a survivor to say its step failed, then kills the second victim.
fn second_fault(job: &mut Job, t: &Trial, until: Instant) {
    let Some((v, delay_us)) = t.second else {
        return;
    };
    let victim = t.victim;
    if job.wait_for(until, |l| {
        l.rank != victim && l.text.contains("failed (") && l.text.contains("agreeing")
    }) {
        std::thread::sleep(Duration::from_micros(delay_us));
        job.signal(v, Signal::SIGKILL);
    } else if t.fault == Fault::Kill {
        job.signal(v, Signal::SIGKILL);
    }
}

fn count(var: &str, default: usize) -> usize {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn pct(v: &mut [Duration], p: f64) -> String {
    if v.is_empty() {
        return "-".into();
    }
    v.sort();
    let i = ((v.len() - 1) as f64 * p).round() as usize;
    format!("{:.0} ms", v[i].as_secs_f64() * 1e3)
}

#[test]
fn chaos_with_processes() {
    let elastic = example("elastic");
    // The clean run's final lines.
    let mut job = Job::start(&elastic, &[]);
    assert!(job.finish(Instant::now() + HANG), "the clean run hung");
    let clean = job.finals();
    assert_eq!(clean.len(), RANKS, "the clean run: {:?}", clean);

    let nft = Cut::available();
    // `CHAOS_FAULTS=CutLink,Kill` runs only those.
    let only = std::env::var("CHAOS_FAULTS").unwrap_or_default();
    let faults: Vec<Fault> = FAULTS
        .iter()
        .copied()
        .filter(|f| nft || !f.needs_nft())
        .filter(|f| only.is_empty() || only.split(',').any(|o| o == format!("{f:?}")))
        .collect();
    // One trial per fault by default; two with `COLLECTIX_LONG_TESTS=1` (as `.ci/run` runs).
    let long = std::env::var_os("COLLECTIX_LONG_TESTS").is_some_and(|v| v == "1");
    let n = count("CHAOS_PROCESSES", (1 + usize::from(long)) * faults.len());
    let mut rng = Rng(count("CHAOS_SEED", 11) as u64);
    let (mut hangs, mut wrong, mut unbounded) = (0, Vec::new(), Vec::new());
    let mut blame = Vec::new();
    let mut by_fault: BTreeMap<Fault, (usize, usize, usize, Vec<Duration>)> = BTreeMap::new();
    let started = Instant::now();
    for i in 0..n {
        let t = Trial::random(&mut rng, faults[i % faults.len()]);
        let o = run(&elastic, &clean, t);
        let e = by_fault.entry(t.fault).or_default();
        e.0 += 1;
        e.1 += usize::from(t.second.is_some());
        e.2 += usize::from(o.false_alarm);
        e.3.extend(o.recovery);
        hangs += usize::from(o.hang);
        wrong.extend(o.wrong);
        unbounded.extend(o.unbounded);
        blame.extend(o.blame);
        if o.hang {
            eprintln!(
                "chaos: {t:?} hung; what the ranks printed (from the fault):\n{}",
                o.lines
            );
            break;
        }
    }
    println!(
        "chaos with processes: {n} faults in {:.0} s; hangs {hangs}, wrong results {}, unbounded {}, a survivor blaming another rank than the one struck {}{}",
        started.elapsed().as_secs_f64(),
        wrong.len(),
        unbounded.len(),
        blame.len(),
        if nft {
            ""
        } else {
            " (link faults skipped: they need root and nftables)"
        }
    );
    println!("| fault | faults | with a second kill | false alarms | recovery p50 / p99 / max |");
    println!("|---|---|---|---|---|");
    for (f, (k, seconds, alarms, rec)) in &mut by_fault {
        println!(
            "| {f:?} | {k} | {seconds} | {alarms} | {} / {} / {} |",
            pct(rec, 0.5),
            pct(rec, 0.99),
            pct(rec, 1.0)
        );
    }
    assert_eq!(hangs, 0, "hangs");
    assert!(wrong.is_empty(), "wrong results:\n{}", wrong.join("\n"));
    assert!(unbounded.is_empty(), "unbounded:\n{}", unbounded.join("\n"));
    assert!(blame.is_empty(), "blame:\n{}", blame.join("\n"));
}
