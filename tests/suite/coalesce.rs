//! Coalesced calls through rank actors, as users make them: a list of tensors as one call
//! (`all_reduce_coalesced`, `all_gather_into_tensor_coalesced`,
//! `reduce_scatter_tensor_coalesced`, on tensors and on caller buffers) gives what the calls
//! one by one give, in one process (W = 1–4, all at once and skewed) and over TCP; a list that
//! cannot be one call (mixed dtypes, no tensors, a tensor that does not split) is refused on
//! its rank and heard at once by the others, and the group goes on.

use crate::common;
use collectix::{
    Buffer, Communicator, DType, Error, Failed, GroupOptions, ReduceOp, Tensor, World,
};
use common::{on_every_rank, tcp_job};
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(30);

/// Rank `r`'s tensor `i` of `n` elements: small integers, exact in any order of additions.
fn input(r: usize, i: usize, n: usize) -> Tensor {
    Tensor::from_vec(
        (0..n)
            .map(|k| ((r * 5 + i * 3 + k) % 7) as f32 - 3.0)
            .collect::<Vec<f32>>(),
    )
}

fn bytes_eq(a: &[u8], b: &[u8], what: &str) -> Result<(), String> {
    if a == b {
        Ok(())
    } else {
        Err(format!("{what}: differs"))
    }
}

/// Every coalesced form against the calls one by one, on one rank (every rank runs this).
fn every_form(c: &Communicator, skew: bool) -> Result<(), String> {
    let (w, r) = (c.size(), c.rank());
    let t = |e: Error| format!("rank {r}: {e}");
    let f = |e: Failed| format!("rank {r}: {e}");
    if skew {
        std::thread::sleep(Duration::from_millis((r as u64 * 5) % 9));
    }
    let counts = [3 * w, 0, 700 * w, w];
    let list: Vec<Tensor> = counts
        .iter()
        .enumerate()
        .map(|(i, &n)| input(r, i, n))
        .collect();
    // One by one, for reference.
    let mut sums = Vec::new();
    let mut gathered = Vec::new();
    let mut scattered = Vec::new();
    for x in &list {
        sums.push(c.all_reduce(x.clone(), ReduceOp::Avg).wait().map_err(t)?);
        let spec = collectix::TensorSpec::new(&[w * x.numel()], DType::F32);
        gathered.push(
            c.all_gather_into_tensor(spec, x.clone())
                .wait()
                .map_err(t)?,
        );
        let spec = collectix::TensorSpec::new(&[x.numel() / w], DType::F32);
        scattered.push(
            c.reduce_scatter_tensor(spec, x.clone(), ReduceOp::Sum)
                .wait()
                .map_err(t)?,
        );
    }
    // Tensor forms.
    let got = c
        .all_reduce_coalesced(list.clone(), ReduceOp::Avg)
        .wait()
        .map_err(t)?;
    for (i, (g, want)) in got.iter().zip(&sums).enumerate() {
        bytes_eq(
            g.bytes(),
            want.bytes(),
            &format!("all_reduce_coalesced {i}"),
        )?;
        if g.shape() != want.shape() {
            return Err(format!("all_reduce_coalesced {i}: shape {:?}", g.shape()));
        }
    }
    let got = c
        .all_gather_into_tensor_coalesced(list.clone())
        .wait()
        .map_err(t)?;
    for (i, (g, want)) in got.iter().zip(&gathered).enumerate() {
        bytes_eq(
            g.bytes(),
            want.bytes(),
            &format!("all_gather_into_tensor_coalesced {i}"),
        )?;
    }
    let got = c
        .reduce_scatter_tensor_coalesced(list.clone(), ReduceOp::Sum)
        .wait()
        .map_err(t)?;
    for (i, (g, want)) in got.iter().zip(&scattered).enumerate() {
        bytes_eq(
            g.bytes(),
            want.bytes(),
            &format!("reduce_scatter_tensor_coalesced {i}"),
        )?;
    }
    // Buffer forms.
    let bufs: Vec<Buffer> = list
        .iter()
        .map(|x| Buffer::from_tensor(x).unwrap_or_else(|e| panic!("{e}")))
        .collect();
    let got = c
        .buffers()
        .all_reduce_coalesced(bufs, ReduceOp::Avg)
        .wait()
        .map_err(f)?;
    for (i, (g, want)) in got.iter().zip(&sums).enumerate() {
        bytes_eq(
            g.bytes(),
            want.bytes(),
            &format!("buffers all_reduce_coalesced {i}"),
        )?;
    }
    let zeros = |n: usize| Buffer::zeros(&[n], DType::F32).unwrap_or_else(|e| panic!("{e}"));
    let outs = counts.iter().map(|&n| zeros(w * n)).collect();
    let got = c
        .buffers()
        .all_gather_into_tensor_coalesced(outs, list.clone())
        .wait()
        .map_err(f)?;
    for (i, (g, want)) in got.iter().zip(&gathered).enumerate() {
        bytes_eq(
            g.bytes(),
            want.bytes(),
            &format!("buffers all_gather_into_tensor_coalesced {i}"),
        )?;
    }
    let outs = counts.iter().map(|&n| zeros(n / w)).collect();
    let got = c
        .buffers()
        .reduce_scatter_tensor_coalesced(outs, list, ReduceOp::Sum)
        .wait()
        .map_err(f)?;
    for (i, (g, want)) in got.iter().zip(&scattered).enumerate() {
        bytes_eq(
            g.bytes(),
            want.bytes(),
            &format!("buffers reduce_scatter_tensor_coalesced {i}"),
        )?;
    }
    Ok(())
}

#[test]
fn every_coalesced_form_matches_the_calls_one_by_one_in_one_process() {
    for w in 1..=4 {
        for skew in [false, true] {
            let results = on_every_rank(w, TIMEOUT, |c| every_form(c, skew));
            for (r, res) in results.into_iter().enumerate() {
                assert_eq!(res, Ok(()), "W={w} skew={skew} rank {r}");
            }
        }
    }
}

#[test]
fn every_coalesced_form_matches_the_calls_one_by_one_over_tcp() {
    let results = tcp_job(3, "the coalesce tests' secret", TIMEOUT, |_, p| {
        every_form(p.communicator(), true)
    });
    for (r, res) in results.into_iter().enumerate() {
        assert_eq!(res, Ok(()), "rank {r}");
    }
}

#[test]
fn a_list_that_cannot_be_one_call_is_refused_and_heard_at_once() {
    let world = World::local_with(2, GroupOptions::default().with_timeout(TIMEOUT))
        .unwrap_or_else(|e| panic!("{e}"));
    let c = world.communicators();
    let f32s = Tensor::from_vec(vec![1.0f32; 4]);
    let i64s = Tensor::from_vec(vec![1i64; 4]);
    let bad: [(Vec<Tensor>, &str); 2] = [
        (vec![f32s.clone(), i64s], "one call moves one dtype"),
        (vec![], "no tensors"),
    ];
    for (list, why) in bad {
        let start = std::time::Instant::now();
        let w0 = c[0].all_reduce_coalesced(list, ReduceOp::Sum);
        let w1 = c[1].all_reduce_coalesced(vec![f32s.clone(), f32s.clone()], ReduceOp::Sum);
        match w0.wait() {
            Err(Error::InvalidArgument(m)) => assert!(m.contains(why), "{m}"),
            other => panic!("rank 0: {other:?}"),
        }
        assert!(matches!(w1.wait(), Err(Error::CallFailed { rank: 0, .. })));
        assert!(start.elapsed() < Duration::from_secs(5), "heard at once");
    }
    // A tensor of 3 elements does not split over 2 ranks.
    let odd = Tensor::from_vec(vec![1.0f32; 3]);
    let w0 = c[0].reduce_scatter_tensor_coalesced(vec![odd], ReduceOp::Sum);
    let w1 = c[1].reduce_scatter_tensor_coalesced(vec![f32s.clone()], ReduceOp::Sum);
    assert!(matches!(w0.wait(), Err(Error::InvalidArgument(m)) if m.contains("split")));
    assert!(matches!(w1.wait(), Err(Error::CallFailed { .. })));
    // The group goes on.
    let next: Vec<_> = c
        .iter()
        .map(|x| x.all_reduce_coalesced(vec![f32s.clone()], ReduceOp::Sum))
        .collect();
    for n in next {
        let got = n
            .wait()
            .ok()
            .and_then(|v| v.first().and_then(|t| t.to_vec::<f32>().ok()));
        assert_eq!(got, Some(vec![2.0; 4]));
    }
}
