//! [`TensorSpec`]: the shape, dtype and device of a tensor to be produced (an output a call
//! makes, or a caller's buffer describes).

use crate::error::Result;
use crate::tensor::dtype::DType;
use crate::tensor::{numel_of, Device, Tensor};

/// Shape and dtype of a tensor to be produced (torch passes pre-allocated outputs; collectix
/// hands back new tensors and takes only their specs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorSpec {
    /// Shape.
    pub shape: Vec<usize>,
    /// Element type.
    pub dtype: DType,
    /// Where the tensor is to be produced.
    pub device: Device,
}

impl TensorSpec {
    /// A spec of a host tensor.
    pub fn new(shape: &[usize], dtype: DType) -> TensorSpec {
        TensorSpec {
            shape: shape.to_vec(),
            dtype,
            device: Device::Host,
        }
    }

    /// The same spec on `device`.
    pub fn on(mut self, device: Device) -> TensorSpec {
        self.device = device;
        self
    }

    /// Elements (overflow-checked).
    pub fn numel(&self) -> Result<usize> {
        numel_of(&self.shape)
    }
}

impl From<&Tensor> for TensorSpec {
    fn from(t: &Tensor) -> Self {
        TensorSpec::new(t.shape(), t.dtype()).on(t.device())
    }
}
