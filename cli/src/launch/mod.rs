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
//! - `--max-restarts N`: a process that dies is started again (same rank, its next
//!   incarnation in `COLLECTIX_INCARNATION`; N restarts in all) while the others go on; the
//!   program rejoins the running job (`Process::rejoin`, which examples/elastic.rs uses).
//!   Every process gets `COLLECTIX_ON_FAILURE` (`stop`, `shrink` or `restart`) to recover
//!   accordingly.
//! - Each process is started through the launcher's own binary (`collectix exec`), which
//!   asks the kernel to SIGKILL it when the launcher dies and then becomes the program: a
//!   launcher killed without warning leaves none of its processes running.

mod spawn;
mod supervise;

use nix::sys::signal::Signal;
use spawn::{signal_all, End, Spawner};
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::atomic::AtomicUsize;
use std::sync::mpsc::channel;
use std::sync::Arc;
use std::time::{Duration, Instant};
use supervise::{supervise, Job, Stop};

/// `collectix launch`'s arguments.
#[derive(clap::Args, Debug)]
pub(crate) struct LaunchArgs {
    /// Processes on this node (else `PET_NPROC_PER_NODE`, as Kubeflow's trainer sets it).
    #[arg(long = "nproc-per-node", env = "PET_NPROC_PER_NODE")]
    nproc_per_node: usize,
    /// Nodes in the job (else `PET_NNODES`).
    #[arg(long, env = "PET_NNODES", default_value_t = 1)]
    nnodes: usize,
    /// This node's rank among the nodes (else `PET_NODE_RANK`).
    #[arg(long = "node-rank", env = "PET_NODE_RANK", default_value_t = 0)]
    node_rank: usize,
    /// Rank 0's host, where the store runs (else `PET_MASTER_ADDR`).
    #[arg(
        long = "master-addr",
        env = "PET_MASTER_ADDR",
        default_value = "127.0.0.1"
    )]
    master_addr: String,
    /// The store's port, 0 for any free one in a job of one node (else `PET_MASTER_PORT`).
    #[arg(long = "master-port", env = "PET_MASTER_PORT", default_value_t = 29500)]
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
    /// How many times in all a process that dies may be restarted (same rank, its next
    /// incarnation) while the others go on; a program rejoins with `Process::rejoin` (as
    /// examples/elastic.rs does). Beyond it, `--on-failure` applies.
    #[arg(long = "max-restarts", default_value_t = 0)]
    max_restarts: usize,
    /// Hot standbys on this node: processes that join the job (ranks after every node's
    /// processes; `WORLD_SIZE` counts them, `COLLECTIX_STANDBYS` says how many) and wait,
    /// connected, outside the world group (`Process::stand_by`). When a process dies, the
    /// others go on (as `--on-failure shrink`) and a standby takes the lost rank's place
    /// when they regrow (`COLLECTIX_ON_FAILURE=standby`; examples/elastic.rs does).
    #[arg(long = "standby", default_value_t = 0)]
    standby: usize,
    /// The program and its arguments (after `--`).
    #[arg(required = true, last = true)]
    program: Vec<String>,
}

impl LaunchArgs {
    /// A job of `nproc` processes on this node running `program`, its store at
    /// `master_addr:master_port` (0: any free port), the launcher's defaults otherwise
    /// (`collectix doctor` launches its ranks so).
    pub(crate) fn local(
        nproc: usize,
        master_addr: String,
        master_port: u16,
        program: Vec<String>,
    ) -> LaunchArgs {
        LaunchArgs {
            nproc_per_node: nproc,
            nnodes: 1,
            node_rank: 0,
            master_addr,
            master_port,
            grace: 5.0,
            on_failure: OnFailure::Stop,
            max_restarts: 0,
            standby: 0,
            program,
        }
    }
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
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("collectix launch: cannot find its own program: {e}");
            return 1;
        }
    };
    let (tx, ended) = channel();
    let spawner = Spawner {
        a,
        exe,
        port,
        secret: secret.as_deref(),
        ended: tx,
    };
    let mut job = Job {
        children: Vec::with_capacity(a.nproc_per_node + a.standby),
        ended,
        relays: Vec::with_capacity(2 * (a.nproc_per_node + a.standby)),
        spawner,
    };
    for local in 0..a.nproc_per_node + a.standby {
        match job.spawner.spawn(local, local, 0, &mut job.relays) {
            Ok(p) => job.children.push(p),
            Err(e) => {
                let rank = a.node_rank * a.nproc_per_node + local;
                eprintln!(
                    "collectix launch: cannot start {:?} as rank {rank}: {e}",
                    a.program[0]
                );
                signal_all(&job.children, Signal::SIGKILL);
                for _ in 0..job.children.len() {
                    let _ = job.ended.recv();
                }
                return 1;
            }
        }
    }
    let stopping = supervise(a, &mut job, &caught);
    // Let the relays print what the processes wrote last: they end when the pipes close,
    // which a process's own children (still running) can delay; wait at most 2 s for that.
    let deadline = Instant::now() + Duration::from_secs(2);
    while job.relays.iter().any(|r| !r.is_finished()) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let children = &job.children;
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
        Some(Stop::Restarted(why)) => {
            (0, format!("{why}; every process then exited with status 0"))
        }
    };
    eprintln!("collectix launch: {why}:");
    for p in children {
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
    let protocol = collectix::StoreProtocol::Collectix;
    collectix::TcpStoreServer::for_job(&a.master_addr, a.master_port, &security, protocol).map_err(
        |e| {
            eprintln!(
                "collectix launch: cannot serve the job's store on {}:{}: {e}",
                a.master_addr, a.master_port
            );
            1
        },
    )
}
