//! A parameter server on 4 in-process ranks: every rank computes a gradient (rank r:
//! `[r, 2r, 3r]`), rank 0 gathers them, averages, and scatters the average back; every rank
//! then holds the same averaged gradient.
//!
//! Prints:
//! ```text
//! rank 0: gradient [0, 0, 0]
//! rank 1: gradient [1, 2, 3]
//! rank 2: gradient [2, 4, 6]
//! rank 3: gradient [3, 6, 9]
//! rank 0: averaged [1.5, 3, 4.5]
//! rank 1: averaged [1.5, 3, 4.5]
//! rank 2: averaged [1.5, 3, 4.5]
//! rank 3: averaged [1.5, 3, 4.5]
//! ```

mod common;
use collectix::{Communicator, Result, Tensor, TensorSpec};

const SERVER: usize = 0;

fn run(c: Communicator) -> Result<Vec<String>> {
    let r = c.rank() as f32;
    let grad = Tensor::from_vec(vec![r, 2.0 * r, 3.0 * r]);
    let spec = TensorSpec::from(&grad);
    let mut lines = vec![format!("rank {}: gradient {grad}", c.rank())];
    let gathered = c.gather(grad, SERVER).wait()?;
    // Only the server has the gradients; it averages them and sends one copy to each rank.
    let scatter_list = gathered
        .map(|grads| -> Result<Vec<Tensor>> {
            let mut sum = vec![0.0f32; 3];
            for g in &grads {
                for (s, x) in sum.iter_mut().zip(g.as_slice::<f32>()?) {
                    *s += x;
                }
            }
            let avg = Tensor::from_vec(sum.into_iter().map(|s| s / grads.len() as f32).collect());
            Ok(vec![avg; grads.len()])
        })
        .transpose()?;
    let averaged = c.scatter(spec, scatter_list, SERVER).wait()?;
    lines.push(format!("rank {}: averaged {averaged}", c.rank()));
    Ok(lines)
}

/// The example's output: the gradients in rank order, then the averages.
pub(crate) fn lines() -> Result<Vec<String>> {
    let out = common::per_rank(4, run)?;
    let mut lines: Vec<String> = out.iter().filter_map(|l| l.first().cloned()).collect();
    lines.extend(out.iter().filter_map(|l| l.get(1).cloned()));
    Ok(lines)
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
