//! `barrier`, and the agreement step of `new_group` (a barrier whose fingerprint carries the member list's hash): dissemination.

use super::{Finish, Plan, Planner};
use crate::algorithm::dissemination;
use crate::error::Result;
use crate::op::OpKind;
use crate::tensor::dtype::DType;

impl Planner<'_> {
    /// Plans `barrier` (and `new_group`'s agreement step, a barrier whose fingerprint carries the members)`.
    pub(super) fn barrier(&self, new_group: Option<u64>) -> Result<Plan> {
        let (w, me) = (self.w(), self.g.rank);
        let (kind, count) = match new_group {
            Some(members) => (OpKind::NewGroup, members),
            None => (OpKind::Barrier, 0),
        };
        let alg = self.algorithm(kind, 0)?;
        let s = dissemination::barrier(me, w);
        Ok(self.collective(
            kind,
            DType::U8,
            Some(count),
            None,
            None,
            alg,
            s,
            Vec::new(),
            Finish::Nothing,
        ))
    }
}

/// nccl-tests' bus-bandwidth factor for a group of `n` ranks.
pub(super) fn busbw_factor(_n: f64) -> f64 {
    0.0
}
