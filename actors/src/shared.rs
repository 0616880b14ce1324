//! Tensors in shared memory: [`Communicator::alloc_shared`] and [`Communicator::to_shared`].
//!
//! Over shared memory, each process has a heap that the other processes of its host map
//! read-only (`collectix_runtime::tensor::shared_heap`). A tensor whose memory lies there
//! crosses to them with one copy, theirs, straight out of their mapping into its place in
//! their output (`collectix_runtime::landing`), instead of one into a ring and one out of it.
//! The large outputs of calls between processes are made there too, so what a rank passes
//! on (a broadcast's tree, a call fed the output of the one before) crosses the same way.
//!
//! Where there is no shared heap (ranks of one process, which pass tensors without copies
//! anyway; TCP peers; a heap that is full or could not be made), the same calls give
//! ordinary memory, and every call works the same: nothing depends on the heap but speed.
//! [`SharedBuffer::is_shared`] says which it got.

use crate::comm::Communicator;
use collectix_runtime::collective::TensorSpec;
use collectix_runtime::tensor::buffer::typed_mut;
use collectix_runtime::tensor::shared_heap::HeapBuf;
use collectix_runtime::{Buffer, DType, Device, Element, Error, Result, Tensor};

/// A tensor's memory being written by its one owner, before it is frozen into a [`Tensor`]
/// (see [`Communicator::alloc_shared`]): in this process's shared heap if there was room,
/// else in ordinary memory.
pub struct SharedBuffer {
    mem: Mem,
    shape: Vec<usize>,
    dtype: DType,
}

enum Mem {
    Heap(HeapBuf),
    Own(Buffer),
}

impl std::fmt::Debug for SharedBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedBuffer")
            .field("shape", &self.shape)
            .field("dtype", &self.dtype)
            .field("shared", &self.is_shared())
            .finish()
    }
}

impl SharedBuffer {
    /// Its shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Its element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Whether it lies in this process's shared heap (else in ordinary memory).
    pub fn is_shared(&self) -> bool {
        matches!(self.mem, Mem::Heap(_))
    }

    /// Its bytes, to write.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        match &mut self.mem {
            Mem::Heap(b) => b.bytes_mut(),
            Mem::Own(b) => b.bytes_mut(),
        }
    }

    /// A typed view to write; fails when `T` is not its dtype (or a bool buffer holds a byte
    /// other than 0 or 1).
    pub fn as_mut_slice<T: Element>(&mut self) -> Result<&mut [T]> {
        let dtype = self.dtype;
        typed_mut(self.bytes_mut(), dtype)
    }

    /// The tensor, read-only from now on (no copy).
    pub fn freeze(self) -> Result<Tensor> {
        match self.mem {
            Mem::Heap(b) => Tensor::from_bytes(b.freeze(), self.dtype, &self.shape),
            Mem::Own(b) => b.into_tensor(),
        }
    }
}

impl Communicator {
    /// A buffer of zeros of `shape` and `dtype` in this process's shared heap, to fill and
    /// [`freeze`](SharedBuffer::freeze) into a tensor that crosses to the other processes of
    /// its host with one copy (see the module doc). Without a shared heap, or without room in
    /// it, the buffer is ordinary memory ([`SharedBuffer::is_shared`] says which).
    pub fn alloc_shared(&self, shape: &[usize], dtype: DType) -> Result<SharedBuffer> {
        let len = TensorSpec::new(shape, dtype)
            .numel()?
            .checked_mul(dtype.size())
            .ok_or_else(|| Error::invalid("buffer byte size overflows usize"))?;
        let heap = self.member.rank.driver.shared_heap();
        let mem = match heap.and_then(|h| h.alloc(len)) {
            Some(mut b) => {
                b.bytes_mut().fill(0);
                Mem::Heap(b)
            }
            None => Mem::Own(Buffer::zeros(shape, dtype)?),
        };
        Ok(SharedBuffer {
            mem,
            shape: shape.to_vec(),
            dtype,
        })
    }

    /// Whether `t`'s bytes lie in this process's shared heap (a tensor made by
    /// [`alloc_shared`](Self::alloc_shared) or [`to_shared`](Self::to_shared) where the heap
    /// had room; false for an empty tensor).
    pub fn is_shared(&self, t: &Tensor) -> bool {
        self.member
            .rank
            .driver
            .shared_heap()
            .is_some_and(|h| h.holds(t.bytes()))
    }

    /// `t` copied into this process's shared heap (a host tensor; one copy), or `t` itself
    /// where it cannot be (no heap, no room, an empty tensor): see
    /// [`alloc_shared`](Self::alloc_shared).
    pub fn to_shared(&self, t: &Tensor) -> Result<Tensor> {
        if t.device() != Device::Host {
            return Err(Error::invalid(format!(
                "to_shared takes host tensors; this one is on {}",
                t.device()
            )));
        }
        let heap = self.member.rank.driver.shared_heap();
        let Some(mut b) = heap.and_then(|h| h.alloc(t.nbytes())) else {
            return Ok(t.clone());
        };
        b.bytes_mut().copy_from_slice(t.bytes());
        Tensor::from_bytes(b.freeze(), t.dtype(), t.shape())
    }
}
