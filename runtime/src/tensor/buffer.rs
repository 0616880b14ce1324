//! [`Buffer`]: host memory the caller owns and a call writes its result into (torch's
//! pre-allocated outputs: `all_gather_into_tensor(output, input)`, an in-place
//! `all_reduce(tensor)`).
//!
//! A [`Tensor`] is shared and immutable, so that ranks of one process can pass it to each
//! other without copies; a `Buffer` is the opposite: one owner, mutable, never shared. A call
//! that writes into a buffer takes it by value and hands it back with its result, so the
//! caller cannot read or write it while the call runs (the borrow checker says so), and the
//! engine never lends its memory to a peer: what a rank sends is never memory it will write.
//!
//! Its memory is 8-aligned, so it can be viewed as any element type.

use crate::error::{Error, Result};
use crate::tensor::dtype::{DType, Element};
use crate::tensor::spec::TensorSpec;
use crate::tensor::{numel_of, Tensor};
use std::fmt;
use std::ops::Range;

/// A mutable host buffer with a shape and a dtype, owned by one holder at a time (see the
/// module doc). Cloning copies it.
#[derive(Clone)]
pub struct Buffer {
    /// The storage, in 8-byte words (8-aligned for any dtype); `len` bytes of it are the
    /// buffer's.
    words: Vec<u64>,
    len: usize,
    shape: Vec<usize>,
    dtype: DType,
}

impl Buffer {
    /// A buffer of zeros (false for bool) of `shape` and `dtype`.
    pub fn zeros(shape: &[usize], dtype: DType) -> Result<Buffer> {
        let len = numel_of(shape)?
            .checked_mul(dtype.size())
            .ok_or_else(|| Error::invalid("buffer byte size overflows usize"))?;
        Ok(Buffer {
            words: vec![0u64; len.div_ceil(8)],
            len,
            shape: shape.to_vec(),
            dtype,
        })
    }

    /// A 1-D buffer holding a copy of `v`.
    pub fn from_slice<T: Element>(v: &[T]) -> Buffer {
        let bytes: &[u8] = bytemuck::cast_slice(v);
        let mut b = Buffer {
            words: vec![0u64; bytes.len().div_ceil(8)],
            len: bytes.len(),
            shape: vec![v.len()],
            dtype: T::DTYPE,
        };
        b.bytes_mut().copy_from_slice(bytes);
        b
    }

    /// A buffer holding a copy of a host tensor.
    pub fn from_tensor(t: &Tensor) -> Result<Buffer> {
        if !t.device().is_host() {
            return Err(Error::invalid(format!(
                "a Buffer is host memory; the tensor is on {}",
                t.device()
            )));
        }
        let mut b = Buffer::zeros(t.shape(), t.dtype())?;
        b.bytes_mut().copy_from_slice(t.bytes());
        Ok(b)
    }

    /// A tensor holding a copy of the buffer (the buffer stays the caller's); fails for a
    /// bool buffer holding a byte other than 0 or 1.
    pub fn to_tensor(&self) -> Result<Tensor> {
        Tensor::from_bytes(
            crate::tensor::aligned_copy(self.bytes(), self.dtype),
            self.dtype,
            &self.shape,
        )
    }

    /// The buffer as a tensor, without a copy (it is shared and immutable from then on);
    /// fails for a bool buffer holding a byte other than 0 or 1.
    pub fn into_tensor(self) -> Result<Tensor> {
        let bytes = crate::tensor::bytes_from_vec(self.words).slice(..self.len);
        Tensor::from_bytes(bytes, self.dtype, &self.shape)
    }

    /// The same memory with another shape of the same number of elements.
    pub fn reshape(mut self, shape: &[usize]) -> Result<Buffer> {
        self.shape = crate::tensor::reshaped(&self.shape, self.numel(), shape)?;
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

    /// The number of elements.
    pub fn numel(&self) -> usize {
        self.len / self.dtype.size()
    }

    /// The size in bytes.
    pub fn nbytes(&self) -> usize {
        self.len
    }

    /// Its shape and dtype, as a spec (on the host).
    pub fn spec(&self) -> TensorSpec {
        TensorSpec::new(&self.shape, self.dtype)
    }

    /// The bytes.
    pub fn bytes(&self) -> &[u8] {
        let all: &[u8] = bytemuck::cast_slice(&self.words);
        &all[..self.len]
    }

    /// The bytes, to write. Bool buffers hold only 0 and 1: writing another byte makes
    /// [`as_slice`](Self::as_slice) and calls on the buffer fail.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        let all: &mut [u8] = bytemuck::cast_slice_mut(&mut self.words);
        &mut all[..self.len]
    }

    /// A typed view; fails when `T` is not the buffer's dtype (or a bool buffer holds a byte
    /// other than 0 or 1).
    pub fn as_slice<T: Element>(&self) -> Result<&[T]> {
        self.check_type::<T>()?;
        bytemuck::checked::try_cast_slice(self.bytes())
            .map_err(|e| Error::invalid(format!("buffer is not a valid {} slice: {e}", self.dtype)))
    }

    /// A typed view to write; fails as [`as_slice`](Self::as_slice) does.
    pub fn as_mut_slice<T: Element>(&mut self) -> Result<&mut [T]> {
        let dtype = self.dtype;
        typed_mut(self.bytes_mut(), dtype)
    }

    /// Elements `range` (in elements), as bytes.
    pub fn elems(&self, range: Range<usize>) -> Result<&[u8]> {
        let r = self.byte_range(range)?;
        Ok(&self.bytes()[r])
    }

    /// The bytes of elements `range`, checked against the buffer.
    pub(crate) fn byte_range(&self, range: Range<usize>) -> Result<Range<usize>> {
        let s = self.dtype.size();
        let (start, end) = (range.start.checked_mul(s), range.end.checked_mul(s));
        match (start, end) {
            (Some(a), Some(b)) if a <= b && b <= self.len => Ok(a..b),
            _ => Err(Error::invalid(format!(
                "elements {range:?} are outside a buffer of {} elements",
                self.numel()
            ))),
        }
    }

    /// A copy of the elements as a vector.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        Ok(self.as_slice::<T>()?.to_vec())
    }

    fn check_type<T: Element>(&self) -> Result<()> {
        check_type::<T>(self.dtype)
    }
}

fn check_type<T: Element>(dtype: DType) -> Result<()> {
    if T::DTYPE != dtype {
        return Err(Error::invalid(format!(
            "buffer has dtype {dtype}, not {}",
            T::DTYPE
        )));
    }
    Ok(())
}

/// `bytes` of a buffer of `dtype`, as `T`s to write; fails when `T` is not `dtype` (or a
/// bool buffer holds a byte other than 0 or 1). (The typed view of [`Buffer`] and of
/// other owned buffers, such as a tensor being filled in shared memory.)
pub fn typed_mut<T: Element>(bytes: &mut [u8], dtype: DType) -> Result<&mut [T]> {
    check_type::<T>(dtype)?;
    bytemuck::checked::try_cast_slice_mut(bytes)
        .map_err(|e| Error::invalid(format!("buffer is not a valid {dtype} slice: {e}")))
}

impl PartialEq for Buffer {
    /// The same shape, dtype and bytes.
    fn eq(&self, other: &Self) -> bool {
        self.shape == other.shape && self.dtype == other.dtype && self.bytes() == other.bytes()
    }
}

impl fmt::Debug for Buffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Buffer({} elements, {}, {:?})",
            self.numel(),
            self.dtype,
            self.shape
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_is_typed_aligned_and_its_own() {
        let mut b = Buffer::from_slice(&[1.0f32, 2.0, 3.0]);
        assert_eq!(b.dtype(), DType::F32);
        assert_eq!(b.nbytes(), 12);
        assert!(b.as_slice::<i32>().is_err());
        if let Ok(s) = b.as_mut_slice::<f32>() {
            s[1] = 5.0;
        }
        let t = b.to_tensor().unwrap_or_else(|_| Tensor::empty(DType::F32));
        if let Ok(s) = b.as_mut_slice::<f32>() {
            s[0] = 9.0;
        }
        // The tensor is a copy: writing the buffer does not change it.
        assert_eq!(t.to_vec::<f32>().ok(), Some(vec![1.0, 5.0, 3.0]));
        assert_eq!(b.to_vec::<f32>().ok(), Some(vec![9.0, 5.0, 3.0]));
        assert_eq!((b.bytes().as_ptr() as usize) % 8, 0);
        assert!(b.clone().reshape(&[3, 1]).is_ok() && b.clone().reshape(&[2]).is_err());
        assert!(b.elems(1..3).is_ok_and(|x| x.len() == 8) && b.elems(2..4).is_err());
    }

    #[test]
    fn a_bool_buffer_with_a_bad_byte_is_refused_on_read() {
        let mut b = Buffer::from_slice(&[true, false]);
        assert_eq!(b.as_slice::<bool>().ok(), Some(&[true, false][..]));
        b.bytes_mut()[0] = 7;
        assert!(b.as_slice::<bool>().is_err());
        assert!(b.to_tensor().is_err() && b.clone().into_tensor().is_err());
        assert!(Tensor::from_bytes(b.bytes().to_vec().into(), DType::Bool, &[2]).is_err());
    }
}
