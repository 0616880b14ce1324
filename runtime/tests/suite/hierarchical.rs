//! The hierarchical all_reduce through the deterministic simulator: for several ways of
//! spreading a group over hosts, every rank gets the exact sum (inputs exact in any order),
//! the same bits on every rank for values whose sums round, and the planner picks it by
//! default for a group on several hosts with several ranks on one; a sub-group on one host
//! is `Host`, not `Hosts`.

use collectix_runtime::group::{CallOptions, GroupId, GroupInfo, GroupOptions, Locality};
use collectix_runtime::testing::sim::Sim;
use collectix_runtime::{Algorithm, Output, Plan, ReduceOp, Request, Tensor};
use std::sync::Arc;

fn opts(hosts: &[u32]) -> GroupOptions {
    GroupOptions {
        segment_bytes: 64,
        hosts: Some(Arc::from(hosts)),
        ..GroupOptions::default()
    }
}

/// Every rank's all_reduce of `inputs[r]` with `alg` (default selection when `None`).
fn run(hosts: &[u32], inputs: &[Tensor], alg: Option<Algorithm>, seed: u64) -> Vec<Tensor> {
    let w = hosts.len();
    let mut sim = Sim::with_options(w, seed, opts(hosts));
    let call = CallOptions {
        algorithm: alg,
        timeout: None,
    };
    let ids: Vec<_> = (0..w)
        .map(|r| {
            let req = Request::AllReduce {
                tensor: inputs[r].clone(),
                op: ReduceOp::Sum,
            };
            sim.submit(r, GroupId::WORLD, req, &call)
                .unwrap_or_else(|e| panic!("{e}"))
        })
        .collect();
    sim.run_no_timeouts(10_000_000)
        .unwrap_or_else(|e| panic!("{e:?}"));
    ids.into_iter()
        .enumerate()
        .map(|(r, id)| match sim.take(r, id) {
            Some(Ok(Output::Tensor(t))) => t,
            other => panic!("hosts {hosts:?} rank {r}: {other:?}"),
        })
        .collect()
}

const MAPS: &[&[u32]] = &[
    &[0, 0, 1, 1],
    &[0, 1, 0, 1],
    &[4, 4, 4, 9, 9],
    &[0, 1, 2],
    &[3, 3],
    &[0, 0, 0, 1, 2, 2, 2, 2],
    &[7],
];

#[test]
fn every_spread_over_hosts_gives_the_exact_sum() {
    for hosts in MAPS {
        let w = hosts.len();
        for n in [0usize, 1, w + 1, 1000] {
            let inputs: Vec<Tensor> = (0..w)
                .map(|r| {
                    Tensor::from_vec(
                        (0..n)
                            .map(|k| ((r * 5 + k) % 7) as i64 - 3)
                            .collect::<Vec<_>>(),
                    )
                })
                .collect();
            let want: Vec<i64> = (0..n)
                .map(|k| (0..w).map(|r| ((r * 5 + k) % 7) as i64 - 3).sum())
                .collect();
            for seed in 0..3 {
                for (r, t) in run(hosts, &inputs, Some(Algorithm::Hierarchical), seed)
                    .into_iter()
                    .enumerate()
                {
                    assert_eq!(
                        t.to_vec::<i64>().ok(),
                        Some(want.clone()),
                        "hosts {hosts:?} n {n} seed {seed} rank {r}"
                    );
                }
            }
        }
    }
}

#[test]
fn every_rank_gets_the_same_bits_when_sums_round() {
    for hosts in MAPS {
        let w = hosts.len();
        let inputs: Vec<Tensor> = (0..w)
            .map(|r| {
                Tensor::from_vec(
                    (0..777)
                        .map(|k| ((r * 7919 + k * 104_729) % 10_007) as f32 * 1.000_1e-3 + 0.1)
                        .collect::<Vec<f32>>(),
                )
            })
            .collect();
        let outs = run(hosts, &inputs, Some(Algorithm::Hierarchical), 1);
        for (r, t) in outs.iter().enumerate() {
            assert_eq!(
                t.bytes(),
                outs[0].bytes(),
                "hosts {hosts:?}: rank {r} differs"
            );
        }
    }
}

#[test]
fn a_group_on_several_hosts_takes_it_by_default_and_one_on_one_host_does_not() {
    let hosts: &[u32] = &[0, 0, 1, 1];
    let world = GroupInfo::world(4, 0, opts(hosts)).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(world.options.locality, Locality::Hosts);
    let req = Request::AllReduce {
        tensor: Tensor::from_vec(vec![1.0f32; 1 << 16]),
        op: ReduceOp::Sum,
    };
    let plan =
        Plan::new(req.clone(), &world, &CallOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(plan.fingerprint().algorithm, Some(Algorithm::Hierarchical));
    // Members 0 and 1 share host 0: a sub-group of them is on one host.
    let sub =
        GroupInfo::new(GroupId(5), vec![0, 1], 1, opts(hosts)).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(sub.options.locality, Locality::Host);
    // One rank per host: the network's rows.
    let spread =
        GroupInfo::new(GroupId(6), vec![1, 2], 1, opts(hosts)).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(spread.options.locality, Locality::Network);
}
