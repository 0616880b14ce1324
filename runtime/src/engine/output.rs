//! Output assembly: payloads checked against the sizes a receive expects, chunks joined, and
//! the call's result built from its finished chunks.

use super::CollectiveState;
use crate::collective::{Assembly, Output};
use crate::data_plane::DataPlane;
use crate::error::{Error, ProtocolError, Result};
use crate::tensor::dtype::DType;
use crate::tensor::reduce::{self, ReduceOp};
use crate::tensor::{validate_storage, Tensor};
use bytes::Bytes;

/// Checks a payload against the chunk sizes the receiver expects; aligns and validates it.
pub(super) fn check_payload(
    parts: Vec<Bytes>,
    elems: &[usize],
    dtype: DType,
) -> std::result::Result<Vec<Bytes>, ProtocolError> {
    if parts.len() != elems.len() {
        return Err(ProtocolError::Parts {
            expected: elems.len(),
            got: parts.len(),
        });
    }
    parts
        .into_iter()
        .zip(elems)
        .enumerate()
        .map(|(i, (p, &n))| {
            let want = (n as u64).saturating_mul(dtype.size() as u64);
            if p.len() as u64 != want {
                return Err(ProtocolError::Length {
                    part: i,
                    expected: want,
                    got: p.len() as u64,
                });
            }
            validate_storage(p, dtype).map_err(|()| ProtocolError::InvalidElements { dtype })
        })
        .collect()
}

/// Joins chunks into one aligned buffer (no copy when only one chunk holds data; else the
/// data plane joins them).
fn concat(plane: &dyn DataPlane, chunks: &[Option<Bytes>], dtype: DType) -> Result<Bytes> {
    let missing = || Error::internal("result chunk never filled");
    let mut nonempty = chunks
        .iter()
        .filter(|c| c.as_ref().is_none_or(|b| !b.is_empty()));
    match (nonempty.next(), nonempty.next()) {
        (None, _) => return Ok(Bytes::new()),
        (Some(one), None) => return one.clone().ok_or_else(missing),
        _ => {}
    }
    let parts = chunks
        .iter()
        .map(|c| c.as_ref().ok_or_else(missing))
        .collect::<Result<Vec<_>>>()?;
    plane.join(dtype, &parts)
}

/// The call's output as the arena the ranks of this process share for it (no copy), if
/// every chunk is the arena's frozen bytes at its own offset; else `None`, and the chunks
/// are joined.
fn shared(c: &CollectiveState, dtype: DType) -> Option<Bytes> {
    let (arena, _) = c.arena.as_ref()?;
    let mut at = 0usize;
    for (chunk, &elems) in c.chunks.iter().zip(&c.sched.layout.chunk_elems) {
        let b = chunk.as_ref()?;
        if !b.is_empty() && !arena.holds_at(b, at) {
            return None;
        }
        at = at.checked_add(elems.checked_mul(dtype.size())?)?;
    }
    (at == arena.len() && c.chunks.len() == c.sched.layout.chunk_elems.len())
        .then(|| arena.frozen(0..at))
        .flatten()
}

pub(super) fn build_output(
    plane: &dyn DataPlane,
    mut c: CollectiveState,
    dtype: DType,
    op: Option<ReduceOp>,
    group_size: usize,
) -> Result<Output> {
    if let Some(sink) = c.sink.take() {
        return sink.finish(&c.chunks, dtype, op, group_size);
    }
    let post = |b: Bytes| -> Result<Bytes> {
        match op {
            Some(op) => Ok(reduce::post(dtype, op, &b, group_size)?.unwrap_or(b)),
            None => Ok(b),
        }
    };
    let layout = &c.sched.layout;
    let tensor = |b: Bytes, shape: Vec<usize>| Tensor::from_parts(b, dtype, shape);
    let whole = match c.assembly {
        Assembly::Whole(_) => shared(&c, dtype),
        _ => None,
    };
    Ok(match c.assembly {
        Assembly::Nothing => Output::None,
        Assembly::Return(t) => Output::Tensor(t),
        Assembly::Whole(shape) => {
            let whole = match whole {
                Some(b) => b,
                None => concat(plane, &c.chunks, dtype)?,
            };
            Output::Tensor(tensor(post(whole)?, shape))
        }
        Assembly::Concat(blocks, shape) => {
            let b = concat(plane, &c.chunks[layout.chunks_of(blocks)], dtype)?;
            Output::Tensor(tensor(post(b)?, shape))
        }
        Assembly::Blocks(blocks, shapes) => {
            let mut out = Vec::with_capacity(shapes.len());
            for (b, shape) in blocks.zip(shapes) {
                out.push(tensor(
                    concat(plane, &c.chunks[layout.chunks_of(b..b + 1)], dtype)?,
                    shape,
                ));
            }
            Output::Tensors(out)
        }
    })
}
