//! Device tensors on a real GPU (the `cuda` feature): every collective over NCCL on a world
//! of one, and over the host-staged path on 2–4 ranks sharing GPU 0 (NCCL refuses two ranks
//! on one device), checked against the host reference; the agreement step's mismatch and
//! timeout errors. On a machine without a GPU each test says so and passes without checking
//! anything (CI has none; see docs/gpu.md for what was run where).
#![cfg(feature = "cuda")]

mod common;
use collectix::runtime::testing::Case;
use collectix::{
    CallOptions, DType, Device, DeviceBackend, DeviceError, Error, GroupOptions, OpKind, ReduceOp,
    Tensor, TensorDeviceExt, World,
};
use common::device::{cases, run, wait_parked};
use std::time::Duration;

const GPU: Device = Device::Cuda(0);

/// Whether a GPU and NCCL are here; prints why not.
fn gpu() -> bool {
    match (
        collectix::device::cuda_devices(),
        collectix::device::nccl_version(),
    ) {
        (Ok(n), Ok(v)) if n > 0 => {
            eprintln!("{n} CUDA device(s), NCCL {v}");
            true
        }
        (d, v) => {
            eprintln!("SKIPPED (no GPU here): devices {d:?}, nccl {v:?}");
            false
        }
    }
}

/// A world of `n` ranks in this process whose calls time out after `timeout`.
fn world_with_timeout(n: usize, timeout: Duration) -> World {
    let opts = GroupOptions {
        timeout,
        ..GroupOptions::default()
    };
    World::local_with(n, opts).unwrap_or_else(|e| panic!("{e}"))
}

fn to_gpu(t: Tensor) -> Tensor {
    t.to_device(GPU)
        .unwrap_or_else(|e| panic!("to_device: {e}"))
}

#[test]
fn nccl_runs_every_collective_on_a_world_of_one() {
    if !gpu() {
        return;
    }
    let world = World::local(1).unwrap_or_else(|e| panic!("{e}"));
    let wrong = run(&world, DeviceBackend::Nccl, GPU, &cases(1), &to_gpu);
    assert!(
        wrong.is_empty(),
        "{} wrong:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
    // Large enough to take several NCCL channels, and every output checked.
    let big: Vec<Case> = [
        OpKind::AllReduce,
        OpKind::AllGatherIntoTensor,
        OpKind::ReduceScatterTensor,
    ]
    .into_iter()
    .map(|kind| Case {
        kind,
        size: 1,
        count: 3 << 20,
        dtype: DType::F32,
        op: ReduceOp::Sum,
        root: 0,
        algorithm: None,
    })
    .collect();
    let wrong = run(&world, DeviceBackend::Nccl, GPU, &big, &to_gpu);
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn host_staged_runs_every_collective_on_2_to_4_ranks_sharing_one_gpu() {
    if !gpu() {
        return;
    }
    for w in 2..=4 {
        let world = World::local(w).unwrap_or_else(|e| panic!("{e}"));
        let wrong = run(&world, DeviceBackend::HostStaged, GPU, &cases(w), &to_gpu);
        assert!(
            wrong.is_empty(),
            "world of {w}: {} wrong:\n{}",
            wrong.len(),
            wrong.join("\n")
        );
    }
}

#[test]
fn what_nccl_lacks_is_a_clear_error() {
    if !gpu() {
        return;
    }
    let world = World::local(1).unwrap_or_else(|e| panic!("{e}"));
    let c = &world.communicators()[0];
    for (t, op) in [
        (Tensor::from_vec(vec![true, false]), ReduceOp::Max),
        (Tensor::from_vec(vec![1i32, 2]), ReduceOp::BXor),
        (Tensor::from_vec(vec![1i64, 2]), ReduceOp::Avg),
    ] {
        let r = c.all_reduce(to_gpu(t), op).wait();
        assert!(
            matches!(r, Err(Error::Device(DeviceError::Unsupported(_)))),
            "{op}: {r:?}"
        );
    }
    // A dtype NCCL has no type for is refused even where no reduction would read it (a
    // grouped exchange once moved i16 as bytes).
    let r = c
        .all_to_all_single(
            collectix::TensorSpec::new(&[2], DType::I16).on(GPU),
            to_gpu(Tensor::from_vec(vec![1i16, 2])),
            None,
            None,
        )
        .wait();
    assert!(
        matches!(r, Err(Error::Device(DeviceError::Unsupported(_)))),
        "i16: {r:?}"
    );
    // The group goes on working after a refused call.
    let r = c
        .all_reduce(to_gpu(Tensor::from_vec(vec![2.5f32])), ReduceOp::Sum)
        .wait();
    assert_eq!(
        r.and_then(|t| t.to_host())
            .and_then(|t| t.to_vec::<f32>())
            .ok(),
        Some(vec![2.5])
    );
    // A barrier on the device: a one-element NCCL all_reduce.
    assert!(wait(c.barrier_on(GPU)).is_ok());
    // Bool moves fine where nothing is reduced.
    let r = c
        .broadcast(to_gpu(Tensor::from_vec(vec![true, false, true])), 0)
        .wait();
    assert_eq!(
        r.and_then(|t| t.to_host())
            .and_then(|t| t.to_vec::<bool>())
            .ok(),
        Some(vec![true, false, true])
    );
}

#[test]
fn mismatched_nccl_calls_fail_on_every_rank_before_nccl_runs() {
    if !gpu() {
        return;
    }
    // Two ranks on one GPU: NCCL would refuse them, but the mismatch is found first.
    let world = World::local(2).unwrap_or_else(|e| panic!("{e}"));
    let works: Vec<_> = world
        .communicators()
        .iter()
        .map(|c| {
            c.all_reduce(
                to_gpu(Tensor::from_vec(vec![1.0f32; 4 + c.rank()])),
                ReduceOp::Sum,
            )
        })
        .collect();
    for (r, w) in works.into_iter().enumerate() {
        let e = w
            .wait_timeout(Duration::from_secs(30))
            .unwrap_or_else(|| panic!("rank {r} hung"));
        assert!(matches!(e, Err(Error::Mismatch { .. })), "rank {r}: {e:?}");
    }
    // A rank with a host tensor against one on NCCL: a mismatch too, never a hang.
    let world = World::local(2).unwrap_or_else(|e| panic!("{e}"));
    let works: Vec<_> = world
        .communicators()
        .iter()
        .map(|c| {
            let t = Tensor::from_vec(vec![1.0f32; 4]);
            c.all_reduce(if c.rank() == 0 { to_gpu(t) } else { t }, ReduceOp::Sum)
        })
        .collect();
    for (r, w) in works.into_iter().enumerate() {
        let e = w
            .wait_timeout(Duration::from_secs(30))
            .unwrap_or_else(|| panic!("rank {r} hung"));
        let e = e.err().map(|e| e.root_cause().clone());
        assert!(matches!(e, Some(Error::Mismatch { .. })), "rank {r}: {e:?}");
    }
}

#[test]
fn a_rank_that_never_calls_is_a_timeout_not_a_hang() {
    if !gpu() {
        return;
    }
    let world = world_with_timeout(2, Duration::from_secs(2));
    let c0 = &world.communicators()[0];
    let w = c0.all_reduce_with(
        to_gpu(Tensor::from_vec(vec![1.0f32])),
        ReduceOp::Sum,
        &CallOptions::default(),
    );
    let e = w
        .wait_timeout(Duration::from_secs(30))
        .unwrap_or_else(|| panic!("hung"));
    assert!(matches!(e, Err(Error::Timeout { .. })), "{e:?}");
}

/// NCCL refuses two ranks on one device; ranks of one process that share a GPU take the
/// device-local path instead (tests/cuda_local.rs has its full matrix), on the default
/// backend, with no error.
#[test]
fn two_ranks_on_one_gpu_take_the_device_local_path() {
    if !gpu() {
        return;
    }
    let world = world_with_timeout(2, Duration::from_secs(20));
    let works: Vec<_> = world
        .communicators()
        .iter()
        .map(|c| c.all_reduce(to_gpu(Tensor::from_vec(vec![1.0f32; 8])), ReduceOp::Sum))
        .collect();
    for (r, w) in works.into_iter().enumerate() {
        let got = w
            .wait_timeout(Duration::from_secs(60))
            .unwrap_or_else(|| panic!("rank {r} hung"))
            .and_then(|t| t.to_host())
            .and_then(|t| t.to_vec::<f32>());
        assert_eq!(got.ok(), Some(vec![2.0f32; 8]), "rank {r}");
    }
}

#[test]
fn results_never_write_over_a_tensor_the_caller_kept() {
    if !gpu() {
        return;
    }
    let world = World::local(1).unwrap_or_else(|e| panic!("{e}"));
    let c = &world.communicators()[0];
    let kept = to_gpu(Tensor::from_vec(vec![1.0f32, 2.0, 3.0]));
    // A clone passed: the result is a new buffer, `kept` is untouched.
    let doubled = c.all_reduce(kept.clone(), ReduceOp::PremulSum(2.0)).wait();
    let host = |t: Tensor| t.to_host().and_then(|t| t.to_vec::<f32>()).ok();
    assert_eq!(doubled.ok().and_then(host), Some(vec![2.0, 4.0, 6.0]));
    assert_eq!(host(kept.clone()), Some(vec![1.0, 2.0, 3.0]));
    // Moved in: NCCL may work in place; the result is right either way.
    let moved = to_gpu(Tensor::from_vec(vec![5.0f32; 3]));
    let r = c.all_reduce(moved, ReduceOp::PremulSum(2.0)).wait();
    assert_eq!(r.ok().and_then(host), Some(vec![10.0; 3]));
    // A view of a larger allocation (all_gather's per-rank outputs) is never written in place.
    let parts = c
        .all_gather(
            vec![collectix::TensorSpec::new(&[3], DType::F32).on(GPU)],
            kept.clone(),
        )
        .wait()
        .unwrap_or_else(|e| panic!("{e}"));
    let r = c
        .all_reduce(parts[0].clone(), ReduceOp::PremulSum(2.0))
        .wait();
    assert_eq!(r.ok().and_then(host), Some(vec![2.0, 4.0, 6.0]));
    assert_eq!(host(parts[0].clone()), Some(vec![1.0, 2.0, 3.0]));
}

/// The device address of `t`'s first byte.
fn address(t: &Tensor) -> Option<u64> {
    use collectix::device::cuda::cudarc::driver::DevicePtr;
    let (buf, range) = t
        .device_storage()?
        .as_any()
        .downcast_ref::<collectix::device::cuda::CudaStorage>()?
        .slice()?;
    let (p, _record) = buf.device_ptr(buf.stream());
    Some(p + range.start as u64)
}

#[test]
fn an_output_dropped_is_reused_and_one_still_held_is_not() {
    if !gpu() {
        return;
    }
    let world = World::local(1).unwrap_or_else(|e| panic!("{e}"));
    let c = &world.communicators()[0];
    let n = 1 << 16;
    let values = |k: f32| (0..n).map(|i| (i % 1000) as f32 * k).collect::<Vec<f32>>();
    let x = to_gpu(Tensor::from_vec(values(1.0)));
    let host = |t: &Tensor| t.to_host().and_then(|t| t.to_vec::<f32>()).ok();
    let call = |k: f32| {
        c.all_reduce(x.clone(), ReduceOp::PremulSum(f64::from(k)))
            .wait()
            .unwrap_or_else(|e| panic!("{e}"))
    };
    // An output dropped goes back to the group's bin; the next output of its size takes it.
    let a = call(1.0);
    let a_at = address(&a);
    assert!(a_at.is_some());
    drop(a);
    let b = call(2.0);
    assert_eq!(
        address(&b),
        a_at,
        "the dropped output's buffer was not reused"
    );
    assert_eq!(host(&b), Some(values(2.0)));
    // A buffer still held through `slice()` is never handed out again.
    let held = b
        .device_storage()
        .and_then(|s| {
            s.as_any()
                .downcast_ref::<collectix::device::cuda::CudaStorage>()
        })
        .and_then(|s| s.slice())
        .map(|(buf, _)| buf.clone())
        .unwrap_or_else(|| panic!("no device buffer"));
    drop(b);
    let d = call(3.0);
    assert_ne!(address(&d), a_at, "a held buffer was reused");
    assert_eq!(host(&d), Some(values(3.0)));
    let bytes = held
        .stream()
        .clone_dtoh(&*held)
        .unwrap_or_else(|e| panic!("{e}"));
    let kept: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|b| f32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    assert_eq!(kept, values(2.0), "a held buffer was written over");
    // Many outputs alive at once, dropped, then as many again: right values each time.
    for round in 0..3 {
        let outs: Vec<Tensor> = (0..8).map(|i| call((round * 8 + i) as f32)).collect();
        for (i, o) in outs.iter().enumerate() {
            assert_eq!(host(o), Some(values((round * 8 + i) as f32)));
        }
    }
}

#[test]
fn an_nccl_operation_past_its_timeout_aborts_the_communicator() {
    if !gpu() {
        return;
    }
    let tiny = CallOptions {
        algorithm: None,
        timeout: Some(Duration::from_micros(1)),
    };
    let small = || to_gpu(Tensor::from_vec(vec![1.0f32]));
    // A communicator that cannot be made in time (nonblocking init, polled): a typed error,
    // and the group's later calls fail at once with it.
    let world = World::local(1).unwrap_or_else(|e| panic!("{e}"));
    let c = &world.communicators()[0];
    let r = wait(c.all_reduce_with(small(), ReduceOp::Sum, &tiny));
    eprintln!("init past its timeout: {r:?}");
    assert!(
        matches!(r, Err(Error::Device(DeviceError::Nccl { code: 7, .. }))),
        "{r:?}"
    );
    let later = wait(c.all_reduce(small(), ReduceOp::Sum));
    assert!(
        matches!(later, Err(Error::Device(DeviceError::Nccl { code: 7, .. }))),
        "{later:?}"
    );

    // An operation past its timeout: the communicator is aborted, and so are later calls.
    let world = World::local(1).unwrap_or_else(|e| panic!("{e}"));
    let c = &world.communicators()[0];
    assert!(
        wait(c.all_reduce(small(), ReduceOp::Sum)).is_ok(),
        "the communicator is made"
    );
    // 1 GiB copied out of place takes about a millisecond; give it a microsecond.
    let big = to_gpu(Tensor::full(&[256 << 20], 1.0f32).unwrap_or_else(|e| panic!("{e}")));
    let r = wait(c.all_reduce_with(big.clone(), ReduceOp::Sum, &tiny));
    eprintln!("past its timeout: {r:?}");
    assert!(
        matches!(r, Err(Error::Device(DeviceError::NcclTimeout { .. }))),
        "{r:?}"
    );
    let later = wait(c.all_reduce(small(), ReduceOp::Sum));
    eprintln!("after the abort: {later:?}");
    assert!(
        matches!(later, Err(Error::Device(DeviceError::NcclTimeout { .. }))),
        "{later:?}"
    );
}

#[test]
fn send_and_recv_of_device_tensors_are_staged_and_complete_beside_collectives() {
    if !gpu() {
        return;
    }
    let world = World::local(2).unwrap_or_else(|e| panic!("{e}"));
    let (a, b) = (&world.communicators()[0], &world.communicators()[1]);
    let staged = |c: &collectix::Communicator| c.with_device_backend(DeviceBackend::HostStaged);
    // Rank 0 sends before its collective, rank 1 receives after it: valid, so it completes.
    // Both ranks share GPU 0, so the host-staged backend (NCCL refuses two ranks on one GPU).
    let sent = staged(a).send(to_gpu(Tensor::from_vec(vec![7i64, 8, 9])), 1, 5);
    let ra = staged(a).all_reduce(to_gpu(Tensor::from_vec(vec![1.0f32])), ReduceOp::Sum);
    let rb = staged(b).all_reduce(to_gpu(Tensor::from_vec(vec![2.0f32])), ReduceOp::Sum);
    let got = staged(b).recv(
        collectix::TensorSpec::new(&[3], DType::I64).on(GPU),
        Some(0),
        5,
    );
    assert!(wait(sent).is_ok());
    for r in [ra, rb] {
        let t = wait(r).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            t.to_host().and_then(|t| t.to_vec::<f32>()).ok(),
            Some(vec![3.0])
        );
    }
    let (t, src) = wait(got).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((t.device(), src), (GPU, 0));
    assert_eq!(
        t.to_host().and_then(|t| t.to_vec::<i64>()).ok(),
        Some(vec![7, 8, 9])
    );
}

/// Send and receive between two ranks sharing one GPU: NCCL would refuse the lane's
/// communicator; ranks of one process take the device-local carrier (a device copy) instead
/// (tests/cuda_local.rs drives it harder).
#[test]
fn send_and_recv_between_two_ranks_on_one_gpu_take_the_device_local_path() {
    if !gpu() {
        return;
    }
    let world = world_with_timeout(2, Duration::from_secs(20));
    let (a, b) = (&world.communicators()[0], &world.communicators()[1]);
    let sent = a.send(to_gpu(Tensor::from_vec(vec![1.5f32; 8])), 1, 0);
    let got = b.recv(
        collectix::TensorSpec::new(&[8], DType::F32).on(GPU),
        Some(0),
        0,
    );
    let sent = sent
        .wait_timeout(Duration::from_secs(60))
        .unwrap_or_else(|| panic!("sender hung"));
    let got = got
        .wait_timeout(Duration::from_secs(60))
        .unwrap_or_else(|| panic!("receiver hung"));
    assert!(sent.is_ok(), "sender: {sent:?}");
    let (t, src) = got.unwrap_or_else(|e| panic!("receiver: {e}"));
    assert_eq!((t.device(), src), (GPU, 0));
    assert_eq!(
        t.to_host().and_then(|t| t.to_vec::<f32>()).ok(),
        Some(vec![1.5f32; 8])
    );
}

/// Send and receive on NCCL between two GPUs (rank r on GPU r), each rank sending to the
/// other at once, tags taken in the reverse of the order they were sent, beside NCCL
/// collectives, and 64 MiB. Needs two GPUs: skipped (and said so) with fewer.
#[test]
fn nccl_send_and_recv_between_two_gpus_in_any_order() {
    if !gpu() {
        return;
    }
    match collectix::device::cuda_devices() {
        Ok(n) if n >= 2 => {}
        n => {
            eprintln!("SKIPPED (needs two GPUs): {n:?}");
            return;
        }
    }
    let world = World::local(2).unwrap_or_else(|e| panic!("{e}"));
    let data = |from: usize, tag: u32| -> Vec<f32> {
        let n = match tag {
            1 => 3,
            2 => 1 << 20,
            _ => 16 << 20,
        };
        (0..n)
            .map(|i| (from * 10 + tag as usize) as f32 + (i % 1000) as f32)
            .collect()
    };
    std::thread::scope(|s| {
        for c in world.communicators() {
            s.spawn(move || {
                let (me, peer) = (c.rank(), 1 - c.rank());
                let dev = Device::Cuda(me as u32);
                let on = |v: Vec<f32>| {
                    Tensor::from_vec(v)
                        .to_device(dev)
                        .unwrap_or_else(|e| panic!("{e}"))
                };
                let sends: Vec<_> = [1, 2, 3]
                    .iter()
                    .map(|&tag| c.send(on(data(me, tag)), peer, tag))
                    .collect();
                let sum = c.all_reduce(on(vec![1.0f32; 4]), ReduceOp::Sum);
                for tag in [3, 2, 1] {
                    let n = data(peer, tag).len();
                    let (t, src) = wait(c.recv(
                        collectix::TensorSpec::new(&[n], DType::F32).on(dev),
                        Some(peer),
                        tag,
                    ))
                    .unwrap_or_else(|e| panic!("rank {me}, tag {tag}: {e}"));
                    assert_eq!((t.device(), src), (dev, peer));
                    let v = t.to_host().and_then(|t| t.to_vec::<f32>());
                    assert!(
                        v.ok() == Some(data(peer, tag)),
                        "rank {me}, tag {tag}: wrong data"
                    );
                }
                for (i, w) in sends.into_iter().enumerate() {
                    wait_parked(w).unwrap_or_else(|e| panic!("rank {me}, send {i}: {e}"));
                }
                let t = wait(sum).unwrap_or_else(|e| panic!("{e}"));
                assert_eq!(
                    t.to_host().and_then(|t| t.to_vec::<f32>()).ok(),
                    Some(vec![2.0; 4])
                );
            });
        }
    });
}

fn wait<T>(w: collectix::Work<T>) -> collectix::Result<T> {
    w.wait_timeout(Duration::from_secs(30))
        .unwrap_or_else(|| panic!("hung"))
}
