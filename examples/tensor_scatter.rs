//! The local tensor ops of `collectix::runtime::tensor::local_ops` on the cases of the torch docs:
//! `scatter_` (tensor and scalar forms, with `reduce='add'` and `'multiply'`), `scatter_add_`,
//! `scatter_reduce_` (`sum` and `amax`, with and without `include_self`) and `gather`. No
//! ranks are involved: these are the local ops, as `torch.Tensor` methods are.
//!
//! Prints one line per case, `LABEL VALUES`, exactly:
//! ```text
//! scatter_ [[1, 0, 0, 4, 0], [0, 2, 0, 0, 0], [0, 0, 3, 0, 0]]
//! scatter_dim1 [[1, 2, 3, 0, 0], [6, 7, 0, 0, 8], [0, 0, 0, 0, 0]]
//! scatter_add [[2, 2, 3.23, 2], [2, 2, 2, 3.23]]
//! scatter_multiply [[2, 2, 2.46, 2], [2, 2, 2, 2.46]]
//! scatter_add_ [[1, 0, 0, 1, 1], [0, 1, 0, 0, 0], [0, 0, 1, 0, 0]]
//! scatter_add_2rows [[2, 0, 0, 1, 1], [0, 2, 0, 0, 0], [0, 0, 2, 1, 1]]
//! scatter_reduce_sum [5, 14, 8, 4]
//! scatter_reduce_sum_exclude_self [4, 12, 5, 4]
//! scatter_reduce_amax [3, 6, 5, 4]
//! scatter_reduce_amax_exclude_self [3, 6, 5, 4]
//! gather [[1, 1], [4, 3]]
//! ```

use collectix::runtime::tensor::local_ops::{ScatterReduce, ScatterReduceOp};
use collectix::{DType, Result, Tensor};

/// The example's output, one line per case.
pub(crate) fn lines() -> Result<Vec<String>> {
    let mut lines: Vec<(&str, Tensor)> = Vec::new();

    // src = torch.arange(1, 11).reshape((2, 5))
    let src = Tensor::from_vec_shape((1i64..=10).collect(), &[2, 5])?;
    let zeros = Tensor::zeros(&[3, 5], DType::I64)?;
    // torch.zeros(3, 5, dtype=src.dtype).scatter_(0, torch.tensor([[0, 1, 2, 0]]), src)
    let index = Tensor::from_vec_shape(vec![0i64, 1, 2, 0], &[1, 4])?;
    lines.push((
        "scatter_",
        zeros.scatter_(0, &index, &src, ScatterReduce::None)?,
    ));
    // torch.zeros(3, 5, dtype=src.dtype).scatter_(1, torch.tensor([[0, 1, 2], [0, 1, 4]]), src)
    let index = Tensor::from_vec_shape(vec![0i64, 1, 2, 0, 1, 4], &[2, 3])?;
    lines.push((
        "scatter_dim1",
        zeros.scatter_(1, &index, &src, ScatterReduce::None)?,
    ));

    // torch.full((2, 4), 2.).scatter_(1, torch.tensor([[2], [3]]), 1.23, reduce=...)
    let full = Tensor::full(&[2, 4], 2.0f32)?;
    let index = Tensor::from_vec_shape(vec![2i64, 3], &[2, 1])?;
    lines.push((
        "scatter_add",
        full.scatter_value_(1, &index, 1.23f32, ScatterReduce::Add)?,
    ));
    lines.push((
        "scatter_multiply",
        full.scatter_value_(1, &index, 1.23f32, ScatterReduce::Multiply)?,
    ));

    // torch.zeros(3, 5).scatter_add_(0, index, torch.ones((2, 5)))
    let ones = Tensor::full(&[2, 5], 1.0f32)?;
    let zeros = Tensor::zeros(&[3, 5], DType::F32)?;
    let index = Tensor::from_vec_shape(vec![0i64, 1, 2, 0, 0], &[1, 5])?;
    lines.push(("scatter_add_", zeros.scatter_add_(0, &index, &ones)?));
    let index = Tensor::from_vec_shape(vec![0i64, 1, 2, 0, 0, 0, 1, 2, 2, 2], &[2, 5])?;
    lines.push(("scatter_add_2rows", zeros.scatter_add_(0, &index, &ones)?));

    // input.scatter_reduce(0, index, src, reduce=..., include_self=...)
    let src = Tensor::from_vec(vec![1.0f32, 2., 3., 4., 5., 6.]);
    let index = Tensor::from_vec(vec![0i64, 1, 0, 1, 2, 1]);
    let input = Tensor::from_vec(vec![1.0f32, 2., 3., 4.]);
    for (label, op, include_self) in [
        ("scatter_reduce_sum", ScatterReduceOp::Sum, true),
        (
            "scatter_reduce_sum_exclude_self",
            ScatterReduceOp::Sum,
            false,
        ),
        ("scatter_reduce_amax", ScatterReduceOp::Amax, true),
        (
            "scatter_reduce_amax_exclude_self",
            ScatterReduceOp::Amax,
            false,
        ),
    ] {
        lines.push((
            label,
            input.scatter_reduce_(0, &index, &src, op, include_self)?,
        ));
    }

    // torch.gather(torch.tensor([[1, 2], [3, 4]]), 1, torch.tensor([[0, 0], [1, 0]]))
    let t = Tensor::from_vec_shape(vec![1i64, 2, 3, 4], &[2, 2])?;
    let index = Tensor::from_vec_shape(vec![0i64, 0, 1, 0], &[2, 2])?;
    lines.push(("gather", t.gather(1, &index)?));

    Ok(lines
        .iter()
        .map(|(label, values)| format!("{label} {}", values.format_values()))
        .collect())
}

#[allow(dead_code)]
fn main() -> Result<()> {
    for line in lines()? {
        println!("{line}");
    }
    Ok(())
}
