use super::*;
use crate::error::{Error, Result};
use crate::tensor::dtype::{bf16, f16, DType};
use crate::tensor::Tensor;

type R = Result<()>;

fn idx(v: Vec<i64>, shape: &[usize]) -> Result<Tensor> {
    Tensor::from_vec_shape(v, shape)
}

fn is_invalid<T>(r: Result<T>) -> bool {
    matches!(r, Err(Error::InvalidArgument(_)))
}

#[test]
fn torch_docs_scatter() -> R {
    let src = Tensor::from_vec_shape((1i64..=10).collect(), &[2, 5])?;
    let zeros = Tensor::zeros(&[3, 5], DType::I64)?;
    let out = zeros.scatter_(
        0,
        &idx(vec![0, 1, 2, 0], &[1, 4])?,
        &src,
        ScatterReduce::None,
    )?;
    assert_eq!(
        out.format_values(),
        "[[1, 0, 0, 4, 0], [0, 2, 0, 0, 0], [0, 0, 3, 0, 0]]"
    );
    let index = idx(vec![0, 1, 2, 0, 1, 4], &[2, 3])?;
    let out = zeros.scatter_(1, &index, &src, ScatterReduce::None)?;
    assert_eq!(
        out.format_values(),
        "[[1, 2, 3, 0, 0], [6, 7, 0, 0, 8], [0, 0, 0, 0, 0]]"
    );
    // self is untouched.
    assert_eq!(zeros.to_vec::<i64>()?, vec![0; 15]);
    Ok(())
}

#[test]
fn torch_docs_scatter_value() -> R {
    let index = idx(vec![2, 3], &[2, 1])?;
    let base = Tensor::full(&[2, 4], 2.0f32)?;
    let add = base.scatter_value_(1, &index, 1.23f32, ScatterReduce::Add)?;
    assert_eq!(add.format_values(), "[[2, 2, 3.23, 2], [2, 2, 2, 3.23]]");
    let mul = base.scatter_value_(1, &index, 1.23f32, ScatterReduce::Multiply)?;
    assert_eq!(mul.format_values(), "[[2, 2, 2.46, 2], [2, 2, 2, 2.46]]");
    let set = base.scatter_value_(1, &index, 1.23f32, ScatterReduce::None)?;
    assert_eq!(set.format_values(), "[[2, 2, 1.23, 2], [2, 2, 2, 1.23]]");
    Ok(())
}

#[test]
fn scatter_value_converts_other_types() -> R {
    let index = idx(vec![0, 2], &[2])?;
    let f =
        Tensor::zeros(&[3], DType::F32)?.scatter_value_(0, &index, 7i32, ScatterReduce::None)?;
    assert_eq!(f.to_vec::<f32>()?, vec![7.0, 0.0, 7.0]);
    let i =
        Tensor::zeros(&[3], DType::I32)?.scatter_value_(0, &index, 2.9f64, ScatterReduce::None)?;
    assert_eq!(i.to_vec::<i32>()?, vec![2, 0, 2]);
    let b =
        Tensor::zeros(&[3], DType::Bool)?.scatter_value_(0, &index, 0.5f32, ScatterReduce::Add)?;
    assert_eq!(b.to_vec::<bool>()?, vec![true, false, true]);
    let big = Tensor::zeros(&[1], DType::I64)?.scatter_value_(
        0,
        &idx(vec![0], &[1])?,
        i64::MAX,
        ScatterReduce::None,
    )?;
    assert_eq!(big.to_vec::<i64>()?, vec![i64::MAX]);
    Ok(())
}

#[test]
fn torch_docs_scatter_add() -> R {
    let src = Tensor::full(&[2, 5], 1.0f32)?;
    let zeros = Tensor::zeros(&[3, 5], DType::F32)?;
    let out = zeros.scatter_add_(0, &idx(vec![0, 1, 2, 0, 0], &[1, 5])?, &src)?;
    assert_eq!(
        out.format_values(),
        "[[1, 0, 0, 1, 1], [0, 1, 0, 0, 0], [0, 0, 1, 0, 0]]"
    );
    let index = idx(vec![0, 1, 2, 0, 0, 0, 1, 2, 2, 2], &[2, 5])?;
    let out = zeros.scatter_add_(0, &index, &src)?;
    assert_eq!(
        out.format_values(),
        "[[2, 0, 0, 1, 1], [0, 2, 0, 0, 0], [0, 0, 2, 1, 1]]"
    );
    Ok(())
}

fn reduce_case(op: ScatterReduceOp, include_self: bool) -> Result<String> {
    let src = Tensor::from_vec(vec![1.0f32, 2., 3., 4., 5., 6.]);
    let index = Tensor::from_vec(vec![0i64, 1, 0, 1, 2, 1]);
    let input = Tensor::from_vec(vec![1.0f32, 2., 3., 4.]);
    Ok(input
        .scatter_reduce_(0, &index, &src, op, include_self)?
        .format_values())
}

#[test]
fn torch_docs_scatter_reduce() -> R {
    use ScatterReduceOp::*;
    assert_eq!(reduce_case(Sum, true)?, "[5, 14, 8, 4]");
    assert_eq!(reduce_case(Sum, false)?, "[4, 12, 5, 4]");
    assert_eq!(reduce_case(Amax, true)?, "[3, 6, 5, 4]");
    assert_eq!(reduce_case(Amax, false)?, "[3, 6, 5, 4]");
    assert_eq!(reduce_case(Amin, true)?, "[1, 2, 3, 4]");
    assert_eq!(reduce_case(Amin, false)?, "[1, 2, 5, 4]");
    assert_eq!(reduce_case(Prod, true)?, "[3, 96, 15, 4]");
    assert_eq!(reduce_case(Prod, false)?, "[3, 48, 5, 4]");
    // (1+1+3)/3, (2+2+4+6)/4, (3+5)/2; without self: 4/2, 12/3, 5/1.
    assert_eq!(reduce_case(Mean, true)?, "[1.6666666, 3.5, 4, 4]");
    assert_eq!(reduce_case(Mean, false)?, "[2, 4, 5, 4]");
    Ok(())
}

#[test]
fn mean_of_integers_floors() -> R {
    let input = Tensor::from_vec(vec![0i32, 10, 7]);
    let src = Tensor::from_vec(vec![-3i32, 0, 5, 6]);
    let index = Tensor::from_vec(vec![0i64, 0, 1, 1]);
    // [-3/3 -> -1, 21/3 -> 7, 7]
    let out = input.scatter_reduce_(0, &index, &src, ScatterReduceOp::Mean, true)?;
    assert_eq!(out.to_vec::<i32>()?, vec![-1, 7, 7]);
    // [-3/2 -> floor -2, 11/2 -> 5, 7]
    let out = input.scatter_reduce_(0, &index, &src, ScatterReduceOp::Mean, false)?;
    assert_eq!(out.to_vec::<i32>()?, vec![-2, 5, 7]);
    let u = Tensor::from_vec(vec![255u8, 1]);
    let out = u.scatter_reduce_(
        0,
        &Tensor::from_vec(vec![0i64, 0]),
        &Tensor::from_vec(vec![255u8, 255]),
        ScatterReduceOp::Mean,
        false,
    )?;
    // 255 + 255 wraps to 254, then 254 / 2.
    assert_eq!(out.to_vec::<u8>()?, vec![127, 1]);
    Ok(())
}

#[test]
fn mean_of_floats() -> R {
    let input = Tensor::from_vec(vec![1.0f64, 2.0]);
    let src = Tensor::from_vec(vec![2.0f64, 4.0, 8.0]);
    let index = Tensor::from_vec(vec![0i64, 0, 0]);
    let out = input.scatter_reduce_(0, &index, &src, ScatterReduceOp::Mean, true)?;
    assert_eq!(out.to_vec::<f64>()?, vec![15.0 / 4.0, 2.0]);
    let out = input.scatter_reduce_(0, &index, &src, ScatterReduceOp::Mean, false)?;
    assert_eq!(out.to_vec::<f64>()?, vec![14.0 / 3.0, 2.0]);
    let h = Tensor::from_vec(vec![f16::from_f32(1.0)]);
    let out = h.scatter_reduce_(
        0,
        &Tensor::from_vec(vec![0i64]),
        &Tensor::from_vec(vec![f16::from_f32(2.0)]),
        ScatterReduceOp::Mean,
        true,
    )?;
    assert_eq!(out.to_vec::<f16>()?, vec![f16::from_f32(1.5)]);
    Ok(())
}

#[test]
fn amin_amax_integers_and_nan() -> R {
    let input = Tensor::from_vec(vec![5i64, 5, 5]);
    let src = Tensor::from_vec(vec![7i64, -2, 9, 3]);
    let index = Tensor::from_vec(vec![0i64, 0, 1, 1]);
    let r = |op, inc| {
        input
            .scatter_reduce_(0, &index, &src, op, inc)?
            .to_vec::<i64>()
    };
    assert_eq!(r(ScatterReduceOp::Amin, true)?, vec![-2, 3, 5]);
    assert_eq!(r(ScatterReduceOp::Amin, false)?, vec![-2, 3, 5]);
    assert_eq!(r(ScatterReduceOp::Amax, true)?, vec![7, 9, 5]);
    assert_eq!(r(ScatterReduceOp::Amax, false)?, vec![7, 9, 5]);

    let input = Tensor::from_vec(vec![f32::NAN, 1.0]);
    let src = Tensor::from_vec(vec![2.0f32, f32::NAN, 3.0]);
    let index = Tensor::from_vec(vec![0i64, 1, 1]);
    for op in [ScatterReduceOp::Amax, ScatterReduceOp::Amin] {
        let v = input
            .scatter_reduce_(0, &index, &src, op, true)?
            .to_vec::<f32>()?;
        assert!(v.iter().all(|x| x.is_nan()), "{op}: {v:?}");
    }
    Ok(())
}

#[test]
fn integers_wrap() -> R {
    let i = Tensor::from_vec(vec![127i8, -128]);
    let index = Tensor::from_vec(vec![0i64, 1]);
    let out = i.scatter_add_(0, &index, &Tensor::from_vec(vec![1i8, -1]))?;
    assert_eq!(out.to_vec::<i8>()?, vec![-128, 127]);
    let u = Tensor::from_vec(vec![200u8]);
    let out = u.scatter_(
        0,
        &Tensor::from_vec(vec![0i64]),
        &Tensor::from_vec(vec![2u8]),
        ScatterReduce::Multiply,
    )?;
    assert_eq!(out.to_vec::<u8>()?, vec![144]);
    let l = Tensor::from_vec(vec![i64::MAX]);
    let out = l.scatter_reduce_(
        0,
        &Tensor::from_vec(vec![0i64, 0]),
        &Tensor::from_vec(vec![1i64, 1]),
        ScatterReduceOp::Sum,
        true,
    )?;
    assert_eq!(out.to_vec::<i64>()?, vec![i64::MIN + 1]);
    Ok(())
}

#[test]
fn bool_add_is_or_multiply_is_and() -> R {
    let b = Tensor::from_vec(vec![true, false, true]);
    let index = Tensor::from_vec(vec![0i64, 1, 2, 1]);
    let src = Tensor::from_vec(vec![true, true, false, true]);
    assert_eq!(
        b.scatter_add_(0, &index, &src)?.to_vec::<bool>()?,
        vec![true, true, true]
    );
    let out = b.scatter_(0, &index, &src, ScatterReduce::Multiply)?;
    assert_eq!(out.to_vec::<bool>()?, vec![true, false, false]);
    let out = b.scatter_reduce_(0, &index, &src, ScatterReduceOp::Amin, false)?;
    assert_eq!(out.to_vec::<bool>()?, vec![true, true, false]);
    assert!(is_invalid(b.scatter_reduce_(
        0,
        &index,
        &src,
        ScatterReduceOp::Mean,
        true
    )));
    Ok(())
}

#[test]
fn half_types_round_through_f32() -> R {
    let h = Tensor::from_vec(vec![bf16::from_f32(256.0)]);
    let index = Tensor::from_vec(vec![0i64, 0]);
    let src = Tensor::from_vec(vec![bf16::from_f32(1.0), bf16::from_f32(1.0)]);
    // Each step rounds back to bf16: 256 + 1 -> 256, twice.
    assert_eq!(
        h.scatter_add_(0, &index, &src)?.to_vec::<bf16>()?,
        vec![bf16::from_f32(256.0)]
    );
    Ok(())
}

#[test]
fn three_d_scatter_add_and_gather() -> R {
    let zeros = Tensor::zeros(&[2, 2, 2], DType::I64)?;
    let index = idx(vec![1, 0, 0, 0, 1, 1, 0, 1], &[2, 2, 2])?;
    let src = Tensor::from_vec_shape((1i64..=8).collect(), &[2, 2, 2])?;
    let out = zeros.scatter_add_(2, &index, &src)?;
    assert_eq!(out.format_values(), "[[[2, 1], [7, 0]], [[0, 11], [7, 8]]]");
    let out = zeros.scatter_add_(-1, &index, &src)?;
    assert_eq!(out.format_values(), "[[[2, 1], [7, 0]], [[0, 11], [7, 8]]]");

    // gather along dim 1 of a [2, 3, 4] tensor against a reference loop.
    let t = Tensor::from_vec_shape((0i64..24).collect(), &[2, 3, 4])?;
    let iv: Vec<i64> = vec![2, 0, 1, 1, 0, 2, 2, 0];
    let index = idx(iv.clone(), &[2, 1, 4])?;
    let got = t.gather(1, &index)?;
    assert_eq!(got.shape(), &[2, 1, 4]);
    let mut want = Vec::new();
    for i in 0..2 {
        for k in 0..4 {
            let j = iv[i * 4 + k];
            want.push((i * 12) as i64 + j * 4 + k as i64);
        }
    }
    assert_eq!(got.to_vec::<i64>()?, want);
    // scatter along dim 0 of a 3-D tensor with a smaller src.
    let out = Tensor::zeros(&[3, 2, 2], DType::I32)?.scatter_(
        0,
        &idx(vec![2, 1], &[1, 1, 2])?,
        &Tensor::from_vec_shape(vec![5i32, 6, 7, 8], &[1, 2, 2])?,
        ScatterReduce::None,
    )?;
    assert_eq!(
        out.format_values(),
        "[[[0, 0], [0, 0]], [[0, 6], [0, 0]], [[5, 0], [0, 0]]]"
    );
    Ok(())
}

#[test]
fn torch_docs_gather() -> R {
    let t = Tensor::from_vec_shape(vec![1i64, 2, 3, 4], &[2, 2])?;
    let out = t.gather(1, &idx(vec![0, 0, 1, 0], &[2, 2])?)?;
    assert_eq!(out.format_values(), "[[1, 1], [4, 3]]");
    let out = t.gather(0, &idx(vec![1, 0], &[1, 2])?)?;
    assert_eq!(out.format_values(), "[[3, 2]]");
    Ok(())
}

#[test]
fn negative_indices_are_rejected_as_in_torch() -> R {
    let t = Tensor::from_vec(vec![10i32, 20, 30]);
    assert!(is_invalid(t.gather(0, &Tensor::from_vec(vec![-1i64]))));
    assert!(is_invalid(t.scatter_value_(
        0,
        &Tensor::from_vec(vec![-2i64]),
        0i32,
        ScatterReduce::None
    )));
    Ok(())
}

#[test]
fn out_of_range_indices_fail() -> R {
    let t = Tensor::from_vec(vec![1.0f32, 2.0, 3.0]);
    let src = Tensor::from_vec(vec![1.0f32]);
    for bad in [3i64, 100, -1, -4, i64::MIN, i64::MAX] {
        let index = Tensor::from_vec(vec![bad]);
        assert!(
            is_invalid(t.scatter_(0, &index, &src, ScatterReduce::None)),
            "{bad}"
        );
        assert!(is_invalid(t.scatter_add_(0, &index, &src)), "{bad}");
        assert!(
            is_invalid(t.scatter_value_(0, &index, 1.0f32, ScatterReduce::Add)),
            "{bad}"
        );
        assert!(
            is_invalid(t.scatter_reduce_(0, &index, &src, ScatterReduceOp::Sum, true)),
            "{bad}"
        );
        assert!(is_invalid(t.gather(0, &index)), "{bad}");
    }
    // Any index into a dimension of size 0 is out of range.
    let empty = Tensor::zeros(&[0, 2], DType::F32)?;
    assert!(is_invalid(empty.gather(0, &idx(vec![0], &[1, 1])?)));
    Ok(())
}

#[test]
fn wrong_index_dtype_fails() {
    let t = Tensor::from_vec(vec![1.0f32, 2.0]);
    let index = Tensor::from_vec(vec![0i32]);
    let src = Tensor::from_vec(vec![1.0f32]);
    assert!(is_invalid(t.scatter_(0, &index, &src, ScatterReduce::None)));
    assert!(is_invalid(t.scatter_add_(0, &index, &src)));
    assert!(is_invalid(t.scatter_value_(
        0,
        &index,
        1.0f32,
        ScatterReduce::None
    )));
    assert!(is_invalid(t.scatter_reduce_(
        0,
        &index,
        &src,
        ScatterReduceOp::Sum,
        true
    )));
    assert!(is_invalid(t.gather(0, &index)));
    // Even an empty index must be int64.
    assert!(is_invalid(t.gather(0, &Tensor::empty(DType::I32))));
}

#[test]
fn dim_out_of_range_fails() -> R {
    let t = Tensor::zeros(&[2, 2], DType::F32)?;
    let index = idx(vec![0], &[1, 1])?;
    let src = Tensor::zeros(&[1, 1], DType::F32)?;
    for dim in [2isize, -3, isize::MAX, isize::MIN] {
        assert!(
            is_invalid(t.scatter_(dim, &index, &src, ScatterReduce::None)),
            "{dim}"
        );
        assert!(is_invalid(t.gather(dim, &index)), "{dim}");
    }
    assert_eq!(t.gather(-2, &index)?.to_vec::<f32>()?, vec![0.0]);
    Ok(())
}

#[test]
fn shape_rules() -> R {
    let t = Tensor::zeros(&[2, 3], DType::F32)?;
    let src = Tensor::zeros(&[2, 3], DType::F32)?;
    // index with another number of dimensions than self
    let flat = Tensor::from_vec(vec![0i64]);
    assert!(is_invalid(t.scatter_(0, &flat, &src, ScatterReduce::None)));
    assert!(is_invalid(t.gather(0, &flat)));
    // src with another number of dimensions than index
    let index = idx(vec![0], &[1, 1])?;
    let src1 = Tensor::from_vec(vec![1.0f32]);
    assert!(is_invalid(t.scatter_add_(0, &index, &src1)));
    // index larger than src
    let big = idx(vec![0; 6], &[2, 3])?;
    let small = Tensor::zeros(&[2, 2], DType::F32)?;
    assert!(is_invalid(t.scatter_(0, &big, &small, ScatterReduce::None)));
    // index larger than self outside dim, but fine along dim
    let wide = idx(vec![0; 4], &[1, 4])?;
    assert!(is_invalid(t.scatter_(
        0,
        &wide,
        &Tensor::zeros(&[1, 4], DType::F32)?,
        ScatterReduce::None
    )));
    assert!(is_invalid(t.gather(0, &wide)));
    let tall = idx(vec![1; 3], &[3, 1])?;
    assert_eq!(t.gather(0, &tall)?.shape(), &[3, 1]);
    let out = t.scatter_(
        0,
        &tall,
        &Tensor::full(&[3, 1], 4.0f32)?,
        ScatterReduce::Add,
    )?;
    assert_eq!(out.format_values(), "[[0, 0, 0], [12, 0, 0]]");
    Ok(())
}

#[test]
fn src_dtype_must_match() {
    let t = Tensor::from_vec(vec![1.0f32, 2.0]);
    let index = Tensor::from_vec(vec![0i64]);
    let src = Tensor::from_vec(vec![1.0f64]);
    assert!(is_invalid(t.scatter_(0, &index, &src, ScatterReduce::None)));
    assert!(is_invalid(t.scatter_add_(0, &index, &src)));
    assert!(is_invalid(t.scatter_reduce_(
        0,
        &index,
        &src,
        ScatterReduceOp::Amax,
        false
    )));
}

#[test]
fn empty_and_zero_dim() -> R {
    // An empty index changes nothing and skips the shape checks, as in torch.
    let t = Tensor::from_vec(vec![1i64, 2]);
    let none = Tensor::empty(DType::I64);
    let src = Tensor::zeros(&[0, 5], DType::I64)?;
    assert_eq!(t.scatter_(0, &none, &src, ScatterReduce::None)?, t);
    assert_eq!(
        t.scatter_reduce_(0, &none, &src, ScatterReduceOp::Mean, false)?,
        t
    );
    let g = t.gather(0, &Tensor::zeros(&[0, 3], DType::I64)?)?;
    assert_eq!((g.shape(), g.dtype()), (&[0usize, 3][..], DType::I64));
    // 0-element self with an empty index.
    let e = Tensor::empty(DType::F32);
    assert_eq!(e.scatter_add_(0, &none, &e)?.numel(), 0);
    // 0-d tensors count as 1-D of size 1.
    let s = Tensor::full(&[], 5.0f32)?;
    let i0 = Tensor::full(&[], 0i64)?;
    let out = s.scatter_add_(0, &i0, &Tensor::full(&[], 2.0f32)?)?;
    assert!(out.shape().is_empty());
    assert_eq!(out.to_vec::<f32>()?, vec![7.0]);
    assert_eq!(s.gather(-1, &i0)?.to_vec::<f32>()?, vec![5.0]);
    assert!(is_invalid(s.gather(1, &i0)));
    Ok(())
}

#[test]
fn every_dtype_scatters() -> R {
    for dtype in DType::ALL {
        let t = Tensor::zeros(&[3], dtype)?;
        let index = Tensor::from_vec(vec![2i64, 0]);
        let out = t.scatter_value_(0, &index, 1.0f64, ScatterReduce::None)?;
        assert_eq!(out.to_f64_vec(), vec![1.0, 0.0, 1.0], "{dtype}");
        let out = out.scatter_add_(0, &index, &out.gather(0, &index)?)?;
        let two = if dtype == DType::Bool { 1.0 } else { 2.0 };
        assert_eq!(out.to_f64_vec(), vec![two, 0.0, two], "{dtype}");
        assert_eq!(out.dtype(), dtype);
    }
    Ok(())
}
