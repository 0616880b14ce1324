use super::*;
use crate::collective::Request;
use crate::group::CallOptions;
use crate::group::{GroupId, GroupOptions};
use crate::tensor::dtype::DType;
use crate::tensor::reduce::{reference, ReduceOp};
use crate::tensor::Tensor;
use std::sync::Arc;

fn lanes(n: usize) -> Vec<Arc<dyn Lane>> {
    (0..n)
        .map(|_| Arc::new(HeapLane::default()) as Arc<dyn Lane>)
        .collect()
}

fn boards(n: usize) -> Vec<Board> {
    let l = lanes(n);
    (0..n)
        .map(|m| Board::new(l.clone(), m).unwrap_or_else(|e| panic!("{e}")))
        .collect()
}

fn info(n: usize, me: usize) -> GroupInfo {
    GroupInfo::new(
        GroupId::WORLD,
        (0..n).collect(),
        me,
        GroupOptions::default(),
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

fn call(req: &Request, n: usize, me: usize) -> BoardCall {
    match BoardCall::of(req, &info(n, me), &CallOptions::default()) {
        Some(Ok(c)) => c,
        other => panic!("not a board call: {other:?}"),
    }
}

/// Runs call `seq` on every member of `b`, each with its own request.
fn run(b: &[Board], seq: u64, reqs: &[Request]) -> Vec<Result<Output>> {
    let n = b.len();
    let calls: Vec<BoardCall> = (0..n).map(|m| call(&reqs[m], n, m)).collect();
    for (m, c) in calls.iter().enumerate() {
        assert!(b[m].can_publish(seq), "member {m} may publish {seq}");
        b[m].publish(seq, c.fingerprint_bytes(), c.payload())
            .unwrap_or_else(|e| panic!("{e}"));
    }
    (0..n)
        .map(|m| {
            let slots: Vec<Option<Slot>> = (0..n)
                .map(|p| {
                    if calls[m].needs(m, p) {
                        b[m].read(p, seq).unwrap_or_else(|e| panic!("{e}"))
                    } else {
                        None
                    }
                })
                .collect();
            let r = calls[m].finish(&info(n, m), seq, &slots);
            b[m].finish(seq);
            r
        })
        .collect()
}

fn f32s(o: &Result<Output>) -> Vec<f32> {
    match o {
        Ok(Output::Tensor(t)) => t.to_vec::<f32>().unwrap_or_else(|e| panic!("{e}")),
        other => panic!("not a tensor: {other:?}"),
    }
}

#[test]
fn a_slot_holds_a_small_call_in_one_line() {
    assert_eq!(INLINE_MAX, 28);
    assert_eq!(SLOT_WORDS * 8, 64);
    assert_eq!(LANE_BYTES, 64 * (DEPTH + 2));
}

#[test]
fn all_reduce_barrier_and_broadcast_agree_with_the_reference_on_every_member() {
    for n in 1..=5 {
        let b = boards(n);
        for seq in 0..(3 * DEPTH as u64) {
            let reqs: Vec<Request> = (0..n)
                .map(|m| Request::AllReduce {
                    tensor: Tensor::from_vec(vec![m as f32 + seq as f32, 1.5, -(m as f32)]),
                    op: ReduceOp::Sum,
                })
                .collect();
            let want: Vec<f32> = vec![
                (0..n).map(|m| m as f32 + seq as f32).sum(),
                1.5 * n as f32,
                -((0..n).sum::<usize>() as f32),
            ];
            for o in run(&b, seq, &reqs) {
                assert_eq!(f32s(&o), want, "n {n} seq {seq}");
            }
        }
        let seq = 3 * DEPTH as u64;
        for o in run(&b, seq, &vec![Request::Barrier; n]) {
            assert!(matches!(o, Ok(Output::None)));
        }
        let root = n / 2;
        let reqs: Vec<Request> = (0..n)
            .map(|m| Request::Broadcast {
                tensor: Tensor::from_vec(vec![if m == root { 7.0f32 } else { 0.0 }; 2]),
                root,
            })
            .collect();
        for o in run(&b, seq + 1, &reqs) {
            assert_eq!(f32s(&o), vec![7.0, 7.0]);
        }
        // A reduce: the root gets the sum, the others their input back.
        let reqs: Vec<Request> = (0..n)
            .map(|m| Request::Reduce {
                tensor: Tensor::from_vec(vec![m as f32, 2.0]),
                root,
                op: ReduceOp::Sum,
            })
            .collect();
        for (m, o) in run(&b, seq + 2, &reqs).into_iter().enumerate() {
            let want = if m == root {
                vec![(0..n).sum::<usize>() as f32, 2.0 * n as f32]
            } else {
                vec![m as f32, 2.0]
            };
            assert_eq!(f32s(&o), want, "n {n} member {m}");
        }
    }
}

#[test]
fn avg_and_max_are_the_sequential_reference() {
    let b = boards(3);
    for (seq, op) in [ReduceOp::Avg, ReduceOp::Max, ReduceOp::Product]
        .into_iter()
        .enumerate()
    {
        let seq = seq as u64;
        let inputs: Vec<Tensor> = (0..3)
            .map(|m| Tensor::from_vec(vec![m as f32 + 0.25, 3.0 - m as f32]))
            .collect();
        let reqs: Vec<Request> = inputs
            .iter()
            .map(|t| Request::AllReduce {
                tensor: t.clone(),
                op,
            })
            .collect();
        let want = reference(op, &inputs).unwrap_or_else(|e| panic!("{e}"));
        for o in run(&b, seq, &reqs) {
            match o {
                Ok(Output::Tensor(t)) => assert_eq!(t.bytes(), want.bytes()),
                other => panic!("{other:?}"),
            }
        }
    }
}

#[test]
fn a_slot_is_reused_only_once_every_member_finished_its_call() {
    let b = boards(3);
    let c = call(&Request::Barrier, 3, 0);
    for seq in 0..DEPTH as u64 {
        assert!(b[0].can_publish(seq));
        b[0].publish(seq, c.fingerprint_bytes(), c.payload())
            .unwrap_or_else(|e| panic!("{e}"));
    }
    let next = DEPTH as u64;
    assert!(!b[0].can_publish(next), "slot 0 still holds call 0");
    b[1].finish(0);
    assert!(!b[0].can_publish(next), "member 2 has not finished call 0");
    b[2].finish(0);
    assert!(b[0].can_publish(next));
    assert_eq!(b[1].read(0, next), Ok(None), "not published yet");
    assert!(b[1].read(0, 0).is_ok_and(|s| s.is_some()));
}

#[test]
fn another_call_in_a_slot_is_a_mismatch_naming_both() {
    let b = boards(2);
    let reqs = vec![
        Request::AllReduce {
            tensor: Tensor::from_vec(vec![1.0f32]),
            op: ReduceOp::Sum,
        },
        Request::AllReduce {
            tensor: Tensor::from_vec(vec![1.0f32]),
            op: ReduceOp::Max,
        },
    ];
    for (m, o) in run(&b, 0, &reqs).into_iter().enumerate() {
        match o {
            Err(Error::Mismatch {
                seq: Some(0),
                ours,
                theirs,
                ..
            }) => {
                assert_eq!(ours.rank, m);
                assert_eq!(theirs.rank, 1 - m);
            }
            other => panic!("member {m}: {other:?}"),
        }
    }
}

#[test]
fn garbage_in_a_lane_is_an_error_never_a_result() {
    let l = lanes(2);
    let b = Board::new(l.clone(), 0).unwrap_or_else(|e| panic!("{e}"));
    let base = slot_base(3);
    // A sequence number and a fingerprint that does not decode: the call that reads it
    // fails with a protocol error naming the member.
    l[1].store(base, 4);
    l[1].store(base + 1, u64::MAX);
    let slot = b.read(1, 3).unwrap_or_else(|e| panic!("{e}"));
    assert!(slot.is_some_and(|s| s.fingerprint().is_none()));
    let mine = call(&Request::Barrier, 2, 0);
    let g = GroupInfo::world(2, 0, GroupOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    assert!(matches!(
        mine.finish(&g, 3, &[None, slot]),
        Err(Error::Protocol { rank: 1, .. })
    ));
    // A good fingerprint, a length out of range.
    let c = call(&Request::Barrier, 2, 1);
    let b1 = Board::new(l.clone(), 1).unwrap_or_else(|e| panic!("{e}"));
    b1.publish(3, c.fingerprint_bytes(), &[])
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(b.read(1, 3).is_ok_and(|s| s.is_some()));
    let w = base + 1 + FINGERPRINT_BYTES / 8;
    let v = l[1].load(w).unwrap_or(0);
    let shift = (FINGERPRINT_BYTES % 8) * 8;
    l[1].store(w, v | (0xff << shift));
    assert!(matches!(b.read(1, 3), Err(BoardError { member: 1, .. })));
    // Out of range members and words.
    assert!(b.read(2, 0).is_err());
    assert!(l[0].load(LANE_WORDS).is_none());
    assert!(!l[0].store(LANE_WORDS, 1));
}

#[test]
fn only_small_calls_without_a_forced_algorithm_run_on_the_board() {
    let g = info(2, 0);
    let small = Request::AllReduce {
        tensor: Tensor::from_vec(vec![0u8; INLINE_MAX]),
        op: ReduceOp::Sum,
    };
    let large = Request::AllReduce {
        tensor: Tensor::from_vec(vec![0u8; INLINE_MAX + 1]),
        op: ReduceOp::Sum,
    };
    let none = CallOptions::default();
    assert!(matches!(BoardCall::of(&small, &g, &none), Some(Ok(_))));
    assert!(BoardCall::of(&large, &g, &none).is_none());
    let forced = CallOptions {
        algorithm: Some(crate::op::Algorithm::Ring),
        ..CallOptions::default()
    };
    assert!(BoardCall::of(&small, &g, &forced).is_none());
    let bad_op = Request::AllReduce {
        tensor: Tensor::from_vec(vec![1.0f32]),
        op: ReduceOp::BXor,
    };
    assert!(matches!(BoardCall::of(&bad_op, &g, &none), Some(Err(_))));
    let bad_root = Request::Broadcast {
        tensor: Tensor::from_vec(vec![1.0f32]),
        root: 2,
    };
    assert!(matches!(BoardCall::of(&bad_root, &g, &none), Some(Err(_))));
    let reduce = |tensor: Tensor, root, op| Request::Reduce { tensor, root, op };
    let one = || Tensor::from_vec(vec![1.0f32]);
    assert!(matches!(
        BoardCall::of(&reduce(one(), 1, ReduceOp::Max), &g, &none),
        Some(Ok(_))
    ));
    assert!(matches!(
        BoardCall::of(&reduce(one(), 2, ReduceOp::Sum), &g, &none),
        Some(Err(_))
    ));
    assert!(matches!(
        BoardCall::of(&reduce(one(), 0, ReduceOp::BXor), &g, &none),
        Some(Err(_))
    ));
    let gather = Request::AllGatherIntoTensor {
        input: Tensor::from_vec(vec![1.0f32]),
        output: crate::TensorSpec::new(&[2], DType::F32),
    };
    assert!(BoardCall::of(&gather, &g, &none).is_none());
}

#[test]
fn a_board_call_fingerprints_its_call_and_its_path() {
    let n = 3;
    let t = || Tensor::from_vec(vec![1.0f32, 2.0]);
    let ar = call(
        &Request::AllReduce {
            tensor: t(),
            op: ReduceOp::PremulSum(2.0),
        },
        n,
        0,
    )
    .fingerprint();
    assert_eq!(ar.path, crate::ids::DataPath::Board);
    assert_eq!((ar.count, ar.root), (Some(2), None));
    assert_eq!(
        ar.scalar,
        2.0f64.to_bits(),
        "the op's scalar is part of the call"
    );
    let red = call(
        &Request::Reduce {
            tensor: t(),
            root: 2,
            op: ReduceOp::Sum,
        },
        n,
        0,
    )
    .fingerprint();
    assert_eq!((red.count, red.root, red.scalar), (Some(2), Some(2), 0));
    assert_eq!(red.path, crate::ids::DataPath::Board);
    let b = call(&Request::Barrier, n, 1).fingerprint();
    assert_eq!(b.path, crate::ids::DataPath::Board);
    assert_eq!(BoardCall::barrier().fingerprint(), b);
}

#[test]
fn a_call_is_partial_where_a_member_finishes_without_every_slot() {
    let n = 3;
    let t = || Tensor::from_vec(vec![1.0f32]);
    let bcast = |me| {
        call(
            &Request::Broadcast {
                tensor: t(),
                root: 0,
            },
            n,
            me,
        )
    };
    let reduce = |me| {
        call(
            &Request::Reduce {
                tensor: t(),
                root: 0,
                op: ReduceOp::Sum,
            },
            n,
            me,
        )
    };
    let all = |me| {
        call(
            &Request::AllReduce {
                tensor: t(),
                op: ReduceOp::Sum,
            },
            n,
            me,
        )
    };
    assert!(bcast(0).partial(0, n), "the root needs nobody");
    assert!(bcast(1).partial(1, n), "a receiver needs only the root");
    assert!(!reduce(0).partial(0, n), "the root needs every member");
    assert!(reduce(2).partial(2, n), "the others need nobody");
    assert!(!all(1).partial(1, n));
    assert!(!call(&Request::Barrier, n, 2).partial(2, n));
    assert!(
        !bcast(1).partial(1, 2),
        "of two members a receiver needs the only other one"
    );
}

#[test]
fn a_slot_of_the_same_call_with_another_length_is_a_broken_peer() {
    let b = boards(2);
    let req = Request::AllReduce {
        tensor: Tensor::from_vec(vec![1.0f32]),
        op: ReduceOp::Sum,
    };
    let (c0, c1) = (call(&req, 2, 0), call(&req, 2, 1));
    b[0].publish(0, c0.fingerprint_bytes(), c0.payload())
        .unwrap_or_else(|e| panic!("{e}"));
    // Member 1's slot names the call but holds 3 bytes, not 4.
    b[1].publish(0, c1.fingerprint_bytes(), &[0u8; 3])
        .unwrap_or_else(|e| panic!("{e}"));
    let slots = vec![None, b[0].read(1, 0).unwrap_or_else(|e| panic!("{e}"))];
    let r = c0.finish(&info(2, 0), 0, &slots);
    assert!(
        matches!(
            r,
            Err(Error::Protocol {
                rank: 1,
                detail: crate::error::ProtocolError::Length {
                    expected: 4,
                    got: 3,
                    ..
                }
            })
        ),
        "{r:?}"
    );
}

#[test]
fn a_slot_is_reused_only_once_every_other_member_finished_the_call_in_it() {
    let ls = lanes(2);
    let b0 = Board::new(ls.clone(), 0).unwrap_or_else(|e| panic!("{e}"));
    let b1 = Board::new(ls, 1).unwrap_or_else(|e| panic!("{e}"));
    let fp = [0u8; FINGERPRINT_BYTES];
    for seq in 0..6 {
        assert!(b0.can_publish(seq), "slot of call {seq} never used");
        assert_eq!(b0.publish(seq, &fp, &[]), Ok(()));
        b0.finish(seq);
    }
    let d = DEPTH as u64;
    assert!(!b0.can_publish(d), "member 1 did not finish call 0");
    assert!(!b0.can_publish(d + 1), "nor call 1");
    b1.finish(0);
    assert!(b0.can_publish(d));
    assert!(!b0.can_publish(d + 1), "member 1 finished call 0 only");
    b1.finish(1);
    assert!(b0.can_publish(d + 1));
    assert!(
        !b0.can_publish(d + 4),
        "member 1 finished calls 0 and 1 only"
    );
    b1.finish(5);
    assert!(b0.can_publish(d + 4) && b0.can_publish(d + 5));
    assert!(b0.can_publish(d + 6), "slot 6 never used");
}

#[test]
fn a_slot_with_the_largest_payload_reads_back_whole() {
    let ls = lanes(2);
    let b0 = Board::new(ls.clone(), 0).unwrap_or_else(|e| panic!("{e}"));
    let b1 = Board::new(ls, 1).unwrap_or_else(|e| panic!("{e}"));
    let payload: Vec<u8> = (1..=INLINE_MAX as u8).collect();
    assert_eq!(b0.publish(3, &[7u8; FINGERPRINT_BYTES], &payload), Ok(()));
    let slot = b1
        .read(0, 3)
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|| panic!("published"));
    assert_eq!(usize::from(slot.len), INLINE_MAX);
    assert_eq!(&slot.payload[..], &payload[..]);
}
