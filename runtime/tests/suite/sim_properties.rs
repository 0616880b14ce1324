//! Properties of the protocol under the seeded simulator, complementing the exhaustive matrix
//! (`matrix.rs`, one call at a time on the world group): random worlds of 1–9 ranks, a random
//! one or two subgroups (random subsets in a random order, possibly overlapping), 1–4
//! collectives in flight at once on any of the groups, random counts (0 and fewer than the group size included), dtypes, ops and algorithms,
//! messages reordered and delayed by the seed. Every result must equal the reference, be the
//! same bits on every rank where the collective gives every rank the same result, and be the
//! same bits under another seed and another delivery order.
//!
//! A failure prints the case, the seed and the simulator's compact trace; proptest keeps the
//! failing case in `proptest-regressions/` and tries it first on the next run, which replays
//! the same trace (same seed, same calls: `replay_gives_the_same_trace` checks that).

use collectix_runtime::group::{CallOptions, GroupId, GroupOptions};
use collectix_runtime::testing::sim::{Delivery, Rng, Sim, SimOptions, TraceEvent};
use collectix_runtime::testing::{reduces, rooted, Case, COLLECTIVES};
use collectix_runtime::{Algorithm, OpKind};
use collectix_runtime::{DType, Output, ReduceOp, Request, Tensor};
use proptest::prelude::*;
use proptest::test_runner::{FileFailurePersistence, TestCaseError};
use std::time::Duration;

/// One collective of a scenario: on the world (`group == 0`) or subgroup `group - 1`.
#[derive(Clone, Debug)]
struct Call {
    group: usize,
    case: Case,
}

#[derive(Clone, Debug)]
struct Scenario {
    world: usize,
    /// Each subgroup's members (global ranks) in group-rank order.
    subs: Vec<Vec<usize>>,
    segment_bytes: usize,
    /// The byte budget per peer (tight ones force rendezvous).
    budget: u64,
    calls: Vec<Call>,
}

impl Scenario {
    fn members(&self, group: usize) -> Vec<usize> {
        match group {
            0 => (0..self.world).collect(),
            g => self.subs[g - 1].clone(),
        }
    }

    /// Group 0 is the world; subgroup `i` gets an id derived as `new_group` would.
    fn gid(&self, group: usize) -> GroupId {
        match group {
            0 => GroupId::WORLD,
            g => {
                let words: Vec<u64> = self.subs[g - 1].iter().map(|&m| m as u64).collect();
                GroupId::derive(GroupId::WORLD, g as u64, &words)
            }
        }
    }

    fn group_options(&self) -> GroupOptions {
        GroupOptions {
            segment_bytes: self.segment_bytes,
            peer_budget_bytes: self.budget,
            ..GroupOptions::default()
        }
    }
}

fn ops_for(kind: OpKind, dtype: DType) -> Vec<ReduceOp> {
    if !reduces(kind) {
        return vec![ReduceOp::Sum];
    }
    ReduceOp::ALL
        .into_iter()
        .filter(|op| op.check(dtype).is_ok())
        .collect()
}

/// Raw choices for one call, turned into a [`Case`] once the group size is known (indices
/// shrink towards the first choice).
type RawCall = (usize, usize, usize, usize, usize, usize, usize, usize);

fn raw_call() -> impl Strategy<Value = RawCall> {
    (
        0..3usize,
        0..COLLECTIVES.len(),
        0..6usize,
        prop_oneof![0..64usize, 64..2000usize],
        0..DType::ALL.len(),
        0..9usize,
        0..4usize,
        0..9usize,
    )
}

fn make_call(raw: RawCall, sc: &Scenario) -> Call {
    let (group, kind, count_class, free, dtype, op, alg, root) = raw;
    let group = group % (sc.subs.len() + 1);
    let size = sc.members(group).len();
    let kind = COLLECTIVES[kind];
    let count = match count_class {
        0 => 0,
        1 => 1,
        2 => size - 1,
        3 => size,
        4 => size + 1,
        _ => free,
    };
    let dtype = DType::ALL[dtype];
    let ops = ops_for(kind, dtype);
    let algs = kind.algorithms();
    Call {
        group,
        case: Case {
            kind,
            size,
            count,
            dtype,
            op: ops[op % ops.len()],
            root: if rooted(kind) { root % size } else { 0 },
            algorithm: match alg % (algs.len() + 1) {
                0 => None,
                a => Some(algs[a - 1]),
            },
        },
    }
}

prop_compose! {
    fn scenario()(world in 1..=9usize)(
        world in Just(world),
        subs in proptest::collection::vec(
            proptest::sample::subsequence((0..world).collect::<Vec<_>>(), 1..=world)
                .prop_shuffle(),
            1..=2,
        ),
        segment_bytes in prop_oneof![Just(16usize), Just(64), Just(4096), Just(1 << 20)],
        budget in prop_oneof![Just(0u64), Just(100), Just(64 << 20)],
        raws in proptest::collection::vec(raw_call(), 1..=4),
    ) -> Scenario {
        let mut sc = Scenario { world, subs, segment_bytes, budget, calls: Vec::new() };
        sc.calls = raws.into_iter().map(|r| make_call(r, &sc)).collect();
        sc
    }
}

/// Results per call, in group-rank order.
type Outputs = Vec<Vec<Output>>;

/// Whether every rank of the group gets the same result.
fn same_everywhere(kind: OpKind) -> bool {
    matches!(
        kind,
        OpKind::AllReduce
            | OpKind::Broadcast
            | OpKind::AllGather
            | OpKind::AllGatherIntoTensor
            | OpKind::Barrier
    )
}

/// Runs the scenario: every rank submits its calls in the scenario's order, then the sim runs
/// with no timeout allowed to fire.
fn run(sc: &Scenario, seed: u64, net: SimOptions) -> Result<(Outputs, Sim), String> {
    let gopts = sc.group_options();
    let mut sim = Sim::with_config(sc.world, seed, gopts.clone(), net);
    for g in 1..=sc.subs.len() {
        sim.add_group_everywhere(sc.gid(g), &sc.members(g), gopts.clone());
    }
    // The op of each call on each group rank.
    let mut ids: Vec<Vec<Option<collectix_runtime::OpId>>> =
        sc.calls.iter().map(|c| vec![None; c.case.size]).collect();
    for r in 0..sc.world {
        for (i, call) in sc.calls.iter().enumerate() {
            let members = sc.members(call.group);
            let Some(local) = members.iter().position(|&m| m == r) else {
                continue;
            };
            let opts = CallOptions {
                algorithm: call.case.algorithm,
                timeout: None,
            };
            let id = sim
                .submit(r, sc.gid(call.group), call.case.request(local), &opts)
                .map_err(|e| format!("call {i} on rank {r}: submit failed: {e}"))?;
            ids[i][local] = Some(id);
        }
    }
    if let Err(e) = sim.run_no_timeouts(2_000_000) {
        return Err(format!("did not settle: {e:?}\n{}", sim.trace_text()));
    }
    let mut outputs = Vec::new();
    for (i, call) in sc.calls.iter().enumerate() {
        let members = sc.members(call.group);
        let mut outs = Vec::new();
        for (local, &g) in members.iter().enumerate() {
            let got = match ids[i][local].and_then(|id| sim.take(g, id)) {
                Some(Ok(out)) => out,
                other => {
                    return Err(format!(
                        "call {i}, group rank {local} (rank {g}): {other:?}\n{}",
                        sim.trace_text()
                    ))
                }
            };
            let want = call.case.expected(local);
            if got != want {
                return Err(format!(
                    "call {i}, group rank {local} (rank {g}): got {got:?}, want {want:?}\n{}",
                    sim.trace_text()
                ));
            }
            if same_everywhere(call.case.kind) && local > 0 && got != outs[0] {
                return Err(format!(
                    "call {i}: group ranks 0 and {local} differ\n{}",
                    sim.trace_text()
                ));
            }
            outs.push(got);
        }
        outputs.push(outs);
    }
    Ok((outputs, sim))
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 4000,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))),
        ..ProptestConfig::default()
    })]

    /// Results equal the reference on every rank, are the same bits on every rank where the
    /// collective gives every rank the same result, and do not depend on the seed or on the
    /// delivery order.
    #[test]
    fn results_match_the_reference_for_every_seed(
        sc in scenario(),
        seed_a in any::<u64>(),
        seed_b in any::<u64>(),
        any_order in any::<bool>(),
    ) {
        let (a, _) = run(&sc, seed_a, SimOptions::default()).map_err(TestCaseError::fail)?;
        let delivery = if any_order { Delivery::AnyOrder } else { Delivery::Timed };
        let net = SimOptions::default().with_delivery(delivery);
        let (b, _) = run(&sc, seed_b, net).map_err(TestCaseError::fail)?;
        prop_assert!(a == b, "seeds {seed_a} and {seed_b} disagree");
    }
}

/// Finite values of every magnitude and sign for a float dtype (no reduction order is exact).
fn inexact(dtype: DType, rng: &mut Rng, n: usize, product: bool) -> Tensor {
    let mut v = || -> f64 {
        let mantissa = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        let sign = if rng.below(2) == 0 { 1.0 } else { -1.0 };
        if product {
            sign * (0.5 + 1.5 * mantissa)
        } else {
            sign * (1.0 + mantissa) * 2f64.powi(rng.below(20) as i32 - 10)
        }
    };
    match dtype {
        DType::F16 => Tensor::from_vec(
            (0..n)
                .map(|_| collectix_runtime::tensor::dtype::f16::from_f64(v()))
                .collect::<Vec<_>>(),
        ),
        DType::BF16 => Tensor::from_vec(
            (0..n)
                .map(|_| collectix_runtime::tensor::dtype::bf16::from_f64(v()))
                .collect::<Vec<_>>(),
        ),
        DType::F32 => Tensor::from_vec((0..n).map(|_| v() as f32).collect::<Vec<_>>()),
        _ => Tensor::from_vec((0..n).map(|_| v()).collect::<Vec<_>>()),
    }
}

/// A reducing call with inexact float inputs: the request of each rank.
fn inexact_requests(
    kind: OpKind,
    w: usize,
    count: usize,
    dtype: DType,
    op: ReduceOp,
    data_seed: u64,
) -> Vec<Request> {
    let mut rng = Rng::new(data_seed);
    let product = op == ReduceOp::Product;
    (0..w)
        .map(|_| match kind {
            OpKind::AllReduce => Request::AllReduce {
                tensor: inexact(dtype, &mut rng, count, product),
                op,
            },
            OpKind::Reduce => Request::Reduce {
                tensor: inexact(dtype, &mut rng, count, product),
                root: (data_seed % w as u64) as usize,
                op,
            },
            _ => Request::ReduceScatterTensor {
                input: inexact(dtype, &mut rng, count * w, product),
                output: collectix_runtime::TensorSpec::new(&[count], dtype),
                op,
            },
        })
        .collect()
}

fn run_inexact(
    reqs: &[Request],
    alg: Option<Algorithm>,
    segment_bytes: usize,
    seed: u64,
    net: SimOptions,
) -> Result<Vec<Output>, String> {
    let gopts = GroupOptions {
        segment_bytes,
        ..GroupOptions::default()
    };
    let mut sim = Sim::with_config(reqs.len(), seed, gopts, net);
    let opts = CallOptions {
        algorithm: alg,
        timeout: None,
    };
    let mut ids = Vec::new();
    for (r, req) in reqs.iter().enumerate() {
        ids.push(
            sim.submit(r, GroupId::WORLD, req.clone(), &opts)
                .map_err(|e| format!("rank {r}: {e}"))?,
        );
    }
    sim.run_no_timeouts(1_000_000)
        .map_err(|e| format!("{e:?}\n{}", sim.trace_text()))?;
    let mut outs = Vec::new();
    for (r, id) in ids.into_iter().enumerate() {
        match sim.take(r, id) {
            Some(Ok(o)) => outs.push(o),
            other => return Err(format!("rank {r}: {other:?}\n{}", sim.trace_text())),
        }
    }
    Ok(outs)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 1000,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))),
        ..ProptestConfig::default()
    })]

    /// With inputs where the reduction order matters (random float mantissas and exponents),
    /// each algorithm still fixes one order: all_reduce gives every rank the same bits, and no
    /// result depends on the seed or the delivery order.
    #[test]
    fn inexact_floats_are_bit_identical_across_ranks_and_seeds(
        w in 2..=9usize,
        kind in prop_oneof![
            Just(OpKind::AllReduce),
            Just(OpKind::Reduce),
            Just(OpKind::ReduceScatterTensor)
        ],
        alg in 0..4usize,
        count in prop_oneof![0..12usize, 12..300usize],
        dtype in prop_oneof![Just(DType::F16), Just(DType::BF16), Just(DType::F32), Just(DType::F64)],
        op in prop_oneof![
            Just(ReduceOp::Sum),
            Just(ReduceOp::Avg),
            Just(ReduceOp::Product),
            Just(ReduceOp::PremulSum(0.3)),
            Just(ReduceOp::Max)
        ],
        segment_bytes in prop_oneof![Just(32usize), Just(1 << 20)],
        data_seed in any::<u64>(),
        seed_a in any::<u64>(),
        seed_b in any::<u64>(),
    ) {
        let algs = kind.algorithms();
        let alg = match alg % (algs.len() + 1) {
            0 => None,
            a => Some(algs[a - 1]),
        };
        let reqs = inexact_requests(kind, w, count, dtype, op, data_seed);
        let a = run_inexact(&reqs, alg, segment_bytes, seed_a, SimOptions::default())
            .map_err(TestCaseError::fail)?;
        let net = SimOptions::default().with_delivery(Delivery::AnyOrder);
        let b = run_inexact(&reqs, alg, segment_bytes, seed_b, net).map_err(TestCaseError::fail)?;
        prop_assert!(a == b, "seeds {seed_a} and {seed_b} disagree");
        if kind == OpKind::AllReduce {
            for (r, o) in a.iter().enumerate() {
                prop_assert!(o == &a[0], "ranks 0 and {r} differ");
            }
        }
    }
}

fn replay_scenario() -> Scenario {
    let case = |kind, count, dtype, algorithm| Case {
        kind,
        size: 4,
        count,
        dtype,
        op: ReduceOp::Sum,
        root: 1,
        algorithm,
    };
    Scenario {
        world: 6,
        subs: vec![vec![4, 1, 5, 0]],
        segment_bytes: 64,
        budget: 100,
        calls: vec![
            Call {
                group: 1,
                case: case(OpKind::AllReduce, 40, DType::F32, Some(Algorithm::Ring)),
            },
            Call {
                group: 0,
                case: Case {
                    size: 6,
                    ..case(OpKind::AllGather, 5, DType::I64, None)
                },
            },
            Call {
                group: 1,
                case: case(OpKind::Broadcast, 33, DType::BF16, None),
            },
        ],
    }
}

/// The replay path: the same seed and the same calls give the same trace, line for line, in
/// either delivery order; another seed gives another one.
#[test]
fn replay_gives_the_same_trace() {
    let sc = replay_scenario();
    for delivery in [Delivery::Timed, Delivery::AnyOrder] {
        let net = SimOptions::default().with_delivery(delivery);
        let trace = |seed| match run(&sc, seed, net.clone()) {
            Ok((_, sim)) => sim.trace_text(),
            Err(e) => panic!("{e}"),
        };
        let first = trace(7);
        assert!(first.starts_with("seed 7:"), "{first}");
        assert!(first.lines().count() > 50, "{first}");
        assert_eq!(first, trace(7), "same seed, another trace");
        assert_ne!(first, trace(8), "another seed, the same trace");
    }
}

/// Timed delivery really delays and reorders: deliveries come in time order, each message
/// takes between the latency and one propagation delay, and some message overtakes one sent
/// earlier on the same link.
#[test]
fn delayed_messages_arrive_after_later_ones() {
    let sc = replay_scenario();
    let net = SimOptions::default();
    let mut overtaken = 0;
    for seed in 0..5 {
        let sim = match run(&sc, seed, net.clone()) {
            Ok((_, sim)) => sim,
            Err(e) => panic!("{e}"),
        };
        let mut last = None;
        let mut sent_last: std::collections::HashMap<(usize, usize), u64> = Default::default();
        for t in sim.trace() {
            let TraceEvent::Delivered { src, dst, sent, .. } = &t.event else {
                continue;
            };
            assert!(last.is_none_or(|l| l <= t.at), "out of time order at {t}");
            last = Some(t.at);
            let flight = t.at.saturating_since(*sent);
            assert!(
                flight >= net.latency && flight <= sim.max_propagation(),
                "{t}"
            );
            let prev = sent_last.entry((*src, *dst)).or_insert(0);
            if sent.as_nanos() < *prev {
                overtaken += 1;
            }
            *prev = (*prev).max(sent.as_nanos());
        }
    }
    assert!(overtaken > 0, "no message was ever overtaken on its link");
}

/// A deadlock (a rank that never calls) ends `run_no_timeouts` with `Stuck`, and a step bound
/// too small for the work ends `run` with `StepBound`: neither hangs.
#[test]
fn deadlock_and_step_bound_are_errors() {
    let case = Case {
        kind: OpKind::AllReduce,
        size: 4,
        count: 100,
        dtype: DType::I32,
        op: ReduceOp::Sum,
        root: 0,
        algorithm: Some(Algorithm::Ring),
    };
    let mut sim = Sim::new(4, 3);
    for r in 0..3 {
        if let Err(e) = sim.submit(r, GroupId::WORLD, case.request(r), &CallOptions::default()) {
            panic!("{e}");
        }
    }
    match sim.run_no_timeouts(100_000) {
        Err(collectix_runtime::testing::sim::SimError::Stuck { pending }) => {
            assert_eq!(pending[3], 0);
            assert!(pending[..3].iter().all(|&p| p == 1), "{pending:?}");
        }
        other => panic!("{other:?}"),
    }
    let mut sim = Sim::with_options(
        4,
        3,
        GroupOptions {
            segment_bytes: 16,
            ..GroupOptions::default()
        }
        .with_timeout(Duration::from_secs(1)),
    );
    let ring = CallOptions {
        algorithm: case.algorithm,
        timeout: None,
    };
    for r in 0..4 {
        if let Err(e) = sim.submit(r, GroupId::WORLD, case.request(r), &ring) {
            panic!("{e}");
        }
    }
    let r = sim.run(10);
    assert_eq!(
        r,
        Err(collectix_runtime::testing::sim::SimError::StepBound { steps: 10 }),
        "{}",
        sim.trace_text()
    );
    assert_eq!(sim.run(1_000_000), Ok(()));
}

/// A hand-made two-rank schedule, to show the simulator catches broken ones. Rank 0 sends
/// its two one-element chunks to rank 1 in two steps, under `tags`; rank 1 receives them in
/// two steps under the same tags; with `recv_first`, each rank instead waits for the other
/// before it sends (a receive posted before its matching send on both ranks).
fn hand_made(rank: usize, tags: [u32; 2], recv_first: bool) -> collectix_runtime::Plan {
    use collectix_runtime::schedule::{Action, Layout, RecvOp, Schedule, SendOp, Step};
    let fp = collectix_runtime::Fingerprint {
        count: Some(2),
        root: Some(0),
        algorithm: Some(Algorithm::Direct),
        ..collectix_runtime::Fingerprint::new(OpKind::Broadcast, DType::I32)
    };
    let peer = 1 - rank;
    let send = |tag: u32, c: usize| SendOp {
        peer,
        tag,
        chunks: c..c + 1,
    };
    let recv = |tag: u32, c: usize| RecvOp {
        peer,
        tag,
        chunks: c..c + 1,
        action: Action::Copy,
    };
    let layout = Layout {
        chunk_elems: vec![1, 1],
        blocks: std::iter::once(0..2).collect(),
    };
    let mut schedule = Schedule::new(layout);
    let one = |v: i32| Some(Tensor::from_vec(vec![v]).bytes().clone());
    let init = if recv_first {
        schedule.steps = vec![
            Step {
                sends: vec![],
                recvs: vec![recv(tags[0], 1)],
            },
            Step {
                sends: vec![send(tags[0], 0)],
                recvs: vec![],
            },
        ];
        vec![one(rank as i32), None]
    } else if rank == 0 {
        schedule.steps = (0..2)
            .map(|i| Step {
                sends: vec![send(tags[i], i)],
                recvs: vec![],
            })
            .collect();
        vec![one(10), one(20)]
    } else {
        schedule.steps = (0..2)
            .map(|i| Step {
                sends: vec![],
                recvs: vec![recv(tags[i], i)],
            })
            .collect();
        vec![None, None]
    };
    collectix_runtime::Plan::from_schedule(fp, schedule, init, Duration::from_millis(1), 2)
}

/// The deliberate bug "a receive posted before its matching send, on both ranks" is caught:
/// `run_no_timeouts` reports the deadlock, and with timeouts each rank's error names the
/// other (every rank is in the call, so the timeout names whose messages it waited for).
#[test]
fn deliberate_bug_receive_before_send_is_caught() {
    let mut sim = Sim::new(2, 1);
    let mut ids = Vec::new();
    for r in 0..2 {
        match sim.submit_plan(r, GroupId::WORLD, hand_made(r, [0, 1], true)) {
            Ok(id) => ids.push(id),
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(
        sim.run_no_timeouts(1000),
        Err(collectix_runtime::testing::sim::SimError::Stuck {
            pending: vec![1, 1]
        })
    );
    assert_eq!(sim.run(1000), Ok(()));
    for (r, id) in ids.into_iter().enumerate() {
        // Its own timeout names the other rank, or the other rank's timeout (whose desync
        // report came back first) names it.
        match sim
            .result(r, id)
            .and_then(|x| x.as_ref().err())
            .map(|e| e.root_cause())
        {
            Some(collectix_runtime::Error::Timeout {
                rank, waiting_for, ..
            }) if *rank == r => {
                assert_eq!(waiting_for, &vec![1 - r], "{}", sim.trace_text());
            }
            Some(collectix_runtime::Error::Timeout {
                rank, waiting_for, ..
            }) if *rank == 1 - r => {
                assert_eq!(waiting_for, &vec![r], "{}", sim.trace_text());
            }
            other => panic!("rank {r}: {other:?}\n{}", sim.trace_text()),
        }
    }
}

/// The deliberate bug "a tag not advanced between two steps" is caught by reordering: with
/// both steps under one tag, a seed that delivers the second message first swaps the data;
/// with the tags advanced, every seed gives the right result.
#[test]
fn deliberate_bug_tag_not_advanced_is_caught_by_reordering() {
    let received = |tags: [u32; 2], seed: u64| -> Vec<i32> {
        let mut sim = Sim::new(2, seed);
        let mut ids = Vec::new();
        for r in 0..2 {
            match sim.submit_plan(r, GroupId::WORLD, hand_made(r, tags, false)) {
                Ok(id) => ids.push(id),
                Err(e) => panic!("{e}"),
            }
        }
        if let Err(e) = sim.run_no_timeouts(1000) {
            panic!("{e:?}\n{}", sim.trace_text());
        }
        match sim.take(1, ids[1]) {
            Some(Ok(Output::Tensor(t))) => t.to_vec::<i32>().unwrap_or_default(),
            other => panic!("{other:?}\n{}", sim.trace_text()),
        }
    };
    let wrong = (0..50).filter(|&s| received([0, 0], s) != [10, 20]).count();
    assert!(wrong > 0, "no seed caught the bug");
    assert!((0..50).all(|s| received([0, 1], s) == [10, 20]));
}
