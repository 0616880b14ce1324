//! The lanes of device point-to-point on the NCCL backend: the state of each direction
//! between this rank and a peer (its ordinals, the sends waiting for their receiver's
//! answer, whether it broke, its device and its NCCL worker), and the outbox of engine calls
//! that must be issued in order once the lanes' lock is released. Only state lives here: the
//! protocol that moves it on (tickets, answers, transfers) is `backend/p2p.rs`.

use crate::sync::lock;
use collectix_runtime::{Device, Error, GroupId, Result, Tensor};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard};

/// How a lane moves its data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Carrier {
    /// NCCL between two GPUs.
    Nccl = 0,
    /// A host message: the carrier of [`StandIn`](super::StandIn) tensors (tests without a GPU).
    Host = 1,
    /// A device-to-device copy between ranks of one process (the device-local path): no
    /// NCCL, which refuses two ranks on one GPU.
    Local = 2,
}

/// Completes a send's `Work`.
pub(crate) type SendDone = Box<dyn FnOnce(Result<()>) + Send>;

/// Completes a receive's `Work` with the received tensor.
pub(crate) type RecvDone = Box<dyn FnOnce(Result<Tensor>) + Send>;

/// A call on the engine, queued under the lanes' lock and issued after it (see the module
/// doc).
pub(crate) type Deferred = Box<dyn FnOnce() + Send>;

/// Sends to fail once the lanes' lock is released.
pub(crate) type Failed = Vec<(SendDone, Error)>;

/// Fails each send with its error (called once the lanes' lock is released).
pub(crate) fn fail_all(failed: Failed) {
    for (done, e) in failed {
        done(Err(e));
    }
}

/// A lane under the lanes' lock, with the outbox of the engine calls to issue, in order,
/// once the lock is released.
pub(crate) struct Locked<'a, L> {
    /// The lane.
    pub(crate) lane: &'a mut L,
    /// The lanes' outbox.
    pub(crate) outbox: &'a mut VecDeque<Deferred>,
}

impl<L> Locked<'_, L> {
    /// The same lane and outbox, borrowed again for a shorter while.
    pub(crate) fn reborrow(&mut self) -> Locked<'_, L> {
        Locked {
            lane: &mut *self.lane,
            outbox: &mut *self.outbox,
        }
    }
}

/// A transfer on a lane: its ordinal `k`, and the lane's NCCL id (made for `k = 0`).
#[derive(Clone, Copy)]
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) struct Transfer {
    /// The ordinal.
    pub(crate) k: u64,
    /// The lane's NCCL id.
    pub(crate) id: [u8; 128],
}

/// A send waiting for its go.
pub(crate) struct PendingSend {
    pub(crate) tensor: Tensor,
    pub(crate) done: SendDone,
}

/// A send whose go arrived, waiting for the earlier ordinals of its lane.
pub(crate) struct Released {
    pub(crate) send: PendingSend,
    pub(crate) id: [u8; 128],
}

/// One direction from this rank to a peer.
#[derive(Default)]
pub(crate) struct OutLane {
    /// The serial number of the next send (carried in its ticket).
    pub(crate) next_s: u64,
    /// Sends waiting for their receiver's answer, by serial number.
    pub(crate) pending: HashMap<u64, PendingSend>,
    /// The next ordinal to issue: transfers leave in ordinal order.
    pub(crate) next_k: u64,
    /// Sends whose answer came, by ordinal, waiting for the earlier ordinals.
    pub(crate) released: BTreeMap<u64, Released>,
    /// What broke the lane, if anything did (every later send fails with it).
    pub(crate) broken: Option<Error>,
    /// The device the lane's sends come from (a communicator lives on one).
    pub(crate) device: Option<Device>,
    pub(crate) worker: Option<super::cuda::worker::WorkerHandle>,
}

impl OutLane {
    /// Marks the lane broken (the first error stays) and takes every send waiting on it.
    pub(crate) fn break_with(&mut self, e: Error) -> Failed {
        let e = self.broken.get_or_insert(e).clone();
        let released = std::mem::take(&mut self.released).into_values();
        self.pending
            .drain()
            .map(|(_, p)| p)
            .chain(released.map(|r| r.send))
            .map(|p| (p.done, e.clone()))
            .collect()
    }
}

/// One direction from a peer to this rank.
#[derive(Default)]
pub(crate) struct InLane {
    pub(crate) next_k: u64,
    pub(crate) broken: Option<Error>,
    /// The device the lane's receives go to.
    pub(crate) device: Option<Device>,
    pub(crate) worker: Option<super::cuda::worker::WorkerHandle>,
}

/// A group member's lanes (in its [`GroupShared`](crate::member::GroupShared)).
#[derive(Default)]
pub(crate) struct Lanes {
    inner: Mutex<LanesInner>,
}

/// The lanes behind their lock.
#[derive(Default)]
pub(crate) struct LanesInner {
    /// To each peer (group rank), per carrier.
    pub(crate) out: HashMap<(usize, Carrier), OutLane>,
    /// From each peer (group rank), per carrier.
    pub(crate) inn: HashMap<(usize, Carrier), InLane>,
    /// The group was destroyed on this rank: no lane is made any more.
    pub(crate) released: bool,
    /// Calls on the engine to issue, in this order, once the lock is released.
    pub(crate) outbox: VecDeque<Deferred>,
    /// A thread is issuing the outbox.
    pub(crate) draining: bool,
}

impl Lanes {
    /// The lanes, locked (ignoring poisoning).
    pub(crate) fn lock(&self) -> MutexGuard<'_, LanesInner> {
        lock(&self.inner)
    }

    /// Issues the outbox, in order, unless another thread is at it (it then issues what was
    /// added too). Called without the lock held.
    pub(crate) fn drain(&self) {
        {
            let mut lanes = self.lock();
            if lanes.draining {
                return;
            }
            lanes.draining = true;
        }
        // Should an action unwind, the next drain must still be possible.
        struct Owner<'a>(&'a Lanes, bool);
        impl Drop for Owner<'_> {
            fn drop(&mut self) {
                if self.1 {
                    self.0.lock().draining = false;
                }
            }
        }
        let mut owner = Owner(self, true);
        loop {
            let next = {
                let mut lanes = self.lock();
                match lanes.outbox.pop_front() {
                    Some(a) => a,
                    None => {
                        lanes.draining = false;
                        owner.1 = false;
                        return;
                    }
                }
            };
            next();
        }
    }

    /// The group is destroyed on this rank: every lane breaks with [`Error::Shutdown`], its
    /// waiting sends fail with it, its NCCL communicator is released (aborted), and no lane
    /// is made any more.
    pub(crate) fn release(&self, group: GroupId) {
        let failed: Failed = {
            let mut lanes = self.lock();
            lanes.released = true;
            let mut failed = Vec::new();
            for lane in lanes.out.values_mut() {
                failed.extend(lane.break_with(Error::Shutdown));
                if let Some(w) = lane.worker.take() {
                    w.release(group);
                }
            }
            for lane in lanes.inn.values_mut() {
                lane.broken.get_or_insert(Error::Shutdown);
                if let Some(w) = lane.worker.take() {
                    w.release(group);
                }
            }
            failed
        };
        fail_all(failed);
    }

    /// Breaks the lane to a peer: every send waiting on it fails with `e`, and so does every
    /// later one.
    pub(crate) fn break_out(&self, key: (usize, Carrier), e: Error) {
        let failed = match self.lock().out.get_mut(&key) {
            Some(lane) => lane.break_with(e),
            None => Vec::new(),
        };
        fail_all(failed);
    }

    /// Breaks the lane from a peer: every later receive matched to it fails with `e`.
    pub(crate) fn break_in(&self, key: (usize, Carrier), e: Error) {
        if let Some(lane) = self.lock().inn.get_mut(&key) {
            lane.broken.get_or_insert(e);
        }
    }
}
