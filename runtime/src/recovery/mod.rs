//! Going on after a failure: the survivors of a failed group agree on who is alive and on
//! which calls completed everywhere ([`agreement`]), and make a smaller group of themselves
//! (a *shrink*, as MPI ULFM's `MPI_Comm_shrink` and NCCL's `ncclCommShrink`). Revoking a
//! group lives with the other failures in the engine (`Engine::revoke_group`).

pub mod agreement;
pub mod evidence;

pub use agreement::{decision_key, open_key, proposal_key, Agreement, Ask, Decision};
pub use evidence::Evidence;
