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

use crate::addr;
use crate::comm::Communicator;
use crate::job::{InitArgs, JobConfig, Rendezvous};
use crate::member::RankShared;
use crate::rank::actor::Leave;
use crate::rank::driver::{
    spin_from_env, Driver, PollerKind, DEFAULT_SPIN_TCP, YIELD_TURNS, YIELD_TURNS_SPARSE,
};
use crate::rank::system;
use crate::security::Security;
use crate::store::{FileStore, Store, TcpStore, TcpStoreServer};
use crate::transport::mesh::{Connect, Mesh, Settings};
#[cfg(target_os = "linux")]
use crate::transport::shm::{self, Hub};
use crate::transport::tcp::{Inbound, Liveness};
use crate::transport::Transport;
use actix::System;
use collectix_runtime::join::{world_locality, Offer, Setting};
use collectix_runtime::wire::codec::Limits;
use collectix_runtime::wire::{Link, LinkError, Message};
use collectix_runtime::{Error, GroupInfo, GroupOptions, Result};
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
/// How long a restarted process tries to reach each peer (one that cannot be reached is
/// taken as lost).
const REJOIN_CONNECT: Duration = Duration::from_secs(5);

/// This process's rank of a multi-process job.
pub struct Process {
    comm: Communicator,
    config: JobConfig,
    store: Arc<dyn Store>,
    system: Option<System>,
    thread: Option<JoinHandle<()>>,
    mesh: Option<Mesh>,
    /// Shared memory with the ranks of this host (none when alone on it, or over TCP only).
    #[cfg(target_os = "linux")]
    shm: Option<Hub>,
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
    fn flush(&self, peer: usize) {
        self.0.flush(peer);
    }
    fn lost(&self, peer: usize) {
        self.0.peer_lost(peer);
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
            let server = if rank == 0 && !config.launcher_store {
                Some(TcpStoreServer::for_job(host, *port, &security)?)
            } else {
                None
            };
            let client =
                TcpStore::connect_secured(host_port(host, *port), left(), security.clone())?;
            (Arc::new(client), server, Some(host.clone()))
        }
        Rendezvous::File { path } => (Arc::new(FileStore::new(path)?), None, None),
    };
    let joined = join(Joining {
        rank,
        world,
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
            #[cfg(target_os = "linux")]
            shm,
        }) => {
            // A connection of its own for the status responder, whose waits hold it.
            let status = match &config.rendezvous {
                Rendezvous::Tcp { host, port } => {
                    TcpStore::connect_secured(host_port(host, *port), left(), security.clone())
                        .ok()
                        .map(|s| {
                            crate::status::Responder::start(
                                rank,
                                comm.member.rank.driver.clone(),
                                Box::new(s),
                            )
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
                #[cfg(target_os = "linux")]
                shm,
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
    /// Shared memory with the ranks of this host.
    #[cfg(target_os = "linux")]
    shm: Option<Hub>,
}

/// What [`join`] needs once the store is there: this rank's place in the job, the store the
/// ranks meet through, how the connections are made, and the time the join has.
struct Joining<'a> {
    /// This rank.
    rank: usize,
    /// Ranks in the job.
    world: usize,
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

/// Checks that every rank of the job was started with the same world size: the first rank to
/// get here records its size (and its rank) in the store, and a rank started with another
/// size is refused at once, naming the rank that recorded the job's (instead of waiting for
/// peers that will never connect).
fn agree_on_world(store: &dyn Store, rank: usize, world: usize) -> Result<()> {
    let mine = format!("{world} {rank}");
    let said = store.compare_set("world_size", b"", mine.into_bytes())?;
    let said = String::from_utf8_lossy(&said);
    let mut words = said.split(' ').map(str::parse::<usize>);
    match (words.next(), words.next()) {
        (Some(Ok(w)), Some(Ok(_))) if w == world => Ok(()),
        (Some(Ok(w)), Some(Ok(by))) => Err(Error::invalid(format!(
            "the job's ranks disagree on WORLD_SIZE: rank {by} says {w}, but this rank ({rank}) \
             was started with {world}; start every rank with the same WORLD_SIZE"
        ))),
        _ => Err(Error::Store(format!(
            "the job's world size in the store is not one: {said:?}"
        ))),
    }
}

/// Steps 2–4 of joining (see the module doc), once the store is there.
fn join(joining: Joining<'_>) -> Result<Joined> {
    let Joining {
        rank,
        world,
        options,
        store,
        store_host,
        security,
        liveness,
        connect,
        transport,
        host_id,
        address,
        interface,
        environment,
        incarnation,
        deadline,
        timeout,
    } = joining;
    let left = || deadline.saturating_duration_since(Instant::now());
    // 2. Listen, publish.
    let ip = match (address, interface) {
        (Some(a), _) => a.trim().to_owned(),
        (None, Some(i)) => addr::interface_ip(i.trim())?.to_string(),
        (None, None) if environment => addr::own_ip(store_host)?,
        (None, None) => addr::own_ip_from(store_host, &|_| None)?,
    };
    let tcp_listener = listen(&ip, security)?;
    let port = tcp_listener
        .local_addr()
        .map_err(|e| Error::Resource(format!("no local address: {e}")))?
        .port();
    let me = host_port(&ip, port);
    if rank == 0 {
        let id = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
            ^ u64::from(std::process::id()).rotate_left(32);
        store.compare_set("job", b"", id.to_string().into_bytes())?;
    }
    agree_on_world(store.as_ref(), rank, world)?;
    // This host's identity, and where this rank takes shared-memory peers (published before
    // the address: a rank that sees `addr/r` finds `host/r` there too).
    let host = match &host_id {
        Some(h) => h.trim().replace(' ', "_"),
        None => host_identity(),
    };
    #[cfg(target_os = "linux")]
    let listener = if transport != Transport::Tcp && incarnation == 0 {
        match shm::Listener::bind(u64::from(std::process::id()), rank) {
            Ok(l) => Some(l),
            Err(e) if transport == Transport::Auto => {
                tracing::warn!(rank, error = %e, "no shared memory: TCP to every peer");
                None
            }
            Err(e) => return Err(e),
        }
    } else {
        None
    };
    #[cfg(target_os = "linux")]
    let socket = listener.as_ref().map_or("-".to_owned(), |l| l.name.clone());
    #[cfg(not(target_os = "linux"))]
    let socket = "-".to_owned();
    let setting = match transport {
        Transport::Auto => Setting::Auto,
        Transport::Shm => Setting::Shm,
        Transport::Tcp => Setting::Tcp,
    };
    let published = format!("{host} {socket} {}", setting.word()).into_bytes();
    if incarnation == 0 {
        store.set(&format!("host/{rank}"), published)?;
    } else {
        // A restarted process keeps its rank's first identity in the map (set only if none
        // is): every rank's map of hosts, and so the hierarchical schedules of the groups the
        // survivors make with it, stay the same on every rank even if it came back in another
        // namespace or on another host. (It talks TCP to everyone.)
        store.compare_set(&format!("host/{rank}"), b"", published)?;
    }
    store.set(&format!("addr/{rank}"), me.clone().into_bytes())?;
    // 3. Everyone.
    let keys: Vec<String> = (0..world).map(|r| format!("addr/{r}")).collect();
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    store.wait(&refs, left())?;
    let job_text = store.get("job", left())?;
    let job = String::from_utf8_lossy(&job_text)
        .parse::<u64>()
        .map_err(|_| Error::Store("the job id in the store is not a number".into()))?;
    let mut addrs = Vec::with_capacity(world);
    for key in &keys {
        addrs.push(String::from_utf8_lossy(&store.get(key, left())?).into_owned());
    }
    let mut hosts = Vec::with_capacity(world);
    let mut sockets = Vec::with_capacity(world);
    let mut offers = Vec::with_capacity(world);
    for r in 0..world {
        let said = String::from_utf8_lossy(&store.get(&format!("host/{r}"), left())?).into_owned();
        // "HOST SOCKET SETTING"; a rank that says less says "-" and "auto".
        let mut words = said.splitn(3, ' ');
        let h = words.next().unwrap_or_default().to_owned();
        let sock = words.next().unwrap_or("-").to_owned();
        let setting = words
            .next()
            .and_then(Setting::from_word)
            .unwrap_or(Setting::Auto);
        offers.push(Offer {
            host: h.clone(),
            shm: sock != "-",
            setting,
        });
        hosts.push(h);
        sockets.push(sock);
    }
    // Decided from what every rank published, so alike on every rank: the world's locality
    // (its algorithm table), or that the settings cannot work together.
    let locality = world_locality(&offers)?;
    // 4. The actor, the links, the connections.
    let mut options = options;
    // Every rank reads the same identities, so every rank picks the same locality (and so
    // the same default algorithms).
    // Each rank's host as an index (in order of first appearance): a group's locality, and
    // its hierarchical algorithms, follow from its members' (`GroupInfo::new`).
    let mut ids: Vec<&str> = Vec::new();
    let index: Vec<u32> = hosts
        .iter()
        .map(|h| match ids.iter().position(|x| x == h) {
            Some(i) => i as u32,
            None => {
                ids.push(h);
                (ids.len() - 1) as u32
            }
        })
        .collect();
    options.hosts = Some(Arc::from(index));
    // On one host with no rank offering shared memory, a host's ranks take the rows for
    // sockets (`collectix_runtime::join::world_locality`).
    options.locality = locality;
    let info = GroupInfo::world(world, rank, options.clone())?;
    // A spinning caller yields its core at every turn if this host's ranks outnumber its
    // cores, else now and then (a yield is a system call; with a core each, the peers are
    // running already). A host identity given by hand may stand for part of a machine: then
    // at every turn.
    let local = hosts.iter().filter(|h| **h == host).count();
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    let crowded =
        host_id.is_some() || std::env::var_os("COLLECTIX_HOST_ID").is_some() || local > cores;
    let yields = if crowded {
        YIELD_TURNS
    } else {
        YIELD_TURNS_SPARSE
    };
    let driver = Arc::new(Driver::new(
        collectix_runtime::Engine::new(rank),
        info.clone(),
        spin_from_env(DEFAULT_SPIN_TCP),
        yields,
    ));
    let system::Started {
        system,
        thread,
        mut ranks,
    } = system::start(&format!("collectix-system-{rank}"), vec![driver.clone()])?;
    let (addr, arbiter, thread_id) = ranks
        .pop()
        .ok_or_else(|| Error::internal("the actor system started no rank"))?;
    let limits = Limits {
        max_payload_bytes: options.max_call_bytes,
        ..Limits::default()
    };
    let inbound: Arc<dyn Inbound> = Arc::new(ToRank(driver.clone()));
    let settings = Settings {
        job,
        limits,
        incarnation,
        security: security.clone(),
        liveness,
    };
    let mesh = Mesh::start(tcp_listener, rank, addrs, settings, inbound)?;
    #[allow(unused_mut)]
    let mut links = mesh.links(Box::new(SelfLink(rank, driver.clone())));
    #[cfg(target_os = "linux")]
    let hub = match listener {
        None => None,
        Some(listener) => {
            // The ranks of this host that take shared memory (those that published a socket).
            let local: std::collections::BTreeMap<usize, String> = (0..world)
                .filter(|&r| hosts[r] == host && sockets[r] != "-")
                .map(|r| (r, sockets[r].clone()))
                .collect();
            let setup = shm::Setup {
                job,
                rank,
                local,
                listener,
                security,
                store: store.as_ref(),
                world,
                ring: shm::ring_from_env()?,
                single_copy: shm::single_copy_from_env()?,
                limits,
                deadline,
            };
            let want: Vec<usize> = setup.local.keys().copied().filter(|&r| r != rank).collect();
            if want.is_empty() {
                None
            } else {
                let started = Hub::start(setup, &driver, &mut links, mesh.incarnations()).and_then(
                    |(hub, peers)| {
                        let missing: Vec<usize> = want
                            .iter()
                            .copied()
                            .filter(|r| !peers.contains(r))
                            .collect();
                        if transport == Transport::Shm && !missing.is_empty() {
                            return Err(Error::Resource(format!(
                                "COLLECTIX_TRANSPORT=shm, but shared memory could not be set \
                                 up with ranks {missing:?} of this host (see the log)"
                            )));
                        }
                        if !missing.is_empty() {
                            tracing::warn!(rank, ?missing, "TCP to these ranks of this host");
                        }
                        // Their messages come through the rings: callers need not read their
                        // connections.
                        let readers = mesh.readers();
                        for &p in &peers {
                            readers.elsewhere(p);
                        }
                        // A lazy job still connects the pairs that share memory at once: their
                        // connections tell when one of them is lost.
                        if connect == Connect::Lazy && !peers.is_empty() {
                            mesh.connect_among(&peers, deadline, timeout)?;
                        }
                        Ok(hub)
                    },
                );
                match started {
                    Ok(h) => h,
                    Err(e) => {
                        system.stop();
                        let _ = thread.join();
                        return Err(e);
                    }
                }
            }
        }
    };
    driver.set_links(links);
    // Waiting callers read the connections that carry messages (see `transport::tcp`).
    let readers = mesh.readers();
    if readers.carries_any(rank) {
        driver.set_poller(PollerKind::Tcp, readers);
    }
    if incarnation > 0 {
        // A restarted process: the others are running already, and learn from this one's
        // hellos that it replaces its rank's previous process.
        mesh.rejoin_all(REJOIN_CONNECT.min(left()));
    } else if connect == Connect::Eager {
        if let Err(e) = mesh.connect_all(deadline, timeout) {
            system.stop();
            let _ = thread.join();
            return Err(e);
        }
    }
    // The world group's board, when the whole job shares this host's memory.
    #[cfg(target_os = "linux")]
    let boards = hub.as_ref().and_then(Hub::boards);
    #[cfg(not(target_os = "linux"))]
    let boards = None;
    let shared = Arc::new(RankShared {
        rank,
        world,
        addr,
        driver,
        arbiter,
        rank_threads: crate::work::RankThreads::shared(&[thread_id]),
        store: store.clone(),
        // One rank per process: its device calls take NCCL.
        hub: None,
        incarnation,
        boards,
    });
    Ok(Joined {
        comm: Communicator::new(shared, info),
        system,
        thread,
        mesh,
        address: me,
        #[cfg(target_os = "linux")]
        shm: hub,
    })
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

    /// How many peers this rank reaches through shared memory (the other ranks of its host,
    /// unless `COLLECTIX_TRANSPORT=tcp` or shared memory could not be set up).
    pub fn shm_peers(&self) -> usize {
        #[cfg(target_os = "linux")]
        {
            self.shm.as_ref().map_or(0, Hub::peers)
        }
        #[cfg(not(target_os = "linux"))]
        {
            0
        }
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
        #[cfg(target_os = "linux")]
        drop(self.shm.take());
    }

    fn leave(&mut self) -> Vec<Error> {
        let Some(system) = self.system.take() else {
            return Vec::new();
        };
        let (tx, rx) = mpsc::channel();
        self.comm.member.rank.addr.do_send(Leave {
            linger: LINGER,
            done: tx,
        });
        let pending = rx.recv_timeout(LINGER * 2).unwrap_or_default();
        // Every rank has left (or the wait ran out): closing now harms nobody. Ranks this one
        // saw lost never will leave: they are not waited for.
        let (rank, world) = (self.config.rank, self.config.world_size);
        let lost = self.comm.member.rank.driver.lost_peers();
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
        #[cfg(target_os = "linux")]
        drop(self.shm.take());
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
        if self.server.is_some() {
            let keys: Vec<String> = alive.iter().map(|r| format!("gone/{r}")).collect();
            let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
            let _ = self.store.wait(&refs, LINGER);
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
