//! What the simulator's failure tests share (`pending.rs`, `revoke.rs`, `failed_calls.rs`): a
//! short call timeout and the options that carry it, a small case of one collective, and a
//! run that must settle.
#![allow(dead_code)]

use collectix_runtime::group::CallOptions;
use collectix_runtime::testing::sim::Sim;
use collectix_runtime::testing::Case;
use collectix_runtime::{DType, OpKind, ReduceOp};
use std::time::Duration;

/// Every call's timeout: a told rank hears far inside it.
pub(crate) const TIMEOUT: Duration = Duration::from_millis(50);
/// The most simulator steps a run may take.
pub(crate) const STEPS: usize = 1_000_000;

/// Call options with [`TIMEOUT`].
pub(crate) fn opts() -> CallOptions {
    CallOptions {
        timeout: Some(TIMEOUT),
        ..Default::default()
    }
}

/// `kind` over `w` ranks, 4 elements of `dtype`, summed, rooted at 0.
pub(crate) fn case(kind: OpKind, w: usize, dtype: DType) -> Case {
    Case {
        kind,
        size: w,
        count: 4,
        dtype,
        op: ReduceOp::Sum,
        root: 0,
        algorithm: None,
    }
}

/// Runs the simulator until nothing is left to do; a panic with the trace if it does not
/// settle.
pub(crate) fn run(sim: &mut Sim) {
    if let Err(e) = sim.run(STEPS) {
        panic!("did not settle: {e:?}\n{}", sim.trace_text());
    }
}
