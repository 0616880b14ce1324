//! Identifiers and fingerprints: what names a group ([`GroupId`]) and what every rank's call
//! must agree on ([`Fingerprint`]). A leaf of the crate: it imports only the coded enums of
//! `op.rs` ([`OpKind`], [`Algorithm`], [`ReduceKind`]) and [`crate::tensor::dtype`], which
//! import nothing of the protocol, so the error type can describe calls without importing
//! any protocol module.

use crate::op::{Algorithm, CodeError, OpKind, ReduceKind};
use crate::tensor::dtype::DType;
use serde::{Deserialize, Serialize};
use std::fmt;

/// A group's identity: the same value on every member, derived from how the group was made
/// (its parent, the parent's creation counter and the members), never from a global counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct GroupId(pub u64);

impl GroupId {
    /// The group of the whole world.
    pub const WORLD: GroupId = GroupId(0);

    /// A child id: FNV-1a over the parent, a creation index and `words` (stable across
    /// builds and platforms, unlike `std`'s hasher).
    pub fn derive(parent: GroupId, index: u64, words: &[u64]) -> GroupId {
        GroupId(fnv1a(
            std::iter::once(parent.0)
                .chain(std::iter::once(index))
                .chain(words.iter().copied()),
        ))
    }
}

impl GroupId {
    /// The id of lane `name` of group `parent`: the same on every member, from the name
    /// alone (a lane is made without a call). Children take creation indices from 0; lanes
    /// take the last index, and the name's length and bytes as words.
    pub fn lane(parent: GroupId, name: &str) -> GroupId {
        let words = name.as_bytes().chunks(8).map(|c| {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            u64::from_le_bytes(w)
        });
        GroupId(fnv1a(
            [parent.0, u64::MAX, name.len() as u64]
                .into_iter()
                .chain(words),
        ))
    }
}

/// FNV-1a (64-bit) over the little-endian bytes of `words`.
pub fn fnv1a(words: impl IntoIterator<Item = u64>) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for w in words {
        for b in w.to_le_bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

impl fmt::Display for GroupId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if *self == GroupId::WORLD {
            f.write_str("world")
        } else {
            write!(f, "{:016x}", self.0)
        }
    }
}

/// Where a call's data goes: the engine (host memory, or device memory staged through the
/// host, so a group may mix ranks with and without GPUs) or NCCL. Ranks that would take
/// different paths for one call disagree in their fingerprints, so they get a mismatch
/// instead of a hang.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[repr(u8)]
pub enum DataPath {
    /// The engine's schedules over host memory.
    #[default]
    Engine = 0,
    /// NCCL on device memory (its agreement step on the engine carries this path).
    Nccl = 1,
    /// The board of small calls in memory the group's members share ([`crate::board`]).
    Board = 2,
}

crate::op::coded!(DataPath, "data path", [Engine, Nccl, Board]);

/// What every rank's call must agree on; carried by every message of the call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Fingerprint {
    /// The collective.
    pub kind: OpKind,
    /// Element type.
    pub dtype: DType,
    /// Elements; `None` for calls whose ranks legitimately differ in size (all_to_all, an
    /// uneven all_gather), which check every payload's size on arrival instead.
    pub count: Option<u64>,
    /// Group-local root, for calls that have one.
    pub root: Option<u32>,
    /// The reduction, for calls that reduce.
    pub op: Option<ReduceKind>,
    /// The reduce op's scalar bits (PremulSum), 0 for every other op.
    pub scalar: u64,
    /// The algorithm, for calls the engine runs (`None` on NCCL, which picks its own).
    pub algorithm: Option<Algorithm>,
    /// The data path.
    pub path: DataPath,
}

/// Bytes of an encoded [`Fingerprint`].
pub const FINGERPRINT_BYTES: usize = 27;

/// Flags of an encoded fingerprint: which optional fields are present.
const HAS_COUNT: u8 = 1;
const HAS_ROOT: u8 = 2;
const HAS_OP: u8 = 4;
const HAS_ALGORITHM: u8 = 8;

impl Fingerprint {
    /// A fingerprint with only kind and dtype set (count varies, no root, no op, no
    /// algorithm, the engine's path); the other fields are filled in by the caller.
    pub fn new(kind: OpKind, dtype: DType) -> Fingerprint {
        Fingerprint {
            kind,
            dtype,
            count: None,
            root: None,
            op: None,
            scalar: 0,
            algorithm: None,
            path: DataPath::Engine,
        }
    }

    /// The fixed-size encoding: kind, dtype, flags, count (u64), root (u32), op, scalar
    /// (u64), algorithm, path; integers little-endian, absent fields zero.
    pub fn to_bytes(&self) -> [u8; FINGERPRINT_BYTES] {
        let mut b = [0u8; FINGERPRINT_BYTES];
        b[0] = self.kind.code();
        b[1] = self.dtype.code();
        let mut flags = 0;
        if let Some(c) = self.count {
            flags |= HAS_COUNT;
            b[3..11].copy_from_slice(&c.to_le_bytes());
        }
        if let Some(r) = self.root {
            flags |= HAS_ROOT;
            b[11..15].copy_from_slice(&r.to_le_bytes());
        }
        if let Some(o) = self.op {
            flags |= HAS_OP;
            b[15] = o.code();
        }
        b[16..24].copy_from_slice(&self.scalar.to_le_bytes());
        if let Some(a) = self.algorithm {
            flags |= HAS_ALGORITHM;
            b[24] = a.code();
        }
        b[25] = self.path.code();
        b[2] = flags;
        b
    }

    /// Decodes [`to_bytes`](Self::to_bytes), checking every code and flag.
    pub fn from_bytes(b: &[u8; FINGERPRINT_BYTES]) -> Result<Fingerprint, CodeError> {
        let flags = b[2];
        if flags & !(HAS_COUNT | HAS_ROOT | HAS_OP | HAS_ALGORITHM) != 0 {
            return Err(CodeError {
                what: "fingerprint flags",
                code: flags,
            });
        }
        let u64_at = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(w)
        };
        let mut r = [0u8; 4];
        r.copy_from_slice(&b[11..15]);
        Ok(Fingerprint {
            kind: OpKind::try_from(b[0])?,
            dtype: DType::try_from(b[1])?,
            count: (flags & HAS_COUNT != 0).then(|| u64_at(3)),
            root: (flags & HAS_ROOT != 0).then(|| u32::from_le_bytes(r)),
            op: if flags & HAS_OP != 0 {
                Some(ReduceKind::try_from(b[15])?)
            } else {
                None
            },
            scalar: u64_at(16),
            algorithm: if flags & HAS_ALGORITHM != 0 {
                Some(Algorithm::try_from(b[24])?)
            } else {
                None
            },
            path: DataPath::try_from(b[25])?,
        })
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}({}", self.kind, self.dtype)?;
        if self.path == DataPath::Nccl {
            f.write_str(", over nccl")?;
        }
        if let Some(c) = self.count {
            write!(f, ", count {c}")?;
        }
        if let Some(r) = self.root {
            write!(f, ", root {r}")?;
        }
        match self.op {
            Some(ReduceKind::PremulSum) => {
                write!(f, ", premul_sum({})", f64::from_bits(self.scalar))?
            }
            Some(o) => write!(f, ", {}", o.name())?,
            None => {}
        }
        match (self.algorithm, self.path) {
            (Some(a), _) => write!(f, ", {a})"),
            (None, DataPath::Board) => f.write_str(", on the board)"),
            (None, _) => f.write_str(")"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_round_trip_and_bad_codes_are_errors() {
        let mut fp = Fingerprint::new(OpKind::AllReduce, DType::F32);
        assert_eq!(Fingerprint::from_bytes(&fp.to_bytes()), Ok(fp));
        fp.count = Some(u64::MAX);
        fp.root = Some(3);
        fp.op = Some(ReduceKind::PremulSum);
        fp.scalar = 0.5f64.to_bits();
        fp.algorithm = Some(Algorithm::Ring);
        fp.path = DataPath::Nccl;
        let b = fp.to_bytes();
        assert_eq!(Fingerprint::from_bytes(&b), Ok(fp));
        assert_eq!(
            fp.to_string(),
            "all_reduce(float32, over nccl, count 18446744073709551615, root 3, premul_sum(0.5), ring)"
        );
        for (i, bad) in [(0, 0u8), (1, 200), (2, 16), (25, 3)] {
            let mut c = b;
            c[i] = bad;
            assert!(Fingerprint::from_bytes(&c).is_err(), "byte {i} = {bad}");
        }
    }
}
