use super::*;
use crate::Tensor;

fn comb<T: crate::Element + bytemuck::Pod>(op: ReduceOp, a: &[T], b: &[T]) -> Vec<T> {
    let r = combine(
        T::DTYPE,
        op,
        bytemuck::cast_slice(a),
        bytemuck::cast_slice(b),
        &Pool::new(1 << 20),
    );
    r.map(|b| bytemuck::cast_slice::<u8, T>(&b).to_vec())
        .unwrap_or_default()
}

/// `fold_into` over several operands, across tile boundaries, gives the bits of the
/// pairwise combines in the same order (with the received value first or second).
#[test]
fn a_fold_is_the_pairwise_combines_in_order() {
    let n = FOLD_TILE_BYTES / 2 + 37; // several f16 and f32 tiles, a ragged last one
    let vals = |k: usize| -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 31 + k * 17) % 101) as f32 / 7.0 - 5.0)
            .collect()
    };
    let (local, xs) = (vals(0), [vals(1), vals(2), vals(3)]);
    let flags = [true, false, true];
    for op in [ReduceOp::Sum, ReduceOp::Product, ReduceOp::Max] {
        for dtype in [DType::F32, DType::F16] {
            let bytes = |v: &[f32]| -> Vec<u8> {
                match dtype {
                    DType::F16 => {
                        let h: Vec<f16> = v.iter().map(|&x| f16::from_f32(x)).collect();
                        bytemuck::cast_slice(&h).to_vec()
                    }
                    _ => bytemuck::cast_slice(v).to_vec(),
                }
            };
            let pool = Pool::new(1 << 24);
            let mut want = Bytes::from(bytes(&local));
            for (x, &first) in xs.iter().zip(&flags) {
                let x = bytes(x);
                want = if first {
                    combine(dtype, op, &x, &want, &pool)
                } else {
                    combine(dtype, op, &want, &x, &pool)
                }
                .unwrap_or_default();
            }
            let others: Vec<Vec<u8>> = xs.iter().map(|x| bytes(x)).collect();
            let refs: Vec<(&[u8], bool)> =
                others.iter().zip(flags).map(|(x, f)| (&x[..], f)).collect();
            let mut out = pool.take(want.len());
            let folded = fold_into(dtype, op, &bytes(&local), &refs, out.bytes_mut());
            assert!(folded.is_ok(), "{op} {dtype}: {folded:?}");
            assert_eq!(out.as_ref(), &want[..], "{op} {dtype}");
        }
    }
    let mut out = [0u8; 8];
    assert!(
        fold_into(
            DType::F32,
            ReduceOp::Sum,
            &[0; 8],
            &[(&[0; 4], false)],
            &mut out
        )
        .is_err(),
        "operands of another length are refused"
    );
}

#[test]
fn dtype_rules_follow_torch() {
    assert!(ReduceOp::BAnd.check(DType::F32).is_err());
    assert!(ReduceOp::BXor.check(DType::Bool).is_ok());
    assert!(ReduceOp::Avg.check(DType::I32).is_err());
    assert!(ReduceOp::PremulSum(2.0).check(DType::BF16).is_ok());
    assert!(ReduceOp::Avg.check(DType::Bool).is_err());
    assert!(ReduceOp::Max.check(DType::Bool).is_ok());
}

#[test]
fn integers_wrap() {
    assert_eq!(comb(ReduceOp::Sum, &[i8::MAX], &[1]), vec![i8::MIN]);
    assert_eq!(comb(ReduceOp::Product, &[i32::MAX], &[2]), vec![-2]);
    assert_eq!(comb(ReduceOp::Sum, &[255u8], &[1]), vec![0]);
}

#[test]
fn the_wider_unsigned_types_wrap_compare_unsigned_and_refuse_avg() {
    assert_eq!(comb(ReduceOp::Sum, &[u16::MAX], &[2]), vec![1]);
    assert_eq!(
        comb(ReduceOp::Product, &[u32::MAX], &[2]),
        vec![u32::MAX - 1]
    );
    assert_eq!(comb(ReduceOp::Sum, &[u64::MAX], &[1]), vec![0]);
    assert_eq!(
        comb(ReduceOp::Max, &[u64::MAX, 1], &[1, 2]),
        vec![u64::MAX, 2]
    );
    assert_eq!(comb(ReduceOp::Min, &[u32::MAX], &[7]), vec![7]);
    assert_eq!(comb(ReduceOp::BXor, &[0xf0u16], &[0xffu16]), vec![0x0f]);
    assert_eq!(comb(ReduceOp::Sum, &[i16::MAX], &[1]), vec![i16::MIN]);
    assert_eq!(comb(ReduceOp::Min, &[-1i16], &[1]), vec![-1]);
    for d in [DType::I16, DType::U16, DType::U32, DType::U64] {
        assert!(ReduceOp::Avg.check(d).is_err(), "{d}");
        assert!(ReduceOp::PremulSum(2.0).check(d).is_err(), "{d}");
        assert!(ReduceOp::BOr.check(d).is_ok(), "{d}");
    }
}

#[test]
fn float_min_max_are_symmetric_in_bits() {
    let odd_nan = f32::from_bits(0x7fc0_1234);
    let vals = [
        0.0f32,
        -0.0,
        1.0,
        -1.0,
        f32::NAN,
        odd_nan,
        f32::INFINITY,
        f32::NEG_INFINITY,
    ];
    for &a in &vals {
        for &b in &vals {
            for op in [ReduceOp::Max, ReduceOp::Min] {
                let x = comb(op, &[a], &[b])[0];
                let y = comb(op, &[b], &[a])[0];
                assert_eq!(x.to_bits(), y.to_bits(), "{op} {a} {b}");
                if a.is_nan() || b.is_nan() {
                    assert_eq!(x.to_bits(), f32::NAN.to_bits());
                }
            }
        }
    }
    assert_eq!(
        comb(ReduceOp::Max, &[-0.0f64], &[0.0])[0].to_bits(),
        0.0f64.to_bits()
    );
    assert_eq!(
        comb(ReduceOp::Min, &[0.0f64], &[-0.0])[0].to_bits(),
        (-0.0f64).to_bits()
    );
}

#[test]
fn bool_ops_are_logical() {
    let a = [false, false, true, true];
    let b = [false, true, false, true];
    let ta = Tensor::from_slice(&a);
    let tb = Tensor::from_slice(&b);
    let run = |op| {
        reference(op, &[ta.clone(), tb.clone()])
            .and_then(|t| t.to_vec::<bool>())
            .unwrap_or_default()
    };
    assert_eq!(run(ReduceOp::Sum), vec![false, true, true, true]);
    assert_eq!(run(ReduceOp::Max), vec![false, true, true, true]);
    assert_eq!(run(ReduceOp::Product), vec![false, false, false, true]);
    assert_eq!(run(ReduceOp::Min), vec![false, false, false, true]);
    assert_eq!(run(ReduceOp::BXor), vec![false, true, true, false]);
}

#[test]
fn half_block_conversion_matches_element_wise() {
    let a16: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).collect();
    let b16: Vec<f16> = (0..=u16::MAX)
        .map(|i| f16::from_bits(i.rotate_left(5)))
        .collect();
    let mut got = vec![f16::ZERO; a16.len()];
    assert!(<f16 as Kernel>::combine(Combine::Sum, &a16, &b16, &mut got, false).is_some());
    for ((x, y), z) in a16.iter().zip(&b16).zip(&got) {
        let want = f16::from_f32(x.to_f32() + y.to_f32());
        assert!(
            want.to_bits() == z.to_bits() || (want.is_nan() && z.is_nan()),
            "{x} + {y}"
        );
    }
    let ab: Vec<bf16> = (0..=u16::MAX).map(bf16::from_bits).collect();
    let bb: Vec<bf16> = (0..=u16::MAX)
        .map(|i| bf16::from_bits(i.rotate_left(3)))
        .collect();
    let mut got = vec![bf16::ZERO; ab.len()];
    assert!(<bf16 as Kernel>::combine(Combine::Prod, &ab, &bb, &mut got, false).is_some());
    for ((x, y), z) in ab.iter().zip(&bb).zip(&got) {
        let want = bf16::from_f32(x.to_f32() * y.to_f32());
        assert!(
            want.to_bits() == z.to_bits() || (want.is_nan() && z.is_nan()),
            "{x} * {y}"
        );
    }
}

#[test]
fn avg_premul_and_half_rounding() {
    let t = |v: Vec<f32>| Tensor::from_vec(v);
    let avg = reference(ReduceOp::Avg, &[t(vec![1.0, 2.0]), t(vec![3.0, 6.0])]);
    assert_eq!(
        avg.and_then(|t| t.to_vec::<f32>()).unwrap_or_default(),
        vec![2.0, 4.0]
    );
    let pm = reference(ReduceOp::PremulSum(0.5), &[t(vec![2.0]), t(vec![4.0])]);
    assert_eq!(
        pm.and_then(|t| t.to_vec::<f32>()).unwrap_or_default(),
        vec![3.0]
    );
    // 2048 + 1 is not representable in f16: rounds to even (2048).
    let h = |x: f32| Tensor::from_vec(vec![f16::from_f32(x)]);
    let s = reference(ReduceOp::Sum, &[h(2048.0), h(1.0)]);
    assert_eq!(
        s.and_then(|t| t.to_vec::<f16>()).unwrap_or_default(),
        vec![f16::from_f32(2048.0)]
    );
}
