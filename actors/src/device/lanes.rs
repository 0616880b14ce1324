//! The lanes of device point-to-point on the NCCL backend, as this crate holds them: the
//! runtime's state machine ([`collectix_runtime::device_lanes`]: tickets, gos, ordinals,
//! broken lanes) and each lane's NCCL worker, under one lock. What moves them on (issuing
//! tickets, transfers and answers) is `backend/p2p.rs`.

use crate::device::cuda::worker::WorkerHandle;
use crate::sync::lock;
pub(crate) use collectix_runtime::device_lanes::{Carrier, Key};
use collectix_runtime::device_lanes::{DeviceLanes, Failed as Failures};
use collectix_runtime::{CallOptions, Error, GroupId, Result, Tensor, TensorSpec};
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

/// Completes a send's `Work`.
pub(crate) type SendDone = Box<dyn FnOnce(Result<()>) + Send>;

/// Completes a receive's `Work` with the received tensor.
pub(crate) type RecvDone = Box<dyn FnOnce(Result<Tensor>) + Send>;

/// A device send, from its admission to its transfer.
pub(crate) struct PendingSend {
    pub(crate) tensor: Tensor,
    pub(crate) opts: CallOptions,
    pub(crate) done: SendDone,
}

/// A device receive whose ticket came, until its transfer is posted.
pub(crate) struct PendingRecv {
    pub(crate) spec: TensorSpec,
    pub(crate) opts: CallOptions,
    pub(crate) done: RecvDone,
}

/// The protocol's state of a group member's lanes.
pub(crate) type Protocol = DeviceLanes<PendingSend, PendingRecv>;

/// Sends and receives to fail once the lock is released.
pub(crate) type Failed = Failures<PendingSend, PendingRecv>;

/// Fails each send and receive with its error (called once the lanes' lock is released).
pub(crate) fn fail_all(failed: Failed) {
    for (s, e) in failed.sends {
        (s.done)(Err(e));
    }
    for (r, e) in failed.recvs {
        (r.done)(Err(e));
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

/// A group member's lanes (in its [`GroupShared`](crate::member::GroupShared)).
#[derive(Default)]
pub(crate) struct Lanes {
    inner: Mutex<LanesInner>,
}

/// The lanes behind their lock.
#[derive(Default)]
pub(crate) struct LanesInner {
    pub(crate) protocol: Protocol,
    /// The NCCL worker of each lane to a peer, started on its first send.
    pub(crate) out_workers: HashMap<Key, Option<WorkerHandle>>,
    /// The NCCL worker of each lane from a peer, started on its first receive.
    pub(crate) in_workers: HashMap<Key, Option<WorkerHandle>>,
}

impl Lanes {
    /// The lanes, locked (ignoring poisoning).
    pub(crate) fn lock(&self) -> MutexGuard<'_, LanesInner> {
        lock(&self.inner)
    }

    /// Runs `f` on the protocol under the lock, then fails what it gave back.
    pub(crate) fn update(&self, f: impl FnOnce(&mut Protocol) -> Failed) {
        let failed = f(&mut self.lock().protocol);
        fail_all(failed);
    }

    /// The group is destroyed on this rank: every lane breaks with [`Error::Shutdown`], its
    /// waiting sends fail with it, its NCCL communicator is released (aborted), and no lane
    /// is made any more.
    pub(crate) fn release(&self, group: GroupId) {
        let failed = {
            let mut lanes = self.lock();
            let LanesInner {
                protocol,
                out_workers,
                in_workers,
            } = &mut *lanes;
            for w in out_workers.values_mut().chain(in_workers.values_mut()) {
                if let Some(w) = w.take() {
                    w.release(group);
                }
            }
            protocol.release()
        };
        fail_all(failed);
    }

    /// Breaks the lane to a peer: every send waiting on it fails with `e`, and so does every
    /// later one.
    pub(crate) fn break_out(&self, key: Key, e: Error) {
        self.update(|p| p.break_out(key, e));
    }

    /// Breaks the lane from a peer: every later receive matched to it fails with `e`.
    pub(crate) fn break_in(&self, key: Key, e: Error) {
        self.update(|p| p.break_in(key, e));
    }
}
