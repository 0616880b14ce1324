//! The engine on its own: malformed and hostile input from a peer ends in a typed error
//! (never a panic, never wrong data), and bookkeeping errors are caught.

use bytes::Bytes;
use collectix_runtime::data_plane::{DataPlane, HostPlane};
use collectix_runtime::error::ProtocolError;
use collectix_runtime::group::{CallOptions, GroupId, GroupInfo, GroupOptions};
use collectix_runtime::wire::{Header, Message};
use collectix_runtime::Fingerprint;
use collectix_runtime::{
    Algorithm, DType, Engine, Error, Event, Output, Plan, ReduceOp, Request, Tensor, Time,
};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

const W: usize = 2;

fn engine(rank: usize) -> Engine {
    let mut e = Engine::new(rank);
    e.add_group(
        GroupInfo::world(W, rank, GroupOptions::default()).unwrap_or_else(|e| panic!("{e}")),
        Time::ZERO,
    );
    e
}

fn plan(rank: usize, req: Request) -> Plan {
    let info = GroupInfo::world(W, rank, GroupOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    let opts = CallOptions {
        algorithm: Some(Algorithm::RecursiveDoubling),
        timeout: Some(Duration::from_secs(1)),
    };
    Plan::new(req, &info, &opts).unwrap_or_else(|e| panic!("{e}"))
}

fn all_reduce(rank: usize, v: Vec<f32>) -> Plan {
    plan(
        rank,
        Request::AllReduce {
            tensor: Tensor::from_vec(v),
            op: ReduceOp::Sum,
        },
    )
}

fn events(e: &mut Engine) -> Vec<Event> {
    std::iter::from_fn(|| e.poll_event()).collect()
}

/// Rank 1 runs an all_reduce of 2 f32s; `msg` is what "rank 0" sends it instead of the real
/// message. Returns rank 1's error and whether it told rank 0 about the abort.
fn feed(header_of: impl Fn(Fingerprint) -> Header, payload: Vec<Bytes>) -> (Error, bool) {
    let mut e = engine(1);
    let p = all_reduce(1, vec![1.0, 2.0]);
    let fp = p.fingerprint();
    let id = e.submit(GroupId::WORLD, 0, p, Time::ZERO);
    while e.poll_transmit().is_some() {}
    e.handle_message(
        Message {
            src: 0,
            header: header_of(fp),
            payload,
        },
        Time::ZERO,
    );
    let told = std::iter::from_fn(|| e.poll_transmit())
        .any(|t| t.dst == 0 && matches!(t.msg.header, Header::Abort { .. }));
    let ev = events(&mut e);
    assert_eq!(ev.len(), 1);
    assert_eq!(ev[0].op, id);
    (
        ev[0]
            .result
            .clone()
            .err()
            .unwrap_or_else(|| panic!("accepted a bad message")),
        told,
    )
}

fn data(seq: u64, tag: u32) -> impl Fn(Fingerprint) -> Header {
    move |call| Header::Data {
        group: GroupId::WORLD,
        seq,
        tag,
        call,
    }
}

fn f32_bytes(v: &[f32]) -> Bytes {
    Tensor::from_slice(v).into_bytes()
}

#[test]
fn wrong_payload_length_is_a_protocol_error() {
    let (e, told) = feed(data(0, 1), vec![f32_bytes(&[1.0, 2.0, 3.0])]);
    assert!(
        matches!(
            e,
            Error::Protocol {
                rank: 0,
                detail: ProtocolError::Length { .. }
            }
        ),
        "{e}"
    );
    assert!(told, "the group is aborted on the peer too");
}

#[test]
fn wrong_number_of_parts_is_a_protocol_error() {
    let (e, _) = feed(data(0, 1), vec![f32_bytes(&[1.0]), f32_bytes(&[2.0])]);
    assert!(
        matches!(
            e,
            Error::Protocol {
                detail: ProtocolError::Parts {
                    expected: 1,
                    got: 2
                },
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn unknown_tag_is_a_protocol_error() {
    let (e, _) = feed(data(0, 77), vec![f32_bytes(&[1.0, 2.0])]);
    assert!(
        matches!(
            e,
            Error::Protocol {
                detail: ProtocolError::UnexpectedTag { tag: 77, .. },
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn different_fingerprint_is_a_mismatch_naming_both_ranks() {
    let (e, told) = feed(
        |mut fp| {
            fp.count = Some(3);
            Header::Data {
                group: GroupId::WORLD,
                seq: 0,
                tag: 1,
                call: fp,
            }
        },
        vec![f32_bytes(&[1.0, 2.0, 3.0])],
    );
    match e {
        Error::Mismatch {
            ours,
            theirs,
            seq: Some(0),
            ..
        } => {
            assert_eq!((ours.rank, theirs.rank), (1, 0));
            assert_eq!((ours.call.count, theirs.call.count), (Some(2), Some(3)));
        }
        other => panic!("{other}"),
    }
    assert!(told);
}

#[test]
fn invalid_bool_bytes_are_rejected() {
    let mut e = engine(1);
    let p = plan(
        1,
        Request::AllReduce {
            tensor: Tensor::from_vec(vec![true, false]),
            op: ReduceOp::Max,
        },
    );
    let fp = p.fingerprint();
    let _ = e.submit(GroupId::WORLD, 0, p, Time::ZERO);
    e.handle_message(
        Message {
            src: 0,
            header: Header::Data {
                group: GroupId::WORLD,
                seq: 0,
                tag: 1,
                call: fp,
            },
            payload: vec![Bytes::from(vec![1u8, 7])],
        },
        Time::ZERO,
    );
    let ev = events(&mut e);
    let err = ev[0].result.clone().err();
    assert!(
        matches!(
            err,
            Some(Error::Protocol {
                detail: ProtocolError::InvalidElements { dtype: DType::Bool },
                ..
            })
        ),
        "{err:?}"
    );
}

#[test]
fn duplicate_message_is_a_protocol_error() {
    // Rank 1 receives its step's message twice before it can use it: a halving-doubling
    // all_reduce on 2 ranks has one step, so hold the first by delivering to an unsubmitted call.
    let mut e = engine(1);
    let p = all_reduce(1, vec![1.0, 2.0]);
    let fp = p.fingerprint();
    let msg = || Message {
        src: 0,
        header: Header::Data {
            group: GroupId::WORLD,
            seq: 0,
            tag: 1,
            call: fp,
        },
        payload: vec![f32_bytes(&[1.0, 1.0])],
    };
    e.handle_message(msg(), Time::ZERO);
    e.handle_message(msg(), Time::ZERO);
    let _ = e.submit(GroupId::WORLD, 0, p, Time::ZERO);
    let ev = events(&mut e);
    // The second copy arrives while the call still holds the first (its reduction waits
    // for the call's own message to leave): the group is aborted with a protocol error
    // naming the sender and the duplicate, never a silent drop. (Had the call finished
    // first, the copy would be a late one: `Stale`.)
    assert_eq!(ev.len(), 1);
    assert!(
        matches!(
            e.aborted(GroupId::WORLD),
            Some(Error::Protocol {
                rank: 0,
                detail: ProtocolError::Duplicate { seq: 0, tag: 1 }
            })
        ),
        "{:?}",
        e.aborted(GroupId::WORLD)
    );
    assert!(std::iter::from_fn(|| e.poll_transmit())
        .any(|t| matches!(t.msg.header, Header::Abort { .. })));
}

#[test]
fn late_message_for_a_finished_call_is_checked() {
    let mut a = engine(0);
    let mut b = engine(1);
    let ia = a.submit(GroupId::WORLD, 0, all_reduce(0, vec![1.0]), Time::ZERO);
    let ib = b.submit(GroupId::WORLD, 0, all_reduce(1, vec![2.0]), Time::ZERO);
    let to_b: Vec<_> = std::iter::from_fn(|| a.poll_transmit()).collect();
    let to_a: Vec<_> = std::iter::from_fn(|| b.poll_transmit()).collect();
    for t in &to_b {
        b.handle_message(t.msg.clone(), Time::ZERO);
    }
    for t in to_a {
        a.handle_message(t.msg, Time::ZERO);
    }
    let ea = events(&mut a);
    let eb = events(&mut b);
    assert_eq!(ea[0].op, ia);
    assert_eq!(eb[0].op, ib);
    assert_eq!(
        ea[0].result.clone().ok(),
        Some(Output::Tensor(Tensor::from_vec(vec![3.0f32])))
    );
    // A replay of the same message after the call finished is a protocol error, not data.
    b.handle_message(to_b[0].msg.clone(), Time::ZERO);
    assert!(matches!(
        b.aborted(GroupId::WORLD),
        Some(Error::Protocol {
            detail: ProtocolError::Stale { seq: 0 },
            ..
        })
    ));
    let later = b.submit(GroupId::WORLD, 1, all_reduce(1, vec![1.0]), Time::ZERO);
    let ev = events(&mut b);
    assert_eq!(ev[0].op, later);
    assert!(matches!(ev[0].result, Err(Error::GroupAborted { .. })));
}

#[test]
fn messages_for_a_group_not_yet_created_wait_for_it() {
    let mut a = engine(0);
    let mut b = engine(1);
    let gid = GroupId::derive(GroupId::WORLD, 0, &[1]);
    let info = |r| {
        GroupInfo::new(gid, vec![0, 1], r, GroupOptions::default())
            .unwrap_or_else(|e| panic!("{e}"))
    };
    a.add_group(info(0), Time::ZERO);
    let pa = Plan::new(
        Request::AllReduce {
            tensor: Tensor::from_vec(vec![5i64]),
            op: ReduceOp::Sum,
        },
        &info(0),
        &CallOptions::default(),
    );
    a.submit(gid, 0, pa.unwrap_or_else(|e| panic!("{e}")), Time::ZERO);
    for t in std::iter::from_fn(|| a.poll_transmit()) {
        b.handle_message(t.msg, Time::ZERO);
    }
    // b learns of the group only now; the early message is used.
    b.add_group(info(1), Time::ZERO);
    let pb = Plan::new(
        Request::AllReduce {
            tensor: Tensor::from_vec(vec![6i64]),
            op: ReduceOp::Sum,
        },
        &info(1),
        &CallOptions::default(),
    );
    let ib = b.submit(gid, 0, pb.unwrap_or_else(|e| panic!("{e}")), Time::ZERO);
    let ev = events(&mut b);
    assert_eq!(ev[0].op, ib);
    assert_eq!(
        ev[0].result.clone().ok(),
        Some(Output::Tensor(Tensor::from_vec(vec![11i64])))
    );
}

#[test]
fn a_rank_outside_a_group_gets_not_a_member() {
    let mut e = engine(0);
    let gid = GroupId::derive(GroupId::WORLD, 3, &[]);
    let id = e.submit(gid, 0, all_reduce(0, vec![1.0]), Time::ZERO);
    let ev = events(&mut e);
    assert_eq!(ev[0].op, id);
    assert_eq!(
        ev[0].result,
        Err(Error::NotAMember {
            group: gid,
            rank: 0
        })
    );
    assert!(GroupInfo::new(gid, vec![1, 2], 0, GroupOptions::default()).is_err());
}

#[test]
fn reusing_a_sequence_number_is_refused() {
    // The communicator takes sequence numbers in order: a reused one is a driver's bug,
    // an internal error, not the caller's invalid argument.
    let mut e = engine(0);
    let _ = e.submit(GroupId::WORLD, 4, all_reduce(0, vec![1.0]), Time::ZERO);
    let again = e.submit(GroupId::WORLD, 4, all_reduce(0, vec![1.0]), Time::ZERO);
    let ev = events(&mut e);
    assert!(ev
        .iter()
        .any(|x| x.op == again && matches!(x.result, Err(Error::Internal(_)))));
}

/// Rank 1 of 2 makes an all_reduce that rank 0 never answers; at the deadline rank 1 asks
/// rank 0 which call it is in. Returns the engine, the call and the deadline.
fn timed_out_and_asking() -> (Engine, collectix_runtime::OpId, Time) {
    let mut e = engine(1);
    let id = e.submit(GroupId::WORLD, 0, all_reduce(1, vec![1.0]), Time::ZERO);
    while e.poll_transmit().is_some() {}
    let at = e.poll_timeout().unwrap_or_else(|| panic!("no deadline"));
    assert_eq!(at, Time::ZERO + Duration::from_secs(1));
    e.handle_timeout(Time::from_nanos(at.as_nanos() - 1));
    assert!(events(&mut e).is_empty(), "not yet");
    e.handle_timeout(at);
    assert!(events(&mut e).is_empty(), "the desync report comes first");
    let asked: Vec<_> = std::iter::from_fn(|| e.poll_transmit()).collect();
    // The inquiry, and a wait-cycle probe to the rank the call waits for.
    assert!(
        matches!(&asked[..], [t, p] if t.dst == 0 && matches!(t.msg.header, Header::Inquire { seq: 0, .. })
            && p.dst == 0 && matches!(&p.msg.header, Header::Probe { path, .. } if path.len() == 1 && path[0].peer == 0)),
        "{asked:?}"
    );
    (e, id, at)
}

#[test]
fn a_timeout_without_an_answer_says_so_after_the_grace() {
    let (mut e, id, at) = timed_out_and_asking();
    let grace = GroupOptions::default().desync_grace;
    assert_eq!(e.poll_timeout(), Some(at + grace));
    e.handle_timeout(at + grace);
    let ev = events(&mut e);
    assert_eq!(ev[0].op, id);
    match &ev[0].result {
        Err(
            err @ Error::Timeout {
                rank: 1, report, ..
            },
        ) => {
            assert_eq!(
                report,
                &vec![collectix_runtime::RankCall::NoAnswer { rank: 0 }]
            );
            assert!(err.to_string().contains("rank 0 did not answer"), "{err}");
        }
        other => panic!("{other:?}"),
    }
    assert!(std::iter::from_fn(|| e.poll_transmit())
        .any(|t| matches!(t.msg.header, Header::Abort { .. })));
    assert_eq!(e.poll_timeout(), None);
}

#[test]
fn a_timeout_names_exactly_the_ranks_that_have_not_made_the_call() {
    let (mut e, id, at) = timed_out_and_asking();
    // Rank 0 answers: it has not reached call 0 (no call on the group yet).
    e.handle_message(
        Message {
            src: 0,
            header: Header::Status {
                group: GroupId::WORLD,
                seq: 0,
                made: None,
                latest: None,
                in_call_for: None,
                elsewhere: false,
            },
            payload: Vec::new(),
        },
        at,
    );
    let ev = events(&mut e);
    assert_eq!(ev[0].op, id);
    assert!(
        matches!(&ev[0].result, Err(Error::Timeout { waiting_for, rank: 1, .. }) if waiting_for == &vec![0]),
        "{:?}",
        ev[0].result
    );
}

#[test]
fn a_timeout_where_a_peer_is_in_another_call_is_a_mismatch_naming_both() {
    let (mut e, id, at) = timed_out_and_asking();
    let theirs = Fingerprint {
        count: Some(7),
        ..Fingerprint::new(collectix_runtime::OpKind::Broadcast, DType::F32)
    };
    e.handle_message(
        Message {
            src: 0,
            header: Header::Status {
                group: GroupId::WORLD,
                seq: 0,
                made: Some(Box::new(theirs)),
                latest: Some(Box::new((0, theirs))),
                in_call_for: None,
                elsewhere: false,
            },
            payload: Vec::new(),
        },
        at,
    );
    let ev = events(&mut e);
    assert_eq!(ev[0].op, id);
    match &ev[0].result {
        Err(
            err @ Error::Mismatch {
                theirs: t, report, ..
            },
        ) => {
            assert_eq!((t.rank, t.call), (0, theirs));
            assert_eq!(report.len(), 1);
            assert!(err.to_string().contains("rank 0 is in broadcast"), "{err}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_rank_answers_an_inquiry_with_its_call() {
    let mut e = engine(0);
    let p = all_reduce(0, vec![1.0]);
    let fp = p.fingerprint();
    let _ = e.submit(GroupId::WORLD, 0, p, Time::ZERO);
    while e.poll_transmit().is_some() {}
    // Asked 3 ms after it made call 0, it says so; of call 5 it has not made, nothing.
    for (seq, made, in_call_for) in [(0, Some(fp), Some(3_000_000)), (5, None, None)] {
        e.handle_message(
            Message {
                src: 1,
                header: Header::Inquire {
                    group: GroupId::WORLD,
                    seq,
                },
                payload: Vec::new(),
            },
            Time::from_nanos(3_000_000),
        );
        let out: Vec<_> = std::iter::from_fn(|| e.poll_transmit()).collect();
        assert!(
            matches!(&out[..], [t] if t.dst == 1 && t.msg.header == Header::Status { group: GroupId::WORLD, seq, made: made.map(Box::new), latest: Some(Box::new((0, fp))), in_call_for, elsewhere: made.is_none() }),
            "{out:?}"
        );
    }
}

#[test]
fn message_from_a_non_member_is_dropped() {
    let mut e = engine(1);
    let p = all_reduce(1, vec![1.0, 2.0]);
    let fp = p.fingerprint();
    let _ = e.submit(GroupId::WORLD, 0, p, Time::ZERO);
    e.handle_message(
        Message {
            src: 9,
            header: data(0, 1)(fp),
            payload: vec![f32_bytes(&[1.0, 2.0])],
        },
        Time::ZERO,
    );
    assert!(events(&mut e).is_empty());
    assert!(e.aborted(GroupId::WORLD).is_none());
}

#[test]
fn messages_for_groups_not_yet_created_are_bounded_per_peer() {
    // A hostile (or runaway) peer sends messages for thousands of groups this rank has not
    // created: at most `ORPHANS_PER_PEER` are kept; the rest are dropped (a conforming peer
    // stays far below: a window of calls per group it shares with this rank).
    let mut b = engine(1);
    for g in 0..10_000u64 {
        let gid = GroupId::derive(GroupId::WORLD, g, &[0, 1]);
        let fp = Fingerprint {
            count: Some(1),
            op: Some(ReduceOp::Sum.kind()),
            algorithm: Some(Algorithm::RecursiveDoubling),
            ..Fingerprint::new(collectix_runtime::OpKind::AllReduce, DType::F32)
        };
        let header = Header::Data {
            group: gid,
            seq: 0,
            call: fp,
            tag: 0,
        };
        b.handle_message(
            Message {
                src: 0,
                header,
                payload: vec![f32_bytes(&[1.0])],
            },
            Time::ZERO,
        );
    }
    assert!(
        b.orphaned() <= collectix_runtime::engine::ORPHANS_PER_PEER,
        "{} kept",
        b.orphaned()
    );
    assert!(b.orphaned() > 0);
}

#[test]
fn a_reduce_step_in_a_call_without_an_op_is_an_internal_error_not_a_sum() {
    // The engine used to reduce with Sum when a plan had no op.
    use collectix_runtime::schedule::{Action, Layout, RecvOp, Schedule};
    let mut s = Schedule::new(Layout::blocks(&[1]));
    s.step(
        Vec::new(),
        vec![RecvOp {
            peer: 0,
            tag: 1,
            chunks: 0..1,
            action: Action::Reduce {
                remote_first: false,
            },
        }],
    );
    let fp = Fingerprint {
        count: Some(1),
        ..Fingerprint::new(collectix_runtime::OpKind::AllReduce, DType::F32)
    };
    let plan = Plan::from_schedule(
        fp,
        s,
        vec![Some(f32_bytes(&[1.0]))],
        Duration::from_secs(1),
        W,
    );
    let mut e = engine(1);
    let id = e.submit(GroupId::WORLD, 0, plan, Time::ZERO);
    e.handle_message(
        Message {
            src: 0,
            header: Header::Data {
                group: GroupId::WORLD,
                seq: 0,
                tag: 1,
                call: fp,
            },
            payload: vec![f32_bytes(&[2.0])],
        },
        Time::ZERO,
    );
    let ev = events(&mut e);
    assert_eq!(ev.len(), 1);
    assert_eq!(ev[0].op, id);
    match &ev[0].result {
        Err(e) => assert!(e.to_string().contains("internal"), "{e}"),
        Ok(out) => panic!("reduced without an op: {out:?}"),
    }
}

/// The host plane, counting the reductions and joins it is asked for.
struct Counting {
    host: HostPlane,
    combines: Arc<AtomicUsize>,
    joins: Arc<AtomicUsize>,
}

impl DataPlane for Counting {
    fn combine(
        &self,
        dtype: DType,
        op: ReduceOp,
        a: &[u8],
        b: &[u8],
    ) -> collectix_runtime::Result<Bytes> {
        self.combines.fetch_add(1, Ordering::Relaxed);
        self.host.combine(dtype, op, a, b)
    }
    fn join(&self, dtype: DType, parts: &[&Bytes]) -> collectix_runtime::Result<Bytes> {
        self.joins.fetch_add(1, Ordering::Relaxed);
        self.host.join(dtype, parts)
    }
}

/// W engines of the world group on counting planes (`pool` bytes kept free each), and the
/// counters of reductions and joins they share.
fn counting_engines(pool: usize) -> (Vec<Engine>, Arc<AtomicUsize>, Arc<AtomicUsize>) {
    let (combines, joins) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let engines = (0..W)
        .map(|r| {
            let plane = Counting {
                host: HostPlane::new(pool),
                combines: combines.clone(),
                joins: joins.clone(),
            };
            let mut e = Engine::with_data_plane(r, Box::new(plane));
            let info = GroupInfo::world(W, r, GroupOptions::default())
                .unwrap_or_else(|err| panic!("{err}"));
            e.add_group(info, Time::ZERO);
            e
        })
        .collect();
    (engines, combines, joins)
}

#[test]
fn reductions_and_joins_go_through_the_engines_data_plane() {
    let (mut engines, calls, _) = counting_engines(1 << 20);
    let ids: Vec<_> = (0..W)
        .map(|r| {
            let p = all_reduce(r, vec![r as f32 + 1.0, 10.0]);
            engines[r].submit(GroupId::WORLD, 0, p, Time::ZERO)
        })
        .collect();
    // Shuttle messages until none is left.
    loop {
        let mut moved = false;
        for r in 0..W {
            while let Some(t) = engines[r].poll_transmit() {
                moved = true;
                engines[t.dst].handle_message(t.msg, Time::ZERO);
            }
        }
        if !moved {
            break;
        }
    }
    for (r, id) in ids.into_iter().enumerate() {
        let ev = events(&mut engines[r]);
        assert_eq!(ev.len(), 1, "rank {r}");
        assert_eq!(ev[0].op, id);
        let want: f32 = (1..=W).map(|k| k as f32).sum();
        assert_eq!(
            ev[0].result,
            Ok(Output::Tensor(Tensor::from_vec(vec![
                want,
                10.0 * W as f32
            ])))
        );
    }
    assert!(
        calls.load(Ordering::Relaxed) >= W,
        "the plane reduced nothing"
    );
}

#[test]
fn a_replayed_point_to_point_message_is_a_protocol_error() {
    let mut e = engine(1);
    let msg = |seq| Message {
        src: 0,
        header: Header::P2p {
            group: GroupId::WORLD,
            tag: 3,
            seq,
            dtype: DType::F32,
            count: 1,
            eager: true,
            path: collectix_runtime::DataPath::Engine,
        },
        payload: vec![f32_bytes(&[1.0])],
    };
    e.handle_message(msg(0), Time::ZERO);
    assert_eq!(e.p2p_buffered(), 1);
    // The same message again: not stored twice, not counted twice against the window.
    e.handle_message(msg(0), Time::ZERO);
    assert!(matches!(
        e.aborted(GroupId::WORLD),
        Some(Error::Protocol {
            rank: 0,
            detail: ProtocolError::Duplicate { seq: 0, tag: 3 }
        })
    ));
}

/// Rank 0 of three makes a ring all_reduce (its first step waits for rank 2) with a 1 s
/// timeout, and at the deadline asks the others which call they are in; ranks 1 and 2 answer
/// with `answers` (made, latest, time in the call). Returns rank 0's verdict.
#[allow(clippy::type_complexity)]
fn ring_of_three_verdict(
    answers: impl Fn(
        Fingerprint,
    ) -> [(
        Option<Fingerprint>,
        Option<(u64, Fingerprint)>,
        Option<Duration>,
    ); 2],
) -> Error {
    let info = GroupInfo::world(3, 0, GroupOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    let mut e = Engine::new(0);
    e.add_group(info.clone(), Time::ZERO);
    let opts = CallOptions {
        algorithm: Some(Algorithm::Ring),
        timeout: Some(Duration::from_secs(1)),
    };
    let req = Request::AllReduce {
        tensor: Tensor::from_vec(vec![1.0f32; 3]),
        op: ReduceOp::Sum,
    };
    let plan = Plan::new(req, &info, &opts).unwrap_or_else(|e| panic!("{e}"));
    let fp = plan.fingerprint();
    let id = e.submit(GroupId::WORLD, 0, plan, Time::ZERO);
    while e.poll_transmit().is_some() {}
    let at = Time::ZERO + Duration::from_secs(1);
    e.handle_timeout(at);
    while e.poll_transmit().is_some() {}
    for (src, (made, latest, in_call_for)) in [1, 2].into_iter().zip(answers(fp)) {
        e.handle_message(
            Message {
                src,
                header: Header::Status {
                    group: GroupId::WORLD,
                    seq: 0,
                    made: made.map(Box::new),
                    latest: latest.map(Box::new),
                    in_call_for: in_call_for.map(|d| d.as_nanos() as u64),
                    elsewhere: false,
                },
                payload: Vec::new(),
            },
            at,
        );
    }
    let ev = events(&mut e);
    assert_eq!(ev[0].op, id);
    match &ev[0].result {
        Err(err) => err.clone(),
        Ok(_) => panic!("the call cannot succeed"),
    }
}

#[test]
fn a_rank_past_the_call_is_never_named_as_behind_even_if_it_forgot_the_call() {
    // At the timeout, rank 2 says it is in the call; rank 1's fingerprint of call 0 is
    // forgotten (it finished long ago) but its latest call is #5, so it has made call 0 too.
    // Nobody is behind: the timeout names whose messages the step waits for (rank 2), never
    // rank 1.
    let later = Fingerprint::new(collectix_runtime::OpKind::Barrier, DType::U8);
    let err = ring_of_three_verdict(|fp| {
        [
            (None, Some((5, later)), None),
            (Some(fp), Some((0, fp)), Some(Duration::from_secs(1))),
        ]
    });
    assert!(
        matches!(&err, Error::Timeout { waiting_for, .. } if waiting_for == &vec![2]),
        "{err:?}"
    );
}

/// Every rank is in the call, but rank 1 made it only 10 ms before it answered, at the end
/// of rank 0's 1 s wait: it came late, and the timeout names it, not rank 2, whose messages
/// the ring's step waits for. (Seen in the fault matrix: a rank whose call on another group
/// had timed out made this one just before the inquiry reached it, and the report named a
/// ring neighbour that was waiting too.)
#[test]
fn a_timeout_names_a_rank_that_made_the_call_late() {
    let err = ring_of_three_verdict(|fp| {
        [
            (Some(fp), Some((0, fp)), Some(Duration::from_millis(10))),
            (Some(fp), Some((0, fp)), Some(Duration::from_secs(1))),
        ]
    });
    match &err {
        Error::Timeout {
            rank: 0,
            waiting_for,
            report,
            ..
        } => {
            assert_eq!(waiting_for, &vec![1]);
            assert!(
                matches!(&report[..], [collectix_runtime::RankCall::Late { rank: 1, after, .. }, collectix_runtime::RankCall::Made { rank: 2, .. }] if *after == Duration::from_millis(990)),
                "{report:?}"
            );
            assert!(err.to_string().contains("rank 1 is in all_reduce"), "{err}");
            assert!(
                err.to_string()
                    .contains("which it made at least 990 ms later"),
                "{err}"
            );
        }
        other => panic!("{other:?}"),
    }
}

/// A rank that had been in the call for half of the asker's wait or more is not late.
#[test]
fn a_rank_in_the_call_for_half_the_wait_is_not_late() {
    let err = ring_of_three_verdict(|fp| {
        [
            (Some(fp), Some((0, fp)), Some(Duration::from_millis(500))),
            (Some(fp), Some((0, fp)), Some(Duration::from_secs(1))),
        ]
    });
    assert!(
        matches!(&err, Error::Timeout { waiting_for, report, .. } if waiting_for == &vec![2] && matches!(&report[..], [collectix_runtime::RankCall::Made { rank: 1, .. }, _])),
        "{err:?}"
    );
}

/// An engine of rank 1 of 2 with a byte budget of 64 (window 16: eager limit 4 bytes).
fn budgeted() -> Engine {
    let opts = GroupOptions {
        peer_budget_bytes: 64,
        ..GroupOptions::default()
    };
    let mut e = Engine::new(1);
    e.add_group(
        GroupInfo::world(W, 1, opts).unwrap_or_else(|e| panic!("{e}")),
        Time::ZERO,
    );
    e
}

#[test]
fn bytes_sent_ahead_beyond_the_budget_are_a_protocol_error() {
    let mut e = budgeted();
    let fp = all_reduce(0, vec![1.0; 10]).fingerprint();
    let msg = |seq| Message {
        src: 0,
        header: data(seq, 0)(fp),
        payload: vec![Bytes::from(vec![0u8; 40])],
    };
    // Calls 0 and 1 not made here: 40 bytes are within 64, 80 are not.
    e.handle_message(msg(0), Time::ZERO);
    assert_eq!((e.buffered(), e.buffered_bytes()), (1, 40));
    assert!(e.aborted(GroupId::WORLD).is_none());
    e.handle_message(msg(1), Time::ZERO);
    match e.aborted(GroupId::WORLD) {
        Some(Error::Protocol {
            rank: 0,
            detail:
                ProtocolError::Budget {
                    seq: 1,
                    bytes: 80,
                    budget: 64,
                },
        }) => {}
        other => panic!("{other:?}"),
    }
}

#[test]
fn an_eager_message_above_the_eager_limit_is_a_protocol_error() {
    let mut e = budgeted();
    let msg = |bytes: usize| Message {
        src: 0,
        header: Header::P2p {
            group: GroupId::WORLD,
            tag: 3,
            seq: 0,
            dtype: DType::U8,
            count: bytes as u64,
            eager: true,
            path: collectix_runtime::DataPath::Engine,
        },
        payload: vec![Bytes::from(vec![0u8; bytes])],
    };
    e.handle_message(msg(5), Time::ZERO);
    match e.aborted(GroupId::WORLD) {
        Some(Error::Protocol {
            rank: 0,
            detail:
                ProtocolError::Budget {
                    bytes: 5,
                    budget: 4,
                    ..
                },
        }) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(e.p2p_buffered(), 0);
}

#[test]
fn bytes_for_groups_not_yet_created_are_bounded_per_peer() {
    // 40 messages of 8 MiB for groups this rank has not created: 32 fit in
    // ORPHAN_BYTES_PER_PEER (256 MiB), the rest are dropped; creating one of the groups
    // adopts its message and frees its share, so another can be kept again.
    use collectix_runtime::engine::ORPHAN_BYTES_PER_PEER;
    let mut b = engine(1);
    let chunk = Bytes::from(vec![0u8; 8 << 20]);
    let gid = |g: u64| GroupId::derive(GroupId::WORLD, g, &[0, 1]);
    let send = |b: &mut Engine, g: u64| {
        let header = Header::Data {
            group: gid(g),
            seq: 0,
            call: all_reduce(0, vec![1.0]).fingerprint(),
            tag: 0,
        };
        b.handle_message(
            Message {
                src: 0,
                header,
                payload: vec![chunk.clone()],
            },
            Time::ZERO,
        );
    };
    for g in 0..40 {
        send(&mut b, g);
    }
    assert_eq!(b.orphaned() as u64, ORPHAN_BYTES_PER_PEER / (8 << 20));
    let info = GroupInfo::new(gid(0), vec![0, 1], 1, GroupOptions::default())
        .unwrap_or_else(|e| panic!("{e}"));
    b.add_group(info, Time::ZERO);
    assert_eq!(b.buffered(), 1, "adopted by the new group");
    send(&mut b, 100);
    assert_eq!(b.orphaned() as u64, ORPHAN_BYTES_PER_PEER / (8 << 20));
}

/// A call that completes in the run that also sends its peer's data does not assemble its
/// output (the join, a full copy for a large tensor) before that data can leave: the output
/// is built when the event is polled, after the transmits. Before, rank 1 of a 2-rank
/// all_to_all joined 64 MiB inside `submit`, and rank 0 waited that long for its message.
#[test]
fn an_output_is_joined_when_its_event_is_polled_after_the_transmits() {
    let (mut engines, _, joins) = counting_engines(0);
    let req = |r: usize| Request::AllToAllSingle {
        input: Tensor::from_vec(vec![r as f32; 8]),
        output: collectix_runtime::TensorSpec::new(&[8], DType::F32),
        output_splits: None,
        input_splits: None,
    };
    let info = GroupInfo::world(W, 0, GroupOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    let p0 = Plan::new(req(0), &info, &CallOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    let id0 = engines[0].submit(GroupId::WORLD, 0, p0, Time::ZERO);
    while let Some(t) = engines[0].poll_transmit() {
        engines[1].handle_message(t.msg, Time::ZERO);
    }
    // Rank 1's call completes inside its submit: rank 0's block is already there.
    let info = GroupInfo::world(W, 1, GroupOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    let p1 = Plan::new(req(1), &info, &CallOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    let id1 = engines[1].submit(GroupId::WORLD, 0, p1, Time::ZERO);
    assert_eq!(
        joins.load(Ordering::Relaxed),
        0,
        "joined before its data left"
    );
    let out: Vec<_> = std::iter::from_fn(|| engines[1].poll_transmit()).collect();
    assert!(!out.is_empty(), "rank 1's block for rank 0 is ready to go");
    assert_eq!(joins.load(Ordering::Relaxed), 0);
    let ev = events(&mut engines[1]);
    assert_eq!(joins.load(Ordering::Relaxed), 1, "joined when polled");
    assert_eq!(ev.len(), 1);
    assert_eq!(ev[0].op, id1);
    let want = [0.0f32, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0];
    assert_eq!(
        ev[0].result,
        Ok(Output::Tensor(Tensor::from_vec(want.to_vec())))
    );
    for t in out {
        engines[0].handle_message(t.msg, Time::ZERO);
    }
    let ev = events(&mut engines[0]);
    assert_eq!(ev.len(), 1);
    assert_eq!(ev[0].op, id0);
    assert_eq!(
        ev[0].result,
        Ok(Output::Tensor(Tensor::from_vec(want.to_vec())))
    );
}

/// A call whose received values are ready when it posts its own sends reduces only after
/// those sends have been taken (`poll_transmit` runs the held reduction once its queue is
/// empty): a peer waiting for this rank's data does not wait for this rank's reduction too.
#[test]
fn a_reduction_waits_until_the_messages_queued_before_it_are_taken() {
    let (mut engines, reductions, _) = counting_engines(0);
    let id0 = engines[0].submit(GroupId::WORLD, 0, all_reduce(0, vec![1.0, 2.0]), Time::ZERO);
    while let Some(t) = engines[0].poll_transmit() {
        engines[1].handle_message(t.msg, Time::ZERO);
    }
    let id1 = engines[1].submit(GroupId::WORLD, 0, all_reduce(1, vec![3.0, 4.0]), Time::ZERO);
    assert_eq!(
        reductions.load(Ordering::Relaxed),
        0,
        "reduced before its data left"
    );
    let first = engines[1].poll_transmit();
    assert!(first.is_some(), "rank 1's data for rank 0 is ready to go");
    assert_eq!(reductions.load(Ordering::Relaxed), 0);
    let mut out: Vec<_> = first.into_iter().collect();
    out.extend(std::iter::from_fn(|| engines[1].poll_transmit()));
    assert_eq!(
        reductions.load(Ordering::Relaxed),
        1,
        "reduced once the queue was empty"
    );
    let want = Output::Tensor(Tensor::from_vec(vec![4.0f32, 6.0]));
    let ev = events(&mut engines[1]);
    assert_eq!((ev.len(), ev[0].op), (1, id1));
    assert_eq!(ev[0].result, Ok(want.clone()));
    for t in out {
        engines[0].handle_message(t.msg, Time::ZERO);
    }
    let ev = events(&mut engines[0]);
    assert_eq!((ev.len(), ev[0].op), (1, id0));
    assert_eq!(ev[0].result, Ok(want));
}

/// Runs `plans` (one per rank of a world of `W`) to the end, every message passing through
/// what a transport's reader does: it asks the receiver's landings where the parts go, and
/// reads them there if they land. The outputs, and the messages that landed per rank.
fn run_landing(plans: Vec<Plan>) -> (Vec<Output>, Vec<u64>) {
    let mut es: Vec<Engine> = (0..W).map(engine).collect();
    let ids: Vec<_> = plans
        .into_iter()
        .enumerate()
        .map(|(r, p)| es[r].submit(GroupId::WORLD, 0, p, Time::ZERO))
        .collect();
    let mut outs: Vec<Option<Output>> = vec![None; W];
    for _ in 0..10_000 {
        let mut moved = false;
        for r in 0..W {
            while let Some(t) = es[r].poll_transmit() {
                moved = true;
                let lens: Vec<usize> = t.msg.payload.iter().map(|p| p.len()).collect();
                let mut msg = t.msg;
                if let Some(parts) = es[t.dst].landings().place(r, &msg.header, &lens) {
                    msg.payload = parts
                        .into_iter()
                        .zip(&msg.payload)
                        .map(|(mut at, p)| {
                            at.bytes_mut().copy_from_slice(p);
                            at.freeze()
                        })
                        .collect();
                }
                es[t.dst].handle_message(msg, Time::ZERO);
            }
            for ev in events(&mut es[r]) {
                assert_eq!(ev.op, ids[r]);
                outs[r] = Some(ev.result.unwrap_or_else(|e| panic!("rank {r}: {e}")));
            }
        }
        if !moved && outs.iter().all(Option::is_some) {
            break;
        }
    }
    for (r, e) in es.iter().enumerate() {
        assert!(
            e.landings().is_empty(),
            "rank {r}: the call's landings dropped"
        );
    }
    let landed = es.iter().map(|e| e.landings().placed()).collect();
    let outs = outs
        .into_iter()
        .enumerate()
        .map(|(r, o)| o.unwrap_or_else(|| panic!("rank {r} never finished")))
        .collect();
    (outs, landed)
}

fn tensor_of(o: &Output) -> &Tensor {
    match o {
        Output::Tensor(t) => t,
        other => panic!("not one tensor: {other:?}"),
    }
}

#[test]
fn received_chunks_land_in_the_output_and_the_rest_is_copied_in() {
    let n = 100_000; // 400 KB of f32: outputs that land.
    let input = |r: usize| {
        (0..n)
            .map(|i| (i % 1000) as f32 + r as f32)
            .collect::<Vec<f32>>()
    };
    // A ring all_reduce: its last steps copy received chunks into the output (they land),
    // while the chunk this rank reduces last is its own (copied in).
    let plans = (0..W)
        .map(|r| {
            let info =
                GroupInfo::world(W, r, GroupOptions::default()).unwrap_or_else(|e| panic!("{e}"));
            let opts = CallOptions {
                algorithm: Some(Algorithm::Ring),
                timeout: Some(Duration::from_secs(1)),
            };
            let req = Request::AllReduce {
                tensor: Tensor::from_vec(input(r)),
                op: ReduceOp::Sum,
            };
            Plan::new(req, &info, &opts).unwrap_or_else(|e| panic!("{e}"))
        })
        .collect();
    let (outs, landed) = run_landing(plans);
    let want: Vec<f32> = (0..n).map(|i| 2.0 * (i % 1000) as f32 + 1.0).collect();
    for (r, o) in outs.iter().enumerate() {
        assert_eq!(
            tensor_of(o).to_vec::<f32>().ok(),
            Some(want.clone()),
            "rank {r}"
        );
    }
    assert!(landed.iter().all(|&l| l > 0), "landed: {landed:?}");

    // A broadcast: the non-root's output is the buffer its one message landed in.
    let plans = (0..W)
        .map(|r| {
            let t = if r == 0 {
                Tensor::from_vec(input(7))
            } else {
                Tensor::zeros(&[n], DType::F32).unwrap_or_else(|e| panic!("{e}"))
            };
            let info =
                GroupInfo::world(W, r, GroupOptions::default()).unwrap_or_else(|e| panic!("{e}"));
            let req = Request::Broadcast { tensor: t, root: 0 };
            Plan::new(req, &info, &CallOptions::default()).unwrap_or_else(|e| panic!("{e}"))
        })
        .collect();
    let (outs, landed) = run_landing(plans);
    for (r, o) in outs.iter().enumerate() {
        assert_eq!(
            tensor_of(o).to_vec::<f32>().ok(),
            Some(input(7)),
            "rank {r}"
        );
    }
    assert_eq!(landed, vec![0, 1]);
}

#[test]
fn small_outputs_and_unexpected_messages_do_not_land() {
    // 2 f32s: below the size where a buffer of its own pays.
    let plans = (0..W).map(|r| all_reduce(r, vec![1.0, 2.0])).collect();
    let (outs, landed) = run_landing(plans);
    assert_eq!(landed, vec![0, 0]);
    for o in &outs {
        assert_eq!(tensor_of(o).to_vec::<f32>().ok(), Some(vec![2.0, 4.0]));
    }
}
