//! `collectix launch`: starts the processes of a job on this host with torchrun's
//! environment, in the spirit of torchrun and mpirun.
//!
//! - Each process gets `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `GROUP_RANK`
//!   (the node's rank), `MASTER_ADDR` and `MASTER_PORT` (what `JobConfig::from_env` reads).
//! - The launcher of node 0 serves the job's store on `MASTER_ADDR:MASTER_PORT` and tells
//!   the processes so (`TORCHELASTIC_USE_AGENT_STORE=True`, as torchrun's agent does): the
//!   store outlives any rank, so the survivors of a lost rank 0 can still agree.
//! - The job's secret: a fresh one (32 random bytes, in hex) in `COLLECTIX_SECRET`, unless
//!   the launcher's own environment has `COLLECTIX_SECRET` or `COLLECTIX_SECRET_FILE`, which
//!   the processes then inherit. A job of several nodes needs the same secret on every node:
//!   the launcher of each must be given it (it cannot make one the others would know).
//! - Every line a process writes is printed with its rank in front (`[rank 3] …`), on the
//!   launcher's stdout or stderr as the process wrote it.
//! - SIGINT and SIGTERM sent to the launcher are forwarded to every process (each leads a
//!   process group of its own, so what it started gets them too).
//! - When a process exits with an error or is killed by a signal, the others are sent
//!   SIGTERM, then SIGKILL after a grace period (with `--on-failure shrink`, a process
//!   killed by a signal is survived instead: the others go on, and the launcher exits 0 if
//!   none of them exits with an error), and the launcher exits non-zero with a
//!   summary that names the process that failed first (each process has a thread of its own
//!   waiting for it, so ends are seen in the order they happen), then how each ended. A
//!   forwarded SIGINT or SIGTERM that every process answers by exiting with status 0 is a
//!   clean shutdown: the launcher exits 0.
//! - Each process is started through the launcher's own binary (`collectix exec`), which
//!   asks the kernel to SIGKILL it when the launcher dies and then becomes the program: a
//!   launcher killed without warning leaves none of its processes running.

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `collectix launch`'s arguments.
#[derive(clap::Args, Debug)]
pub(crate) struct LaunchArgs {
    /// Processes on this node.
    #[arg(long = "nproc-per-node")]
    nproc_per_node: usize,
    /// Nodes in the job.
    #[arg(long, default_value_t = 1)]
    nnodes: usize,
    /// This node's rank among the nodes.
    #[arg(long = "node-rank", default_value_t = 0)]
    node_rank: usize,
    /// Rank 0's host (where the store runs).
    #[arg(long = "master-addr", default_value = "127.0.0.1")]
    master_addr: String,
    /// The store's port (0: any free one, for a job of one node).
    #[arg(long = "master-port", default_value_t = 29500)]
    master_port: u16,
    /// Seconds the other processes get, after a failure or a forwarded signal, before they
    /// are killed.
    #[arg(long, default_value_t = 5.0)]
    grace: f64,
    /// What a process that dies does to the job: `stop` stops the others (torchrun's way);
    /// `shrink` lets them go on without it (a program that shrinks its groups on a failure,
    /// as examples/elastic.rs does, finishes with one rank fewer).
    #[arg(long = "on-failure", value_enum, default_value_t = OnFailure::Stop)]
    on_failure: OnFailure,
    /// The program and its arguments (after `--`).
    #[arg(required = true, last = true)]
    program: Vec<String>,
}

/// What a process that dies does to the job (`--on-failure`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OnFailure {
    /// Stop every other process (SIGTERM, then SIGKILL after `--grace`).
    Stop,
    /// The others go on. A process killed by a signal (killed, crashed) is survived; one
    /// that exits with a non-zero status still fails the job, at its end.
    Shrink,
}

/// How one process ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum End {
    Ok,
    Code(i32),
    Signal(i32),
}

impl End {
    fn of(s: ExitStatus) -> End {
        match (s.code(), s.signal()) {
            (Some(0), _) => End::Ok,
            (Some(c), _) => End::Code(c),
            (None, Some(sig)) => End::Signal(sig),
            (None, None) => End::Code(-1),
        }
    }

    fn text(self) -> String {
        match self {
            End::Ok => "exited with status 0".into(),
            End::Code(c) => format!("exited with status {c}"),
            End::Signal(s) => {
                let name = Signal::try_from(s).map_or_else(|_| format!("{s}"), |n| n.to_string());
                format!("was killed by signal {s} ({name})")
            }
        }
    }
}

/// Copies each line of `from` to the launcher's stdout (or stderr), prefixed with the rank.
fn relay(
    from: impl std::io::Read + Send + 'static,
    rank: usize,
    to_stderr: bool,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        for line in BufReader::new(from).split(b'\n').map_while(Result::ok) {
            let mut out = Vec::with_capacity(line.len() + 12);
            out.extend_from_slice(format!("[rank {rank}] ").as_bytes());
            out.extend_from_slice(&line);
            out.push(b'\n');
            let _ = if to_stderr {
                std::io::stderr().lock().write_all(&out)
            } else {
                std::io::stdout().lock().write_all(&out)
            };
        }
    })
}

/// Sends `sig` to the process group of every process still running (each process leads a
/// group of its own, so what it started gets the signal too).
fn signal_all(children: &[Proc], sig: Signal) {
    for p in children {
        // A process reaped already is skipped: its number may be another's by now.
        if p.end.is_none() && !p.reaped.load(Ordering::SeqCst) {
            let _ = kill(Pid::from_raw(-p.pid), sig);
        }
    }
}

/// A process of the job.
struct Proc {
    rank: usize,
    pid: i32,
    /// Set by its waiting thread the moment it has been reaped.
    reaped: Arc<AtomicBool>,
    /// How it ended (`None` while it runs).
    end: Option<End>,
}

/// Why the job stopped.
enum Stop {
    /// A process failed (the first to), with the text of the summary's first line.
    Failed(String),
    /// The launcher got this signal and forwarded it.
    Signal(Signal),
    /// Under `--on-failure shrink`: a process died (the first to), and the others went on.
    WentOn(String),
}

/// A thread that waits for `child` (index `i` of the job's processes) and reports how it
/// ended as soon as it does.
fn wait_for(mut child: Child, i: usize, reaped: Arc<AtomicBool>, tx: Sender<(usize, End)>) {
    std::thread::spawn(move || {
        let end = child.wait().map_or(End::Code(-1), End::of);
        reaped.store(true, Ordering::SeqCst);
        let _ = tx.send((i, end));
    });
}

/// Runs the job; the launcher's exit code.
pub(crate) fn run(a: &LaunchArgs) -> u8 {
    if a.nproc_per_node == 0 || a.nnodes == 0 || a.node_rank >= a.nnodes {
        eprintln!(
            "collectix launch: --nproc-per-node and --nnodes must be positive, and --node-rank below --nnodes"
        );
        return 2;
    }
    let secret = match job_secret(a) {
        Ok(s) => s,
        Err(code) => return code,
    };
    // SIGINT and SIGTERM to the launcher: remembered, then forwarded.
    let caught = Arc::new(AtomicUsize::new(0));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        let c = caught.clone();
        // The handler only stores the signal's number in an atomic (async-signal-safe); it
        // fails only for signals that cannot be caught, which these are not.
        let _ = signal_hook::flag::register_usize(sig, c, sig as usize);
    }
    // The job's store, served by the launcher of node 0 (as torchrun's agent serves it), so
    // that it outlives any rank: the survivors of a lost rank 0 still agree through it.
    let store = if a.node_rank == 0 {
        match serve_store(a, secret.as_deref()) {
            Ok(s) => Some(s),
            Err(code) => return code,
        }
    } else if a.master_port == 0 {
        eprintln!("collectix launch: --master-port 0 (any free port) is for a job of one node");
        return 2;
    } else {
        None
    };
    let port = store
        .as_ref()
        .map_or(a.master_port, |s| s.local_addr().port());
    let (mut children, ended, relays) = match start_all(a, port, secret.as_deref()) {
        Ok(started) => started,
        Err(code) => return code,
    };
    let stopping = supervise(a, &mut children, &ended, &caught);
    // Let the relays print what the processes wrote last: they end when the pipes close,
    // which a process's own children (still running) can delay; wait at most 2 s for that.
    let deadline = Instant::now() + Duration::from_secs(2);
    while relays.iter().any(|r| !r.is_finished()) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let clean = children.iter().all(|p| p.end == Some(End::Ok));
    let (code, why) = match stopping {
        None => return 0,
        Some(Stop::Signal(s)) if clean => {
            (0, format!("the launcher got {s}; the job stopped cleanly"))
        }
        Some(Stop::Signal(s)) => (1, format!("the launcher got {s}; the job stopped")),
        Some(Stop::Failed(why)) => (1, format!("{why}; the job stopped")),
        Some(Stop::WentOn(why)) => (
            0,
            format!("{why}; the job went on without it (--on-failure shrink)"),
        ),
    };
    eprintln!("collectix launch: {why}:");
    for p in &children {
        let how = p.end.map_or("did not end".into(), End::text);
        eprintln!("  rank {} {how}", p.rank);
    }
    code
}

/// `collectix exec`: how the launcher starts each process. Asks the kernel to SIGKILL this
/// process when its parent (the launcher, `parent`) dies, then becomes `program` (the
/// request survives the exec). Returns only when that fails.
pub(crate) fn exec(parent: u32, program: &[String]) -> u8 {
    let Some((first, rest)) = program.split_first() else {
        eprintln!("collectix exec: no program");
        return 2;
    };
    if let Err(e) = nix::sys::prctl::set_pdeathsig(Signal::SIGKILL) {
        eprintln!("collectix exec: cannot ask to die with the launcher: {e}");
        return 1;
    }
    // The launcher may have died before the request was made: then nobody would send it.
    if u32::try_from(nix::unistd::getppid().as_raw()).ok() != Some(parent) {
        return 1;
    }
    let e = Command::new(first).args(rest).exec();
    eprintln!("collectix launch: cannot start {first:?}: {e}");
    127
}

/// The secret to give the processes: `None` where the launcher's environment has one (which
/// they inherit), else a fresh one for a job of one node; the exit code where there is none.
fn job_secret(a: &LaunchArgs) -> Result<Option<String>, u8> {
    let given = ["COLLECTIX_SECRET", "COLLECTIX_SECRET_FILE"]
        .iter()
        .any(|k| std::env::var(k).is_ok_and(|v| !v.trim().is_empty()));
    match (given, a.nnodes) {
        (true, _) => Ok(None),
        (false, 1) => match collectix::Secret::random_text() {
            Ok(s) => Ok(Some(s)),
            Err(e) => {
                eprintln!("collectix launch: cannot make the job's secret: {e}");
                Err(1)
            }
        },
        (false, _) => {
            eprintln!(
                "collectix launch: a job of {} nodes needs one secret on every node: export the same \
                 COLLECTIX_SECRET (e.g. `openssl rand -hex 32`) or COLLECTIX_SECRET_FILE before \
                 launching on each",
                a.nnodes
            );
            Err(2)
        }
    }
}

/// Serves the job's store on `--master-addr`:`--master-port`, with the job's secret (the one
/// made for the processes, or the one in the launcher's environment).
fn serve_store(a: &LaunchArgs, made: Option<&str>) -> Result<collectix::TcpStoreServer, u8> {
    let env = |k: &str| match (k, made) {
        ("COLLECTIX_SECRET", Some(s)) => Some(s.to_string()),
        _ => std::env::var(k).ok(),
    };
    let security = collectix::Security::resolve(&env).map_err(|e| {
        eprintln!("collectix launch: the job's secret: {e}");
        2
    })?;
    collectix::TcpStoreServer::for_job(&a.master_addr, a.master_port, &security).map_err(|e| {
        eprintln!(
            "collectix launch: cannot serve the job's store on {}:{}: {e}",
            a.master_addr, a.master_port
        );
        1
    })
}

/// Starts this node's processes, each with a relay for its stdout and one for its stderr;
/// where one cannot start, kills those started and gives the exit code.
fn start_all(a: &LaunchArgs, port: u16, secret: Option<&str>) -> Result<Started, u8> {
    let world = a.nproc_per_node * a.nnodes;
    let mut children: Vec<Proc> = Vec::with_capacity(a.nproc_per_node);
    let mut relays = Vec::with_capacity(2 * a.nproc_per_node);
    let (tx, ended) = channel();
    let me = std::env::current_exe().map_err(|e| {
        eprintln!("collectix launch: cannot find its own program: {e}");
        1
    })?;
    for local in 0..a.nproc_per_node {
        let rank = a.node_rank * a.nproc_per_node + local;
        let mut cmd = Command::new(&me);
        if let Some(s) = secret {
            cmd.env("COLLECTIX_SECRET", s);
        }
        let spawned = cmd
            .args(["exec", "--parent", &std::process::id().to_string(), "--"])
            .args(&a.program)
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", world.to_string())
            .env("LOCAL_RANK", local.to_string())
            .env("LOCAL_WORLD_SIZE", a.nproc_per_node.to_string())
            .env("GROUP_RANK", a.node_rank.to_string())
            .env("MASTER_ADDR", &a.master_addr)
            .env("MASTER_PORT", port.to_string())
            // Node 0's launcher serves the store, not rank 0.
            .env("TORCHELASTIC_USE_AGENT_STORE", "True")
            // A process group of its own: signals reach what it starts, and a terminal's
            // Ctrl-C reaches the launcher, which forwards it.
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn();
        match spawned {
            Ok(mut c) => {
                if let Some(o) = c.stdout.take() {
                    relays.push(relay(o, rank, false));
                }
                if let Some(e) = c.stderr.take() {
                    relays.push(relay(e, rank, true));
                }
                let reaped = Arc::new(AtomicBool::new(false));
                let pid = i32::try_from(c.id()).unwrap_or(i32::MAX);
                wait_for(c, children.len(), reaped.clone(), tx.clone());
                children.push(Proc {
                    rank,
                    pid,
                    reaped,
                    end: None,
                });
            }
            Err(e) => {
                eprintln!(
                    "collectix launch: cannot start {:?} as rank {rank}: {e}",
                    a.program[0]
                );
                signal_all(&children, Signal::SIGKILL);
                for _ in 0..children.len() {
                    let _ = ended.recv();
                }
                return Err(1);
            }
        }
    }
    Ok((children, ended, relays))
}

/// The started processes, the channel their ends arrive on, and their output relays.
type Started = (
    Vec<Proc>,
    Receiver<(usize, End)>,
    Vec<std::thread::JoinHandle<()>>,
);

/// Waits for every process to end, forwarding the signals the launcher catches (`caught`);
/// after the first failure or forwarded signal, sends the others SIGTERM, then SIGKILL once
/// `--grace` has passed. Why the job stopped (`None`: every process exited with 0).
fn supervise(
    a: &LaunchArgs,
    children: &mut [Proc],
    ended: &Receiver<(usize, End)>,
    caught: &AtomicUsize,
) -> Option<Stop> {
    let grace = Duration::from_secs_f64(a.grace.max(0.0));
    let mut stopping: Option<(Instant, Stop)> = None;
    let (mut termed, mut killed) = (false, false);
    let mut running = children.len();
    // Under `--on-failure shrink`: the first death by a signal (survived), and the first
    // exit with an error (which fails the job once every process has ended).
    let (mut went_on, mut errored): (Option<String>, Option<String>) = (None, None);
    while running > 0 {
        // Ends arrive in the order the processes ended.
        if let Ok((i, e)) = ended.recv_timeout(Duration::from_millis(20)) {
            if let Some(p) = children.get_mut(i) {
                p.end = Some(e);
                running -= 1;
                let why = || format!("rank {} {}", p.rank, e.text());
                let survivable = matches!(e, End::Signal(_)) && a.on_failure == OnFailure::Shrink;
                if e == End::Ok || stopping.is_some() {
                } else if survivable {
                    went_on.get_or_insert_with(why);
                } else if a.on_failure == OnFailure::Shrink {
                    errored.get_or_insert_with(why);
                } else {
                    stopping = Some((Instant::now(), Stop::Failed(why())));
                }
            }
            continue;
        }
        let sig = caught.swap(0, Ordering::SeqCst);
        if sig != 0 {
            let s = Signal::try_from(sig as i32).unwrap_or(Signal::SIGTERM);
            signal_all(children, s);
            if stopping.is_none() {
                stopping = Some((Instant::now(), Stop::Signal(s)));
                termed = true;
            }
        }
        if let Some((since, _)) = &stopping {
            if !termed {
                termed = true;
                signal_all(children, Signal::SIGTERM);
            } else if !killed && since.elapsed() > grace {
                killed = true;
                signal_all(children, Signal::SIGKILL);
            }
        }
    }
    stopping
        .map(|(_, why)| why)
        .or(errored.map(Stop::Failed))
        .or(went_on.map(Stop::WentOn))
}
