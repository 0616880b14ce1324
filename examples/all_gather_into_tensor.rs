//! torch.distributed's all_gather_into_tensor tutorial on 4 in-process ranks: rank r holds
//! `[r, r]`; every rank gets the 4 × 2 concatenation.
//!
//! Prints, for R = 0..3:
//! ```text
//! rank R: all_gather_into_tensor [[0, 0], [1, 1], [2, 2], [3, 3]]
//! ```

mod common;
use collectix::{Communicator, DType, Result, Tensor, TensorSpec};

fn run(c: Communicator) -> Result<Vec<String>> {
    let r = c.rank() as i64;
    let out = c
        .all_gather_into_tensor(
            TensorSpec::new(&[c.size(), 2], DType::I64),
            Tensor::from_vec(vec![r, r]),
        )
        .wait()?;
    Ok(vec![format!(
        "rank {}: all_gather_into_tensor {out}",
        c.rank()
    )])
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
