//! Tensors in shared memory: [`Communicator::alloc_shared`] and [`Communicator::to_shared`].
//!
//! Over shared memory, each process has a heap that the other processes of its host map
//! read-only (`collectix_runtime::tensor::shared_heap`). A tensor whose memory lies there
//! crosses to them with one copy, theirs, straight out of their mapping into its place in
//! their output (`collectix_runtime::landing`), instead of one into a ring and one out of it.
//! An all_gather in place ([`Communicator::all_gather_into_tensor_in_place`]) gathers into
//! such a buffer: each peer's block copied once, out of the peer's heap into the buffer, the
//! rank's own block not at all, and the result (the buffer's memory, in the heap) crosses on
//! with one copy too. (Other calls' outputs are ordinary memory: what a rank forwards from
//! them went no faster out of the heap, where measured.)
//!
//! Where there is no shared heap (ranks of one process, which pass tensors without copies
//! anyway; TCP peers; a heap that is full or could not be made), the same calls give
//! ordinary memory, and every call works the same: nothing depends on the heap but speed.
//! [`SharedBuffer::is_shared`] says which it got.

use crate::comm::{one, Communicator};
use crate::work::Work;
use bytes::Bytes;
use collectix_runtime::collective::Request;
use collectix_runtime::collective::TensorSpec;
use collectix_runtime::tensor::arena::{Arena, ArenaPart};
use collectix_runtime::tensor::buffer::typed_mut;
use collectix_runtime::tensor::shared_heap::HeapBuf;
use collectix_runtime::CallOptions;
use collectix_runtime::{Buffer, DType, Device, Element, Error, Result, Tensor};
use std::ops::Range;
use std::sync::Arc;

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
    /// A heap block that an in-place call gathered into: its memory is that call's result
    /// too, while the result lives.
    Arena(Arc<Arena>),
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
        matches!(self.mem, Mem::Heap(_) | Mem::Arena(_))
    }

    /// Its bytes, to write. After an in-place call
    /// ([`Communicator::all_gather_into_tensor_in_place`]) whose result still lives (or whose
    /// own block a peer may still be reading), the buffer first moves to a block of its own,
    /// its contents copied, so that the result never changes.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        if let Mem::Arena(_) = self.mem {
            self.mem = match self.take_mem() {
                Mem::Arena(a) => unshared(a),
                m => m,
            };
        }
        match &mut self.mem {
            Mem::Heap(b) => b.bytes_mut(),
            Mem::Own(b) => b.bytes_mut(),
            // (Never: unshared just above.)
            Mem::Arena(_) => &mut [],
        }
    }

    /// Its memory, taken out (an empty buffer left in its place).
    fn take_mem(&mut self) -> Mem {
        std::mem::replace(&mut self.mem, Mem::Own(Buffer::from_slice::<u8>(&[])))
    }

    /// The arena an in-place call gathers into, the buffer's memory, and the share of its
    /// block `own` (this rank's input, as the caller left it); `None` where the buffer is
    /// ordinary memory. A buffer gathered into before is used again: its heap block back
    /// whole if nothing holds it any more, else with its ranges no share is left of thawed (a
    /// peer may still read this rank's block of the last call, which is as the caller left
    /// it: writing the buffer would have moved it to a block of its own); where a range other
    /// than `own` is still held or claimed, a block of its own, only `own` copied (the rest
    /// is overwritten).
    fn arena(&mut self, own: Range<usize>) -> Result<Option<(Arc<Arena>, Bytes)>> {
        // A fresh arena has every range free: the second turn ends.
        for _ in 0..2 {
            let a = match self.take_mem() {
                Mem::Heap(b) => Arena::from_heap(b),
                Mem::Arena(a) => match Arc::try_unwrap(a) {
                    Ok(x) => match x.into_heap() {
                        Ok(b) => Arena::from_heap(b),
                        Err(x) => Arc::new(x),
                    },
                    Err(a) => {
                        a.thaw();
                        a
                    }
                },
                m => {
                    self.mem = m;
                    return Ok(None);
                }
            };
            self.mem = Mem::Arena(a.clone());
            let Some(mine) =
                (a.frozen(own.clone())).or_else(|| a.claim(own.clone()).map(ArenaPart::freeze))
            else {
                return Err(Error::internal(
                    "the rank's block of an in-place buffer is being written",
                ));
            };
            if !a.claimed_outside(&own) {
                return Ok(Some((a, mine)));
            }
            // `mine` keeps the rank's block frozen while it is copied.
            self.mem = detached(&a, Some(own.clone()));
        }
        Err(Error::internal(
            "a fresh in-place buffer has claimed ranges",
        ))
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
            Mem::Arena(a) => match unshared(a) {
                Mem::Heap(b) => Tensor::from_bytes(b.freeze(), self.dtype, &self.shape),
                Mem::Own(b) => b
                    .into_tensor()
                    .and_then(|t| Tensor::from_bytes(t.bytes().clone(), self.dtype, &self.shape)),
                Mem::Arena(_) => Err(Error::internal("an unshared buffer is an arena")),
            },
            Mem::Own(b) => b.into_tensor(),
        }
    }
}

/// The arena's memory as a buffer's own: its heap block once nothing else holds it, else a
/// copy ([`detached`]).
fn unshared(a: Arc<Arena>) -> Mem {
    match Arc::try_unwrap(a) {
        Ok(x) => match x.into_heap() {
            Ok(b) => Mem::Heap(b),
            Err(x) => detached(&Arc::new(x), None),
        },
        Err(a) => detached(&a, None),
    }
}

/// A block of its own for a buffer whose arena is still shared: a new heap block (ordinary
/// memory if the heap is full) holding the arena's frozen bytes (all of them after a call
/// that finished; only those within `only` if given), zeros elsewhere (a call that failed
/// midway: unspecified contents).
fn detached(a: &Arc<Arena>, only: Option<Range<usize>>) -> Mem {
    let fill = |dst: &mut [u8]| {
        dst.fill(0);
        for r in a.frozen_ranges() {
            let r = match &only {
                Some(o) => r.start.max(o.start)..r.end.min(o.end),
                None => r,
            };
            if r.is_empty() {
                continue;
            }
            if let (Some(src), Some(d)) = (a.frozen(r.clone()), dst.get_mut(r)) {
                if src.len() == d.len() {
                    d.copy_from_slice(&src);
                }
            }
        }
    };
    match a.heap().and_then(|h| h.alloc(a.len())) {
        Some(mut b) => {
            fill(b.bytes_mut());
            Mem::Heap(b)
        }
        None => {
            // Bytes (8-aligned words): `freeze` gives them the buffer's dtype and shape.
            let mut b = Buffer::from_slice::<u8>(&vec![0; a.len()]);
            fill(b.bytes_mut());
            Mem::Own(b)
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

    /// `all_gather_into_tensor(output, output.chunk(W)[rank])` on a buffer in shared memory,
    /// torch's in-place form (FSDP's gather): `output` holds this rank's input in its block
    /// `rank` (its elements `rank·n..(rank+1)·n`, n its elements / W), and the gathered
    /// tensor comes back. Between processes over shared memory each peer's block is copied
    /// once, out of the peer's heap straight into its place in `output`'s memory, and this
    /// rank's own block is not copied at all: the result *is* `output`'s memory, in the
    /// shared heap, so it crosses on with one copy too. Elsewhere (one process, TCP, a
    /// buffer in ordinary memory, a small call) the result is the same tensor, made as by
    /// [`all_gather_into_tensor`](Self::all_gather_into_tensor).
    ///
    /// `output` stays the caller's, to write the next call's block into and gather again
    /// (FSDP's flat parameter, step after step): writing it
    /// ([`SharedBuffer::bytes_mut`]) while the last result still lives moves it to a block
    /// of its own first, so a result never changes.
    ///
    /// Where it differs from torch: the result is the returned tensor (torch's `output`
    /// holds it); the buffer's blocks other than `rank`'s are unspecified after a call (they
    /// hold the result only where every block landed). The rank's block is the flat range of
    /// elements above, whatever the buffer's shape. It is taken when the call is made, so
    /// writing the buffer before the result is back is safe (it moves to a block of its own
    /// first); torch leaves that a race. Without room in the heap the buffer is ordinary
    /// memory, and the call gathers as the out-of-place form does.
    pub fn all_gather_into_tensor_in_place(&self, output: &mut SharedBuffer) -> Work<Tensor> {
        self.all_gather_into_tensor_in_place_with(output, &CallOptions::default())
    }

    /// [`all_gather_into_tensor_in_place`](Self::all_gather_into_tensor_in_place) with
    /// per-call options.
    pub fn all_gather_into_tensor_in_place_with(
        &self,
        output: &mut SharedBuffer,
        opts: &CallOptions,
    ) -> Work<Tensor> {
        let (w, r, dtype) = (self.size(), self.rank(), output.dtype);
        let spec = TensorSpec::new(&output.shape, dtype);
        let numel = match spec.numel() {
            Ok(n) => n,
            Err(e) => return self.member.refuse(false, e),
        };
        let n = numel / w.max(1);
        if n * w != numel {
            return self.member.refuse(false, Error::invalid(format!(
                "an in-place all_gather_into_tensor needs a buffer of a multiple of {w} elements (the group's size); it holds {numel}"
            )));
        }
        let own = r * n * dtype.size()..(r + 1) * n * dtype.size();
        // The own block stays where the caller wrote it, frozen: it is both the input and
        // its part of the output.
        let landing = match n {
            0 => Ok(None),
            _ => output.arena(own.clone()),
        };
        let input = landing.and_then(|l| match l {
            Some((arena, mine)) => Ok((mine, Some(arena))),
            None => (output.bytes_mut().get(own))
                .map(|b| (Bytes::copy_from_slice(b), None))
                .ok_or_else(|| Error::internal("the rank's block is past the buffer's end")),
        });
        match input.and_then(|(b, into)| Tensor::from_bytes(b, dtype, &[n]).map(|t| (t, into))) {
            Ok((input, into)) => self.call_landing(
                Request::AllGatherIntoTensor {
                    input,
                    output: spec,
                },
                opts,
                into,
                one,
            ),
            Err(e) => self.member.refuse(false, e),
        }
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
