//! A call as it runs on the board ([`BoardCall`]): which calls do (the same answer on every
//! member for the same call), what each member publishes, which slots it needs, and its
//! output from the slots.

use super::{BoardError, Slot, INLINE_MAX, SLOT_WORDS};
use crate::collective::{Output, Request};
use crate::error::{Error, Result};
use crate::group::{CallOptions, GroupInfo};
use crate::ids::{DataPath, Fingerprint, FINGERPRINT_BYTES};
use crate::op::OpKind;
use crate::tensor::dtype::DType;
use crate::tensor::reduce::{reference, ReduceOp};
use crate::tensor::Tensor;

/// What a call on the board computes.
#[derive(Clone, Debug)]
enum Body {
    Barrier,
    AllReduce {
        op: ReduceOp,
        shape: Vec<usize>,
    },
    Broadcast {
        root: usize,
        shape: Vec<usize>,
    },
    /// The root reduces every member's slot; the others get their input back.
    Reduce {
        op: ReduceOp,
        root: usize,
        shape: Vec<usize>,
    },
}

/// A call that runs on the board: its fingerprint, this member's payload, and what to make
/// of the slots.
#[derive(Clone, Debug)]
pub struct BoardCall {
    fp: Fingerprint,
    /// `fp` as its bytes: what this member publishes, and what it compares the others'
    /// slots with.
    fp_bytes: [u8; FINGERPRINT_BYTES],
    payload: Vec<u8>,
    body: Body,
}

/// The payload of a call's tensor, if the call is small enough for the board.
fn small(t: &Tensor) -> Option<&[u8]> {
    (t.device().is_host() && t.bytes().len() <= INLINE_MAX).then(|| &t.bytes()[..])
}

impl BoardCall {
    /// The call `req` as it runs on the board of `group`, or `None` if it does not (not one
    /// of the four calls, too large, on a device, or with a forced algorithm): the same
    /// answer on every member for the same call. `Some(Err)` is an argument error (an op the
    /// dtype does not support, a root out of range), refused as the engine would.
    pub fn of(req: &Request, group: &GroupInfo, opts: &CallOptions) -> Option<Result<BoardCall>> {
        if opts.algorithm.is_some() {
            return None;
        }
        let fp = |kind, dtype| Fingerprint {
            path: DataPath::Board,
            ..Fingerprint::new(kind, dtype)
        };
        // A reduction's fingerprint: its count, op and op's scalar, and its root if it has
        // one.
        let reduction = |kind, t: &Tensor, op: &ReduceOp, root: Option<usize>| Fingerprint {
            count: Some(t.numel() as u64),
            root: root.and_then(|r| u32::try_from(r).ok()),
            op: Some(op.kind()),
            scalar: op.scalar_bits(),
            ..fp(kind, t.dtype())
        };
        Some(match req {
            Request::Barrier => Ok(BoardCall::barrier()),
            Request::AllReduce { tensor, op } => {
                let payload = small(tensor)?;
                let dtype = tensor.dtype();
                op.check(dtype).map(|()| {
                    BoardCall::new(
                        reduction(OpKind::AllReduce, tensor, op, None),
                        payload.to_vec(),
                        Body::AllReduce {
                            op: *op,
                            shape: tensor.shape().to_vec(),
                        },
                    )
                })
            }
            Request::Broadcast { tensor, root } => {
                let payload = small(tensor)?;
                if let Err(e) = group.check_rank(*root, "root") {
                    Err(e)
                } else {
                    let mine = group.rank == *root;
                    Ok(BoardCall::new(
                        Fingerprint {
                            count: Some(tensor.numel() as u64),
                            root: u32::try_from(*root).ok(),
                            ..fp(OpKind::Broadcast, tensor.dtype())
                        },
                        if mine { payload.to_vec() } else { Vec::new() },
                        Body::Broadcast {
                            root: *root,
                            shape: tensor.shape().to_vec(),
                        },
                    ))
                }
            }
            Request::Reduce { tensor, root, op } => {
                let payload = small(tensor)?;
                let dtype = tensor.dtype();
                group
                    .check_rank(*root, "root")
                    .and_then(|()| op.check(dtype))
                    .map(|()| {
                        BoardCall::new(
                            reduction(OpKind::Reduce, tensor, op, Some(*root)),
                            payload.to_vec(),
                            Body::Reduce {
                                op: *op,
                                root: *root,
                                shape: tensor.shape().to_vec(),
                            },
                        )
                    })
            }
            _ => return None,
        })
    }

    /// A barrier, as it runs on any group's board (what [`of`](Self::of) makes of
    /// `Request::Barrier` without a forced algorithm).
    pub fn barrier() -> BoardCall {
        BoardCall::new(
            Fingerprint {
                path: DataPath::Board,
                ..Fingerprint::new(OpKind::Barrier, DType::U8)
            },
            Vec::new(),
            Body::Barrier,
        )
    }

    fn new(fp: Fingerprint, payload: Vec<u8>, body: Body) -> BoardCall {
        BoardCall {
            fp_bytes: fp.to_bytes(),
            fp,
            payload,
            body,
        }
    }

    /// The call's fingerprint.
    pub fn fingerprint(&self) -> Fingerprint {
        self.fp
    }

    /// The call's fingerprint as its bytes: what this member publishes.
    pub fn fingerprint_bytes(&self) -> &[u8; FINGERPRINT_BYTES] {
        &self.fp_bytes
    }

    /// What this member publishes.
    pub fn payload(&self) -> &[u8] {
        &self.payload
    }

    /// Whether this member needs member `m`'s slot to finish the call: a broadcast needs
    /// only its root's, and its root nobody's (it finishes at once, as the engine's root
    /// does once its part is sent); a reduce's root needs every member's, and the others
    /// nobody's (they get their input back, as from the engine, once their part is
    /// published); the other calls every member's.
    ///
    /// Needed or not, every slot that is there when the call finishes is compared with the
    /// call ([`Board::look`](super::Board::look)): the slots a call does not need are how a disagreement that
    /// no needed slot shows (two ranks that each name themselves a broadcast's root) is
    /// seen.
    pub fn needs(&self, me: usize, m: usize) -> bool {
        m != me
            && match &self.body {
                Body::Broadcast { root, .. } => m == *root,
                Body::Reduce { root, .. } => me == *root,
                _ => true,
            }
    }

    /// Whether member `me` finishes the call without every other member's slot (a
    /// broadcast, a reduce): it then looks at the slots it does not need after a `SeqCst`
    /// fence that follows its publish ([`Board::look`](super::Board::look)).
    pub fn partial(&self, me: usize, members: usize) -> bool {
        (0..members).any(|m| m != me && !self.needs(me, m))
    }

    /// The call's output, from every member's slot (`slots[me]` and those the call does not
    /// [need](Self::needs) may be `None`). A slot of another call is an [`Error::Mismatch`]
    /// naming both calls (`members` are the group's global ranks).
    pub fn finish(&self, group: &GroupInfo, seq: u64, slots: &[Option<Slot>]) -> Result<Output> {
        let me = group.rank;
        for (m, s) in slots.iter().enumerate() {
            if let Some(s) = s.as_ref().filter(|_| m != me) {
                if s.fp != self.fp_bytes {
                    return Err(self.mismatch(group, seq, m, s));
                }
            }
        }
        let tensor = |bytes: &[u8], shape: &[usize]| {
            Tensor::from_bytes(bytes::Bytes::copy_from_slice(bytes), self.fp.dtype, shape)
        };
        match &self.body {
            Body::Barrier => Ok(Output::None),
            Body::Broadcast { root, shape } => {
                if *root == me {
                    return tensor(&self.payload, shape).map(Output::Tensor);
                }
                let s = slots
                    .get(*root)
                    .copied()
                    .flatten()
                    .ok_or_else(|| Error::internal("broadcast finished without its root"))?;
                check_len(&s, self.payload_len(), group, *root)?;
                tensor(s.payload(), shape).map(Output::Tensor)
            }
            Body::Reduce { root, .. } if *root != me => {
                tensor(&self.payload, self.shape()).map(Output::Tensor)
            }
            Body::AllReduce { op, shape } | Body::Reduce { op, shape, .. } => {
                let mut operands: Vec<&[u8]> = Vec::new();
                let n = self.payload.len();
                for (m, s) in slots.iter().enumerate() {
                    if m != me {
                        let s = s
                            .as_ref()
                            .ok_or_else(|| Error::internal("all_reduce finished early"))?;
                        check_len(s, n, group, m)?;
                    }
                }
                let operand = |m: usize| -> &[u8] {
                    if m == me {
                        &self.payload
                    } else {
                        slots[m].as_ref().map_or(&[][..], |s| s.payload())
                    }
                };
                if matches!(op, ReduceOp::PremulSum(_)) {
                    // Its inputs are scaled first: the reference, which allocates.
                    operands.extend((0..slots.len()).map(operand));
                    let inputs = operands
                        .iter()
                        .map(|b| tensor(b, shape))
                        .collect::<Result<Vec<_>>>()?;
                    return reference(*op, &inputs).map(Output::Tensor);
                }
                // Folded in rank order (every member gets the same bits: the reference's
                // order), in 8-aligned buffers on the stack.
                let mut acc = [0u64; SLOT_WORDS / 2];
                let mut next = [0u64; SLOT_WORDS / 2];
                let mut x = [0u64; SLOT_WORDS / 2];
                {
                    let a: &mut [u8] = bytemuck::cast_slice_mut(&mut acc[..]);
                    a[..n].copy_from_slice(operand(0));
                }
                for m in 1..slots.len() {
                    {
                        let xb: &mut [u8] = bytemuck::cast_slice_mut(&mut x[..]);
                        xb[..n].copy_from_slice(operand(m));
                    }
                    let a: &[u8] = bytemuck::cast_slice(&acc[..]);
                    let xb: &[u8] = bytemuck::cast_slice(&x[..]);
                    let o: &mut [u8] = bytemuck::cast_slice_mut(&mut next[..]);
                    crate::tensor::reduce::fold_into(
                        self.fp.dtype,
                        *op,
                        &a[..n],
                        &[(&xb[..n], false)],
                        &mut o[..n],
                    )?;
                    std::mem::swap(&mut acc, &mut next);
                }
                let a: &mut [u8] = bytemuck::cast_slice_mut(&mut acc[..]);
                crate::tensor::reduce::post_in_place(self.fp.dtype, *op, &mut a[..n], slots.len())?;
                tensor(&a[..n], shape).map(Output::Tensor)
            }
        }
    }

    /// Member `m`'s slot `s` of call `seq` names another call: the mismatch, or a protocol
    /// error if it names none.
    pub fn mismatch(&self, group: &GroupInfo, seq: u64, m: usize, s: &Slot) -> Error {
        let Some(theirs) = s.fingerprint() else {
            return Error::Protocol {
                rank: group.global(m),
                detail: crate::error::ProtocolError::Malformed(
                    BoardError {
                        member: m,
                        what: "fingerprint does not decode",
                    }
                    .to_string(),
                ),
            };
        };
        Error::Mismatch {
            group: group.id,
            seq: Some(seq),
            ours: crate::error::CallDesc {
                rank: group.global(group.rank),
                call: self.fp,
            },
            theirs: crate::error::CallDesc {
                rank: group.global(m),
                call: theirs,
            },
            report: Vec::new(),
        }
    }

    /// The shape of the call's tensor (none for a barrier).
    fn shape(&self) -> &[usize] {
        match &self.body {
            Body::Barrier => &[],
            Body::AllReduce { shape, .. }
            | Body::Broadcast { shape, .. }
            | Body::Reduce { shape, .. } => shape,
        }
    }

    /// The payload every member's slot of this call holds (a broadcast's non-roots publish
    /// none: the root's length follows from the shared fingerprint).
    fn payload_len(&self) -> usize {
        self.fp.count.unwrap_or(0) as usize * self.fp.dtype.size()
    }
}

/// A slot whose length is not the call's, although its fingerprint is: a broken peer.
fn check_len(s: &Slot, want: usize, group: &GroupInfo, m: usize) -> Result<()> {
    if s.payload().len() == want {
        return Ok(());
    }
    Err(Error::Protocol {
        rank: group.global(m),
        detail: crate::error::ProtocolError::Length {
            part: 0,
            expected: want as u64,
            got: s.payload().len() as u64,
        },
    })
}
