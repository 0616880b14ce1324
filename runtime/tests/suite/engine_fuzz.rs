//! Fuzz target (proptest) for the engine's message handling: rank 1 of a world of 3, with
//! collectives and point-to-point calls in flight, is fed frames made from real traffic
//! (the seeds: what ranks 0 and 2 sent it for the same calls) with bytes flipped, cut and
//! inserted, then decoded by the codec as a transport would, in any order, from either peer,
//! with time moving on. It must end every call with a result or a typed error — never a
//! panic. Inputs: `COLLECTIX_FUZZ_CASES` (default 2 000); long runs as in `docs/testing.md`.

use bytes::BytesMut;
use collectix_runtime::group::{CallOptions, GroupId, GroupInfo, GroupOptions};
use collectix_runtime::wire::{decode, encode, Limits, Message, Transmit};
use collectix_runtime::{
    Algorithm, DType, Engine, Plan, ReduceOp, Request, Tensor, TensorSpec, Time,
};
use proptest::prelude::*;
use std::time::Duration;

const W: usize = 3;

fn cases() -> u32 {
    std::env::var("COLLECTIX_FUZZ_CASES")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(2_000)
}

fn info(rank: usize) -> GroupInfo {
    GroupInfo::world(W, rank, GroupOptions::default()).unwrap_or_else(|e| panic!("{e}"))
}

/// The calls every rank makes, in order.
fn plans(rank: usize) -> Vec<Plan> {
    let opts = |alg| CallOptions {
        algorithm: alg,
        timeout: Some(Duration::from_secs(1)),
    };
    let mut reqs: Vec<(Request, Option<Algorithm>)> = vec![
        (
            Request::AllReduce {
                tensor: Tensor::from_vec(vec![1.0f32, 2.0, 3.0]),
                op: ReduceOp::Sum,
            },
            Some(Algorithm::Ring),
        ),
        (
            Request::Broadcast {
                tensor: Tensor::from_vec(vec![rank as i64; 5]),
                root: 0,
            },
            None,
        ),
        (
            Request::AllGatherIntoTensor {
                input: Tensor::from_vec(vec![rank as u8; 3]),
                output: TensorSpec::new(&[3 * W], DType::U8),
            },
            None,
        ),
    ];
    // Point-to-point: each rank sends to the next and receives from any source.
    reqs.push((
        Request::Send {
            tensor: Tensor::from_vec(vec![rank as u16; 4]),
            dst: (rank + 1) % W,
            tag: 7,
        },
        None,
    ));
    reqs.push((
        Request::Recv {
            spec: TensorSpec::new(&[4], DType::U16),
            src: None,
            tag: 7,
        },
        None,
    ));
    reqs.into_iter()
        .map(|(r, alg)| Plan::new(r, &info(rank), &opts(alg)).unwrap_or_else(|e| panic!("{e}")))
        .collect()
}

/// Rank `r`'s group and calls, submitted (collectives numbered in order; point-to-point
/// calls outside the group's order, as the actors submit them).
fn submit_all(e: &mut Engine, r: usize) {
    e.add_group(info(r), Time::ZERO);
    let mut seq = 0;
    for p in plans(r) {
        let s = if p.is_p2p() {
            0
        } else {
            seq += 1;
            seq - 1
        };
        e.submit(GroupId::WORLD, s, p, Time::ZERO);
    }
}

/// A world of engines with every call submitted.
fn world() -> Vec<Engine> {
    (0..W)
        .map(|r| {
            let mut e = Engine::new(r);
            submit_all(&mut e, r);
            e
        })
        .collect()
}

/// The seeds: every message ranks 0 and 2 sent rank 1 in a clean run, as (source, frame).
fn seeds() -> Vec<(usize, Vec<u8>)> {
    let mut es = world();
    let mut out = Vec::new();
    loop {
        let mut moved = false;
        for r in 0..W {
            while let Some(Transmit { dst, msg }) = es[r].poll_transmit() {
                moved = true;
                if dst == 1 {
                    out.push((msg.src, encode(&msg).to_contiguous().to_vec()));
                }
                if let Some(e) = es.get_mut(dst) {
                    e.handle_message(msg, Time::ZERO);
                }
            }
            while es[r].poll_event().is_some() {}
        }
        if !moved {
            return out;
        }
    }
}

/// Flips, cuts and inserts: `edits` applied to `base`.
fn mutate(mut base: Vec<u8>, edits: &[(usize, u8, u8)]) -> Vec<u8> {
    for &(at, how, byte) in edits {
        if base.is_empty() {
            base.push(byte);
            continue;
        }
        let i = at % base.len();
        match how % 3 {
            0 => base[i] ^= byte | 1,
            1 => base.truncate(i),
            _ => base.insert(i, byte),
        }
    }
    base
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn fuzz_engine_takes_mangled_traffic(
        picks in proptest::collection::vec((any::<usize>(), any::<bool>()), 1..24),
        edits in proptest::collection::vec((any::<usize>(), any::<usize>(), any::<u8>(), any::<u8>()), 0..6),
        late in 0u64..3_000,
    ) {
        let seeds = seeds();
        prop_assume!(!seeds.is_empty());
        let mut e = Engine::new(1);
        submit_all(&mut e, 1);
        // Frames picked from the seeds (repeats and any order), some from the other peer.
        let mut frames: Vec<(usize, Vec<u8>)> = picks
            .iter()
            .map(|&(i, swap)| {
                let (src, f) = &seeds[i % seeds.len()];
                let src = if swap { 2 - src } else { *src };
                (src, f.clone())
            })
            .collect();
        for &(which, at, how, byte) in &edits {
            let n = frames.len();
            let f = &mut frames[which % n].1;
            *f = mutate(std::mem::take(f), &[(at, how, byte)]);
        }
        let now = Time::from_nanos(late * 1_000_000);
        for (src, f) in frames {
            let mut buf = BytesMut::from(&f[..]);
            // As a transport does: decoded frames are delivered; a decoding error drops the
            // link (here: the rest of this frame's bytes).
            while let Ok(Some(d)) = decode(&mut buf, &Limits::default()) {
                let msg: Message = d.into_message(src);
                e.handle_message(msg, now);
            }
            while e.poll_transmit().is_some() {}
            while e.poll_event().is_some() {}
        }
        // Time moves past every deadline: every call still open ends.
        e.handle_timeout(Time::from_nanos(10_000_000_000));
        while e.poll_transmit().is_some() {}
        while e.poll_event().is_some() {}
    }
}

#[test]
fn the_seeds_are_real_traffic() {
    // A clean run sends rank 1 messages from both peers.
    let s = seeds();
    assert!(
        s.iter().any(|(src, _)| *src == 0) && s.iter().any(|(src, _)| *src == 2),
        "{} seeds",
        s.len()
    );
}
