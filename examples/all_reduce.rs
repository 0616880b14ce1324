//! The all_reduce tutorial example on 4 in-process ranks: rank r holds `[r+1, 2(r+1)]`; the sum
//! over the world is `[10, 20]` on every rank. Then the subgroup of ranks 1 and 3 reduces the
//! original inputs with min and max.
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

use collectix::{Communicator, ReduceOp, Result, Tensor, World};

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
    if let Some(g) = c.new_group(&[1, 3]).wait()? {
        let min = g.all_reduce(input(&c), ReduceOp::Min).wait()?;
        let max = g.all_reduce(input(&c), ReduceOp::Max).wait()?;
        lines.push(format!("rank {}: group_min {min}", c.rank()));
        lines.push(format!("rank {}: group_max {max}", c.rank()));
    }
    Ok(lines)
}

fn main() -> Result<()> {
    let world = World::local(4)?;
    let threads: Vec<_> = world
        .communicators()
        .iter()
        .cloned()
        .map(|c| std::thread::spawn(move || run(c)))
        .collect();
    let mut out: Vec<Vec<String>> = Vec::new();
    for t in threads {
        out.push(t.join().map_err(|_| collectix::Error::Shutdown)??);
    }
    // The world sums first, then the group lines, each in rank order.
    for lines in &out {
        println!("{}", lines[0]);
    }
    for lines in &out {
        for l in &lines[1..] {
            println!("{l}");
        }
    }
    world.shutdown();
    Ok(())
}
