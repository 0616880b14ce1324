//! No size from a caller crashes the process (an all_gather declaring a peer's block as
//! 2^50 elements used to abort the process, the ring layout allocating before anything was
//! checked). Every absurd size is `InvalidArgument` on the caller, at once.

use collectix::runtime::collective::{Request, TensorSpec};
use collectix::{CallOptions, DType, Error, GroupOptions, ReduceOp, Tensor, World};

fn invalid(r: collectix::Result<collectix::runtime::collective::Output>) -> bool {
    matches!(r, Err(Error::InvalidArgument(_)))
}

#[test]
fn an_absurd_peer_block_in_all_gather_is_an_invalid_argument() {
    let world = World::local(2).unwrap_or_else(|e| panic!("{e}"));
    let c = &world.communicators()[0];
    // Own input above 64 KiB so that the ring (the default) is chosen.
    let input = Tensor::from_vec(vec![1.0f32; 20_000]);
    let outputs = vec![
        TensorSpec::new(&[20_000], DType::F32),
        TensorSpec::new(&[1 << 50], DType::F32),
    ];
    let r = c
        .submit(
            Request::AllGather { input, outputs },
            &CallOptions::default(),
        )
        .wait();
    assert!(invalid(r.clone()), "{r:?}");
}

#[test]
fn absurd_output_specs_are_invalid_arguments_everywhere() {
    let world = World::local(2).unwrap_or_else(|e| panic!("{e}"));
    let c = &world.communicators()[0];
    let huge = TensorSpec::new(&[1 << 40, 1 << 20], DType::F64);
    let reqs = vec![
        Request::Recv {
            spec: huge.clone(),
            src: Some(1),
            tag: 0,
        },
        Request::Scatter {
            output: huge.clone(),
            inputs: None,
            root: 1,
        },
        Request::AllToAll {
            inputs: vec![
                Tensor::from_vec(vec![1.0f64]),
                Tensor::from_vec(vec![1.0f64]),
            ],
            outputs: vec![TensorSpec::new(&[1], DType::F64), huge.clone()],
        },
        Request::AllGatherIntoTensor {
            input: Tensor::from_vec(vec![1.0f64; 3]),
            output: huge.clone(),
        },
        Request::AllToAllSingle {
            input: Tensor::from_vec(vec![1.0f64; 2]),
            output: huge,
            output_splits: None,
            input_splits: None,
        },
    ];
    for req in reqs {
        let what = format!("{req:?}").chars().take(60).collect::<String>();
        let r = c.submit(req, &CallOptions::default()).wait();
        assert!(invalid(r.clone()), "{what}: {r:?}");
    }
}

#[test]
fn the_per_call_limit_is_an_option_and_says_so() {
    let opts = GroupOptions {
        max_call_bytes: 1 << 10,
        ..GroupOptions::default()
    };
    let world = World::local_with(1, opts).unwrap_or_else(|e| panic!("{e}"));
    let c = &world.communicators()[0];
    let r = c
        .all_reduce(Tensor::from_vec(vec![1.0f32; 1024]), ReduceOp::Sum)
        .wait();
    assert!(
        matches!(&r, Err(Error::InvalidArgument(m)) if m.contains("max_call_bytes")),
        "{r:?}"
    );
    let r = c
        .all_reduce(Tensor::from_vec(vec![1.0f32; 16]), ReduceOp::Sum)
        .wait();
    assert!(r.is_ok());
}
