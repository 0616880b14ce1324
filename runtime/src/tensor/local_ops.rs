//! Local tensor ops with torch semantics: [`scatter_`](Tensor::scatter_),
//! [`scatter_value_`](Tensor::scatter_value_), [`scatter_add_`](Tensor::scatter_add_),
//! [`scatter_reduce_`](Tensor::scatter_reduce_) and [`gather`](Tensor::gather).
//!
//! Tensors are values, so the ops that torch runs in place (the trailing underscore) keep
//! torch's name but leave `self` alone and return the result as a new tensor.
//!
//! # Rules (torch's, checked before anything is computed)
//! - `dim` may be negative (`-1` is the last dimension); a 0-d tensor counts as 1-D, as in torch.
//! - `index` must have dtype [`DType::I64`] (torch requires int64) and, like `src`, the same
//!   number of dimensions as `self`.
//! - `index.size(d) <= src.size(d)` for every `d`, and `index.size(d) <= self.size(d)` for every
//!   `d != dim` (gather: only the latter). When `index` has no elements the shape checks are
//!   skipped and nothing is written, as in torch.
//! - `src` must have `self`'s dtype.
//! - Every index value `i` must lie in `0..n`, where `n = self.size(dim)`; as in torch's
//!   kernels, negative index values are rejected (unlike negative `dim`s).
//!
//! Every violation is an [`Error::InvalidArgument`]; the ops never panic.
//!
//! # Numerics
//! - Elements are visited in row-major order of `index`. For [`ScatterReduce::None`] a later
//!   write to the same place wins (torch leaves the winner unspecified).
//! - Integers wrap on overflow (two's complement), in debug builds too.
//! - `f16` and `bf16` are combined through `f32` and rounded back after every step.
//! - bool: add and sum act as OR, multiply and prod as AND, amax as OR, amin as AND.
//! - `amax`/`amin` on floats propagate NaN, as torch's CPU kernels do.

use crate::error::{Error, Result};
use crate::tensor::dtype::{bf16, f16, DType, Element};
use crate::tensor::{bytes_from_vec, Tensor};
use std::fmt;

/// The `reduce` argument of torch's `scatter_` (`None`, `'add'` or `'multiply'`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum ScatterReduce {
    /// Plain scatter: each indexed element is replaced.
    #[default]
    None,
    /// `reduce='add'`: the value is added (OR for bool, wrapping for integers).
    Add,
    /// `reduce='multiply'`: the element is multiplied by the value (AND for bool, wrapping
    /// for integers).
    Multiply,
}

impl fmt::Display for ScatterReduce {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ScatterReduce::None => "none",
            ScatterReduce::Add => "add",
            ScatterReduce::Multiply => "multiply",
        })
    }
}

/// The `reduce` argument of torch's `scatter_reduce_`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScatterReduceOp {
    /// `"sum"` (OR for bool, wrapping for integers).
    Sum,
    /// `"prod"` (AND for bool, wrapping for integers).
    Prod,
    /// `"mean"`: the sum divided by the number of contributions (floor division for
    /// integers, as torch does; not defined for bool).
    Mean,
    /// `"amax"`: the maximum (NaN propagates).
    Amax,
    /// `"amin"`: the minimum (NaN propagates).
    Amin,
}

impl fmt::Display for ScatterReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ScatterReduceOp::Sum => "sum",
            ScatterReduceOp::Prod => "prod",
            ScatterReduceOp::Mean => "mean",
            ScatterReduceOp::Amax => "amax",
            ScatterReduceOp::Amin => "amin",
        })
    }
}

/// How one source element is combined with the element it lands on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Combine {
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
trait Scalar: Element + bytemuck::Pod {
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

/// A typed view of a tensor's storage (`bool` as `u8`).
fn storage<S: bytemuck::Pod>(t: &Tensor) -> Result<&[S]> {
    let b: &[u8] = t.bytes();
    if b.is_empty() {
        return Ok(&[]);
    }
    bytemuck::try_cast_slice(b)
        .map_err(|e| Error::invalid(format!("tensor storage is not a valid {}: {e}", t.dtype())))
}

/// The shape torch's scatter/gather checks see: a 0-d tensor counts as 1-D of size 1.
fn nonempty_shape(t: &Tensor) -> Vec<usize> {
    if t.shape().is_empty() {
        vec![1]
    } else {
        t.shape().to_vec()
    }
}

/// Wraps a torch-style (possibly negative) `dim` for a tensor of `ndim` dimensions.
fn wrap_dim(op: &str, dim: isize, ndim: usize) -> Result<usize> {
    let n = isize::try_from(ndim).unwrap_or(isize::MAX);
    let d = if dim < 0 { dim.saturating_add(n) } else { dim };
    if (0..n).contains(&d) {
        usize::try_from(d).map_err(|_| Error::invalid(format!("{op}(): bad dim {dim}")))
    } else {
        Err(Error::invalid(format!(
            "{op}(): dimension out of range (expected to be in range of [{}, {}], but got {dim})",
            -n,
            n - 1
        )))
    }
}

/// Checks an index value against `0..size` (torch rejects negative index values here).
fn wrap_index(op: &str, raw: i64, size: usize, dim: usize) -> Result<usize> {
    let n = i64::try_from(size).unwrap_or(i64::MAX);
    if (0..n).contains(&raw) {
        usize::try_from(raw).map_err(|_| Error::invalid(format!("{op}(): bad index {raw}")))
    } else {
        Err(Error::invalid(format!(
            "{op}(): index {raw} is out of bounds for dimension {dim} with size {size}"
        )))
    }
}

/// Row-major strides of `shape`.
fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1usize; shape.len()];
    let mut acc = 1usize;
    for (st, &d) in s.iter_mut().zip(shape).rev() {
        *st = acc;
        acc = acc.saturating_mul(d);
    }
    s
}

fn check_index_dtype(op: &str, index: &Tensor) -> Result<()> {
    if index.dtype() == DType::I64 {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "{op}(): Expected dtype int64 for index, got {}",
            index.dtype()
        )))
    }
}

fn check_same_dtype(op: &str, this: &Tensor, src: &Tensor) -> Result<()> {
    if this.dtype() == src.dtype() {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "{op}(): Expected self.dtype to be equal to src.dtype ({} vs {})",
            this.dtype(),
            src.dtype()
        )))
    }
}

/// torch's `scatter_shape_check` (and `gather_shape_check` when `src` is `None` and `gather`).
fn check_shapes(
    op: &str,
    self_shape: &[usize],
    dim: usize,
    index_shape: &[usize],
    src_shape: Option<&[usize]>,
) -> Result<()> {
    if self_shape.len() != index_shape.len() {
        return Err(Error::invalid(format!(
            "{op}(): Index tensor must have the same number of dimensions as self tensor \
             (index {index_shape:?}, self {self_shape:?})"
        )));
    }
    if let Some(src_shape) = src_shape {
        if src_shape.len() != index_shape.len() {
            return Err(Error::invalid(format!(
                "{op}(): Index tensor must have the same number of dimensions as src tensor \
                 (index {index_shape:?}, src {src_shape:?})"
            )));
        }
    }
    for (d, (&i, &s)) in index_shape.iter().zip(self_shape).enumerate() {
        let src_ok = src_shape
            .and_then(|ss| ss.get(d))
            .is_none_or(|&src_d| i <= src_d);
        if (d != dim && i > s) || !src_ok {
            return Err(Error::invalid(match src_shape {
                Some(ss) => format!(
                    "{op}(): Expected index {index_shape:?} to be smaller than self \
                     {self_shape:?} apart from dimension {dim} and to be smaller size than src \
                     {ss:?}"
                ),
                None => format!(
                    "{op}(): Size does not match at dimension {d} expected index \
                     {index_shape:?} to be smaller than self {self_shape:?} apart from \
                     dimension {dim}"
                ),
            }));
        }
    }
    Ok(())
}

/// The checked geometry of one scatter or gather call.
struct Walk<'a> {
    op: &'a str,
    dim: usize,
    /// `self`'s shape (0-d as `[1]`).
    target_shape: Vec<usize>,
    /// `index`'s shape (0-d as `[1]`).
    index_shape: Vec<usize>,
    /// The index values, row-major.
    index: &'a [i64],
}

impl Walk<'_> {
    /// Calls `f(target_offset, other_offset)` for every element of `index`, in row-major
    /// order: `target_offset` is the element of `self` it addresses, `other_offset` the
    /// element at the same position in a tensor of strides `other_strides` (or, without
    /// them, the index element's own position).
    fn run(
        &self,
        other_strides: Option<&[usize]>,
        mut f: impl FnMut(usize, usize) -> Result<()>,
    ) -> Result<()> {
        let tstrides = strides(&self.target_shape);
        let size = self.target_shape.get(self.dim).copied().unwrap_or(0);
        let mut coord = vec![0usize; self.index_shape.len()];
        for (p, &raw) in self.index.iter().enumerate() {
            let i = wrap_index(self.op, raw, size, self.dim)?;
            let mut t_off = 0usize;
            for (d, (&c, &st)) in coord.iter().zip(&tstrides).enumerate() {
                t_off += (if d == self.dim { i } else { c }) * st;
            }
            let o_off = match other_strides {
                Some(os) => coord.iter().zip(os).map(|(&c, &st)| c * st).sum(),
                None => p,
            };
            f(t_off, o_off)?;
            for (c, &n) in coord.iter_mut().zip(&self.index_shape).rev() {
                *c += 1;
                if *c < n {
                    break;
                }
                *c = 0;
            }
        }
        Ok(())
    }
}

/// Where the scattered values come from.
#[derive(Clone, Copy)]
enum Source<'a> {
    /// A tensor, read at the index element's position.
    Tensor(&'a Tensor),
    /// One scalar: `exact` holds its bytes when it already has the tensor's dtype.
    Scalar { value: f64, exact: Option<&'a [u8]> },
}

fn internal(op: &str) -> Error {
    Error::invalid(format!("{op}(): element offset out of range"))
}

impl Tensor {
    /// Checks a scatter call; `None` when `index` is empty (nothing to do).
    fn scatter_walk<'a>(
        &self,
        op: &'a str,
        dim: isize,
        index: &'a Tensor,
        src: Option<&Tensor>,
    ) -> Result<Option<Walk<'a>>> {
        check_index_dtype(op, index)?;
        if let Some(src) = src {
            check_same_dtype(op, self, src)?;
        }
        let target_shape = nonempty_shape(self);
        let dim = wrap_dim(op, dim, target_shape.len())?;
        if index.numel() == 0 {
            return Ok(None);
        }
        let index_shape = nonempty_shape(index);
        let src_shape = src.map(nonempty_shape);
        check_shapes(op, &target_shape, dim, &index_shape, src_shape.as_deref())?;
        Ok(Some(Walk {
            op,
            dim,
            target_shape,
            index_shape,
            index: index.as_slice::<i64>()?,
        }))
    }

    /// Scatters with `combine`: the values come from `src` (at the index element's position)
    /// or are the scalar `value`.
    fn scatter_impl(
        &self,
        op: &str,
        dim: isize,
        index: &Tensor,
        source: Source<'_>,
        combine: Combine,
    ) -> Result<Tensor> {
        let src = match source {
            Source::Tensor(t) => Some(t),
            Source::Scalar { .. } => None,
        };
        let Some(walk) = self.scatter_walk(op, dim, index, src)? else {
            return Ok(self.clone());
        };
        let is_bool = self.dtype() == DType::Bool;
        crate::with_storage_type!(self.dtype(), S => {
            let mut out: Vec<S> = storage::<S>(self)?.to_vec();
            match source {
                Source::Tensor(src) => {
                    let sv = storage::<S>(src)?;
                    let sstrides = strides(&nonempty_shape(src));
                    walk.run(Some(&sstrides), |t, o| {
                        let b = *sv.get(o).ok_or_else(|| internal(op))?;
                        let a = out.get_mut(t).ok_or_else(|| internal(op))?;
                        *a = S::combine(combine, *a, b, is_bool);
                        Ok(())
                    })?;
                }
                Source::Scalar { value, exact } => {
                    let b = match exact.map(bytemuck::try_pod_read_unaligned::<S>) {
                        Some(Ok(v)) => v,
                        _ => S::from_scalar(value, is_bool),
                    };
                    walk.run(None, |t, _| {
                        let a = out.get_mut(t).ok_or_else(|| internal(op))?;
                        *a = S::combine(combine, *a, b, is_bool);
                        Ok(())
                    })?;
                }
            }
            Ok(Tensor::from_parts(bytes_from_vec(out), self.dtype(), self.shape().to_vec()))
        })
    }

    /// torch's `self.scatter_(dim, index, src, reduce=...)`: writes `src` into a copy of
    /// `self` at the positions `index` gives along `dim`, and returns it (`self` itself is
    /// not changed: tensors are values).
    ///
    /// For a 3-D tensor and [`ScatterReduce::None`]:
    /// ```text
    /// out[index[i][j][k]][j][k] = src[i][j][k]  # dim == 0
    /// out[i][index[i][j][k]][k] = src[i][j][k]  # dim == 1
    /// out[i][j][index[i][j][k]] = src[i][j][k]  # dim == 2
    /// ```
    /// [`Add`](ScatterReduce::Add) and [`Multiply`](ScatterReduce::Multiply) combine instead
    /// of replacing. See the [module docs](crate::tensor::local_ops) for the checks (`index` must
    /// be int64, `src` of `self`'s dtype) and the numerics.
    ///
    /// # Example (from the torch docs)
    /// ```
    /// use collectix_runtime::Tensor;
    /// use collectix_runtime::tensor::local_ops::ScatterReduce;
    ///
    /// let src = Tensor::from_vec_shape((1i64..=10).collect(), &[2, 5])?;
    /// let index = Tensor::from_vec_shape(vec![0i64, 1, 2, 0], &[1, 4])?;
    /// let out = Tensor::zeros(&[3, 5], src.dtype())?.scatter_(0, &index, &src, ScatterReduce::None)?;
    /// assert_eq!(out.format_values(), "[[1, 0, 0, 4, 0], [0, 2, 0, 0, 0], [0, 0, 3, 0, 0]]");
    ///
    /// let index = Tensor::from_vec_shape(vec![0i64, 1, 2, 0, 1, 4], &[2, 3])?;
    /// let out = Tensor::zeros(&[3, 5], src.dtype())?.scatter_(1, &index, &src, ScatterReduce::None)?;
    /// assert_eq!(out.format_values(), "[[1, 2, 3, 0, 0], [6, 7, 0, 0, 8], [0, 0, 0, 0, 0]]");
    /// # Ok::<(), collectix_runtime::Error>(())
    /// ```
    pub fn scatter_(
        &self,
        dim: isize,
        index: &Tensor,
        src: &Tensor,
        reduce: ScatterReduce,
    ) -> Result<Tensor> {
        self.scatter_impl("scatter_", dim, index, Source::Tensor(src), reduce.into())
    }

    /// torch's `self.scatter_(dim, index, value, reduce=...)`: like
    /// [`scatter_`](Tensor::scatter_) with every source element equal to the scalar `value`.
    /// Returns the result (`self` is not changed).
    ///
    /// `value` may be of any element type: when `T` is `self`'s dtype it is used exactly;
    /// otherwise it is converted through `f64` as `as` would (to a bool: `value != 0`), as
    /// torch converts a Python scalar to the tensor's dtype.
    ///
    /// # Example (from the torch docs)
    /// ```
    /// use collectix_runtime::Tensor;
    /// use collectix_runtime::tensor::local_ops::ScatterReduce;
    ///
    /// let index = Tensor::from_vec_shape(vec![2i64, 3], &[2, 1])?;
    /// let base = Tensor::full(&[2, 4], 2.0f32)?;
    /// let out = base.scatter_value_(1, &index, 1.23f32, ScatterReduce::Multiply)?;
    /// assert_eq!(out.format_values(), "[[2, 2, 2.46, 2], [2, 2, 2, 2.46]]");
    /// let out = base.scatter_value_(1, &index, 1.23f32, ScatterReduce::Add)?;
    /// assert_eq!(out.format_values(), "[[2, 2, 3.23, 2], [2, 2, 2, 3.23]]");
    /// # Ok::<(), collectix_runtime::Error>(())
    /// ```
    pub fn scatter_value_<T: Element>(
        &self,
        dim: isize,
        index: &Tensor,
        value: T,
        reduce: ScatterReduce,
    ) -> Result<Tensor> {
        let exact = (T::DTYPE == self.dtype()).then(|| bytemuck::bytes_of(&value));
        self.scatter_impl(
            "scatter_",
            dim,
            index,
            Source::Scalar {
                value: value.to_f64(),
                exact,
            },
            reduce.into(),
        )
    }

    /// torch's `self.scatter_add_(dim, index, src)`: adds every element of `src` into a copy
    /// of `self` at the position `index` gives along `dim` (duplicates accumulate), and
    /// returns it (`self` is not changed). Same as [`scatter_`](Tensor::scatter_) with
    /// [`ScatterReduce::Add`]; for bool, adding is OR.
    ///
    /// # Example (from the torch docs)
    /// ```
    /// use collectix_runtime::{DType, Tensor};
    ///
    /// let src = Tensor::full(&[2, 5], 1.0f32)?;
    /// let zeros = Tensor::zeros(&[3, 5], DType::F32)?;
    /// let index = Tensor::from_vec_shape(vec![0i64, 1, 2, 0, 0], &[1, 5])?;
    /// let out = zeros.scatter_add_(0, &index, &src)?;
    /// assert_eq!(out.format_values(), "[[1, 0, 0, 1, 1], [0, 1, 0, 0, 0], [0, 0, 1, 0, 0]]");
    ///
    /// let index = Tensor::from_vec_shape(vec![0i64, 1, 2, 0, 0, 0, 1, 2, 2, 2], &[2, 5])?;
    /// let out = zeros.scatter_add_(0, &index, &src)?;
    /// assert_eq!(out.format_values(), "[[2, 0, 0, 1, 1], [0, 2, 0, 0, 0], [0, 0, 2, 1, 1]]");
    /// # Ok::<(), collectix_runtime::Error>(())
    /// ```
    pub fn scatter_add_(&self, dim: isize, index: &Tensor, src: &Tensor) -> Result<Tensor> {
        self.scatter_impl(
            "scatter_add_",
            dim,
            index,
            Source::Tensor(src),
            Combine::Add,
        )
    }

    /// torch's `self.scatter_reduce_(dim, index, src, reduce, include_self=...)`: reduces
    /// every element of `src` into a copy of `self` at the position `index` gives along
    /// `dim`, and returns it (`self` is not changed).
    ///
    /// With `include_self` the elements of `self` that are scattered to take part in the
    /// reduction; without it they are replaced by the reduction of what is scattered to
    /// them. Elements nothing is scattered to keep their value either way.
    /// [`Mean`](ScatterReduceOp::Mean) divides by the number of contributions (counting
    /// `self`'s element when `include_self`), with floor division for integers, as torch;
    /// the counts are exact. Mean is not defined for bool (an error).
    ///
    /// # Example (from the torch docs)
    /// ```
    /// use collectix_runtime::Tensor;
    /// use collectix_runtime::tensor::local_ops::ScatterReduceOp;
    ///
    /// let src = Tensor::from_vec(vec![1.0f32, 2., 3., 4., 5., 6.]);
    /// let index = Tensor::from_vec(vec![0i64, 1, 0, 1, 2, 1]);
    /// let input = Tensor::from_vec(vec![1.0f32, 2., 3., 4.]);
    /// let sum = input.scatter_reduce_(0, &index, &src, ScatterReduceOp::Sum, true)?;
    /// assert_eq!(sum.format_values(), "[5, 14, 8, 4]");
    /// let sum = input.scatter_reduce_(0, &index, &src, ScatterReduceOp::Sum, false)?;
    /// assert_eq!(sum.format_values(), "[4, 12, 5, 4]");
    /// let amax = input.scatter_reduce_(0, &index, &src, ScatterReduceOp::Amax, true)?;
    /// assert_eq!(amax.format_values(), "[3, 6, 5, 4]");
    /// let amax = input.scatter_reduce_(0, &index, &src, ScatterReduceOp::Amax, false)?;
    /// assert_eq!(amax.format_values(), "[3, 6, 5, 4]");
    /// # Ok::<(), collectix_runtime::Error>(())
    /// ```
    pub fn scatter_reduce_(
        &self,
        dim: isize,
        index: &Tensor,
        src: &Tensor,
        reduce: ScatterReduceOp,
        include_self: bool,
    ) -> Result<Tensor> {
        const OP: &str = "scatter_reduce_";
        let is_bool = self.dtype() == DType::Bool;
        if is_bool && reduce == ScatterReduceOp::Mean {
            return Err(Error::invalid(format!(
                "{OP}(): reduce=\"mean\" is not supported for dtype bool"
            )));
        }
        let Some(walk) = self.scatter_walk(OP, dim, index, Some(src))? else {
            return Ok(self.clone());
        };
        let combine = Combine::from(reduce);
        let sstrides = strides(&nonempty_shape(src));
        crate::with_storage_type!(self.dtype(), S => {
            let mut out: Vec<S> = storage::<S>(self)?.to_vec();
            let sv = storage::<S>(src)?;
            if !include_self {
                let init = S::identity(reduce, is_bool);
                walk.run(None, |t, _| {
                    *out.get_mut(t).ok_or_else(|| internal(OP))? = init;
                    Ok(())
                })?;
            }
            let mut counts: Vec<u64> = if reduce == ScatterReduceOp::Mean {
                vec![u64::from(include_self); out.len()]
            } else {
                Vec::new()
            };
            walk.run(Some(&sstrides), |t, o| {
                let b = *sv.get(o).ok_or_else(|| internal(OP))?;
                let a = out.get_mut(t).ok_or_else(|| internal(OP))?;
                *a = S::combine(combine, *a, b, is_bool);
                if let Some(c) = counts.get_mut(t) {
                    *c += 1;
                }
                Ok(())
            })?;
            for (x, &c) in out.iter_mut().zip(&counts) {
                if c > 1 {
                    *x = S::mean(*x, c);
                }
            }
            Ok(Tensor::from_parts(bytes_from_vec(out), self.dtype(), self.shape().to_vec()))
        })
    }

    /// torch's `torch.gather(self, dim, index)`: a new tensor of `index`'s shape and `self`'s
    /// dtype, with, for a 3-D tensor:
    /// ```text
    /// out[i][j][k] = self[index[i][j][k]][j][k]  # dim == 0
    /// out[i][j][k] = self[i][index[i][j][k]][k]  # dim == 1
    /// out[i][j][k] = self[i][j][index[i][j][k]]  # dim == 2
    /// ```
    /// `index` must be int64 with as many dimensions as `self`, and `index.size(d) <=
    /// self.size(d)` for `d != dim` (see the [module docs](crate::tensor::local_ops)).
    ///
    /// # Example (from the torch docs)
    /// ```
    /// use collectix_runtime::Tensor;
    ///
    /// let t = Tensor::from_vec_shape(vec![1i64, 2, 3, 4], &[2, 2])?;
    /// let index = Tensor::from_vec_shape(vec![0i64, 0, 1, 0], &[2, 2])?;
    /// assert_eq!(t.gather(1, &index)?.format_values(), "[[1, 1], [4, 3]]");
    /// # Ok::<(), collectix_runtime::Error>(())
    /// ```
    pub fn gather(&self, dim: isize, index: &Tensor) -> Result<Tensor> {
        const OP: &str = "gather";
        check_index_dtype(OP, index)?;
        let target_shape = nonempty_shape(self);
        let dim = wrap_dim(OP, dim, target_shape.len())?;
        let out_shape = index.shape().to_vec();
        if index.numel() == 0 {
            return Tensor::zeros(&out_shape, self.dtype());
        }
        let index_shape = nonempty_shape(index);
        check_shapes(OP, &target_shape, dim, &index_shape, None)?;
        let walk = Walk {
            op: OP,
            dim,
            target_shape,
            index_shape,
            index: index.as_slice::<i64>()?,
        };
        crate::with_storage_type!(self.dtype(), S => {
            let sv = storage::<S>(self)?;
            let mut out: Vec<S> = Vec::with_capacity(index.numel());
            walk.run(None, |t, _| {
                out.push(*sv.get(t).ok_or_else(|| internal(OP))?);
                Ok(())
            })?;
            Ok(Tensor::from_parts(bytes_from_vec(out), self.dtype(), out_shape))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let f = Tensor::zeros(&[3], DType::F32)?.scatter_value_(
            0,
            &index,
            7i32,
            ScatterReduce::None,
        )?;
        assert_eq!(f.to_vec::<f32>()?, vec![7.0, 0.0, 7.0]);
        let i = Tensor::zeros(&[3], DType::I32)?.scatter_value_(
            0,
            &index,
            2.9f64,
            ScatterReduce::None,
        )?;
        assert_eq!(i.to_vec::<i32>()?, vec![2, 0, 2]);
        let b = Tensor::zeros(&[3], DType::Bool)?.scatter_value_(
            0,
            &index,
            0.5f32,
            ScatterReduce::Add,
        )?;
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
}
