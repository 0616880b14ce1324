//! [`gather`](Tensor::gather).

use super::walk::{
    check_index_dtype, check_shapes, internal, nonempty_shape, storage, wrap_dim, Walk,
};
use crate::error::Result;
use crate::tensor::{bytes_from_vec, Tensor};

impl Tensor {
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
