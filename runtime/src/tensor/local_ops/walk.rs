//! torch's argument checks (dims, dtypes, shapes, index values) and the walk over `index`
//! that the scatter and gather ops share.

use crate::error::{Error, Result};
use crate::tensor::dtype::DType;
use crate::tensor::Tensor;

/// A typed view of a tensor's storage (`bool` as `u8`).
pub(super) fn storage<S: bytemuck::Pod>(t: &Tensor) -> Result<&[S]> {
    let b: &[u8] = t.bytes();
    if b.is_empty() {
        return Ok(&[]);
    }
    bytemuck::try_cast_slice(b)
        .map_err(|e| Error::invalid(format!("tensor storage is not a valid {}: {e}", t.dtype())))
}

/// The shape torch's scatter/gather checks see: a 0-d tensor counts as 1-D of size 1.
pub(super) fn nonempty_shape(t: &Tensor) -> Vec<usize> {
    if t.shape().is_empty() {
        vec![1]
    } else {
        t.shape().to_vec()
    }
}

/// Wraps a torch-style (possibly negative) `dim` for a tensor of `ndim` dimensions.
pub(super) fn wrap_dim(op: &str, dim: isize, ndim: usize) -> Result<usize> {
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
pub(super) fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1usize; shape.len()];
    let mut acc = 1usize;
    for (st, &d) in s.iter_mut().zip(shape).rev() {
        *st = acc;
        acc = acc.saturating_mul(d);
    }
    s
}

pub(super) fn check_index_dtype(op: &str, index: &Tensor) -> Result<()> {
    if index.dtype() == DType::I64 {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "{op}(): Expected dtype int64 for index, got {}",
            index.dtype()
        )))
    }
}

pub(super) fn check_same_dtype(op: &str, this: &Tensor, src: &Tensor) -> Result<()> {
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
pub(super) fn check_shapes(
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
pub(super) struct Walk<'a> {
    pub(super) op: &'a str,
    pub(super) dim: usize,
    /// `self`'s shape (0-d as `[1]`).
    pub(super) target_shape: Vec<usize>,
    /// `index`'s shape (0-d as `[1]`).
    pub(super) index_shape: Vec<usize>,
    /// The index values, row-major.
    pub(super) index: &'a [i64],
}

impl Walk<'_> {
    /// Calls `f(target_offset, other_offset)` for every element of `index`, in row-major
    /// order: `target_offset` is the element of `self` it addresses, `other_offset` the
    /// element at the same position in a tensor of strides `other_strides` (or, without
    /// them, the index element's own position).
    pub(super) fn run(
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

pub(super) fn internal(op: &str) -> Error {
    Error::invalid(format!("{op}(): element offset out of range"))
}
