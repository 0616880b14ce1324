//! [`Process`]: this process's rank of a multi-process job, joined over TCP.
//!
//! [`init`] reads the job's settings ([`JobConfig`]), meets the other ranks through the
//! store, connects to every peer (rank `i` connects to every `j > i` and accepts the others,
//! each connection opened with the link's handshake), and starts this rank's actor with a TCP
//! link per peer. The result is the world communicator, as `init_process_group` gives.
//!
//! Joining, step by step:
//! 1. rank 0 serves the TCP store (a `file://` rendezvous needs none);
//! 2. every rank listens on a port of its own and publishes `addr/RANK` (the address it is
//!    reached at: `COLLECTIX_ADDR` if set, else the local address of its route to the store);
//!    rank 0 publishes the job's identity (`job`);
//! 3. every rank waits for all the addresses: a rank that never arrives is named by the
//!    timeout's error (`Error::StoreTimeout`, the missing `addr/…` keys);
//! 4. connections, then the actor.
//!
//! Leaving ([`Process::shutdown`]): the rank stops taking calls, fails those still waiting,
//! sends what flow control still holds as peers grant credit (for at most the linger), then
//! waits (bounded) until every rank has left the same way, so that no rank mistakes another's
//! orderly exit for a lost peer; then the connections close after their queues are sent.

mod join;

use crate::addr;
use crate::assemble::{assemble, Birth};
use crate::comm::Communicator;
use crate::job::{InitArgs, JobConfig, Rendezvous};
use crate::rank::actor::Leave;
use crate::rank::driver::{
    spin_from_env, Driver, DEFAULT_SPIN_TCP, YIELD_TURNS, YIELD_TURNS_SPARSE,
};
use crate::rank::system;
use crate::security::Security;
use crate::store::{
    FileStore, PrefixStore, Store, StoreProtocol, TcpStore, TcpStoreServer, TorchStore,
};
use crate::transport::mesh::{Connect, Mesh, Settings};
use crate::transport::row::{Running, Starting};
#[cfg(target_os = "linux")]
use crate::transport::shm;
use crate::transport::table;
use crate::transport::tcp::{Inbound, Liveness};
use crate::transport::Transport;
use actix::System;
use collectix_runtime::join::{world_locality, Offer, Setting};
use collectix_runtime::tensor::arena::ArenaPart;
use collectix_runtime::wire::codec::Limits;
use collectix_runtime::wire::{Header, Link, LinkError, Message};
use collectix_runtime::{Error, GroupInfo, GroupOptions, Result};
use join::join;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, TcpListener};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long `Process::abort` waits for messages queued in front of connections still being
/// made.
const ABORT_FLUSH: Duration = Duration::from_secs(2);
/// How long a leaving rank keeps sending what flow control holds, and how long it waits for
/// the others to leave.
const LINGER: Duration = Duration::from_secs(10);
/// How long the rank serving the store keeps it after its own join failed, while other ranks
/// are still connected to it.
const JOIN_LINGER: Duration = Duration::from_secs(5);
/// How long the rank serving the store waits at most, once every rank said it is gone, for
/// the answers to those last requests to be written.
const ANSWERED: Duration = Duration::from_secs(1);
/// How long a rank's status responder tries its store connection again once it broke (the
/// store's rank closed it: the job is ending).
const STATUS_RECONNECT: Duration = Duration::from_secs(1);

/// This process's rank of a multi-process job.
pub struct Process {
    comm: Communicator,
    config: JobConfig,
    store: Arc<dyn Store>,
    system: Option<System>,
    thread: Option<JoinHandle<()>>,
    mesh: Option<Mesh>,
    /// The transports beside the TCP connections that carry messages to some peers
    /// (`transport::table`): shared memory with the ranks of this host, unless alone on it or
    /// over TCP only. Dropped (stopped) after the connections close.
    transports: Vec<Box<dyn Running>>,
    /// Which transport carries each peer, by rank (`shm`, `tcp`; `self`).
    paths: Vec<&'static str>,
    server: Option<TcpStoreServer>,
    address: String,
    /// Answers `collectix status` (a TCP job's ranks only); stops when dropped.
    _status: Option<crate::status::Responder>,
}

/// Hands a connection's arrivals, its "can take more" and its loss to the rank's driver,
/// from the connection's own threads: the same hot path as the in-process links.
struct ToRank(Arc<Driver>);

impl Inbound for ToRank {
    fn deliver(&self, src: usize, msg: Message) {
        self.0.deliver_read(src, msg);
    }
    fn deliver_driving(&self, src: usize, msg: Message) {
        self.0.deliver(src, msg);
    }
    fn place(&self, src: usize, header: &Header, lens: &[usize]) -> Option<Vec<ArenaPart>> {
        self.0.landings().place(src, header, lens)
    }
    fn flush(&self, peer: usize) {
        self.0.flush(peer);
    }
    fn lost(&self, peer: usize) {
        self.0.peer_lost(peer);
    }
    fn dead(&self, peer: usize) {
        self.0.peer_dead(peer);
    }
    fn rejoined(&self, peer: usize) {
        self.0.peer_rejoined(peer);
    }
}

/// The link to this rank itself (the engine never sends to itself; were it to, the message
/// would go to the rank's own inbox).
struct SelfLink(usize, Arc<Driver>);

impl Link<Message> for SelfLink {
    fn try_send(&mut self, msg: Message) -> std::result::Result<(), LinkError<Message>> {
        self.1.deliver(self.0, msg);
        Ok(())
    }
}

/// A client of the job's TCP store at `addr`, in `protocol`.
fn connect_store(
    addr: String,
    protocol: StoreProtocol,
    timeout: Duration,
    security: &Security,
) -> Result<Arc<dyn Store>> {
    Ok(match protocol {
        StoreProtocol::Collectix => {
            Arc::new(TcpStore::connect_secured(addr, timeout, security.clone())?)
        }
        StoreProtocol::Torch => Arc::new(TorchStore::connect(addr, timeout)?),
    })
}

/// The store as this attempt of the job sees it: under torchrun's restarts, its keys apart
/// (`JobConfig::attempt`).
fn attempt_keys(config: &JobConfig, store: Arc<dyn Store>) -> Arc<dyn Store> {
    match config.attempt {
        0 => store,
        n => Arc::new(PrefixStore::new(format!("worker/attempt_{n}"), store)),
    }
}

/// A connection of its own for the status responder, whose waits hold it (`None` if the
/// store cannot be reached). Once the store is gone (the job ends) the responder stops at
/// its first failed request (collectix's client tries the connection again for a second
/// first, not for the connect timeout).
fn status_store(
    config: &JobConfig,
    addr: String,
    timeout: Duration,
    security: &Security,
) -> Option<Box<dyn Store>> {
    let store: Arc<dyn Store> = match config.store_protocol {
        StoreProtocol::Collectix => {
            let s = TcpStore::connect_secured(addr, timeout, security.clone()).ok()?;
            Arc::new(s.reconnect_within(STATUS_RECONNECT))
        }
        StoreProtocol::Torch => Arc::new(TorchStore::connect(addr, timeout).ok()?),
    };
    Some(Box::new(attempt_keys(config, store)))
}

/// This host's identity (see `transport::shm::host_id`; elsewhere than Linux, its name or
/// `COLLECTIX_HOST_ID`).
fn host_identity() -> String {
    #[cfg(target_os = "linux")]
    {
        shm::host_id()
    }
    #[cfg(not(target_os = "linux"))]
    {
        std::env::var("COLLECTIX_HOST_ID").unwrap_or_else(|_| "host".to_owned())
    }
}

/// "host:port", with an IPv6 address in brackets.
fn host_port(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Listens for peers on `ip` (this rank's address), or on every address when that one is not
/// this host's (a name behind NAT) and any address is allowed.
fn listen(ip: &str, security: &Security) -> Result<TcpListener> {
    let ip = addr::resolve_ip(ip).unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
    security.check_bind(ip, "this rank")?;
    TcpListener::bind((ip, 0))
        .or_else(|e| {
            if security.any_address() {
                TcpListener::bind((Ipv6Addr::UNSPECIFIED, 0))
                    .or_else(|_| TcpListener::bind((Ipv4Addr::UNSPECIFIED, 0)))
            } else {
                Err(e)
            }
        })
        .map_err(|e| Error::Resource(format!("cannot listen for peers on {ip}: {e}")))
}

/// Joins the job: see the module doc. `options` are the world group's; `timeout` bounds the
/// whole join (the store, the other ranks' arrival, the connections). What `args` leaves out
/// comes from the environment; [`Process::builder`] gives the same in code.
pub fn init(args: &InitArgs, options: GroupOptions, timeout: Duration) -> Result<Process> {
    init_with(args, options, timeout, true)
}

/// [`init`]; with `environment` false, the job's variables (rank, size, store, secret,
/// address, transport, connection, liveness) are not read, and what `args` leaves out has
/// its default.
pub(crate) fn init_with(
    args: &InitArgs,
    options: GroupOptions,
    timeout: Duration,
    environment: bool,
) -> Result<Process> {
    let own = environment;
    let env = |k: &str| if own { std::env::var(k).ok() } else { None };
    let config = JobConfig::resolve(args, &env)?;
    let security = match &args.security {
        Some(s) => s.clone(),
        None => Security::resolve(&env)?,
    };
    let liveness = match args.liveness {
        Some(l) => l,
        None if own => Liveness::from_env()?,
        None => Liveness::default(),
    };
    let connect = match args.connect {
        Some(c) => c,
        None if own => Connect::from_env()?,
        None => Connect::Eager,
    };
    let transport = match args.transport {
        Some(t) => t,
        None if own => Transport::from_env()?,
        None => Transport::Auto,
    };
    let (rank, world) = (config.rank, config.world_size);
    let deadline = crate::sync::deadline_after(timeout);
    let left = || deadline.saturating_duration_since(Instant::now());
    // 1. The store.
    let (store, server, store_host): (Arc<dyn Store>, _, Option<String>) = match &config.rendezvous
    {
        Rendezvous::Tcp { host, port } => {
            let protocol = config.store_protocol;
            let server = if rank == 0 && !config.launcher_store {
                Some(TcpStoreServer::for_job(host, *port, &security, protocol)?)
            } else {
                None
            };
            let client = connect_store(host_port(host, *port), protocol, left(), &security)?;
            (attempt_keys(&config, client), server, Some(host.clone()))
        }
        Rendezvous::File { path } => (Arc::new(FileStore::new(path)?), None, None),
    };
    let joined = join(Joining {
        rank,
        world,
        standbys: config.standbys,
        options,
        store: &store,
        store_host: store_host.as_deref(),
        security: &security,
        liveness,
        connect,
        transport,
        host_id: args.host_id.clone(),
        address: args.address.as_deref(),
        interface: args.interface.as_deref(),
        environment,
        incarnation: config.incarnation,
        deadline,
        timeout,
    });
    match joined {
        Ok(Joined {
            comm,
            system,
            thread,
            mesh,
            address,
            transports,
            paths,
        }) => {
            let status = match &config.rendezvous {
                Rendezvous::Tcp { host, port } => {
                    status_store(&config, host_port(host, *port), left(), &security).map(|s| {
                        crate::status::Responder::start(rank, comm.member.rank.driver.clone(), s)
                    })
                }
                Rendezvous::File { .. } => None,
            };
            Ok(Process {
                comm,
                config,
                store,
                system: Some(system),
                thread: Some(thread),
                mesh: Some(mesh),
                transports,
                paths,
                server,
                address,
                _status: status,
            })
        }
        Err(e) => {
            // The others' joins are timing out about now too: the store stays up until they
            // are done with it (for at most JOIN_LINGER), so that their errors name the
            // missing ranks, not a vanished store. On this thread: a thread of its own died
            // with the process if the caller exited at once.
            if let Some(server) = server {
                drop(store);
                if !server.wait_idle(JOIN_LINGER) {
                    tracing::debug!(
                        clients = server.clients(),
                        "the store's clients were still connected after the linger"
                    );
                }
            }
            Err(e)
        }
    }
}

/// What joining gives.
struct Joined {
    /// The world communicator.
    comm: Communicator,
    /// The actor system and its thread.
    system: System,
    thread: JoinHandle<()>,
    /// The TCP connections.
    mesh: Mesh,
    /// The address this rank published.
    address: String,
    /// The transports beside the connections that keep something running.
    transports: Vec<Box<dyn Running>>,
    /// Which transport carries each peer (`shm`, `tcp`; `self`), by rank.
    paths: Vec<&'static str>,
}

/// What [`join`] needs once the store is there: this rank's place in the job, the store the
/// ranks meet through, how the connections are made, and the time the join has.
struct Joining<'a> {
    /// This rank.
    rank: usize,
    /// Ranks in the job, and how many of them (the last) are hot standbys.
    world: usize,
    standbys: usize,
    /// The world group's options.
    options: GroupOptions,
    /// The job's store.
    store: &'a Arc<dyn Store>,
    /// The store's host, for a TCP store: the address this rank publishes may be the local
    /// end of its route there (see [`addr::own_ip`]).
    store_host: Option<&'a str>,
    /// What the connections demand of those who connect, and where this rank may listen.
    security: &'a Security,
    /// How the connections tell a silent peer from a quiet one.
    liveness: Liveness,
    /// When this rank connects to its peers: eager connection makes every connection
    /// before the join returns.
    connect: Connect,
    /// Whether the ranks of one host use shared memory.
    transport: Transport,
    /// This process's host identity, if the program gave one.
    host_id: Option<String>,
    /// The address this rank is reached at, given in code ([`InitArgs::address`]).
    address: Option<&'a str>,
    /// The interface whose address that is, given in code ([`InitArgs::interface`]).
    interface: Option<&'a str>,
    /// Whether `COLLECTIX_ADDR` and `COLLECTIX_SOCKET_IFNAME` may say it instead.
    environment: bool,
    /// Which process of its rank this is (0, one more for each restart).
    incarnation: u32,
    /// When the whole join must be done.
    deadline: Instant,
    /// The whole join's length, which a timeout's error reports.
    timeout: Duration,
}

impl Process {
    /// This rank's world communicator.
    pub fn communicator(&self) -> &Communicator {
        &self.comm
    }

    /// How many peers this rank has a connection to: every one with eager connection, the
    /// ones it has talked with (either way) with lazy connection.
    pub fn connected_peers(&self) -> usize {
        self.mesh.as_ref().map_or(0, Mesh::connected)
    }

    /// The transport that carries this rank's messages to `peer`: `shm` (shared memory, the
    /// ranks of its host), `tcp`, or `self`; `None` for a rank not in the job.
    pub fn transport_to(&self, peer: usize) -> Option<&'static str> {
        self.paths.get(peer).copied().filter(|p| !p.is_empty())
    }

    /// How many peers this rank reaches through shared memory (the other ranks of its host,
    /// unless `COLLECTIX_TRANSPORT=tcp` or shared memory could not be set up).
    pub fn shm_peers(&self) -> usize {
        (self.transports.iter())
            .filter(|t| t.name() == "shm")
            .map(|t| t.peers())
            .sum()
    }

    /// How many messages this rank has read straight into their place in a call's output
    /// (large outputs, over shared memory or TCP: no buffer of their own, no join; see
    /// `docs/architecture.md`, "Received into place").
    pub fn landed(&self) -> u64 {
        self.comm.member.rank.driver.landings().placed()
    }

    /// How many payload parts this rank read straight from a peer's shared heap: payloads
    /// of tensors in shared memory (`Communicator::alloc_shared`, and large outputs between
    /// processes of one host), copied once, out of the peer's memory.
    pub fn read_from_shared_heaps(&self) -> u64 {
        self.transports.iter().map(|t| t.heap_reads()).sum()
    }

    /// How many large payload parts (8 MiB or more) this rank read out of a peer's memory in
    /// pieces shared with its other threads (its transport's progress thread, its waiting
    /// callers): the receiver's single copy, done with every core that looks.
    pub fn split_reads(&self) -> u64 {
        self.transports.iter().map(|t| t.split_reads()).sum()
    }

    /// The address ("host:port") this rank listens on for its peers, as it published it.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// The job's store (torch's default store): every rank of the job sees the same keys.
    /// collectix keeps its own keys in it (`addr/…`, `job`, `left/…`, `gone/…`); a program
    /// should use a prefix of its own ([`PrefixStore`](crate::PrefixStore)).
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The job's settings as this process read them.
    pub fn config(&self) -> &JobConfig {
        &self.config
    }

    /// Leaves the job in order (see the module doc) and returns this rank's pending error,
    /// if any: a failure of a group that no call of this rank returned.
    pub fn shutdown(mut self) -> Result<()> {
        let pending = self.leave();
        match pending.into_iter().next() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Leaves at once, without waiting for the other ranks (torch's `abort`): the rank's
    /// actor stops, what its links had queued (an abort this rank sent its peers when a call
    /// failed, say) is sent — bounded, 10 s at most — and the connections close. For a rank
    /// that failed and is about to exit: its peers then learn of the failure itself, not only
    /// of a closed connection. (The store this rank may serve closes too.)
    pub fn abort(mut self) {
        // What waits in front of a connection still being made (a lazy one: the abort of a
        // revoke, say) goes first, for a moment: else it is dropped with the links, and the
        // peer hears only that this rank was lost.
        let driver = self.comm.member.rank.driver.clone();
        let deadline = Instant::now() + ABORT_FLUSH;
        while driver.queued() > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        if let Some(system) = self.system.take() {
            system.stop();
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Some(mut mesh) = self.mesh.take() {
            mesh.close();
        }
        self.transports.clear();
    }

    fn leave(&mut self) -> Vec<Error> {
        let Some(system) = self.system.take() else {
            return Vec::new();
        };
        let (tx, rx) = mpsc::channel();
        if let Some(addr) = &self.comm.member.rank.addr {
            addr.do_send(Leave {
                linger: LINGER,
                done: tx,
            });
        }
        let pending = rx.recv_timeout(LINGER * 2).unwrap_or_default();
        // Every rank has left (or the wait ran out): closing now harms nobody. Ranks this one
        // saw lost never will leave: they are not waited for.
        let (rank, world) = (self.config.rank, self.config.world_size);
        let lost = self.comm.member.rank.driver.lost_peers();
        // The standbys are not waited for: they stay until the job is over.
        let world = world - self.config.standbys;
        let alive = || (0..world).filter(|r| !lost.contains(r));
        // The store is gone with rank 0 where rank 0 served it: each request would wait out
        // the store's timeout to reconnect (three of them, three timeouts). Likewise after
        // the first request that fails.
        let store_gone = matches!(self.config.rendezvous, Rendezvous::Tcp { .. })
            && !self.config.launcher_store
            && lost.contains(&0);
        if store_gone {
            tracing::debug!(rank, "the store's rank is lost: leaving without it");
        } else if let Err(e) = self.store.set(&format!("left/{rank}"), Vec::new()) {
            tracing::warn!(rank, error = %e, "the store is gone; leaving without it");
        } else {
            self.leave_in_order(&alive().collect::<Vec<_>>());
        }
        system.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // The actor is gone: each link's writer sends what it queued, then closes its side.
        if let Some(mut mesh) = self.mesh.take() {
            mesh.close();
        }
        self.transports.clear();
        pending
    }

    /// The store steps of leaving in order, once this rank said it left: waits for the
    /// `alive` ranks to leave too, and the rank serving the store keeps it until each of them
    /// has had its answer.
    fn leave_in_order(&self, alive: &[usize]) {
        let rank = self.config.rank;
        let keys: Vec<String> = alive.iter().map(|r| format!("left/{r}")).collect();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        if let Err(e) = self.store.wait(&refs, LINGER) {
            tracing::warn!(rank, error = %e, "not every rank left in order; closing anyway");
        }
        // The rank serving the store keeps it until every rank has had its answer (else a
        // rank's last request could find the store gone and wait out its timeout).
        if self.store.set(&format!("gone/{rank}"), Vec::new()).is_err() {
            return;
        }
        if let Some(server) = &self.server {
            let keys: Vec<String> = alive.iter().map(|r| format!("gone/{r}")).collect();
            let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
            let _ = self.store.wait(&refs, LINGER);
            // A `gone/` key is seen before its answer has left: closing now could cut the
            // answer off, and that rank would wait out its store timeout reconnecting.
            if !server.wait_answered(ANSWERED) {
                tracing::warn!(rank, "a store request still unanswered; closing anyway");
            }
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        for e in self.leave() {
            tracing::error!(error = %e, "a process dropped without shutdown() swallowed this failure");
        }
    }
}
