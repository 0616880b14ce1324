//! Coalesced calls through the deterministic simulator: a list of tensors moved as one call
//! (`collective::coalesce`) gives each tensor exactly what its own call gives, for
//! all_reduce, all_gather_into_tensor and reduce_scatter_tensor, every algorithm, W = 1–5;
//! and it moves as one call: as many frames as one call of the list's total size, fewer than
//! the calls one by one.

use collectix_runtime::collective::coalesce::{coalesce, Coalescing};
use collectix_runtime::group::{CallOptions, GroupId, GroupOptions};
use collectix_runtime::tensor::pool::Pool;
use collectix_runtime::testing::sim::Sim;
use collectix_runtime::{
    Algorithm, Buffer, DType, Destination, OpKind, Output, Plan, ReduceOp, Request, Tensor,
    TensorSpec,
};

/// Rank `r`'s tensor `i` of `n` elements: small integers, exact in any order of additions.
fn input(dtype: DType, r: usize, i: usize, n: usize) -> Tensor {
    let v: Vec<f64> = (0..n)
        .map(|k| ((r * 5 + i * 3 + k) % 7) as f64 - 3.0)
        .collect();
    match dtype {
        DType::I64 => Tensor::from_vec(v.iter().map(|&x| x as i64).collect::<Vec<_>>()),
        _ => Tensor::from_vec(v.iter().map(|&x| x as f32).collect::<Vec<_>>()),
    }
}

/// 64-byte segments: pipelined layouts cut across the list's tensors.
fn opts() -> GroupOptions {
    GroupOptions {
        segment_bytes: 64,
        ..GroupOptions::default()
    }
}

fn call(alg: Algorithm) -> CallOptions {
    CallOptions {
        algorithm: Some(alg),
        timeout: None,
    }
}

/// Each rank's list as one coalesced call; each rank's outputs, and the frames it took.
fn coalesced(
    kind: Coalescing,
    dtype: DType,
    w: usize,
    counts: &[usize],
    alg: Algorithm,
    seed: u64,
    opts: GroupOptions,
) -> (Vec<Vec<Buffer>>, u64) {
    let mut sim = Sim::with_options(w, seed, opts);
    let mut ids = Vec::new();
    for r in 0..w {
        let ts: Vec<Tensor> = counts
            .iter()
            .enumerate()
            .map(|(i, &n)| input(dtype, r, i, n))
            .collect();
        let bytes: Vec<&[u8]> = ts.iter().map(|t| &t.bytes()[..]).collect();
        let c = coalesce(kind, dtype, &bytes, w, &Pool::none()).unwrap_or_else(|e| panic!("{e}"));
        let outs = c
            .outputs
            .iter()
            .map(|&n| Buffer::zeros(&[n], dtype).unwrap_or_else(|e| panic!("{e}")))
            .collect();
        let info = sim
            .group(r, GroupId::WORLD)
            .unwrap_or_else(|e| panic!("{e}"));
        let dest = Destination::with_runs(outs, c.runs);
        let plan = Plan::new(c.request, &info, &call(alg))
            .and_then(|p| p.writing_into(&dest))
            .unwrap_or_else(|e| panic!("{kind:?} W={w} {alg}: {e}"));
        ids.push(
            sim.submit_plan(r, GroupId::WORLD, plan)
                .unwrap_or_else(|e| panic!("{e}")),
        );
    }
    sim.run_no_timeouts(10_000_000)
        .unwrap_or_else(|e| panic!("{e:?}"));
    let outs = ids
        .into_iter()
        .enumerate()
        .map(|(r, id)| match sim.take(r, id) {
            Some(Ok(Output::Buffers(b))) => b,
            other => panic!("{kind:?} W={w} {alg} rank {r}: {other:?}"),
        })
        .collect();
    (outs, sim.link_stats().frames)
}

/// The request of one tensor's own call.
fn single(kind: Coalescing, w: usize, t: Tensor) -> Request {
    let (n, dtype) = (t.numel(), t.dtype());
    match kind {
        Coalescing::AllReduce(op) => Request::AllReduce { tensor: t, op },
        Coalescing::AllGatherIntoTensor => Request::AllGatherIntoTensor {
            input: t,
            output: TensorSpec::new(&[w * n], dtype),
        },
        Coalescing::ReduceScatterTensor(op) => Request::ReduceScatterTensor {
            input: t,
            output: TensorSpec::new(&[n / w], dtype),
            op,
        },
    }
}

/// Each rank's tensors, each in its own call (one after another); the outputs and frames.
fn one_by_one(
    kind: Coalescing,
    dtype: DType,
    w: usize,
    counts: &[usize],
    alg: Algorithm,
    seed: u64,
    opts: GroupOptions,
) -> (Vec<Vec<Tensor>>, u64) {
    let mut sim = Sim::with_options(w, seed, opts);
    let mut ids = vec![Vec::new(); w];
    for (i, &n) in counts.iter().enumerate() {
        for (r, mine) in ids.iter_mut().enumerate() {
            let req = single(kind, w, input(dtype, r, i, n));
            mine.push(
                sim.submit(r, GroupId::WORLD, req, &call(alg))
                    .unwrap_or_else(|e| panic!("{e}")),
            );
        }
    }
    sim.run_no_timeouts(10_000_000)
        .unwrap_or_else(|e| panic!("{e:?}"));
    let outs = ids
        .into_iter()
        .enumerate()
        .map(|(r, ids)| {
            ids.into_iter()
                .map(|id| match sim.take(r, id) {
                    Some(Ok(Output::Tensor(t))) => t,
                    other => panic!("rank {r}: {other:?}"),
                })
                .collect()
        })
        .collect();
    (outs, sim.link_stats().frames)
}

fn kinds() -> [(Coalescing, OpKind); 4] {
    [
        (Coalescing::AllReduce(ReduceOp::Sum), OpKind::AllReduce),
        (Coalescing::AllReduce(ReduceOp::Avg), OpKind::AllReduce),
        (Coalescing::AllGatherIntoTensor, OpKind::AllGatherIntoTensor),
        (
            Coalescing::ReduceScatterTensor(ReduceOp::Avg),
            OpKind::ReduceScatterTensor,
        ),
    ]
}

#[test]
fn a_coalesced_list_gives_each_tensor_what_its_own_call_gives() {
    let mut seed = 11;
    for (kind, op_kind) in kinds() {
        for &alg in op_kind.algorithms() {
            for w in 1..=5 {
                // Sizes that straddle the chunks: 64-byte segments cut across the tensors.
                let counts = [3 * w, 0, 17 * w, w];
                for dtype in [DType::I64, DType::F32] {
                    if dtype == DType::I64
                        && matches!(
                            kind,
                            Coalescing::AllReduce(ReduceOp::Avg)
                                | Coalescing::ReduceScatterTensor(ReduceOp::Avg)
                        )
                    {
                        continue;
                    }
                    seed += 1;
                    let (got, _) = coalesced(kind, dtype, w, &counts, alg, seed, opts());
                    let (want, _) = one_by_one(kind, dtype, w, &counts, alg, seed, opts());
                    for r in 0..w {
                        assert_eq!(got[r].len(), want[r].len());
                        for (i, (b, t)) in got[r].iter().zip(&want[r]).enumerate() {
                            assert_eq!(
                                b.bytes(),
                                &t.bytes()[..],
                                "{kind:?} {alg} W={w} {dtype} rank {r} tensor {i}"
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn a_coalesced_list_moves_as_one_call() {
    for (kind, op_kind) in kinds() {
        for &alg in op_kind.algorithms() {
            for w in [2, 4] {
                let counts = [8 * w, 4 * w, 12 * w];
                let total: usize = counts.iter().sum();
                // Default segments (1 MiB): each call's steps send one message per peer.
                let o = GroupOptions::default;
                let (_, together) = coalesced(kind, DType::F32, w, &counts, alg, 5, o());
                let (_, flat) = one_by_one(kind, DType::F32, w, &[total], alg, 5, o());
                let (_, apart) = one_by_one(kind, DType::F32, w, &counts, alg, 5, o());
                assert_eq!(together, flat, "{kind:?} {alg} W={w}: frames of one call");
                assert!(
                    together < apart,
                    "{kind:?} {alg} W={w}: {together} vs {apart}"
                );
            }
        }
    }
}

#[test]
fn a_list_that_is_not_one_call_is_refused() {
    let pool = Pool::none();
    let a = Tensor::from_vec(vec![1.0f32; 4]);
    let odd = Tensor::from_vec(vec![1.0f32; 3]);
    let rs = Coalescing::ReduceScatterTensor(ReduceOp::Sum);
    let e = coalesce(
        rs,
        DType::F32,
        &[&a.bytes()[..], &odd.bytes()[..]],
        2,
        &pool,
    );
    assert!(e.is_err_and(|e| e.to_string().contains("do not split into 2 blocks")));
    let e = coalesce(Coalescing::AllGatherIntoTensor, DType::F32, &[], 2, &pool);
    assert!(e.is_err_and(|e| e.to_string().contains("no tensors")));
    let e = coalesce(
        Coalescing::AllGatherIntoTensor,
        DType::F64,
        &[&odd.bytes()[..]],
        2,
        &pool,
    );
    assert!(e.is_err_and(|e| e.to_string().contains("whole number")));
}
