//! The device-local path on a real GPU (the `cuda` feature): ranks of one process whose
//! tensors are on the same GPU run every collective with device copies and a reduction
//! kernel (`actors/src/device/cuda/local.rs`), chosen automatically on the default (NCCL)
//! backend. Checked bit for bit against the host reference on worlds of 2, 3, 4 and 8 ranks:
//! every collective, every dtype, every op the host engine reduces, and random floats whose
//! sums round. On a machine without a GPU each test says so and passes without checking
//! anything (CI has none; see docs/gpu.md for what was run where).
#![cfg(feature = "cuda")]

mod common;
use collectix::runtime::tensor::reduce::reference;
use collectix::runtime::testing::{reduces, rooted, Case, COLLECTIVES};
use collectix::runtime::{bf16, f16};
use collectix::{
    DType, Device, DeviceBackend, Element, OpKind, ReduceOp, Tensor, TensorDeviceExt, TensorSpec,
    World,
};
use common::device::{run, wait_parked};
use std::time::Duration;

const GPU: Device = Device::Cuda(0);

/// Whether a GPU is here (the local path needs no NCCL); prints why not.
fn gpu() -> bool {
    match collectix::device::cuda_devices() {
        Ok(n) if n > 0 => true,
        other => {
            eprintln!("SKIPPED (no GPU here): {other:?}");
            false
        }
    }
}

fn to_gpu(t: Tensor) -> Tensor {
    t.to_device(GPU)
        .unwrap_or_else(|e| panic!("to_device: {e}"))
}

/// Every collective (barrier aside) × every dtype × every op the host engine takes for it
/// (reductions; the others once per dtype), 37 elements (a partial block of threads), plus
/// empty tensors, and large f32/bf16 calls whose threads stride over several blocks.
fn full_matrix(w: usize) -> Vec<Case> {
    let mut out = Vec::new();
    let case = |kind, count, dtype, op| Case {
        kind,
        size: w,
        count,
        dtype,
        op,
        root: if rooted(kind) { (count + 1) % w } else { 0 },
        algorithm: None,
    };
    for kind in COLLECTIVES {
        if kind == OpKind::Barrier {
            continue;
        }
        for dtype in DType::ALL {
            if reduces(kind) {
                for op in ReduceOp::ALL {
                    if op.check(dtype).is_ok() {
                        out.push(case(kind, 37, dtype, op));
                    }
                }
            } else {
                out.push(case(kind, 37, dtype, ReduceOp::Sum));
            }
        }
        out.push(case(kind, 0, DType::F32, ReduceOp::Sum));
    }
    for kind in [
        OpKind::AllReduce,
        OpKind::ReduceScatterTensor,
        OpKind::AllGatherIntoTensor,
    ] {
        out.push(case(kind, 3 << 18, DType::F32, ReduceOp::Sum));
        out.push(case(kind, 3 << 18, DType::BF16, ReduceOp::Avg));
    }
    out
}

#[test]
fn the_local_path_runs_every_collective_dtype_and_op_on_2_3_4_and_8_ranks_on_one_gpu() {
    if !gpu() {
        return;
    }
    for w in [2, 3, 4, 8] {
        let world = World::local(w).unwrap_or_else(|e| panic!("{e}"));
        let cases = full_matrix(w);
        let wrong = run(&world, DeviceBackend::Nccl, GPU, &cases, &to_gpu);
        eprintln!("world of {w}: {} cases, {} wrong", cases.len(), wrong.len());
        let mut kinds: Vec<String> = wrong
            .iter()
            .map(|m| m.split(',').next().unwrap_or("").to_string())
            .collect();
        kinds.dedup();
        eprintln!("wrong by kind: {kinds:?}");
        assert!(
            wrong.is_empty(),
            "world of {w}: {} wrong:\n{}",
            wrong.len(),
            wrong
                .iter()
                .take(20)
                .cloned()
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}

/// A small deterministic generator of values whose sums round.
fn values(seed: u64, n: usize) -> Vec<f64> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 11) as f64 / (1u64 << 53) as f64 - 0.5) * 1000.0
        })
        .collect()
}

fn tensor_of(dtype: DType, v: &[f64]) -> Tensor {
    fn make<T: Element>(v: &[f64]) -> Tensor {
        Tensor::from_vec(v.iter().map(|&x| T::from_f64(x)).collect::<Vec<T>>())
    }
    match dtype {
        DType::F16 => make::<f16>(v),
        DType::BF16 => make::<bf16>(v),
        DType::F32 => make::<f32>(v),
        _ => make::<f64>(v),
    }
}

/// Rounding: random floats, so every pairwise step rounds, must give the host reference's
/// bits (left to right in rank order, 16-bit floats rounded after each step, PremulSum's
/// scaling and Avg's division as on the host), for all_reduce and reduce_scatter_tensor.
#[test]
fn the_local_path_rounds_as_the_host_reference_does() {
    if !gpu() {
        return;
    }
    let n = 4099;
    for w in [3, 8] {
        let world = World::local(w).unwrap_or_else(|e| panic!("{e}"));
        for dtype in [DType::F16, DType::BF16, DType::F32, DType::F64] {
            for op in [
                ReduceOp::Sum,
                ReduceOp::Product,
                ReduceOp::Min,
                ReduceOp::Max,
                ReduceOp::Avg,
                ReduceOp::PremulSum(0.3),
            ] {
                let inputs: Vec<Tensor> = (0..w)
                    .map(|r| tensor_of(dtype, &values((r * 31 + n) as u64, n * w)))
                    .collect();
                let want = reference(op, &inputs).unwrap_or_else(|e| panic!("{e}"));
                let works: Vec<_> = world
                    .communicators()
                    .iter()
                    .zip(&inputs)
                    .map(|(c, t)| c.all_reduce(to_gpu(t.clone()), op))
                    .collect();
                for (r, wk) in works.into_iter().enumerate() {
                    let got = wait_parked(wk)
                        .and_then(|t| t.to_host())
                        .unwrap_or_else(|e| panic!("{dtype} {op} rank {r}: {e}"));
                    assert!(
                        got.bytes() == want.bytes(),
                        "all_reduce {dtype} {op} on {w} ranks, rank {r}: bits differ"
                    );
                }
                // reduce_scatter_tensor: rank r gets block r of the same reduction.
                let works: Vec<_> = world
                    .communicators()
                    .iter()
                    .zip(&inputs)
                    .map(|(c, t)| {
                        c.reduce_scatter_tensor(
                            TensorSpec::new(&[n], dtype).on(GPU),
                            to_gpu(t.clone()),
                            op,
                        )
                    })
                    .collect();
                let esize = dtype.size();
                for (r, wk) in works.into_iter().enumerate() {
                    let got = wait_parked(wk)
                        .and_then(|t| t.to_host())
                        .unwrap_or_else(|e| panic!("{dtype} {op} rank {r}: {e}"));
                    assert!(
                        got.bytes()[..] == want.bytes()[r * n * esize..(r + 1) * n * esize],
                        "reduce_scatter {dtype} {op} on {w} ranks, rank {r}: bits differ"
                    );
                }
            }
        }
    }
}

/// Ranks driven as users drive them: each from its own thread, a batch of calls issued
/// before any is waited, the ranks skewed by different pauses; every result exact.
#[test]
fn skewed_ranks_issuing_batches_get_every_result() {
    if !gpu() {
        return;
    }
    let w = 4;
    let world = World::local(w).unwrap_or_else(|e| panic!("{e}"));
    std::thread::scope(|s| {
        for (r, c) in world.communicators().iter().enumerate() {
            s.spawn(move || {
                for round in 0..20u32 {
                    std::thread::sleep(Duration::from_micros(
                        ((r as u64 * 7 + round as u64) % 5) * 300,
                    ));
                    let works: Vec<_> = (0..8u32)
                        .map(|i| {
                            let v = (r as u32 + 1) * 1000 + round * 10 + i;
                            c.all_reduce(
                                to_gpu(Tensor::from_vec(vec![v as i64; 1000])),
                                ReduceOp::Sum,
                            )
                        })
                        .collect();
                    for (i, wk) in works.into_iter().enumerate() {
                        let got = wait_parked(wk)
                            .and_then(|t| t.to_host())
                            .and_then(|t| t.to_vec::<i64>())
                            .unwrap_or_else(|e| panic!("rank {r}: {e}"));
                        let want: i64 = (0..w as i64)
                            .map(|q| (q + 1) * 1000 + round as i64 * 10 + i as i64)
                            .sum();
                        assert!(
                            got.iter().all(|&x| x == want),
                            "rank {r} round {round} call {i}"
                        );
                    }
                }
            });
        }
    });
}

/// An all_reduce of a tensor the caller moved in is written over it; a tensor the caller
/// kept a clone of is never changed.
#[test]
fn the_local_path_never_writes_over_a_tensor_the_caller_kept() {
    if !gpu() {
        return;
    }
    let world = World::local(2).unwrap_or_else(|e| panic!("{e}"));
    let kept: Vec<Tensor> = (0..2)
        .map(|r| to_gpu(Tensor::from_vec(vec![r as f32 + 1.0; 64])))
        .collect();
    let works: Vec<_> = world
        .communicators()
        .iter()
        .zip(&kept)
        .map(|(c, t)| c.all_reduce(t.clone(), ReduceOp::Sum))
        .collect();
    for wk in works {
        let got = wait_parked(wk)
            .and_then(|t| t.to_host())
            .and_then(|t| t.to_vec::<f32>());
        assert_eq!(got.ok(), Some(vec![3.0f32; 64]));
    }
    for (r, t) in kept.iter().enumerate() {
        let v = t.to_host().and_then(|t| t.to_vec::<f32>()).ok();
        assert_eq!(
            v,
            Some(vec![r as f32 + 1.0; 64]),
            "rank {r}'s kept tensor changed"
        );
    }
    // Moved in: the result is on the GPU, and right.
    let works: Vec<_> = world
        .communicators()
        .iter()
        .map(|c| {
            c.all_reduce(
                to_gpu(Tensor::from_vec(vec![2.0f32; 64])),
                ReduceOp::Product,
            )
        })
        .collect();
    for wk in works {
        let got = wait_parked(wk)
            .and_then(|t| t.to_host())
            .and_then(|t| t.to_vec::<f32>());
        assert_eq!(got.ok(), Some(vec![4.0f32; 64]));
    }
}

/// torch's NCCL barrier (a one-element all_reduce on the device) on ranks sharing a GPU:
/// the device-local path, every rank released.
#[test]
fn barrier_on_a_shared_gpu_releases_every_rank() {
    if !gpu() {
        return;
    }
    let world = World::local(4).unwrap_or_else(|e| panic!("{e}"));
    for round in 0..3 {
        let works: Vec<_> = world
            .communicators()
            .iter()
            .map(|c| c.barrier_on(GPU))
            .collect();
        for (r, w) in works.into_iter().enumerate() {
            let got = wait_parked(w);
            assert!(got.is_ok(), "round {round} rank {r}: {got:?}");
        }
    }
}

/// Device send and receive between ranks sharing one GPU, as users drive them: every rank
/// sends to every other on three tags (sizes 0, 3 and 1 Mi elements) before it receives,
/// receives in another order than the sends (peers and tags reversed), with an all_reduce in
/// between; then receives from any source. Every tensor exact and on the GPU.
#[test]
fn device_send_and_recv_between_ranks_on_one_gpu_in_any_order() {
    if !gpu() {
        return;
    }
    let w = 4;
    let world = World::local(w).unwrap_or_else(|e| panic!("{e}"));
    let data = |from: usize, to: usize, tag: u32| -> Vec<f32> {
        let n = match tag {
            1 => 0,
            2 => 3,
            _ => 1 << 20,
        };
        (0..n)
            .map(|i| (from * 100 + to * 10 + tag as usize) as f32 + (i % 1000) as f32)
            .collect()
    };
    std::thread::scope(|s| {
        for c in world.communicators() {
            s.spawn(move || {
                let me = c.rank();
                let peers: Vec<usize> = (0..w).filter(|&p| p != me).collect();
                let mut sends = Vec::new();
                for &p in &peers {
                    for tag in [1u32, 2, 3] {
                        sends.push(c.send(to_gpu(Tensor::from_vec(data(me, p, tag))), p, tag));
                    }
                }
                let sum = c.all_reduce(to_gpu(Tensor::from_vec(vec![1.0f32; 4])), ReduceOp::Sum);
                for &p in peers.iter().rev() {
                    for tag in [3u32, 2, 1] {
                        let n = data(p, me, tag).len();
                        let (t, src) = wait_parked(c.recv(
                            TensorSpec::new(&[n], DType::F32).on(GPU),
                            Some(p),
                            tag,
                        ))
                        .unwrap_or_else(|e| panic!("rank {me} from {p}, tag {tag}: {e}"));
                        assert_eq!((t.device(), src), (GPU, p));
                        let v = t.to_host().and_then(|t| t.to_vec::<f32>());
                        assert!(
                            v.ok() == Some(data(p, me, tag)),
                            "rank {me} from {p}, tag {tag}: wrong data"
                        );
                    }
                }
                for (i, wk) in sends.into_iter().enumerate() {
                    wait_parked(wk).unwrap_or_else(|e| panic!("rank {me}, send {i}: {e}"));
                }
                let t = wait_parked(sum).unwrap_or_else(|e| panic!("{e}"));
                assert_eq!(
                    t.to_host().and_then(|t| t.to_vec::<f32>()).ok(),
                    Some(vec![w as f32; 4])
                );
            });
        }
    });
    // From any source: rank 0 takes one message from each of the others, in whatever order
    // they come, and learns who sent each.
    let works: Vec<_> = (1..w)
        .map(|r| world.communicators()[r].send(to_gpu(Tensor::from_vec(vec![r as i32; 5])), 0, 9))
        .collect();
    let mut seen = Vec::new();
    for _ in 1..w {
        let (t, src) = wait_parked(world.communicators()[0].recv(
            TensorSpec::new(&[5], DType::I32).on(GPU),
            None,
            9,
        ))
        .unwrap_or_else(|e| panic!("any source: {e}"));
        let v = t.to_host().and_then(|t| t.to_vec::<i32>()).ok();
        assert_eq!(v, Some(vec![src as i32; 5]), "from {src}");
        seen.push(src);
    }
    seen.sort();
    assert_eq!(seen, (1..w).collect::<Vec<_>>());
    for wk in works {
        wait_parked(wk).unwrap_or_else(|e| panic!("{e}"));
    }
}
