//! The all_reduce tutorial example on 4 in-process ranks: rank r holds `[r+1, 2(r+1)]`; the sum
//! over the world is `[10, 20]` on every rank. Then the subgroup of the odd ranks (1 and 3)
//! reduces the original inputs with min and max.
//!
//! The same program runs as processes over TCP: `collectix launch --nproc-per-node 4 --
//! target/debug/examples/all_reduce` (or under any launcher of `docs/deployment.md`); each
//! process then prints its own rank's lines. Any number of processes works: with W of them
//! the sum is `[W(W+1)/2, W(W+1)]` and the subgroup holds the odd ranks below W.
//!
//! Prints, in rank order:
//! ```text
//! rank 0: sum [10, 20]
//! rank 1: sum [10, 20]
//! rank 2: sum [10, 20]
//! rank 3: sum [10, 20]
//! rank 1: group_min [2, 4]
//! rank 1: group_max [4, 8]
//! rank 3: group_min [2, 4]
//! rank 3: group_max [4, 8]
//! ```

mod common;
use collectix::{Communicator, ReduceOp, Result, Tensor};

fn input(c: &Communicator) -> Tensor {
    let r = c.rank() as f32;
    Tensor::from_vec(vec![r + 1.0, 2.0 * (r + 1.0)])
}

/// What one rank does; returns its output lines.
fn run(c: Communicator) -> Result<Vec<String>> {
    let mut lines = Vec::new();
    let sum = c.all_reduce(input(&c), ReduceOp::Sum).wait()?;
    lines.push(format!("rank {}: sum {sum}", c.rank()));
    // new_group is collective: every rank calls it; members get Some.
    let odd: Vec<usize> = (1..c.size()).step_by(2).collect();
    if odd.is_empty() {
        return Ok(lines); // a world of one has no odd rank
    }
    if let Some(g) = c.new_group(&odd).wait()? {
        let min = g.all_reduce(input(&c), ReduceOp::Min).wait()?;
        let max = g.all_reduce(input(&c), ReduceOp::Max).wait()?;
        lines.push(format!("rank {}: group_min {min}", c.rank()));
        lines.push(format!("rank {}: group_max {max}", c.rank()));
    }
    Ok(lines)
}

/// The example's output, in rank order: the world sums, then the group lines.
pub(crate) fn lines() -> Result<Vec<String>> {
    let out = common::per_rank(4, run)?;
    let mut lines: Vec<String> = out.iter().filter_map(|l| l.first().cloned()).collect();
    lines.extend(out.iter().flat_map(|l| l.iter().skip(1).cloned()));
    Ok(lines)
}

#[allow(dead_code)]
fn main() -> common::Main {
    common::Main(body())
}

/// What `main` does.
fn body() -> collectix::Result<()> {
    // Started by `collectix launch --nproc-per-node 4` (or mpirun, srun): this process is one
    // rank and prints its own lines.
    if common::launched() {
        return common::run_launched(run);
    }
    common::print(&lines()?);
    Ok(())
}
