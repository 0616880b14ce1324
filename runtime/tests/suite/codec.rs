//! The wire codec: every message kind round-trips; arbitrary bytes, truncations and bit flips
//! of valid frames decode to a frame, "need more bytes" or a typed error, never a panic; and
//! no length from the wire makes the decoder allocate beyond its limits.

use bytes::{Bytes, BytesMut};
use collectix_runtime::error::{CallDesc, ProtocolError, RankCall, Wait};
use collectix_runtime::wire::codec::HEARTBEAT;
use collectix_runtime::wire::{
    decode, encode, encode_head, AbortReason, DecodeError, Header, Limits, Message,
};
use collectix_runtime::{Algorithm, DType, DataPath, Fingerprint, GroupId, OpKind, ReduceKind};
use proptest::prelude::*;

/// The frame format's magic and version, then `rest`.
fn this_version(rest: &[u8]) -> Vec<u8> {
    let mut b = collectix_runtime::wire::codec::MAGIC.to_vec();
    b.push(collectix_runtime::wire::codec::VERSION);
    b.extend_from_slice(rest);
    b
}

fn fingerprint() -> impl Strategy<Value = Fingerprint> {
    (
        0usize..15,
        0usize..DType::ALL.len(),
        proptest::option::of(any::<u64>()),
        proptest::option::of(any::<u32>()),
        proptest::option::of(1u8..=9),
        any::<u64>(),
        proptest::option::of(0usize..Algorithm::ALL.len()),
        any::<bool>(),
    )
        .prop_map(|(k, d, count, root, op, scalar, alg, nccl)| Fingerprint {
            kind: OpKind::try_from(k as u8 + 1).unwrap_or(OpKind::Barrier),
            dtype: DType::ALL[d],
            count,
            root,
            op: op.and_then(|c| ReduceKind::try_from(c).ok()),
            scalar,
            algorithm: alg.map(|a| Algorithm::ALL[a]),
            path: if nccl {
                DataPath::Nccl
            } else {
                DataPath::Engine
            },
        })
}

fn protocol_error() -> impl Strategy<Value = ProtocolError> {
    prop_oneof![
        (any::<u64>(), any::<u32>())
            .prop_map(|(seq, tag)| ProtocolError::UnexpectedTag { seq, tag }),
        (any::<u64>(), any::<u32>()).prop_map(|(seq, tag)| ProtocolError::Duplicate { seq, tag }),
        (any::<u32>(), any::<u64>(), any::<u64>()).prop_map(|(part, expected, got)| {
            ProtocolError::Length {
                part: part as usize,
                expected,
                got,
            }
        }),
        (any::<u32>(), any::<u32>()).prop_map(|(e, g)| ProtocolError::Parts {
            expected: e as usize,
            got: g as usize
        }),
        (0usize..DType::ALL.len()).prop_map(|d| ProtocolError::InvalidElements {
            dtype: DType::ALL[d]
        }),
        any::<u64>().prop_map(|seq| ProtocolError::Stale { seq }),
        any::<u64>().prop_map(|seq| ProtocolError::Window { seq }),
        ".{0,40}".prop_map(ProtocolError::Malformed),
        (any::<u64>(), any::<u64>(), any::<u64>())
            .prop_map(|(seq, bytes, budget)| { ProtocolError::Budget { seq, bytes, budget } }),
    ]
}

fn report() -> impl Strategy<Value = Vec<RankCall>> {
    let line = prop_oneof![
        (any::<u32>(), fingerprint()).prop_map(|(r, call)| RankCall::Made {
            rank: r as usize,
            call
        }),
        (any::<u32>(), fingerprint(), any::<u64>()).prop_map(|(r, call, nanos)| {
            RankCall::Late {
                rank: r as usize,
                call,
                after: std::time::Duration::from_nanos(nanos),
            }
        }),
        (
            any::<u32>(),
            proptest::option::of((any::<u64>(), fingerprint()))
        )
            .prop_map(|(r, latest)| RankCall::NotReached {
                rank: r as usize,
                latest
            }),
        any::<u32>().prop_map(|r| RankCall::NoAnswer { rank: r as usize }),
    ];
    proptest::collection::vec(line, 0..5)
}

fn wait() -> impl Strategy<Value = Wait> {
    (
        any::<u32>(),
        any::<u64>(),
        any::<u64>(),
        0u8..15,
        any::<u32>(),
        any::<bool>(),
    )
        .prop_map(|(rank, group, seq, k, peer, reached)| Wait {
            rank: rank as usize,
            group: GroupId(group),
            seq,
            op: OpKind::try_from(k + 1).unwrap_or(OpKind::Barrier),
            peer: peer as usize,
            reached,
        })
}

fn reason() -> impl Strategy<Value = AbortReason> {
    let call = || {
        (any::<u32>(), fingerprint()).prop_map(|(rank, call)| CallDesc {
            rank: rank as usize,
            call,
        })
    };
    prop_oneof![
        (proptest::option::of(any::<u64>()), call(), call(), report()).prop_map(
            |(seq, ours, theirs, report)| AbortReason::Mismatch {
                seq,
                ours,
                theirs,
                report
            }
        ),
        (
            proptest::option::of(any::<u64>()),
            0u8..15,
            any::<u64>(),
            proptest::collection::vec(any::<u64>(), 0..8),
            report()
        )
            .prop_map(|(seq, k, rank, waiting_for, report)| AbortReason::Timeout {
                seq,
                op: OpKind::try_from(k + 1).unwrap_or(OpKind::Barrier),
                rank,
                waiting_for,
                report,
            }),
        any::<u64>().prop_map(|rank| AbortReason::PeerLost { rank }),
        any::<u64>().prop_map(|by| AbortReason::Revoked { by }),
        proptest::collection::vec(wait(), 0..8).prop_map(|cycle| AbortReason::WaitCycle { cycle }),
        (any::<u64>(), any::<u64>())
            .prop_map(|(rank, undelivered)| AbortReason::PeerShutdown { rank, undelivered }),
        (any::<u64>(), protocol_error())
            .prop_map(|(rank, detail)| AbortReason::Protocol { rank, detail }),
        ".{0,60}".prop_map(|text| AbortReason::Other { text }),
        ".{0,60}".prop_map(|text| AbortReason::Internal { text }),
        (any::<u64>(), fingerprint(), any::<[u64; 4]>()).prop_map(|(seq, call, v)| {
            AbortReason::SizeMismatch {
                seq,
                call,
                sender: v[0],
                receiver: v[1],
                expected: v[2],
                got: v[3],
            }
        }),
    ]
}

fn header() -> impl Strategy<Value = Header> {
    let g = || any::<u64>().prop_map(GroupId);
    prop_oneof![
        (g(), any::<u64>(), any::<u32>(), fingerprint()).prop_map(|(group, seq, tag, call)| {
            Header::Data {
                group,
                seq,
                tag,
                call,
            }
        }),
        (
            g(),
            any::<u32>(),
            any::<u64>(),
            0usize..DType::ALL.len(),
            any::<u64>(),
            any::<bool>(),
            any::<bool>()
        )
            .prop_map(|(group, tag, seq, d, count, eager, nccl)| Header::P2p {
                group,
                tag,
                seq,
                dtype: DType::ALL[d],
                count,
                eager,
                path: if nccl {
                    collectix_runtime::DataPath::Nccl
                } else {
                    collectix_runtime::DataPath::Engine
                },
            }),
        (g(), any::<u64>()).prop_map(|(group, calls)| Header::Credit { group, calls }),
        (g(), any::<u64>()).prop_map(|(group, seq)| Header::WantCredit { group, seq }),
        (g(), any::<u32>(), any::<u64>()).prop_map(|(group, tag, upto)| Header::P2pGrant {
            group,
            tag,
            upto
        }),
        (g(), any::<u32>(), any::<u64>()).prop_map(|(group, tag, seq)| Header::P2pAsk {
            group,
            tag,
            seq
        }),
        (g(), any::<u64>()).prop_map(|(group, eager)| Header::P2pConsumed { group, eager }),
        (g(), reason()).prop_map(|(group, reason)| Header::Abort {
            group,
            reason: Box::new(reason)
        }),
        (g(), any::<u64>()).prop_map(|(group, seq)| Header::Inquire { group, seq }),
        (g(), any::<u64>()).prop_map(|(group, calls)| Header::Left { group, calls }),
        (g(), any::<u64>(), "\\PC{0,64}").prop_map(|(group, seq, reason)| Header::Failed {
            group,
            seq,
            reason
        }),
        (
            g(),
            any::<u64>(),
            proptest::option::of(fingerprint()),
            proptest::option::of((any::<u64>(), fingerprint())),
            proptest::option::of(any::<u64>()),
            any::<bool>()
        )
            .prop_map(|(group, seq, made, latest, in_call_for, elsewhere)| {
                Header::Status {
                    group,
                    seq,
                    made: made.map(Box::new),
                    latest: latest.map(Box::new),
                    in_call_for,
                    elsewhere,
                }
            }),
        (g(), proptest::collection::vec(wait(), 0..8)).prop_map(|(group, path)| {
            Header::Probe {
                group,
                path: Box::new(path),
            }
        }),
    ]
}

fn message() -> impl Strategy<Value = Message> {
    (
        header(),
        proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 0..5),
    )
        .prop_map(|(header, parts)| Message {
            src: 0,
            header,
            payload: parts.into_iter().map(Bytes::from).collect(),
        })
}

/// Decodes every frame in `bytes`; stops at the first error or when more bytes are needed.
/// Inputs per property: `COLLECTIX_FUZZ_CASES` (default 2 000; long runs in
/// `docs/testing.md`).
fn cases() -> u32 {
    std::env::var("COLLECTIX_FUZZ_CASES")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(2_000)
}

fn decode_all(bytes: &[u8]) -> Result<usize, DecodeError> {
    let mut buf = BytesMut::from(bytes);
    let limits = Limits {
        max_parts: 64,
        max_payload_bytes: 1 << 20,
    };
    let mut n = 0;
    while decode(&mut buf, &limits)?.is_some() {
        n += 1;
    }
    Ok(n)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn every_message_round_trips(msg in message(), src in 0usize..64) {
        let frame = encode(&msg);
        let mut buf = frame.to_contiguous();
        // A second frame behind it: decoding takes exactly one.
        buf.extend_from_slice(&encode(&msg).to_contiguous());
        let got = decode(&mut buf, &Limits::default()).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let got = got.ok_or_else(|| TestCaseError::fail("incomplete"))?.into_message(src);
        prop_assert_eq!(&got.header, &msg.header);
        prop_assert_eq!(&got.payload, &msg.payload);
        prop_assert_eq!(got.src, src);
        prop_assert_eq!(buf.len(), frame.len());
    }

    #[test]
    fn a_head_encoded_into_a_reused_buffer_is_the_frames_head(
        msgs in proptest::collection::vec(message(), 1..4),
    ) {
        // One buffer for every frame, as the TCP writer keeps it; here never cleared, so
        // each head starts where the last ended.
        let mut head = BytesMut::new();
        for msg in &msgs {
            let before = head.len();
            encode_head(msg, &mut head);
            prop_assert_eq!(&head[before..], &encode(msg).head[..]);
        }
    }

    #[test]
    fn heartbeats_between_frames_are_skipped_and_change_nothing(
        msgs in proptest::collection::vec(message(), 1..5),
        beats in proptest::collection::vec(0usize..3, 6),
    ) {
        let mut buf = BytesMut::new();
        for (i, msg) in msgs.iter().enumerate() {
            for _ in 0..beats[i] {
                buf.extend_from_slice(&HEARTBEAT);
            }
            buf.extend_from_slice(&encode(msg).to_contiguous());
        }
        for _ in 0..beats[5] {
            buf.extend_from_slice(&HEARTBEAT);
        }
        for msg in &msgs {
            let got = decode(&mut buf, &Limits::default()).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let got = got.ok_or_else(|| TestCaseError::fail("incomplete"))?;
            prop_assert_eq!(&got.header, &msg.header);
            prop_assert_eq!(&got.payload, &msg.payload);
        }
        // Trailing heartbeats are taken off; nothing is left, and nothing is returned.
        prop_assert!(matches!(decode(&mut buf, &Limits::default()), Ok(None)));
        prop_assert!(buf.is_empty());
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = decode_all(&bytes);
    }

    #[test]
    fn arbitrary_bytes_after_a_valid_prefix_never_panic(
        kind in 1u8..=14,
        header_len in 0u32..200,
        parts in 0u32..4,
        rest in proptest::collection::vec(any::<u8>(), 0..300),
    ) {
        let mut b = this_version(b"");
        b.push(kind);
        b.extend_from_slice(&header_len.to_le_bytes());
        b.extend_from_slice(&parts.to_le_bytes());
        b.extend_from_slice(&rest);
        let _ = decode_all(&b);
    }

    #[test]
    fn truncated_frames_ask_for_more_and_never_panic(msg in message(), cut in any::<prop::sample::Index>()) {
        let full = encode(&msg).to_contiguous();
        let n = cut.index(full.len());
        let mut buf = BytesMut::from(&full[..n]);
        let r = decode(&mut buf, &Limits::default());
        prop_assert!(matches!(r, Ok(None)), "{n} of {} bytes: {r:?}", full.len());
        prop_assert_eq!(buf.len(), n, "an incomplete frame leaves the buffer untouched");
    }

    #[test]
    fn flipped_bits_never_panic(msg in message(), at in any::<prop::sample::Index>(), bit in 0u8..8) {
        let mut full = encode(&msg).to_contiguous();
        let i = at.index(full.len());
        full[i] ^= 1 << bit;
        let _ = decode_all(&full);
    }
}

#[test]
fn a_heartbeat_with_a_header_or_a_payload_is_an_error() {
    let mut with_part = HEARTBEAT.to_vec();
    with_part[8] = 1;
    with_part.extend_from_slice(&[0u8; 9]);
    assert!(matches!(
        decode_all(&with_part),
        Err(DecodeError::TooLarge { .. })
    ));
    let mut with_header = HEARTBEAT.to_vec();
    with_header[4] = 2;
    with_header.extend_from_slice(&[0u8; 2]);
    assert_eq!(decode_all(&with_header), Err(DecodeError::Trailing(2)));
    assert_eq!(decode_all(&HEARTBEAT), Ok(0));
}

#[test]
fn lengths_beyond_the_limits_are_refused_before_allocating() {
    let limits = Limits {
        max_parts: 4,
        max_payload_bytes: 1 << 10,
    };
    // 2^32 - 1 parts.
    let mut b = BytesMut::from(&this_version(b"\x01\x00\x00\x00\x00\xff\xff\xff\xff")[..]);
    assert!(matches!(
        decode(&mut b, &limits),
        Err(DecodeError::TooLarge {
            what: "payload part count",
            ..
        })
    ));
    // One part of 2^62 bytes.
    let mut b = BytesMut::from(&this_version(b"\x01\x00\x00\x00\x00\x01\x00\x00\x00")[..]);
    b.extend_from_slice(&(1u64 << 62).to_le_bytes());
    assert!(matches!(
        decode(&mut b, &limits),
        Err(DecodeError::TooLarge {
            what: "payload length",
            ..
        })
    ));
    // A header of 4 GiB.
    let mut b = BytesMut::from(&this_version(b"\x01\xff\xff\xff\xff\x00\x00\x00\x00")[..]);
    assert!(matches!(
        decode(&mut b, &limits),
        Err(DecodeError::TooLarge {
            what: "header length",
            ..
        })
    ));
    // Wrong magic, version, kind.
    for (bytes, want) in [
        (&b"XX\x01\x01"[..], "magic"),
        (
            &b"CX\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00"[..],
            "version",
        ),
        (
            &this_version(b"\x0f\x00\x00\x00\x00\x00\x00\x00\x00")[..],
            "kind",
        ),
    ] {
        let mut b = BytesMut::from(bytes);
        let e = decode(&mut b, &limits).err();
        assert!(
            e.as_ref().is_some_and(|e| e.to_string().contains(want)),
            "{want}: {e:?}"
        );
    }
}

#[test]
fn a_header_with_trailing_bytes_or_a_bad_code_is_an_error() {
    let msg = Message {
        src: 0,
        header: Header::Credit {
            group: GroupId(1),
            calls: 2,
        },
        payload: Vec::new(),
    };
    let frame = encode(&msg).to_contiguous();
    // One more header byte, declared in the header length.
    let mut b = frame.clone();
    b[4] += 1;
    b.extend_from_slice(&[0]);
    assert_eq!(
        decode(&mut b, &Limits::default()),
        Err(DecodeError::Trailing(1))
    );
    // A p2p header whose dtype code names nothing.
    let p2p = Message {
        src: 0,
        header: Header::P2p {
            group: GroupId(1),
            tag: 0,
            seq: 0,
            dtype: DType::F32,
            count: 0,
            eager: true,
            path: collectix_runtime::DataPath::Engine,
        },
        payload: Vec::new(),
    };
    let mut b = encode(&p2p).to_contiguous();
    let dtype_at = 12 + 8 + 4 + 8;
    b[dtype_at] = 0;
    assert!(matches!(
        decode(&mut b, &Limits::default()),
        Err(DecodeError::Code(_))
    ));
    // A p2p header whose data path code names nothing.
    let mut b = encode(&p2p).to_contiguous();
    let path_at = dtype_at + 1 + 8 + 1;
    b[path_at] = 9;
    assert!(matches!(
        decode(&mut b, &Limits::default()),
        Err(DecodeError::Code(_))
    ));
}

#[test]
fn a_bad_header_is_refused_before_its_payload_arrives() {
    // A p2p frame declaring 1 MiB of payload whose header names no dtype: `decode` refuses it
    // once the head is there, as `decode_head` does, instead of waiting for the payload.
    let p2p = Message {
        src: 0,
        header: Header::P2p {
            group: GroupId(1),
            tag: 0,
            seq: 0,
            dtype: DType::U8,
            count: 1 << 20,
            eager: true,
            path: collectix_runtime::DataPath::Engine,
        },
        payload: vec![Bytes::from(vec![0u8; 1 << 20])],
    };
    let full = encode(&p2p).to_contiguous();
    let head_len = full.len() - (1 << 20);
    let dtype_at = 12 + 8 + 8 + 4 + 8;
    let mut b = BytesMut::from(&full[..head_len]);
    assert!(
        b[dtype_at] != 0,
        "the dtype byte is not where this test expects it"
    );
    b[dtype_at] = 0;
    assert!(
        matches!(
            decode(&mut b, &Limits::default()),
            Err(DecodeError::Code(_))
        ),
        "a bad header waited for its payload"
    );
    // With the header intact, the same bytes are a frame still arriving.
    let mut ok = BytesMut::from(&full[..head_len]);
    assert_eq!(decode(&mut ok, &Limits::default()), Ok(None));
}
