//! `send` and `recv`: point-to-point calls, matched by (source, tag) outside the group's call sequence (see `engine/p2p.rs`).

use super::{p2p_fp, Body, Plan, Planner, TensorSpec};
use crate::error::{Error, Result};
use crate::op::OpKind;
use crate::tensor::Tensor;

impl Planner<'_> {
    /// Plans `send`.
    pub(super) fn send(&self, tensor: Tensor, dst: usize, tag: u32) -> Result<Plan> {
        let (w, me) = (self.w(), self.g.rank);
        self.g.check_rank(dst, "destination")?;
        if dst == me {
            return Err(Error::invalid("a rank cannot send to itself"));
        }
        let fp = p2p_fp(OpKind::Send, tensor.dtype(), tensor.numel() as u64);
        let body = Body::Send {
            dst,
            tag,
            count: tensor.numel() as u64,
            data: tensor.into_bytes(),
        };
        Ok(Plan {
            fp,
            reduce: None,
            body,
            timeout: self.timeout(),
            group_size: w,
        })
    }

    /// Plans `recv`.
    pub(super) fn recv(&self, spec: TensorSpec, src: Option<usize>, tag: u32) -> Result<Plan> {
        let (w, me) = (self.w(), self.g.rank);
        match src {
            Some(s) => {
                self.g.check_rank(s, "source")?;
                if s == me {
                    return Err(Error::invalid("a rank cannot receive from itself"));
                }
            }
            // Nobody could ever send it anything: refused now, not at its timeout.
            None if w < 2 => {
                return Err(Error::invalid(
                    "a receive from any source in a group of one: no other member can send",
                ))
            }
            None => {}
        }
        let fp = p2p_fp(OpKind::Recv, spec.dtype, spec.numel()? as u64);
        Ok(Plan {
            fp,
            reduce: None,
            body: Body::Recv { src, tag, spec },
            timeout: self.timeout(),
            group_size: w,
        })
    }
}

/// nccl-tests' bus-bandwidth factor for a group of `n` ranks.
pub(super) fn busbw_factor(_n: f64) -> f64 {
    1.0
}
