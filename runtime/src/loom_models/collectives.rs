//! Model group 1: every collective completes with the right result on every rank, under
//! every interleaving of its messages loom explores: each collective on 2 ranks and on 3,
//! each all_reduce algorithm, the other algorithms where a kind has two, pipelined
//! (one-element segments) ring and tree, and send/recv (FIFO per tag, any source).

use super::{assert_output, case_plan, check, plan, run_world, world, world_with, Script};
use crate::collective::{Output, Request, TensorSpec};
use crate::group::{GroupId, GroupOptions};
use crate::op::{Algorithm, OpKind};
use crate::tensor::dtype::DType;
use crate::tensor::reduce::ReduceOp;
use crate::tensor::Tensor;
use crate::testing::Case;

/// A case of `kind` over `size` ranks, `count` i32 elements, summed, rooted at `root`.
fn case(kind: OpKind, size: usize, count: usize, root: usize) -> Case {
    Case {
        kind,
        size,
        count,
        dtype: DType::I32,
        op: ReduceOp::Sum,
        root,
        algorithm: None,
    }
}

/// Runs `case` on its world, every rank calling at once, and checks every rank's result
/// against [`Case::expected`].
fn model(name: &str, case: Case) {
    model_with(name, case, GroupOptions::default());
}

/// [`model`] with group options `opts` (a small `segment_bytes` makes the pipelined
/// algorithms cut even 2–3 elements into one-element messages).
fn model_with(name: &str, case: Case, opts: GroupOptions) {
    let unit = if case.count == 1 {
        "element"
    } else {
        "elements"
    };
    let name = format!("{name} ({} ranks, {} {unit})", case.size, case.count);
    check(&name, move || {
        let n = case.size;
        let scripts = (0..n)
            .map(|r| {
                let info = world_with(n, r, opts.clone());
                let p = case_plan(&case, &info);
                Script::new(r).group(info).call(GroupId::WORLD, 0, p)
            })
            .collect();
        let results = run_world(scripts, Vec::new());
        for (r, res) in results.iter().enumerate() {
            assert_eq!(res.len(), 1, "rank {r}: one call, one result");
            assert_output(
                &format!("{:?} rank {r}", case.kind),
                &res[0],
                &case.expected(r),
            );
        }
    });
}

/// `case` with `alg` forced.
fn with(mut c: Case, alg: Algorithm) -> Case {
    c.algorithm = Some(alg);
    c
}

/// all_reduce, ring, 2 ranks.
#[test]
fn all_reduce_ring_2() {
    model(
        "all_reduce ring",
        with(case(OpKind::AllReduce, 2, 2, 0), Algorithm::Ring),
    );
}

/// all_reduce, halving-doubling, 2 ranks.
#[test]
fn all_reduce_halving_doubling_2() {
    let c = with(case(OpKind::AllReduce, 2, 2, 0), Algorithm::HalvingDoubling);
    model("all_reduce halving_doubling", c);
}

/// all_reduce, recursive doubling, 2 ranks.
#[test]
fn all_reduce_recursive_doubling_2() {
    let c = with(
        case(OpKind::AllReduce, 2, 2, 0),
        Algorithm::RecursiveDoubling,
    );
    model("all_reduce recursive_doubling", c);
}

/// all_reduce, ring, 3 ranks (one block per rank).
#[test]
fn all_reduce_ring_3() {
    model(
        "all_reduce ring",
        with(case(OpKind::AllReduce, 3, 3, 0), Algorithm::Ring),
    );
}

/// all_reduce, halving-doubling, 3 ranks (a non-power of two: one rank folds in first).
#[test]
fn all_reduce_halving_doubling_3() {
    let c = with(case(OpKind::AllReduce, 3, 2, 0), Algorithm::HalvingDoubling);
    model("all_reduce halving_doubling", c);
}

/// all_reduce, recursive doubling, 3 ranks (a non-power of two).
#[test]
fn all_reduce_recursive_doubling_3() {
    let c = with(
        case(OpKind::AllReduce, 3, 1, 0),
        Algorithm::RecursiveDoubling,
    );
    model("all_reduce recursive_doubling", c);
}

/// all_reduce of f32 with the product, 2 ranks.
#[test]
fn all_reduce_product_f32_2() {
    let mut c = case(OpKind::AllReduce, 2, 3, 0);
    c.dtype = DType::F32;
    c.op = ReduceOp::Product;
    model("all_reduce product f32", c);
}

/// broadcast from rank 1, default algorithm, 2 ranks.
#[test]
fn broadcast_2() {
    model("broadcast root 1", case(OpKind::Broadcast, 2, 2, 1));
}

/// broadcast from rank 2, direct, 3 ranks.
#[test]
fn broadcast_direct_3() {
    let c = with(case(OpKind::Broadcast, 3, 1, 2), Algorithm::Direct);
    model("broadcast direct root 2", c);
}

/// reduce to rank 0, default algorithm, 2 ranks.
#[test]
fn reduce_2() {
    model("reduce root 0", case(OpKind::Reduce, 2, 2, 0));
}

/// reduce to rank 1, binomial tree, 3 ranks.
#[test]
fn reduce_tree_3() {
    let c = with(case(OpKind::Reduce, 3, 1, 1), Algorithm::BinomialTree);
    model("reduce binomial_tree root 1", c);
}

/// all_gather (list form, uneven blocks), 2 ranks.
#[test]
fn all_gather_2() {
    model("all_gather", case(OpKind::AllGather, 2, 1, 0));
}

/// all_gather_into_tensor, 2 ranks.
#[test]
fn all_gather_into_tensor_2() {
    model(
        "all_gather_into_tensor",
        case(OpKind::AllGatherIntoTensor, 2, 2, 0),
    );
}

/// gather to rank 1, 2 ranks.
#[test]
fn gather_2() {
    model("gather root 1", case(OpKind::Gather, 2, 2, 1));
}

/// gather to rank 0, 3 ranks.
#[test]
fn gather_3() {
    model("gather root 0", case(OpKind::Gather, 3, 1, 0));
}

/// scatter from rank 0, 2 ranks.
#[test]
fn scatter_2() {
    model("scatter root 0", case(OpKind::Scatter, 2, 2, 0));
}

/// reduce_scatter (list form, uneven blocks), 2 ranks.
#[test]
fn reduce_scatter_2() {
    model("reduce_scatter", case(OpKind::ReduceScatter, 2, 1, 0));
}

/// reduce_scatter_tensor, 2 ranks.
#[test]
fn reduce_scatter_tensor_2() {
    model(
        "reduce_scatter_tensor",
        case(OpKind::ReduceScatterTensor, 2, 1, 0),
    );
}

/// all_to_all (list form, uneven sizes), 2 ranks.
#[test]
fn all_to_all_2() {
    model("all_to_all", case(OpKind::AllToAll, 2, 1, 0));
}

/// all_to_all_single with uneven splits, 2 ranks.
#[test]
fn all_to_all_single_2() {
    model("all_to_all_single", case(OpKind::AllToAllSingle, 2, 1, 0));
}

/// barrier, 2 ranks.
#[test]
fn barrier_2() {
    model("barrier", case(OpKind::Barrier, 2, 0, 0));
}

/// barrier (dissemination), 3 ranks.
#[test]
fn barrier_3() {
    let c = with(case(OpKind::Barrier, 3, 0, 0), Algorithm::Dissemination);
    model("barrier", c);
}

/// barrier (direct: rank 0 gathers and releases), 3 ranks.
#[test]
fn barrier_direct_3() {
    let c = with(case(OpKind::Barrier, 3, 0, 0), Algorithm::Direct);
    model("barrier direct", c);
}

/// One element per message: `segment_bytes` of one i32.
fn one_element_segments() -> GroupOptions {
    GroupOptions {
        segment_bytes: 4,
        ..GroupOptions::default()
    }
}

/// all_reduce, ring, 3 elements cut into one-element segments (pipelined), 2 ranks.
#[test]
fn all_reduce_ring_segmented_2() {
    let c = with(case(OpKind::AllReduce, 2, 3, 0), Algorithm::Ring);
    model_with(
        "all_reduce ring, 1-element segments",
        c,
        one_element_segments(),
    );
}

/// broadcast from rank 0, binomial tree, 3 one-element segments (pipelined), 3 ranks.
#[test]
fn broadcast_tree_segmented_3() {
    let c = with(case(OpKind::Broadcast, 3, 3, 0), Algorithm::BinomialTree);
    model_with(
        "broadcast binomial_tree root 0, 1-element segments",
        c,
        one_element_segments(),
    );
}

/// reduce to rank 2, direct, 3 ranks.
#[test]
fn reduce_direct_3() {
    let c = with(case(OpKind::Reduce, 3, 2, 2), Algorithm::Direct);
    model("reduce direct root 2", c);
}

/// all_reduce, reduce_broadcast (rank 0 reduces and sends the result back), 3 ranks.
#[test]
fn all_reduce_reduce_broadcast_3() {
    let c = with(case(OpKind::AllReduce, 3, 2, 0), Algorithm::ReduceBroadcast);
    model("all_reduce reduce_broadcast", c);
}

/// reduce to rank 1, reduce-scatter-gather (two steps), 3 ranks.
#[test]
fn reduce_scatter_gather_3() {
    let c = with(
        case(OpKind::Reduce, 3, 2, 1),
        Algorithm::ReduceScatterGather,
    );
    model("reduce reduce_scatter_gather root 1", c);
}

/// all_gather (list form), ring, 3 ranks.
#[test]
fn all_gather_ring_3() {
    model(
        "all_gather ring",
        with(case(OpKind::AllGather, 3, 1, 0), Algorithm::Ring),
    );
}

/// all_gather_into_tensor, direct, 3 ranks.
#[test]
fn all_gather_direct_3() {
    let c = with(
        case(OpKind::AllGatherIntoTensor, 3, 1, 0),
        Algorithm::Direct,
    );
    model("all_gather_into_tensor direct", c);
}

/// scatter from rank 1, 3 ranks.
#[test]
fn scatter_3() {
    model("scatter root 1", case(OpKind::Scatter, 3, 1, 1));
}

/// reduce_scatter (list form), ring, 3 ranks.
#[test]
fn reduce_scatter_ring_3() {
    let c = with(case(OpKind::ReduceScatter, 3, 1, 0), Algorithm::Ring);
    model("reduce_scatter ring", c);
}

/// reduce_scatter_tensor, direct, 3 ranks.
#[test]
fn reduce_scatter_tensor_direct_3() {
    let c = with(
        case(OpKind::ReduceScatterTensor, 3, 1, 0),
        Algorithm::Direct,
    );
    model("reduce_scatter_tensor direct", c);
}

/// all_to_all (pairwise), 3 ranks.
#[test]
fn all_to_all_3() {
    model("all_to_all", case(OpKind::AllToAll, 3, 1, 0));
}

/// all_to_all_single (pairwise), 3 ranks.
#[test]
fn all_to_all_single_3() {
    model("all_to_all_single", case(OpKind::AllToAllSingle, 3, 1, 0));
}

/// `send` of `v` to group rank `dst` under `tag`, as rank `r` of a world of `n`.
fn send(n: usize, r: usize, dst: usize, tag: u32, v: Vec<i32>) -> crate::collective::Plan {
    let req = Request::Send {
        tensor: Tensor::from_vec(v),
        dst,
        tag,
    };
    plan(req, &world(n, r))
}

/// `recv` of `len` i32s from `src` (any if `None`) under `tag`, as rank `r` of a world of
/// `n`.
fn recv(n: usize, r: usize, src: Option<usize>, tag: u32, len: usize) -> crate::collective::Plan {
    let req = Request::Recv {
        spec: TensorSpec::new(&[len], DType::I32),
        src,
        tag,
    };
    plan(req, &world(n, r))
}

/// Rank 0 sends two messages under one tag and one under another; rank 1 receives them,
/// the second tag first: FIFO per (source, tag), whatever the interleaving.
#[test]
fn send_recv_2() {
    check("send/recv fifo (2 ranks)", || {
        let s0 = Script::new(0)
            .group(world(2, 0))
            .call(GroupId::WORLD, 0, send(2, 0, 1, 7, vec![1, 2]))
            .call(GroupId::WORLD, 0, send(2, 0, 1, 7, vec![3, 4]))
            .call(GroupId::WORLD, 0, send(2, 0, 1, 9, vec![5]));
        let s1 = Script::new(1)
            .group(world(2, 1))
            .call(GroupId::WORLD, 0, recv(2, 1, Some(0), 9, 1))
            .call(GroupId::WORLD, 0, recv(2, 1, Some(0), 7, 2))
            .call(GroupId::WORLD, 0, recv(2, 1, None, 7, 2));
        let res = run_world(vec![s0, s1], Vec::new());
        for (i, r) in res[0].iter().enumerate() {
            assert_output(&format!("send {i}"), r, &Output::None);
        }
        let got = |v: Vec<i32>| Output::Received {
            tensor: Tensor::from_vec(v),
            src: 0,
        };
        assert_output("recv tag 9", &res[1][0], &got(vec![5]));
        assert_output("first recv tag 7", &res[1][1], &got(vec![1, 2]));
        assert_output(
            "second recv tag 7 (any source)",
            &res[1][2],
            &got(vec![3, 4]),
        );
    });
}

/// Ranks 0 and 2 each send to rank 1, which receives twice from any source: each message
/// is received exactly once, and the reported source matches the data.
#[test]
fn recv_any_source_3() {
    check("recv any source (3 ranks)", || {
        let s0 =
            Script::new(0)
                .group(world(3, 0))
                .call(GroupId::WORLD, 0, send(3, 0, 1, 4, vec![10]));
        let s1 = Script::new(1)
            .group(world(3, 1))
            .call(GroupId::WORLD, 0, recv(3, 1, None, 4, 1))
            .call(GroupId::WORLD, 0, recv(3, 1, None, 4, 1));
        let s2 =
            Script::new(2)
                .group(world(3, 2))
                .call(GroupId::WORLD, 0, send(3, 2, 1, 4, vec![30]));
        let res = run_world(vec![s0, s1, s2], Vec::new());
        let mut seen: Vec<(usize, Vec<i32>)> = res[1]
            .iter()
            .map(|r| match r {
                Some(Ok(Output::Received { tensor, src })) => (
                    *src,
                    tensor
                        .to_vec::<i32>()
                        .unwrap_or_else(|e| panic!("received tensor: {e}")),
                ),
                other => panic!("wrong result: recv any source gave {other:?}"),
            })
            .collect();
        seen.sort();
        assert_eq!(seen, vec![(0, vec![10]), (2, vec![30])]);
    });
}
