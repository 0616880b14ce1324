use super::*;
use crate::testing::sim::Rng;

/// Sends and receives are numbers here: which user call each is.
type Lanes = DeviceLanes<u32, u32>;

const GPU: Device = Device::Cuda(0);
const HOST: Key = (1, Carrier::Host);
/// The sender's end of the same lane, seen from the receiver (rank 0 sends to rank 1).
const FROM0: usize = 0;

fn no_id() -> Result<NcclId, Error> {
    Err(Error::internal("no id for this carrier"))
}

fn drain(l: &mut Lanes) -> Vec<Action<u32, u32>> {
    assert!(l.begin_drain());
    std::iter::from_fn(|| l.next_action()).collect()
}

fn ok(f: Failed<u32, u32>) {
    assert!(f.is_empty(), "nothing fails: {f:?}");
}

fn status(go: &[u8]) -> u64 {
    u64_at(go, 16).unwrap_or(u64::MAX)
}

/// Every send, however the receiver orders its receives, how the answers come back and how
/// the two ranks' drains interleave, leaves in ordinal order and meets the receive that took
/// its ticket: transfer `k` on the sender and post `k` on the receiver are the same pair.
#[test]
fn tickets_taken_in_any_order_pair_each_send_with_its_receive() {
    for seed in 0..2_000u64 {
        let mut rng = Rng::new(seed);
        let n = 1 + rng.below(8);
        let (mut a, mut b) = (Lanes::default(), Lanes::default());
        let key_b = (FROM0, Carrier::Host);
        // Send i is user call i; its ticket carries serial s.
        let mut tickets: Vec<(u32, [u8; TICKET_BYTES])> = (0..n as u32)
            .map(|i| {
                (
                    i,
                    a.send(HOST, GPU, i).unwrap_or_else(|_| panic!("admitted")),
                )
            })
            .collect();
        // The receiver takes the tickets in any order (they were sent on different tags).
        let mut posts: BTreeMap<u64, u32> = BTreeMap::new();
        let mut transfers: Vec<(u64, u32)> = Vec::new();
        let mut gos: Vec<Vec<u8>> = Vec::new();
        // Receive r takes the ticket of send `took[r]`.
        let mut took: HashMap<u32, u32> = HashMap::new();
        let mut r = 0u32;
        while !tickets.is_empty() || !gos.is_empty() {
            if !tickets.is_empty() && (gos.is_empty() || rng.below(2) == 0) {
                let (i, t) = tickets.swap_remove(rng.below(tickets.len()));
                took.insert(r, i);
                ok(b.on_ticket(FROM0, 0, &t, GPU, r, no_id));
                r += 1;
                for act in drain(&mut b) {
                    match act {
                        Action::Post { key, k, recv, .. } => {
                            assert_eq!(key, key_b);
                            assert!(posts.insert(k, recv).is_none(), "ordinal {k} posted twice");
                        }
                        Action::Answer { key, go } => {
                            assert_eq!(key, key_b);
                            assert_eq!(status(&go), 0);
                            gos.push(go);
                        }
                        Action::Transfer { .. } => panic!("a receiver transfers nothing"),
                    }
                }
            } else {
                // Answers may be taken in any order by the sender's waiting sends.
                let go = gos.swap_remove(rng.below(gos.len()));
                ok(a.on_go(HOST, 1, &go));
                for act in drain(&mut a) {
                    match act {
                        Action::Transfer { key, k, send, .. } => {
                            assert_eq!(key, HOST);
                            transfers.push((k, send));
                        }
                        _ => panic!("a sender only transfers"),
                    }
                }
            }
        }
        let ks: Vec<u64> = transfers.iter().map(|t| t.0).collect();
        assert_eq!(
            ks,
            (0..n as u64).collect::<Vec<_>>(),
            "seed {seed}: in ordinal order"
        );
        for (k, send) in transfers {
            assert_eq!(took[&posts[&k]], send, "seed {seed}: transfer {k}");
        }
    }
}

#[test]
fn a_send_is_refused_at_once_where_its_lane_cannot_take_it() {
    let mut a = Lanes::default();
    assert!(a.send(HOST, GPU, 0).is_ok());
    let Err((e, 1)) = a.send(HOST, Device::Cuda(1), 1) else {
        panic!("another device on the same lane")
    };
    assert_eq!(e.kind_name(), "invalid_argument");
    // Another carrier is another lane.
    assert!(a.send((1, Carrier::Local), Device::Cuda(1), 2).is_ok());
    let f = a.break_out(HOST, Error::Shutdown);
    assert_eq!(f.sends.len(), 1, "the waiting send fails");
    assert!(matches!(a.send(HOST, GPU, 3), Err((Error::Shutdown, 3))));
}

#[test]
fn a_refused_ticket_fails_its_send_with_the_reason() {
    let mut a = Lanes::default();
    let mut b = Lanes::default();
    // Another device on the receiving end.
    let t = a.send(HOST, GPU, 0).unwrap_or_else(|_| panic!());
    ok(b.on_ticket(FROM0, 0, &t, GPU, 10, no_id));
    drain(&mut b);
    let t = a.send(HOST, GPU, 1).unwrap_or_else(|_| panic!());
    let f = b.on_ticket(FROM0, 0, &t, Device::Cuda(3), 11, no_id);
    assert_eq!(f.recvs.len(), 1);
    assert_eq!(f.recvs[0].1.kind_name(), "invalid_argument");
    let acts = drain(&mut b);
    let [Action::Answer { go, .. }] = &acts[..] else {
        panic!("one refusal: {acts:?}")
    };
    assert_eq!(status(go), Refusal::Device as u64);
    let f = a.on_go(HOST, 1, go);
    assert_eq!(f.sends.len(), 1);
    assert_eq!(
        (f.sends[0].0, f.sends[0].1.kind_name()),
        (1, "invalid_argument")
    );
    // An NCCL lane whose receiver cannot make an id.
    let nccl = (1, Carrier::Nccl);
    let t = a.send(nccl, GPU, 2).unwrap_or_else(|_| panic!());
    let f = b.on_ticket(FROM0, 0, &t, GPU, 12, || {
        Err(DeviceError::Unsupported("no libnccl".into()).into())
    });
    assert_eq!(f.recvs.len(), 1);
    let acts = drain(&mut b);
    let [Action::Answer { go, .. }] = &acts[..] else {
        panic!("one refusal: {acts:?}")
    };
    assert_eq!(status(go), Refusal::NoNccl as u64);
    let f = a.on_go(nccl, 1, go);
    assert_eq!(f.sends[0].1.kind_name(), "device");
    assert!(f.sends[0].1.to_string().contains("cannot receive on NCCL"));
}

#[test]
fn an_nccl_lane_makes_its_id_once_for_its_first_transfer() {
    let (mut a, mut b) = (Lanes::default(), Lanes::default());
    let nccl = (1, Carrier::Nccl);
    let mut made = 0;
    for i in 0..3 {
        let t = a.send(nccl, GPU, i).unwrap_or_else(|_| panic!());
        ok(b.on_ticket(FROM0, 0, &t, GPU, i, || {
            made += 1;
            Ok([7; ID_BYTES])
        }));
        for act in drain(&mut b) {
            if let Action::Answer { go, .. } = act {
                ok(a.on_go(nccl, 1, &go));
            }
        }
        let acts = drain(&mut a);
        let [Action::Transfer { k, id, send, .. }] = &acts[..] else {
            panic!("one transfer: {acts:?}")
        };
        assert_eq!((*k, *send), (u64::from(i), i));
        assert_eq!(
            id[0],
            if i == 0 { 7 } else { 0 },
            "the id travels with k = 0"
        );
    }
    assert_eq!(made, 1);
}

#[test]
fn a_malformed_or_repeated_go_breaks_the_lane() {
    let mut a = Lanes::default();
    a.send(HOST, GPU, 0).unwrap_or_else(|_| panic!());
    let f = a.on_go(HOST, 5, &[1, 2, 3]);
    assert_eq!(f.sends.len(), 1);
    let e = &f.sends[0].1;
    assert_eq!(e.kind_name(), "protocol");
    assert!(e.to_string().contains("rank 5"), "{e}");
    assert!(a.send(HOST, GPU, 1).is_err(), "broken for good");

    // An ordinal given twice: the second send fails, and so does every waiting one, and
    // the first, whose transfer was queued and not yet issued.
    let mut a = Lanes::default();
    for i in 0..3 {
        a.send(HOST, GPU, i).unwrap_or_else(|_| panic!());
    }
    ok(a.on_go(HOST, 1, &encode_go(0, 0, 0, &[0; ID_BYTES])));
    let f = a.on_go(HOST, 1, &encode_go(1, 0, 0, &[0; ID_BYTES]));
    let mut failed: Vec<u32> = f.sends.iter().map(|s| s.0).collect();
    failed.sort_unstable();
    assert_eq!(failed, vec![0, 1, 2]);
    assert!(f
        .sends
        .iter()
        .all(|s| s.1.to_string().contains("given twice")));
    assert_eq!(a.queued(), 0);

    // A go for a send that does not wait: a protocol error, unless the lane broke already
    // (the answer to a send that failed with it).
    let mut a = Lanes::default();
    a.send(HOST, GPU, 0).unwrap_or_else(|_| panic!());
    let f = a.on_go(HOST, 1, &encode_go(9, 0, 0, &[0; ID_BYTES]));
    assert_eq!(f.sends.len(), 1);
    assert!(a
        .on_go(HOST, 1, &encode_go(9, 0, 0, &[0; ID_BYTES]))
        .is_empty());
}

#[test]
fn a_malformed_ticket_fails_its_receive_and_answers_nothing() {
    let mut b = Lanes::default();
    for t in [&[0u8; 3][..], &[0, 0, 0, 0, 0, 0, 0, 0, 9], &[0; 10]] {
        let f = b.on_ticket(FROM0, 4, t, GPU, 1, no_id);
        assert_eq!(f.recvs.len(), 1);
        assert_eq!(f.recvs[0].1.kind_name(), "protocol");
        assert_eq!(b.queued(), 0, "nobody to answer");
    }
}

/// A post that cannot be issued (on NCCL: the lane's worker is gone) fails its receive,
/// turns its go and the go of every post still queued behind it into refusals, and refuses
/// the lane's later tickets; a go whose post was issued stands.
#[test]
fn a_post_that_fails_refuses_its_go_and_the_lanes_later_tickets() {
    let (mut a, mut b) = (Lanes::default(), Lanes::default());
    let key = (FROM0, Carrier::Host);
    for i in 0..3 {
        let t = a.send(HOST, GPU, i).unwrap_or_else(|_| panic!());
        ok(b.on_ticket(FROM0, 0, &t, GPU, 10 + i, no_id));
    }
    assert!(b.begin_drain());
    // Post 0 and its go are issued.
    let Some(Action::Post { k: 0, .. }) = b.next_action() else {
        panic!()
    };
    let Some(Action::Answer { go: go0, .. }) = b.next_action() else {
        panic!()
    };
    assert_eq!(status(&go0), 0);
    // Post 1 fails.
    let Some(Action::Post { k: 1, recv: 11, .. }) = b.next_action() else {
        panic!()
    };
    let f = b.post_failed(key, 1, Error::Shutdown);
    let failed: Vec<u32> = f.recvs.iter().map(|r| r.0).collect();
    assert_eq!(failed, vec![12], "the receive queued behind it");
    let rest: Vec<_> = std::iter::from_fn(|| b.next_action()).collect();
    assert_eq!(rest.len(), 2, "the two goes, and no post: {rest:?}");
    for act in &rest {
        let Action::Answer { go, .. } = act else {
            panic!("{act:?}")
        };
        assert_eq!(status(go), Refusal::Broken as u64);
    }
    let t = a.send(HOST, GPU, 3).unwrap_or_else(|_| panic!());
    let f = b.on_ticket(FROM0, 0, &t, GPU, 13, no_id);
    assert_eq!(f.recvs[0].1, Error::Shutdown, "the first error stays");
}

#[test]
fn a_transfer_that_fails_fails_the_lanes_queued_transfers_only() {
    let mut a = Lanes::default();
    let other = (2, Carrier::Host);
    for i in 0..2 {
        a.send(HOST, GPU, i).unwrap_or_else(|_| panic!());
        a.send(other, GPU, 10 + i).unwrap_or_else(|_| panic!());
    }
    for (key, s) in [(HOST, 0), (other, 0), (HOST, 1), (other, 1)] {
        ok(a.on_go(key, 1, &encode_go(s, s, 0, &[0; ID_BYTES])));
    }
    assert!(a.begin_drain());
    let Some(Action::Transfer { send: 0, .. }) = a.next_action() else {
        panic!()
    };
    let f = a.break_out(HOST, Error::internal("gone"));
    let failed: Vec<u32> = f.sends.iter().map(|s| s.0).collect();
    assert_eq!(failed, vec![1], "the transfer queued behind it");
    let rest: Vec<u32> = std::iter::from_fn(|| a.next_action())
        .map(|act| match act {
            Action::Transfer { send, .. } => send,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(rest, vec![10, 11], "the other lane goes on");
}

#[test]
fn release_fails_every_waiting_send_and_refuses_what_comes_after() {
    let (mut a, mut b) = (Lanes::default(), Lanes::default());
    a.send(HOST, GPU, 0).unwrap_or_else(|_| panic!());
    a.send(HOST, GPU, 1).unwrap_or_else(|_| panic!());
    ok(a.on_go(HOST, 1, &encode_go(1, 1, 0, &[0; ID_BYTES])));
    let f = a.release();
    let mut failed: Vec<u32> = f.sends.iter().map(|s| s.0).collect();
    failed.sort_unstable();
    assert_eq!(
        failed,
        vec![0, 1],
        "waiting for its go, and for an earlier ordinal"
    );
    assert!(f.sends.iter().all(|s| s.1 == Error::Shutdown));
    assert!(matches!(a.send(HOST, GPU, 2), Err((Error::Shutdown, 2))));

    let mut c = Lanes::default();
    let t = c.send(HOST, GPU, 0).unwrap_or_else(|_| panic!());
    ok(b.release());
    let f = b.on_ticket(FROM0, 0, &t, GPU, 5, no_id);
    assert_eq!(f.recvs[0].1, Error::Shutdown);
    let acts = drain(&mut b);
    let [Action::Answer { go, .. }] = &acts[..] else {
        panic!()
    };
    assert_eq!(status(go), Refusal::Broken as u64);
}

#[test]
fn one_thread_drains_at_a_time() {
    let mut a = Lanes::default();
    assert!(a.begin_drain());
    assert!(!a.begin_drain(), "another thread is at it");
    assert!(a.next_action().is_none());
    assert!(a.begin_drain(), "the drain ended with the queue");
    a.abandon_drain();
    assert!(a.begin_drain(), "an abandoned drain may begin again");
}
