//! Small sends and receives through the mailboxes of a group whose ranks share memory
//! (`collectix_runtime::board::mail`), beside the engine's path for larger ones: one
//! lane's messages are received in order whichever way each went, a full ring sends
//! through the engine, a receive from any source takes mailbox messages, a mismatch is an
//! error, and ranks that keep sending to each other one call at a time never hang.

use crate::common;
use collectix::{Communicator, DType, Error, Tensor, TensorSpec, Transport, World};
use common::wait_all;
use std::time::Duration;

fn world(n: usize) -> World {
    World::local(n).unwrap_or_else(|e| panic!("{e}"))
}

/// Waits up to 30 s for `w`: a hang is a failure.
fn within<T>(w: collectix::Work<T>) -> collectix::Result<T> {
    w.wait_timeout(std::time::Duration::from_secs(30))
        .unwrap_or_else(|| panic!("hung"))
}

fn v(t: &Tensor) -> Vec<i32> {
    t.to_vec::<i32>().unwrap_or_default()
}

/// Small (mailbox) and large (engine) messages on one lane, 40 of them sent before any
/// receive (more than a ring holds: the rest go through the engine), are received in the
/// order they were sent, by receives of a named source and of any source: rank 0 of `c`
/// sends, rank 1 receives.
fn one_lane_in_order(c: &Communicator) -> Result<(), String> {
    let size = |k: usize| if k % 3 == 2 { 64 } else { 1 + k % 2 };
    let msg = |k: usize| vec![k as i32; size(k)];
    if c.rank() == 0 {
        for k in 0..40 {
            drop(c.send(Tensor::from_vec(msg(k)), 1, 9));
        }
        // The sends are done once the receiver says so (a barrier on the board).
        return within(c.barrier()).map_err(|e| e.to_string());
    }
    for k in 0..40 {
        let src = if k % 4 == 3 { None } else { Some(0) };
        match within(c.recv(TensorSpec::new(&[size(k)], DType::I32), src, 9)) {
            Ok((t, from)) if (v(&t), from) == (msg(k), 0) => {}
            Ok((t, from)) => return Err(format!("message {k}: {:?} from {from}", v(&t))),
            Err(e) => return Err(format!("message {k}: {e}")),
        }
    }
    within(c.barrier()).map_err(|e| e.to_string())
}

/// Each rank of `c` sends a small message to the next and receives one from the one before,
/// one call at a time, 3,000 times (the benchmark's send_recv): every exchange completes
/// with the right data.
fn exchange_one_call_at_a_time(c: &Communicator) -> Result<(), String> {
    let (r, n) = (c.rank(), c.size());
    for k in 0..3000i32 {
        let s = c.send(Tensor::from_vec(vec![k * 10 + r as i32]), (r + 1) % n, 0);
        let got = within(c.recv(TensorSpec::new(&[1], DType::I32), Some((r + n - 1) % n), 0));
        within(s).map_err(|e| format!("send {k}: {e}"))?;
        match got {
            Ok((t, _)) if v(&t) == vec![k * 10 + ((r + n - 1) % n) as i32] => {}
            Ok((t, _)) => return Err(format!("exchange {k}: {:?}", v(&t))),
            Err(e) => return Err(format!("exchange {k}: {e}")),
        }
    }
    Ok(())
}

/// 200 times: a group of ranks 0 and 1 of `c`; rank 0 sends one small message on it (done
/// at once: it is in the mailbox) and destroys the group straight after, so its departure
/// follows the message; rank 1's receive, waiting already (even rounds) or made after the
/// departure came (odd rounds), gets the message: a member that left after a send is not a
/// reason to lose what it sent.
fn send_then_leave(c: &Communicator) -> Result<(), String> {
    for k in 0..200i32 {
        let g = within(c.new_group(&[0, 1])).map_err(|e| format!("round {k}: new_group: {e}"))?;
        let Some(g) = g else {
            continue;
        };
        let late = k % 2 == 1;
        if g.rank() == 0 {
            within(c.barrier()).map_err(|e| format!("round {k}: barrier: {e}"))?;
            within(g.send(Tensor::from_vec(vec![k]), 1, 5))
                .map_err(|e| format!("round {k}: send: {e}"))?;
            within(g.destroy()).map_err(|e| format!("round {k}: destroy: {e}"))?;
        } else {
            let spec = TensorSpec::new(&[1], DType::I32);
            let got = if late {
                within(c.barrier()).map_err(|e| format!("round {k}: barrier: {e}"))?;
                std::thread::sleep(Duration::from_millis(5));
                within(g.recv(spec, Some(0), 5))
            } else {
                let r = g.recv(spec, Some(0), 5);
                within(c.barrier()).map_err(|e| format!("round {k}: barrier: {e}"))?;
                within(r)
            };
            match got {
                Ok((t, _)) if v(&t) == vec![k] => {}
                Ok((t, _)) => return Err(format!("round {k}: {:?}", v(&t))),
                Err(e) => return Err(format!("round {k} (late: {late}): {e}")),
            }
            let _ = within(g.destroy());
        }
    }
    Ok(())
}

fn all_ok(what: &str, results: Vec<Result<(), String>>) {
    let ok = vec![Ok(()); results.len()];
    assert_eq!(results, ok, "{what}: every rank's result");
}

#[test]
fn small_and_large_messages_of_one_lane_keep_their_order() {
    all_ok(
        "one process",
        common::on_every_rank(2, Duration::from_secs(30), one_lane_in_order),
    );
}

#[test]
fn ranks_exchanging_small_messages_one_call_at_a_time_never_hang() {
    for n in [2usize, 4] {
        all_ok(
            &format!("one process, {n} ranks"),
            common::on_every_rank(n, Duration::from_secs(30), exchange_one_call_at_a_time),
        );
    }
}

/// The same two, between processes over shared memory (the world's mailboxes in the
/// ranks' segments, a sender's flag and the receiver's doorbell).
#[test]
fn over_shared_memory_small_messages_keep_their_order_and_never_hang() {
    for n in [2usize, 4] {
        all_ok(
            &format!("shared memory, {n} ranks"),
            common::job(
                Transport::Shm,
                n,
                "mail",
                Duration::from_secs(30),
                |_, p| {
                    let c = p.communicator();
                    if n == 2 {
                        one_lane_in_order(c)?;
                    }
                    exchange_one_call_at_a_time(c)?;
                    p.shutdown().map_err(|e| e.to_string())
                },
            ),
        );
    }
}

/// A small message sent just before its sender left the group is received, in one
/// process and between processes: the receiving rank reads its mailboxes before it hears
/// of a departure.
#[test]
fn a_small_message_sent_just_before_its_sender_leaves_is_received() {
    all_ok(
        "one process",
        common::on_every_rank(2, Duration::from_secs(30), send_then_leave),
    );
    all_ok(
        "shared memory",
        common::job(
            Transport::Shm,
            2,
            "mail-leave",
            Duration::from_secs(30),
            |_, p| {
                send_then_leave(p.communicator())?;
                p.shutdown().map_err(|e| e.to_string())
            },
        ),
    );
}

/// A small message received as another size is a mismatch on the receiver, and the
/// sender's next call on the group fails: the group was aborted on both ranks.
#[test]
fn a_small_message_received_as_another_size_is_a_mismatch() {
    let w = world(2);
    let c = w.communicators();
    within(c[0].send(Tensor::from_vec(vec![1i32]), 1, 3)).unwrap_or_else(|e| panic!("{e}"));
    let r = within(c[1].recv(TensorSpec::new(&[2], DType::I32), Some(0), 3));
    assert!(matches!(r, Err(Error::Mismatch { .. })), "{r:?}");
    let later = wait_all(
        vec![c[0].all_reduce(
            Tensor::from_vec(vec![1.0f32; 1000]),
            collectix::ReduceOp::Sum,
        )],
        30,
    );
    assert!(
        matches!(&later[0], Err(Error::GroupAborted { .. })),
        "{later:?}"
    );
}
