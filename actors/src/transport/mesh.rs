//! The TCP connections of one process to its peers: a listener with an acceptor
//! thread, a slot per peer, and connections made at once ([`Connect::Eager`]) or on a link's
//! first message ([`Connect::Lazy`]).
//!
//! **One connection per pair.** When two ranks connect to each other at the same moment, the
//! lower rank answers the higher one's hello with "duplicate" ([`Refused::Duplicate`]) and
//! both keep the lower rank's connection; the higher rank's connector then waits for it. Should
//! two connections come up all the same (a hello accepted just before this rank's own
//! connector started), the first installed becomes this rank's link, on which it sends
//! everything, so its messages to that peer keep their order; each rank reads from both, and
//! the other stays open, idle, until the process leaves (closing it earlier would look like a
//! lost peer to the other side).
//!
//! **Lazy.** A link whose peer has no connection yet answers its first message with "would
//! block" and starts a connector thread; once the connection is up (opened or accepted), the
//! rank is told to flush ([`Inbound::flush`]) and sends what waited. A connection that cannot
//! be made is a lost peer ([`Inbound::lost`]).
//!
//! **Eager.** [`Mesh::connect_all`] connects to every higher rank and waits until every peer
//! has a connection: the lower ranks connect to this one, answered by the acceptor thread
//! meanwhile. The rank that never connects is named by the error.
//!
//! Eager is the default: see `docs/deployment.md` for the measurements at 32 and 64 processes
//! behind that choice. `COLLECTIX_CONNECT=lazy` chooses the other.

use super::tcp::{self, Connection, Hello, Inbound, Liveness, Refused, TcpLink};
use super::Link;
use crate::gate::{Gate, Pass};
use crate::security::Security;
use crate::sync::lock;
use collectix_runtime::tensor::arena::ArenaPart;
use collectix_runtime::tensor::pool::Pool;
use collectix_runtime::wire::codec::Limits;
use collectix_runtime::wire::{Header, LinkError, Message};
use collectix_runtime::{Error, LinkFailure, LinkStep, Result};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// When a process connects to its peers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Connect {
    /// Every pair at join: a rank learns of any peer's death at once, and the first calls pay
    /// nothing.
    Eager,
    /// A pair when one of them first sends to the other.
    Lazy,
}

impl Connect {
    /// From `COLLECTIX_CONNECT` (`eager` or `lazy`; unset is eager).
    pub fn from_env() -> Result<Connect> {
        match std::env::var("COLLECTIX_CONNECT") {
            Err(_) => Ok(Connect::Eager),
            Ok(v) => match v.trim() {
                "" | "eager" => Ok(Connect::Eager),
                "lazy" => Ok(Connect::Lazy),
                other => Err(Error::invalid(format!(
                    "COLLECTIX_CONNECT is {other:?}; set it to eager or lazy"
                ))),
            },
        }
    }
}

/// A peer's connection, as far as this rank's sending goes.
enum Slot {
    /// None yet.
    Idle,
    /// A connector is at work.
    Connecting,
    /// This rank's link to the peer.
    Up(TcpLink),
    /// The connector failed (the peer was reported lost).
    Failed,
}

/// What the links, the acceptor and the connectors share.
struct Shared {
    rank: usize,
    world: usize,
    job: u64,
    /// This process's incarnation of its rank (0, one more for each restart).
    incarnation: u32,
    /// The incarnation of each peer that this rank's connection to it is with: a connection
    /// from a higher one replaces it (the peer was restarted), one from a lower one is
    /// dropped, and only the current one's loss is reported.
    known: Arc<Vec<AtomicU32>>,
    /// Each peer's address ("host:port").
    addrs: Vec<String>,
    slots: Vec<Mutex<Slot>>,
    /// Every connection's threads, to join when leaving.
    connections: Mutex<Vec<Connection>>,
    /// Second connections' links, kept open until the process leaves.
    spare: Mutex<Vec<TcpLink>>,
    inbound: Arc<dyn Inbound>,
    limits: Limits,
    /// What each connection must prove, either way.
    security: Security,
    /// Heartbeats and how long a silent peer is given.
    liveness: Liveness,
    /// Received payloads' buffers, shared by every connection's reader.
    pool: Pool,
    /// Every connection's receiving side, for the rank's waiting callers to read.
    readers: Arc<tcp::Readers>,
    closing: AtomicBool,
}

impl Shared {
    /// Starts the threads of a connection made with `peer` and makes it this rank's link to
    /// the peer, unless it has one already. Whether it did.
    fn install(&self, stream: TcpStream, peer: usize, incarnation: u32) -> std::io::Result<bool> {
        // The slot is locked before the reader starts: whoever learns of a message that came
        // on the connection (and asks about the slot) finds it up.
        let mut slot = lock(&self.slots[peer]);
        let known = self.known[peer].load(Ordering::SeqCst);
        if incarnation < known {
            // A process of the peer's rank that was replaced already.
            return Ok(false);
        }
        let newer = incarnation > known;
        if newer {
            // A restarted process: its previous incarnation is gone for good, which the rank
            // hears before anything the new one sends.
            self.known[peer].store(incarnation, Ordering::SeqCst);
            tracing::info!(peer, incarnation, "a new incarnation of a peer connected");
            self.inbound.rejoined(peer);
        }
        let inbound: Arc<dyn Inbound> = Arc::new(Current {
            inner: self.inbound.clone(),
            known: self.known.clone(),
            peer,
            incarnation,
        });
        let (link, conn) = tcp::start(
            stream,
            peer,
            self.limits,
            inbound,
            self.liveness,
            self.pool.clone(),
            Some(&self.readers),
        )?;
        lock(&self.connections).push(conn);
        if self.closing.load(Ordering::SeqCst) {
            // Too late: the process is leaving (dropping the link closes the connection).
            return Ok(false);
        }
        if newer {
            // The previous incarnation's link (dead) goes.
            *slot = Slot::Up(link);
            drop(slot);
            self.inbound.flush(peer);
            return Ok(true);
        }
        if matches!(*slot, Slot::Up(_)) {
            drop(slot);
            lock(&self.spare).push(link);
            return Ok(false);
        }
        *slot = Slot::Up(link);
        drop(slot);
        // Whatever waited for the connection goes now.
        self.inbound.flush(peer);
        Ok(true)
    }

    /// Opens a connection to `peer` and installs it.
    fn connect(&self, peer: usize, within: Duration) -> Result<()> {
        let addr = &self.addrs[peer];
        let link_error = |failure: LinkFailure| Error::Link {
            rank: peer,
            addr: addr.clone(),
            failure,
        };
        let until = crate::sync::deadline_after(within);
        let mut s = connect_retrying(addr, within).map_err(|e| {
            link_error(LinkFailure::Io {
                step: LinkStep::Connect,
                detail: e.to_string(),
            })
        })?;
        let hello = Hello {
            job: self.job,
            from: self.rank as u32,
            to: peer as u32,
            world: self.world as u32,
            incarnation: self.incarnation,
        };
        // The answer comes within what is left of `within` (a stopped peer's kernel takes
        // the connection, and nothing answers).
        let left = until.saturating_duration_since(Instant::now());
        let _ = s.set_read_timeout(Some(
            tcp::HELLO_TIMEOUT.min(left.max(Duration::from_millis(1))),
        ));
        match tcp::connect(&mut s, hello, &self.security) {
            Ok(()) => {}
            Err(Refused::Duplicate) => {
                // The peer (a lower rank) is connecting to this one: its connection comes.
                drop(s);
                let deadline = crate::sync::deadline_after(within);
                while Instant::now() < deadline {
                    if matches!(*lock(&self.slots[peer]), Slot::Up(_)) {
                        return Ok(());
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
                return Err(link_error(LinkFailure::NeverCame));
            }
            Err(Refused::Auth(d)) => {
                return Err(Error::Unauthenticated {
                    peer: format!("rank {peer} at {addr}"),
                    reason: d.to_string(),
                })
            }
            Err(Refused::Link(failure)) => return Err(link_error(failure)),
        }
        let _ = s.set_read_timeout(None);
        let theirs = self.known[peer].load(Ordering::SeqCst);
        self.install(s, peer, theirs)
            .map(|_| ())
            .map_err(|e| Error::Resource(format!("cannot start rank {peer}'s link: {e}")))
    }

    /// Whether every peer has a link.
    fn missing(&self) -> Vec<usize> {
        (0..self.world)
            .filter(|&p| p != self.rank && !matches!(*lock(&self.slots[p]), Slot::Up(_)))
            .collect()
    }
}

/// A connection's view of the rank's inbound: everything goes through, but a loss only
/// while the connection is with its peer's current incarnation (the end of a replaced one's
/// connection is no news).
struct Current {
    inner: Arc<dyn Inbound>,
    known: Arc<Vec<AtomicU32>>,
    peer: usize,
    incarnation: u32,
}

impl Inbound for Current {
    fn deliver(&self, src: usize, msg: Message) {
        self.inner.deliver(src, msg);
    }
    fn deliver_driving(&self, src: usize, msg: Message) {
        self.inner.deliver_driving(src, msg);
    }
    fn place(&self, src: usize, header: &Header, lens: &[usize]) -> Option<Vec<ArenaPart>> {
        self.inner.place(src, header, lens)
    }
    fn flush(&self, peer: usize) {
        self.inner.flush(peer);
    }
    fn lost(&self, peer: usize) {
        if self.known[self.peer].load(Ordering::SeqCst) == self.incarnation {
            self.inner.lost(peer);
        }
    }
    fn dead(&self, peer: usize) {
        if self.known[self.peer].load(Ordering::SeqCst) == self.incarnation {
            self.inner.dead(peer);
        }
    }
    fn rejoined(&self, peer: usize) {
        self.inner.rejoined(peer);
    }
}

/// What every connection of a job's mesh shares.
#[derive(Clone, Debug)]
pub(crate) struct Settings {
    /// The job's identity (in every hello).
    pub job: u64,
    /// The frame decoder's limits.
    pub limits: Limits,
    /// This process's incarnation of its rank (0, one more for each restart).
    pub incarnation: u32,
    /// What each connection must prove, either way.
    pub security: Security,
    /// Heartbeats, and how long a silent peer is given.
    pub liveness: Liveness,
}

/// The connections of this process (see the module doc).
pub(crate) struct Mesh {
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
    /// Where a connection reaches the listener (to wake the acceptor when closing).
    wake: std::net::SocketAddr,
}

impl Mesh {
    /// Starts accepting on `listener` for rank `rank`; `addrs` are every rank's addresses
    /// (this rank's unused). Every connection, either way, must pass the settings' secret
    /// handshake, and is watched with their liveness. Nothing is connected yet.
    pub(crate) fn start(
        listener: TcpListener,
        rank: usize,
        addrs: Vec<String>,
        settings: Settings,
        inbound: Arc<dyn Inbound>,
    ) -> Result<Mesh> {
        let Settings {
            job,
            limits,
            incarnation,
            security,
            liveness,
        } = settings;
        let world = addrs.len();
        let mut wake = listener
            .local_addr()
            .map_err(|e| Error::Resource(format!("no local address: {e}")))?;
        if wake.ip().is_unspecified() {
            wake.set_ip(if wake.is_ipv4() {
                std::net::Ipv4Addr::LOCALHOST.into()
            } else {
                std::net::Ipv6Addr::LOCALHOST.into()
            });
        }
        let shared = Arc::new(Shared {
            rank,
            world,
            job,
            incarnation,
            known: Arc::new((0..world).map(|_| AtomicU32::new(0)).collect()),
            addrs,
            slots: (0..world).map(|_| Mutex::new(Slot::Idle)).collect(),
            connections: Mutex::new(Vec::new()),
            spare: Mutex::new(Vec::new()),
            inbound,
            limits,
            security,
            liveness,
            pool: Pool::new(tcp::RECV_POOL_BYTES),
            readers: Arc::new(tcp::Readers::new(world)),
            closing: AtomicBool::new(false),
        });
        let acceptor = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name(format!("collectix-accept-{rank}"))
                .spawn(move || accept_loop(&listener, &shared))
                .map_err(|e| Error::Resource(format!("cannot start the acceptor: {e}")))?
        };
        Ok(Mesh {
            shared,
            acceptor: Some(acceptor),
            wake,
        })
    }

    /// The connections' receiving sides, as the rank's waiting callers read them (the
    /// driver's poller for TCP).
    pub(crate) fn readers(&self) -> Arc<tcp::Readers> {
        self.shared.readers.clone()
    }

    /// The incarnation of each peer that this rank's connection to it is with (a restarted
    /// peer's is higher): another transport that set up a path to a peer's first process
    /// stops using it once this moves.
    pub(crate) fn incarnations(&self) -> Arc<Vec<AtomicU32>> {
        self.shared.known.clone()
    }

    /// The rank's links, one per global rank: `own` for itself.
    pub(crate) fn links(&self, own: Box<dyn Link<Message> + Send>) -> super::Links {
        let mut own = Some(own);
        (0..self.shared.world)
            .map(|peer| -> Box<dyn Link<Message> + Send> {
                match (peer == self.shared.rank).then(|| own.take()).flatten() {
                    Some(own) => own,
                    None => Box::new(PeerLink {
                        peer,
                        shared: self.shared.clone(),
                    }),
                }
            })
            .collect()
    }

    /// Eager connection: connects to every higher rank and waits (until `deadline`) until
    /// every peer has a connection. The timeout's error names the ranks still missing.
    pub(crate) fn connect_all(&self, deadline: Instant, timeout: Duration) -> Result<()> {
        let all: Vec<usize> = (0..self.shared.world).collect();
        self.connect_among(&all, deadline, timeout)
    }

    /// [`connect_all`](Mesh::connect_all) for the pairs of this rank with `peers` only (the
    /// peers of a lazy job it shares memory with: their connections tell when one is lost).
    pub(crate) fn connect_among(
        &self,
        peers: &[usize],
        deadline: Instant,
        timeout: Duration,
    ) -> Result<()> {
        let s = &self.shared;
        let left = || deadline.saturating_duration_since(Instant::now());
        for &peer in peers.iter().filter(|&&p| p > s.rank && p < s.world) {
            if matches!(*lock(&s.slots[peer]), Slot::Up(_)) {
                continue;
            }
            s.connect(peer, left())?;
        }
        let mut nap = Duration::from_micros(200);
        loop {
            let missing: Vec<usize> = s
                .missing()
                .into_iter()
                .filter(|p| peers.contains(p))
                .collect();
            if missing.is_empty() {
                return Ok(());
            }
            if left().is_zero() {
                return Err(Error::StoreTimeout {
                    what: format!("connections from ranks {missing:?}"),
                    waited_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
                });
            }
            std::thread::sleep(nap.min(left()));
            nap = (nap * 2).min(Duration::from_millis(20));
        }
    }

    /// A restarted process (a new incarnation of its rank) rejoining a running job: connects
    /// to every peer, in parallel, each within `within`; a peer that cannot be reached is
    /// reported lost (it may have died too), the others learn from the hello that this is a
    /// new incarnation and replace their link.
    pub(crate) fn rejoin_all(&self, within: Duration) {
        let s = &self.shared;
        std::thread::scope(|sc| {
            for peer in (0..s.world).filter(|&p| p != s.rank) {
                sc.spawn(move || {
                    if let Err(why) = s.connect(peer, within) {
                        tracing::warn!(peer, reason = %why, "a restarted rank cannot reach a peer");
                        *lock(&s.slots[peer]) = Slot::Failed;
                        s.inbound.lost(peer);
                    }
                });
            }
        });
    }

    /// How many peers this rank has a connection to (eager: all, once joined; lazy: those
    /// it has talked with).
    pub(crate) fn connected(&self) -> usize {
        let s = &self.shared;
        (0..s.world)
            .filter(|&p| p != s.rank && matches!(*lock(&s.slots[p]), Slot::Up(_)))
            .count()
    }

    /// Stops accepting, closes every link (each writer sends what it queued first) and waits
    /// for the writers. Call it once the rank actor is gone.
    pub(crate) fn close(&mut self) {
        let s = &self.shared;
        s.closing.store(true, Ordering::SeqCst);
        if let Some(t) = self.acceptor.take() {
            crate::sync::wake_acceptor(t, self.wake, "a rank's acceptor");
        }
        for slot in &s.slots {
            *lock(slot) = Slot::Failed;
        }
        lock(&s.spare).clear();
        // Bounded: a writer stuck on a peer that reads nothing more is left behind.
        let conns = std::mem::take(&mut *lock(&s.connections));
        let deadline = Instant::now() + CLOSE_TIMEOUT;
        for c in conns {
            while !c.writer.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
            if c.writer.is_finished() {
                let _ = c.writer.join();
            } else {
                tracing::warn!("a connection's writer did not finish sending; left behind");
            }
        }
    }
}

impl Drop for Mesh {
    fn drop(&mut self) {
        if self.acceptor.is_some() {
            self.close();
        }
    }
}

/// This rank's link to one peer: the slot's connection, made on the first message if need
/// be.
struct PeerLink {
    peer: usize,
    shared: Arc<Shared>,
}

impl Link<Message> for PeerLink {
    fn try_send(&mut self, msg: Message) -> std::result::Result<(), LinkError<Message>> {
        let mut slot = lock(&self.shared.slots[self.peer]);
        match &mut *slot {
            Slot::Up(link) => link.try_send(msg),
            Slot::Connecting => Err(LinkError::WouldBlock(msg)),
            Slot::Failed => Err(LinkError::Closed),
            Slot::Idle => {
                *slot = Slot::Connecting;
                drop(slot);
                if self.start_connecting(CONNECT_TIMEOUT) {
                    Err(LinkError::WouldBlock(msg))
                } else {
                    Err(LinkError::Closed)
                }
            }
        }
    }

    fn probe(&mut self, within: Duration) {
        let mut slot = lock(&self.shared.slots[self.peer]);
        if matches!(*slot, Slot::Idle) {
            *slot = Slot::Connecting;
            drop(slot);
            // Had no thread started, the slot is failed: the next message tells the loss.
            let _ = self.start_connecting(within);
        }
    }

    fn is_connecting(&self) -> bool {
        matches!(*lock(&self.shared.slots[self.peer]), Slot::Connecting)
    }
}

impl PeerLink {
    /// Starts a connector thread for the link (its slot says connecting), which tries for
    /// `within`; one that cannot connect reports the peer lost, then marks the slot failed.
    /// Whether the thread started (if not, the slot is failed).
    fn start_connecting(&self, within: Duration) -> bool {
        let (shared, peer) = (self.shared.clone(), self.peer);
        let started = std::thread::Builder::new()
            .name(format!("collectix-connect-{peer}"))
            .spawn(move || {
                if let Err(why) = shared.connect(peer, within) {
                    if matches!(*lock(&shared.slots[peer]), Slot::Up(_)) {
                        return;
                    }
                    tracing::warn!(peer, reason = %why, "cannot connect");
                    // Reported before the slot leaves "connecting": whoever waits for the
                    // connection to be made or not finds the loss told.
                    shared.inbound.lost(peer);
                    let mut slot = lock(&shared.slots[peer]);
                    if matches!(*slot, Slot::Connecting) {
                        *slot = Slot::Failed;
                    }
                }
            });
        if started.is_err() {
            *lock(&self.shared.slots[self.peer]) = Slot::Failed;
        }
        started.is_ok()
    }
}

/// How long leaving waits for the writers to send what they queued.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a lazy link tries to reach its peer. The peer was listening before it published
/// its address, so a peer that cannot be reached for this long is taken as lost.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

fn accept_loop(listener: &TcpListener, shared: &Arc<Shared>) {
    // Connections prove the secret in the gate, without a thread each; one that passes
    // reads its hello on a thread of its own, so that a slow one holds up nobody else.
    let gate = {
        let security = shared.security.clone();
        let shared = shared.clone();
        let pass: Pass = Box::new(move |s, deadline| {
            let shared = shared.clone();
            let _ = std::thread::Builder::new()
                .name("collectix-hello".into())
                .spawn(move || hello(s, &shared, deadline));
        });
        Gate::start(
            "collectix-link-gate",
            "a rank's listener",
            security,
            b"link",
            pass,
        )
    };
    let gate = match gate {
        Ok(g) => g,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the listener's gate: no peer can connect");
            return;
        }
    };
    loop {
        let accepted = listener.accept();
        if shared.closing.load(Ordering::SeqCst) {
            return;
        }
        match accepted {
            Ok((s, _)) => gate.admit(s),
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

/// A connection that passed the gate: its hello, by `deadline`, then its link.
fn hello(mut s: TcpStream, shared: &Arc<Shared>, deadline: Instant) {
    let from_addr = s
        .peer_addr()
        .map_or_else(|_| "?".to_string(), |a| a.to_string());
    let (job, me, world) = (shared.job, shared.rank as u32, shared.world as u32);
    let connecting = |from: u32| {
        shared
            .slots
            .get(from as usize)
            .is_some_and(|slot| matches!(*lock(slot), Slot::Connecting))
    };
    match tcp::accept_hello(&mut s, job, me, world, &connecting, deadline) {
        Ok((from, incarnation)) => {
            if let Err(e) = shared.install(s, from as usize, incarnation) {
                tracing::warn!(from, error = %e, "cannot start a link");
            }
        }
        Err(why) => tracing::warn!(%from_addr, reason = %why, "connection refused"),
    }
}

/// Connects to `addr`, retrying while nobody listens there yet, for at most `within`.
pub(crate) fn connect_retrying(addr: &str, within: Duration) -> std::io::Result<TcpStream> {
    let deadline = crate::sync::deadline_after(within);
    loop {
        let attempt = addr
            .to_socket_addrs()
            .and_then(|mut a| a.next().ok_or_else(|| std::io::Error::other("no address")))
            .and_then(|a| {
                TcpStream::connect_timeout(
                    &a,
                    Duration::from_secs(5).min(within.max(Duration::from_millis(1))),
                )
            });
        match attempt {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() >= deadline => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Nowhere;

    impl Inbound for Nowhere {
        fn deliver(&self, _: usize, _: Message) {}
        fn flush(&self, _: usize) {}
        fn lost(&self, _: usize) {}
    }

    /// Rank `rank` of a world whose addresses are `addrs`, in job `job`, listening on
    /// `listener`.
    fn mesh(listener: TcpListener, rank: usize, addrs: Vec<String>, job: u64) -> Mesh {
        let settings = Settings {
            job,
            limits: Limits::default(),
            incarnation: 0,
            security: Security::insecure(),
            liveness: Liveness::default(),
        };
        Mesh::start(listener, rank, addrs, settings, Arc::new(Nowhere))
            .unwrap_or_else(|e| panic!("{e}"))
    }

    fn listener() -> (TcpListener, String) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
        let addr = l.local_addr().unwrap_or_else(|e| panic!("{e}")).to_string();
        (l, addr)
    }

    /// A peer that cannot be reached, or that belongs to another job, is a typed link
    /// error naming the peer, its address and why: never a store error or a bare string.
    #[test]
    fn a_link_that_cannot_be_made_is_a_typed_error_naming_the_peer() {
        // Nobody listens at rank 1's address.
        let (l0, a0) = listener();
        let (gone, a1) = listener();
        drop(gone);
        let mut m = mesh(l0, 0, vec![a0, a1.clone()], 7);
        let within = Duration::from_millis(200);
        match m.connect_all(crate::sync::deadline_after(within), within) {
            Err(Error::Link {
                rank: 1,
                addr,
                failure:
                    LinkFailure::Io {
                        step: LinkStep::Connect,
                        ..
                    },
            }) => assert_eq!(addr, a1),
            other => panic!("{other:?}"),
        }
        m.close();
        // Rank 1 listens, but in another job: it refuses the hello, and says why.
        let (l0, a0) = listener();
        let (l1, a1) = listener();
        let mut other = mesh(l1, 1, vec![a0.clone(), a1.clone()], 8);
        let mut m = mesh(l0, 0, vec![a0, a1], 7);
        let within = Duration::from_secs(5);
        match m.connect_all(crate::sync::deadline_after(within), within) {
            Err(Error::Link {
                rank: 1,
                failure: LinkFailure::Refused { reason },
                ..
            }) => {
                let want = LinkFailure::OtherJob { theirs: 7, ours: 8 };
                assert_eq!(reason, want.to_string());
            }
            other => panic!("{other:?}"),
        }
        m.close();
        other.close();
    }

    /// Closing wakes the acceptor and waits for it; when the wake-up connection is lost
    /// (here: it goes where nobody listens, as a SYN dropped on a lossy link did in the
    /// process chaos run, `cli/tests/suite/chaos.rs`), closing still returns, within its bound. It
    /// used to wait for the acceptor forever.
    #[test]
    fn closing_returns_when_the_acceptor_cannot_be_woken() {
        let (l0, a0) = listener();
        let (gone, a1) = listener();
        let nowhere = gone.local_addr().unwrap_or_else(|e| panic!("{e}"));
        drop(gone);
        let mut m = mesh(l0, 0, vec![a0, a1], 7);
        m.wake = nowhere;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            m.close();
            let _ = tx.send(());
        });
        assert!(
            rx.recv_timeout(crate::sync::WAKE_TIMEOUT + Duration::from_secs(10))
                .is_ok(),
            "close did not return"
        );
    }

    /// What one rank's mesh tells its rank, in order.
    #[derive(Clone, Default)]
    struct Told(Arc<Mutex<Vec<String>>>);

    impl Inbound for Told {
        fn deliver(&self, src: usize, _: Message) {
            lock(&self.0).push(format!("message from {src}"));
        }
        fn flush(&self, _: usize) {}
        fn lost(&self, peer: usize) {
            lock(&self.0).push(format!("lost {peer}"));
        }
        fn rejoined(&self, peer: usize) {
            lock(&self.0).push(format!("rejoined {peer}"));
        }
    }

    impl Told {
        fn has(&self, what: &str) -> bool {
            lock(&self.0).iter().any(|e| e == what)
        }
        fn wait_for(&self, what: &str) {
            let start = Instant::now();
            while !self.has(what) {
                assert!(
                    start.elapsed() < Duration::from_secs(10),
                    "never told {what:?}"
                );
                std::thread::sleep(Duration::from_millis(2));
            }
        }
    }

    struct Nothing;
    impl Link<Message> for Nothing {
        fn try_send(&mut self, _: Message) -> std::result::Result<(), LinkError<Message>> {
            Ok(())
        }
    }

    fn mesh_as(
        listener: TcpListener,
        rank: usize,
        addrs: Vec<String>,
        incarnation: u32,
        inbound: Arc<dyn Inbound>,
    ) -> Mesh {
        let settings = Settings {
            job: 7,
            limits: Limits::default(),
            incarnation,
            security: Security::insecure(),
            liveness: Liveness::default(),
        };
        Mesh::start(listener, rank, addrs, settings, inbound).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Rank 1 is restarted (a new process at a new address, incarnation 1) and rejoins: rank 0
    /// hears that it rejoined, takes its messages on the new connection, and does not take
    /// the end of the old process's connection for the new one's loss; the new one's end is.
    #[test]
    fn a_restarted_peer_replaces_its_connection_and_only_its_own_end_is_a_loss() {
        let (l0, a0) = listener();
        let (l1, a1) = listener();
        let told = Told::default();
        let mut m0 = mesh_as(
            l0,
            0,
            vec![a0.clone(), a1.clone()],
            0,
            Arc::new(told.clone()),
        );
        let mut m1 = mesh_as(l1, 1, vec![a0.clone(), a1], 0, Arc::new(Nowhere));
        let within = Duration::from_secs(10);
        std::thread::scope(|s| {
            s.spawn(|| m1.connect_all(Instant::now() + within, within));
            m0.connect_all(Instant::now() + within, within)
                .unwrap_or_else(|e| panic!("{e}"));
        });
        let (l1b, a1b) = listener();
        let mut m1b = mesh_as(l1b, 1, vec![a0, a1b], 1, Arc::new(Nowhere));
        m1b.rejoin_all(within);
        told.wait_for("rejoined 1");
        let mut links = m1b.links(Box::new(Nothing));
        let credit = Message {
            src: 1,
            header: collectix_runtime::wire::message::Header::Credit {
                group: collectix_runtime::GroupId::WORLD,
                calls: 1,
            },
            payload: Vec::new(),
        };
        assert!(links[0].try_send(credit).is_ok());
        told.wait_for("message from 1");
        // The old process goes: its connection's end is no news.
        m1.close();
        std::thread::sleep(Duration::from_millis(200));
        assert!(!told.has("lost 1"), "{:?}", lock(&told.0));
        drop(links);
        m1b.close();
        told.wait_for("lost 1");
        m0.close();
    }
}
