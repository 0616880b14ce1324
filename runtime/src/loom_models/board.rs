//! Model group 8: the board of small calls (`crate::board`): members that publish a slot,
//! look at the others' ([`Board::look`], what a caller's quick path and the queued path
//! both run), finish, and reuse a slot [`DEPTH`] calls later. Each member is a loom thread
//! over lanes whose words are loom atomics (only the words the model touches: the
//! `finished` mark and the slots of its calls).
//!
//! What they prove, in every interleaving loom explores:
//! - two members that disagree, neither needing the other's slot (each names itself a
//!   broadcast's root), are never both `Ok`: the fence after the publish makes one see the
//!   other's slot (and without it, the planted bug, loom finds the execution where both
//!   miss);
//! - with three members, one waiting for a root's slot and two needing nobody's, the same;
//! - a member reuses its slot only once every other member finished the call in it (and
//!   without the look at their marks, the planted bug, loom finds a member still in the call
//!   when the slot is taken).
//!
//! Not modelled here: the spin of a waiting caller (each member looks a bounded number of
//! times), and the wake-up of a member whose caller left (`board::wake`, modelled in
//! `board_wake.rs`).

use super::{check, must_fail};
use crate::board::{slot_base, AtomicWords, Board, BoardCall, Flaw, Lane, DEPTH, SLOT_WORDS};
use crate::collective::{Output, Request};
use crate::error::{Error, Result};
use crate::group::{CallOptions, GroupInfo, GroupOptions};
use crate::sync::{AtomicBool, AtomicU64, Ordering};
use crate::tensor::reduce::ReduceOp;
use crate::tensor::Tensor;
use loom::sync::Arc;

/// A lane holding only the words of the `finished` mark and of the slots of `seqs`.
struct ModelLane {
    words: Vec<(usize, AtomicU64)>,
}

impl ModelLane {
    fn new(seqs: &[u64]) -> ModelLane {
        let mut at: Vec<usize> = vec![0];
        for &s in seqs {
            at.extend(slot_base(s)..slot_base(s) + SLOT_WORDS);
        }
        at.sort_unstable();
        at.dedup();
        ModelLane {
            words: at.into_iter().map(|i| (i, AtomicU64::new(0))).collect(),
        }
    }
}

impl AtomicWords for ModelLane {
    fn word(&self, i: usize) -> Option<&AtomicU64> {
        self.words.iter().find(|(k, _)| *k == i).map(|(_, w)| w)
    }
}

/// The boards of `n` members over model lanes for calls `seqs`, each with `flaw`.
fn boards(n: usize, seqs: &[u64], flaw: Option<Flaw>) -> Vec<Board> {
    let lanes: Vec<std::sync::Arc<dyn Lane>> = (0..n)
        .map(|_| std::sync::Arc::new(ModelLane::new(seqs)) as std::sync::Arc<dyn Lane>)
        .collect();
    (0..n)
        .map(|m| {
            let b = Board::new(lanes.clone(), m).unwrap_or_else(|e| panic!("{e}"));
            match flaw {
                Some(f) => b.with_flaw(f),
                None => b,
            }
        })
        .collect()
}

fn info(n: usize, me: usize) -> GroupInfo {
    GroupInfo::world(n, me, GroupOptions::default()).unwrap_or_else(|e| panic!("{e}"))
}

fn call(req: &Request, n: usize, me: usize) -> BoardCall {
    match BoardCall::of(req, &info(n, me), &CallOptions::default()) {
        Some(Ok(c)) => c,
        other => panic!("not a board call: {other:?}"),
    }
}

fn broadcast(root: usize) -> Request {
    Request::Broadcast {
        tensor: Tensor::from_vec(vec![1.0f32]),
        root,
    }
}

/// Member `board.me()` publishes call `seq` and looks up to `looks` times: the call's end,
/// or `None` if a slot it needs never came in those looks.
fn publish_and_look(
    board: &Board,
    c: &BoardCall,
    n: usize,
    seq: u64,
    looks: usize,
) -> Option<Result<Output>> {
    assert!(board.can_publish(seq), "slot {seq} taken");
    if let Err(e) = board.publish(seq, c.fingerprint_bytes(), c.payload()) {
        panic!("publish: {e}");
    }
    let info = info(n, board.me());
    let mut slots = vec![None; n];
    for k in 0..looks {
        if let Some(r) = board.look(c, &info, seq, true, &mut slots) {
            return Some(r);
        }
        if k + 1 < looks {
            loom::thread::yield_now();
        }
    }
    None
}

/// Members calling `reqs[m]` at call 0, each on a thread (member 0 on this one): what each
/// look ended with.
fn disagree(reqs: Vec<Request>, flaw: Option<Flaw>) -> Vec<Option<Result<Output>>> {
    let n = reqs.len();
    let mut bs = boards(n, &[0], flaw).into_iter();
    let mine = bs.next().unwrap_or_else(|| panic!("no member"));
    let c0 = call(&reqs[0], n, 0);
    let handles: Vec<_> = bs
        .enumerate()
        .map(|(k, b)| {
            let c = call(&reqs[k + 1], n, k + 1);
            loom::thread::spawn(move || publish_and_look(&b, &c, n, 0, 2))
        })
        .collect();
    let mut got = vec![publish_and_look(&mine, &c0, n, 0, 2)];
    got.extend(
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| panic!("a member panicked"))),
    );
    got
}

fn assert_seen(got: &[Option<Result<Output>>]) {
    assert!(
        got.iter()
            .any(|r| matches!(r, Some(Err(Error::Mismatch { .. })))),
        "every member that finished the disagreeing call was Ok: {got:?}"
    );
}

#[test]
fn two_roots_of_one_broadcast_see_each_other() {
    check("board: two members each the root of its broadcast", || {
        assert_seen(&disagree(vec![broadcast(0), broadcast(1)], None));
    });
}

#[test]
fn three_members_that_need_few_slots_see_a_disagreement() {
    check(
        "board: broadcast root, its receiver, a reduce's non-root",
        || {
            let reduce = Request::Reduce {
                tensor: Tensor::from_vec(vec![1.0f32]),
                root: 0,
                op: ReduceOp::Sum,
            };
            assert_seen(&disagree(vec![broadcast(0), broadcast(0), reduce], None));
        },
    );
}

/// The bug: the slots a call does not need are read without the fence after the publish.
/// loom must find the execution where each member's look misses the other's slot (its
/// first already does: the second member's load may read the value before the first
/// member's store, the store buffer's effect, which only the fences forbid).
#[test]
fn without_the_fence_two_roots_may_both_miss_the_disagreement() {
    let (msg, _) = must_fail("bug: board look without its fence", || {
        assert_seen(&disagree(
            vec![broadcast(0), broadcast(1)],
            Some(Flaw::NoCheckFence),
        ));
    });
    assert!(msg.contains("every member"), "unexpected failure: {msg}");
}

/// Two members all-reduce at call 0; member 0 then reuses its slot for call `DEPTH` as
/// soon as the board lets it. Member 1 says it is done with call 0 before it marks it
/// finished: a slot taken while member 1 is not done is the bug.
fn reuse(flaw: Option<Flaw>) {
    let n = 2;
    let later = DEPTH as u64;
    let mut bs = boards(n, &[0, later], flaw).into_iter();
    let (b0, b1) = match (bs.next(), bs.next()) {
        (Some(a), Some(b)) => (a, b),
        _ => panic!("two members"),
    };
    let done1 = Arc::new(AtomicBool::new(false));
    let seen = done1.clone();
    let all_reduce = |x: f32| Request::AllReduce {
        tensor: Tensor::from_vec(vec![x]),
        op: ReduceOp::Sum,
    };
    let c1 = call(&all_reduce(2.0), n, 1);
    let other = loom::thread::spawn(move || {
        let got = publish_and_look(&b1, &c1, n, 0, 2);
        if let Some(r) = &got {
            assert!(
                matches!(r, Ok(Output::Tensor(t)) if t.to_vec::<f32>().ok() == Some(vec![3.0])),
                "member 1 read a slot that was not call 0's: {r:?}"
            );
            done1.store(true, Ordering::Release);
            b1.finish(0);
        }
    });
    let c0 = call(&all_reduce(1.0), n, 0);
    if let Some(Ok(_)) = publish_and_look(&b0, &c0, n, 0, 2) {
        b0.finish(0);
        if b0.can_publish(later) {
            assert!(
                seen.load(Ordering::Acquire),
                "member 0 took its slot back while member 1 was still in call 0"
            );
            let next = call(&Request::Barrier, n, 0);
            if let Err(e) = b0.publish(later, next.fingerprint_bytes(), next.payload()) {
                panic!("publish: {e}");
            }
        }
    }
    other.join().unwrap_or_else(|_| panic!("member 1 panicked"));
}

#[test]
fn a_slot_is_reused_only_once_every_member_finished_its_call() {
    check("board: reuse of a slot after DEPTH calls", || reuse(None));
}

/// The bug: a slot reused without a look at the other members' `finished` marks.
#[test]
fn reusing_a_slot_without_the_marks_is_caught() {
    let (msg, _) = must_fail("bug: board reuse without the marks", || {
        reuse(Some(Flaw::ReuseUnchecked))
    });
    assert!(
        msg.contains("still in call 0") || msg.contains("not call 0's"),
        "unexpected failure: {msg}"
    );
}

/// Two members' queues (`board::queue::Queue`, what each rank's driver steps), each on its
/// own thread stepping twice: member 0 the root of two broadcasts, member 1 the receiver of
/// the first and, in `disagree`, the root of its own second one. Every result member 1 gets
/// for call 0 is member 0's value; with `disagree`, whatever each member's steps saw, the
/// second call is never `Ok` on both with no record of the disagreement on either.
fn two_queues(disagree: bool, flaw: Option<Flaw>) {
    use crate::board::queue::{Queue, Record};
    use crate::time::Time;
    let n = 2;
    let mut bs = boards(n, &[0, 1], flaw).into_iter();
    let (b0, b1) = match (bs.next(), bs.next()) {
        (Some(a), Some(b)) => (a, b),
        _ => panic!("two members"),
    };
    let bcast = |me: usize, root: usize, x: f32| {
        call(
            &Request::Broadcast {
                tensor: Tensor::from_vec(vec![x]),
                root,
            },
            n,
            me,
        )
    };
    let run = |b: Board, calls: Vec<BoardCall>, me: usize| {
        move || {
            let mut q = Queue::new(n);
            for (seq, c) in calls.into_iter().enumerate() {
                q.push(seq as u64, c, false, seq, Time::ZERO);
            }
            let (mut out, mut records) = (Vec::new(), Vec::new());
            for _ in 0..2 {
                q.step(&b, &info(n, me), &|| Time::ZERO, &mut out, &mut records);
            }
            (out, records)
        }
    };
    let second_root = if disagree { 1 } else { 0 };
    let other = loom::thread::spawn(run(
        b1,
        vec![bcast(1, 0, -1.0), bcast(1, second_root, -1.0)],
        1,
    ));
    let (out0, rec0) = run(b0, vec![bcast(0, 0, 5.0), bcast(0, 0, 6.0)], 0)();
    let (out1, rec1) = other.join().unwrap_or_else(|_| panic!("member 1 panicked"));
    for (seq, r) in &out1 {
        if *seq == 0 {
            assert!(
                matches!(r, Ok(Output::Tensor(t)) if t.to_vec::<f32>().ok() == Some(vec![5.0])),
                "member 1's call 0: {r:?}"
            );
        }
    }
    if disagree {
        let ok = |out: &Vec<(usize, Result<Output>)>| out.iter().any(|(s, r)| *s == 1 && r.is_ok());
        let told = |recs: &Vec<Record>| {
            recs.iter()
                .any(|r| matches!(r, Record::Failed(1, _) | Record::Disagreed(1, _)))
        };
        assert!(
            !(ok(&out0) && ok(&out1)) || told(&rec0) || told(&rec1),
            "call 1 Ok on both members and no record of the disagreement: {out0:?} {out1:?}"
        );
    } else {
        assert!(
            rec0.iter().chain(&rec1).all(|r| !r.failed()),
            "a failure where the members agree: {rec0:?} {rec1:?}"
        );
    }
}

#[test]
fn two_queues_that_agree_end_their_calls_with_the_root_s_values() {
    check("board: two members' queues, two broadcasts", || {
        two_queues(false, None)
    });
}

#[test]
fn two_queues_that_disagree_on_the_second_root_never_both_end_it_unheard() {
    check(
        "board: two members' queues, the second call's roots differ",
        || two_queues(true, None),
    );
}

/// The bug of the fence, through the queues: loom finds both members ending the second call
/// `Ok` with no record of it.
#[test]
fn two_queues_without_the_fence_may_end_the_disagreement_unheard() {
    let (msg, _) = must_fail("bug: board queues without the look's fence", || {
        two_queues(true, Some(Flaw::NoCheckFence))
    });
    assert!(msg.contains("no record"), "unexpected failure: {msg}");
}
