//! The ranks this process drives, and running a step on each of them: every rank of an
//! in-process world on a thread of its own (bound to a core when asked), or this process's
//! own rank of a job over TCP.

use super::args::{Args, Backend, Bind, Bodies, Transport};
use super::cell::Cell;
use super::measure::{measure, Measured, Waits};
use collectix::{CallOptions, Communicator, DeviceBackend, Policy, Result, World};
use std::future::Future;
use std::sync::Arc;

/// The ranks this process drives: every rank of an in-process world, or its own rank of a
/// job over TCP.
pub(super) enum Ranks {
    Local(Box<World>, Vec<Communicator>, DeviceBackend),
    Tcp(Box<collectix::Process>, Communicator),
}

impl Ranks {
    /// The world of `--transport` (`--ranks` ranks in this process, or this process's rank
    /// of the job its environment describes), its communicators using `backend` for device
    /// tensors.
    pub(super) fn start(a: &Args, backend: DeviceBackend) -> Result<Ranks> {
        Ok(match a.transport {
            Transport::Local => {
                let world = World::local(a.ranks.max(1))?;
                let comms: Vec<Communicator> = world
                    .communicators()
                    .iter()
                    .map(|c| c.with_device_backend(backend))
                    .collect();
                Ranks::Local(Box::new(world), comms, backend)
            }
            Transport::Tcp | Transport::Shm => {
                let p = collectix::init(
                    &collectix::InitArgs {
                        transport: Some(if a.transport == Transport::Shm {
                            collectix::Transport::Shm
                        } else {
                            collectix::Transport::Tcp
                        }),
                        ..Default::default()
                    },
                    collectix::GroupOptions::default(),
                    std::time::Duration::from_secs(120),
                )?;
                let c = p.communicator().with_device_backend(backend);
                Ranks::Tcp(Box::new(p), c)
            }
        })
    }

    /// The ranks in the world.
    pub(super) fn size(&self) -> usize {
        match self {
            Ranks::Local(_, c, _) => c.len(),
            Ranks::Tcp(_, c) => c.size(),
        }
    }

    /// Whether this process prints the table (and writes the files).
    pub(super) fn prints(&self) -> bool {
        match self {
            Ranks::Local(..) => true,
            Ranks::Tcp(_, c) => c.rank() == 0,
        }
    }

    /// Whether the ranks are processes of their own (so that this process's memory is rank
    /// 0's only).
    pub(super) fn is_processes(&self) -> bool {
        matches!(self, Ranks::Tcp(..))
    }

    /// Every rank this process drives measures its cell (`cells[r]`): each on a thread of its
    /// own, or (`--bodies`) each as an async task on the threads the world's ranks share;
    /// the first one's result (`measure` makes every rank's the same).
    pub(super) fn measure(
        &self,
        a: &Args,
        bind: bool,
        cells: &Arc<Vec<Cell>>,
        opts: &CallOptions,
    ) -> Result<Measured> {
        let mut got = match self {
            Ranks::Local(world, comms, backend) => {
                if tasks(a, comms.len()) {
                    let (a, cells, opts, backend) =
                        (Arc::new(a.clone()), cells.clone(), opts.clone(), *backend);
                    world
                        .spawn(Policy::Stop, move |c| {
                            let (a, cells, opts) = (a.clone(), cells.clone(), opts.clone());
                            async move {
                                let (r, c) = (c.rank(), c.with_device_backend(backend));
                                measure(Waits::Await, &a, &c, r, &cells[r], &opts).await
                            }
                        })
                        .into_iter()
                        .collect::<Result<Vec<_>>>()?
                } else {
                    on_every_rank(comms, bind, |r, c| {
                        block_on(measure(Waits::Block, a, c, r, &cells[r], opts))
                    })?
                }
            }
            Ranks::Tcp(_, c) => {
                // A process's rank on the core of its host-local rank (as mpirun binds).
                let local = local_env("LOCAL_RANK").unwrap_or(c.rank());
                if bind && !bind_to_core(local) {
                    eprintln!(
                        "collectix: bench rank {}: could not bind its thread to a core",
                        c.rank()
                    );
                }
                let r = c.rank();
                let cell = cells
                    .get(r)
                    .ok_or_else(|| collectix::Error::internal("no cell for this rank"))?;
                vec![block_on(measure(Waits::Block, a, c, r, cell, opts))?]
            }
        };
        if got.is_empty() {
            return Err(collectix::Error::internal("no rank ran"));
        }
        Ok(got.swap_remove(0))
    }

    /// Shuts the world (or this process's part of the job) down.
    pub(super) fn shutdown(self) -> Result<()> {
        match self {
            Ranks::Local(world, _, _) => world.shutdown(),
            Ranks::Tcp(p, _) => p.shutdown(),
        }
    }
}

/// `--backend` as collectix's device backend.
pub(super) fn device_backend(b: Backend) -> DeviceBackend {
    match b {
        Backend::Nccl => DeviceBackend::Nccl,
        Backend::Staged => DeviceBackend::HostStaged,
    }
}

/// Whether the ranks' calling threads are bound to cores: `--bind auto` and a core for each
/// rank of this host (the `w` ranks of this process, or for a rank of a multi-process job
/// the host's ranks, `LOCAL_WORLD_SIZE` as `collectix launch` and torchrun set it).
pub(super) fn binds(a: &Args, w: usize) -> bool {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let here = match a.transport {
        Transport::Local => w,
        _ => local_env("LOCAL_WORLD_SIZE").unwrap_or(w),
    };
    a.bind == Bind::Auto && here <= cores
}

/// Beyond this many ranks per core, `--bodies auto` runs them as tasks: a thread per rank
/// that waits drives its rank itself (a small call of a few ranks takes microseconds, where
/// a task waits for the rank's actor), but thousands of threads cost more than they save
/// (W = 64 on 2 cores: 165 µs per 4-byte all_reduce as threads, 248 µs as tasks; W = 1,024:
/// 5.9 ms and 4.3 ms).
const TASKS_PER_CORE: usize = 32;

/// Whether an in-process world of `w` ranks runs the bench as async tasks (`--bodies`).
pub(super) fn tasks(a: &Args, w: usize) -> bool {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    match a.bodies {
        Bodies::Auto => a.transport == Transport::Local && w > TASKS_PER_CORE * cores,
        Bodies::Threads => false,
        Bodies::Tasks => a.transport == Transport::Local,
    }
}

/// Runs a future that never waits for a wake-up (a rank body that blocks in `Work::wait`)
/// on the calling thread; one that does is parked until woken.
fn block_on<T>(f: impl Future<Output = T>) -> T {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = std::task::Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = std::task::Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    loop {
        if let std::task::Poll::Ready(t) = f.as_mut().poll(&mut cx) {
            return t;
        }
        std::thread::park();
    }
}

/// A launcher's variable, as a number.
fn local_env(name: &str) -> Option<usize> {
    std::env::var(name).ok()?.trim().parse().ok()
}

/// Every rank, on a thread of its own, runs `f(rank, comm)`; the results in rank order.
fn on_every_rank<T: Send>(
    comms: &[Communicator],
    bind: bool,
    f: impl Fn(usize, &Communicator) -> Result<T> + Sync,
) -> Result<Vec<T>> {
    std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .enumerate()
            .map(|(r, c)| {
                let f = &f;
                s.spawn(move || {
                    if bind && !bind_to_core(r) {
                        eprintln!("collectix: bench rank {r}: could not bind its thread to a core");
                    }
                    f(r, c)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(collectix::Error::Shutdown)))
            .collect()
    })
}

/// Binds the calling thread to the `i`-th core this process may run on; whether it could.
#[cfg(target_os = "linux")]
fn bind_to_core(i: usize) -> bool {
    use nix::sched::{sched_getaffinity, sched_setaffinity, CpuSet};
    use nix::unistd::Pid;
    let me = Pid::from_raw(0);
    let Ok(allowed) = sched_getaffinity(me) else {
        return false;
    };
    let cpus: Vec<usize> = (0..CpuSet::count())
        .filter(|&c| allowed.is_set(c).unwrap_or(false))
        .collect();
    if cpus.len() == 1 {
        // Bound already: by the run of an earlier size, or by a launcher.
        return true;
    }
    let Some(&cpu) = cpus.get(i) else {
        return false;
    };
    let mut one = CpuSet::new();
    one.set(cpu).is_ok() && sched_setaffinity(me, &one).is_ok()
}

/// Binding is Linux's only: elsewhere the threads stay where the scheduler puts them.
#[cfg(not(target_os = "linux"))]
fn bind_to_core(_: usize) -> bool {
    false
}
