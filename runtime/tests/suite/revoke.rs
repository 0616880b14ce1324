//! Revoking a group (ULFM's `MPI_Comm_revoke`) in the seeded simulator: every member's
//! pending and later calls fail promptly, naming the revoker; and a group made after a loss
//! that still names the lost rank fails at once.

use crate::common;
use collectix_runtime::group::{GroupId, GroupOptions};
use collectix_runtime::testing::sim::Sim;
use collectix_runtime::testing::Case;
use collectix_runtime::{DType, Error, OpId, OpKind, Time};
use common::{opts, STEPS, TIMEOUT};
use std::time::Duration;

fn all_reduce(w: usize) -> Case {
    common::case(OpKind::AllReduce, w, DType::F32)
}

fn revoked_by(e: Option<&collectix_runtime::Result<collectix_runtime::Output>>) -> Option<usize> {
    match e {
        Some(Err(e)) => match e.root_cause() {
            Error::Revoked { by, .. } => Some(*by),
            _ => None,
        },
        _ => None,
    }
}

/// Ranks 0, 2 and 3 wait in an all_reduce that rank 1 will never join: rank 1 revokes the
/// group instead. Each fails at once (far inside its timeout) with the revoke naming rank
/// 1, and so does every later call of every member, the revoker's included.
#[test]
fn a_revoke_ends_every_members_pending_and_later_calls() {
    let w = 4;
    for seed in 0..20 {
        let mut sim = Sim::new(w, seed);
        let case = all_reduce(w);
        let waiting: Vec<(usize, OpId)> = [0, 2, 3]
            .into_iter()
            .map(|r| {
                let id = sim
                    .submit(r, GroupId::WORLD, case.request(r), &opts())
                    .unwrap_or_else(|e| panic!("{e}"));
                (r, id)
            })
            .collect();
        sim.run_for(Duration::from_micros(100));
        assert_eq!(sim.revoke(1, GroupId::WORLD), Ok(()));
        sim.run(STEPS).unwrap_or_else(|e| panic!("{e:?}"));
        for &(r, id) in &waiting {
            assert_eq!(
                revoked_by(sim.result(r, id)),
                Some(1),
                "rank {r}: {:?}\n{}",
                sim.result(r, id),
                sim.trace_text()
            );
            let at = sim.completed_at(r, id).unwrap_or(Time::ZERO);
            assert!(at < Time::ZERO + TIMEOUT / 10, "rank {r} told at {at:?}");
        }
        for r in 0..w {
            let later = sim
                .submit(r, GroupId::WORLD, case.request(r), &opts())
                .unwrap_or_else(|e| panic!("{e}"));
            sim.run(STEPS).unwrap_or_else(|e| panic!("{e:?}"));
            assert_eq!(revoked_by(sim.result(r, later)), Some(1), "rank {r}");
        }
        // Revoking again is harmless; the first revoke stands.
        assert_eq!(sim.revoke(2, GroupId::WORLD), Ok(()));
    }
}

/// A revoke reaches only its group: a group of the same ranks made separately goes on.
#[test]
fn a_revoke_leaves_other_groups_alone() {
    let w = 3;
    let mut sim = Sim::new(w, 5);
    let other = GroupId::derive(GroupId::WORLD, 0, &[9]);
    sim.add_group_everywhere(other, &[0, 1, 2], GroupOptions::default());
    assert_eq!(sim.revoke(0, GroupId::WORLD), Ok(()));
    let case = all_reduce(w);
    let ids: Vec<OpId> = (0..w)
        .map(|r| {
            sim.submit(r, other, case.request(r), &opts())
                .unwrap_or_else(|e| panic!("{e}"))
        })
        .collect();
    sim.run(STEPS).unwrap_or_else(|e| panic!("{e:?}"));
    for (r, id) in ids.into_iter().enumerate() {
        assert!(matches!(sim.result(r, id), Some(Ok(_))), "rank {r}");
    }
    // Revoking a group this rank is not in, or one it destroyed, is refused.
    let stranger = GroupId::derive(GroupId::WORLD, 1, &[7]);
    assert!(matches!(
        sim.revoke(0, stranger),
        Err(Error::NotAMember { .. })
    ));
    assert_eq!(sim.destroy_group(1, other), Ok(()));
    assert!(matches!(
        sim.revoke(1, other),
        Err(Error::InvalidArgument(_))
    ));
}

/// Rank 2 is killed; the survivors then make a group that still names it (a decision
/// taken before the loss was known, say). Its first call fails at once with the loss,
/// instead of waiting out its timeout.
#[test]
fn a_group_made_after_a_loss_that_names_the_lost_rank_fails_at_once() {
    let w = 3;
    let mut sim = Sim::new(w, 8);
    sim.kill(2);
    let late = GroupId::derive(GroupId::WORLD, 2, &[3]);
    sim.add_group_everywhere(late, &[0, 1, 2], GroupOptions::default());
    let case = all_reduce(w);
    for r in 0..2 {
        let id = sim
            .submit(r, late, case.request(r), &opts())
            .unwrap_or_else(|e| panic!("{e}"));
        sim.run(STEPS).unwrap_or_else(|e| panic!("{e:?}"));
        let e = match sim.result(r, id) {
            Some(Err(e)) => e.root_cause().clone(),
            other => panic!("rank {r}: {other:?}"),
        };
        assert_eq!(e, Error::PeerLost { rank: 2 }, "rank {r}");
        let at = sim.completed_at(r, id).unwrap_or(Time::ZERO);
        assert!(at < Time::ZERO + TIMEOUT / 10, "rank {r} failed at {at:?}");
    }
}

/// A rank that its peers declared lost (frozen, then resumed) hears so in words that say
/// it, not that it lost itself: the abort a peer sent ("peer rank 1 was lost") reaches rank 1
/// itself when it runs again.
#[test]
fn a_rank_declared_lost_by_its_peers_is_told_so_not_that_it_lost_itself() {
    use collectix_runtime::wire::message::{AbortReason, Header, Message};
    use collectix_runtime::{Engine, GroupInfo};
    let mut e = Engine::new(1);
    let info = GroupInfo::world(3, 1, GroupOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    e.add_group(info.clone(), Time::ZERO);
    let plan = collectix_runtime::Plan::new(all_reduce(3).request(1), &info, &opts())
        .unwrap_or_else(|e| panic!("{e}"));
    let id = e.submit(GroupId::WORLD, 0, plan, Time::ZERO);
    while e.poll_transmit().is_some() {}
    e.handle_message(
        Message {
            src: 2,
            header: Header::Abort {
                group: GroupId::WORLD,
                reason: Box::new(AbortReason::PeerLost { rank: 1 }),
            },
            payload: Vec::new(),
        },
        Time::ZERO,
    );
    let ev = e.poll_event().unwrap_or_else(|| panic!("no event"));
    assert_eq!(ev.op, id);
    let err = ev.result.err().unwrap_or_else(|| panic!("completed"));
    assert_eq!(err.root_cause(), &Error::DeclaredLost { by: 2 });
    assert_eq!(
        err.root_cause().to_string(),
        "rank 2 declared this rank lost (it was frozen, stopped or cut off) and went on without it"
    );
}

/// A call on the NCCL path completes, for the survivors' agreement, when its device
/// operation does, not when its host agreement step does: until the driver says the device
/// operation finished, the completed prefix stops before it, on every rank.
#[test]
fn a_call_on_the_nccl_path_completes_with_its_device_operation() {
    use collectix_runtime::{DataPath, Plan};
    let w = 2;
    let mut sim = Sim::new(w, 3);
    let case = all_reduce(w);
    for r in 0..w {
        sim.submit(r, GroupId::WORLD, case.request(r), &opts())
            .unwrap_or_else(|e| panic!("{e}"));
    }
    sim.run(STEPS).unwrap_or_else(|e| panic!("{e:?}"));
    // Call 1: the host step of a call on the NCCL path.
    let ids: Vec<OpId> = (0..w)
        .map(|r| {
            let info = sim
                .group(r, GroupId::WORLD)
                .unwrap_or_else(|e| panic!("{e}"));
            let plan = Plan::new(case.request(r), &info, &opts())
                .unwrap_or_else(|e| panic!("{e}"))
                .with_path(DataPath::Nccl);
            sim.submit_plan(r, GroupId::WORLD, plan)
                .unwrap_or_else(|e| panic!("{e}"))
        })
        .collect();
    sim.run(STEPS).unwrap_or_else(|e| panic!("{e:?}"));
    for (r, id) in ids.iter().enumerate() {
        assert!(matches!(sim.result(r, *id), Some(Ok(_))), "rank {r}");
    }
    let completed = |sim: &Sim, r: usize| {
        sim.engine(r)
            .and_then(|e| e.completed_calls(GroupId::WORLD))
    };
    for r in 0..w {
        assert_eq!(
            completed(&sim, r),
            Some(1),
            "rank {r}: the device operation runs"
        );
    }
    for r in 0..w {
        if let Some(e) = sim.engine_mut(r) {
            e.device_done(GroupId::WORLD, 1);
        }
        assert_eq!(
            completed(&sim, r),
            Some(2),
            "rank {r}: the device operation finished"
        );
    }
}
