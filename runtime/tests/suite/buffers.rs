//! Caller-owned outputs through the deterministic simulator: every collective × algorithm ×
//! group size, with its result written into the caller's buffers (`Plan::writing_into`)
//! instead of new tensors, compared bit for bit with the sequential reference; and the rules
//! a destination is checked by before anything is sent.

use collectix_runtime::group::{CallOptions, GroupId, GroupOptions};
use collectix_runtime::testing::sim::Sim;
use collectix_runtime::testing::{reduces, rooted, Case, COLLECTIVES};
use collectix_runtime::{Buffer, DType, Destination, Error, OpKind, Output, Plan, ReduceOp};

/// Buffers shaped like `want`, filled with a pattern no result has (in-place calls whose
/// output is their input start from the input, as the caller's buffer would hold it).
fn buffers_for(case: &Case, r: usize, want: &Output) -> Vec<Buffer> {
    let garbage = |t: &collectix_runtime::Tensor| {
        let mut b = Buffer::zeros(t.shape(), t.dtype()).unwrap_or_else(|e| panic!("{e}"));
        if t.dtype() != DType::Bool {
            b.bytes_mut().fill(0xA5);
        }
        b
    };
    let returns_input = matches!(
        (case.kind, r == case.root),
        (OpKind::Reduce, false) | (OpKind::Broadcast, true)
    );
    match want {
        Output::Tensor(t) if returns_input => {
            vec![Buffer::from_tensor(t).unwrap_or_else(|e| panic!("{e}"))]
        }
        Output::Tensor(t) => vec![garbage(t)],
        Output::Tensors(ts) => ts.iter().map(garbage).collect(),
        _ => Vec::new(),
    }
}

fn same(got: &Output, want: &Output) -> bool {
    let eq = |b: &Buffer, t: &collectix_runtime::Tensor| {
        b.dtype() == t.dtype() && b.numel() == t.numel() && b.bytes() == &t.bytes()[..]
    };
    match (got, want) {
        (Output::Buffers(b), Output::Tensor(t)) => b.len() == 1 && eq(&b[0], t),
        (Output::Buffers(b), Output::Tensors(ts)) => {
            b.len() == ts.len() && b.iter().zip(ts).all(|(b, t)| eq(b, t))
        }
        (Output::Buffers(b), Output::None) => b.is_empty(),
        _ => false,
    }
}

fn run(case: &Case, seed: u64) -> Result<(), String> {
    let opts = GroupOptions {
        segment_bytes: 4096,
        ..GroupOptions::default()
    };
    let mut sim = Sim::with_options(case.size, seed, opts.clone());
    let call = CallOptions {
        algorithm: case.algorithm,
        timeout: None,
    };
    let mut ids = Vec::new();
    for r in 0..case.size {
        let info = sim.group(r, GroupId::WORLD).map_err(|e| e.to_string())?;
        let want = case.expected(r);
        let dest = Destination::new(buffers_for(case, r, &want));
        let plan = Plan::new(case.request(r), &info, &call)
            .and_then(|p| p.writing_into(&dest))
            .map_err(|e| format!("{case:?}: rank {r}: {e}"))?;
        let id = sim
            .submit_plan(r, GroupId::WORLD, plan)
            .map_err(|e| format!("{case:?}: rank {r}: {e}"))?;
        ids.push((id, want));
    }
    sim.run_no_timeouts(10_000_000)
        .map_err(|e| format!("{case:?} seed {seed}: {e:?}"))?;
    for (r, (id, want)) in ids.into_iter().enumerate() {
        let got = sim
            .take(r, id)
            .ok_or_else(|| format!("{case:?}: rank {r} has no result"))?
            .map_err(|e| format!("{case:?} seed {seed}: rank {r} failed: {e}"))?;
        if !same(&got, &want) {
            return Err(format!(
                "{case:?} seed {seed}: rank {r} got {got:?}, want {want:?}"
            ));
        }
    }
    Ok(())
}

fn sweep(counts_of: impl Fn(usize) -> Vec<usize>, dtypes: &[DType]) -> usize {
    let mut n = 0;
    let mut seed = 7u64;
    for kind in COLLECTIVES {
        if kind == OpKind::Barrier {
            continue;
        }
        for &alg in kind.algorithms() {
            for w in [1, 2, 3, 4, 5, 8] {
                for count in counts_of(w) {
                    for &dtype in dtypes {
                        let ops: Vec<ReduceOp> = if reduces(kind) {
                            [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max]
                                .into_iter()
                                .filter(|op| op.check(dtype).is_ok())
                                .collect()
                        } else {
                            vec![ReduceOp::Sum]
                        };
                        for op in ops {
                            let root = if rooted(kind) { (count + w / 2) % w } else { 0 };
                            let case = Case {
                                kind,
                                size: w,
                                count,
                                dtype,
                                op,
                                root,
                                algorithm: Some(alg),
                            };
                            seed = seed
                                .wrapping_mul(6364136223846793005)
                                .wrapping_add(1442695040888963407);
                            if let Err(e) = run(&case, seed) {
                                panic!("{e}");
                            }
                            n += 1;
                        }
                    }
                }
            }
        }
    }
    n
}

#[test]
fn every_collective_writes_into_caller_buffers_exactly() {
    let n = sweep(
        |w| vec![0, 1, w + 1, 1000],
        &[DType::F32, DType::BF16, DType::I64, DType::Bool],
    );
    assert!(n > 1000, "{n} cases");
}

#[test]
fn large_pipelined_calls_write_into_caller_buffers_exactly() {
    // 4096-byte segments: thousands of chunks, each written out after its last step.
    let n = sweep(|_| vec![65_539], &[DType::F32]);
    assert!(n > 50, "{n} cases");
}

fn plan_into(kind: OpKind, w: usize, bufs: Vec<Buffer>) -> Result<Plan, Error> {
    let sim = Sim::new(w, 1);
    let info = sim.group(0, GroupId::WORLD)?;
    let case = Case {
        kind,
        size: w,
        count: 4,
        dtype: DType::F32,
        op: ReduceOp::Sum,
        root: 0,
        algorithm: None,
    };
    Plan::new(case.request(0), &info, &CallOptions::default())?
        .writing_into(&Destination::new(bufs))
}

#[test]
fn a_destination_of_the_wrong_size_dtype_or_count_is_refused() {
    let f32s = |n: usize| Buffer::zeros(&[n], DType::F32).unwrap_or_else(|e| panic!("{e}"));
    // all_gather_into_tensor over 3 ranks of 4 elements writes 12.
    assert!(plan_into(OpKind::AllGatherIntoTensor, 3, vec![f32s(12)]).is_ok());
    let cases = [
        (
            OpKind::AllGatherIntoTensor,
            vec![f32s(11)],
            "holds 11 float32 elements",
        ),
        (
            OpKind::AllGatherIntoTensor,
            vec![Buffer::zeros(&[12], DType::F64).unwrap_or_else(|e| panic!("{e}"))],
            "holds float64",
        ),
        (OpKind::AllGatherIntoTensor, vec![], "writes 1 output"),
        (
            OpKind::AllGather,
            vec![f32s(4), f32s(4)],
            "writes 3 outputs",
        ),
        (
            OpKind::ReduceScatterTensor,
            vec![f32s(12)],
            "writes 4 there",
        ),
    ];
    for (kind, bufs, text) in cases {
        match plan_into(kind, 3, bufs) {
            Err(Error::InvalidArgument(m)) => assert!(m.contains(text), "{kind:?}: {m}"),
            other => panic!("{kind:?}: {other:?}"),
        }
    }
    // The shape is the buffer's own: [3, 4] holds the 12 elements as well as [12].
    let shaped = Buffer::zeros(&[3, 4], DType::F32).unwrap_or_else(|e| panic!("{e}"));
    assert!(plan_into(OpKind::AllGatherIntoTensor, 3, vec![shaped]).is_ok());
}

#[test]
fn a_failed_call_leaves_the_buffers_in_the_destination() {
    // Rank 1 never calls: rank 0's call times out, and its buffers stay in the destination
    // for its handle to hand back, in their declared shape and dtype.
    let mut sim = Sim::new(2, 3);
    let info = sim
        .group(0, GroupId::WORLD)
        .unwrap_or_else(|e| panic!("{e}"));
    let dest = Destination::new(vec![Buffer::from_slice(&[1.0f32, 2.0, 3.0])]);
    let req = collectix_runtime::Request::AllReduce {
        tensor: collectix_runtime::Tensor::from_vec(vec![1.0f32, 2.0, 3.0]),
        op: ReduceOp::Sum,
    };
    let opts = CallOptions {
        timeout: Some(std::time::Duration::from_millis(20)),
        ..Default::default()
    };
    let plan = Plan::new(req, &info, &opts)
        .and_then(|p| p.writing_into(&dest))
        .unwrap_or_else(|e| panic!("{e}"));
    let id = sim
        .submit_plan(0, GroupId::WORLD, plan)
        .unwrap_or_else(|e| panic!("{e}"));
    drop(sim.run(1_000_000));
    assert!(matches!(sim.take(0, id), Some(Err(_))));
    let back = dest.take().unwrap_or_default();
    assert_eq!(back.len(), 1);
    assert_eq!(back[0].to_vec::<f32>().ok(), Some(vec![1.0, 2.0, 3.0]));
}

#[test]
fn a_direct_all_reduce_in_segments_gives_the_bits_of_one_segment() {
    // Values whose sums round: the order of additions shows in the bits. One segment per
    // block (the default 1 MiB) against 4 KiB segments, into caller buffers.
    let w = 4;
    let n = 10_000;
    let opts = GroupOptions {
        segment_bytes: 4096,
        ..GroupOptions::default()
    };
    let call = CallOptions {
        algorithm: Some(collectix_runtime::Algorithm::Direct),
        timeout: None,
    };
    let input = |r: usize| {
        collectix_runtime::Tensor::from_vec(
            (0..n)
                .map(|i| ((i * 7919 + r * 104_729) % 1000) as f32 * 0.001_37 + 0.1 / (r + 1) as f32)
                .collect::<Vec<f32>>(),
        )
    };
    let mut plain = Sim::new(w, 3);
    let mut into = Sim::with_options(w, 3, opts);
    let mut ids = Vec::new();
    for r in 0..w {
        let req = || collectix_runtime::Request::AllReduce {
            tensor: input(r),
            op: ReduceOp::Sum,
        };
        let a = plain.submit(r, GroupId::WORLD, req(), &call);
        let info = into
            .group(r, GroupId::WORLD)
            .unwrap_or_else(|e| panic!("{e}"));
        let dest = Destination::new(vec![
            Buffer::zeros(&[n], DType::F32).unwrap_or_else(|e| panic!("{e}"))
        ]);
        let plan = Plan::new(req(), &info, &call)
            .and_then(|p| p.writing_into(&dest))
            .unwrap_or_else(|e| panic!("{e}"));
        let segments = plan.schedule().map_or(0, |s| s.layout.chunk_elems.len());
        assert!(segments > w, "in segments: {segments} chunks");
        let b = into.submit_plan(r, GroupId::WORLD, plan);
        ids.push((
            a.unwrap_or_else(|e| panic!("{e}")),
            b.unwrap_or_else(|e| panic!("{e}")),
        ));
    }
    assert_eq!(plain.run_no_timeouts(1_000_000), Ok(()));
    assert_eq!(into.run_no_timeouts(1_000_000), Ok(()));
    for (r, (a, b)) in ids.into_iter().enumerate() {
        let want = match plain.take(r, a) {
            Some(Ok(Output::Tensor(t))) => t,
            other => panic!("rank {r}: {other:?}"),
        };
        match into.take(r, b) {
            Some(Ok(Output::Buffers(v))) => assert_eq!(v[0].bytes(), &want.bytes()[..], "rank {r}"),
            other => panic!("rank {r}: {other:?}"),
        }
    }
}
