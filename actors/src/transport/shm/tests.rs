//! The hub between two ranks of this process (two drivers, two segments, a memory store):
//! set up past an intruder on the socket, and a peer's scribbled ring makes that peer lost.

use super::*;
use crate::rank::driver::{Driver, DEFAULT_SPIN};
use crate::store::MemoryStore;
use collectix_runtime::{Engine, GroupInfo, GroupOptions};
use std::io::Write;
use std::os::linux::net::SocketAddrExt;

fn driver(rank: usize) -> Arc<Driver> {
    let world =
        GroupInfo::world(2, rank, GroupOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    Arc::new(Driver::new(Engine::new(rank), world, DEFAULT_SPIN, 0))
}

/// Two ranks' hubs, set up together; an intruder first knocks on rank 0's socket with junk.
fn two_hubs() -> Vec<(Arc<Driver>, Hub)> {
    two_hubs_with(4096, true)
}

/// [`two_hubs`] with rings of `ring` bytes, reading each other's memory if `single_copy`.
fn two_hubs_with(ring: u64, single_copy: bool) -> Vec<(Arc<Driver>, Hub)> {
    let store = MemoryStore::new();
    let security = Security::insecure();
    let listeners: Vec<Listener> = (0..2)
        .map(|r| Listener::bind(7, r).unwrap_or_else(|e| panic!("{e}")))
        .collect();
    let local: BTreeMap<usize, String> = listeners
        .iter()
        .enumerate()
        .map(|(r, l)| (r, l.name.clone()))
        .collect();
    let intruder = std::os::unix::net::SocketAddr::from_abstract_name(local[&0].as_bytes())
        .and_then(|a| std::os::unix::net::UnixStream::connect_addr(&a));
    if let Ok(mut s) = intruder {
        let _ = s.write_all(b"GET / HTTP/1.1\r\n\r\n");
    }
    let (store, security, local) = (&store, &security, &local);
    std::thread::scope(|sc| {
        let hs: Vec<_> = listeners
            .into_iter()
            .enumerate()
            .map(|(rank, listener)| {
                sc.spawn(move || {
                    let d = driver(rank);
                    let mut links: crate::transport::Links =
                        (0..2).map(|_| crate::transport::local::cut()).collect();
                    let (hub, peers) = Hub::start(
                        Setup {
                            job: 42,
                            rank,
                            local: local.clone(),
                            listener,
                            security,
                            store,
                            world: 2,
                            ring,
                            single_copy: if single_copy {
                                SingleCopy::All
                            } else {
                                SingleCopy::Off
                            },
                            heap: 1 << 20,
                            limits: Limits::default(),
                            deadline: Instant::now() + Duration::from_secs(20),
                        },
                        &d,
                        &mut links,
                        Arc::new(vec![AtomicU32::new(0), AtomicU32::new(0)]),
                    )
                    .unwrap_or_else(|e| panic!("rank {rank}: {e}"));
                    assert_eq!(peers, vec![1 - rank]);
                    (d, hub.unwrap_or_else(|| panic!("rank {rank}: no hub")))
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| panic!("a rank panicked")))
            .collect()
    })
}

#[test]
fn a_peer_that_scribbles_on_its_ring_is_lost_not_trusted() {
    let hubs = two_hubs();
    let (d0, _) = &hubs[0];
    let (_, hub1) = &hubs[1];
    assert!(d0.lost_peers().is_empty());
    // Rank 1 writes a tail far past anything a ring holds into its ring in rank 0's segment.
    let theirs = &hub1.inner.senders[0].theirs;
    let at = theirs.tail_at(1).unwrap_or_else(|| panic!("no ring 1"));
    assert!(theirs.region().write(at, &(1u64 << 40).to_le_bytes()));
    theirs.ring();
    os::wake(theirs.doorbell());
    // Rank 0's progress thread reads the ring, refuses it, and loses rank 1.
    let start = Instant::now();
    while !d0.lost_peers().contains(&1) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "rank 1 never lost"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_hub_and_its_driver_are_freed_when_dropped() {
    let hubs = two_hubs();
    let weak: Vec<_> = hubs.iter().map(|(d, _)| Arc::downgrade(d)).collect();
    drop(hubs);
    assert!(
        weak.iter().all(|w| w.upgrade().is_none()),
        "a driver outlived its hub"
    );
}

#[test]
fn the_whole_job_on_one_host_shares_a_board_in_its_segments() {
    use collectix_runtime::board::Lane;
    let hubs = two_hubs();
    for (d, hub) in &hubs {
        let boards = hub.boards().unwrap_or_else(|| panic!("no board"));
        let world = collectix_runtime::GroupInfo::world(2, d.rank(), Default::default())
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            boards.board(&world).is_some(),
            "the world group has a board"
        );
        let other = collectix_runtime::GroupInfo::new(
            collectix_runtime::GroupId(7),
            vec![0, 1],
            d.rank(),
            Default::default(),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            boards.board(&other).is_none(),
            "other groups use the engine"
        );
    }
    // Rank 1's lane, as rank 0 maps it, is the one rank 1 writes in its own segment.
    let mine = hubs[1].1.inner.own.lane();
    let seen = hubs[0].1.inner.senders[0].theirs.lane();
    assert!(mine.store(7, 0xfeed));
    assert_eq!(seen.load(7), Some(0xfeed));
    assert_eq!(seen.load(collectix_runtime::board::LANE_WORDS), None);
}

#[test]
fn a_peer_that_scribbles_on_its_board_lane_fails_the_call_not_the_process() {
    use collectix_runtime::board::{BoardCall, Lane};
    use collectix_runtime::{CallOptions, Request};
    let hubs = two_hubs();
    let (d0, hub0) = &hubs[0];
    let world = GroupInfo::world(2, 0, GroupOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    let gb = hub0
        .boards()
        .and_then(|b| b.board(&world))
        .unwrap_or_else(|| panic!("no board"));
    // Rank 1's lane, written as a broken rank 1 would: slot 0 (words 16–23, after the lane's
    // two header lines) claims call 0 (its first word is the sequence number + 1) but holds no
    // fingerprint that decodes.
    let lane1 = hubs[1].1.inner.own.lane();
    assert!(lane1.store(17, u64::MAX));
    assert!(lane1.store(16, 1));
    let call = match BoardCall::of(&Request::Barrier, &world, &CallOptions::default()) {
        Some(Ok(c)) => c,
        other => panic!("{other:?}"),
    };
    let fp = call.fingerprint();
    let (tx, rx) = std::sync::mpsc::channel();
    let (submitted, after) = d0.submit_board(
        &gb,
        &mut crate::sync::lock(&gb.issue),
        crate::rank::driver::BoardSubmit {
            seq: 0,
            call,
            timeout: Duration::from_secs(30),
            published: false,
            span: gb.span(0, &fp),
        },
        Box::new(move |r| {
            let _ = tx.send(r);
        }),
    );
    d0.hand_over(after);
    match submitted {
        Ok(deadline) => d0.submitted_board(deadline),
        Err((done, e)) => done(Err(e)),
    }
    let start = Instant::now();
    let got = loop {
        d0.board_progress();
        if let Ok(r) = rx.try_recv() {
            break r;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "no result");
        std::thread::sleep(Duration::from_millis(1));
    };
    assert!(
        matches!(got, Err(Error::Protocol { rank: 1, .. })),
        "{got:?}"
    );
}

/// A ring is read a slice at a time. A caller that parks reads its rings once as it leaves,
/// to take what a sender published while it still polled (the sender rang nothing); what
/// lies beyond that slice must not wait for the progress thread's timed look (500 ms): it
/// is read, or the progress thread is woken. (Before: one slice of a 1 MiB frame read, the
/// rest left with the thread parked.)
#[test]
fn a_caller_that_parks_leaves_nothing_published_unread_and_unrung() {
    use collectix_runtime::wire::{Header, Message};
    // Through the ring (no remote records: those are read whole).
    let hubs = two_hubs_with(2 << 20, false);
    let (inner0, inner1) = (&hubs[0].1.inner, &hubs[1].1.inner);
    // Rank 1's progress thread parks once setup is over (nothing to read, nobody polling).
    let start = Instant::now();
    while inner1.own.sleeping().load(Ordering::SeqCst) == 0 {
        assert!(start.elapsed() < Duration::from_secs(10), "never rested");
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(50));
    // A caller of rank 1 reads; rank 0 sends a frame of 1 MiB (8 slices), which rings nothing.
    inner1.enter();
    let msg = Message {
        src: 0,
        header: Header::Credit {
            group: GroupId(99),
            calls: 1,
        },
        payload: vec![bytes::Bytes::from(vec![7u8; 1 << 20])],
    };
    let sent = lock(&inner0.senders[0].tx).frames.send(msg);
    assert!(matches!(sent, Ok(Sent::Whole)), "the frame fits the ring");
    let bell = inner1.own.doorbell().load(Ordering::SeqCst);
    // The caller parks: it leaves reading once.
    inner1.parking();
    inner1.leave();
    let unread = lock(&inner1.readers)[0].ring.ready().unwrap_or(0);
    let rung = inner1.own.doorbell().load(Ordering::SeqCst) != bell;
    assert!(
        unread == 0 || rung,
        "{unread} bytes published and unread, the progress thread not woken"
    );
}
