//! Watching the job's processes: each end as it happens, the launcher's signals forwarded,
//! a failure stopping the others (`--on-failure stop`), survived (`shrink`), or answered by
//! restarting the rank that died (`--max-restarts`).

use super::spawn::{signal_all, End, Proc, Spawner};
use super::{LaunchArgs, OnFailure};
use nix::sys::signal::Signal;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::Receiver;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Why the job stopped.
pub(super) enum Stop {
    /// A process failed (the first to), with the text of the summary's first line.
    Failed(String),
    /// The launcher got this signal and forwarded it.
    Signal(Signal),
    /// Under `--on-failure shrink`: a process died (the first to), and the others went on.
    WentOn(String),
    /// Processes died and were restarted (`--max-restarts`); what the first restart said.
    Restarted(String),
}

/// The job's processes as the supervisor keeps them.
pub(super) struct Job<'a> {
    pub(super) children: Vec<Proc>,
    pub(super) ended: Receiver<(usize, End)>,
    pub(super) relays: Vec<JoinHandle<()>>,
    pub(super) spawner: Spawner<'a>,
}

/// Waits for every process to end, forwarding the signals the launcher catches (`caught`);
/// restarts a process that dies while `--max-restarts` allows (same rank, next incarnation);
/// after a failure beyond that (or a forwarded signal) under `--on-failure stop`, sends the
/// others SIGTERM, then SIGKILL once `--grace` has passed. Why the job stopped (`None`: every
/// process exited with 0, none was restarted).
pub(super) fn supervise(a: &LaunchArgs, job: &mut Job<'_>, caught: &AtomicUsize) -> Option<Stop> {
    let grace = Duration::from_secs_f64(a.grace.max(0.0));
    let mut stopping: Option<(Instant, Stop)> = None;
    let (mut termed, mut killed) = (false, false);
    let mut running = job.children.len();
    let mut restarts = 0usize;
    // Under `--on-failure shrink`: the first death by a signal (survived), and the first
    // exit with an error (which fails the job once every process has ended). The first
    // restart's words.
    let (mut went_on, mut errored, mut restarted): (
        Option<String>,
        Option<String>,
        Option<String>,
    ) = (None, None, None);
    while running > 0 {
        // Ends arrive in the order the processes ended.
        if let Ok((i, e)) = job.ended.recv_timeout(Duration::from_millis(20)) {
            let Some(p) = job.children.get_mut(i) else {
                continue;
            };
            p.end = Some(e);
            running -= 1;
            let why = format!("rank {} {}", p.rank, e.text());
            if e == End::Ok || stopping.is_some() {
                continue;
            }
            if restarts < a.max_restarts {
                restarts += 1;
                let (local, next) = (p.local, p.incarnation + 1);
                let said = format!(
                    "{why}; restarted it (restart {restarts} of {})",
                    a.max_restarts
                );
                eprintln!("collectix launch: {said}");
                match job.spawner.spawn(i, local, next, &mut job.relays) {
                    Ok(fresh) => {
                        job.children[i] = fresh;
                        running += 1;
                        restarted.get_or_insert(said);
                        continue;
                    }
                    Err(err) => eprintln!("collectix launch: cannot restart rank: {err}"),
                }
            }
            // With standbys, the others go on (a standby takes the lost rank's place).
            let shrink = a.on_failure == OnFailure::Shrink || a.standby > 0;
            if matches!(e, End::Signal(_)) && shrink {
                went_on.get_or_insert(why);
            } else if shrink {
                errored.get_or_insert(why);
            } else {
                stopping = Some((Instant::now(), Stop::Failed(why)));
            }
            continue;
        }
        let sig = caught.swap(0, Ordering::SeqCst);
        if sig != 0 {
            let s = Signal::try_from(sig as i32).unwrap_or(Signal::SIGTERM);
            signal_all(&job.children, s);
            if stopping.is_none() {
                stopping = Some((Instant::now(), Stop::Signal(s)));
                termed = true;
            }
        }
        if let Some((since, _)) = &stopping {
            if !termed {
                termed = true;
                signal_all(&job.children, Signal::SIGTERM);
            } else if !killed && since.elapsed() > grace {
                killed = true;
                signal_all(&job.children, Signal::SIGKILL);
            }
        }
    }
    stopping
        .map(|(_, why)| why)
        .or(errored.map(Stop::Failed))
        .or(went_on.map(Stop::WentOn))
        .or(restarted.map(Stop::Restarted))
}
