//! The device worker: one thread per rank that owns the rank's NCCL communicators for their
//! whole life (an NCCL communicator is `!Send`), fed by a crossbeam channel.
//!
//! Calls arrive when their agreement step has completed, which may be out of order; each
//! group's calls run in the order of their NCCL ordinal `k` (the order of issue), so every
//! rank enqueues the same NCCL operations in the same order. A call whose agreement failed
//! arrives as a `Skip`. The first call of a group carries the NCCL id and creates the
//! communicator on the call's device.
//!
//! After enqueueing, the worker records a CUDA event and keeps polling: a call completes
//! (its `Work` with it) when its event fires; a communicator with an asynchronous error,
//! or a call still running past its timeout, aborts the communicator (never a hang) and
//! fails that call and every later one on the group.

use super::nccl::{Comm, Nccl};
use super::plan::NcclOp;
use super::{context, cuda_err};
use crate::rank::driver::Done;
use collectix_runtime::{DeviceError, Error, GroupId, OpKind, Output, Result, Tensor};
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use cudarc::driver::{CudaContext, CudaEvent, CudaStream};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long the worker waits for a new job while calls are in flight before it polls them
/// again.
const POLL: Duration = Duration::from_micros(20);

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

/// What the worker is sent.
pub(crate) enum Job {
    Call(Box<Call>),
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
        let nccl = Nccl::load()?;
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
        ctx: Arc<CudaContext>,
        device: u32,
    },
    Broken(Error),
}

struct GroupState {
    next: u64,
    waiting: BTreeMap<u64, Option<Box<Call>>>,
    comm: CommState,
}

struct InFlight {
    group: GroupId,
    event: CudaEvent,
    done: Done<Output>,
    output: Output,
    _keep: Vec<Tensor>,
    deadline: Instant,
    kind: OpKind,
    timeout: Duration,
}

struct Worker {
    nccl: Arc<Nccl>,
    rx: Receiver<Job>,
    groups: HashMap<GroupId, GroupState>,
    in_flight: Vec<InFlight>,
}

impl Worker {
    fn new(nccl: Arc<Nccl>, rx: Receiver<Job>) -> Worker {
        Worker {
            nccl,
            rx,
            groups: HashMap::new(),
            in_flight: Vec::new(),
        }
    }

    fn run(mut self) {
        let mut open = true;
        while open || !self.in_flight.is_empty() {
            let job = if self.in_flight.is_empty() {
                self.rx.recv().ok()
            } else {
                match self.rx.recv_timeout(POLL) {
                    Ok(j) => Some(j),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => {
                        open = false;
                        None
                    }
                }
            };
            match job {
                Some(j) => self.accept(j),
                None if self.in_flight.is_empty() => open = false,
                None => {}
            }
            self.poll();
        }
        // Calls still waiting for an earlier one that will never come fail with Shutdown
        // (their `done` is dropped); communicators are aborted as the groups drop.
    }

    fn accept(&mut self, job: Job) {
        let (group, k, call) = match job {
            Job::Call(c) => (c.group, c.k, Some(c)),
            Job::Skip { group, k } => (group, k, None),
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
        g.waiting.insert(k, call);
        while let Some(entry) = g.waiting.remove(&g.next) {
            g.next += 1;
            let Some(call) = entry else { continue };
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
                &self.nccl,
                &mut g.comm,
                init,
                device,
                Launchable { op, dtype, rank },
                timeout,
            ) {
                Ok((event, output, keep)) => self.in_flight.push(InFlight {
                    group,
                    event,
                    done,
                    output,
                    _keep: keep,
                    deadline: Instant::now() + timeout,
                    kind,
                    timeout,
                }),
                Err(e) => done(Err(e)),
            }
        }
    }

    /// Completes the calls whose events fired; aborts communicators that failed or hang.
    fn poll(&mut self) {
        let now = Instant::now();
        let mut i = 0;
        while i < self.in_flight.len() {
            let f = &self.in_flight[i];
            let fired = f.event.try_is_complete();
            let state = self.groups.get(&f.group).map(|g| &g.comm);
            let async_err = match state {
                Some(CommState::Ready { comm, .. }) => comm.async_error().err(),
                _ => None,
            };
            let outcome = match (fired, async_err) {
                (Ok(true), _) => Some(Ok(())),
                (Err(e), _) => Some(Err(cuda_err("cuEventQuery")(e))),
                (Ok(false), Some(e)) => Some(Err(e)),
                (Ok(false), None) if now >= f.deadline => Some(Err(DeviceError::NcclTimeout {
                    group: f.group,
                    op: f.kind,
                    timeout_ms: f.timeout.as_millis() as u64,
                }
                .into())),
                (Ok(false), None) => None,
            };
            match outcome {
                None => i += 1,
                Some(Ok(())) => {
                    let f = self.in_flight.swap_remove(i);
                    (f.done)(Ok(f.output));
                }
                Some(Err(e)) => self.break_group(self.in_flight[i].group, e),
            }
        }
    }

    /// Aborts the group's communicator and fails its calls in flight with `e` (and every
    /// later call with it).
    fn break_group(&mut self, group: GroupId, e: Error) {
        if let Some(g) = self.groups.get_mut(&group) {
            // Dropping the communicator aborts it.
            g.comm = CommState::Broken(e.clone());
        }
        let (failed, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut self.in_flight)
            .into_iter()
            .partition(|f| f.group == group);
        self.in_flight = rest;
        for f in failed {
            (f.done)(Err(e.clone()));
        }
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
        *state = CommState::Ready {
            comm,
            stream,
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
            let (output, keep) = op.launch(comm, stream, *device, dtype, rank)?;
            let event = stream
                .record_event(None)
                .map_err(cuda_err("cuEventRecord"))?;
            Ok((event, output, keep))
        }
    }
}
