//! The device worker: a thread per group (or per point-to-point lane) on each rank that owns
//! its NCCL communicator for its whole life (an NCCL communicator is `!Send`), fed by a
//! crossbeam channel. A group of one process's ranks (`local.rs`) starts its worker without
//! libnccl, which is loaded if an NCCL call comes: its calls on one GPU are device-local,
//! and the worker only watches their slots (`Job::Local`, `Job::Watch`) and completes them
//! when their event fires.
//!
//! Calls arrive when their agreement step has completed, which may be out of order; each
//! group's calls run in the order of their NCCL ordinal `k` (the order of issue), so every
//! rank enqueues the same NCCL operations in the same order. A call whose agreement failed
//! arrives as a `Skip`. The first call of a group carries the NCCL id and creates the
//! communicator on the call's device.
//!
//! After enqueueing, the worker records a CUDA event and keeps polling (spinning first, see
//! `run`): a call completes (its `Work` with it) when its event fires; a communicator with an
//! asynchronous error, or a call still running past its timeout, aborts the communicator
//! (never a hang) and fails that call and every later one on the group.

use super::local::Slot;
use super::nccl::{Comm, Nccl};
use super::plan::NcclOp;
use super::pool::Pool;
use super::{context, cuda_err};
use crate::rank::driver::Done;
use collectix_runtime::{DeviceError, Error, GroupId, OpKind, Output, Result, Tensor};
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TryRecvError};
use cudarc::driver::{CudaContext, CudaEvent, CudaStream};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long the worker waits for a new job while calls are in flight before it polls them
/// again, once its spin budget is spent.
const POLL: Duration = Duration::from_micros(20);
/// How long the worker spins while calls are in flight before it sleeps between polls,
/// unless `COLLECTIX_SPIN_US` says otherwise (the knob of the ranks' waiting callers).
const DEVICE_SPIN: Duration = Duration::from_micros(200);
/// Spin turns between two yields of the thread (so that a machine with fewer cores than
/// spinning threads still runs the others).
const YIELD_EVERY: u32 = 16;

/// One turn of a spin: a pause, or every [`YIELD_EVERY`] turns a yield of the thread.
fn spin_turn(turns: &mut u32) {
    *turns = turns.wrapping_add(1);
    if turns.is_multiple_of(YIELD_EVERY) {
        std::thread::yield_now();
    } else {
        std::hint::spin_loop();
    }
}

/// Asks the kernel to wake this thread's timed waits within a microsecond of their time
/// (Linux's default slack of 50 µs would stretch each 20 µs poll to about 70 µs). Best
/// effort: a refusal leaves the default.
fn fine_timers() {
    #[cfg(target_os = "linux")]
    let _ = nix::sys::prctl::set_timerslack(1_000);
}

/// What the first call of a group needs to create its communicator.
pub(crate) struct Init {
    pub(crate) id: [u8; 128],
    pub(crate) rank: usize,
    pub(crate) size: usize,
}

/// A call whose agreement step succeeded.
pub(crate) struct Call {
    pub(crate) group: GroupId,
    pub(crate) k: u64,
    pub(crate) init: Option<Init>,
    pub(crate) device: u32,
    pub(crate) kind: OpKind,
    pub(crate) dtype: collectix_runtime::DType,
    pub(crate) rank: usize,
    pub(crate) op: NcclOp,
    pub(crate) timeout: Duration,
    pub(crate) done: Done<Output>,
}

/// A call whose agreement step succeeded and that runs on the device-local path (every
/// member is a rank of this process on the same device: `local.rs`), its part deposited
/// already: the worker watches its slot and completes it.
pub(crate) struct LocalCall {
    pub(crate) slot: Arc<Slot>,
    pub(crate) group: GroupId,
    /// Its NCCL ordinal, which the group's NCCL calls skip.
    pub(crate) k: u64,
    /// This rank in the group.
    pub(crate) rank: usize,
    /// The call's sequence number (none for a transfer), and this rank in the world, for a
    /// timeout's error.
    pub(crate) seq: Option<u64>,
    pub(crate) global_rank: usize,
    /// The world ranks of the slot's parts, in part order.
    pub(crate) members: Vec<usize>,
    pub(crate) kind: OpKind,
    pub(crate) timeout: Duration,
    pub(crate) done: Done<Output>,
}

/// What the worker is sent.
pub(crate) enum Job {
    Call(Box<Call>),
    /// A call of the device-local path: watched at once (it needs no turn: the ranks'
    /// parts meet in its slot), its NCCL ordinal skipped.
    Local(Box<LocalCall>),
    /// A device-local transfer of a point-to-point lane: watched, and nothing else (its
    /// ordinal is the lane's, not the group's).
    Watch(Box<LocalCall>),
    /// Call `k` of the group failed its agreement step on this rank: it never runs.
    Skip {
        group: GroupId,
        k: u64,
    },
    /// The group was destroyed on this rank: its communicator is released (aborted), its
    /// calls in flight fail with `Shutdown`, and so do those still waiting their turn.
    Release {
        group: GroupId,
    },
}

/// The rank's handle on its worker; dropping it lets the worker finish what it holds and
/// exit.
pub(crate) struct WorkerHandle {
    tx: Sender<Job>,
}

impl WorkerHandle {
    /// Starts a worker on a thread named `name` (fails if libnccl cannot be loaded): a
    /// group's on one rank, or a point-to-point lane's (`backend/p2p.rs`).
    pub(crate) fn spawn_named(name: String) -> Result<WorkerHandle> {
        WorkerHandle::spawn(name, Some(Nccl::load()?))
    }

    /// Starts a worker that loads libnccl only when an NCCL call first needs it: a group of
    /// this process's ranks, whose calls may all take the device-local path.
    pub(crate) fn spawn_lazy(name: String) -> Result<WorkerHandle> {
        WorkerHandle::spawn(name, None)
    }

    fn spawn(name: String, nccl: Option<Arc<Nccl>>) -> Result<WorkerHandle> {
        let (tx, rx) = crossbeam_channel::unbounded();
        std::thread::Builder::new()
            .name(name)
            .spawn(move || Worker::new(nccl, rx).run())
            .map_err(|e| Error::Resource(format!("could not start the device worker: {e}")))?;
        Ok(WorkerHandle { tx })
    }

    pub(crate) fn sender(&self) -> Sender<Job> {
        self.tx.clone()
    }

    /// Releases the group's NCCL state (see [`Job::Release`]).
    pub(crate) fn release(&self, group: GroupId) {
        let _ = self.tx.send(Job::Release { group });
    }
}

enum CommState {
    None,
    Ready {
        comm: Comm,
        stream: Arc<CudaStream>,
        /// The group's outputs come from here (memory kept for reuse).
        pool: Pool,
        ctx: Arc<CudaContext>,
        device: u32,
    },
    Broken(Error),
}

/// A call waiting for its turn in the group's order.
enum Turn {
    Nccl(Box<Call>),
    /// Its agreement step failed, or it took the device-local path: no NCCL call.
    Skip,
}

struct GroupState {
    next: u64,
    waiting: BTreeMap<u64, Turn>,
    comm: CommState,
}

/// What the worker's wait for its next job gave.
enum Next {
    Job(Job),
    /// Nothing yet.
    Nothing,
    /// Every handle on the worker is gone.
    Closed,
}

/// What an enqueued call waits for.
enum Pending {
    /// An NCCL call: its event, its output, and its inputs kept until then.
    Event {
        event: CudaEvent,
        output: Output,
        _keep: Vec<Tensor>,
    },
    /// A device-local call: its slot, which every member's worker watches.
    Local {
        slot: Arc<Slot>,
        rank: usize,
        /// What a timeout's error says.
        timeout_error: Box<dyn FnOnce(Vec<usize>) -> Error + Send>,
    },
}

struct InFlight {
    group: GroupId,
    pending: Pending,
    done: Done<Output>,
    deadline: Instant,
    kind: OpKind,
    timeout: Duration,
}

struct Worker {
    /// libnccl, loaded by the first NCCL call if not at the start.
    nccl: Option<Arc<Nccl>>,
    /// How long to spin while calls are in flight before sleeping between polls.
    spin: Duration,
    rx: Receiver<Job>,
    groups: HashMap<GroupId, GroupState>,
    in_flight: Vec<InFlight>,
}

impl Worker {
    fn new(nccl: Option<Arc<Nccl>>, rx: Receiver<Job>) -> Worker {
        Worker {
            nccl,
            spin: crate::rank::driver::spin_from_env(DEVICE_SPIN),
            rx,
            groups: HashMap::new(),
            in_flight: Vec::new(),
        }
    }

    fn run(mut self) {
        fine_timers();
        let mut open = true;
        // The worker spins (looking at its channel and, while calls are in flight, at their
        // events) until `spin_until`, then sleeps: a small operation finishes on the GPU
        // within microseconds, a program that makes one call after another sends the next
        // within microseconds, and a thread put to sleep takes tens of microseconds to run
        // again. Each new call, and each completion, starts a new spin.
        let mut spin_until: Option<Instant> = None;
        let mut turns = 0u32;
        while open || !self.in_flight.is_empty() {
            match self.next(&mut spin_until, &mut turns) {
                Next::Job(j) => {
                    self.accept(j);
                    spin_until = None;
                }
                Next::Closed => open = false,
                Next::Nothing => {}
            }
            if self.poll() {
                spin_until = None;
            }
        }
        // Calls still waiting for an earlier one that will never come fail with Shutdown
        // (their `done` is dropped); communicators are aborted as the groups drop.
    }

    /// The next job: looked for at once while spinning; past the spin, waited for `POLL` at
    /// a time while calls are in flight (to poll them), or until it comes when none is.
    fn next(&mut self, spin_until: &mut Option<Instant>, turns: &mut u32) -> Next {
        let now = Instant::now();
        if now < *spin_until.get_or_insert(now + self.spin) {
            return match self.rx.try_recv() {
                Ok(j) => Next::Job(j),
                Err(TryRecvError::Empty) => {
                    spin_turn(turns);
                    Next::Nothing
                }
                Err(TryRecvError::Disconnected) => Next::Closed,
            };
        }
        if self.in_flight.is_empty() {
            return self.rx.recv().map_or(Next::Closed, Next::Job);
        }
        match self.rx.recv_timeout(POLL) {
            Ok(j) => Next::Job(j),
            Err(RecvTimeoutError::Timeout) => Next::Nothing,
            Err(RecvTimeoutError::Disconnected) => Next::Closed,
        }
    }

    fn accept(&mut self, job: Job) {
        let (group, k, turn) = match job {
            Job::Call(c) => (c.group, c.k, Turn::Nccl(c)),
            Job::Local(c) => {
                let (group, k) = (c.group, c.k);
                self.in_flight.push(watch(*c));
                (group, k, Turn::Skip)
            }
            Job::Watch(c) => {
                self.in_flight.push(watch(*c));
                return;
            }
            Job::Skip { group, k } => (group, k, Turn::Skip),
            Job::Release { group } => {
                self.break_group(group, Error::Shutdown);
                // Dropping the state drops the communicator (aborted) and the `done` of
                // every call still waiting (each then completes with `Shutdown`).
                self.groups.remove(&group);
                return;
            }
        };
        let g = self.groups.entry(group).or_insert_with(|| GroupState {
            next: 0,
            waiting: BTreeMap::new(),
            comm: CommState::None,
        });
        g.waiting.insert(k, turn);
        while let Some(turn) = g.waiting.remove(&g.next) {
            g.next += 1;
            match turn {
                Turn::Skip => {}
                Turn::Nccl(call) => {
                    let nccl = match &self.nccl {
                        Some(n) => Ok(n.clone()),
                        None => Nccl::load(),
                    };
                    let nccl = match nccl {
                        Ok(n) => {
                            self.nccl = Some(n.clone());
                            n
                        }
                        Err(e) => {
                            (call.done)(Err(e));
                            continue;
                        }
                    };
                    let Call {
                        group,
                        init,
                        device,
                        kind,
                        dtype,
                        rank,
                        op,
                        timeout,
                        done,
                        ..
                    } = *call;
                    match launch(
                        &nccl,
                        &mut g.comm,
                        init,
                        device,
                        Launchable { op, dtype, rank },
                        timeout,
                    ) {
                        Ok((event, output, keep)) => self.in_flight.push(InFlight {
                            group,
                            pending: Pending::Event {
                                event,
                                output,
                                _keep: keep,
                            },
                            done,
                            deadline: crate::sync::deadline_after(timeout),
                            kind,
                            timeout,
                        }),
                        Err(e) => done(Err(e)),
                    }
                }
            }
        }
    }

    /// Completes the calls whose events fired; aborts communicators that failed or hang.
    /// Whether any call completed or failed.
    fn poll(&mut self) -> bool {
        let before = self.in_flight.len();
        let now = Instant::now();
        let mut i = 0;
        while i < self.in_flight.len() {
            let f = &mut self.in_flight[i];
            let group = f.group;
            match &mut f.pending {
                Pending::Local { slot, rank, .. } => {
                    let outcome = match slot.poll(*rank) {
                        Some(r) => Some(r),
                        None if now >= f.deadline => {
                            let f = self.in_flight.swap_remove(i);
                            if let Pending::Local {
                                slot,
                                timeout_error,
                                ..
                            } = f.pending
                            {
                                (f.done)(Err(slot.expire(timeout_error)));
                            }
                            continue;
                        }
                        None => None,
                    };
                    match outcome {
                        None => i += 1,
                        Some(r) => {
                            // A local call's failure is its own: the group goes on.
                            let f = self.in_flight.swap_remove(i);
                            (f.done)(r);
                        }
                    }
                }
                Pending::Event { event, .. } => {
                    let fired = event.try_is_complete();
                    let state = self.groups.get(&group).map(|g| &g.comm);
                    let async_err = match state {
                        Some(CommState::Ready { comm, .. }) => comm.async_error().err(),
                        _ => None,
                    };
                    let outcome = match (fired, async_err) {
                        (Ok(true), _) => Some(Ok(())),
                        (Err(e), _) => Some(Err(cuda_err("cuEventQuery")(e))),
                        (Ok(false), Some(e)) => Some(Err(e)),
                        (Ok(false), None) if now >= f.deadline => {
                            Some(Err(DeviceError::NcclTimeout {
                                group,
                                op: f.kind,
                                timeout_ms: f.timeout.as_millis() as u64,
                            }
                            .into()))
                        }
                        (Ok(false), None) => None,
                    };
                    match outcome {
                        None => i += 1,
                        Some(Ok(())) => {
                            let f = self.in_flight.swap_remove(i);
                            if let Pending::Event { output, .. } = f.pending {
                                (f.done)(Ok(output));
                            }
                        }
                        Some(Err(e)) => self.break_group(group, e),
                    }
                }
            }
        }
        self.in_flight.len() != before
    }

    /// Aborts the group's communicator and fails its calls in flight with `e` (and every
    /// later call with it).
    fn break_group(&mut self, group: GroupId, e: Error) {
        if let Some(g) = self.groups.get_mut(&group) {
            // Dropping the communicator aborts it.
            g.comm = CommState::Broken(e.clone());
        }
        // Local calls of the group fail too on this rank; their slots go on for the others
        // (a member that left is heard of on the engine).
        let (failed, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut self.in_flight)
            .into_iter()
            .partition(|f| f.group == group);
        self.in_flight = rest;
        for f in failed {
            (f.done)(Err(e.clone()));
        }
    }
}

/// Watches a device-local call's slot until its result comes or its time is up.
fn watch(c: LocalCall) -> InFlight {
    let LocalCall {
        slot,
        group,
        k: _,
        rank,
        seq,
        global_rank,
        members,
        kind,
        timeout,
        done,
    } = c;
    let timeout_error: Box<dyn FnOnce(Vec<usize>) -> Error + Send> =
        Box::new(move |missing: Vec<usize>| {
            let waiting_for = missing
                .iter()
                .map(|&r| members.get(r).copied().unwrap_or(r))
                .collect();
            Error::Timeout {
                group,
                seq,
                op: kind,
                rank: global_rank,
                waiting_for,
                report: Vec::new(),
            }
        });
    InFlight {
        group,
        pending: Pending::Local {
            slot,
            rank,
            timeout_error,
        },
        done,
        deadline: crate::sync::deadline_after(timeout),
        kind,
        timeout,
    }
}

/// What a call enqueues: the operation, its element type, and this rank in the
/// communicator.
struct Launchable {
    op: NcclOp,
    dtype: collectix_runtime::DType,
    rank: usize,
}

/// Creates the group's communicator if this is its first call, then enqueues the call and
/// records its completion event.
fn launch(
    nccl: &Arc<Nccl>,
    state: &mut CommState,
    init: Option<Init>,
    call_device: u32,
    call: Launchable,
    timeout: Duration,
) -> Result<(CudaEvent, Output, Vec<Tensor>)> {
    let Launchable { op, dtype, rank } = call;
    if let CommState::None = state {
        let init = init.ok_or_else(|| Error::internal("first NCCL call without an id"))?;
        let ctx = context(call_device)?;
        ctx.bind_to_thread().map_err(cuda_err("cuCtxSetCurrent"))?;
        let comm = nccl.init_rank(init.size, init.id, init.rank, timeout);
        let comm = match comm {
            Ok(c) => c,
            Err(e) => {
                *state = CommState::Broken(e.clone());
                return Err(e);
            }
        };
        let stream = ctx.new_stream().map_err(cuda_err("cuStreamCreate"))?;
        let pool = Pool::new(&ctx)?;
        *state = CommState::Ready {
            comm,
            stream,
            pool,
            ctx,
            device: call_device,
        };
    }
    match state {
        CommState::Broken(e) => Err(e.clone()),
        CommState::None => Err(Error::internal("no communicator")),
        CommState::Ready {
            comm,
            stream,
            pool,
            ctx,
            device,
        } => {
            if *device != call_device {
                return Err(DeviceError::Unsupported(format!(
                    "a call on cuda:{call_device} in a group whose NCCL communicator is on cuda:{device}"
                ))
                .into());
            }
            ctx.bind_to_thread().map_err(cuda_err("cuCtxSetCurrent"))?;
            let (output, keep) = op.launch(comm, stream, pool, *device, dtype, rank)?;
            let event = stream
                .record_event(None)
                .map_err(cuda_err("cuEventRecord"))?;
            Ok((event, output, keep))
        }
    }
}
