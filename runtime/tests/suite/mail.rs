//! Small point-to-point messages through a board group's mailboxes
//! (`collectix_runtime::board::mail`) and the engine: a lane's messages are received in the
//! order they were sent whichever way each travelled, a receive takes a message without a
//! pending call only when no receive posted before could take it, and a message that does
//! not match its receive, or is replayed, aborts the group as one from a transport does.

use collectix_runtime::board::mail::{mailbox_words, Mail, Mailboxes};
use collectix_runtime::board::{HeapLane, Lane};
use collectix_runtime::group::{CallOptions, GroupId};
use collectix_runtime::testing::sim::Sim;
use collectix_runtime::{DType, Error, Output, Request, Tensor, TensorSpec};
use std::sync::Arc;

/// A group of `n` members' mailboxes, as each member sees them.
fn mailboxes(n: usize) -> Vec<Mailboxes> {
    let mem: Vec<Arc<dyn Lane>> = (0..n)
        .map(|_| Arc::new(HeapLane::with_words(mailbox_words(n))) as Arc<dyn Lane>)
        .collect();
    (0..n)
        .map(|me| Mailboxes::new(mem.clone(), me).unwrap_or_else(|| panic!("mailboxes")))
        .collect()
}

fn send(sim: &mut Sim, from: usize, to: usize, tag: u32, v: Vec<i32>) {
    sim.submit(
        from,
        GroupId::WORLD,
        Request::Send {
            tensor: Tensor::from_vec(v),
            dst: to,
            tag,
        },
        &CallOptions::default(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
}

fn recv(
    sim: &mut Sim,
    at: usize,
    src: Option<usize>,
    tag: u32,
    n: usize,
) -> collectix_runtime::OpId {
    sim.submit(
        at,
        GroupId::WORLD,
        Request::Recv {
            spec: TensorSpec::new(&[n], DType::I32),
            src,
            tag,
        },
        &CallOptions::default(),
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

fn received(sim: &mut Sim, rank: usize, id: collectix_runtime::OpId) -> Vec<i32> {
    match sim.take(rank, id) {
        Some(Ok(Output::Received { tensor, .. })) => tensor.to_vec::<i32>().unwrap_or_default(),
        other => panic!(
            "receive {id:?} on rank {rank}: {other:?}\n{}",
            sim.trace_text()
        ),
    }
}

/// Rank 0 mails `v` to rank 1 on `tag` through `b`, with the lane's sequence number its
/// engine draws, and rank 1's engine reads it (as a driver of rank 1 would).
fn mail(
    sim: &mut Sim,
    b: &[Mailboxes],
    out: &mut collectix_runtime::board::mail::MailOut,
    tag: u32,
    v: &[i32],
) {
    let seq = sim
        .on_engine(0, |e| e.p2p_mail_seq(GroupId::WORLD, 1, tag))
        .flatten()
        .unwrap_or_else(|| panic!("no sequence number"));
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    b[0].post(out, 1, tag, seq, DType::I32, &bytes)
        .unwrap_or_else(|e| panic!("{e:?}"));
}

fn deliver_mail(sim: &mut Sim, b: &[Mailboxes], inn: &mut collectix_runtime::board::mail::MailIn) {
    while let Some(m) = b[1].take(inn, 0) {
        let m: Mail = m.unwrap_or_else(|e| panic!("{e}"));
        sim.on_engine(1, |e| e.on_p2p_mail(GroupId::WORLD, 0, m));
    }
}

/// Messages of one lane that travel partly by mailbox and partly through the engine's
/// transports arrive in any order and are received in the order they were sent; each
/// consumed mailbox message is reported once, to free its slot.
#[test]
fn a_lanes_messages_are_received_in_order_whichever_way_each_went() {
    for seed in 0..8 {
        let mut sim = Sim::new(2, seed);
        let b = mailboxes(2);
        let (mut out, mut inn) = (b[0].outbox(), b[1].inbox());
        // 0: engine (large), 1: mailbox, 2: engine, 3: mailbox.
        send(&mut sim, 0, 1, 5, vec![0; 100]);
        mail(&mut sim, &b, &mut out, 5, &[1]);
        send(&mut sim, 0, 1, 5, vec![2; 3]);
        mail(&mut sim, &b, &mut out, 5, &[3, 3]);
        // The mailbox is read before the engine's messages come.
        deliver_mail(&mut sim, &b, &mut inn);
        let ids = [
            recv(&mut sim, 1, Some(0), 5, 100),
            recv(&mut sim, 1, Some(0), 5, 1),
            recv(&mut sim, 1, Some(0), 5, 3),
            recv(&mut sim, 1, None, 5, 2),
        ];
        sim.run_no_timeouts(100_000)
            .unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(received(&mut sim, 1, ids[0]), vec![0; 100], "seed {seed}");
        assert_eq!(received(&mut sim, 1, ids[1]), vec![1]);
        assert_eq!(received(&mut sim, 1, ids[2]), vec![2; 3]);
        assert_eq!(received(&mut sim, 1, ids[3]), vec![3, 3]);
        let mut freed = Vec::new();
        if let Some(e) = sim.engine_mut(1) {
            e.take_mail_freed(&mut freed);
        }
        assert_eq!(freed, vec![(GroupId::WORLD, 0), (GroupId::WORLD, 0)]);
    }
}

/// A receive takes the lane's next message without a pending call when it is here; not
/// when a receive posted before could take it (that one gets it), nor when the lane's
/// next message is not here (a later one of the lane is).
#[test]
fn a_receive_takes_a_message_at_once_only_when_nothing_comes_first() {
    let mut sim = Sim::new(2, 1);
    let b = mailboxes(2);
    let (mut out, mut inn) = (b[0].outbox(), b[1].inbox());
    let spec = TensorSpec::new(&[1], DType::I32);
    let take = |sim: &mut Sim| {
        sim.on_engine(1, |e| e.p2p_take(GroupId::WORLD, 0, 7, &spec))
            .flatten()
    };
    assert!(take(&mut sim).is_none(), "nothing sent yet");
    // Message 0 through the engine, not delivered yet; message 1 by mailbox, here.
    send(&mut sim, 0, 1, 7, vec![10]);
    mail(&mut sim, &b, &mut out, 7, &[11]);
    deliver_mail(&mut sim, &b, &mut inn);
    assert!(
        take(&mut sim).is_none(),
        "the lane's next message is not here"
    );
    sim.run_no_timeouts(100_000)
        .unwrap_or_else(|e| panic!("{e:?}"));
    assert!(
        matches!(take(&mut sim), Some(Ok(Output::Received { tensor, src: 0 })) if tensor.to_vec::<i32>().unwrap_or_default() == vec![10])
    );
    assert!(
        matches!(take(&mut sim), Some(Ok(Output::Received { tensor, src: 0 })) if tensor.to_vec::<i32>().unwrap_or_default() == vec![11])
    );
    // A receive from any source posted first gets the next message, not a later take.
    let posted = recv(&mut sim, 1, None, 7, 1);
    mail(&mut sim, &b, &mut out, 7, &[12]);
    deliver_mail(&mut sim, &b, &mut inn);
    assert!(take(&mut sim).is_none(), "a posted receive comes first");
    sim.run_no_timeouts(100_000)
        .unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(received(&mut sim, 1, posted), vec![12]);
}

/// A mailbox message that does not match the receive that takes it (another count) fails
/// that receive with a mismatch naming both calls and aborts the group on both ranks; a
/// replayed one (a sequence number of the lane consumed already) aborts it as a protocol
/// violation.
#[test]
fn a_mismatched_or_replayed_mailbox_message_aborts_the_group() {
    let mut sim = Sim::new(2, 2);
    let b = mailboxes(2);
    let (mut out, mut inn) = (b[0].outbox(), b[1].inbox());
    mail(&mut sim, &b, &mut out, 3, &[1]);
    deliver_mail(&mut sim, &b, &mut inn);
    let two = TensorSpec::new(&[2], DType::I32);
    let r = sim
        .on_engine(1, |e| e.p2p_take(GroupId::WORLD, 0, 3, &two))
        .flatten();
    assert!(matches!(r, Some(Err(Error::Mismatch { .. }))), "{r:?}");
    sim.run_no_timeouts(100_000)
        .unwrap_or_else(|e| panic!("{e:?}"));
    for rank in 0..2 {
        assert!(
            sim.engine(rank)
                .and_then(|e| e.aborted(GroupId::WORLD))
                .is_some(),
            "rank {rank} did not abort"
        );
    }
    // The sender's next small send goes through the engine, which reports the abort.
    assert!(sim
        .on_engine(0, |e| e.p2p_mail_seq(GroupId::WORLD, 1, 3))
        .flatten()
        .is_none());

    let mut sim = Sim::new(2, 3);
    let m = Mail {
        tag: 4,
        seq: 0,
        dtype: DType::I32,
        bytes: vec![0; 4],
    };
    sim.on_engine(1, |e| {
        e.on_p2p_mail(GroupId::WORLD, 0, m.clone());
        e.on_p2p_mail(GroupId::WORLD, 0, m);
    });
    let aborted = sim
        .engine(1)
        .and_then(|e| e.aborted(GroupId::WORLD))
        .cloned();
    assert!(
        matches!(aborted, Some(Error::Protocol { rank: 0, .. })),
        "{aborted:?}"
    );
}
