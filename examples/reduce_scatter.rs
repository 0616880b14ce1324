//! torch.distributed's reduce_scatter tutorial on 4 in-process ranks: every rank's input list
//! is `[0, 1, 2, 3]` (one-element tensors); rank r gets the sum of everyone's entry r.
//!
//! Prints:
//! ```text
//! rank 0: reduce_scatter [0]
//! rank 1: reduce_scatter [4]
//! rank 2: reduce_scatter [8]
//! rank 3: reduce_scatter [12]
//! ```

mod common;
use collectix::{Communicator, ReduceOp, Result, Tensor};

fn run(c: Communicator) -> Result<Vec<String>> {
    let inputs: Vec<Tensor> = (0..c.size() as i64)
        .map(|i| Tensor::from_vec(vec![i]))
        .collect();
    let out = c.reduce_scatter(inputs, ReduceOp::Sum).wait()?;
    Ok(vec![format!("rank {}: reduce_scatter {out}", c.rank())])
}

/// The example's output, in rank order.
pub(crate) fn lines() -> Result<Vec<String>> {
    Ok(common::per_rank(4, run)?.concat())
}

#[allow(dead_code)]
fn main() -> common::Main {
    common::Main(body())
}

/// What `main` does.
fn body() -> collectix::Result<()> {
    common::print(&lines()?);
    Ok(())
}
