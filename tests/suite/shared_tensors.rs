//! Tensors in shared memory (`Communicator::alloc_shared`, `to_shared`) between the
//! processes of one host: their payloads cross with one copy (read from the sender's heap),
//! the results are exact, and the faults of any call end the same way on them: a mismatch is
//! a typed error on every rank, a peer that goes away mid-call is named, never a hang. (The
//! whole matrix on shared tensors, on 2, 3 and 4 ranks: `tests/suite/tcp_world.rs`; the torch
//! differential and the fault matrix on them: `tests/suite/torch_differential.rs`,
//! `tests/suite/fault_matrix.rs`.) Each rank is a thread of this process joined as a process
//! would be.

use crate::common;

use collectix::{DType, Error, Tensor, TensorSpec, Transport};
use std::time::Duration;

const MIB: usize = 1 << 20;

/// Runs `body` on `w` ranks over shared memory (calls time out after `timeout`); every rank
/// must end `Ok`.
fn on_shm(
    w: usize,
    timeout: Duration,
    body: impl Fn(usize, collectix::Process) -> Result<(), String> + Sync,
) {
    let ends = common::job(Transport::Shm, w, "shared", timeout, body);
    for (r, e) in ends.into_iter().enumerate() {
        assert_eq!(e, Ok(()), "rank {r}");
    }
}

#[test]
fn a_tensor_filled_in_place_crosses_from_the_heap_and_comes_back_exact() {
    on_shm(2, Duration::from_secs(20), |r, p| {
        let c = p.communicator();
        let n = MIB / 4;
        let mut b = c
            .alloc_shared(&[n], DType::F32)
            .map_err(|e| e.to_string())?;
        if !b.is_shared() {
            return Err(format!("rank {r}: no shared heap"));
        }
        if b.as_mut_slice::<i32>().is_ok() {
            return Err("an f32 buffer viewed as i32".into());
        }
        for (i, x) in b
            .as_mut_slice::<f32>()
            .map_err(|e| e.to_string())?
            .iter_mut()
            .enumerate()
        {
            *x = (i % 997) as f32 + r as f32;
        }
        let t = b.freeze().map_err(|e| e.to_string())?;
        // A broadcast from rank 0, then an all_gather of both ranks' tensors.
        let got = c
            .broadcast(t.clone(), 0)
            .wait()
            .map_err(|e| e.to_string())?;
        let want: Vec<f32> = (0..n).map(|i| (i % 997) as f32).collect();
        if got.to_vec::<f32>().ok() != Some(want) {
            return Err(format!("rank {r}: broadcast wrong"));
        }
        let all = c
            .all_gather_into_tensor(TensorSpec::new(&[2 * n], DType::F32), t)
            .wait()
            .map_err(|e| e.to_string())?;
        let want: Vec<f32> = (0..2 * n)
            .map(|k| (k % n % 997) as f32 + (k / n) as f32)
            .collect();
        if all.to_vec::<f32>().ok() != Some(want) {
            return Err(format!("rank {r}: all_gather wrong"));
        }
        // Rank 1 read rank 0's broadcast and its block, rank 0 rank 1's block: each a
        // part of 1 MiB out of the peer's heap, whenever it came (maybe before this rank's
        // own call).
        let read = p.read_from_shared_heaps();
        if read != [1, 2][r] {
            return Err(format!("rank {r}: {read} parts read from the peer's heap"));
        }
        p.shutdown().map_err(|e| e.to_string())
    });
}

/// all_to_all's blocks of 2 to 8 MiB cross with one copy too, read out of the sender's
/// memory by one thread of the receiver (`frames::EXCHANGE_MIN`): exact on 3 ranks, with
/// blocks of 3 MiB and of 1 MiB (the ring) in one call after another.
#[test]
fn all_to_all_blocks_of_a_few_mib_are_exact() {
    on_shm(3, Duration::from_secs(60), |r, p| {
        let c = p.communicator();
        for block in [3 * MIB / 4, MIB / 4] {
            let w = c.size();
            let input: Vec<f32> = (0..w * block)
                .map(|i| (r * 7 + i / block) as f32 + (i % block % 1013) as f32)
                .collect();
            let got = c
                .all_to_all_single(
                    TensorSpec::new(&[w * block], DType::F32),
                    Tensor::from_slice(&input),
                    None,
                    None,
                )
                .wait()
                .map_err(|e| format!("rank {r}: {e}"))?;
            let want: Vec<f32> = (0..w * block)
                .map(|i| ((i / block) * 7 + r) as f32 + (i % block % 1013) as f32)
                .collect();
            if got.to_vec::<f32>().ok() != Some(want) {
                return Err(format!(
                    "rank {r}: all_to_all of {} B blocks wrong",
                    block * 4
                ));
            }
        }
        Ok(())
    });
}

/// Large parts of rooted calls (a broadcast, a reduce, a gather, a scatter), of all_to_all,
/// of all_gather and of point-to-point messages cross with one copy, read out of the sender's memory by the
/// receiver, in pieces that the receiver's threads share; the results are exact, on ordinary
/// and shared tensors alike.
#[test]
fn large_rooted_calls_all_to_all_and_messages_are_read_once_by_every_thread_of_the_receiver() {
    on_shm(2, Duration::from_secs(60), |r, p| {
        let c = p.communicator();
        let n = 12 * MIB / 4;
        let mine: Vec<f32> = (0..n).map(|i| (i % 1009) as f32 + r as f32).collect();
        let of = |q: usize| -> Vec<f32> { (0..n).map(|i| (i % 1009) as f32 + q as f32).collect() };
        let e = |e: Error| format!("rank {r}: {e}");
        let got = c
            .broadcast(Tensor::from_slice(&mine), 0)
            .wait()
            .map_err(e)?;
        if got.to_vec::<f32>().ok() != Some(of(0)) {
            return Err(format!("rank {r}: broadcast wrong"));
        }
        let sum = c
            .reduce(Tensor::from_slice(&mine), 1, collectix::ReduceOp::Sum)
            .wait()
            .map_err(e)?;
        if r == 1 {
            let want: Vec<f32> = (0..n).map(|i| 2.0 * (i % 1009) as f32 + 1.0).collect();
            if sum.to_vec::<f32>().ok() != Some(want) {
                return Err("rank 1: reduce wrong".into());
            }
        }
        let all = c.gather(Tensor::from_slice(&mine), 0).wait().map_err(e)?;
        if r == 0 {
            let all: Vec<Vec<f32>> = all
                .unwrap_or_default()
                .iter()
                .filter_map(|t| t.to_vec::<f32>().ok())
                .collect();
            if all != vec![of(0), of(1)] {
                return Err("rank 0: gather wrong".into());
            }
        }
        let shared = c.to_shared(&Tensor::from_slice(&mine)).map_err(e)?;
        let got = c.broadcast(shared, 1).wait().map_err(e)?;
        if got.to_vec::<f32>().ok() != Some(of(1)) {
            return Err(format!("rank {r}: broadcast of a shared tensor wrong"));
        }
        // Point-to-point too: both ranks send at once and receive the other's tensor.
        let sent = c.isend(Tensor::from_slice(&mine), 1 - r, 5);
        let (got, from) = c
            .recv(TensorSpec::new(&[n], DType::F32), Some(1 - r), 5)
            .wait()
            .map_err(e)?;
        sent.wait().map_err(e)?;
        if from != 1 - r || got.to_vec::<f32>().ok() != Some(of(1 - r)) {
            return Err(format!("rank {r}: recv wrong"));
        }
        // Rank 1 read the broadcast, the reduce's part and the message, rank 0 the gather's,
        // the shared broadcast and the message: each at least 8 MiB, read in pieces.
        let split = p.split_reads();
        if split < 3 {
            return Err(format!("rank {r}: {split} parts read in pieces"));
        }
        // (The all_to_all's blocks are counted from here: none comes before the barrier.)
        c.barrier().wait().map_err(e)?;
        // An all_to_all of two 12 MiB blocks: each rank reads the peer's block once, in
        // pieces, into its output (twice: the second call issued at once on both ranks).
        for _ in 0..2 {
            let both: Vec<f32> = mine.iter().chain(&mine).map(|x| x * 2.0 + 1.0).collect();
            let got = c
                .all_to_all_single(
                    TensorSpec::new(&[2 * n], DType::F32),
                    Tensor::from_slice(&both),
                    None,
                    None,
                )
                .wait()
                .map_err(e)?;
            let want: Vec<f32> = (0..2)
                .flat_map(|q| of(q).into_iter().map(|x| x * 2.0 + 1.0))
                .collect();
            if got.to_vec::<f32>().ok() != Some(want) {
                return Err(format!("rank {r}: all_to_all wrong"));
            }
        }
        let more = p.split_reads() - split;
        if more < 2 {
            return Err(format!("rank {r}: {more} all_to_all blocks read in pieces"));
        }
        // An all_gather of 12 MiB blocks (ordinary tensors): each rank reads the peer's block
        // once, in pieces, out of the peer's memory (twice). Counted before a barrier: the
        // peer's first block cannot come before it.
        let split = p.split_reads();
        c.barrier().wait().map_err(e)?;
        for k in 0..2 {
            let mine: Vec<f32> = mine.iter().map(|x| x - k as f32).collect();
            let got = c
                .all_gather_into_tensor(
                    TensorSpec::new(&[2 * n], DType::F32),
                    Tensor::from_slice(&mine),
                )
                .wait()
                .map_err(e)?;
            let want: Vec<f32> = (0..2)
                .flat_map(|q| of(q).into_iter().map(|x| x - k as f32))
                .collect();
            if got.to_vec::<f32>().ok() != Some(want) {
                return Err(format!("rank {r}: all_gather wrong"));
            }
        }
        let more = p.split_reads() - split;
        if more < 2 {
            return Err(format!("rank {r}: {more} all_gather blocks read in pieces"));
        }
        p.shutdown().map_err(|e| e.to_string())
    });
}

/// Rank `r`'s part of the in-place all_gather rounds (see the tests below): `landed` counts
/// the messages it read straight into place; `in_heap`: whether the job has shared heaps
/// (processes over shared memory), where every large result must be the buffer's memory.
fn in_place_rounds(
    r: usize,
    w: usize,
    c: &collectix::Communicator,
    landed: &dyn Fn() -> u64,
    in_heap: bool,
) -> Result<(), String> {
    let value = |round: usize, owner: usize, i: usize| {
        (i % 1009) as i32 * 8 + owner as i32 + round as i32 * 100_000
    };
    let (mut big, mut small) = (None, None);
    let mut kept: Option<(usize, Tensor)> = None;
    let mut total = 0;
    // Round 2 twice: the second gathers again without writing (its block as left).
    let rounds = [
        (0usize, 3 * MIB),
        (1, 3 * MIB),
        (2, 3 * MIB),
        (2, 3 * MIB),
        (3, 100),
    ];
    for (k, (round, n)) in rounds.into_iter().enumerate() {
        let slot = if n == 100 { &mut small } else { &mut big };
        if slot.is_none() {
            *slot = Some(
                c.alloc_shared(&[w * n], DType::I32)
                    .map_err(|e| e.to_string())?,
            );
        }
        let Some(b) = slot.as_mut() else {
            return Err("no buffer".into());
        };
        if b.is_shared() != in_heap {
            return Err(format!("rank {r}: in the heap: {}", b.is_shared()));
        }
        if k != 3 {
            let v = b.as_mut_slice::<i32>().map_err(|e| e.to_string())?;
            for (i, x) in v[r * n..(r + 1) * n].iter_mut().enumerate() {
                *x = value(round, r, i);
            }
        }
        // Counted before the barrier: no peer's block of this call can come before it. (A
        // peer more than `frames::HOLD` ahead would have its block read into a buffer of its
        // own, then copied in: the result is the same, in place, but not landed.)
        let before = landed();
        c.barrier().wait().map_err(|e| e.to_string())?;
        let got = c
            .all_gather_into_tensor_in_place(b)
            .wait()
            .map_err(|e| format!("rank {r} call {k}: {e}"))?;
        let want: Vec<i32> = (0..w * n).map(|j| value(round, j / n, j % n)).collect();
        let v = got.to_vec::<i32>().unwrap_or_default();
        if v != want || got.shape() != [w * n] {
            let bad = (0..v.len().min(want.len())).filter(|&j| v[j] != want[j]);
            return Err(format!(
                "rank {r} call {k}: wrong result, {} elements wrong",
                bad.count()
            ));
        }
        let large = in_heap && n * 4 >= 64 << 10;
        if large && !c.is_shared(&got) {
            return Err(format!("rank {r} call {k}: result not in the heap"));
        }
        if large {
            total += landed() - before;
        }
        // Round 0's result is held through round 1 (the buffer written under it), then
        // dropped before round 2 (written in place again).
        if let Some((was, t)) = kept.take() {
            let want: Vec<i32> = (0..w * n).map(|j| value(was, j / n, j % n)).collect();
            if t.to_vec::<i32>().ok() != Some(want) {
                return Err(format!("rank {r}: round {was}'s result changed"));
            }
        }
        if round == 0 {
            kept = Some((round, got));
        }
    }
    // Blocks received straight into the buffer: at most W - 1 per large call. A peer more
    // than `frames::HOLD` ahead (more threads than cores: a rank not scheduled for a while)
    // has its block read into a buffer of its own and then copied in, so only some are
    // asserted.
    if in_heap && total == 0 {
        return Err(format!("rank {r}: no block landed in the buffer"));
    }
    // A buffer that the group's size does not divide: a typed error on every rank.
    let odd = if r == 0 { w * 64 + 1 } else { w * 64 };
    let mut b = c
        .alloc_shared(&[odd], DType::I32)
        .map_err(|e| e.to_string())?;
    match c
        .all_gather_into_tensor_in_place(&mut b)
        .wait_timeout(Duration::from_secs(20))
    {
        Some(Err(_)) => Ok(()),
        other => Err(format!("rank {r}: odd size gave {other:?}")),
    }
}

/// An in-place all_gather (torch's `all_gather_into_tensor(out, out.chunk(W)[rank])`) on a
/// buffer in shared memory, between processes over shared memory: every peer's block lands
/// straight in the caller's buffer and the result is that buffer's memory (in the heap),
/// exact, on 2 and 3 processes, large and small; the buffer is gathered into again step
/// after step (FSDP's flat parameter), with and without writing it, and a result still held
/// never changes when the buffer is written again; a wrong size is a typed error on every
/// rank.
#[test]
fn an_in_place_all_gather_lands_every_block_in_the_callers_buffer() {
    for w in [2usize, 3] {
        on_shm(w, Duration::from_secs(30), |r, p| {
            in_place_rounds(r, w, p.communicator(), &|| p.landed(), true)?;
            p.abort();
            Ok(())
        });
    }
}

/// The same calls over TCP and in one process (no shared heap: the buffers are ordinary
/// memory), exact.
#[test]
fn an_in_place_all_gather_without_a_shared_heap_is_exact_too() {
    let ends = common::tcp_job(2, "in-place", Duration::from_secs(30), |r, p| {
        in_place_rounds(r, 2, p.communicator(), &|| p.landed(), false)?;
        p.abort();
        Ok(())
    });
    assert_eq!(ends, vec![Ok(()), Ok(())]);
    let world = collectix::World::local(3).unwrap_or_else(|e| panic!("{e}"));
    let comms = world.communicators();
    std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .enumerate()
            .map(|(r, c)| s.spawn(move || in_place_rounds(r, 3, c, &|| 0, false)))
            .collect();
        for (r, h) in hs.into_iter().enumerate() {
            assert_eq!(h.join().ok(), Some(Ok(())), "rank {r}");
        }
    });
}

#[test]
fn mismatched_shared_tensors_are_a_typed_error_on_every_rank() {
    on_shm(3, Duration::from_secs(5), |r, p| {
        let c = p.communicator();
        // Rank 2's block is a different size: every rank must be told, none hang.
        let n = if r == 2 { MIB / 4 + 16 } else { MIB / 4 };
        let t = c
            .to_shared(&Tensor::from_vec(vec![r as f32; n]))
            .map_err(|e| e.to_string())?;
        let res = c
            .all_gather_into_tensor(TensorSpec::new(&[3 * n], DType::F32), t)
            .wait_timeout(Duration::from_secs(30));
        match res {
            Some(Err(e)) if matches!(e.root_cause(), Error::Mismatch { .. }) => {}
            other => return Err(format!("rank {r}: {other:?}")),
        }
        p.abort();
        Ok(())
    });
}

#[test]
fn a_peer_that_leaves_mid_call_is_named_by_the_ranks_reading_its_heap() {
    on_shm(3, Duration::from_secs(20), |r, p| {
        let c = p.communicator();
        let t = c
            .to_shared(&Tensor::from_vec(vec![r as f32; 4 * MIB / 4]))
            .map_err(|e| e.to_string())?;
        // One all_gather every rank makes; then rank 2 aborts (as soon as its own call is
        // done: the others may still wait for its last messages) while the others start
        // another. Each of theirs ends exact or in the loss of rank 2, the second in the loss.
        let lost = |e: &Error| matches!(e.root_cause(), Error::PeerLost { rank: 2 });
        let first = c
            .all_gather_into_tensor(TensorSpec::new(&[3 * MIB], DType::F32), t.clone())
            .wait();
        if r == 2 {
            first.map_err(|e| format!("rank {r}: {e}"))?;
            p.abort();
            return Ok(());
        }
        match first {
            Ok(_) => {}
            Err(e) if lost(&e) => {}
            Err(e) => return Err(format!("rank {r}: the first call: {e:?}")),
        }
        let res = c
            .all_gather_into_tensor(TensorSpec::new(&[3 * MIB], DType::F32), t)
            .wait_timeout(Duration::from_secs(60));
        match res {
            Some(Err(e)) if lost(&e) => {}
            other => return Err(format!("rank {r}: {other:?}")),
        }
        p.abort();
        Ok(())
    });
}
