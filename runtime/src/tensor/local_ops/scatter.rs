//! [`scatter_`](Tensor::scatter_), [`scatter_value_`](Tensor::scatter_value_),
//! [`scatter_add_`](Tensor::scatter_add_) and [`scatter_reduce_`](Tensor::scatter_reduce_).

use super::scalar::{Combine, Scalar};
use super::walk::{
    check_index_dtype, check_same_dtype, check_shapes, internal, nonempty_shape, storage, strides,
    wrap_dim, Walk,
};
use super::{ScatterReduce, ScatterReduceOp};
use crate::error::{Error, Result};
use crate::tensor::dtype::{DType, Element};
use crate::tensor::{bytes_from_vec, Tensor};

/// Where the scattered values come from.
#[derive(Clone, Copy)]
enum Source<'a> {
    /// A tensor, read at the index element's position.
    Tensor(&'a Tensor),
    /// One scalar: `exact` holds its bytes when it already has the tensor's dtype.
    Scalar { value: f64, exact: Option<&'a [u8]> },
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
}
