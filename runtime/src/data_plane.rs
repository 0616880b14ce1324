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
use crate::tensor::dtype::DType;
use crate::tensor::pool::Pool;
use crate::tensor::reduce::{self, ReduceOp};
use bytes::Bytes;

/// Where chunks live and how they are combined; one per engine (rank).
pub trait DataPlane: Send {
    /// `a ⊕ b` elementwise under `op`, into a new chunk (`a` and `b` have the same length).
    fn combine(&self, dtype: DType, op: ReduceOp, a: &[u8], b: &[u8]) -> Result<Bytes>;

    /// The chunks of an output (two or more), in order, as one buffer aligned for `dtype`.
    fn join(&self, dtype: DType, parts: &[&Bytes]) -> Result<Bytes>;
}

/// Host memory: reduction results and joined outputs in buffers recycled through a pool (up
/// to `limit` bytes kept free): a call's output, once the caller drops it, is the next call's
/// (no fresh pages to fault in).
pub struct HostPlane {
    pool: Pool,
}

impl HostPlane {
    /// A host plane that keeps at most `limit` bytes of free reduction buffers.
    pub fn new(limit: usize) -> HostPlane {
        HostPlane {
            pool: Pool::new(limit),
        }
    }
}

impl DataPlane for HostPlane {
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
}
