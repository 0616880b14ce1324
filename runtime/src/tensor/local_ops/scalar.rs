//! The element arithmetic of the ops: how a source element combines with its target, per
//! storage type, with torch's identities and mean.

use super::{ScatterReduce, ScatterReduceOp};
use crate::tensor::dtype::{bf16, f16, Element};

/// How one source element is combined with the element it lands on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Combine {
    Assign,
    Add,
    Mul,
    Max,
    Min,
}

impl From<ScatterReduce> for Combine {
    fn from(r: ScatterReduce) -> Self {
        match r {
            ScatterReduce::None => Combine::Assign,
            ScatterReduce::Add => Combine::Add,
            ScatterReduce::Multiply => Combine::Mul,
        }
    }
}

impl From<ScatterReduceOp> for Combine {
    fn from(r: ScatterReduceOp) -> Self {
        match r {
            ScatterReduceOp::Sum | ScatterReduceOp::Mean => Combine::Add,
            ScatterReduceOp::Prod => Combine::Mul,
            ScatterReduceOp::Amax => Combine::Max,
            ScatterReduceOp::Amin => Combine::Min,
        }
    }
}

/// Storage types the ops compute on (`bool` is handled through its `u8` storage).
pub(super) trait Scalar: Element + bytemuck::Pod {
    /// `a (op) b`.
    fn combine(op: Combine, a: Self, b: Self, is_bool: bool) -> Self;
    /// What an element starts from when `include_self` is false (torch's init values).
    fn identity(op: ScatterReduceOp, is_bool: bool) -> Self;
    /// `sum / count` (floor division for integers); `count >= 1`.
    fn mean(sum: Self, count: u64) -> Self;
    /// Converts a scalar given as `f64` (`is_bool`: to 0 or 1 by `!= 0`, as torch's `bool()`).
    fn from_scalar(v: f64, is_bool: bool) -> Self {
        if is_bool {
            Self::from_f64(if v != 0.0 { 1.0 } else { 0.0 })
        } else {
            Self::from_f64(v)
        }
    }
}

/// torch's `std::max` after a NaN check of the source: NaN in either operand wins.
#[inline]
fn fmax<T: PartialOrd + Copy>(a: T, b: T, b_nan: bool) -> T {
    if b_nan || a < b {
        b
    } else {
        a
    }
}

/// torch's `std::min` after a NaN check of the source: NaN in either operand wins.
#[inline]
fn fmin<T: PartialOrd + Copy>(a: T, b: T, b_nan: bool) -> T {
    if b_nan || b < a {
        b
    } else {
        a
    }
}

macro_rules! float_scalar {
    ($t:ty) => {
        impl Scalar for $t {
            fn combine(op: Combine, a: Self, b: Self, _: bool) -> Self {
                match op {
                    Combine::Assign => b,
                    Combine::Add => a + b,
                    Combine::Mul => a * b,
                    Combine::Max => fmax(a, b, b.is_nan()),
                    Combine::Min => fmin(a, b, b.is_nan()),
                }
            }
            fn identity(op: ScatterReduceOp, _: bool) -> Self {
                match op {
                    ScatterReduceOp::Sum | ScatterReduceOp::Mean => 0.0,
                    ScatterReduceOp::Prod => 1.0,
                    ScatterReduceOp::Amax => <$t>::NEG_INFINITY,
                    ScatterReduceOp::Amin => <$t>::INFINITY,
                }
            }
            fn mean(sum: Self, count: u64) -> Self {
                sum / (count as $t)
            }
        }
    };
}
float_scalar!(f32);
float_scalar!(f64);

macro_rules! half_scalar {
    ($t:ty) => {
        impl Scalar for $t {
            fn combine(op: Combine, a: Self, b: Self, _: bool) -> Self {
                let (x, y) = (a.to_f32(), b.to_f32());
                match op {
                    Combine::Assign => b,
                    Combine::Add => <$t>::from_f32(x + y),
                    Combine::Mul => <$t>::from_f32(x * y),
                    Combine::Max => fmax(a, b, y.is_nan()),
                    Combine::Min => fmin(a, b, y.is_nan()),
                }
            }
            fn identity(op: ScatterReduceOp, _: bool) -> Self {
                match op {
                    ScatterReduceOp::Sum | ScatterReduceOp::Mean => <$t>::ZERO,
                    ScatterReduceOp::Prod => <$t>::ONE,
                    ScatterReduceOp::Amax => <$t>::NEG_INFINITY,
                    ScatterReduceOp::Amin => <$t>::INFINITY,
                }
            }
            fn mean(sum: Self, count: u64) -> Self {
                <$t>::from_f32(sum.to_f32() / (count as f32))
            }
        }
    };
}
half_scalar!(f16);
half_scalar!(bf16);

macro_rules! int_scalar {
    ($t:ty) => {
        impl Scalar for $t {
            fn combine(op: Combine, a: Self, b: Self, is_bool: bool) -> Self {
                match (op, is_bool) {
                    (Combine::Assign, _) => b,
                    (Combine::Add | Combine::Max, true) => a | b,
                    (Combine::Mul | Combine::Min, true) => a & b,
                    (Combine::Add, false) => a.wrapping_add(b),
                    (Combine::Mul, false) => a.wrapping_mul(b),
                    (Combine::Max, false) => a.max(b),
                    (Combine::Min, false) => a.min(b),
                }
            }
            fn identity(op: ScatterReduceOp, is_bool: bool) -> Self {
                match (op, is_bool) {
                    (ScatterReduceOp::Sum | ScatterReduceOp::Mean, _) => 0,
                    (ScatterReduceOp::Prod, _) => 1,
                    (ScatterReduceOp::Amax, true) => 0,
                    (ScatterReduceOp::Amin, true) => 1,
                    (ScatterReduceOp::Amax, false) => <$t>::MIN,
                    (ScatterReduceOp::Amin, false) => <$t>::MAX,
                }
            }
            fn mean(sum: Self, count: u64) -> Self {
                // Floor division; the quotient's magnitude is at most the sum's, so it fits.
                <$t>::try_from(i128::from(sum).div_euclid(i128::from(count))).unwrap_or(sum)
            }
        }
    };
}
int_scalar!(i8);
int_scalar!(u8);
int_scalar!(i16);
int_scalar!(u16);
int_scalar!(i32);
int_scalar!(u32);
int_scalar!(i64);
int_scalar!(u64);
