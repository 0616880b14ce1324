//! `Plan::check`, the collective checks a data path of its own (the NCCL backend) starts
//! from, agrees with planning: the same fingerprint (but for the algorithm, which planning
//! picks) on every case of the matrix, and the same refusal of a wrong call.

use collectix_runtime::collective::TensorSpec;
use collectix_runtime::group::{CallOptions, GroupInfo, GroupOptions};
use collectix_runtime::testing::matrix;
use collectix_runtime::{DType, DataPath, Error, Plan, ReduceOp, Request, Tensor};

fn world(w: usize, r: usize) -> GroupInfo {
    GroupInfo::world(w, r, GroupOptions::default()).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn check_gives_planning_s_fingerprint_on_every_case() {
    for w in [1, 2, 3, 4, 5] {
        for case in matrix(w) {
            for r in 0..w {
                let info = world(w, r);
                let planned = Plan::new(case.request(r), &info, &CallOptions::default())
                    .unwrap_or_else(|e| panic!("{case:?}: {e}"));
                let checked =
                    Plan::check(case.request(r), &info).unwrap_or_else(|e| panic!("{case:?}: {e}"));
                let mut want = planned.fingerprint();
                want.algorithm = None;
                assert_eq!(
                    checked.fingerprint(DataPath::Engine),
                    want,
                    "{case:?} rank {r}"
                );
                let on_nccl = checked.fingerprint(DataPath::Nccl);
                assert_eq!(on_nccl.path, DataPath::Nccl);
            }
        }
    }
}

#[test]
fn check_refuses_what_planning_refuses() {
    let info = world(3, 1);
    let t = || Tensor::from_vec(vec![1.0f32; 4]);
    let wrong = [
        Request::Reduce {
            tensor: t(),
            root: 3,
            op: ReduceOp::Sum,
        },
        Request::Broadcast {
            tensor: t(),
            root: 7,
        },
        Request::AllGatherIntoTensor {
            input: t(),
            output: TensorSpec::new(&[5], DType::F32),
        },
        Request::AllGather {
            input: t(),
            outputs: vec![TensorSpec::new(&[4], DType::F32); 2],
        },
        Request::Scatter {
            output: TensorSpec::new(&[4], DType::I32),
            inputs: None,
            root: 1,
        },
        Request::ReduceScatterTensor {
            input: t(),
            output: TensorSpec::new(&[2], DType::F32),
            op: ReduceOp::Sum,
        },
        Request::AllToAllSingle {
            input: t(),
            output: TensorSpec::new(&[4], DType::F32),
            output_splits: None,
            input_splits: Some(vec![1, 1]),
        },
    ];
    for req in wrong {
        let planned = Plan::new(req.clone(), &info, &CallOptions::default()).err();
        let checked = Plan::check(req.clone(), &info).err();
        assert!(
            matches!(planned, Some(Error::InvalidArgument(_))),
            "{req:?}: {planned:?}"
        );
        assert_eq!(checked, planned, "{req:?}");
    }
    // Point-to-point calls have no collective check.
    let send = Request::Send {
        tensor: t(),
        dst: 0,
        tag: 0,
    };
    assert!(matches!(
        Plan::check(send, &info),
        Err(Error::InvalidArgument(_))
    ));
}
