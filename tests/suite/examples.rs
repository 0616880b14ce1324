#![allow(clippy::duplicate_mod)]
//! The runnable examples, run as tests: each must print exactly what its doc comment says.

#[path = "../../examples/all_gather_into_tensor.rs"]
mod all_gather_into_tensor;
#[path = "../../examples/all_reduce.rs"]
mod all_reduce;
#[path = "../../examples/ddp.rs"]
mod ddp;
#[path = "../../examples/fsdp.rs"]
mod fsdp;
#[path = "../../examples/parameter_server.rs"]
mod parameter_server;
#[path = "../../examples/reduce_scatter.rs"]
mod reduce_scatter;
#[path = "../../examples/scatter_data.rs"]
mod scatter_data;
#[path = "../../examples/seed_search.rs"]
mod seed_search;
#[path = "../../examples/send_recv.rs"]
mod send_recv;
#[path = "../../examples/tensor_scatter.rs"]
mod tensor_scatter;

fn check(got: collectix::Result<Vec<String>>, want: &[&str]) {
    let got = got.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(got, want.iter().map(|s| s.to_string()).collect::<Vec<_>>());
}

#[test]
fn reduce_scatter_example() {
    check(
        reduce_scatter::lines(),
        &[
            "rank 0: reduce_scatter [0]",
            "rank 1: reduce_scatter [4]",
            "rank 2: reduce_scatter [8]",
            "rank 3: reduce_scatter [12]",
        ],
    );
}

#[test]
fn all_gather_into_tensor_example() {
    let line = |r| format!("rank {r}: all_gather_into_tensor [[0, 0], [1, 1], [2, 2], [3, 3]]");
    let want: Vec<String> = (0..4).map(line).collect();
    check(
        all_gather_into_tensor::lines(),
        &want.iter().map(String::as_str).collect::<Vec<_>>(),
    );
}

#[test]
fn seed_search_example() {
    check(
        seed_search::lines(),
        &[
            "buggy ring: 293 of 1000 seeds fail; the first, seed 1, after 300s (virtual):",
            "  rank 0: recv (point-to-point on group world) timed out on rank 0, still waiting for ranks [2]",
            "  rank 1: [10.0, 20.0, 30.0, 2.0], want [10.0, 20.0, 30.0, 40.0]",
            "  rank 2: [10.0, 20.0, 30.0, 40.0]",
            "  rank 3: [10.0, 20.0, 30.0, 40.0]",
            "replay of seed 1: the same steps (81) and the same results",
            "fixed ring: 1000 seeds, no failure",
        ],
    );
}

#[test]
fn send_recv_example() {
    check(
        send_recv::lines(),
        &["rank 0: sent [1, -1]", "rank 1: received [1, -1]"],
    );
}

#[test]
fn all_reduce_example() {
    check(
        all_reduce::lines(),
        &[
            "rank 0: sum [10, 20]",
            "rank 1: sum [10, 20]",
            "rank 2: sum [10, 20]",
            "rank 3: sum [10, 20]",
            "rank 1: group_min [2, 4]",
            "rank 1: group_max [4, 8]",
            "rank 3: group_min [2, 4]",
            "rank 3: group_max [4, 8]",
        ],
    );
}

#[test]
fn parameter_server_example() {
    check(
        parameter_server::lines(),
        &[
            "rank 0: gradient [0, 0, 0]",
            "rank 1: gradient [1, 2, 3]",
            "rank 2: gradient [2, 4, 6]",
            "rank 3: gradient [3, 6, 9]",
            "rank 0: averaged [1.5, 3, 4.5]",
            "rank 1: averaged [1.5, 3, 4.5]",
            "rank 2: averaged [1.5, 3, 4.5]",
            "rank 3: averaged [1.5, 3, 4.5]",
        ],
    );
}

#[test]
fn scatter_data_example() {
    check(
        scatter_data::lines(),
        &[
            "rank 0: shard [0, 1]",
            "rank 1: shard [2, 3]",
            "rank 2: shard [4, 5]",
            "rank 0: config epochs=3 lr=0.05",
            "rank 1: config epochs=3 lr=0.05",
            "rank 2: config epochs=3 lr=0.05",
            "rank 3: config epochs=3 lr=0.05",
        ],
    );
}

#[test]
fn tensor_scatter_example() {
    check(
        tensor_scatter::lines(),
        &[
            "scatter_ [[1, 0, 0, 4, 0], [0, 2, 0, 0, 0], [0, 0, 3, 0, 0]]",
            "scatter_dim1 [[1, 2, 3, 0, 0], [6, 7, 0, 0, 8], [0, 0, 0, 0, 0]]",
            "scatter_add [[2, 2, 3.23, 2], [2, 2, 2, 3.23]]",
            "scatter_multiply [[2, 2, 2.46, 2], [2, 2, 2, 2.46]]",
            "scatter_add_ [[1, 0, 0, 1, 1], [0, 1, 0, 0, 0], [0, 0, 1, 0, 0]]",
            "scatter_add_2rows [[2, 0, 0, 1, 1], [0, 2, 0, 0, 0], [0, 0, 2, 1, 1]]",
            "scatter_reduce_sum [5, 14, 8, 4]",
            "scatter_reduce_sum_exclude_self [4, 12, 5, 4]",
            "scatter_reduce_amax [3, 6, 5, 4]",
            "scatter_reduce_amax_exclude_self [3, 6, 5, 4]",
            "gather [[1, 1], [4, 3]]",
        ],
    );
}

/// The ddp example's loss curve on 2 and 4 in-process ranks is single-process training's on
/// the same data, to float tolerance (the sums are added in another order), and it learns.
#[test]
fn ddp_example_matches_single_process_training() {
    let single = ddp::train(None).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(single.len(), ddp::STEPS);
    let tail: f32 = single[ddp::STEPS - 5..].iter().sum::<f32>() / 5.0;
    assert!(tail < 0.6 * single[0], "it does not learn: {single:?}");
    for w in [2, 4] {
        let got = ddp::in_process(w).unwrap_or_else(|e| panic!("W={w}: {e}"));
        assert_eq!(got.len(), single.len());
        for (s, (a, b)) in got.iter().zip(&single).enumerate() {
            assert!(
                (a - b).abs() <= 1e-4 * b.abs(),
                "W={w}, step {s}: {a} against single-process {b}"
            );
        }
    }
}

/// The fsdp example: on 1, 2 and 4 in-process ranks, as FSDP and as HSDP, with and without
/// prefetch, every rank's loss curve is single-process training's bit for bit, it learns, and
/// each rank held its shards and at most two gathered layers (one without prefetch).
#[test]
fn fsdp_example_matches_single_process_training_exactly_and_holds_a_shard() {
    for (ranks, replicas, prefetch) in [
        (4, 1, true),
        (4, 1, false),
        (4, 2, true),
        (2, 1, true),
        (2, 2, true),
        (1, 1, true),
    ] {
        let cfg = fsdp::Config {
            ranks,
            replicas,
            prefetch,
            ..fsdp::Config::default()
        };
        let want = fsdp::single(&cfg).unwrap_or_else(|e| panic!("{e}"));
        assert!(
            want[want.len() - 1] < 0.7 * want[0],
            "it does not learn: {want:?}"
        );
        let reports = fsdp::in_process(&cfg).unwrap_or_else(|e| panic!("{cfg:?}: {e}"));
        assert_eq!(reports.len(), ranks);
        for (r, rep) in reports.iter().enumerate() {
            assert_eq!(rep.losses, want, "{cfg:?}, rank {r}");
            // Per layer 16 × 16 + 16 floats; a rank keeps 1/shards of each layer, plus the
            // gathered layers it held at once.
            let layer = 272 * 4;
            let shards = ranks / replicas;
            let gathered = if prefetch { 2 } else { 1 };
            assert_eq!(rep.total_bytes, fsdp::LAYERS * layer, "{cfg:?}");
            assert_eq!(
                rep.peak_bytes,
                fsdp::LAYERS * layer / shards + gathered * layer,
                "{cfg:?}, rank {r}"
            );
            let lines = fsdp::lines(r, rep);
            assert_eq!(
                lines.last().map(String::as_str),
                Some(
                    format!("rank {r}: param bytes held peak {} of 8704", rep.peak_bytes).as_str()
                )
            );
        }
    }
}
