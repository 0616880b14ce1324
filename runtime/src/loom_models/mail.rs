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
//! Not modelled here: who wakes the receiver (the protocol of an in-process arrival,
//! `progress.rs`, with the mailbox looked at by every driver and a leaving one).

use super::{check, must_fail};
use crate::board::mail::{MailFlaw, Mailboxes};
use crate::board::{AtomicWords, Lane, SLOT_WORDS};
use crate::sync::AtomicU64;
use crate::DType;

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
