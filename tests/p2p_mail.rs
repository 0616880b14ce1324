//! Small sends and receives through the mailboxes of a group whose ranks share memory
//! (`collectix_runtime::board::mail`), beside the engine's path for larger ones: one
//! lane's messages are received in order whichever way each went, a full ring sends
//! through the engine, a receive from any source takes mailbox messages, a mismatch is an
//! error, and ranks that keep sending to each other one call at a time never hang.

mod common;
use collectix::{DType, Error, Tensor, TensorSpec, World};
use common::wait_all;

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
/// order they were sent, by receives of a named source and of any source.
#[test]
fn small_and_large_messages_of_one_lane_keep_their_order() {
    let w = world(2);
    let c = w.communicators();
    let size = |k: usize| if k % 3 == 2 { 64 } else { 1 + k % 2 };
    let msg = |k: usize| vec![k as i32; size(k)];
    for k in 0..40 {
        drop(c[0].send(Tensor::from_vec(msg(k)), 1, 9));
    }
    for k in 0..40 {
        let src = if k % 4 == 3 { None } else { Some(0) };
        let r = within(c[1].recv(TensorSpec::new(&[size(k)], DType::I32), src, 9));
        match r {
            Ok((t, from)) => assert_eq!((v(&t), from), (msg(k), 0), "message {k}"),
            Err(e) => panic!("message {k}: {e}"),
        }
    }
}

/// Two ranks exchange a small message each way, one call at a time, many times (the
/// benchmark's send_recv), and four ranks pass one around a ring: every exchange completes
/// with the right data.
#[test]
fn ranks_exchanging_small_messages_one_call_at_a_time_never_hang() {
    for n in [2usize, 4] {
        let w = world(n);
        let c = w.communicators();
        let threads: Vec<_> = c
            .iter()
            .cloned()
            .enumerate()
            .map(|(r, comm)| {
                std::thread::spawn(move || {
                    for k in 0..3000i32 {
                        let s =
                            comm.send(Tensor::from_vec(vec![k * 10 + r as i32]), (r + 1) % n, 0);
                        let got = within(comm.recv(
                            TensorSpec::new(&[1], DType::I32),
                            Some((r + n - 1) % n),
                            0,
                        ));
                        within(s).unwrap_or_else(|e| panic!("send {k} of {r}: {e}"));
                        match got {
                            Ok((t, _)) => {
                                assert_eq!(v(&t), vec![k * 10 + ((r + n - 1) % n) as i32])
                            }
                            Err(e) => panic!("receive {k} of rank {r} of {n}: {e}"),
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap_or_else(|_| panic!("a rank panicked"));
        }
    }
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
