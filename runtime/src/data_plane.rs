//! The data-plane seam: where a call's chunks live and how they are combined, apart from the
//! engine's control logic (which chunk goes where, when a step is complete). The engine
//! holds chunks as `Bytes`; a data plane decides what memory backs them and does the work on
//! them: reducing two chunks into a new one, and joining a call's chunks into its output.
//!
//! [`HostPlane`] is today's implementation: reduction results go into recycled, aligned host
//! buffers (`tensor/pool.rs`). A shared-memory transport can supply a plane whose
//! buffers live in a segment shared with its peers (`Bytes::from_owner` over the mapping, so
//! nothing else changes); a device plane would do the same with pinned staging memory.

use crate::error::Result;
use crate::ids::GroupId;
use crate::sync::unmodelled::Mutex;
use crate::tensor::arena::{Arena, ArenaPart};
use crate::tensor::dtype::DType;
use crate::tensor::pool::Pool;
use crate::tensor::reduce::{self, ReduceOp};
use bytes::Bytes;
use std::collections::HashMap;
use std::sync::{Arc, Weak};

/// Where chunks live and how they are combined; one per engine (rank).
pub trait DataPlane: Send {
    /// `a ⊕ b` elementwise under `op`, into a new chunk (`a` and `b` have the same length).
    fn combine(&self, dtype: DType, op: ReduceOp, a: &[u8], b: &[u8]) -> Result<Bytes>;

    /// The chunks of an output (two or more), in order, as one buffer aligned for `dtype`.
    fn join(&self, dtype: DType, parts: &[&Bytes]) -> Result<Bytes>;

    /// `local` folded with every `(x, x_first)` of `others` in order (`acc = x ⊕ acc` when
    /// `x_first`, else `acc ⊕ x`), into `into` when given (a part of the call's shared
    /// output), else into a new chunk. The default combines pair by pair.
    fn fold(
        &self,
        dtype: DType,
        op: ReduceOp,
        local: &[u8],
        others: &[(&[u8], bool)],
        into: Option<ArenaPart>,
    ) -> Result<Bytes> {
        let mut acc: Option<Bytes> = None;
        for (x, x_first) in others {
            let l = acc.as_deref().unwrap_or(local);
            acc = Some(if *x_first {
                self.combine(dtype, op, x, l)?
            } else {
                self.combine(dtype, op, l, x)?
            });
        }
        let acc = acc.unwrap_or_else(|| Bytes::copy_from_slice(local));
        Ok(match into {
            Some(mut part) => {
                part.bytes_mut().copy_from_slice(&acc);
                part.freeze()
            }
            None => acc,
        })
    }

    /// The output buffer the ranks of this process share for call `call` (its group and
    /// sequence number), `len` bytes (see [`crate::tensor::arena`]): the same arena for every
    /// rank of the call that asks while any holds it. `None` (the default) where ranks do not
    /// share an address space.
    fn arena(&self, _call: (GroupId, u64), _len: usize) -> Option<Arc<Arena>> {
        None
    }

    /// An output buffer of `len` bytes for this rank alone, which received chunks land in
    /// (see [`crate::landing`]): where peers are other processes. `None` (the default) where
    /// a message carries its payload without a copy (ranks of one process).
    fn own_output(&self, _len: usize) -> Option<Arc<Arena>> {
        None
    }

    /// Whether received payloads are read by this rank's transports (peers in other
    /// processes), so that they can land in an output buffer (see [`crate::landing`]).
    fn lands(&self) -> bool {
        false
    }
}

/// The arenas of the calls in flight among the ranks of one process (an in-process world),
/// shared by their data planes: the first rank of a call to ask makes its arena, the others
/// find it. Entries are weak, so an arena lives as long as a rank holds it (a call running,
/// an output kept) and no longer; its memory comes from, and returns to, one pool.
pub struct Arenas {
    pool: Pool,
    calls: Mutex<HashMap<(GroupId, u64), Weak<Arena>>>,
}

impl Arenas {
    /// Arenas whose memory is recycled through a pool keeping at most `limit` free bytes.
    pub fn new(limit: usize) -> Arc<Arenas> {
        Arc::new(Arenas {
            pool: Pool::new(limit),
            calls: Mutex::new(HashMap::new()),
        })
    }

    /// The arena of `call`, made if no rank holds one; `None` if the one held has another
    /// length (the ranks disagree on the call, which then fails on its fingerprint).
    pub fn get(&self, call: (GroupId, u64), len: usize) -> Option<Arc<Arena>> {
        let mut calls = self.calls.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(a) = calls.get(&call).and_then(Weak::upgrade) {
            return (a.len() == len).then_some(a);
        }
        if calls.len() >= 64 {
            calls.retain(|_, w| w.strong_count() > 0);
        }
        let a = Arena::new(&self.pool, len);
        calls.insert(call, Arc::downgrade(&a));
        Some(a)
    }
}

/// Host memory: reduction results and joined outputs in buffers recycled through a pool (up
/// to `limit` bytes kept free): a call's output, once the caller drops it, is the next call's
/// (no fresh pages to fault in).
pub struct HostPlane {
    pool: Pool,
    /// The arenas shared with the other ranks of this process, in an in-process world.
    arenas: Option<Arc<Arenas>>,
}

impl HostPlane {
    /// A host plane that keeps at most `limit` bytes of free reduction buffers.
    pub fn new(limit: usize) -> HostPlane {
        HostPlane {
            pool: Pool::new(limit),
            arenas: None,
        }
    }

    /// A host plane of a rank whose peers share its address space: calls whose output can
    /// be shared get one arena for all of them from `arenas`.
    pub fn shared(limit: usize, arenas: Arc<Arenas>) -> HostPlane {
        HostPlane {
            pool: Pool::new(limit),
            arenas: Some(arenas),
        }
    }
}

impl DataPlane for HostPlane {
    fn own_output(&self, len: usize) -> Option<Arc<Arena>> {
        // In the pool, not the shared heap: a received byte is copied once into it either
        // way, and what this rank forwards from it went no faster as one copy out of the heap
        // than as two through a ring, where measured (`docs/performance.md`).
        self.lands().then(|| Arena::new(&self.pool, len))
    }

    fn lands(&self) -> bool {
        self.arenas.is_none()
    }

    fn combine(&self, dtype: DType, op: ReduceOp, a: &[u8], b: &[u8]) -> Result<Bytes> {
        reduce::combine(dtype, op, a, b, &self.pool)
    }

    fn join(&self, _dtype: DType, parts: &[&Bytes]) -> Result<Bytes> {
        let total: usize = parts.iter().map(|p| p.len()).sum();
        let mut out = self.pool.take(total);
        let mut at = 0;
        let dst = out.bytes_mut();
        for p in parts {
            dst[at..at + p.len()].copy_from_slice(p);
            at += p.len();
        }
        Ok(out.freeze())
    }

    fn fold(
        &self,
        dtype: DType,
        op: ReduceOp,
        local: &[u8],
        others: &[(&[u8], bool)],
        into: Option<ArenaPart>,
    ) -> Result<Bytes> {
        match into {
            Some(mut part) => {
                reduce::fold_into(dtype, op, local, others, part.bytes_mut())?;
                Ok(part.freeze())
            }
            None => {
                let mut out = self.pool.take(local.len());
                reduce::fold_into(dtype, op, local, others, out.bytes_mut())?;
                Ok(out.freeze())
            }
        }
    }

    fn arena(&self, call: (GroupId, u64), len: usize) -> Option<Arc<Arena>> {
        self.arenas.as_ref()?.get(call, len)
    }
}
