//! Model group 10: how a member of a board learns it must wake another ([`crate::board::wake`]),
//! across processes: the rank's [`Signal`] mirrored into its lane header, which the mover
//! reads after its fence.
//!
//! Three loom threads:
//! - the rank's last driver leaves with a call pending ([`Signal::leave`]), then looks at
//!   the board (a flag standing for the other member's slot);
//! - another thread of the rank changes its pending count meanwhile (a call queued and
//!   finished by its progress thread), which writes the mirror too;
//! - the other member publishes its slot (the flag), fences, and reads the mirror
//!   ([`need_of_lane`]).
//!
//! What it proves, in every interleaving loom explores: the leaving driver's look sees the
//! slot, or the mover finds that the rank needs a wake-up (no wake-up is lost). Planted bug:
//! the mirror written without its lock (a writer stores what it read, again until the
//! state did not change meanwhile: the actors crate's old loop). A stale store then lands
//! after the leaving driver's fence, the mover reads "driven", and nobody looks again.

use super::{check_from, must_fail_from};
use crate::board::wake::{need_of_lane, Need, Signal};
use crate::board::{AtomicWords, Lane, DRIVERS_WORD, PENDING_WORD, UNATTENDED_WORD};
use crate::sync::{fence, AtomicBool, AtomicU64, Ordering};
use loom::sync::Arc;

/// The bound the planted bug needs (its execution preempts the writer between its read and
/// its store, and the leaving driver twice); the model passes at it too.
const BOUND: usize = 3;

/// A lane holding only the words of the mirror.
struct MirrorLane([AtomicU64; 3]);

impl AtomicWords for MirrorLane {
    fn word(&self, i: usize) -> Option<&AtomicU64> {
        match i {
            PENDING_WORD => Some(&self.0[0]),
            DRIVERS_WORD => Some(&self.0[1]),
            UNATTENDED_WORD => Some(&self.0[2]),
            _ => None,
        }
    }
}

fn leave_while_the_count_moves(unlocked: bool) {
    let lane: std::sync::Arc<dyn Lane> =
        std::sync::Arc::new(MirrorLane(std::array::from_fn(|_| AtomicU64::new(0))));
    let signal = if unlocked {
        Signal::default().with_unlocked_mirror()
    } else {
        Signal::default()
    };
    signal.mirror_into(lane.clone());
    // One call pending, one thread driving it.
    signal.add_pending(1);
    signal.enter();
    let signal = Arc::new(signal);
    let slot = Arc::new(AtomicBool::new(false));

    let leaver = {
        let (signal, slot) = (signal.clone(), slot.clone());
        loom::thread::spawn(move || {
            let (_, look) = signal.leave();
            look && slot.load(Ordering::SeqCst)
        })
    };
    let other = {
        let signal = signal.clone();
        loom::thread::spawn(move || {
            signal.add_pending(1);
            signal.sub_pending(1);
        })
    };
    slot.store(true, Ordering::SeqCst);
    fence(Ordering::SeqCst);
    let woken = need_of_lane(&*lane) != Need::No;
    let seen = leaver
        .join()
        .unwrap_or_else(|_| panic!("the leaving driver panicked"));
    other
        .join()
        .unwrap_or_else(|_| panic!("the other thread panicked"));
    assert!(
        seen || woken,
        "a wake-up was lost: the leaving driver missed the slot and the mover read no need"
    );
}

#[test]
fn a_driver_leaving_while_the_pending_count_moves_loses_no_wake_up() {
    check_from("board wake: leave while the count moves", BOUND, || {
        leave_while_the_count_moves(false)
    });
}

#[test]
fn without_the_mirror_lock_a_stale_store_loses_a_wake_up() {
    let (msg, _) = must_fail_from("bug: board wake mirror without its lock", BOUND, || {
        leave_while_the_count_moves(true)
    });
    assert!(
        msg.contains("a wake-up was lost"),
        "unexpected failure: {msg}"
    );
}
