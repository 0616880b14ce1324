//! Model group 5: deliberate bugs the models must catch, so they are known to bite. Each
//! buggy model has a correct twin that passes, so the failure comes from the bug and not
//! from the harness.
//!
//! - A schedule in which both ranks receive before they send: loom reports the deadlock.
//! - A sequence number not advanced: on every rank, the second call is refused and the
//!   results check fails ("wrong result"); on one rank only, the other rank waits forever
//!   for the second call and loom reports the deadlock.
//! - A completion slot that forgets to notify, or notifies one of two waiters: loom finds
//!   the lost wake-up and reports the deadlock.
//! - A driver that throws away messages for calls its rank has not made yet: loom finds
//!   the interleaving in which such a message arrives, and reports the deadlock.
//!
//! The last three bugs only show in some interleavings: their tests also assert that the
//! first execution passed, so it is loom's search, not luck, that finds them.

use super::{assert_output, check, must_fail, plan, run_world, world, Script};
use crate::collective::{Output, Plan, Request};
use crate::group::GroupId;
use crate::schedule::{Action, Layout, RecvOp, Schedule, SendOp};
use crate::sync::{lock, Arc, Condvar, Mutex};
use crate::tensor::reduce::ReduceOp;
use crate::tensor::Tensor;
use std::time::Duration;

/// A hand-made one-element exchange between ranks 0 and 1 of a world of 2: each rank sends
/// its value and copies the peer's. With `recv_first`, each rank's schedule receives in a
/// step before the step that sends — the deliberate bug.
fn exchange(r: usize, recv_first: bool) -> Plan {
    let info = world(2, r);
    let v = 10 * (r as i32 + 1);
    // The fingerprint of a real 1-element i32 all_reduce, so both ranks agree on it.
    let fp = plan(
        Request::AllReduce {
            tensor: Tensor::from_vec(vec![v]),
            op: ReduceOp::Sum,
        },
        &info,
    )
    .fingerprint();
    let peer = 1 - r;
    let send = SendOp {
        peer,
        tag: 0,
        chunks: 0..1,
    };
    let recv = RecvOp {
        peer,
        tag: 0,
        chunks: 0..1,
        action: Action::Copy,
    };
    let mut s = Schedule::new(Layout::blocks(&[1]));
    if recv_first {
        s.step(Vec::new(), vec![recv]);
        s.step(vec![send], Vec::new());
    } else {
        s.step(vec![send], vec![recv]);
    }
    let init = vec![Some(Tensor::from_vec(vec![v]).into_bytes())];
    Plan::from_schedule(fp, s, init, Duration::from_secs(300), 2)
}

/// Runs the exchange on 2 ranks and checks each got the other's value.
fn run_exchange(recv_first: bool) {
    let scripts = (0..2)
        .map(|r| {
            Script::new(r)
                .group(world(2, r))
                .call(GroupId::WORLD, 0, exchange(r, recv_first))
        })
        .collect();
    let res = run_world(scripts, Vec::new());
    for (r, rr) in res.iter().enumerate() {
        let peer_value = 10 * (2 - r as i32);
        let want = Output::Tensor(Tensor::from_vec(vec![peer_value]));
        assert_output(&format!("rank {r} exchange"), &rr[0], &want);
    }
}

/// The correct twin: send, then receive, in one step.
#[test]
fn exchange_send_then_recv_completes() {
    check("bug twin: exchange, send then receive", || {
        run_exchange(false)
    });
}

/// The bug: both ranks receive before they send. loom must report the deadlock (on the
/// first execution already: every interleaving deadlocks).
#[test]
fn exchange_recv_before_send_deadlocks() {
    let (msg, _) = must_fail("bug: exchange, receive before send", || run_exchange(true));
    assert!(
        msg.contains("deadlock"),
        "expected loom's deadlock report, got {msg:?}"
    );
}

/// Two all_reduces per rank; rank `r` gives its calls the sequence numbers `seqs[r]`.
fn two_all_reduces(seqs: [[u64; 2]; 2]) {
    let scripts = (0..2)
        .map(|r| {
            let info = world(2, r);
            let k = r as i32 + 1;
            let a = plan(
                Request::AllReduce {
                    tensor: Tensor::from_vec(vec![k]),
                    op: ReduceOp::Sum,
                },
                &info,
            );
            let b = plan(
                Request::AllReduce {
                    tensor: Tensor::from_vec(vec![100 * k]),
                    op: ReduceOp::Sum,
                },
                &info,
            );
            Script::new(r)
                .group(info)
                .call(GroupId::WORLD, seqs[r][0], a)
                .call(GroupId::WORLD, seqs[r][1], b)
        })
        .collect();
    let res = run_world(scripts, Vec::new());
    for (r, rr) in res.iter().enumerate() {
        let a = Output::Tensor(Tensor::from_vec(vec![3i32]));
        let b = Output::Tensor(Tensor::from_vec(vec![300i32]));
        assert_output(&format!("rank {r} call #0"), &rr[0], &a);
        assert_output(&format!("rank {r} call #1"), &rr[1], &b);
    }
}

/// The correct twin: sequence numbers 0, 1 on both ranks.
#[test]
fn sequence_advanced_completes() {
    check("bug twin: sequence numbers advanced", || {
        two_all_reduces([[0, 1], [0, 1]]);
    });
}

/// The bug on every rank: both calls get sequence number 0. The engine refuses the second
/// ("already used"), so the model's result check fails.
#[test]
fn sequence_not_advanced_anywhere_is_caught() {
    let (msg, _) = must_fail("bug: sequence number not advanced (both ranks)", || {
        two_all_reduces([[0, 0], [0, 0]]);
    });
    assert!(
        msg.contains("wrong result") && msg.contains("already used"),
        "expected the refused second call, got {msg:?}"
    );
}

/// The bug on one rank: rank 1 reuses 0, rank 0 waits for call #1 forever. loom must
/// report the deadlock (a real run would time out).
#[test]
fn sequence_not_advanced_on_one_rank_deadlocks() {
    let (msg, _) = must_fail("bug: sequence number not advanced (rank 1)", || {
        two_all_reduces([[0, 1], [0, 0]]);
    });
    assert!(
        msg.contains("deadlock"),
        "expected loom's deadlock report, got {msg:?}"
    );
}

/// How the copy of the completion slot below is broken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Flaw {
    /// Not broken: notifies every waiter, like [`crate::completion`].
    None,
    /// Sets the value and notifies nobody.
    NoNotify,
    /// Notifies one waiter only.
    NotifyOne,
}

/// A reduced copy of the completion slot's blocking path (`set` and `wait`, with the
/// value left in place so several waiters can read it), with a [`Flaw`] switched in.
struct FlawedSlot {
    value: Mutex<Option<u32>>,
    ready: Condvar,
    flaw: Flaw,
}

impl FlawedSlot {
    /// An empty slot with `flaw`.
    fn new(flaw: Flaw) -> FlawedSlot {
        FlawedSlot {
            value: Mutex::new(None),
            ready: Condvar::new(),
            flaw,
        }
    }

    /// Sets the value, then notifies as the flaw allows.
    fn complete(&self, v: u32) {
        *lock(&self.value) = Some(v);
        match self.flaw {
            Flaw::None => self.ready.notify_all(),
            Flaw::NotifyOne => self.ready.notify_one(),
            Flaw::NoNotify => {}
        }
    }

    /// Blocks until the value is there.
    fn wait(&self) -> u32 {
        let mut g = lock(&self.value);
        loop {
            if let Some(v) = *g {
                return v;
            }
            g = self.ready.wait(g).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// `waiters` threads wait on a [`FlawedSlot`] while the main thread completes it.
fn flawed_slot(flaw: Flaw, waiters: usize) {
    let s = Arc::new(FlawedSlot::new(flaw));
    let hs: Vec<_> = (0..waiters)
        .map(|_| {
            let s = s.clone();
            loom::thread::spawn(move || s.wait())
        })
        .collect();
    s.complete(7);
    // No loom object may be on the main thread's stack when loom reports the deadlock:
    // dropping one while that panic unwinds would abort the test binary.
    drop(s);
    for h in hs {
        assert_eq!(h.join().unwrap_or_else(|_| panic!("waiter panicked")), 7);
    }
}

/// The correct twin: notify_all wakes both waiters.
#[test]
fn slot_copy_notify_all_completes() {
    check("bug twin: slot copy with notify_all, 2 waiters", || {
        flawed_slot(Flaw::None, 2);
    });
}

/// Asserts that a [`must_fail`] outcome is loom's deadlock report, found only after the
/// first execution passed: the bug hides from the default schedule, and loom's search is
/// what finds it.
fn assert_found_by_search(what: &str, (msg, execution): (String, usize)) {
    assert!(
        msg.contains("deadlock"),
        "{what}: expected a deadlock, got {msg:?}"
    );
    assert!(
        execution > 1,
        "{what}: failed on the first execution, so this does not show the search at work"
    );
}

/// The bug: no notify. loom must find the interleaving where the waiter sleeps first.
#[test]
fn slot_copy_without_notify_loses_the_wake_up() {
    let what = "bug: slot copy without notify";
    let outcome = must_fail(what, || flawed_slot(Flaw::NoNotify, 1));
    assert_found_by_search(what, outcome);
}

/// The bug: notify_one with two waiters. loom must find the waiter left behind.
#[test]
fn slot_copy_notify_one_leaves_a_waiter_behind() {
    let what = "bug: slot copy with notify_one, 2 waiters";
    let outcome = must_fail(what, || flawed_slot(Flaw::NotifyOne, 2));
    assert_found_by_search(what, outcome);
}

/// The bug in a driver: rank 1 throws away messages for a call it has not made yet,
/// in the overlapping-groups model. Whether such a message arrives early depends on the
/// interleaving (rank 2's message for the second group races rank 0's for the first), so
/// the first execution passes and loom must search for the one that loses it.
#[test]
fn driver_dropping_early_messages_deadlocks() {
    let what = "bug: driver drops messages for calls not made yet";
    let outcome = must_fail(what, || super::concurrent::overlapping_3(false, true));
    assert_found_by_search(what, outcome);
}
