//! Host tensors: a shape, a dtype, a device tag and shared, aligned, immutable storage.
//!
//! Storage is a [`Bytes`] whose start is aligned for the dtype. Wrapping a `Vec<T>` or an
//! aligned `Bytes` costs no copy, and so does cloning a tensor or slicing its storage into
//! message payloads: that is how in-process ranks share data. Operations that produce new
//! values (reductions, the local [`scatter_`](Tensor::scatter_) family) write a new buffer.

pub mod arena;
pub mod buffer;
pub mod dtype;
pub mod local_ops;
pub mod pages;
pub mod pool;
pub mod reduce;
pub mod shared_heap;
pub mod spec;

use crate::error::{Error, Result};
use crate::tensor::dtype::{DType, Element};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::sync::Arc;

/// Where a tensor's storage lives. A tensor's device is part of its value: moving between
/// devices is explicit (`to_device`/`to_host` in `collectix-actors`, behind its `cuda`
/// feature), and a collective runs where its tensors are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[non_exhaustive]
pub enum Device {
    /// Ordinary host memory.
    #[default]
    Host,
    /// Memory of the CUDA device with this ordinal.
    Cuda(u32),
}

impl Device {
    /// Whether this is host memory.
    pub const fn is_host(self) -> bool {
        matches!(self, Device::Host)
    }
}

impl fmt::Display for Device {
    /// torch's spelling: `cpu`, `cuda:0`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Host => f.write_str("cpu"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

/// Storage that lives on a device: implemented by the device layer (CUDA memory in
/// `collectix-actors` under its `cuda` feature). The runtime never reads it; it only carries
/// it inside a [`Tensor`] so that a device tensor is an ordinary value.
pub trait DeviceStorage: Send + Sync + 'static {
    /// The device the bytes are on (never [`Device::Host`]).
    fn device(&self) -> Device;
    /// The size in bytes.
    fn nbytes(&self) -> usize;
    /// For the device layer to recover its concrete type.
    fn as_any(&self) -> &dyn std::any::Any;
}

/// Keeps a `Vec<T>` alive behind a [`Bytes`] without copying it.
struct VecOwner<T: Element>(Vec<T>);

impl<T: Element> AsRef<[u8]> for VecOwner<T> {
    fn as_ref(&self) -> &[u8] {
        bytemuck::cast_slice(&self.0)
    }
}

/// Turns a vector into shared bytes without copying it.
pub fn bytes_from_vec<T: Element>(v: Vec<T>) -> Bytes {
    if v.is_empty() {
        return Bytes::new();
    }
    Bytes::from_owner(VecOwner(v))
}

/// Copies `src` into a fresh buffer aligned for `dtype`.
pub(crate) fn aligned_copy(src: &[u8], dtype: DType) -> Bytes {
    crate::with_storage_type!(dtype, T => {
        let v: Vec<T> = bytemuck::pod_collect_to_vec(src);
        bytes_from_vec(v)
    })
}

/// Whether `b` starts at an address aligned for `dtype`.
pub(crate) fn is_aligned(b: &[u8], dtype: DType) -> bool {
    b.is_empty() || (b.as_ptr() as usize).is_multiple_of(dtype.size())
}

/// Makes `b` usable as storage for `dtype`: aligned (copied if it is not) and, for bool,
/// checked to hold only 0 and 1.
pub(crate) fn validate_storage(b: Bytes, dtype: DType) -> std::result::Result<Bytes, ()> {
    if dtype == DType::Bool && b.iter().any(|&x| x > 1) {
        return Err(());
    }
    Ok(if is_aligned(&b, dtype) {
        b
    } else {
        aligned_copy(&b, dtype)
    })
}

/// The number of elements of `shape`, or an error on overflow.
pub(crate) fn numel_of(shape: &[usize]) -> Result<usize> {
    shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| {
            Error::invalid(format!(
                "shape {shape:?} has more elements than fit in usize"
            ))
        })
}

/// `to`, if it has the `numel` elements of shape `from` (a reshape's check).
pub(crate) fn reshaped(from: &[usize], numel: usize, to: &[usize]) -> Result<Vec<usize>> {
    if numel_of(to)? != numel {
        return Err(Error::invalid(format!(
            "cannot reshape {from:?} ({numel} elements) to {to:?}"
        )));
    }
    Ok(to.to_vec())
}

/// A dense, contiguous host tensor (row-major), like a contiguous `torch.Tensor` on CPU.
///
/// Cloning is cheap (the storage is shared). Tensors are values: collectives take them by
/// value and hand back new ones, so no rank ever writes into memory another rank reads.
#[derive(Clone)]
pub struct Tensor {
    shape: Vec<usize>,
    dtype: DType,
    device: Device,
    /// Host storage; empty for a device tensor.
    data: Bytes,
    /// Device storage, for a tensor whose `device` is not the host.
    on_device: Option<Arc<dyn DeviceStorage>>,
}

impl Tensor {
    /// Wraps a vector as a 1-D tensor, without copying.
    pub fn from_vec<T: Element>(v: Vec<T>) -> Tensor {
        let n = v.len();
        Tensor {
            shape: vec![n],
            dtype: T::DTYPE,
            device: Device::Host,
            data: bytes_from_vec(v),
            on_device: None,
        }
    }

    /// Wraps a vector with the given shape, without copying.
    pub fn from_vec_shape<T: Element>(v: Vec<T>, shape: &[usize]) -> Result<Tensor> {
        Tensor::from_vec(v).reshape(shape)
    }

    /// Copies a slice into a new 1-D tensor.
    pub fn from_slice<T: Element>(v: &[T]) -> Tensor {
        Tensor::from_vec(pages::copied(v))
    }

    /// Wraps bytes as a tensor of `dtype` and `shape`. No copy when `bytes` is aligned for
    /// the dtype (it is copied into an aligned buffer otherwise). Fails when the length does
    /// not match or, for bool, when a byte is neither 0 nor 1.
    pub fn from_bytes(bytes: Bytes, dtype: DType, shape: &[usize]) -> Result<Tensor> {
        let numel = numel_of(shape)?;
        let want = numel
            .checked_mul(dtype.size())
            .ok_or_else(|| Error::invalid("tensor byte size overflows usize"))?;
        if bytes.len() != want {
            return Err(Error::invalid(format!(
                "{} bytes cannot hold a {dtype} tensor of shape {shape:?} ({want} bytes)",
                bytes.len()
            )));
        }
        let data = validate_storage(bytes, dtype)
            .map_err(|()| Error::invalid("bool tensor bytes must be 0 or 1"))?;
        Ok(Tensor {
            shape: shape.to_vec(),
            dtype,
            device: Device::Host,
            data,
            on_device: None,
        })
    }

    /// A tensor of zeros (false for bool).
    pub fn zeros(shape: &[usize], dtype: DType) -> Result<Tensor> {
        let n = numel_of(shape)?;
        let data = crate::with_storage_type!(dtype, T => bytes_from_vec(pages::filled(n, <T as bytemuck::Zeroable>::zeroed())));
        Ok(Tensor {
            shape: shape.to_vec(),
            dtype,
            device: Device::Host,
            data,
            on_device: None,
        })
    }

    /// A tensor filled with `value` (converted as `as` would).
    pub fn full<T: Element>(shape: &[usize], value: T) -> Result<Tensor> {
        let n = numel_of(shape)?;
        Tensor::from_vec(pages::filled(n, value)).reshape(shape)
    }

    /// A 0-element tensor of `dtype` (torch's `torch.empty(0)`).
    pub fn empty(dtype: DType) -> Tensor {
        Tensor {
            shape: vec![0],
            dtype,
            device: Device::Host,
            data: Bytes::new(),
            on_device: None,
        }
    }

    /// The same storage with another shape of the same number of elements.
    pub fn reshape(mut self, shape: &[usize]) -> Result<Tensor> {
        self.shape = reshaped(&self.shape, self.numel(), shape)?;
        Ok(self)
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The dtype.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The device.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The number of elements.
    pub fn numel(&self) -> usize {
        match &self.on_device {
            Some(d) => d.nbytes() / self.dtype.size(),
            None => self.data.len() / self.dtype.size(),
        }
    }

    /// The size in bytes.
    pub fn nbytes(&self) -> usize {
        match &self.on_device {
            Some(d) => d.nbytes(),
            None => self.data.len(),
        }
    }

    /// The host storage, shared (no copy); empty for a device tensor (see
    /// [`device_storage`](Tensor::device_storage)).
    pub fn bytes(&self) -> &Bytes {
        &self.data
    }

    /// Gives up the tensor for its storage (no copy).
    pub fn into_bytes(self) -> Bytes {
        self.data
    }

    /// A typed view; fails when `T` is not the tensor's dtype or the tensor is not on the
    /// host.
    pub fn as_slice<T: Element>(&self) -> Result<&[T]> {
        self.host_only()?;
        if T::DTYPE != self.dtype {
            return Err(Error::invalid(format!(
                "tensor has dtype {}, not {}",
                self.dtype,
                T::DTYPE
            )));
        }
        if self.data.is_empty() {
            // An empty `Bytes` may point anywhere; an empty slice needs no alignment.
            return Ok(&[]);
        }
        bytemuck::checked::try_cast_slice(&self.data).map_err(|e| {
            Error::invalid(format!("storage is not a valid {} slice: {e}", self.dtype))
        })
    }

    /// A copy of the elements as a vector.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        Ok(self.as_slice::<T>()?.to_vec())
    }

    /// The elements converted to `f64` (any dtype), for tests and printing.
    pub fn to_f64_vec(&self) -> Vec<f64> {
        macro_rules! conv {
            ($t:ty) => {
                self.as_slice::<$t>()
                    .map(|s| s.iter().map(|x| x.to_f64()).collect())
                    .unwrap_or_default()
            };
        }
        match self.dtype {
            DType::F16 => conv!(crate::tensor::dtype::f16),
            DType::BF16 => conv!(crate::tensor::dtype::bf16),
            DType::F32 => conv!(f32),
            DType::F64 => conv!(f64),
            DType::I8 => conv!(i8),
            DType::U8 => conv!(u8),
            DType::I32 => conv!(i32),
            DType::I64 => conv!(i64),
            DType::Bool => conv!(bool),
            DType::I16 => conv!(i16),
            DType::U16 => conv!(u16),
            DType::U32 => conv!(u32),
            DType::U64 => conv!(u64),
        }
    }

    /// The values as torch prints them without the `tensor(...)` wrapper, each element
    /// with Rust's `{}`: `[1, 2]`, `[[0, 0], [1, 1]]`; a 0-d tensor prints as its value.
    pub fn format_values(&self) -> String {
        fn rec<T: fmt::Display>(out: &mut String, v: &[T], shape: &[usize]) {
            match shape.split_first() {
                None => {
                    if let Some(x) = v.first() {
                        out.push_str(&x.to_string());
                    }
                }
                Some((&d, rest)) => {
                    let inner: usize = rest.iter().product();
                    out.push('[');
                    for i in 0..d {
                        if i > 0 {
                            out.push_str(", ");
                        }
                        let lo = (i * inner).min(v.len());
                        let hi = ((i + 1) * inner).min(v.len());
                        rec(out, &v[lo..hi], rest);
                    }
                    out.push(']');
                }
            }
        }
        let mut out = String::new();
        macro_rules! go {
            ($t:ty) => {
                if let Ok(s) = self.as_slice::<$t>() {
                    rec(&mut out, s, &self.shape)
                }
            };
        }
        match self.dtype {
            DType::F16 => go!(crate::tensor::dtype::f16),
            DType::BF16 => go!(crate::tensor::dtype::bf16),
            DType::F32 => go!(f32),
            DType::F64 => go!(f64),
            DType::I8 => go!(i8),
            DType::U8 => go!(u8),
            DType::I32 => go!(i32),
            DType::I64 => go!(i64),
            DType::Bool => go!(bool),
            DType::I16 => go!(i16),
            DType::U16 => go!(u16),
            DType::U32 => go!(u32),
            DType::U64 => go!(u64),
        }
        out
    }

    /// Builds a tensor from storage that is known to be valid (engine-internal).
    pub(crate) fn from_parts(data: Bytes, dtype: DType, shape: Vec<usize>) -> Tensor {
        Tensor {
            shape,
            dtype,
            device: Device::Host,
            data,
            on_device: None,
        }
    }

    /// Wraps device storage as a tensor of `dtype` and `shape` (for the device layer; users
    /// get device tensors from `to_device` in `collectix-actors`). Fails when the sizes do not
    /// match.
    pub fn from_device_storage(
        storage: Arc<dyn DeviceStorage>,
        dtype: DType,
        shape: &[usize],
    ) -> Result<Tensor> {
        let want = numel_of(shape)?
            .checked_mul(dtype.size())
            .ok_or_else(|| Error::invalid("tensor byte size overflows usize"))?;
        if storage.nbytes() != want {
            return Err(Error::invalid(format!(
                "{} bytes of device storage cannot hold a {dtype} tensor of shape {shape:?} ({want} bytes)",
                storage.nbytes()
            )));
        }
        if storage.device().is_host() {
            return Err(Error::invalid(
                "device storage that claims to be on the host",
            ));
        }
        Ok(Tensor {
            shape: shape.to_vec(),
            dtype,
            device: storage.device(),
            data: Bytes::new(),
            on_device: Some(storage),
        })
    }

    /// The device storage of a device tensor (`None` on the host).
    pub fn device_storage(&self) -> Option<&Arc<dyn DeviceStorage>> {
        self.on_device.as_ref()
    }

    /// An error for host-only accessors called on a device tensor.
    fn host_only(&self) -> Result<()> {
        if self.device.is_host() {
            Ok(())
        } else {
            Err(Error::invalid(format!(
                "the tensor is on {}: copy it to the host first (to_host)",
                self.device
            )))
        }
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.device.is_host() {
            write!(
                f,
                "Tensor({} elements on {}, {}, {:?})",
                self.numel(),
                self.device,
                self.dtype,
                self.shape
            )
        } else if self.numel() <= 32 {
            write!(
                f,
                "Tensor({}, {}, {:?})",
                self.format_values(),
                self.dtype,
                self.shape
            )
        } else {
            write!(
                f,
                "Tensor({} elements, {}, {:?})",
                self.numel(),
                self.dtype,
                self.shape
            )
        }
    }
}

impl PartialEq for Tensor {
    /// Same shape, dtype and bytes on the host; on a device, the same storage.
    fn eq(&self, other: &Self) -> bool {
        let same_storage = match (&self.on_device, &other.on_device) {
            (None, None) => self.data == other.data,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        };
        self.shape == other.shape
            && self.dtype == other.dtype
            && self.device == other.device
            && same_storage
    }
}

impl fmt::Display for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.format_values())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wraps_vec_without_copy() {
        let v = vec![1.0f32, 2.0, 3.0];
        let p = v.as_ptr() as usize;
        let t = Tensor::from_vec(v);
        assert_eq!(t.bytes().as_ptr() as usize, p);
        assert_eq!(t.as_slice::<f32>().unwrap_or_default(), &[1.0, 2.0, 3.0]);
        assert!(t.as_slice::<i32>().is_err());
    }

    #[test]
    fn misaligned_bytes_are_copied_and_bool_validated() {
        let raw = Bytes::from(vec![0u8; 9]);
        let t = Tensor::from_bytes(raw.slice(1..9), DType::F64, &[1]);
        assert!(t.is_ok_and(|t| t.as_slice::<f64>().is_ok()));
        let bad = Tensor::from_bytes(Bytes::from(vec![0u8, 2]), DType::Bool, &[2]);
        assert!(matches!(bad, Err(Error::InvalidArgument(_))));
        assert!(Tensor::from_bytes(Bytes::from(vec![0u8; 3]), DType::F32, &[1]).is_err());
    }

    #[test]
    fn formats_like_the_examples() {
        let t = Tensor::from_vec(vec![0.0f32, 0.0, 1.0, 1.0]).reshape(&[2, 2]);
        assert_eq!(
            t.map(|t| t.format_values()).unwrap_or_default(),
            "[[0, 0], [1, 1]]"
        );
        assert_eq!(Tensor::from_vec(vec![1i64, -1]).format_values(), "[1, -1]");
        assert_eq!(Tensor::from_vec(vec![10.5f32]).format_values(), "[10.5]");
    }
}
