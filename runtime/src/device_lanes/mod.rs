//! The lanes of device point-to-point (NCCL, the device-local copy, or host messages for
//! stand-in tensors): the ticket / go rendezvous as a state machine without IO. Each
//! direction between this rank and a peer, on one carrier, is a *lane*, with ordinals of its
//! own, so that no transfer waits behind another it does not depend on.
//!
//! NCCL matches point-to-point operations by order on a communicator, not by tag, and a
//! receive it has not reached blocks everything behind it. A collectix receive is matched by
//! (source, tag), possibly from any source, so the receiver decides the order:
//!
//! 1. The sender's send is admitted ([`DeviceLanes::send`]): it takes the lane's next serial
//!    number `s` and waits for its go. Its driver sends the *ticket* (`s` and the carrier,
//!    [`TICKET_BYTES`]) on the user's tag, matched like any message, and waits for an answer
//!    on the carrier's answer tag.
//! 2. The receiver's receive matches a ticket ([`DeviceLanes::on_ticket`]). It takes the
//!    next ordinal `k` of the lane, makes the lane's NCCL id when `k = 0`, and queues
//!    [`Action::Post`] (transfer `k` into this receive) then [`Action::Answer`], the *go*
//!    `(s, k, status, id)` ([`GO_BYTES`]). Or it refuses, with the status saying why
//!    ([`Refusal`]), and the receive fails.
//! 3. The sender, on the go ([`DeviceLanes::on_go`]), queues [`Action::Transfer`] for `k`,
//!    in ordinal order: transfers leave a lane in the order the receiver posted them.
//!
//! A lane that breaks (a transfer failed, no go came within the timeout, a malformed or
//! repeated go, the group destroyed) fails every send waiting on it and every later one;
//! a receiving lane that breaks refuses every later ticket. Queued transfers and posts of a
//! broken lane fail too, and a queued go of a cancelled post becomes a refusal.
//!
//! The driver (the actors crate's `backend/p2p.rs`) holds a [`DeviceLanes`] under a lock,
//! completes what a method gives back as [`Failed`] once the lock is released, and issues
//! the queued [`Action`]s in order, one thread at a time ([`DeviceLanes::begin_drain`],
//! [`DeviceLanes::next_action`]), never under the lock: issuing runs the engine, which may
//! run other completions that take it.

use crate::error::{DeviceError, Error, ProtocolError};
use crate::tensor::Device;
use std::collections::{BTreeMap, HashMap, VecDeque};

#[cfg(all(test, not(collectix_loom)))]
mod tests;

/// Bytes of a ticket: the send's serial number and its carrier.
pub const TICKET_BYTES: usize = 9;
/// Bytes of a go: `s`, `k`, a status ([`Refusal`] or 0) and the lane's NCCL id.
pub const GO_BYTES: usize = 8 + 8 + 8 + ID_BYTES;
/// Bytes of an NCCL unique id.
pub const ID_BYTES: usize = 128;

/// An NCCL unique id (all zero where none is needed).
pub type NcclId = [u8; ID_BYTES];

/// How a lane moves its data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Carrier {
    /// NCCL between two GPUs.
    Nccl = 0,
    /// A host message: the carrier of stand-in tensors (tests without a GPU).
    Host = 1,
    /// A device-to-device copy between ranks of one process (the device-local path): no
    /// NCCL, which refuses two ranks on one GPU.
    Local = 2,
}

impl Carrier {
    fn from_byte(b: u8) -> Option<Carrier> {
        match b {
            0 => Some(Carrier::Nccl),
            1 => Some(Carrier::Host),
            2 => Some(Carrier::Local),
            _ => None,
        }
    }
}

/// A lane: the peer (its rank in the group) and the carrier.
pub type Key = (usize, Carrier);

/// Why a receiver refused a ticket (a go's status; 0 is "go").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The receiving lane is broken, or the group was destroyed there.
    Broken = 1,
    /// The receiver cannot make an NCCL id (no `cuda` feature, no libnccl).
    NoNccl = 2,
    /// The receive names another device than the lane's.
    Device = 3,
}

impl Refusal {
    /// The error the refused send fails with; `peer` is the receiver's global rank.
    fn error(status: u64, peer: usize) -> Error {
        if status == Refusal::NoNccl as u64 {
            DeviceError::Unsupported(format!(
                "rank {peer} cannot receive on NCCL (no `cuda` feature or no libnccl there)"
            ))
            .into()
        } else if status == Refusal::Device as u64 {
            Error::invalid(format!(
                "rank {peer} receives from this rank on another device than this receive names"
            ))
        } else {
            DeviceError::Unsupported(format!(
                "rank {peer}'s receives from this rank are broken by an earlier failure (or its group was destroyed)"
            ))
            .into()
        }
    }
}

/// What the driver issues, in this order, once the lock is released. `S` is a send (its
/// tensor and what completes it), `R` a receive.
#[derive(Debug)]
pub enum Action<S, R> {
    /// Transfer `k` of the lane to `key.0`, from `send`. If it cannot be issued, the driver
    /// fails the send and breaks the lane ([`DeviceLanes::break_out`]: a skipped ordinal
    /// would pair the next transfer with the wrong receive) before it issues anything else.
    Transfer {
        /// The lane.
        key: Key,
        /// The transfer's ordinal on the lane.
        k: u64,
        /// The lane's NCCL id, made by the receiver for `k = 0`.
        id: NcclId,
        /// The send.
        send: S,
    },
    /// Transfer `k` of the lane from `key.0`, into `recv`: posted before its go is sent. If
    /// it cannot be posted, the driver fails the receive and says so
    /// ([`DeviceLanes::post_failed`]) before it issues anything else.
    Post {
        /// The lane.
        key: Key,
        /// The transfer's ordinal on the lane.
        k: u64,
        /// The lane's NCCL id (made here for `k = 0`).
        id: NcclId,
        /// The receive.
        recv: R,
    },
    /// The answer to a ticket from `key.0`, on the carrier's answer tag.
    Answer {
        /// The lane.
        key: Key,
        /// The go or refusal, [`GO_BYTES`].
        go: Vec<u8>,
    },
}

/// Sends and receives that failed, to complete with their errors once the lock is released.
#[must_use = "failed sends and receives must be completed"]
#[derive(Debug)]
pub struct Failed<S, R> {
    /// The sends, with their errors.
    pub sends: Vec<(S, Error)>,
    /// The receives, with their errors.
    pub recvs: Vec<(R, Error)>,
}

impl<S, R> Default for Failed<S, R> {
    fn default() -> Self {
        Failed {
            sends: Vec::new(),
            recvs: Vec::new(),
        }
    }
}

impl<S, R> Failed<S, R> {
    /// Whether nothing failed.
    pub fn is_empty(&self) -> bool {
        self.sends.is_empty() && self.recvs.is_empty()
    }

    fn send(s: S, e: Error) -> Self {
        Failed {
            sends: vec![(s, e)],
            recvs: Vec::new(),
        }
    }

    fn recv(r: R, e: Error) -> Self {
        Failed {
            sends: Vec::new(),
            recvs: vec![(r, e)],
        }
    }
}

/// One direction from this rank to a peer.
struct OutLane<S> {
    /// The serial number of the next send (carried in its ticket).
    next_s: u64,
    /// Sends waiting for their receiver's answer, by serial number.
    pending: HashMap<u64, S>,
    /// The next ordinal to queue: transfers leave in ordinal order.
    next_k: u64,
    /// Sends whose go came, by ordinal, waiting for the earlier ordinals.
    released: BTreeMap<u64, (S, NcclId)>,
    /// What broke the lane, if anything did (every later send fails with it).
    broken: Option<Error>,
    /// The device the lane's sends come from.
    device: Option<Device>,
}

impl<S> Default for OutLane<S> {
    fn default() -> Self {
        OutLane {
            next_s: 0,
            pending: HashMap::new(),
            next_k: 0,
            released: BTreeMap::new(),
            broken: None,
            device: None,
        }
    }
}

/// One direction from a peer to this rank.
#[derive(Default)]
struct InLane {
    next_k: u64,
    broken: Option<Error>,
    device: Option<Device>,
}

/// A group member's lanes: the protocol's whole state on this rank.
pub struct DeviceLanes<S, R> {
    out: HashMap<Key, OutLane<S>>,
    inn: HashMap<Key, InLane>,
    /// The group was destroyed on this rank: no lane is made any more.
    released: bool,
    actions: VecDeque<Action<S, R>>,
    draining: bool,
}

impl<S, R> Default for DeviceLanes<S, R> {
    fn default() -> Self {
        DeviceLanes {
            out: HashMap::new(),
            inn: HashMap::new(),
            released: false,
            actions: VecDeque::new(),
            draining: false,
        }
    }
}

/// Checks that a lane keeps to one device, and fixes it on first use.
fn same_device(lane: &mut Option<Device>, d: Device) -> Result<(), Error> {
    match *lane {
        Some(l) if l != d => Err(Error::invalid(format!(
            "device point-to-point between two ranks keeps to one device per direction: this \
             one is on {l}, the call on {d}"
        ))),
        _ => {
            *lane = Some(d);
            Ok(())
        }
    }
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// A go: `s`, `k`, `status` and `id`.
pub fn encode_go(s: u64, k: u64, status: u64, id: &NcclId) -> Vec<u8> {
    let mut b = Vec::with_capacity(GO_BYTES);
    b.extend_from_slice(&s.to_le_bytes());
    b.extend_from_slice(&k.to_le_bytes());
    b.extend_from_slice(&status.to_le_bytes());
    b.extend_from_slice(id);
    b
}

/// Makes `go` (of send `s`) a refusal, [`Refusal::Broken`].
fn refuse_go(go: &mut Vec<u8>) {
    let s = u64_at(go, 0).unwrap_or(u64::MAX);
    *go = encode_go(s, 0, Refusal::Broken as u64, &[0; ID_BYTES]);
}

fn malformed(peer: usize, what: String) -> Error {
    Error::Protocol {
        rank: peer,
        detail: ProtocolError::Malformed(what),
    }
}

impl<S, R> DeviceLanes<S, R> {
    /// A new send of the lane `key`, from `device`: its ticket, to send on the user's tag
    /// (the send then waits for its go). Refused, with the send given back, when the group
    /// was destroyed here, the lane is broken, or the lane's sends come from another
    /// device.
    pub fn send(
        &mut self,
        key: Key,
        device: Device,
        send: S,
    ) -> Result<[u8; TICKET_BYTES], (Error, S)> {
        if self.released {
            return Err((Error::Shutdown, send));
        }
        let lane = self.out.entry(key).or_default();
        if let Some(e) = &lane.broken {
            return Err((e.clone(), send));
        }
        if let Err(e) = same_device(&mut lane.device, device) {
            return Err((e, send));
        }
        let s = lane.next_s;
        lane.next_s += 1;
        lane.pending.insert(s, send);
        let mut ticket = [0u8; TICKET_BYTES];
        ticket[..8].copy_from_slice(&s.to_le_bytes());
        ticket[8] = key.1 as u8;
        Ok(ticket)
    }

    /// The serial number a ticket carries.
    pub fn ticket_serial(ticket: &[u8; TICKET_BYTES]) -> u64 {
        u64_at(ticket, 0).unwrap_or(u64::MAX)
    }

    /// Send `s` of lane `key` failed before its go (its ticket could not be sent, or its
    /// lane could not start): it fails with `e`, if it still waits.
    pub fn ticket_failed(&mut self, key: Key, s: u64, e: Error) -> Failed<S, R> {
        match self.out.get_mut(&key).and_then(|l| l.pending.remove(&s)) {
            Some(p) => Failed::send(p, e),
            None => Failed::default(),
        }
    }

    /// The receiver's answer `go` to one of this rank's tickets on lane `key`; `peer` is the
    /// receiver's global rank (for errors). A go queues the transfers next in ordinal
    /// order; a refusal fails its send; a malformed go, or one for a send that does not
    /// wait, or an ordinal given twice, breaks the lane.
    pub fn on_go(&mut self, key: Key, peer: usize, go: &[u8]) -> Failed<S, R> {
        let parsed = (
            u64_at(go, 0),
            u64_at(go, 8),
            u64_at(go, 16),
            go.get(24..GO_BYTES)
                .and_then(|i| <NcclId>::try_from(i).ok()),
        );
        let Some(lane) = self.out.get_mut(&key) else {
            return Failed::default();
        };
        let (Some(s), Some(k), Some(status), Some(id), GO_BYTES) =
            (parsed.0, parsed.1, parsed.2, parsed.3, go.len())
        else {
            let e = malformed(peer, format!("an answer of {} bytes", go.len()));
            return self.break_out(key, e);
        };
        let Some(send) = lane.pending.remove(&s) else {
            if lane.broken.is_some() {
                return Failed::default();
            }
            let e = malformed(peer, format!("an answer for send {s}, which does not wait"));
            return self.break_out(key, e);
        };
        if status != 0 {
            return Failed::send(send, Refusal::error(status, peer));
        }
        if let Some(e) = &lane.broken {
            return Failed::send(send, e.clone());
        }
        if k < lane.next_k || lane.released.contains_key(&k) {
            let e = malformed(peer, format!("ordinal {k} given twice"));
            let mut f = self.break_out(key, e.clone());
            f.sends.push((send, e));
            return f;
        }
        lane.released.insert(k, (send, id));
        while let Some((send, id)) = lane.released.remove(&lane.next_k) {
            let k = lane.next_k;
            lane.next_k += 1;
            self.actions
                .push_back(Action::Transfer { key, k, id, send });
        }
        Failed::default()
    }

    /// A receive matched a ticket from `src` (its rank in the group; `peer` is its global
    /// rank, for errors), into `device`. Queues the post of the lane's next transfer and
    /// the go, or a refusal with the receive failed. `make_id` makes the lane's NCCL id,
    /// called only for the first transfer of an NCCL lane.
    pub fn on_ticket(
        &mut self,
        src: usize,
        peer: usize,
        ticket: &[u8],
        device: Device,
        recv: R,
        make_id: impl FnOnce() -> Result<NcclId, Error>,
    ) -> Failed<S, R> {
        let s = u64_at(ticket, 0);
        let carrier = ticket.get(8).copied().and_then(Carrier::from_byte);
        let (Some(s), Some(carrier), TICKET_BYTES) = (s, carrier, ticket.len()) else {
            let e = malformed(
                peer,
                format!("a device send's ticket of {} bytes", ticket.len()),
            );
            return Failed::recv(recv, e);
        };
        let key = (src, carrier);
        let refuse = |why: Refusal| Action::Answer {
            key,
            go: encode_go(s, 0, why as u64, &[0; ID_BYTES]),
        };
        if self.released {
            self.actions.push_back(refuse(Refusal::Broken));
            return Failed::recv(recv, Error::Shutdown);
        }
        let lane = self.inn.entry(key).or_default();
        if let Some(e) = &lane.broken {
            self.actions.push_back(refuse(Refusal::Broken));
            return Failed::recv(recv, e.clone());
        }
        if let Err(e) = same_device(&mut lane.device, device) {
            self.actions.push_back(refuse(Refusal::Device));
            return Failed::recv(recv, e);
        }
        let k = lane.next_k;
        let mut id = [0u8; ID_BYTES];
        if k == 0 && carrier == Carrier::Nccl {
            match make_id() {
                Ok(i) => id = i,
                Err(e) => {
                    self.actions.push_back(refuse(Refusal::NoNccl));
                    return Failed::recv(recv, e);
                }
            }
        }
        lane.next_k += 1;
        self.actions.push_back(Action::Post { key, k, id, recv });
        self.actions.push_back(Action::Answer {
            key,
            go: encode_go(s, k, 0, &id),
        });
        Failed::default()
    }

    /// Transfer `k` of lane `key` (from a peer), just taken from the queue, could not be
    /// posted (the driver fails its receive): the lane breaks with `e`, and the go of `k`
    /// (still queued, right behind it) becomes a refusal, as does the go of every post of
    /// the lane still queued, whose receive fails.
    pub fn post_failed(&mut self, key: Key, k: u64, e: Error) -> Failed<S, R> {
        let f = self.break_in(key, e);
        for a in self.actions.iter_mut() {
            if let Action::Answer { key: k2, go } = a {
                if *k2 == key && u64_at(go, 8) == Some(k) && u64_at(go, 16) == Some(0) {
                    refuse_go(go);
                }
            }
        }
        f
    }

    /// Breaks the lane to a peer: every send waiting on it, or queued and not yet issued,
    /// fails with `e` (the first error stays), and so does every later one.
    pub fn break_out(&mut self, key: Key, e: Error) -> Failed<S, R> {
        let Some(lane) = self.out.get_mut(&key) else {
            return Failed::default();
        };
        let e = lane.broken.get_or_insert(e).clone();
        let released = std::mem::take(&mut lane.released).into_values();
        let mut sends: Vec<(S, Error)> = lane
            .pending
            .drain()
            .map(|(_, p)| p)
            .chain(released.map(|(s, _)| s))
            .map(|s| (s, e.clone()))
            .collect();
        let mut kept = VecDeque::with_capacity(self.actions.len());
        for a in self.actions.drain(..) {
            match a {
                Action::Transfer { key: k2, send, .. } if k2 == key => {
                    sends.push((send, e.clone()))
                }
                a => kept.push_back(a),
            }
        }
        self.actions = kept;
        Failed {
            sends,
            recvs: Vec::new(),
        }
    }

    /// Breaks the lane from a peer: every later ticket on it is refused, and every post
    /// queued and not yet issued is cancelled, its receive failed with `e` (the first
    /// error stays) and its go made a refusal.
    pub fn break_in(&mut self, key: Key, e: Error) -> Failed<S, R> {
        let e = self
            .inn
            .entry(key)
            .or_default()
            .broken
            .get_or_insert(e)
            .clone();
        let mut recvs = Vec::new();
        let mut cancelled = Vec::new();
        let mut kept = VecDeque::with_capacity(self.actions.len());
        for a in self.actions.drain(..) {
            match a {
                Action::Post {
                    key: k2, k, recv, ..
                } if k2 == key => {
                    cancelled.push(k);
                    recvs.push((recv, e.clone()));
                }
                a => kept.push_back(a),
            }
        }
        self.actions = kept;
        // The go of each cancelled post (still queued: it was queued after its post) tells
        // the sender no. A go whose post was issued stands.
        for a in self.actions.iter_mut() {
            if let Action::Answer { key: k2, go } = a {
                let k = u64_at(go, 8).unwrap_or(u64::MAX);
                if *k2 == key && u64_at(go, 16) == Some(0) && cancelled.contains(&k) {
                    refuse_go(go);
                }
            }
        }
        Failed {
            sends: Vec::new(),
            recvs,
        }
    }

    /// The group is destroyed on this rank: every lane breaks with [`Error::Shutdown`] (its
    /// waiting and queued sends and posts fail with it), and no lane is made any more.
    pub fn release(&mut self) -> Failed<S, R> {
        self.released = true;
        let mut f = Failed::default();
        let outs: Vec<Key> = self.out.keys().copied().collect();
        for key in outs {
            let g = self.break_out(key, Error::Shutdown);
            f.sends.extend(g.sends);
        }
        let ins: Vec<Key> = self.inn.keys().copied().collect();
        for key in ins {
            let g = self.break_in(key, Error::Shutdown);
            f.recvs.extend(g.recvs);
        }
        f
    }

    /// Starts issuing the queued actions: `false` when another thread is at it (it issues
    /// what was queued since, too).
    pub fn begin_drain(&mut self) -> bool {
        !std::mem::replace(&mut self.draining, true)
    }

    /// The next action to issue, by the thread that began the drain; `None` ends its drain.
    pub fn next_action(&mut self) -> Option<Action<S, R>> {
        let a = self.actions.pop_front();
        if a.is_none() {
            self.draining = false;
        }
        a
    }

    /// Ends a drain early (the draining thread unwound): the next drain may begin.
    pub fn abandon_drain(&mut self) {
        self.draining = false;
    }

    /// Actions queued and not yet issued.
    #[cfg(all(test, not(collectix_loom)))]
    fn queued(&self) -> usize {
        self.actions.len()
    }
}
