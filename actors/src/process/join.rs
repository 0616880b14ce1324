//! Steps 2–4 of joining a job (see `process`'s module doc), once the store is there: listen,
//! publish, read what every rank published, decide from it (`collectix_runtime::join`),
//! start the actor and the transports (`transport::table`), and assemble the rank
//! (`assemble`).

use super::*;
use crate::member::Spawner;
use crate::rank::driver::LinkTable;

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

/// What a rank learns from the store at join: its own host identity and shared-memory
/// listener, and what every rank published.
struct Published {
    /// This rank's host identity.
    host: String,
    /// Where this rank takes shared-memory peers, if it offers shared memory.
    #[cfg(target_os = "linux")]
    listener: Option<shm::Listener>,
    /// The job's id.
    job: u64,
    /// Each rank's address, host identity and shared-memory socket ("-": none).
    addrs: Vec<String>,
    hosts: Vec<String>,
    sockets: Vec<String>,
    /// What each rank published, as the table of transports reads it.
    offers: Vec<Offer>,
    /// Each rank's host as an index, in order of first appearance.
    host_index: Vec<u32>,
    /// The world group's locality (`collectix_runtime::join::world_locality`).
    locality: collectix_runtime::Locality,
}

/// Step 2's second half and step 3 of joining: publishes this rank's host, shared-memory
/// socket, transport setting (`host/RANK`) and address (`addr/RANK`), waits for every
/// rank's, and reads them.
#[allow(clippy::too_many_arguments)]
fn publish_and_read(
    store: &Arc<dyn Store>,
    rank: usize,
    world: usize,
    transport: Transport,
    host_id: &Option<String>,
    incarnation: u32,
    me: &str,
    left: &dyn Fn() -> Duration,
) -> Result<Published> {
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
    store.set(&format!("addr/{rank}"), me.as_bytes().to_vec())?;
    // Everyone's.
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
    // Each rank's host as an index (in order of first appearance): a group's locality, and
    // its hierarchical algorithms, follow from its members' (`GroupInfo::new`).
    let mut ids: Vec<&str> = Vec::new();
    let host_index: Vec<u32> = hosts
        .iter()
        .map(|h| match ids.iter().position(|x| x == h) {
            Some(i) => i as u32,
            None => {
                ids.push(h);
                (ids.len() - 1) as u32
            }
        })
        .collect();
    Ok(Published {
        host,
        #[cfg(target_os = "linux")]
        listener,
        job,
        addrs,
        hosts,
        sockets,
        offers,
        host_index,
        locality,
    })
}

/// Where this rank listens for its peers (the address given, the interface's, or the local
/// end of the route to the store), and that address as it publishes it.
fn listen_where(
    address: Option<&str>,
    interface: Option<&str>,
    environment: bool,
    store_host: Option<&str>,
    security: &Security,
) -> Result<(TcpListener, String)> {
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
    Ok((tcp_listener, host_port(&ip, port)))
}

/// The rank's driver, for a host with `local` ranks of the job: a spinning caller yields its
/// core at every turn if they outnumber its cores, else now and then (a yield is a system
/// call; with a core each, the peers are running already). A host identity given by hand
/// (`by_hand`, or `COLLECTIX_HOST_ID`) may stand for part of a machine: then at every turn.
fn rank_driver(rank: usize, info: &GroupInfo, local: usize, by_hand: bool) -> Arc<Driver> {
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    let crowded = by_hand || std::env::var_os("COLLECTIX_HOST_ID").is_some() || local > cores;
    let yields = if crowded {
        YIELD_TURNS
    } else {
        YIELD_TURNS_SPARSE
    };
    Arc::new(Driver::new(
        collectix_runtime::Engine::new(rank),
        info.clone(),
        spin_from_env(DEFAULT_SPIN_TCP),
        yields,
    ))
}

/// A join that failed once the actor system ran: stops the system and joins its thread;
/// returns `e`.
fn halt(system: &System, thread: JoinHandle<()>, e: Error) -> Error {
    system.stop();
    let _ = thread.join();
    e
}

/// Steps 2–4 of joining (see the module doc), once the store is there.
pub(super) fn join(joining: Joining<'_>) -> Result<Joined> {
    let Joining {
        rank,
        world,
        standbys,
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
    let (tcp_listener, me) = listen_where(address, interface, environment, store_host, security)?;
    if rank == 0 {
        let id = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
            ^ u64::from(std::process::id()).rotate_left(32);
        store.compare_set("job", b"", id.to_string().into_bytes())?;
    }
    agree_on_world(store.as_ref(), rank, world)?;
    // 3. What every rank published, and what follows from it alike on every rank.
    let p = publish_and_read(
        store,
        rank,
        world,
        transport,
        &host_id,
        incarnation,
        &me,
        &left,
    )?;
    // 4. The actor, the links, the connections. The world's options carry each rank's host
    // (a group's locality and hierarchical algorithms follow from its members') and the
    // locality every rank decided alike.
    let mut options = options;
    options.hosts = Some(Arc::from(p.host_index));
    options.locality = p.locality;
    // The world group leaves out the standbys; a standby is in a group of its own until it
    // replaces a lost rank.
    let active = world - standbys;
    let info = if rank < active {
        GroupInfo::world(active, rank, options.clone())?
    } else {
        GroupInfo::new(
            crate::world::standby_group(rank),
            vec![rank],
            rank,
            options.clone(),
        )?
    };
    let local = p.hosts.iter().filter(|h| **h == p.host).count();
    let driver = rank_driver(rank, &info, local, host_id.is_some());
    let system::Started {
        system,
        thread,
        mut ranks,
    } = system::start(&format!("collectix-system-{rank}"), vec![driver.clone()], 1)?;
    let Some((addr, arbiter, thread_id)) = ranks.pop() else {
        let e = Error::internal("the actor system started no rank");
        return Err(halt(&system, thread, e));
    };
    let limits = Limits {
        max_payload_bytes: options.max_call_bytes,
        ..Limits::default()
    };
    let inbound: Arc<dyn Inbound> = Arc::new(ToRank(driver.clone()));
    let settings = Settings {
        job: p.job,
        limits,
        incarnation,
        security: security.clone(),
        liveness,
    };
    let started = Mesh::start(tcp_listener, rank, p.addrs, settings, inbound).and_then(|mesh| {
        let mut links = mesh.links(Box::new(SelfLink(rank, driver.clone())));
        let mut st = Starting {
            job: p.job,
            rank,
            world,
            incarnation,
            sockets: &p.sockets,
            #[cfg(target_os = "linux")]
            listener: p.listener,
            transport,
            connect,
            security,
            store,
            limits,
            deadline,
            timeout,
            driver: &driver,
            links: &mut links,
            mesh: &mesh,
        };
        let running = table::start(&mut st, &p.offers)?;
        Ok((mesh, links, running))
    });
    let (mesh, links, (transports, paths)) = match started {
        Ok(s) => s,
        Err(e) => return Err(halt(&system, thread, e)),
    };
    // The world group's board, when the whole job shares this host's memory.
    let boards = transports.iter().find_map(|t| t.boards());
    let shared = assemble(Birth {
        rank,
        world,
        standbys,
        incarnation,
        driver,
        actor: (Some(addr), Spawner::Arbiter(arbiter), thread_id),
        threads: vec![thread_id],
        links: LinkTable::given(links),
        store: store.clone(),
        // One rank per process: its device calls take NCCL.
        hub: None,
        boards,
        // The links of a rank cut off fall silent together, and each end notices at its
        // own heartbeat: two heartbeats and some.
        settle: liveness.heartbeat * 2 + std::time::Duration::from_millis(50),
    });
    Ok(Joined {
        comm: Communicator::new(shared, info),
        system,
        thread,
        mesh,
        address: me,
        transports,
        paths,
    })
}
