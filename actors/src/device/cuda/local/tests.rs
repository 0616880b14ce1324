//! The slot's protocol without a GPU: parts meet, a member that gives up fails the call
//! for all, a call that never fills times out naming who never came, and the hub
//! forgets a slot once every member has come. (The execution itself needs a GPU:
//! tests/cuda_local.rs.)
use super::*;
use collectix_runtime::ReduceOp;

fn part() -> Part {
    Part {
        op: NcclOp::AllReduce {
            input: Tensor::from_vec(vec![1.0f32; 4]),
            op: ReduceOp::Sum,
        },
        dtype: DType::F32,
        ordinal: 0,
    }
}

fn deposit(k: u64, rank: usize) -> Deposit {
    Deposit {
        group: GroupId(7),
        lane: None,
        k,
        size: 3,
        rank,
    }
}

fn pending(hub: &LocalHub) -> usize {
    lock(&hub.state).slots.len()
}

#[test]
fn a_member_that_gives_up_fails_the_call_for_every_member_at_once() {
    let hub = LocalHub::new();
    let a = hub.deposit(&deposit(0, 0), part());
    assert!(a.poll(0).is_none(), "waits for the others");
    hub.abandon(GroupId(7), 0, 3, Error::Shutdown);
    assert!(matches!(a.poll(0), Some(Err(Error::Shutdown))));
    // A member that comes later fails at once too, and its part is dropped.
    let c = hub.deposit(&deposit(0, 2), part());
    assert!(matches!(c.poll(2), Some(Err(Error::Shutdown))));
    assert_eq!(pending(&hub), 0, "every member came: the slot is forgotten");
}

#[test]
fn a_call_that_never_fills_times_out_naming_who_never_came() {
    let hub = LocalHub::new();
    let slot = hub.deposit(&deposit(3, 1), part());
    let e = slot.expire(|missing| Error::invalid(format!("missing {missing:?}")));
    assert!(
        matches!(&e, Error::InvalidArgument(m) if m == "missing [0, 2]"),
        "{e:?}"
    );
    // Every member sees the same failure, and a late one fails at once.
    assert!(matches!(slot.poll(1), Some(Err(Error::InvalidArgument(_)))));
    let late = hub.deposit(&deposit(3, 0), part());
    assert!(matches!(late.poll(0), Some(Err(Error::InvalidArgument(_)))));
    assert_eq!(pending(&hub), 1, "rank 2 has not come yet");
}

#[test]
fn a_part_deposited_twice_is_an_error_not_a_silent_overwrite() {
    let hub = LocalHub::new();
    let a = hub.deposit(&deposit(0, 1), part());
    let b = hub.deposit(&deposit(0, 1), part());
    assert!(matches!(a.poll(1), Some(Err(Error::Internal(_)))));
    assert!(matches!(b.poll(1), Some(Err(Error::Internal(_)))));
}

#[test]
fn calls_are_kept_apart_by_group_and_ordinal() {
    let hub = LocalHub::new();
    let a = hub.deposit(&deposit(0, 0), part());
    let b = hub.deposit(&deposit(1, 0), part());
    hub.abandon(GroupId(7), 1, 3, Error::Shutdown);
    assert!(
        a.poll(0).is_none(),
        "call 0 is not touched by call 1's failure"
    );
    assert!(matches!(b.poll(0), Some(Err(Error::Shutdown))));
    assert_eq!(pending(&hub), 2);
}

/// When every part has come, the last member executes the call; without a GPU (CI)
/// that fails with a typed device error, the same for every member.
#[test]
fn a_full_call_runs_or_fails_with_a_typed_error_for_every_member() {
    let hub = LocalHub::new();
    let slots: Vec<_> = (0..3)
        .map(|r| hub.deposit(&deposit(0, r), part()))
        .collect();
    assert_eq!(pending(&hub), 0);
    for (r, s) in slots.iter().enumerate() {
        match s.poll(r) {
            // No GPU here: the context cannot be made. With one: host tensors are not
            // CUDA memory.
            Some(Err(Error::Device(_))) | Some(Err(Error::InvalidArgument(_))) => {}
            other => panic!("rank {r}: {other:?}"),
        }
    }
}
