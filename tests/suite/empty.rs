//! Empty tensors of every dtype work with every accessor and every collective (an empty
//! tensor wider than a byte used to fail every typed accessor with an alignment error).

use collectix::runtime::testing::{Case, COLLECTIVES};
use collectix::{CallOptions, DType, ReduceOp, Tensor, World};

#[test]
fn empty_tensors_of_every_dtype_have_working_accessors() {
    assert_eq!(
        Tensor::from_vec(Vec::<i64>::new()).to_vec::<i64>().ok(),
        Some(vec![])
    );
    assert_eq!(
        Tensor::from_vec(Vec::<f64>::new())
            .as_slice::<f64>()
            .map(<[f64]>::len)
            .ok(),
        Some(0)
    );
    for dtype in DType::ALL {
        for t in [
            Tensor::empty(dtype),
            Tensor::zeros(&[0, 3], dtype).unwrap_or_else(|e| panic!("{e}")),
        ] {
            assert_eq!(t.numel(), 0);
            assert!(t.to_f64_vec().is_empty());
            assert_eq!(t.format_values(), "[]", "{dtype}");
            let ok = match dtype {
                DType::F16 => t
                    .to_vec::<collectix::runtime::tensor::dtype::f16>()
                    .map(|v| v.len()),
                DType::BF16 => t
                    .to_vec::<collectix::runtime::tensor::dtype::bf16>()
                    .map(|v| v.len()),
                DType::F32 => t.to_vec::<f32>().map(|v| v.len()),
                DType::F64 => t.to_vec::<f64>().map(|v| v.len()),
                DType::I8 => t.to_vec::<i8>().map(|v| v.len()),
                DType::U8 => t.to_vec::<u8>().map(|v| v.len()),
                DType::I32 => t.to_vec::<i32>().map(|v| v.len()),
                DType::I64 => t.to_vec::<i64>().map(|v| v.len()),
                DType::I16 => t.to_vec::<i16>().map(|v| v.len()),
                DType::U16 => t.to_vec::<u16>().map(|v| v.len()),
                DType::U32 => t.to_vec::<u32>().map(|v| v.len()),
                DType::U64 => t.to_vec::<u64>().map(|v| v.len()),
                _ => t.to_vec::<bool>().map(|v| v.len()),
            };
            assert_eq!(ok.ok(), Some(0), "{dtype}");
        }
    }
}

#[test]
fn every_collective_runs_on_empty_tensors_of_every_dtype() {
    let world = World::local(3).unwrap_or_else(|e| panic!("{e}"));
    let mut works = Vec::new();
    for kind in COLLECTIVES {
        for dtype in DType::ALL {
            let op = if dtype == DType::Bool {
                ReduceOp::Max
            } else {
                ReduceOp::Sum
            };
            let case = Case {
                kind,
                size: 3,
                count: 0,
                dtype,
                op,
                root: 1,
                algorithm: None,
            };
            for (r, c) in world.communicators().iter().enumerate() {
                works.push((
                    case.clone(),
                    r,
                    c.submit(case.request(r), &CallOptions::default()),
                ));
            }
        }
    }
    for (case, r, w) in works {
        let got = w.wait();
        assert_eq!(got.ok(), Some(case.expected(r)), "{case:?} rank {r}");
    }
}
