//! Reduce operations ([`ReduceOp`]) with torch's dtype rules, and their kernels.
//!
//! # Numerics
//! - Integer `Sum` and `Product` wrap on overflow (two's complement), as torch does, in debug
//!   builds too.
//! - The unsigned types beyond `uint8` (`uint16`, `uint32`, `uint64`), which torch's c10d
//!   back ends (Gloo, NCCL) do not reduce, follow the same rules here: `Sum` and `Product`
//!   wrap modulo 2^bits; `Min`/`Max` compare as unsigned numbers; `BAnd`/`BOr`/`BXor` act on
//!   the bits; `Avg` and `PremulSum` are refused with `InvalidArgument`, as for every integer
//!   type (torch's rule for `int64`: averaging is for floating types). `int16` follows the
//!   signed rules of `int8`/`int32`/`int64`. On the NCCL path `uint32`/`uint64` map to
//!   `ncclUint32`/`ncclUint64`; NCCL has no 16-bit integers, so `int16`/`uint16` device calls
//!   need the host-staged backend.
//! - `Min`/`Max` on floats propagate NaN (as `torch.maximum`), return the canonical quiet NaN
//!   whatever the operands' payloads, and order −0 below +0, so `max(a, b)` and `max(b, a)`
//!   have the same bits.
//! - `f16` and `bf16` are combined pairwise: both operands are widened to `f32`, combined, and
//!   rounded back (round to nearest even) after every pairwise step, as torch's CPU kernels
//!   do. A sum over W ranks is therefore rounded W−1 times, in the order the algorithm's
//!   schedule fixes (never in arrival order), so every run and every rank gives the same bits.
//! - `Avg` sums, then divides once by the group size where the final value is computed.
//!   `PremulSum(s)` multiplies each rank's input by `s` (in the element type, via `f64` for
//!   `f32`/`f64` and `f32` for the 16-bit types) before summing.
//! - bool: `Sum`/`Max` act as OR, `Product`/`Min` as AND, bitwise ops as on 0/1 bytes.
//!
//! Kernels are plain element loops over slices (`zip`/`map`/`collect`) that the compiler
//! vectorizes for the integer and plain float ops; f16/bf16 convert in blocks of 256 through
//! `half`'s slice conversions (F16C where the CPU has it), combine in f32, and round back.
//! `cargo run --release --example kernel_bench` measures them (figures in
//! `docs/performance.md`): on cache-resident operands the vectorized loops run several times
//! faster than f32 max (its NaN and ±0 branches), which runs several times faster than
//! f16/bf16 (the conversions). On operands far larger than the cache every dtype is bound by
//! the page faults of a fresh output buffer; that is why the engine reduces into buffers from
//! a pool (`pool.rs`) that are recycled once their last share is dropped, instead of
//! allocating one per chunk (the benchmark measures the unpooled reference path).

use crate::error::{Error, Result};
use crate::op::ReduceKind;
use crate::tensor::bytes_from_vec;
use crate::tensor::dtype::{bf16, f16, DType};
use crate::tensor::pool::Pool;
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use std::fmt;

/// A reduction, as `torch.distributed.ReduceOp`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum ReduceOp {
    /// Sum (wrapping for integers, OR for bool).
    Sum,
    /// Product (wrapping for integers, AND for bool).
    Product,
    /// Minimum (AND for bool).
    Min,
    /// Maximum (OR for bool).
    Max,
    /// Mean over the group: floating types only.
    Avg,
    /// Sum of each input multiplied by the scalar: floating types only.
    PremulSum(f64),
    /// Bitwise AND: integers and bool only.
    BAnd,
    /// Bitwise OR: integers and bool only.
    BOr,
    /// Bitwise XOR: integers and bool only.
    BXor,
}

impl ReduceOp {
    /// Every op, with `PremulSum(0.5)` for the scalar one (handy for test matrices).
    pub const ALL: [ReduceOp; 9] = [
        ReduceOp::Sum,
        ReduceOp::Product,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::Avg,
        ReduceOp::PremulSum(0.5),
        ReduceOp::BAnd,
        ReduceOp::BOr,
        ReduceOp::BXor,
    ];

    /// The op without its scalar, as fingerprints carry it.
    pub fn kind(self) -> ReduceKind {
        match self {
            ReduceOp::Sum => ReduceKind::Sum,
            ReduceOp::Product => ReduceKind::Product,
            ReduceOp::Min => ReduceKind::Min,
            ReduceOp::Max => ReduceKind::Max,
            ReduceOp::Avg => ReduceKind::Avg,
            ReduceOp::PremulSum(_) => ReduceKind::PremulSum,
            ReduceOp::BAnd => ReduceKind::BAnd,
            ReduceOp::BOr => ReduceKind::BOr,
            ReduceOp::BXor => ReduceKind::BXor,
        }
    }

    /// A small stable code for fingerprints and frames ([`ReduceKind::code`]).
    pub fn code(self) -> u8 {
        self.kind().code()
    }

    /// The scalar's bits (`PremulSum`), 0 otherwise.
    pub fn scalar_bits(self) -> u64 {
        match self {
            ReduceOp::PremulSum(s) => s.to_bits(),
            _ => 0,
        }
    }

    /// Checks torch's dtype rules: bitwise ops on integers and bool only; `Avg` and
    /// `PremulSum` on floating types only.
    pub fn check(self, dtype: DType) -> Result<()> {
        let ok = match self {
            ReduceOp::BAnd | ReduceOp::BOr | ReduceOp::BXor => !dtype.is_float(),
            ReduceOp::Avg | ReduceOp::PremulSum(_) => dtype.is_float(),
            _ => true,
        };
        if ok {
            Ok(())
        } else {
            Err(Error::invalid(format!(
                "reduce op {self} is not supported for dtype {dtype}"
            )))
        }
    }

    /// The pairwise combination the kernels apply (Avg and PremulSum combine as Sum).
    pub(crate) fn combiner(self) -> Combine {
        match self {
            ReduceOp::Sum | ReduceOp::Avg | ReduceOp::PremulSum(_) => Combine::Sum,
            ReduceOp::Product => Combine::Prod,
            ReduceOp::Min => Combine::Min,
            ReduceOp::Max => Combine::Max,
            ReduceOp::BAnd => Combine::And,
            ReduceOp::BOr => Combine::Or,
            ReduceOp::BXor => Combine::Xor,
        }
    }
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReduceOp::Sum => f.write_str("sum"),
            ReduceOp::Product => f.write_str("prod"),
            ReduceOp::Min => f.write_str("min"),
            ReduceOp::Max => f.write_str("max"),
            ReduceOp::Avg => f.write_str("avg"),
            ReduceOp::PremulSum(s) => write!(f, "premul_sum({s})"),
            ReduceOp::BAnd => f.write_str("band"),
            ReduceOp::BOr => f.write_str("bor"),
            ReduceOp::BXor => f.write_str("bxor"),
        }
    }
}

/// The pairwise operation a kernel applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Combine {
    Sum,
    Prod,
    Min,
    Max,
    And,
    Or,
    Xor,
}

#[inline]
fn zip_into<T: Copy>(a: &[T], b: &[T], out: &mut [T], f: impl Fn(T, T) -> T) {
    for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
        *o = f(x, y);
    }
}

/// Element types the kernels know. `bool` is reduced through its `u8` storage.
pub(crate) trait Kernel: bytemuck::Pod {
    /// `out[i] = a[i] (op) b[i]`; `None` when `op` does not apply to the type (validation
    /// rules this out before any kernel runs).
    fn combine(op: Combine, a: &[Self], b: &[Self], out: &mut [Self], is_bool: bool) -> Option<()>;
    /// Every element multiplied by `s` (floats only).
    fn scale(a: &[Self], s: f64) -> Option<Vec<Self>>;
    /// Every element divided by `n` (floats only).
    fn divide(a: &[Self], n: usize) -> Option<Vec<Self>>;
    /// [`divide`](Kernel::divide) in place (the same bits).
    fn divide_in_place(a: &mut [Self], n: usize) -> Option<()>;
}

macro_rules! float_minmax {
    ($t:ty, $max:ident, $min:ident) => {
        #[inline]
        fn $max(a: $t, b: $t) -> $t {
            if a.is_nan() || b.is_nan() {
                <$t>::NAN
            } else if a > b {
                a
            } else if b > a {
                b
            } else if a.is_sign_positive() {
                a
            } else {
                b
            }
        }
        #[inline]
        fn $min(a: $t, b: $t) -> $t {
            if a.is_nan() || b.is_nan() {
                <$t>::NAN
            } else if a < b {
                a
            } else if b < a {
                b
            } else if a.is_sign_negative() {
                a
            } else {
                b
            }
        }
    };
}
float_minmax!(f32, max_f32, min_f32);
float_minmax!(f64, max_f64, min_f64);

macro_rules! float_kernel {
    ($t:ty, $max:ident, $min:ident) => {
        impl Kernel for $t {
            fn combine(
                op: Combine,
                a: &[Self],
                b: &[Self],
                out: &mut [Self],
                _: bool,
            ) -> Option<()> {
                Some(match op {
                    Combine::Sum => zip_into(a, b, out, |x, y| x + y),
                    Combine::Prod => zip_into(a, b, out, |x, y| x * y),
                    Combine::Min => zip_into(a, b, out, $min),
                    Combine::Max => zip_into(a, b, out, $max),
                    _ => return None,
                })
            }
            fn scale(a: &[Self], s: f64) -> Option<Vec<Self>> {
                Some(a.iter().map(|&x| ((x as f64) * s) as $t).collect())
            }
            fn divide(a: &[Self], n: usize) -> Option<Vec<Self>> {
                let n = n as $t;
                Some(a.iter().map(|&x| x / n).collect())
            }
            fn divide_in_place(a: &mut [Self], n: usize) -> Option<()> {
                let n = n as $t;
                a.iter_mut().for_each(|x| *x /= n);
                Some(())
            }
        }
    };
}
float_kernel!(f32, max_f32, min_f32);
float_kernel!(f64, max_f64, min_f64);

/// `f(a, b)` for 16-bit floats: both widened to f32 in blocks (half's slice conversions use
/// F16C where the CPU has it), combined, and rounded back to nearest even — the same bits as
/// converting element by element.
fn half_into<T>(a: &[T], b: &[T], out: &mut [T], f: impl Fn(f32, f32) -> f32)
where
    T: Copy,
    [T]: half::slice::HalfFloatSliceExt,
{
    use half::slice::HalfFloatSliceExt;
    const BLOCK: usize = 256;
    let (mut fa, mut fb) = ([0f32; BLOCK], [0f32; BLOCK]);
    for ((ca, cb), co) in a
        .chunks(BLOCK)
        .zip(b.chunks(BLOCK))
        .zip(out.chunks_mut(BLOCK))
    {
        let n = ca.len().min(cb.len()).min(co.len());
        ca[..n].convert_to_f32_slice(&mut fa[..n]);
        cb[..n].convert_to_f32_slice(&mut fb[..n]);
        for (x, &y) in fa[..n].iter_mut().zip(&fb[..n]) {
            *x = f(*x, y);
        }
        co[..n].convert_from_f32_slice(&fa[..n]);
    }
}

/// `f(a)` for 16-bit floats in place, as [`half_into`] computes it.
fn half_in_place<T>(a: &mut [T], f: impl Fn(f32) -> f32)
where
    T: Copy,
    [T]: half::slice::HalfFloatSliceExt,
{
    use half::slice::HalfFloatSliceExt;
    const BLOCK: usize = 256;
    let mut fa = [0f32; BLOCK];
    for ca in a.chunks_mut(BLOCK) {
        let n = ca.len();
        ca.convert_to_f32_slice(&mut fa[..n]);
        fa[..n].iter_mut().for_each(|x| *x = f(*x));
        ca.convert_from_f32_slice(&fa[..n]);
    }
}

/// [`half_into`] into a new vector.
fn half_zip<T>(a: &[T], b: &[T], f: impl Fn(f32, f32) -> f32) -> Vec<T>
where
    T: Copy + Default,
    [T]: half::slice::HalfFloatSliceExt,
{
    let mut out = vec![T::default(); a.len()];
    half_into(a, b, &mut out, f);
    out
}

macro_rules! half_kernel {
    ($t:ty) => {
        impl Kernel for $t {
            fn combine(
                op: Combine,
                a: &[Self],
                b: &[Self],
                out: &mut [Self],
                _: bool,
            ) -> Option<()> {
                Some(match op {
                    Combine::Sum => half_into(a, b, out, |x, y| x + y),
                    Combine::Prod => half_into(a, b, out, |x, y| x * y),
                    Combine::Min => half_into(a, b, out, min_f32),
                    Combine::Max => half_into(a, b, out, max_f32),
                    _ => return None,
                })
            }
            fn scale(a: &[Self], s: f64) -> Option<Vec<Self>> {
                let s = s as f32;
                Some(half_zip(a, a, |x, _| x * s))
            }
            fn divide(a: &[Self], n: usize) -> Option<Vec<Self>> {
                let n = n as f32;
                Some(half_zip(a, a, |x, _| x / n))
            }
            fn divide_in_place(a: &mut [Self], n: usize) -> Option<()> {
                let n = n as f32;
                half_in_place(a, |x| x / n);
                Some(())
            }
        }
    };
}
half_kernel!(f16);
half_kernel!(bf16);

macro_rules! int_kernel {
    ($t:ty) => {
        impl Kernel for $t {
            fn combine(
                op: Combine,
                a: &[Self],
                b: &[Self],
                out: &mut [Self],
                is_bool: bool,
            ) -> Option<()> {
                Some(match (op, is_bool) {
                    (Combine::Sum | Combine::Max, true) | (Combine::Or, _) => {
                        zip_into(a, b, out, |x, y| x | y)
                    }
                    (Combine::Prod | Combine::Min, true) | (Combine::And, _) => {
                        zip_into(a, b, out, |x, y| x & y)
                    }
                    (Combine::Xor, _) => zip_into(a, b, out, |x, y| x ^ y),
                    (Combine::Sum, false) => zip_into(a, b, out, <$t>::wrapping_add),
                    (Combine::Prod, false) => zip_into(a, b, out, <$t>::wrapping_mul),
                    (Combine::Min, false) => zip_into(a, b, out, std::cmp::min),
                    (Combine::Max, false) => zip_into(a, b, out, std::cmp::max),
                })
            }
            fn scale(_: &[Self], _: f64) -> Option<Vec<Self>> {
                None
            }
            fn divide(_: &[Self], _: usize) -> Option<Vec<Self>> {
                None
            }
            fn divide_in_place(_: &mut [Self], _: usize) -> Option<()> {
                None
            }
        }
    };
}
int_kernel!(i8);
int_kernel!(u8);
int_kernel!(i16);
int_kernel!(u16);
int_kernel!(i32);
int_kernel!(u32);
int_kernel!(i64);
int_kernel!(u64);

/// Typed view of storage that the engine has validated (aligned, right length).
pub(crate) fn view<T: bytemuck::Pod>(b: &[u8]) -> Result<&[T]> {
    if b.is_empty() {
        return Ok(&[]);
    }
    bytemuck::try_cast_slice(b)
        .map_err(|e| Error::invalid(format!("misaligned or ragged buffer: {e}")))
}

fn unsupported(op: ReduceOp, dtype: DType) -> Error {
    Error::invalid(format!("reduce op {op} is not supported for dtype {dtype}"))
}

/// `a (op) b`, element-wise, into a new aligned buffer. Both are `dtype` storage of the same
/// length.
pub(crate) fn combine(
    dtype: DType,
    op: ReduceOp,
    a: &[u8],
    b: &[u8],
    pool: &Pool,
) -> Result<Bytes> {
    if a.len() != b.len() {
        return Err(Error::invalid("reduce operands differ in length"));
    }
    let c = op.combiner();
    crate::with_storage_type!(dtype, T => {
        let n = a.len() / std::mem::size_of::<T>();
        let mut buf = pool.take(a.len());
        let out = buf.typed_mut::<T>(n).ok_or_else(|| Error::internal("pool buffer too small"))?;
        <T as Kernel>::combine(c, view::<T>(a)?, view::<T>(b)?, out, dtype == DType::Bool)
            .ok_or_else(|| unsupported(op, dtype))?;
        Ok(buf.freeze())
    })
}

/// Elements per tile of [`fold_into`]: a tile of every operand stays in the first cache levels
/// while all of them are folded into it.
const FOLD_TILE_BYTES: usize = 16 << 10;

/// `local` folded with each of `others` in order — `acc = x (op) acc` where `x`'s flag says
/// the received value goes first, else `acc = acc (op) x` — written into `out` once: the same
/// bits as combining pairwise in that order, but one pass over memory however many operands
/// there are (tile by tile), instead of one pass, and one new buffer, per operand. All are
/// `dtype` storage of `out`'s length; `out` is 8-aligned.
pub(crate) fn fold_into(
    dtype: DType,
    op: ReduceOp,
    local: &[u8],
    others: &[(&[u8], bool)],
    out: &mut [u8],
) -> Result<()> {
    if local.len() != out.len() || others.iter().any(|(x, _)| x.len() != out.len()) {
        return Err(Error::invalid("reduce operands differ in length"));
    }
    let Some(((first, first_remote), rest)) = others.split_first() else {
        out.copy_from_slice(local);
        return Ok(());
    };
    let c = op.combiner();
    let is_bool = dtype == DType::Bool;
    crate::with_storage_type!(dtype, T => {
        let out: &mut [T] = bytemuck::try_cast_slice_mut(out)
            .map_err(|e| Error::internal(format!("misaligned fold output: {e}")))?;
        let local = view::<T>(local)?;
        let first = view::<T>(first)?;
        let rest = rest
            .iter()
            .map(|(x, f)| Ok((view::<T>(x)?, *f)))
            .collect::<Result<Vec<_>>>()?;
        let tile = (FOLD_TILE_BYTES / std::mem::size_of::<T>()).max(1);
        let mut tmp = vec![<T as bytemuck::Zeroable>::zeroed(); if rest.is_empty() { 0 } else { tile.min(out.len()) }];
        for start in (0..out.len()).step_by(tile) {
            let end = (start + tile).min(out.len());
            let acc = &mut out[start..end];
            let (l, x) = (&local[start..end], &first[start..end]);
            let (a, b) = if *first_remote { (x, l) } else { (l, x) };
            <T as Kernel>::combine(c, a, b, acc, is_bool).ok_or_else(|| unsupported(op, dtype))?;
            for (x, remote_first) in &rest {
                let t = &mut tmp[..end - start];
                let x = &x[start..end];
                let (a, b) = if *remote_first { (x, &*acc) } else { (&*acc, x) };
                <T as Kernel>::combine(c, a, b, t, is_bool).ok_or_else(|| unsupported(op, dtype))?;
                acc.copy_from_slice(t);
            }
        }
        Ok(())
    })
}

/// The input transform of `op` (PremulSum's scaling), or `None` when there is none.
pub(crate) fn pre(dtype: DType, op: ReduceOp, a: &[u8]) -> Result<Option<Bytes>> {
    let ReduceOp::PremulSum(s) = op else {
        return Ok(None);
    };
    crate::with_storage_type!(dtype, T => {
        let out = <T as Kernel>::scale(view::<T>(a)?, s).ok_or_else(|| unsupported(op, dtype))?;
        Ok(Some(bytes_from_vec(out)))
    })
}

/// The output transform of `op` over `group_size` ranks (Avg's division), or `None`.
pub(crate) fn post(
    dtype: DType,
    op: ReduceOp,
    a: &[u8],
    group_size: usize,
) -> Result<Option<Bytes>> {
    if op != ReduceOp::Avg {
        return Ok(None);
    }
    crate::with_storage_type!(dtype, T => {
        let out = <T as Kernel>::divide(view::<T>(a)?, group_size).ok_or_else(|| unsupported(op, dtype))?;
        Ok(Some(bytes_from_vec(out)))
    })
}

/// [`post`] in place: the output transform of `op` over `group_size` ranks applied to `a`.
pub(crate) fn post_in_place(
    dtype: DType,
    op: ReduceOp,
    a: &mut [u8],
    group_size: usize,
) -> Result<()> {
    if op != ReduceOp::Avg || a.is_empty() {
        return Ok(());
    }
    crate::with_storage_type!(dtype, T => {
        let v: &mut [T] = bytemuck::try_cast_slice_mut(a)
            .map_err(|e| Error::invalid(format!("misaligned or ragged buffer: {e}")))?;
        <T as Kernel>::divide_in_place(v, group_size).ok_or_else(|| unsupported(op, dtype))
    })
}

/// Reduces a list of same-shaped tensors in list order with `op`, including the pre and post
/// transforms: the sequential reference the tests compare collectives with.
pub fn reference(op: ReduceOp, inputs: &[crate::Tensor]) -> Result<crate::Tensor> {
    let first = inputs
        .first()
        .ok_or_else(|| Error::invalid("reference of no inputs"))?;
    let dtype = first.dtype();
    op.check(dtype)?;
    let prep = |t: &crate::Tensor| -> Result<Bytes> {
        Ok(pre(dtype, op, t.bytes())?.unwrap_or_else(|| t.bytes().clone()))
    };
    let mut acc = prep(first)?;
    for t in &inputs[1..] {
        acc = combine(dtype, op, &acc, &prep(t)?, &Pool::none())?;
    }
    if let Some(b) = post(dtype, op, &acc, inputs.len())? {
        acc = b;
    }
    Ok(crate::Tensor::from_parts(
        acc,
        dtype,
        first.shape().to_vec(),
    ))
}

#[cfg(test)]
#[path = "reduce_tests.rs"]
mod tests;
