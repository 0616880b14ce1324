//! Device tensors without a GPU: the host-staged path with stand-in device memory on 1–4
//! ranks (every collective, checked against the host reference), mixed groups, the typed
//! errors of the NCCL path, and the host-only accessors refusing device tensors.

mod common;
use collectix::device::StandIn;
use collectix::runtime::collective::TensorSpec;
use collectix::{
    DType, Device, DeviceBackend, DeviceError, Error, ReduceOp, Tensor, TensorDeviceExt, World,
};
use common::device::{cases, run, wait_parked};
use std::time::Duration;

const GPU: Device = Device::Cuda(0);

fn stand_in(t: Tensor) -> Tensor {
    StandIn::tensor(&t, GPU).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn host_staged_runs_every_collective_on_1_to_4_ranks() {
    for w in 1..=4 {
        let world = World::local(w).unwrap_or_else(|e| panic!("{e}"));
        // A scatter's non-roots pass no tensor, only a spec on the device: their output can
        // only be made in real device memory (covered by tests/cuda.rs on a GPU), not as a
        // stand-in.
        let mut cs = cases(w);
        cs.retain(|c| w == 1 || c.kind != collectix::OpKind::Scatter);
        let wrong = run(&world, DeviceBackend::HostStaged, GPU, &cs, &stand_in);
        assert!(
            wrong.is_empty(),
            "world of {w}: {} wrong:\n{}",
            wrong.len(),
            wrong.join("\n")
        );
    }
}

#[test]
fn a_group_may_mix_ranks_with_and_without_devices_on_the_staged_path() {
    let world = World::local(3).unwrap_or_else(|e| panic!("{e}"));
    let works: Vec<_> = world
        .communicators()
        .iter()
        .map(|c| {
            let t = Tensor::from_vec(vec![c.rank() as f32 + 1.0, 10.0]);
            // Rank 1 has no GPU: it passes a host tensor.
            let t = if c.rank() == 1 { t } else { stand_in(t) };
            c.with_device_backend(DeviceBackend::HostStaged)
                .all_reduce(t, ReduceOp::Sum)
        })
        .collect();
    for (r, w) in works.into_iter().enumerate() {
        let t = w.wait().unwrap_or_else(|e| panic!("rank {r}: {e}"));
        assert_eq!(
            t.device(),
            if r == 1 { Device::Host } else { GPU },
            "rank {r}"
        );
        let v = t.to_host().and_then(|t| t.to_vec::<f32>());
        assert_eq!(v.ok(), Some(vec![6.0, 30.0]), "rank {r}");
    }
}

#[test]
fn device_tensors_refuse_host_accessors_and_round_trip() {
    let t = stand_in(Tensor::from_vec(vec![1i64, -2, 3]));
    assert_eq!(t.device(), GPU);
    assert_eq!((t.numel(), t.nbytes(), t.shape()), (3, 24, &[3usize][..]));
    assert!(matches!(t.to_vec::<i64>(), Err(Error::InvalidArgument(_))));
    assert!(matches!(
        t.as_slice::<i64>(),
        Err(Error::InvalidArgument(_))
    ));
    assert_eq!(
        t.to_host().and_then(|h| h.to_vec::<i64>()).ok(),
        Some(vec![1, -2, 3])
    );
    assert_eq!(TensorSpec::from(&t).device, GPU);
    // A device tensor never reaches the engine as if it were host memory.
    let plan = collectix::runtime::Plan::new(
        collectix::runtime::Request::AllReduce {
            tensor: t.clone(),
            op: ReduceOp::Sum,
        },
        &collectix::runtime::GroupInfo::new(
            collectix::GroupId::WORLD,
            vec![0],
            0,
            Default::default(),
        )
        .unwrap_or_else(|e| panic!("{e}")),
        &Default::default(),
    );
    assert!(matches!(plan, Err(Error::InvalidArgument(_))));
    // Mixing devices in one call is refused at once.
    let world = World::local(1).unwrap_or_else(|e| panic!("{e}"));
    let c = &world.communicators()[0];
    let mixed = c
        .all_gather(vec![TensorSpec::new(&[3], DType::I64)], t)
        .wait();
    assert!(matches!(mixed, Err(Error::InvalidArgument(m)) if m.contains("mixes")),);
}

#[test]
fn the_nccl_path_fails_with_a_typed_error_without_cuda() {
    let world = World::local(2).unwrap_or_else(|e| panic!("{e}"));
    let works: Vec<_> = world
        .communicators()
        .iter()
        .map(|c| c.all_reduce(stand_in(Tensor::from_vec(vec![1.0f32])), ReduceOp::Sum))
        .collect();
    for w in works {
        match w.wait() {
            // Built without the feature.
            Err(Error::Device(DeviceError::FeatureDisabled)) => {}
            // Built with it, on a machine without libcuda/libnccl: the library is named.
            Err(Error::Device(DeviceError::LibraryMissing { library, tried, .. })) => {
                assert!(!tried.is_empty(), "{library}: nothing tried");
            }
            // With libnccl and a GPU: stand-in memory is not CUDA memory.
            Err(Error::InvalidArgument(m)) => assert!(m.contains("CUDA memory"), "{m}"),
            other => panic!("expected a typed device error, got {other:?}"),
        }
    }
    let b = world.communicators()[0]
        .barrier_on(GPU)
        .wait_timeout(std::time::Duration::from_secs(30));
    assert!(matches!(b, Some(Err(Error::Device(_)))), "{b:?}");
    let to = Tensor::from_vec(vec![1u8]).to_device(GPU);
    assert!(matches!(to, Err(Error::Device(_))), "{to:?}");
    assert!(collectix::device::cuda_devices().is_err() || cfg!(feature = "cuda"));
}

/// Waits for `w`, at most 60 s (a hang fails the test instead of hanging it).
fn within<T: Send + 'static>(w: collectix::Work<T>) -> collectix::Result<T> {
    w.wait_timeout(Duration::from_secs(60))
        .unwrap_or_else(|| panic!("no result within 60 s"))
}

fn values(t: &Tensor) -> Vec<f32> {
    assert_eq!(t.device(), GPU);
    t.to_host()
        .and_then(|h| h.to_vec::<f32>())
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Device sends on the NCCL backend (stand-ins carry their data on the host, through the same
/// rendezvous and lanes as NCCL): every rank sends a small and a large tensor to every other
/// rank, on tags 1 and 2, and every receiver takes tag 2 first and waits for it before it
/// even posts tag 1 — the reverse of the order they were sent in. NCCL alone, which matches
/// by order, would wait forever here.
#[test]
fn device_sends_on_the_nccl_backend_complete_whatever_order_receivers_take_them_in() {
    let w = 3;
    let world = World::local(w).unwrap_or_else(|e| panic!("{e}"));
    let data = |from: usize, to: usize, tag: u32| -> Vec<f32> {
        let n = if tag == 1 { 3 } else { 300_000 };
        (0..n)
            .map(|i| (from * 100 + to * 10 + tag as usize) as f32 + i as f32)
            .collect()
    };
    std::thread::scope(|s| {
        for c in world.communicators() {
            s.spawn(move || {
                let me = c.rank();
                let mut sends = Vec::new();
                for to in (0..w).filter(|&p| p != me) {
                    for tag in [1, 2] {
                        let t = stand_in(Tensor::from_vec(data(me, to, tag)));
                        sends.push(c.send(t, to, tag));
                    }
                }
                for from in (0..w).filter(|&p| p != me) {
                    let n2 = data(from, me, 2).len();
                    let (t2, src) =
                        within(c.recv(TensorSpec::new(&[n2], DType::F32).on(GPU), Some(from), 2))
                            .unwrap_or_else(|e| panic!("rank {me} from {from}, tag 2: {e}"));
                    assert_eq!(src, from);
                    assert_eq!(
                        values(&t2),
                        data(from, me, 2),
                        "rank {me} from {from}, tag 2"
                    );
                    let (t1, _) =
                        within(c.recv(TensorSpec::new(&[3], DType::F32).on(GPU), Some(from), 1))
                            .unwrap_or_else(|e| panic!("rank {me} from {from}, tag 1: {e}"));
                    assert_eq!(
                        values(&t1),
                        data(from, me, 1),
                        "rank {me} from {from}, tag 1"
                    );
                }
                for (i, sent) in sends.into_iter().enumerate() {
                    wait_parked(sent).unwrap_or_else(|e| panic!("rank {me}, send {i}: {e}"));
                }
            });
        }
    });
}

/// Receives from any source, interleaved with collectives, issued all at once.
#[test]
fn device_receives_from_any_source_beside_collectives() {
    let w = 4;
    let world = World::local(w).unwrap_or_else(|e| panic!("{e}"));
    let comms = world.communicators();
    let mut works = Vec::new();
    let mut recvs = Vec::new();
    for c in comms.iter() {
        if c.rank() == 0 {
            for _ in 1..w {
                recvs.push(c.recv(TensorSpec::new(&[2], DType::F32).on(GPU), None, 7));
            }
        } else {
            let t = stand_in(Tensor::from_vec(vec![c.rank() as f32, 1.0]));
            works.push(c.send(t, 0, 7));
        }
    }
    let sums: Vec<_> = comms
        .iter()
        .map(|c| c.all_reduce(Tensor::from_vec(vec![1.0f32]), ReduceOp::Sum))
        .collect();
    let mut from: Vec<usize> = recvs
        .into_iter()
        .map(|r| {
            let (t, src) = within(r).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(values(&t), vec![src as f32, 1.0]);
            src
        })
        .collect();
    from.sort();
    assert_eq!(from, vec![1, 2, 3]);
    for s in works {
        within(s).unwrap_or_else(|e| panic!("{e}"));
    }
    for s in sums {
        let t = within(s).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(t.to_vec::<f32>().ok(), Some(vec![w as f32]));
    }
}

/// A ring of `batch_isend_irecv` on device tensors, every rank in its own thread, one rank
/// late at the start: every round's data arrives from the left neighbour, in order.
#[test]
fn a_skewed_ring_of_device_batches_delivers_every_round_in_order() {
    let (w, rounds) = (4, 12);
    let world = World::local(w).unwrap_or_else(|e| panic!("{e}"));
    let data = |from: usize, round: usize, n: usize| -> Vec<f32> {
        (0..n).map(|i| (from * 1000 + round + i) as f32).collect()
    };
    std::thread::scope(|s| {
        for c in world.communicators() {
            s.spawn(move || {
                let me = c.rank();
                let (right, left) = ((me + 1) % w, (me + w - 1) % w);
                if me == 2 {
                    std::thread::sleep(Duration::from_millis(50));
                }
                for round in 0..rounds {
                    let n = 1 + (round * 37) % 1000;
                    let works = c.batch_isend_irecv(vec![
                        collectix::P2POp::Send {
                            tensor: stand_in(Tensor::from_vec(data(me, round, n))),
                            peer: right,
                            tag: 0,
                        },
                        collectix::P2POp::Recv {
                            spec: TensorSpec::new(&[n], DType::F32).on(GPU),
                            peer: left,
                            tag: 0,
                        },
                    ]);
                    let mut got = None;
                    for w in works {
                        let r = within(w);
                        if let Some(t) =
                            r.unwrap_or_else(|e| panic!("rank {me}, round {round}: {e}"))
                        {
                            got = Some(values(&t));
                        }
                    }
                    assert_eq!(got, Some(data(left, round, n)), "rank {me}, round {round}");
                }
            });
        }
    });
}

/// A device send met by a receive on the other path (the host-staged backend, or a host
/// spec), or by one of another size, is a mismatch on both ranks, not wrong data or a hang.
#[test]
fn a_device_send_met_by_another_path_or_size_is_a_mismatch_on_both_ranks() {
    for case in 0..3 {
        let world = World::local(2).unwrap_or_else(|e| panic!("{e}"));
        let (a, b) = (&world.communicators()[0], &world.communicators()[1]);
        let sent = a.send(stand_in(Tensor::from_vec(vec![4i32, 5])), 1, 9);
        let got = match case {
            0 => b.with_device_backend(DeviceBackend::HostStaged).recv(
                TensorSpec::new(&[2], DType::I32).on(GPU),
                Some(0),
                9,
            ),
            1 => b.recv(TensorSpec::new(&[2], DType::I32), Some(0), 9),
            _ => b.recv(TensorSpec::new(&[3], DType::I32).on(GPU), Some(0), 9),
        };
        let mismatch = |e: &Error| match e {
            Error::Mismatch { .. } => true,
            Error::GroupAborted { cause, .. } => matches!(**cause, Error::Mismatch { .. }),
            _ => false,
        };
        let r = within(got).err();
        assert!(
            r.as_ref().is_some_and(mismatch),
            "case {case}, receiver: {r:?}"
        );
        let r = within(sent).err();
        assert!(
            r.as_ref().is_some_and(mismatch),
            "case {case}, sender: {r:?}"
        );
    }
}

/// A device send nobody receives fails with a timeout (the group's: it waits for its
/// receiver as long as any send of its lane) and breaks its lane: the next send to that rank
/// fails at once with the same error. Like every timeout, it also aborts the group on that
/// rank, so later calls fail at once rather than hang.
#[test]
fn an_unreceived_device_send_times_out_and_breaks_its_lane() {
    let opts = collectix::GroupOptions {
        timeout: Duration::from_millis(300),
        ..Default::default()
    };
    let world = World::local_with(2, opts).unwrap_or_else(|e| panic!("{e}"));
    let a = &world.communicators()[0];
    let send = |v: f32| a.send(stand_in(Tensor::from_vec(vec![v])), 1, 3);
    let first = within(send(1.0));
    assert!(matches!(first, Err(Error::Timeout { .. })), "{first:?}");
    let next = within(send(2.0));
    assert_eq!(next.err(), first.err());
    let got = within(a.recv(TensorSpec::new(&[1], DType::F32).on(GPU), Some(1), 3));
    assert!(
        matches!(got, Err(Error::GroupAborted { .. })),
        "{:?}",
        got.err()
    );
}

/// A direction between two ranks keeps to one device (its NCCL communicator lives on one):
/// a send from another device is refused at once; a receive into another device refuses
/// the sender's ticket, and both fail with `InvalidArgument`.
#[test]
fn a_lane_keeps_to_one_device_on_each_end() {
    let world = World::local(2).unwrap_or_else(|e| panic!("{e}"));
    let (a, b) = (&world.communicators()[0], &world.communicators()[1]);
    let other = Device::Cuda(1);
    let on = |d: Device| {
        StandIn::tensor(&Tensor::from_vec(vec![1.0f32]), d).unwrap_or_else(|e| panic!("{e}"))
    };
    let spec = |d: Device| TensorSpec::new(&[1], DType::F32).on(d);
    // The lane 0 → 1 is on cuda:0 at both ends after this.
    let s = a.send(on(GPU), 1, 0);
    assert!(within(b.recv(spec(GPU), Some(0), 0)).is_ok());
    assert!(within(s).is_ok());
    let refused = within(a.send(on(other), 1, 0));
    assert!(
        matches!(refused, Err(Error::InvalidArgument(_))),
        "{refused:?}"
    );
    let s = a.send(on(GPU), 1, 0);
    let r = within(b.recv(spec(other), Some(0), 0));
    assert!(matches!(r, Err(Error::InvalidArgument(_))), "{:?}", r.err());
    let s = within(s);
    assert!(matches!(s, Err(Error::InvalidArgument(_))), "{s:?}");
    // The lane goes on working on its device.
    let s = a.send(on(GPU), 1, 0);
    let got = within(b.recv(spec(GPU), Some(0), 0));
    assert_eq!(got.map(|(t, _)| values(&t)), Ok(vec![1.0]));
    assert!(within(s).is_ok());
}

#[test]
fn reserved_tags_are_refused() {
    let world = World::local(2).unwrap_or_else(|e| panic!("{e}"));
    let a = &world.communicators()[0];
    let tag = collectix::FIRST_RESERVED_TAG;
    let s = within(a.send(Tensor::from_vec(vec![1u8]), 1, tag));
    assert!(matches!(s, Err(Error::InvalidArgument(_))), "{s:?}");
    let r = within(a.recv(TensorSpec::new(&[1], DType::U8), None, u32::MAX));
    assert!(matches!(r, Err(Error::InvalidArgument(_))), "{r:?}");
}

/// Destroying a group fails its device sends still waiting for their receiver with
/// `Shutdown` at once, and later ones too.
#[test]
fn destroying_a_group_fails_its_waiting_device_sends_at_once() {
    let world = World::local(2).unwrap_or_else(|e| panic!("{e}"));
    let a = &world.communicators()[0];
    let sent = a.send(stand_in(Tensor::from_vec(vec![1.0f32])), 1, 0);
    // Its caller waits, parked on the rank by now.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(sent.wait());
    });
    std::thread::sleep(Duration::from_millis(100));
    let _ = within(a.destroy());
    let r = rx
        .recv_timeout(Duration::from_secs(60))
        .unwrap_or_else(|_| panic!("a parked wait() was not woken"));
    assert_eq!(r.err(), Some(Error::Shutdown));
    let later = within(a.send(stand_in(Tensor::from_vec(vec![1.0f32])), 1, 0));
    assert!(later.is_err(), "{later:?}");
}
