//! Output assembly: payloads checked against the sizes a receive expects, chunks joined, and
//! the call's result built from its finished chunks.

use super::{CollectiveState, Engine};
use crate::collective::{Assembly, Output};
use crate::data_plane::DataPlane;
use crate::error::{Error, ProtocolError, Result};
use crate::group::GroupId;
use crate::ids::Fingerprint;
use crate::landing::LAND_MIN;
use crate::schedule::Action;
use crate::tensor::arena::Arena;
use crate::tensor::dtype::DType;
use crate::tensor::reduce::{self, ReduceOp};
use crate::tensor::{validate_storage, Tensor};
use bytes::Bytes;
use std::ops::Range;
use std::sync::Arc;

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

/// The chunks of the output a call builds from one run of them (all of them, or the blocks
/// it concatenates); `None` for other outputs.
fn output_chunks(c: &CollectiveState) -> Option<Range<usize>> {
    match &c.assembly {
        Assembly::Whole(_) => Some(0..c.sched.layout.chunk_elems.len()),
        Assembly::Concat(blocks, _) => Some(c.sched.layout.chunks_of(blocks.clone())),
        _ => None,
    }
}

impl Engine {
    /// For a call `c` (group `group`, call `seq`, fingerprint `fp`) whose output is one run of
    /// chunks of at least [`LAND_MIN`] bytes, a buffer of this rank's own for the output, and
    /// a landing in it for every receive that copies chunks into the output (see
    /// [`crate::landing`]); `None` if the plane gives no such buffer or nothing would land.
    /// The buffer is `into` (a caller's, `Plan::landing_in`) where it fits: the output's
    /// length, and one of the call's own chunks its frozen bytes at that chunk's place.
    pub(super) fn expect_landings(
        &self,
        group: GroupId,
        seq: u64,
        fp: Fingerprint,
        c: &CollectiveState,
        into: Option<Arc<Arena>>,
    ) -> Option<(Arc<Arena>, Range<usize>)> {
        let out = output_chunks(c)?;
        let size = fp.dtype.size();
        let elems = c.sched.layout.chunk_elems.get(out.clone())?;
        // Each output chunk's start in the buffer, and the buffer's length last.
        let mut starts = Vec::with_capacity(elems.len() + 1);
        let mut at = 0usize;
        for &e in elems {
            starts.push(at);
            at = at.checked_add(e.checked_mul(size)?)?;
        }
        starts.push(at);
        if at < LAND_MIN {
            return None;
        }
        let into = into.filter(|a| {
            self.plane.lands()
                && a.len() == at
                && c.chunks.get(out.clone()).is_some_and(|chunks| {
                    chunks.iter().zip(&starts).any(|(ch, &start)| {
                        ch.as_ref()
                            .is_some_and(|b| !b.is_empty() && a.holds_at(b, start))
                    })
                })
        });
        let g = self.groups.get(&group)?;
        let landing = |r: &crate::schedule::RecvOp| {
            let copies = matches!(r.action, Action::Copy)
                && r.chunks.start >= out.start
                && r.chunks.end <= out.end
                && !r.chunks.is_empty();
            copies.then(|| {
                r.chunks
                    .clone()
                    .map(|ch| starts[ch - out.start]..starts[ch - out.start + 1])
                    .collect::<Vec<_>>()
            })
        };
        // Every landing first, then the buffer and their registration: nothing is left
        // registered when this gives up midway.
        let mut wanted = Vec::new();
        for r in c.sched.steps.iter().flat_map(|s| &s.recvs) {
            let Some(ranges) = landing(r) else { continue };
            if ranges.iter().any(|x| x.is_empty()) {
                continue;
            }
            wanted.push(((group, seq, *g.info.members.get(r.peer)?, r.tag), ranges));
        }
        if wanted.is_empty() {
            return None;
        }
        let arena = match into {
            Some(a) => a,
            None => self.plane.own_output(at)?,
        };
        for (key, ranges) in wanted {
            self.landings.expect(key, fp, &arena, ranges);
        }
        Some((arena, out))
    }
}

/// The call's output as the buffer its received chunks landed in (see [`crate::landing`]),
/// the chunks not in place (this rank's own, its reductions) copied in; `None` if no chunk
/// landed, or one could not be placed (then the chunks are joined).
fn landed(c: &CollectiveState, dtype: DType) -> Option<Bytes> {
    let (arena, out) = c.landed.as_ref()?;
    let elems = c.sched.layout.chunk_elems.get(out.clone())?;
    let chunks = c.chunks.get(out.clone())?;
    let mut gaps = Vec::new();
    let (mut at, mut any) = (0usize, false);
    for (chunk, &e) in chunks.iter().zip(elems) {
        let b = chunk.as_ref()?;
        let len = e.checked_mul(dtype.size())?;
        if b.len() != len {
            return None;
        }
        if arena.holds_at(b, at) {
            any = true;
        } else if len > 0 {
            gaps.push((b, at..at + len));
        }
        at += len;
    }
    if !any || at != arena.len() {
        return None;
    }
    for (b, range) in gaps {
        let mut part = arena.claim(range)?;
        part.bytes_mut().copy_from_slice(b);
        part.freeze();
    }
    arena.frozen(0..at)
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
        Assembly::Whole(_) => shared(&c, dtype).or_else(|| landed(&c, dtype)),
        Assembly::Concat(..) => landed(&c, dtype),
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
            let b = match whole {
                Some(b) => b,
                None => concat(plane, &c.chunks[layout.chunks_of(blocks)], dtype)?,
            };
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
