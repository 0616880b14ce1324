//! torch.distributed's point-to-point tutorial on 4 in-process ranks: rank 0 sends `[1, -1]`
//! to rank 1 (blocking send and recv); ranks 2 and 3 take no part.
//!
//! Prints:
//! ```text
//! rank 0: sent [1, -1]
//! rank 1: received [1, -1]
//! ```

mod common;
use collectix::{Communicator, DType, Result, Tensor, TensorSpec};

fn run(c: Communicator) -> Result<Vec<String>> {
    match c.rank() {
        0 => {
            let t = Tensor::from_vec(vec![1i64, -1]);
            c.send(t.clone(), 1, 0).wait()?;
            Ok(vec![format!("rank 0: sent {t}")])
        }
        1 => {
            let (t, _src) = c
                .recv(TensorSpec::new(&[2], DType::I64), Some(0), 0)
                .wait()?;
            Ok(vec![format!("rank 1: received {t}")])
        }
        _ => Ok(vec![]),
    }
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
