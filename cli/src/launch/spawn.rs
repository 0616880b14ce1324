//! Starting the job's processes (each through `collectix exec`, with torchrun's environment
//! and its output relayed with its rank in front), waiting for them, and signalling them.

use super::LaunchArgs;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::thread::JoinHandle;

/// How one process ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum End {
    Ok,
    Code(i32),
    Signal(i32),
}

impl End {
    pub(super) fn of(s: ExitStatus) -> End {
        match (s.code(), s.signal()) {
            (Some(0), _) => End::Ok,
            (Some(c), _) => End::Code(c),
            (None, Some(sig)) => End::Signal(sig),
            (None, None) => End::Code(-1),
        }
    }

    pub(super) fn text(self) -> String {
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
pub(super) fn signal_all(children: &[Proc], sig: Signal) {
    for p in children {
        // A process reaped already is skipped: its number may be another's by now.
        if p.end.is_none() && !p.reaped.load(Ordering::SeqCst) {
            let _ = kill(Pid::from_raw(-p.pid), sig);
        }
    }
}

/// A process of the job.
pub(super) struct Proc {
    pub(super) rank: usize,
    /// Its local index on this node.
    pub(super) local: usize,
    pid: i32,
    /// Set by its waiting thread the moment it has been reaped.
    reaped: Arc<AtomicBool>,
    /// How it ended (`None` while it runs).
    pub(super) end: Option<End>,
    /// Which process of its rank it is (0, one more for each restart).
    pub(super) incarnation: u32,
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

/// What starting one process of the job takes: the launcher's own program (each process
/// starts as `collectix exec`), the store's port, the secret to hand down, and where the
/// processes' ends are reported.
pub(super) struct Spawner<'a> {
    pub(super) a: &'a LaunchArgs,
    pub(super) exe: PathBuf,
    pub(super) port: u16,
    pub(super) secret: Option<&'a str>,
    pub(super) ended: Sender<(usize, End)>,
}

impl Spawner<'_> {
    /// Starts local process `local` (index `i` of the job's processes) as incarnation
    /// `incarnation` of its rank, with its output relays (pushed on `relays`).
    pub(super) fn spawn(
        &self,
        i: usize,
        local: usize,
        incarnation: u32,
        relays: &mut Vec<JoinHandle<()>>,
    ) -> std::io::Result<Proc> {
        let a = self.a;
        let active = a.nproc_per_node * a.nnodes;
        let standbys = a.standby * a.nnodes;
        let world = active + standbys;
        // The standbys come after every node's processes.
        let rank = if local < a.nproc_per_node {
            a.node_rank * a.nproc_per_node + local
        } else {
            active + a.node_rank * a.standby + (local - a.nproc_per_node)
        };
        let mut cmd = Command::new(&self.exe);
        if let Some(s) = self.secret {
            cmd.env("COLLECTIX_SECRET", s);
        }
        let policy = if a.max_restarts > 0 {
            "restart"
        } else if a.standby > 0 {
            "standby"
        } else {
            match a.on_failure {
                super::OnFailure::Stop => "stop",
                super::OnFailure::Shrink => "shrink",
            }
        };
        let mut c = cmd
            .args(["exec", "--parent", &std::process::id().to_string(), "--"])
            .args(&a.program)
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", world.to_string())
            .env("LOCAL_RANK", local.to_string())
            .env(
                "LOCAL_WORLD_SIZE",
                (a.nproc_per_node + a.standby).to_string(),
            )
            .env("COLLECTIX_STANDBYS", standbys.to_string())
            .env("GROUP_RANK", a.node_rank.to_string())
            .env("MASTER_ADDR", &a.master_addr)
            .env("MASTER_PORT", self.port.to_string())
            // Node 0's launcher serves the store, not rank 0.
            .env("TORCHELASTIC_USE_AGENT_STORE", "True")
            // In collectix's own protocol (torchrun's agent serves torch's).
            .env("COLLECTIX_STORE_PROTOCOL", "collectix")
            // Which process of its rank this is, and what the job does when one dies (a
            // program may recover accordingly: examples/elastic.rs does).
            .env("COLLECTIX_INCARNATION", incarnation.to_string())
            .env("TORCHELASTIC_RESTART_COUNT", incarnation.to_string())
            .env("COLLECTIX_ON_FAILURE", policy)
            // A process group of its own: signals reach what it starts, and a terminal's
            // Ctrl-C reaches the launcher, which forwards it.
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        if let Some(o) = c.stdout.take() {
            relays.push(relay(o, rank, false));
        }
        if let Some(e) = c.stderr.take() {
            relays.push(relay(e, rank, true));
        }
        let reaped = Arc::new(AtomicBool::new(false));
        let pid = i32::try_from(c.id()).unwrap_or(i32::MAX);
        wait_for(c, i, reaped.clone(), self.ended.clone());
        Ok(Proc {
            rank,
            local,
            pid,
            reaped,
            end: None,
            incarnation,
        })
    }
}
