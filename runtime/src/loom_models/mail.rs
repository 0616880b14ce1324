//! Model group 11: a board group's mailboxes (`crate::board::mail`): a sender that writes
//! small messages into its ring toward a receiver as long as the ring has room, and a
//! receiver that reads them in order and frees each slot once the message is consumed,
//! across two wraps of a ring of two slots (so every slot is reused).
//!
//! What it proves, in every interleaving loom explores: the receiver reads every message
//! whole (its tag, its sequence number and its bytes those the sender wrote) and in order,
//! and never a slot that names anything else. The two planted bugs must be caught: a sender
//! that writes a slot's position word before its message (the receiver may read the slot's
//! old contents under the new position), and a sender that writes a slot the receiver has
//! not freed (it overwrites a message not read yet, which the receiver sees as a slot
//! naming another message, or a message lost).
//!
//! And who takes a message (`crate::board::mail_wake`): a sender racing a driver of the
//! receiver that leaves, and two ranks that send to each other at once while each is
//! counted as a driver of its own: no message is left in a mailbox with nobody driving its
//! receiver and no run asked for. Two more planted bugs must be caught there: a driver that
//! leaves without looking at the flag, and a sender that reads the receiver's drivers
//! without its fence.

use super::{check, must_fail};
use crate::board::mail::{MailFlaw, MailIn, Mailboxes};
use crate::board::mail_wake::{MailFlag, MailWakeFlaw};
use crate::board::{AtomicWords, Lane, SLOT_WORDS};
use crate::progress::Inbox;
use crate::sync::AtomicU64;
use crate::DType;
use loom::sync::Arc;

/// Slots per ring in the model.
const DEPTH: usize = 2;
/// Messages sent: two wraps of the ring.
const MESSAGES: u64 = 2 * DEPTH as u64;

/// A member's mailbox words for a group of two with rings of [`DEPTH`] slots.
struct ModelBox(Vec<AtomicU64>);

impl ModelBox {
    fn new() -> ModelBox {
        ModelBox(
            (0..3 * SLOT_WORDS + 2 * DEPTH * SLOT_WORDS)
                .map(|_| AtomicU64::new(0))
                .collect(),
        )
    }
}

impl AtomicWords for ModelBox {
    fn word(&self, i: usize) -> Option<&AtomicU64> {
        self.0.get(i)
    }
}

/// The message the sender writes as its `k`th: distinct in every field.
fn payload(k: u64) -> Vec<u8> {
    let b = (k as u8).wrapping_mul(37).wrapping_add(1);
    vec![b; 8 + 8 * (k as usize % 2)]
}

/// A sender and a receiver of [`MESSAGES`] messages over rings of [`DEPTH`] slots, with
/// `flaw` planted in both members' view.
fn send_and_receive(flaw: Option<MailFlaw>) {
    let mem: Vec<std::sync::Arc<dyn Lane>> = (0..2)
        .map(|_| std::sync::Arc::new(ModelBox::new()) as std::sync::Arc<dyn Lane>)
        .collect();
    let member = |me| {
        Mailboxes::new(mem.clone(), me)
            .unwrap_or_else(|| panic!("mailboxes"))
            .for_model(DEPTH, flaw)
    };
    let (sender, receiver) = (member(0), member(1));
    let t = loom::thread::spawn(move || {
        let mut out = sender.outbox();
        for k in 0..MESSAGES {
            loop {
                match sender.post(&mut out, 1, k as u32 + 10, k, DType::U8, &payload(k)) {
                    Ok(()) => break,
                    Err(crate::board::mail::NotPosted::Full) => loom::thread::yield_now(),
                    Err(e) => panic!("post: {e:?}"),
                }
            }
        }
    });
    let mut inn = receiver.inbox();
    for k in 0..MESSAGES {
        let m = loop {
            match receiver.take(&mut inn, 0) {
                Some(Ok(m)) => break m,
                Some(Err(e)) => panic!("message {k}: {e}"),
                None => loom::thread::yield_now(),
            }
        };
        assert_eq!(
            (m.tag, m.seq, &m.bytes),
            (k as u32 + 10, k, &payload(k)),
            "message {k} read wrong"
        );
        receiver.free(&mut inn, 0, 1);
    }
    t.join().unwrap_or_else(|_| panic!("the sender panicked"));
}

#[test]
fn a_receiver_reads_every_message_whole_and_in_order_across_slot_reuse() {
    check(
        "mail: a sender and a receiver, two wraps of two slots",
        || send_and_receive(None),
    );
}

/// The bug: the position word is written before the message. loom must find the execution
/// where the receiver reads the slot between the two.
#[test]
fn with_the_position_written_first_a_receiver_may_read_a_torn_message() {
    let (msg, _) = must_fail("bug: mailbox position written first", || {
        send_and_receive(Some(MailFlaw::PositionFirst))
    });
    assert!(
        msg.contains("read wrong") || msg.contains("message"),
        "unexpected failure: {msg}"
    );
}

/// The bug: a slot is written without looking at what the receiver freed. loom must find
/// the execution where a message is overwritten before it is read.
#[test]
fn without_the_look_at_freed_slots_a_message_is_overwritten_unread() {
    let (msg, _) = must_fail("bug: mailbox room unchecked", || {
        send_and_receive(Some(MailFlaw::RoomUnchecked))
    });
    assert!(msg.contains("message"), "unexpected failure: {msg}");
}

// Who takes a message written into a mailbox (`crate::board::mail_wake`): a sender raises
// the receiver's flag and wakes it if nobody drives it; a driver that leaves looks at the
// flag. No message may be left in a mailbox with nobody driving its receiver and no run
// asked for.

/// A rank of the wake models: its inbox (whose drivers count and background run the rule
/// uses), its mail flag, its view of a group of two's mailboxes, and what it read.
struct Rank {
    me: usize,
    inbox: Inbox<u32>,
    flag: MailFlag,
    boxes: Mailboxes,
}

/// The two ranks of a group, sharing their mailboxes; `flaw` planted in both flags.
fn two_ranks(flaw: Option<MailWakeFlaw>) -> (Arc<Rank>, Arc<Rank>) {
    let mem: Vec<std::sync::Arc<dyn Lane>> = (0..2)
        .map(|_| std::sync::Arc::new(ModelBox::new()) as std::sync::Arc<dyn Lane>)
        .collect();
    let rank = |me| {
        Arc::new(Rank {
            me,
            inbox: Inbox::new(),
            flag: flaw.map_or_else(MailFlag::new, MailFlag::with_flaw),
            boxes: Mailboxes::new(mem.clone(), me)
                .unwrap_or_else(|| panic!("mailboxes"))
                .for_model(1, None),
        })
    };
    (rank(0), rank(1))
}

impl Rank {
    /// A run of the rank's engine: reads its mailboxes if the flag was raised (as
    /// `Driver::take_mail`), appending the tags of what it read.
    fn run(&self, inn: &mut MailIn, got: &mut Vec<u32>) {
        if self.flag.take() {
            let src = 1 - self.me;
            while let Some(m) = self.boxes.take(inn, src) {
                match m {
                    Ok(m) => got.push(m.tag),
                    Err(e) => panic!("a mailbox read: {e}"),
                }
            }
        }
    }

    /// Sends `tag` to `peer` and settles who takes it: `true` when the sender asked for the
    /// peer's background run (it must be woken).
    fn send(&self, peer: &Rank, tag: u32) -> bool {
        let mut out = self.boxes.outbox();
        let dst = peer.me;
        if let Err(e) = self
            .boxes
            .post(&mut out, dst, tag, 0, DType::U8, &[tag as u8])
        {
            panic!("post: {e:?}");
        }
        peer.flag.raise(&peer.inbox) && peer.inbox.ask()
    }

    /// The background run, if it was asked for: what it read.
    fn background(&self, asked: bool, inn: &mut MailIn, got: &mut Vec<u32>) {
        if asked {
            let mut arrivals = Vec::new();
            self.inbox.begin_background(&mut arrivals);
            self.run(inn, got);
        }
    }
}

/// A sender against a driver of the receiver that runs once and leaves.
fn send_vs_leaving_driver(flaw: Option<MailWakeFlaw>) {
    let (sender, receiver) = two_ranks(flaw);
    let peer = receiver.clone();
    let t = loom::thread::spawn(move || sender.send(&peer, 7));
    let mut inn = receiver.boxes.inbox();
    let mut got = Vec::new();
    let d = receiver.inbox.enter();
    receiver.run(&mut inn, &mut got);
    if receiver.flag.leave(d) {
        receiver.run(&mut inn, &mut got);
    }
    let asked = t.join().unwrap_or_else(|_| panic!("the sender panicked"));
    receiver.background(asked, &mut inn, &mut got);
    assert_eq!(
        got,
        [7],
        "the message was stranded (background asked: {asked})"
    );
}

#[test]
fn a_message_racing_a_leaving_driver_is_never_stranded() {
    check("mail_wake: a send vs a leaving driver", || {
        send_vs_leaving_driver(None)
    });
}

/// Two ranks that send to each other at once, each counted as a driver of its own rank
/// while it sends (as `Driver::mail_send`), then leaving: each finds the other driven, and
/// each must see, leaving, the message the other wrote.
#[test]
fn two_ranks_sending_to_each_other_at_once_each_take_the_others_message() {
    check("mail_wake: two ranks send to each other", || {
        let (a, b) = two_ranks(None);
        let side = |me: Arc<Rank>, peer: Arc<Rank>, tag: u32| {
            let mut inn = me.boxes.inbox();
            let mut got = Vec::new();
            let d = me.inbox.enter();
            let asked = me.send(&peer, tag);
            if me.flag.leave(d) {
                me.run(&mut inn, &mut got);
            }
            (asked, inn, got)
        };
        let (a2, b2) = (a.clone(), b.clone());
        let t = loom::thread::spawn(move || side(a2, b2, 1));
        let (asked_a, mut inn_b, mut got_b) = side(b.clone(), a.clone(), 2);
        let (asked_b, mut inn_a, mut got_a) =
            t.join().unwrap_or_else(|_| panic!("rank 0 panicked"));
        a.background(asked_a, &mut inn_a, &mut got_a);
        b.background(asked_b, &mut inn_b, &mut got_b);
        assert_eq!((got_a, got_b), (vec![2], vec![1]), "a message was stranded");
    });
}

/// The bug: a driver stops driving without looking at the flag. loom must find the
/// execution where the sender saw it driving and it left without reading the message.
#[test]
fn a_driver_that_leaves_without_looking_at_the_flag_strands_a_message() {
    let (msg, _) = must_fail("bug: mail_wake leave without a look", || {
        send_vs_leaving_driver(Some(MailWakeFlaw::NoLook))
    });
    assert!(msg.contains("stranded"), "unexpected failure: {msg}");
}

/// The bug: a sender reads the receiver's drivers without a fence after raising its flag.
/// loom must find the execution where each of the sender and the leaving driver misses
/// the other's write.
#[test]
fn a_sender_without_its_fence_strands_a_message() {
    let (msg, _) = must_fail("bug: mail_wake raise without a fence", || {
        send_vs_leaving_driver(Some(MailWakeFlaw::NoFence))
    });
    assert!(msg.contains("stranded"), "unexpected failure: {msg}");
}
