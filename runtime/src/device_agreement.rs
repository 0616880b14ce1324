//! The agreement step before a call on device tensors (NCCL, or the device-local path of
//! ranks that share a GPU): a small all_gather on the engine of every rank's block — its
//! call's fingerprint, the call's NCCL ordinal in the group, a status, its device and, on the
//! group's first NCCL call, rank 0's NCCL id. Every rank checks the same blocks alike
//! ([`Ours::check`]): a mismatch fails the call on every rank before NCCL is called, and
//! the devices decide the path on every rank alike ([`takes_local_path`]).
//!
//! Sans-IO: the actors crate (`backend/nccl.rs`) makes the NCCL id, runs the all_gather and
//! hands the call to its device worker.

use crate::collective::Output;
use crate::error::{CallDesc, DeviceError, Error, Result};
use crate::group::GroupInfo;
use crate::ids::{Fingerprint, FINGERPRINT_BYTES};

/// Bytes of the fingerprint's part of a block (its wire encoding, zero-padded).
const FP_BYTES: usize = 64;
/// Bytes of a rank's block: the fingerprint, the ordinal, the status, the device, the id.
pub const BLOCK_BYTES: usize = FP_BYTES + 8 + 8 + 8 + 128;

/// One rank's part of the agreement step, as it arrived.
struct Block {
    fp_bytes: Vec<u8>,
    k: u64,
    status: u64,
    device: u64,
    id: [u8; 128],
}

fn parse(block: &[u8]) -> Option<Block> {
    let word = |at: usize| -> Option<u64> {
        Some(u64::from_le_bytes(block.get(at..at + 8)?.try_into().ok()?))
    };
    let fp_bytes = block.get(..FP_BYTES)?.to_vec();
    let id: [u8; 128] = block.get(FP_BYTES + 24..BLOCK_BYTES)?.try_into().ok()?;
    Some(Block {
        fp_bytes,
        k: word(FP_BYTES)?,
        status: word(FP_BYTES + 8)?,
        device: word(FP_BYTES + 16)?,
        id,
    })
}

fn decode_fp(b: &[u8]) -> Option<Fingerprint> {
    let bytes: &[u8; FINGERPRINT_BYTES] = b.get(..FINGERPRINT_BYTES)?.try_into().ok()?;
    Fingerprint::from_bytes(bytes).ok()
}

/// What the agreement step showed: every member's device, and rank 0's NCCL id on the
/// group's first NCCL call.
#[derive(Debug, PartialEq, Eq)]
pub struct Agreed {
    /// Each member's device ordinal, in group-rank order.
    pub devices: Vec<u64>,
    /// Rank 0's NCCL id, on the group's first NCCL call.
    pub init_id: Option<[u8; 128]>,
}

/// This rank's part of a call's agreement step, to check the others' against.
#[derive(Clone, Debug)]
pub struct Ours {
    /// The call.
    pub fp: Fingerprint,
    fp_bytes: [u8; FP_BYTES],
    /// Its sequence number in the group.
    pub seq: u64,
    /// The call's NCCL ordinal in the group.
    pub k: u64,
    /// The group.
    pub info: GroupInfo,
}

impl Ours {
    /// This rank's part of call `seq` (`fp`, the group's NCCL call `k`) of group `info`.
    pub fn new(fp: Fingerprint, seq: u64, k: u64, info: GroupInfo) -> Ours {
        let mut fp_bytes = [0u8; FP_BYTES];
        fp_bytes[..FINGERPRINT_BYTES].copy_from_slice(&fp.to_bytes());
        Ours {
            fp,
            fp_bytes,
            seq,
            k,
            info,
        }
    }

    /// This rank's block: its call, `status` (0: fine; else rank 0 could not make the
    /// group's NCCL id), its `device`, and the NCCL `id` (zeros unless rank 0 made one).
    pub fn block(&self, status: u64, device: u32, id: &[u8; 128]) -> Vec<u8> {
        let mut block = Vec::with_capacity(BLOCK_BYTES);
        block.extend_from_slice(&self.fp_bytes);
        block.extend_from_slice(&self.k.to_le_bytes());
        block.extend_from_slice(&status.to_le_bytes());
        block.extend_from_slice(&u64::from(device).to_le_bytes());
        block.extend_from_slice(id);
        block
    }

    /// Checks the agreement step's output (every rank's block, in group-rank order): the
    /// same call at the same NCCL ordinal everywhere, and rank 0's NCCL id made.
    pub fn check(&self, out: Output) -> Result<Agreed> {
        let all = match out {
            Output::Tensor(t) => t.to_vec::<u8>()?,
            other => return Err(Error::internal(format!("agreement step gave {other:?}"))),
        };
        let members = &self.info.members;
        let mut init_id = None;
        let mut devices = Vec::with_capacity(members.len());
        for (r, block) in all.chunks(BLOCK_BYTES).enumerate() {
            let theirs = parse(block).ok_or_else(|| Error::internal("short agreement block"))?;
            let rank = members.get(r).copied().unwrap_or(r);
            if theirs.fp_bytes != self.fp_bytes || theirs.k != self.k {
                return Err(self.mismatch(rank, &theirs));
            }
            if theirs.status != 0 {
                return Err(DeviceError::Nccl {
                    call: format!("ncclGetUniqueId on rank {rank}"),
                    code: 0,
                    detail: "rank 0 could not make the group's NCCL id".into(),
                }
                .into());
            }
            if r == 0 && self.k == 0 {
                init_id = Some(theirs.id);
            }
            devices.push(theirs.device);
        }
        Ok(Agreed { devices, init_id })
    }

    /// The mismatch between this rank's call and world rank `rank`'s.
    fn mismatch(&self, rank: usize, theirs: &Block) -> Error {
        let me = self.info.rank;
        Error::Mismatch {
            group: self.info.id,
            seq: Some(self.seq),
            ours: CallDesc {
                rank: self.info.members.get(me).copied().unwrap_or(me),
                call: self.fp,
            },
            theirs: CallDesc {
                rank,
                call: decode_fp(&theirs.fp_bytes).unwrap_or(self.fp),
            },
            report: Vec::new(),
        }
    }
}

/// Whether a call of a group whose ranks share a hub takes the device-local path: two or
/// more members, every one on this rank's device (`ordinal`), as the agreement step showed
/// them all. Every rank sees the same devices, so every rank decides alike.
pub fn takes_local_path(size: usize, devices: &[u64], ordinal: u32) -> bool {
    size > 1 && devices.len() == size && devices.iter().all(|&d| d == u64::from(ordinal))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::group::GroupOptions;
    use crate::op::OpKind;
    use crate::tensor::dtype::DType;
    use crate::tensor::Tensor;

    /// The path a hub's group takes: local only with two or more members all on one device;
    /// a group of one keeps NCCL, and so do members on different devices.
    #[test]
    fn the_local_path_needs_two_members_on_one_device() {
        assert!(takes_local_path(2, &[0, 0], 0));
        assert!(takes_local_path(4, &[3, 3, 3, 3], 3));
        assert!(!takes_local_path(1, &[0], 0), "a group of one keeps NCCL");
        assert!(
            !takes_local_path(2, &[0, 1], 0),
            "different devices take NCCL"
        );
        assert!(!takes_local_path(2, &[1, 1], 0), "not this rank's device");
        assert!(
            !takes_local_path(3, &[0, 0], 0),
            "a member missing from the agreement"
        );
    }

    fn ours(rank: usize, count: u64, k: u64) -> Ours {
        let info =
            GroupInfo::world(2, rank, GroupOptions::default()).unwrap_or_else(|e| panic!("{e}"));
        let fp = Fingerprint {
            count: Some(count),
            ..Fingerprint::new(OpKind::AllReduce, DType::F32)
        };
        Ours::new(fp, 3, k, info)
    }

    fn gathered(blocks: &[Vec<u8>]) -> Output {
        Output::Tensor(Tensor::from_vec(blocks.concat()))
    }

    #[test]
    fn the_blocks_agree_give_the_devices_and_rank_0_s_id() {
        let (a, b) = (ours(0, 4, 0), ours(1, 4, 0));
        let id = [7u8; 128];
        let out = gathered(&[a.block(0, 2, &id), b.block(0, 5, &[0; 128])]);
        assert_eq!(
            b.check(out),
            Ok(Agreed {
                devices: vec![2, 5],
                init_id: Some(id)
            })
        );
    }

    #[test]
    fn another_call_another_ordinal_or_no_id_fail_on_every_rank() {
        let id = [0u8; 128];
        let (a, b) = (ours(0, 4, 1), ours(1, 5, 1));
        let out = gathered(&[a.block(0, 0, &id), b.block(0, 0, &id)]);
        assert!(matches!(a.check(out.clone()), Err(Error::Mismatch { .. })));
        assert!(matches!(b.check(out), Err(Error::Mismatch { .. })));
        let (a, b) = (ours(0, 4, 1), ours(1, 4, 2));
        let out = gathered(&[a.block(0, 0, &id), b.block(0, 0, &id)]);
        assert!(matches!(a.check(out), Err(Error::Mismatch { .. })));
        let (a, b) = (ours(0, 4, 0), ours(1, 4, 0));
        let out = gathered(&[a.block(1, 0, &id), b.block(0, 0, &id)]);
        assert!(matches!(b.check(out), Err(Error::Device(_))));
        let short = Output::Tensor(Tensor::from_vec(vec![0u8; 10]));
        assert!(a.check(short).is_err());
    }
}
