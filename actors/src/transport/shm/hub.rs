//! Starting a rank's shared memory with the other ranks of its host ([`Hub::start`]): its
//! segment, the exchange of segments ([`setup`]), the peers' segments mapped, the pairs
//! agreed through the store and the world's board decided (`collectix_runtime::join`), then
//! the progress thread and the rings in place of the links.

use super::*;
use collectix_runtime::join::{shared_pairs, world_board};
use std::os::fd::OwnedFd;

/// The peers' segments this rank mapped: each with this rank's ring in it, the peer's ring
/// in this rank's segment, and the peer's memory if this process may read it.
type Mapped = BTreeMap<usize, (Arc<Segment>, RingWriter, RingReader, Option<PeerMemory>)>;

impl Hub {
    /// Sets up shared memory with the other ranks of this host: makes this rank's segment,
    /// exchanges segments ([`setup`]), maps the peers', and agrees through the store on the
    /// pairs where both sides succeeded (a pair uses shared memory only if both say so).
    /// Then starts the progress thread and swaps the links to those peers for rings, each
    /// falling back to `links[peer]` (TCP) once the peer's process is replaced
    /// (`incarnations`). Returns the hub and the peers it reaches (`None` for the hub when
    /// none).
    pub(crate) fn start(
        s: Setup<'_>,
        driver: &Arc<Driver>,
        links: &mut crate::transport::Links,
        incarnations: Arc<Vec<AtomicU32>>,
    ) -> Result<(Option<Hub>, Vec<usize>)> {
        let index: BTreeMap<usize, u32> = s
            .local
            .keys()
            .enumerate()
            .map(|(i, &r)| (r, i as u32))
            .collect();
        let rings = index.len() as u32;
        let me = *index
            .get(&s.rank)
            .ok_or_else(|| Error::internal("this rank is not among its host's ranks"))?;
        // The memfds go to the exchange (the peers get them); this rank keeps its mappings.
        let (segment, own) = own_segment(rings, s.ring, s.rank).unzip();
        let (heap_fd, heap) = own_heap(s.heap, s.rank).unzip();
        let offer = setup::Offer {
            segment,
            heap: heap_fd.zip(heap.as_ref().map(|h| h.range().start)),
        };
        let deadline = s.deadline.min(Instant::now() + EXCHANGE);
        let got = setup::exchange(
            &setup::Exchange {
                job: s.job,
                rank: s.rank,
                local: &s.local,
                security: s.security,
                deadline,
            },
            s.listener,
            &offer,
        )?;
        drop(offer);
        let from_heap = Arc::new(AtomicU64::new(0));
        let mapped = match &own {
            Some(seg) => map_peers(got, rings, me, &index, seg, s.single_copy, &from_heap),
            None => BTreeMap::new(),
        };
        let (both, full) = agree(
            Agreeing {
                rank: s.rank,
                world: s.world,
                store: s.store,
                local: &s.local,
                deadline: s.deadline,
            },
            &mapped,
        )?;
        let Some(own) = own else {
            return Ok((None, Vec::new()));
        };
        if both.is_empty() {
            return Ok((None, Vec::new()));
        }
        let boards = full.then(|| world_boards(driver, &mapped, &own, s.world));
        let mut readers = Vec::new();
        let mut senders = Vec::new();
        for (peer, (theirs, writer, reader, remote)) in mapped {
            if !both.contains(&peer) {
                continue;
            }
            readers.push(Reading {
                peer,
                ring: reader,
                frames: FrameReader::new(s.limits),
                theirs: theirs.clone(),
                remote: remote.map(Arc::new),
                dead: false,
            });
            senders.push(Sending {
                peer,
                theirs,
                tx: Arc::new(Mutex::new(Tx {
                    frames: match &heap {
                        Some(h) => FrameWriter::new(writer).with_heap(h.clone()),
                        None => FrameWriter::new(writer),
                    }
                    .with_single_copy(s.single_copy),
                    full: false,
                    broken: false,
                })),
            });
        }
        let inner = Arc::new(Inner {
            own,
            readers: Mutex::new(readers),
            senders,
            in_progress: AtomicUsize::new(0),
            lending: AtomicBool::new(false),
            callers: Callers::new(),
            driver: Arc::downgrade(driver),
            pool: Pool::new(crate::transport::tcp::RECV_POOL_BYTES),
            closing: AtomicBool::new(false),
            from_heap,
            helping: Mutex::new(Vec::new()),
            split_reads: AtomicU64::new(0),
        });
        if let Some(h) = heap {
            driver.use_shared_heap(h);
        }
        let thread = {
            let inner = inner.clone();
            std::thread::Builder::new()
                .name(format!("collectix-shm-{}", s.rank))
                .spawn(move || inner.progress_loop())
                .map_err(|e| Error::Resource(format!("cannot start a thread: {e}")))?
        };
        for sending in &inner.senders {
            let Some(slot) = links.get_mut(sending.peer) else {
                continue;
            };
            let at = incarnations
                .get(sending.peer)
                .map_or(0, |a| a.load(Ordering::SeqCst));
            let tcp = std::mem::replace(slot, Box::new(Closed));
            *slot = Box::new(ShmLink {
                peer: sending.peer,
                tx: sending.tx.clone(),
                theirs: sending.theirs.clone(),
                inner: inner.clone(),
                tcp,
                incarnations: incarnations.clone(),
                at,
            });
        }
        driver.set_poller(PollerKind::Shm, inner.clone());
        let peers: Vec<usize> = both.into_iter().collect();
        tracing::debug!(rank = s.rank, ?peers, ring = s.ring, "shared memory up");
        Ok((
            Some(Hub {
                inner,
                thread: Some(thread),
                boards,
            }),
            peers,
        ))
    }
}

/// This rank's segment, with a ring for each rank of its host (`None`, with a warning, if it
/// cannot be made: the peers are told so in the exchange).
fn own_segment(rings: u32, ring: u64, rank: usize) -> Option<(OwnedFd, Arc<Segment>)> {
    let own = Layout::new(rings, ring)
        .map_err(|e| e.to_string())
        .and_then(|layout| {
            let bytes = layout.bytes().ok_or("a segment too large")?;
            let (fd, region) = os::create(bytes).map_err(|e| e.to_string())?;
            let seg = Segment::create(Arc::new(region), layout, std::process::id())
                .map_err(|e| e.to_string())?;
            Ok((fd, Arc::new(seg)))
        });
    match own {
        Ok(o) => Some(o),
        Err(why) => {
            tracing::warn!(rank, reason = %why, "cannot make a shared-memory segment");
            None
        }
    }
}

/// This rank's shared heap of `len` bytes (`None` for 0, or with a warning if it cannot be
/// made: the peers then read everything through the rings).
fn own_heap(len: usize, rank: usize) -> Option<(OwnedFd, Arc<SharedHeap>)> {
    if len == 0 {
        return None;
    }
    match os::create_heap(len) {
        Ok(h) => Some(h),
        Err(why) => {
            tracing::warn!(rank, reason = %why, "cannot make a shared heap");
            None
        }
    }
}

/// Maps the segments the peers sent (`got`); those that cannot be used are left out, with a
/// warning.
fn map_peers(
    got: setup::Got,
    rings: u32,
    me: u32,
    index: &BTreeMap<usize, u32>,
    own_seg: &Arc<Segment>,
    single_copy: SingleCopy,
    from_heap: &Arc<AtomicU64>,
) -> Mapped {
    let mut mapped = BTreeMap::new();
    for (peer, p) in got {
        let Some(fd) = p.fd else { continue };
        match map_peer(&fd, rings, me, index.get(&peer).copied(), own_seg) {
            Ok((theirs, writer, reader)) => {
                // Whether this process reads the peer's memory itself (single copy, when
                // asked for and the probe word reads back).
                let remote = os::Remote { pid: p.pid };
                let mut word = [0u8; 8];
                let readable = single_copy != SingleCopy::Off
                    && remote.read(p.probe, &mut word).is_ok()
                    && u64::from_le_bytes(word) == os::PROBE;
                if readable {
                    reader.allow_remote();
                } else {
                    tracing::debug!(peer, "cannot read the peer's memory: two copies");
                }
                // The peer's shared heap, read-only: what it sends from there is copied once.
                let heap = p.heap.as_ref().and_then(|(fd, at)| match os::map_heap(fd) {
                    Ok(region) => Some((region, *at)),
                    Err(why) => {
                        tracing::warn!(peer, reason = %why, "cannot map a peer's shared heap");
                        None
                    }
                });
                if heap.is_some() {
                    reader.allow_heap();
                }
                let memory = (readable || heap.is_some()).then(|| PeerMemory {
                    heap,
                    cma: readable.then_some(remote),
                    from_heap: from_heap.clone(),
                });
                mapped.insert(peer, (theirs, writer, reader, memory));
            }
            Err(why) => tracing::warn!(
                peer,
                reason = %why,
                "the shared-memory segment of a rank of this host cannot be used"
            ),
        }
    }
    mapped
}

/// What [`agree`] needs of the setup.
struct Agreeing<'a> {
    rank: usize,
    world: usize,
    store: &'a dyn Store,
    local: &'a BTreeMap<usize, String>,
    deadline: Instant,
}

/// Publishes the peers whose segments this rank mapped (`shm/RANK`) and reads theirs: the
/// peers with which shared memory is used, and whether the world group gets a board
/// (`collectix_runtime::join::shared_pairs`, `world_board`; boards on, and the whole job on
/// this host).
fn agree(s: Agreeing<'_>, mapped: &Mapped) -> Result<(BTreeSet<usize>, bool)> {
    let mine: BTreeSet<usize> = mapped.keys().copied().collect();
    let list: Vec<String> = mine.iter().map(usize::to_string).collect();
    s.store
        .set(&format!("shm/{}", s.rank), list.join(",").into_bytes())?;
    let left = || s.deadline.saturating_duration_since(Instant::now());
    let read = |r: usize| -> Result<BTreeSet<usize>> {
        let v = s.store.get(&format!("shm/{r}"), left())?;
        Ok(String::from_utf8_lossy(&v)
            .split(',')
            .filter_map(|x| x.parse().ok())
            .collect())
    };
    let mut lists = BTreeMap::new();
    for &peer in &mine {
        lists.insert(peer, read(peer)?);
    }
    let both = shared_pairs(s.rank, &mine, &lists);
    let full = crate::board::enabled() && s.local.len() == s.world && {
        lists.insert(s.rank, mine);
        for &r in s.local.keys() {
            if let std::collections::btree_map::Entry::Vacant(e) = lists.entry(r) {
                e.insert(read(r)?);
            }
        }
        world_board(s.world, &lists)
    };
    Ok((both, full))
}

/// The world group's board: each rank's lane in its segment (this rank's in its own), and
/// how to wake each other rank (its lane's header and its doorbell).
fn world_boards(
    driver: &Arc<Driver>,
    mapped: &Mapped,
    own: &Arc<Segment>,
    world: usize,
) -> Arc<ShmBoards> {
    let mut lanes: Vec<Arc<dyn Lane>> = Vec::with_capacity(world);
    let mut wake: Vec<Option<Arc<dyn Wake>>> = Vec::with_capacity(world);
    let mut boxes: Vec<Arc<dyn Lane>> = Vec::with_capacity(world);
    let mut segs: Vec<Option<Arc<Segment>>> = Vec::with_capacity(world);
    for r in 0..world {
        match mapped.get(&r) {
            Some((theirs, ..)) => {
                let lane: Arc<dyn Lane> = Arc::new(theirs.lane());
                wake.push(Some(Arc::new(ShmWake {
                    lane: lane.clone(),
                    seg: theirs.clone(),
                })));
                lanes.push(lane);
                boxes.push(Arc::new(theirs.mailbox()));
                segs.push(Some(theirs.clone()));
            }
            None => {
                lanes.push(Arc::new(own.lane()));
                wake.push(None);
                boxes.push(Arc::new(own.mailbox()));
                segs.push(None);
            }
        }
    }
    driver
        .boards
        .signal
        .activity
        .mirror_into(Arc::new(own.lane()));
    Arc::new(ShmBoards {
        lanes,
        wake,
        boxes,
        segs,
    })
}

/// A peer's segment, mapped and checked, with this rank's ring in it and the peer's ring in
/// `own`.
fn map_peer(
    fd: &std::os::fd::OwnedFd,
    rings: u32,
    me: u32,
    k: Option<u32>,
    own: &Arc<Segment>,
) -> std::result::Result<(Arc<Segment>, RingWriter, RingReader), String> {
    let region = os::map(fd).map_err(|e| e.to_string())?;
    let theirs = Arc::new(Segment::open(Arc::new(region), rings).map_err(|e| e.to_string())?);
    let writer = theirs
        .writer(me)
        .ok_or("this rank's ring in it is not fresh")?;
    let reader = k
        .and_then(|k| own.reader(k))
        .ok_or("not a rank of this host")?;
    Ok((theirs, writer, reader))
}
