//! The shared-memory transport between the processes of one host.
//!
//! **Which pairs.** At join every rank publishes its host's identity ([`host_id`]: the boot's
//! id and the network namespace, or `COLLECTIX_HOST_ID`) with the name of a Unix socket;
//! two ranks with the same identity are on one host. Locality is decided per pair of ranks,
//! from what they published, never from a launcher's `LOCAL_WORLD_SIZE`: a group's members on
//! one host talk through shared memory, members on different hosts through TCP, whatever the
//! group. `COLLECTIX_TRANSPORT` chooses: `auto` (the default; a setup that fails falls back
//! to TCP with a warning), `shm` (a setup that fails is an error), `tcp` (no shared memory).
//!
//! **Segments.** Each process owns one segment, a sealed memfd with a ring per local peer
//! (`collectix_runtime::wire::shm`); a peer sends by writing frames into its ring there.
//! The memfds travel over Unix sockets ([`setup`]) and have no name: nothing is left behind
//! in `/dev/shm` when any process dies.
//!
//! **Progress.** A sender writes a frame into the ring itself (on the thread that sends,
//! usually the rank's caller); a frame that does not fit goes on as the reader frees room.
//! The receiving side is read by whoever is at hand: a caller of the rank waiting for its call
//! reads the rings on every turn of its spin ([`Poller`]), so a small call crosses no thread;
//! otherwise the process's progress thread, which parks on a futex in its segment (the
//! doorbell) and uses no CPU while the job is idle. A sender rings the doorbell only when
//! the receiving process has no caller reading and its thread is parked. The segment's
//! "a caller reads" word stays raised for up to 2 ms ([`LINGER`]) after the last caller left,
//! so a frame that comes between two calls of a caller (an exchange, in which both sides send
//! at once) rings nothing: the caller takes it a moment later. The progress thread looks at
//! least that often while the word is raised and lowers it once no caller came for a whole
//! wait; a caller that parks with its call not done lowers it as it leaves.
//!
//! **Loss.** The TCP connection of each pair stays open beside the rings, carrying heartbeats:
//! a process that dies, or stops, is lost as over TCP (at once for a `kill -9`, which closes
//! its sockets). Bytes a sender wrote but never published are never read. A ring whose
//! counters or frames are not valid makes its peer lost, with the reason in the log.
//!
//! **Restarts.** A restarted process (`COLLECTIX_INCARNATION` above 0) talks to its peers over
//! TCP, and they to it: the rings were set up with its first process.
//!
//! **Board.** When every rank of the job is on this host and every pair agreed on shared
//! memory, the world group's small calls run on a board ([`collectix_runtime::board`]): each
//! process's lane is in its own segment, after the header. A member that moved wakes a peer
//! whose lane says it has calls pending and nobody driving by ringing its doorbell; the
//! progress thread then makes the board progress. Other groups, and jobs across hosts, use
//! the engine for every call (for now).

mod hub;
mod os;
mod row;
mod setup;
#[cfg(test)]
mod tests;

pub(crate) use row::ROW;
pub(crate) use setup::Listener;

use crate::board::BoardSource;
use crate::rank::driver::{Driver, GroupBoard, GroupMail, MailPeer, Poller, PollerKind, Wake};
use crate::security::Security;
use crate::store::Store;
use crate::sync::lock;
use collectix_runtime::board::mail::Mailboxes;
use collectix_runtime::board::wake::{need_of_lane, Need};
use collectix_runtime::board::{Board, Lane};
use collectix_runtime::tensor::pool::Pool;
use collectix_runtime::wire::codec::Limits;
use collectix_runtime::wire::shm::{
    Callers, FrameReader, FrameWriter, Layout, Leave, RemoteRead, Rest, RingReader, RingWriter,
    Segment, Sent, Share, SharedRead, SingleCopy, Sources, HOLD,
};
use collectix_runtime::wire::{Link, LinkError, Message};
use collectix_runtime::{Error, Result};
use collectix_runtime::{GroupId, GroupInfo};

use collectix_runtime::tensor::shared_heap::SharedHeap;
use collectix_runtime::wire::shm::region::Region;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Each ring's capacity unless `COLLECTIX_SHM_RING` says otherwise (see
/// `docs/performance.md` for the sizes measured).
pub(crate) const DEFAULT_RING: u64 = 2 << 20;

/// Which large payloads go as remote records, read by the receiver out of the sender's
/// memory (`COLLECTIX_SHM_SINGLE_COPY`: unset, empty or `auto` for those of 8 MiB or more of
/// rooted collectives and point-to-point, `1` or `all` for every payload, `0` or `off` for
/// none; see [`SingleCopy`]).
pub(crate) fn single_copy_from_env() -> Result<SingleCopy> {
    match std::env::var("COLLECTIX_SHM_SINGLE_COPY") {
        Err(_) => Ok(SingleCopy::Auto),
        Ok(v) => match v.trim() {
            "" | "auto" => Ok(SingleCopy::Auto),
            "1" | "all" => Ok(SingleCopy::All),
            "0" | "off" => Ok(SingleCopy::Off),
            other => Err(Error::invalid(format!(
                "COLLECTIX_SHM_SINGLE_COPY is {other:?}; set it to auto (the default), all (or 1) or off (or 0)"
            ))),
        },
    }
}

/// The ring capacity from `COLLECTIX_SHM_RING` (bytes, a multiple of 64 from 4 KiB to 1 GiB).
pub(crate) fn ring_from_env() -> Result<u64> {
    match std::env::var("COLLECTIX_SHM_RING") {
        Err(_) => Ok(DEFAULT_RING),
        Ok(v) => v
            .trim()
            .parse::<u64>()
            .ok()
            .filter(|&n| Layout::new(1, n).is_ok())
            .ok_or_else(|| {
                Error::invalid(format!(
                    "COLLECTIX_SHM_RING is {v:?}; give bytes, a multiple of 64 from 4096 to 2^30"
                ))
            }),
    }
}

/// This host's identity as far as shared memory goes: `COLLECTIX_HOST_ID` if set, else the
/// kernel's boot id and this process's network namespace (processes that share both can
/// reach each other's abstract Unix sockets and memory; containers with network namespaces
/// of their own count as hosts apart).
pub(crate) fn host_id() -> String {
    if let Ok(id) = std::env::var("COLLECTIX_HOST_ID") {
        if !id.trim().is_empty() {
            return id.trim().replace(' ', "_");
        }
    }
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default();
    let net = std::fs::read_link("/proc/self/ns/net")
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default();
    format!("{host}/{boot}/{net}").replace(' ', "_")
}

/// What setting up a host's shared memory needs.
pub(crate) struct Setup<'a> {
    pub(crate) job: u64,
    pub(crate) rank: usize,
    /// The ranks of this host (this one included), with their sockets' names.
    pub(crate) local: BTreeMap<usize, String>,
    pub(crate) listener: Listener,
    pub(crate) security: &'a Security,
    /// Where the ranks of this host agree on the pairs that use shared memory.
    pub(crate) store: &'a dyn Store,
    /// Ranks in the job (the world group's board needs all of them on this host).
    pub(crate) world: usize,
    pub(crate) ring: u64,
    /// Which large payloads go as remote records (`COLLECTIX_SHM_SINGLE_COPY`): the
    /// receiver reads them from the sender's memory, one copy in all, where the kernel lets
    /// it; by default those of rooted collectives and point-to-point, see [`SingleCopy`].
    pub(crate) single_copy: SingleCopy,
    /// Bytes of this process's shared heap (0: none; see `COLLECTIX_SHM_HEAP`).
    pub(crate) heap: usize,
    pub(crate) limits: Limits,
    pub(crate) deadline: Instant,
}

/// How long the ranks of one host take at most to exchange their segments (within the
/// join's deadline).
const EXCHANGE: Duration = Duration::from_secs(30);

/// A process's shared memory: its segment, its peers', and its progress thread (stopped and
/// joined when dropped).
pub(crate) struct Hub {
    inner: Arc<Inner>,
    thread: Option<JoinHandle<()>>,
    /// The world group's board, when the whole job shares this host's memory.
    boards: Option<Arc<ShmBoards>>,
}

/// The world group's board across the processes of one host: each rank's lane in its own
/// segment.
struct ShmBoards {
    /// By world rank.
    lanes: Vec<Arc<dyn Lane>>,
    /// By world rank (`None` for this one).
    wake: Vec<Option<Arc<dyn Wake>>>,
    /// Each rank's mailbox in its segment, by world rank.
    boxes: Vec<Arc<dyn Lane>>,
    /// Each other rank's segment, to wake it for a message in its mailbox (`None` for this
    /// one).
    segs: Vec<Option<Arc<Segment>>>,
}

impl BoardSource for ShmBoards {
    fn board(&self, info: &GroupInfo) -> Option<Arc<GroupBoard>> {
        if info.id != GroupId::WORLD || info.members.len() != self.lanes.len() {
            return None;
        }
        let lanes = info
            .members
            .iter()
            .map(|&m| self.lanes.get(m).cloned())
            .collect::<Option<Vec<_>>>()?;
        let wake = info
            .members
            .iter()
            .map(|&m| self.wake.get(m).cloned().flatten())
            .collect();
        let board = Board::new(lanes, info.rank).ok()?;
        let boxes = info
            .members
            .iter()
            .map(|&m| self.boxes.get(m).cloned())
            .collect::<Option<Vec<_>>>()?;
        let peers = info
            .members
            .iter()
            .map(|&m| self.segs.get(m).cloned().flatten().map(MailPeer::Process))
            .collect();
        let mail = Mailboxes::new(boxes, info.rank).map(|b| GroupMail::new(b, peers));
        Some(Arc::new(GroupBoard::new(board, info.clone(), wake, mail)))
    }
}

/// How a member wakes a peer process for its board: the peer's lane says whether it needs it
/// (untrusted words: they decide a wake-up, nothing else), its doorbell wakes its progress
/// thread.
struct ShmWake {
    lane: Arc<dyn Lane>,
    seg: Arc<Segment>,
}

impl Wake for ShmWake {
    fn need(&self) -> Need {
        need_of_lane(&*self.lane)
    }

    /// The peer's progress thread, if it is parked and no caller of the peer reads (as for a
    /// frame in a ring).
    fn wake_now(&self) {
        nudge(&self.seg);
    }
}

/// The ring this process reads from one peer.
struct Reading {
    peer: usize,
    ring: RingReader,
    frames: FrameReader,
    /// The peer's segment: its doorbell, rung when it waits for room this side freed.
    theirs: Arc<Segment>,
    /// The peer's memory, where this process can read it (remote records).
    remote: Option<Arc<PeerMemory>>,
    /// The ring failed: nothing more is read from it.
    dead: bool,
}

/// A peer's memory as this process reads it for remote records: its shared heap, mapped
/// read-only here, and the rest of it with `process_vm_readv` where the kernel lets this
/// process (and it was asked for).
pub(crate) struct PeerMemory {
    /// The peer's heap: its mapping here and its address in the peer.
    heap: Option<(Region, u64)>,
    cma: Option<os::Remote>,
    /// Parts read from the peer's heap (shared with the hub's count).
    from_heap: Arc<AtomicU64>,
}

impl RemoteRead for PeerMemory {
    fn read(&self, addr: u64, dst: &mut [u8]) -> std::result::Result<(), String> {
        if let Some((region, base)) = &self.heap {
            let at = addr
                .checked_sub(*base)
                .and_then(|a| usize::try_from(a).ok());
            // A part that lies in the heap is copied out of the mapping (bounds-checked).
            if let Some(at) = at.filter(|&a| a < region.len()) {
                if !region.read(at, dst) {
                    return Err(format!(
                        "{} bytes at {at} run past the peer's shared heap of {}",
                        dst.len(),
                        region.len()
                    ));
                }
                self.from_heap.fetch_add(1, Ordering::Relaxed);
                return Ok(());
            }
        }
        match &self.cma {
            Some(r) => r.read(addr, dst),
            None => Err(format!("{:#x} is outside the peer's shared heap", addr)),
        }
    }
}

/// The shared heap's size from `COLLECTIX_SHM_HEAP` (bytes; 0 for none): address space,
/// whose pages cost memory once written.
pub(crate) fn heap_from_env() -> Result<usize> {
    match std::env::var("COLLECTIX_SHM_HEAP") {
        Err(_) => Ok(DEFAULT_HEAP),
        Ok(v) => v
            .trim()
            .parse::<usize>()
            .ok()
            .filter(|&n| n <= MAX_HEAP)
            .ok_or_else(|| {
                Error::invalid(format!(
                    "COLLECTIX_SHM_HEAP is {v:?}; give bytes, at most 2^40 (0: no heap)"
                ))
            }),
    }
}

/// Each process's shared heap unless `COLLECTIX_SHM_HEAP` says otherwise: 4 GiB of address
/// space (a page costs memory once written, and goes with the process).
pub(crate) const DEFAULT_HEAP: usize = 4 << 30;

/// The largest shared heap.
const MAX_HEAP: usize = 1 << 40;

/// This process's ring in one peer's segment.
struct Tx {
    frames: FrameWriter,
    /// A message was refused while a frame was in progress: the rank is told to flush once
    /// it is done.
    full: bool,
    /// The ring is corrupt: the link is closed.
    broken: bool,
}

struct Sending {
    peer: usize,
    theirs: Arc<Segment>,
    tx: Arc<Mutex<Tx>>,
}

struct Inner {
    own: Arc<Segment>,
    readers: Mutex<Vec<Reading>>,
    senders: Vec<Sending>,
    /// Frames in progress over all links (their pumping is skipped while none is).
    in_progress: AtomicUsize,
    /// Some link has lent messages to its receiver (remote records not yet acknowledged):
    /// the pumping lets go of those the receivers have read.
    lending: AtomicBool,
    /// Callers of this rank reading the rings now (the segment's `polling`, which peers
    /// read, stays raised for up to [`LINGER`] after the last one left): the runtime's
    /// doorbell protocol decides when it is lowered and how the progress thread rests.
    callers: Callers,
    /// The rank (weak: the driver holds this as its poller).
    driver: Weak<Driver>,
    pool: Pool,
    closing: AtomicBool,
    /// Payload parts read straight from a peer's shared heap.
    from_heap: Arc<AtomicU64>,
    /// Large remote parts being read, which every thread of this rank that looks helps with
    /// (`collectix_runtime::wire::shm::shared_read`): the progress thread, and a caller
    /// waiting while another thread reads the rings.
    helping: Mutex<Vec<Arc<SharedRead>>>,
    /// Reads posted to `helping` so far.
    split_reads: AtomicU64,
}

/// Wakes `seg`'s owner if it needs it (no caller of its reads, its thread parked).
pub(crate) fn nudge(seg: &Segment) {
    if seg.needs_wake() {
        seg.ring();
        os::wake(seg.doorbell());
    }
}

/// Most frames one reading takes from one ring before it looks at the others (and its caller
/// at its call).
const BURST: usize = 64;

impl Hub {
    /// Payload parts this rank read straight from a peer's shared heap (one copy each).
    pub(crate) fn heap_reads(&self) -> u64 {
        self.inner.from_heap.load(Ordering::Relaxed)
    }

    /// Large remote parts this rank read in pieces with every thread that helped.
    pub(crate) fn split_reads(&self) -> u64 {
        self.inner.split_reads.load(Ordering::Relaxed)
    }

    /// How many peers this rank reaches through shared memory.
    pub(crate) fn peers(&self) -> usize {
        self.inner.senders.len()
    }

    /// Where the rank's groups get boards (the world group's, when the whole job is on this
    /// host).
    pub(crate) fn boards(&self) -> Option<Arc<dyn BoardSource>> {
        self.boards.clone().map(|b| b as Arc<dyn BoardSource>)
    }
}

impl Drop for Hub {
    fn drop(&mut self) {
        self.inner.closing.store(true, Ordering::SeqCst);
        self.inner.own.ring();
        os::wake(self.inner.own.doorbell());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A link placeholder while the links are rebuilt.
struct Closed;

impl Link<Message> for Closed {
    fn try_send(&mut self, _: Message) -> std::result::Result<(), LinkError<Message>> {
        Err(LinkError::Closed)
    }
}

/// How long the progress thread parks at most before it looks whether the hub is closing.
const PARK: Duration = Duration::from_millis(500);
/// How long the segment's `polling` stays raised after the last caller left, at most: a
/// frame sent meanwhile rings no doorbell (a caller that comes back a moment later takes it,
/// as it does between two calls), and the progress thread looks at least this often while it
/// is raised, lowering it once no caller came for a whole wait. A call left to the
/// background is so delayed by at most about twice this; a caller that parks lowers it as it
/// leaves.
const LINGER: Duration = Duration::from_millis(2);

impl Inner {
    /// Reads the rings and hands what came to the rank with `deliver` (at most [`BURST`]
    /// frames per ring); whether anything came. `None` if someone else is reading now.
    fn read(
        &self,
        driver: &Driver,
        deliver: &dyn Fn(&Driver, usize, Message),
        progress: bool,
    ) -> Option<bool> {
        // A small message in this rank's mailbox (`rank::driver::mail`): the rank's drivers
        // take it; from the progress thread, the rank is asked for a run if none drives.
        let mail = self.own.take_mail_flag();
        if mail {
            driver.mail_came(progress);
        }
        let Ok(mut readers) = self.readers.try_lock() else {
            // Whoever reads may have posted a large part: take pieces of it.
            self.help_reads();
            return None;
        };
        let mut any = mail;
        let mut lost = Vec::new();
        let post = |job: &Arc<SharedRead>| {
            lock(&self.helping).push(job.clone());
            self.split_reads.fetch_add(1, Ordering::Relaxed);
            // The progress thread, even while callers read: it rests when they do.
            self.own.ring();
            os::wake(self.own.doorbell());
            // And the callers parked for their calls: a core they leave idle could copy.
            driver.wake_helpers();
        };
        for r in readers.iter_mut().filter(|r| !r.dead) {
            let mut wake = false;
            let src = Sources {
                pool: &self.pool,
                remote: r.remote.as_deref().map(|x| x as &dyn RemoteRead),
                landings: Some((r.peer, driver.landings())),
                share: r.remote.as_ref().map(|m| Share {
                    remote: m.clone(),
                    post: &post,
                }),
                now: driver.now(),
            };
            for _ in 0..BURST {
                match r.frames.next(&mut r.ring, &src, &mut wake) {
                    Ok(Some((header, payload))) => {
                        any = true;
                        deliver(
                            driver,
                            r.peer,
                            Message {
                                src: r.peer,
                                header,
                                payload,
                            },
                        );
                    }
                    Ok(None) => break,
                    Err(e) => {
                        tracing::warn!(peer = r.peer, reason = %e, "shared-memory ring lost");
                        r.dead = true;
                        lost.push(r.peer);
                        break;
                    }
                }
            }
            if wake {
                // The peer waits for room: its thread, if no caller of its pumps now.
                nudge(&r.theirs);
            }
        }
        drop(readers);
        for peer in lost {
            driver.peer_lost(peer);
        }
        Some(any)
    }

    /// Takes pieces of the large reads posted by the thread reading the rings until none is
    /// left; whether it took any.
    fn help_reads(&self) {
        let jobs: Vec<Arc<SharedRead>> = {
            let mut h = lock(&self.helping);
            h.retain(|j| !j.finished());
            h.clone()
        };
        for j in jobs {
            while j.help() {}
        }
    }

    /// Moves on the frames in progress; `Some(whether any went on)`, `None` if a link was
    /// busy (its holder moves it on, or the caller should look again).
    fn pump(&self, driver: &Driver) -> Option<bool> {
        if self.lending.swap(false, Ordering::AcqRel) {
            let mut still = false;
            for s in &self.senders {
                match s.tx.try_lock() {
                    Ok(mut tx) => {
                        // A corrupt acknowledgement is found again by the next send.
                        let _ = tx.frames.release();
                        still |= tx.frames.lent() > 0;
                    }
                    Err(_) => still = true,
                }
            }
            if still {
                self.lending.store(true, Ordering::Release);
            }
        }
        if self.in_progress.load(Ordering::Acquire) == 0 {
            return Some(false);
        }
        let mut any = false;
        let mut busy = false;
        for s in &self.senders {
            let Ok(mut tx) = s.tx.try_lock() else {
                busy = true;
                continue;
            };
            if !tx.frames.is_pending() || tx.broken || !tx.frames.has_room() {
                continue;
            }
            any = true;
            match tx.frames.pump() {
                Ok(false) => {
                    drop(tx);
                    nudge(&s.theirs);
                }
                Ok(true) => {
                    self.in_progress.fetch_sub(1, Ordering::AcqRel);
                    let flush = std::mem::take(&mut tx.full);
                    drop(tx);
                    nudge(&s.theirs);
                    if flush {
                        driver.flush(s.peer);
                    }
                }
                Err(e) => {
                    tx.broken = true;
                    self.in_progress.fetch_sub(1, Ordering::AcqRel);
                    drop(tx);
                    tracing::warn!(peer = s.peer, reason = %e, "shared-memory ring lost");
                    driver.peer_lost(s.peer);
                }
            }
        }
        if busy && !any {
            None
        } else {
            Some(any)
        }
    }

    /// Whether there may be work for the progress thread now (a lock held by someone else
    /// counts: what it guards may hold work this thread was woken for).
    fn has_work(&self) -> bool {
        if self.own.mail_flag() || lock(&self.helping).iter().any(|j| !j.finished()) {
            return true;
        }
        match self.readers.try_lock() {
            Err(_) => return true,
            Ok(readers) => {
                if readers
                    .iter()
                    .any(|r| !r.dead && r.ring.ready().map_or(true, |n| n > 0))
                {
                    return true;
                }
            }
        }
        self.in_progress.load(Ordering::Acquire) > 0
            && self.senders.iter().any(|s| {
                s.tx.try_lock().map_or(true, |t| {
                    t.frames.is_pending() && !t.broken && t.frames.has_room()
                })
            })
    }

    /// Whether a ring's reader keeps a remote record unread for its call (false while
    /// someone reads: they look again).
    fn holding(&self) -> bool {
        self.readers
            .try_lock()
            .is_ok_and(|rs| rs.iter().any(|r| !r.dead && r.frames.holding().is_some()))
    }

    /// The progress thread: reads and pumps while there is work, then parks on the doorbell.
    fn progress_loop(&self) {
        while !self.closing.load(Ordering::SeqCst) {
            let Some(driver) = self.driver.upgrade() else {
                return;
            };
            // A panic in what a completion runs (user code) must not end this thread: nothing
            // would read the rings any more.
            let worked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let read = self.read(&driver, &|d, src, msg| d.deliver_read(src, msg), true);
                let pumped = self.pump(&driver);
                let board = driver.board_progress();
                read != Some(false) || pumped != Some(false) || board
            }));
            match worked {
                Ok(true) => continue,
                Ok(false) => {}
                Err(_) => {
                    tracing::error!("a completion panicked on the shared-memory thread");
                    continue;
                }
            }
            let bell = Callers::going_to_sleep(&self.own);
            // A caller reading the rings now takes what comes; else anything published before
            // `sleeping` was seen is found here, and anything after rings the bell.
            // The board too: a member that moved before it saw `sleeping` is seen here.
            let board = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let moved = driver.board_progress_last();
                // This thread parks: whom it moved for and still need it are woken now.
                driver.board_flush();
                moved
            }))
            .unwrap_or(true);
            drop(driver);
            // Callers read (or did a moment ago, and `polling` still says so): look again
            // within the linger, lowering `polling` once no caller came for a whole wait
            // (senders ring from then on; what came before is read by the next turn).
            // A record kept unread for its call (`frames::HOLD`) is looked at again in time,
            // whoever rings.
            let (linger, park) = if self.holding() {
                (LINGER.min(HOLD), HOLD)
            } else {
                (LINGER, PARK)
            };
            match self.callers.rest(&self.own, bell, || {
                // A close whose doorbell came before `bell` is seen here.
                !self.has_work() && !board && !self.closing.load(Ordering::SeqCst)
            }) {
                Rest::Linger { bell, looks } => {
                    os::wait(self.own.doorbell(), bell, linger);
                    self.callers.lingered(&self.own, looks);
                }
                Rest::Park { bell } => os::wait(self.own.doorbell(), bell, park),
                Rest::Stay => {}
            }
            self.callers.woke(&self.own);
        }
    }

    /// A caller's read and pump; whether anything happened.
    fn poll_now(&self) -> bool {
        let Some(driver) = self.driver.upgrade() else {
            return false;
        };
        let read = self.read(&driver, &|d, src, msg| d.deliver(src, msg), false);
        let pumped = self.pump(&driver);
        read == Some(true) || pumped == Some(true)
    }
}

impl Poller for Inner {
    fn enter(&self) {
        self.callers.enter(&self.own);
    }

    fn poll(&self) -> bool {
        self.poll_now()
    }

    /// The last caller out leaves `polling` raised (the progress thread lowers it within
    /// [`LINGER`]), unless it parks: then it lowers it, and takes what a sender published
    /// before it saw no reader (after that, the sender rings).
    fn leave(&self) {
        let background = || {
            self.driver
                .upgrade()
                .is_some_and(|d| d.has_calls_in_flight())
        };
        match self.callers.leave(&self.own, background) {
            Leave::Done => {}
            Leave::ReadOnce => {
                self.poll_now();
                // A read takes a slice of a ring at a time (`frames::SLICE`): what a sender
                // published beyond it, before it saw no reader, rings nothing. The progress
                // thread takes it.
                if self.has_work() {
                    self.own.ring();
                    os::wake(self.own.doorbell());
                }
            }
            Leave::WakeProgress => {
                self.own.ring();
                os::wake(self.own.doorbell());
            }
        }
    }

    fn parking(&self) {
        self.callers.parking();
    }

    fn drain(&self) {
        let Some(driver) = self.driver.upgrade() else {
            return;
        };
        // The rings are read before a loss is handled: what a peer sent before it left (its
        // last frames, then its closed connection) is not overtaken by the loss.
        let deadline = Instant::now() + Duration::from_millis(10);
        while self
            .read(&driver, &|d, src, msg| d.deliver(src, msg), false)
            .is_none()
            && Instant::now() < deadline
        {
            std::thread::yield_now();
        }
    }
}

/// A rank's link to a peer of its host: frames into this rank's ring in the peer's segment.
struct ShmLink {
    peer: usize,
    tx: Arc<Mutex<Tx>>,
    theirs: Arc<Segment>,
    inner: Arc<Inner>,
    /// The TCP link to the peer: used once the peer's process is replaced.
    tcp: Box<dyn Link<Message> + Send>,
    incarnations: Arc<Vec<AtomicU32>>,
    /// The peer's incarnation the rings were set up with.
    at: u32,
}

impl Link<Message> for ShmLink {
    fn try_send(&mut self, msg: Message) -> std::result::Result<(), LinkError<Message>> {
        if self
            .incarnations
            .get(self.peer)
            .is_some_and(|a| a.load(Ordering::Relaxed) != self.at)
        {
            // The peer's process was replaced: nothing of the old one reads the ring again.
            let mut tx = lock(&self.tx);
            if tx.frames.is_pending() && !tx.broken {
                self.inner.in_progress.fetch_sub(1, Ordering::AcqRel);
            }
            tx.frames.abandon();
            drop(tx);
            return self.tcp.try_send(msg);
        }
        let mut tx = lock(&self.tx);
        if tx.broken {
            tx.frames.abandon();
            return Err(LinkError::Closed);
        }
        if tx.frames.is_pending() {
            // Moves the frame in progress on first (whoever holds the link does).
            match tx.frames.pump() {
                Ok(true) => {
                    self.inner.in_progress.fetch_sub(1, Ordering::AcqRel);
                }
                Ok(false) => {}
                Err(e) => {
                    tx.broken = true;
                    self.inner.in_progress.fetch_sub(1, Ordering::AcqRel);
                    tracing::warn!(peer = self.peer, reason = %e, "shared-memory ring lost");
                    return Err(LinkError::Closed);
                }
            }
        }
        let r = match tx.frames.send(msg) {
            Ok(Sent::Whole) => Ok(()),
            Ok(Sent::Partly) => {
                self.inner.in_progress.fetch_add(1, Ordering::AcqRel);
                Ok(())
            }
            Err((msg, None)) => {
                // A frame is still in progress: the rank is told to flush once it is done.
                tx.full = true;
                Err(LinkError::WouldBlock(msg))
            }
            Err((_, Some(e))) => {
                tx.broken = true;
                tracing::warn!(peer = self.peer, reason = %e, "shared-memory ring lost");
                return Err(LinkError::Closed);
            }
        };
        if tx.frames.lent() > 0 {
            self.inner.lending.store(true, Ordering::Release);
        }
        drop(tx);
        nudge(&self.theirs);
        r
    }
}
