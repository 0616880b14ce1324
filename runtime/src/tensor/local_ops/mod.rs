//! Local tensor ops with torch semantics: [`scatter_`], [`scatter_value_`], [`scatter_add_`],
//! [`scatter_reduce_`] and [`gather`].
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
//!
//! [`scatter_`]: crate::Tensor::scatter_
//! [`scatter_value_`]: crate::Tensor::scatter_value_
//! [`scatter_add_`]: crate::Tensor::scatter_add_
//! [`scatter_reduce_`]: crate::Tensor::scatter_reduce_
//! [`gather`]: crate::Tensor::gather
//! [`DType::I64`]: crate::DType::I64
//! [`Error::InvalidArgument`]: crate::Error::InvalidArgument

mod gather;
mod scalar;
mod scatter;
mod walk;

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

#[cfg(test)]
mod tests;
