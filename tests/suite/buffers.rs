//! Caller-owned buffers (`Communicator::buffers`), driven as users drive ranks: every
//! collective's buffer form gives exactly what its tensor form gives, in one process and over
//! TCP, all ranks at once and skewed; and each buffer rule holds: a buffer of the wrong size
//! or dtype is refused before anything is sent (the others hear at once, and the group goes
//! on), a failed call hands its buffers back, the in-place gather reads its input from the
//! buffer, and nothing the caller keeps aliases what a call writes.

use crate::common;
use collectix::{
    Buffer, Communicator, DType, Error, Failed, GroupOptions, ReduceOp, Tensor, TensorSpec, World,
};
use common::{on_every_rank, tcp_job};
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_secs(30);
/// A hang guard, far above what a told rank takes.
const TOLD: Duration = Duration::from_secs(5);

fn vals(rank: usize, salt: usize, n: usize) -> Tensor {
    Tensor::from_vec(
        (0..n)
            .map(|i| ((rank * 7 + salt * 3 + i) % 11) as f32 - 5.0)
            .collect::<Vec<f32>>(),
    )
}

fn same(b: &Buffer, t: &Tensor, what: &str) -> Result<(), String> {
    if b.dtype() == t.dtype() && b.bytes() == &t.bytes()[..] {
        Ok(())
    } else {
        Err(format!(
            "{what}: buffer {:?} vs tensor {t:?}",
            b.to_tensor()
        ))
    }
}

fn all_same(b: &[Buffer], t: &[Tensor], what: &str) -> Result<(), String> {
    if b.len() != t.len() {
        return Err(format!("{what}: {} buffers, {} tensors", b.len(), t.len()));
    }
    b.iter().zip(t).try_for_each(|(b, t)| same(b, t, what))
}

fn buf(t: &Tensor) -> Buffer {
    Buffer::from_tensor(t).unwrap_or_else(|e| panic!("{e}"))
}

fn zeros(n: usize) -> Buffer {
    Buffer::zeros(&[n], DType::F32).unwrap_or_else(|e| panic!("{e}"))
}

/// Every buffer form against its tensor form, on one rank of `c`'s group (every rank runs
/// this, in the same order).
fn every_form(c: &Communicator, skew: bool) -> Result<(), String> {
    let (w, r) = (c.size(), c.rank());
    let e = |e: Failed| format!("rank {r}: {e}");
    let t = |e: Error| format!("rank {r}: {e}");
    let pause = || {
        if skew {
            std::thread::sleep(Duration::from_millis((r as u64 * 3) % 7));
        }
    };
    let n = 5;
    for (salt, op) in [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max]
        .into_iter()
        .enumerate()
    {
        let x = vals(r, salt, 1000 + salt);
        pause();
        let got = c.buffers().all_reduce(buf(&x), op).wait().map_err(e)?;
        same(
            &got,
            &c.all_reduce(x.clone(), op).wait().map_err(t)?,
            "all_reduce",
        )?;
        let got = c.buffers().reduce(buf(&x), w - 1, op).wait().map_err(e)?;
        same(&got, &c.reduce(x, w - 1, op).wait().map_err(t)?, "reduce")?;
    }
    let x = vals(r, 9, n);
    pause();
    let src = 1 % w;
    let got = c.buffers().broadcast(buf(&x), src).wait().map_err(e)?;
    same(
        &got,
        &c.broadcast(x.clone(), src).wait().map_err(t)?,
        "broadcast",
    )?;

    let specs = vec![TensorSpec::new(&[n], DType::F32); w];
    let got = c
        .buffers()
        .all_gather(vec![zeros(n); w], x.clone())
        .wait()
        .map_err(e)?;
    all_same(
        &got,
        &c.all_gather(specs, x.clone()).wait().map_err(t)?,
        "all_gather",
    )?;

    let spec = TensorSpec::new(&[w * n], DType::F32);
    let want = c
        .all_gather_into_tensor(spec, x.clone())
        .wait()
        .map_err(t)?;
    let got = c
        .buffers()
        .all_gather_into_tensor(zeros(w * n), x.clone())
        .wait()
        .map_err(e)?;
    same(&got, &want, "all_gather_into_tensor")?;
    // In place: this rank's shard is its slice of the flat buffer; the rest is garbage.
    let mut flat = Buffer::from_slice(&vec![f32::NAN; w * n]);
    flat.as_mut_slice::<f32>()
        .map_err(t)?
        .get_mut(r * n..(r + 1) * n)
        .ok_or("slice")?
        .copy_from_slice(x.as_slice::<f32>().map_err(t)?);
    pause();
    let got = c
        .buffers()
        .all_gather_into_tensor_in_place(flat)
        .wait()
        .map_err(e)?;
    same(&got, &want, "all_gather_into_tensor in place")?;

    let list = (r == 0).then(|| vec![zeros(n); w]);
    let got = c.buffers().gather(x.clone(), list, 0).wait().map_err(e)?;
    match (got, c.gather(x.clone(), 0).wait().map_err(t)?) {
        (Some(g), Some(want)) => all_same(&g, &want, "gather")?,
        (None, None) => {}
        (g, want) => return Err(format!("gather: {g:?} vs {want:?}")),
    }

    let inputs: Vec<Tensor> = (0..w).map(|k| vals(r, 20 + k, n)).collect();
    let scatter_list = (r == 0).then(|| inputs.clone());
    let mine = TensorSpec::new(&[n], DType::F32);
    let got = c
        .buffers()
        .scatter(zeros(n), scatter_list.clone(), 0)
        .wait()
        .map_err(e)?;
    same(
        &got,
        &c.scatter(mine, scatter_list, 0).wait().map_err(t)?,
        "scatter",
    )?;

    let blocks: Vec<Tensor> = (0..w).map(|k| vals(r, 40 + k, n)).collect();
    let got = c
        .buffers()
        .reduce_scatter(zeros(n), blocks.clone(), ReduceOp::Sum)
        .wait()
        .map_err(e)?;
    same(
        &got,
        &c.reduce_scatter(blocks, ReduceOp::Sum).wait().map_err(t)?,
        "reduce_scatter",
    )?;
    let whole = vals(r, 50, w * n);
    let got = c
        .buffers()
        .reduce_scatter_tensor(zeros(n), whole.clone(), ReduceOp::Avg)
        .wait()
        .map_err(e)?;
    let spec = TensorSpec::new(&[n], DType::F32);
    let want = c
        .reduce_scatter_tensor(spec, whole, ReduceOp::Avg)
        .wait()
        .map_err(t)?;
    same(&got, &want, "reduce_scatter_tensor")?;

    // all_to_all: rank r sends r + k + 1 elements to rank k.
    let ins: Vec<Tensor> = (0..w).map(|k| vals(r, 60 + k, r + k + 1)).collect();
    let outs: Vec<Buffer> = (0..w).map(|k| zeros(k + r + 1)).collect();
    let specs = (0..w)
        .map(|k| TensorSpec::new(&[k + r + 1], DType::F32))
        .collect();
    let got = c
        .buffers()
        .all_to_all(outs, ins.clone())
        .wait()
        .map_err(e)?;
    all_same(
        &got,
        &c.all_to_all(specs, ins).wait().map_err(t)?,
        "all_to_all",
    )?;
    let in_splits: Vec<usize> = (0..w).map(|k| r + k + 1).collect();
    let out_splits: Vec<usize> = (0..w).map(|k| k + r + 1).collect();
    let total_in: usize = in_splits.iter().sum();
    let total_out: usize = out_splits.iter().sum();
    let x = vals(r, 70, total_in);
    let got = c
        .buffers()
        .all_to_all_single(
            zeros(total_out),
            x.clone(),
            Some(out_splits.clone()),
            Some(in_splits.clone()),
        )
        .wait()
        .map_err(e)?;
    let spec = TensorSpec::new(&[total_out], DType::F32);
    let want = c
        .all_to_all_single(spec, x, Some(out_splits), Some(in_splits))
        .wait()
        .map_err(t)?;
    same(&got, &want, "all_to_all_single")?;

    if w > 1 {
        // A ring of point-to-point messages, received into buffers.
        let to = (r + 1) % w;
        let from = (r + w - 1) % w;
        let sent = c.send(vals(r, 80, n), to, 5);
        let (got, sender) = c
            .buffers()
            .recv(zeros(n), Some(from), 5)
            .wait()
            .map_err(e)?;
        sent.wait().map_err(t)?;
        if sender != from {
            return Err(format!("recv from {sender}, not {from}"));
        }
        same(&got, &vals(from, 80, n), "recv")?;
    }
    Ok(())
}

fn in_process(w: usize, skew: bool) -> Vec<Result<(), String>> {
    on_every_rank(w, TIMEOUT, |c| every_form(c, skew))
}

#[test]
fn every_buffer_form_matches_its_tensor_form_in_one_process() {
    for w in [1, 2, 3, 4] {
        for skew in [false, true] {
            for (r, res) in in_process(w, skew).into_iter().enumerate() {
                assert_eq!(res, Ok(()), "W={w} skew={skew} rank {r}");
            }
        }
    }
}

#[test]
fn every_buffer_form_matches_its_tensor_form_over_tcp() {
    let secret = "the buffers tests' secret";
    let results = tcp_job(3, secret, TIMEOUT, |_, p| {
        every_form(p.communicator(), true)
    });
    for (r, res) in results.into_iter().enumerate() {
        assert_eq!(res, Ok(()), "rank {r}");
    }
}

#[test]
fn a_buffer_of_the_wrong_size_or_dtype_is_refused_before_anything_is_sent() {
    let world = World::local_with(3, GroupOptions::default().with_timeout(TIMEOUT))
        .unwrap_or_else(|e| panic!("{e}"));
    let c = world.communicators();
    let bad = [
        zeros(11),                                                           // 12 needed
        Buffer::zeros(&[12], DType::BF16).unwrap_or_else(|e| panic!("{e}")), // f32 needed
    ];
    for (i, b) in bad.into_iter().enumerate() {
        let start = Instant::now();
        let before = b.clone();
        // Rank 0's buffer is wrong; ranks 1 and 2 call correctly.
        let w0 = c[0].buffers().all_gather_into_tensor(b, vals(0, 0, 4));
        let others: Vec<_> = (1..3)
            .map(|r| {
                c[r].buffers()
                    .all_gather_into_tensor(zeros(12), vals(r, 0, 4))
            })
            .collect();
        match w0.wait() {
            Err(Failed {
                error: Error::InvalidArgument(m),
                buffers,
            }) => {
                assert!(m.contains("11") || m.contains("bfloat16"), "{m}");
                assert_eq!(buffers, vec![before], "the buffer comes back unchanged");
            }
            other => panic!("case {i}: rank 0 got {other:?}"),
        }
        for (k, w) in others.into_iter().enumerate() {
            match w.wait() {
                Err(Failed {
                    error: Error::CallFailed { rank: 0, .. },
                    buffers,
                }) => assert_eq!(buffers.len(), 1),
                other => panic!("case {i}: rank {} got {other:?}", k + 1),
            }
        }
        assert!(start.elapsed() < TOLD, "the others heard at once");
        // The group goes on: the next call is the next on every rank.
        let sums: Vec<_> = c
            .iter()
            .map(|x| {
                x.buffers()
                    .all_reduce(Buffer::from_slice(&[1.0f32]), ReduceOp::Sum)
            })
            .collect();
        for s in sums {
            assert_eq!(
                s.wait().ok().and_then(|b| b.to_vec::<f32>().ok()),
                Some(vec![3.0])
            );
        }
    }
}

#[test]
fn an_in_place_gather_of_a_buffer_that_does_not_split_evenly_is_refused() {
    let world = World::local(2).unwrap_or_else(|e| panic!("{e}"));
    let c = world.communicators();
    let works: Vec<_> = c
        .iter()
        .map(|x| x.buffers().all_gather_into_tensor_in_place(zeros(5)))
        .collect();
    for w in works {
        match w.wait() {
            Err(Failed { error, buffers }) => {
                assert!(
                    matches!(&error, Error::InvalidArgument(m) if m.contains("multiple of 2"))
                        || matches!(error, Error::CallFailed { .. }),
                    "{error}"
                );
                assert_eq!(buffers, vec![zeros(5)]);
            }
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn a_call_that_fails_midway_hands_its_buffers_back() {
    // Rank 1 never makes the call: rank 0's times out, and its buffer comes back with the
    // error, its dtype and size intact; each element is its old value or a result.
    let world = World::local_with(
        2,
        GroupOptions::default().with_timeout(Duration::from_millis(200)),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let c = world.communicators();
    let old = Buffer::from_slice(&[1.0f32, 2.0, 3.0, 4.0]);
    match c[0].buffers().all_reduce(old.clone(), ReduceOp::Sum).wait() {
        Err(Failed { error, buffers }) => {
            assert!(
                matches!(error.root_cause(), Error::Timeout { .. }),
                "{error}"
            );
            assert_eq!(buffers.len(), 1);
            assert_eq!(
                (buffers[0].dtype(), buffers[0].shape()),
                (DType::F32, &[4][..])
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_peer_that_disagrees_midway_fails_the_call_and_the_buffers_come_back() {
    // The ranks disagree on the op: a mismatch, found when their messages meet.
    let world = World::local_with(2, GroupOptions::default().with_timeout(TIMEOUT))
        .unwrap_or_else(|e| panic!("{e}"));
    let c = world.communicators();
    let a = c[0].buffers().all_reduce(zeros(64), ReduceOp::Sum);
    let b = c[1].buffers().all_reduce(zeros(64), ReduceOp::Max);
    for w in [a, b] {
        match w.wait() {
            Err(Failed { error, buffers }) => {
                assert!(
                    matches!(error.root_cause(), Error::Mismatch { .. }),
                    "{error}"
                );
                assert_eq!(
                    buffers,
                    vec![zeros(64)],
                    "all zeros: old values and results agree"
                );
            }
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn what_the_caller_keeps_never_aliases_what_a_call_writes() {
    // The input of an out-of-place call is a tensor made from the buffer: a copy. Writing the
    // buffer after the call was issued changes neither the call's input nor its result.
    let world = World::local(2).unwrap_or_else(|e| panic!("{e}"));
    let c = world.communicators();
    let works: Vec<_> = c
        .iter()
        .map(|x| {
            let mut b = Buffer::from_slice(&[x.rank() as f32 + 1.0; 4]);
            let input = b.to_tensor().unwrap_or_else(|e| panic!("{e}"));
            let work = x.buffers().all_gather_into_tensor(zeros(8), input.clone());
            if let Ok(s) = b.as_mut_slice::<f32>() {
                s.fill(-1.0);
            }
            (work, input, x.rank() as f32 + 1.0)
        })
        .collect();
    for (w, input, mine) in works {
        let got = w.wait().map(|b| b.to_vec::<f32>().unwrap_or_default());
        assert_eq!(got.ok(), Some(vec![1.0, 1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 2.0]));
        assert_eq!(
            input.to_vec::<f32>().ok(),
            Some(vec![mine; 4]),
            "the input is a copy"
        );
    }
}

#[test]
fn ranks_may_mix_buffer_and_tensor_forms_of_one_call() {
    // Where each rank's result goes is its own business: a direct all_reduce of 4 MiB blocks
    // (in 1 MiB segments) with rank 0 on a buffer and rank 1 on tensors completes on both.
    let world = World::local_with(2, GroupOptions::default().with_timeout(TIMEOUT))
        .unwrap_or_else(|e| panic!("{e}"));
    let c = world.communicators();
    let direct = collectix::CallOptions {
        algorithm: Some(collectix::Algorithm::Direct),
        timeout: None,
    };
    let n = 2 << 20;
    let x = |r: usize| vals(r, 3, n);
    let a = c[0]
        .buffers()
        .with_options(&direct)
        .all_reduce(buf(&x(0)), ReduceOp::Sum);
    let b = c[1].all_reduce_with(x(1), ReduceOp::Sum, &direct);
    let got_a = a.wait().unwrap_or_else(|e| panic!("{e}"));
    let got_b = b.wait().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(got_a.bytes(), &got_b.bytes()[..]);
}

#[test]
fn a_buffer_call_can_be_awaited() {
    let world = World::local(2).unwrap_or_else(|e| panic!("{e}"));
    let c = world.communicators();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let got = rt.block_on(async {
        let a = c[0]
            .buffers()
            .all_reduce(Buffer::from_slice(&[1i64]), ReduceOp::Sum);
        let b = c[1]
            .buffers()
            .all_reduce(Buffer::from_slice(&[2i64]), ReduceOp::Sum);
        (a.await, b.await)
    });
    assert_eq!(
        got.0.ok().and_then(|b| b.to_vec::<i64>().ok()),
        Some(vec![3])
    );
    assert_eq!(
        got.1.ok().and_then(|b| b.to_vec::<i64>().ok()),
        Some(vec![3])
    );
}
