//! In-process ranks share one output buffer where a call's output can be shared (direct
//! all_reduce and all_gather_into_tensor write each rank's block into one arena, a split
//! reduce each rank's reduced block into the root's; see
//! `runtime/src/tensor/arena.rs`): the values must be every rank's right answer, the memory
//! one buffer, and an output kept while later calls run must never change.

use collectix::{Algorithm, CallOptions, DType, ReduceOp, Tensor, TensorSpec, World};

fn direct() -> CallOptions {
    CallOptions {
        algorithm: Some(Algorithm::Direct),
        timeout: None,
    }
}

fn input(rank: usize, call: usize, n: usize) -> Tensor {
    Tensor::from_vec(
        (0..n)
            .map(|i| ((rank * 7 + call * 3 + i) % 13) as f32)
            .collect::<Vec<_>>(),
    )
}

/// Waits for every rank's output: each holds `want`, all in the same memory.
fn one_buffer_holding(works: Vec<collectix::Work<Tensor>>, want: &[f32]) {
    let outs: Vec<Tensor> = works
        .into_iter()
        .map(|wk| wk.wait().unwrap_or_else(|e| panic!("{e}")))
        .collect();
    for o in &outs {
        assert_eq!(o.to_vec::<f32>().ok().as_deref(), Some(want));
        assert_eq!(o.bytes().as_ptr(), outs[0].bytes().as_ptr(), "one buffer");
    }
}

#[test]
fn ranks_of_one_process_get_one_buffer_holding_the_right_values() {
    let w = 4;
    let n = 1001; // blocks of 251, 250, 250, 250 elements
    let world = World::local(w).unwrap_or_else(|e| panic!("{e}"));
    let cs = world.communicators();
    let want: Vec<f32> = (0..n)
        .map(|i| (0..w).map(|r| ((r * 7 + i) % 13) as f32).sum())
        .collect();
    let works: Vec<_> = cs
        .iter()
        .enumerate()
        .map(|(r, c)| c.all_reduce_with(input(r, 0, n), ReduceOp::Sum, &direct()))
        .collect();
    one_buffer_holding(works, &want);

    let works: Vec<_> = cs
        .iter()
        .enumerate()
        .map(|(r, c)| {
            c.all_gather_into_tensor_with(
                TensorSpec::new(&[w * n], DType::F32),
                input(r, 0, n),
                &direct(),
            )
        })
        .collect();
    let gathered: Vec<f32> = (0..w)
        .flat_map(|r| input(r, 0, n).to_vec::<f32>().unwrap_or_default())
        .collect();
    one_buffer_holding(works, &gathered);
}

/// Outputs kept while 40 more calls run (whose arenas come from the same pool) keep their
/// values; calls in flight at once, issued in a different order on each rank's thread, each
/// get their own buffer; Avg's division makes a new buffer from the shared one.
#[test]
fn kept_outputs_never_change_while_later_calls_reuse_memory() {
    let w = 3;
    let n = 4099;
    let calls = 40;
    let world = World::local(w).unwrap_or_else(|e| panic!("{e}"));
    let cs = world.communicators();
    let kept: Vec<Vec<Tensor>> = std::thread::scope(|s| {
        let hs: Vec<_> = cs
            .iter()
            .enumerate()
            .map(|(r, c)| {
                s.spawn(move || {
                    let mut outs = Vec::new();
                    // Batches of 4 in flight; rank r waits on them in a rotated order.
                    for batch in (0..calls).collect::<Vec<_>>().chunks(4) {
                        let works: Vec<_> = batch
                            .iter()
                            .map(|&k| {
                                let op = if k % 5 == 4 {
                                    ReduceOp::Avg
                                } else {
                                    ReduceOp::Sum
                                };
                                c.all_reduce_with(input(r, k, n), op, &direct())
                            })
                            .collect();
                        let mut got: Vec<_> = works.into_iter().map(Some).collect();
                        let len = got.len();
                        let mut done = vec![None; len];
                        for i in 0..len {
                            let j = (i + r) % len;
                            if let Some(wk) = got[j].take() {
                                done[j] = Some(wk.wait().unwrap_or_else(|e| panic!("{e}")));
                            }
                        }
                        outs.extend(done.into_iter().flatten());
                    }
                    outs
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| panic!("a rank's thread panicked"))
            })
            .collect()
    });
    for (r, outs) in kept.iter().enumerate() {
        assert_eq!(outs.len(), calls);
        for (k, o) in outs.iter().enumerate() {
            let sum = |i: usize| -> f32 { (0..w).map(|q| ((q * 7 + k * 3 + i) % 13) as f32).sum() };
            let want: Vec<f32> = (0..n)
                .map(|i| {
                    if k % 5 == 4 {
                        sum(i) / w as f32
                    } else {
                        sum(i)
                    }
                })
                .collect();
            assert_eq!(o.to_vec::<f32>().ok(), Some(want), "rank {r}, call {k}");
        }
    }
}

/// A split reduce (`reduce_scatter_gather`): each rank reduces its block into the root's
/// output, so the root gets the reduction (Avg's division included) and every other rank
/// gets its own input back, untouched, in its own memory; rounds reuse the pool's buffers.
#[test]
fn a_split_reduce_gives_the_root_the_reduction_and_the_others_their_inputs() {
    let w = 4;
    let n = 1001; // blocks of 251, 250, 250, 250 elements
    let world = World::local(w).unwrap_or_else(|e| panic!("{e}"));
    let cs = world.communicators();
    let opts = CallOptions {
        algorithm: Some(Algorithm::ReduceScatterGather),
        timeout: None,
    };
    for (call, root, op) in [
        (0, 2, ReduceOp::Sum),
        (1, 0, ReduceOp::Avg),
        (2, 3, ReduceOp::Max),
    ] {
        let inputs: Vec<Tensor> = (0..w).map(|r| input(r, call, n)).collect();
        let works: Vec<_> = cs
            .iter()
            .zip(&inputs)
            .map(|(c, t)| c.reduce_with(t.clone(), root, op, &opts))
            .collect();
        let column = |i: usize| (0..w).map(move |r| ((r * 7 + call * 3 + i) % 13) as f32);
        let want: Vec<f32> = (0..n)
            .map(|i| match op {
                ReduceOp::Sum => column(i).sum(),
                ReduceOp::Avg => column(i).sum::<f32>() / w as f32,
                _ => column(i).fold(f32::MIN, f32::max),
            })
            .collect();
        for (r, wk) in works.into_iter().enumerate() {
            let out = wk.wait().unwrap_or_else(|e| panic!("{e}"));
            if r == root {
                assert_eq!(out.to_vec::<f32>().ok(), Some(want.clone()), "call {call}");
            } else {
                assert_eq!(out.to_vec::<f32>().ok(), inputs[r].to_vec::<f32>().ok());
                assert_eq!(
                    out.bytes().as_ptr(),
                    inputs[r].bytes().as_ptr(),
                    "its input"
                );
            }
        }
    }
}
