//! Model group 2: two collectives in flight, issued in the same order by every rank, with
//! messages of the second arriving before the first has finished — on one group, and on two
//! different groups that share members. The two calls of each model have the same
//! fingerprint (kind, dtype, count, op, algorithm) and different data, so only the
//! sequence number and the group keep them apart: a mix-up shows as a wrong sum.

use super::{assert_output, check, plan, run_world, subgroup, world, Script};
use crate::collective::{Output, Request};
use crate::group::{GroupId, GroupInfo};
use crate::op::{Algorithm, OpKind};
use crate::tensor::reduce::ReduceOp;
use crate::tensor::Tensor;

/// An i32 sum all_reduce of `v` with `alg` forced, planned for the member of `info`.
fn all_reduce(info: &GroupInfo, v: Vec<i32>, alg: Algorithm) -> crate::collective::Plan {
    let mut info = info.clone();
    info.options = info.options.with_algorithm(OpKind::AllReduce, alg);
    plan(
        Request::AllReduce {
            tensor: Tensor::from_vec(v),
            op: ReduceOp::Sum,
        },
        &info,
    )
}

/// Two all_reduces on the world of 2 ranks (sequence numbers 0 and 1), rank 0 submitting
/// both at once, rank 1 the second only when the first finished (`lazy_1`) or both at once.
fn same_group(name: &str, alg: Algorithm, lazy_1: bool) {
    check(name, move || {
        let scripts = (0..2)
            .map(|r| {
                let info = world(2, r);
                let k = r as i32 + 1;
                let a = all_reduce(&info, vec![k, 10 * k], alg);
                let b = all_reduce(&info, vec![100 * k, 1000 * k], alg);
                let s = Script::new(r).group(info).call(GroupId::WORLD, 0, a).call(
                    GroupId::WORLD,
                    1,
                    b,
                );
                if lazy_1 && r == 1 {
                    s.lazy()
                } else {
                    s
                }
            })
            .collect();
        let res = run_world(scripts, Vec::new());
        for (r, rr) in res.iter().enumerate() {
            let first = Output::Tensor(Tensor::from_vec(vec![3i32, 30]));
            let second = Output::Tensor(Tensor::from_vec(vec![300i32, 3000]));
            assert_output(&format!("rank {r} call #0"), &rr[0], &first);
            assert_output(&format!("rank {r} call #1"), &rr[1], &second);
        }
    });
}

/// [`same_group`], ring, both ranks submitting both calls at once.
#[test]
fn same_group_ring_both_eager() {
    same_group(
        "two in flight, same group, ring, both eager",
        Algorithm::Ring,
        false,
    );
}

/// [`same_group`], ring, rank 1 lazy: the second call's first message always reaches it
/// before its first call finished.
#[test]
fn same_group_ring_one_lazy() {
    same_group(
        "two in flight, same group, ring, rank 1 lazy",
        Algorithm::Ring,
        true,
    );
}

/// [`same_group`], recursive doubling, rank 1 lazy.
#[test]
fn same_group_recursive_doubling_one_lazy() {
    let name = "two in flight, same group, recursive doubling, rank 1 lazy";
    same_group(name, Algorithm::RecursiveDoubling, true);
}

/// Two ring all_reduces on the world of 3 ranks (sequence numbers 0 and 1), rank 2
/// submitting the second only when the first finished.
#[test]
fn same_group_ring_3() {
    check(
        "two in flight, same group, ring, rank 2 lazy (3 ranks)",
        || {
            let scripts = (0..3)
                .map(|r| {
                    let info = world(3, r);
                    let k = r as i32 + 1;
                    let a = all_reduce(&info, vec![k], Algorithm::Ring);
                    let b = all_reduce(&info, vec![100 * k], Algorithm::Ring);
                    let s = Script::new(r).group(info).call(GroupId::WORLD, 0, a).call(
                        GroupId::WORLD,
                        1,
                        b,
                    );
                    if r == 2 {
                        s.lazy()
                    } else {
                        s
                    }
                })
                .collect();
            let res = run_world(scripts, Vec::new());
            for (r, rr) in res.iter().enumerate() {
                let first = Output::Tensor(Tensor::from_vec(vec![6i32]));
                let second = Output::Tensor(Tensor::from_vec(vec![600i32]));
                assert_output(&format!("rank {r} call #0"), &rr[0], &first);
                assert_output(&format!("rank {r} call #1"), &rr[1], &second);
            }
        },
    );
}

/// The id of the second group in the overlapping-groups models.
fn sub_id() -> GroupId {
    GroupId::derive(GroupId::WORLD, 0, &[2, 1])
}

/// 3 ranks: an all_reduce on the world (sequence 0), then one on the group {2, 1} (also
/// sequence 0 there, and rank 2 is that group's rank 0). Rank 0 only takes part in the
/// first; rank 1 submits lazily, so the second group's messages can reach it before it
/// finished the first or even made the second call; with `late`, it also registers the
/// second group only then, so those messages can arrive for a group it does not know yet.
/// With `drop_bug`, rank 1's driver throws early messages away (a deliberate bug, see
/// `bugs.rs`).
pub(super) fn overlapping_3(late: bool, drop_bug: bool) {
    let members = [2usize, 1];
    let scripts = (0..3)
        .map(|r| {
            let w = world(3, r);
            let k = r as i32 + 1;
            let mut s = Script::new(r).group(w.clone()).call(
                GroupId::WORLD,
                0,
                all_reduce(&w, vec![k], Algorithm::RecursiveDoubling),
            );
            if r != 0 {
                let g = subgroup(sub_id(), &members, r);
                let p = all_reduce(&g, vec![100 * k], Algorithm::RecursiveDoubling);
                s = s.group(g).call(sub_id(), 0, p);
            }
            if r == 1 {
                s = s.lazy();
                if late {
                    s = s.late_groups();
                }
                if drop_bug {
                    s = s.drop_unexpected();
                }
            }
            s
        })
        .collect();
    let res = run_world(scripts, Vec::new());
    let world_sum = Output::Tensor(Tensor::from_vec(vec![6i32]));
    let group_sum = Output::Tensor(Tensor::from_vec(vec![500i32]));
    for (r, rr) in res.iter().enumerate() {
        assert_output(&format!("rank {r} world call"), &rr[0], &world_sum);
        if r != 0 {
            assert_output(&format!("rank {r} group call"), &rr[1], &group_sum);
        }
    }
}

/// [`overlapping_3`], every group registered at start.
#[test]
fn overlapping_groups_3() {
    check("two in flight, overlapping groups (3 ranks)", || {
        overlapping_3(false, false)
    });
}

/// [`overlapping_3`], rank 1 registering the second group only when it calls into it.
#[test]
fn overlapping_groups_late_registration_3() {
    check(
        "two in flight, overlapping groups, second group registered late (3 ranks)",
        || overlapping_3(true, false),
    );
}

/// 2 ranks, two groups with the same members in opposite orders (so group-local ranks
/// differ), both on sequence 0, ring all_reduce in each; rank 0 lazy.
#[test]
fn overlapping_groups_2() {
    check("two in flight, same members, two groups (2 ranks)", || {
        let id = GroupId::derive(GroupId::WORLD, 0, &[1, 0]);
        let scripts = (0..2)
            .map(|r| {
                let w = world(2, r);
                let g = subgroup(id, &[1, 0], r);
                let k = r as i32 + 1;
                let a = all_reduce(&w, vec![k, 2 * k], Algorithm::Ring);
                let b = all_reduce(&g, vec![100 * k, 200 * k], Algorithm::Ring);
                let s = Script::new(r)
                    .group(w)
                    .group(g)
                    .call(GroupId::WORLD, 0, a)
                    .call(id, 0, b);
                if r == 0 {
                    s.lazy()
                } else {
                    s
                }
            })
            .collect();
        let res = run_world(scripts, Vec::new());
        for (r, rr) in res.iter().enumerate() {
            let a = Output::Tensor(Tensor::from_vec(vec![3i32, 6]));
            let b = Output::Tensor(Tensor::from_vec(vec![300i32, 600]));
            assert_output(&format!("rank {r} world call"), &rr[0], &a);
            assert_output(&format!("rank {r} group call"), &rr[1], &b);
        }
    });
}

/// Flow control under every interleaving: a window of one call, rank 0 issuing `calls`
/// broadcasts at once (all but the first must wait for the others' credits), the other
/// ranks making each call only when the previous one finished, then a barrier so that rank 0
/// keeps serving credits until everyone is done. Every value arrives, in order; nothing hangs.
fn flow_control(n: usize, calls: u64) {
    let name = format!("flow control, window 1, root {calls} broadcasts ahead ({n} ranks)");
    check(&name, move || {
        let scripts = (0..n)
            .map(|r| {
                let opts = crate::group::GroupOptions {
                    window: 1,
                    ..crate::group::GroupOptions::default()
                };
                let info = super::world_with(n, r, opts);
                let mut s = Script::new(r).group(info.clone());
                for k in 0..calls {
                    let v = if r == 0 { k as i32 + 7 } else { 0 };
                    let req = Request::Broadcast {
                        tensor: Tensor::from_vec(vec![v]),
                        root: 0,
                    };
                    s = s.call(GroupId::WORLD, k, plan(req, &info));
                }
                let s = s.call(GroupId::WORLD, calls, plan(Request::Barrier, &info));
                if r == 0 {
                    s
                } else {
                    s.lazy()
                }
            })
            .collect();
        let res = run_world(scripts, Vec::new());
        for (r, rr) in res.iter().enumerate() {
            for (k, got) in rr.iter().take(calls as usize).enumerate() {
                let want = Output::Tensor(Tensor::from_vec(vec![k as i32 + 7]));
                assert_output(&format!("rank {r} call #{k}"), got, &want);
            }
            assert_output(
                &format!("rank {r} barrier"),
                &rr[calls as usize],
                &Output::None,
            );
        }
    });
}

/// [`flow_control`] on 2 ranks, three broadcasts.
#[test]
fn flow_control_window_of_one() {
    flow_control(2, 3);
}

/// [`flow_control`] on 3 ranks, two broadcasts.
#[test]
fn flow_control_window_of_one_three_ranks() {
    flow_control(3, 2);
}

/// The lagging receiver: a window of one call, rank 1 issuing `calls` reduces to
/// root 0 at once (a non-root's reduce completes as soon as its part is sent, so it runs ahead
/// by itself), the root making each call only when the previous one finished, then a barrier.
/// Note: this model passes on the old flow control too (the one that kept only the highest
/// call asked about; loom explores only 3 executions here: channels are FIFO and both ranks
/// are single threads); that flow control's stall needs the asks and credits to cross in one
/// particular order, which the simulator's liveness sweep (`runtime/tests/suite/liveness.rs`, the
/// "Greedy" pattern) produces and catches.
fn lagging_receiver(calls: u64) {
    let name = format!("flow control, window 1, a lagging root under {calls} reduces");
    check(&name, move || {
        let scripts = (0..2)
            .map(|r| {
                let opts = crate::group::GroupOptions {
                    window: 1,
                    ..crate::group::GroupOptions::default()
                };
                let info = super::world_with(2, r, opts);
                let mut s = Script::new(r).group(info.clone());
                for k in 0..calls {
                    let req = Request::Reduce {
                        tensor: Tensor::from_vec(vec![k as i32 + 10 * r as i32]),
                        root: 0,
                        op: crate::ReduceOp::Sum,
                    };
                    s = s.call(GroupId::WORLD, k, plan(req, &info));
                }
                let s = s.call(GroupId::WORLD, calls, plan(Request::Barrier, &info));
                if r == 0 {
                    s.lazy()
                } else {
                    s
                }
            })
            .collect();
        let res = run_world(scripts, Vec::new());
        for (k, got) in res[0].iter().take(calls as usize).enumerate() {
            let want = Output::Tensor(Tensor::from_vec(vec![2 * k as i32 + 10]));
            assert_output(&format!("root call #{k}"), got, &want);
        }
        for (r, rr) in res.iter().enumerate() {
            assert_output(
                &format!("rank {r} barrier"),
                &rr[calls as usize],
                &Output::None,
            );
        }
    });
}

/// [`lagging_receiver`] with ten reduces.
#[test]
fn flow_control_lagging_receiver_window_of_one() {
    lagging_receiver(10);
}
