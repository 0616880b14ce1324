//! Device tensors without a GPU: the host-staged path with stand-in device memory on 1–4
//! ranks (every collective, checked against the host reference), mixed groups, the typed
//! errors of the NCCL path, and the host-only accessors refusing device tensors.

mod common;
use collectix::device::StandIn;
use collectix::runtime::collective::TensorSpec;
use collectix::{
    DType, Device, DeviceBackend, DeviceError, Error, ReduceOp, Tensor, TensorDeviceExt, World,
};
use common::device::{cases, run};

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

#[test]
fn a_device_send_is_staged_under_either_backend() {
    let world = World::local(2).unwrap_or_else(|e| panic!("{e}"));
    let (a, b) = (&world.communicators()[0], &world.communicators()[1]);
    // The default backend is NCCL; a send of a device tensor still goes through the host.
    let sent = a.send(stand_in(Tensor::from_vec(vec![4i32, 5])), 1, 9);
    let got = b.recv(TensorSpec::new(&[2], DType::I32), Some(0), 9);
    assert!(sent.wait().is_ok());
    let (t, src) = got.wait().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((src, t.to_vec::<i32>().ok()), (0, Some(vec![4, 5])));
}
