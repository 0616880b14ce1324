//! Data sharding on 4 in-process ranks: the data-loading group is ranks 0, 1 and 2; rank 0
//! generates a dataset of 3 samples × 2 features (`[[0, 1], [2, 3], [4, 5]]`) and scatters one
//! sample to each member; then rank 0 broadcasts a small training config (a serde struct) to
//! the whole world.
//!
//! Prints:
//! ```text
//! rank 0: shard [0, 1]
//! rank 1: shard [2, 3]
//! rank 2: shard [4, 5]
//! rank 0: config epochs=3 lr=0.05
//! rank 1: config epochs=3 lr=0.05
//! rank 2: config epochs=3 lr=0.05
//! rank 3: config epochs=3 lr=0.05
//! ```

mod common;
use collectix::{Communicator, DType, Result, Tensor, TensorSpec};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct Config {
    epochs: u32,
    lr: f64,
}

fn run(c: Communicator) -> Result<Vec<String>> {
    let mut lines = Vec::new();
    if let Some(loaders) = c.new_group(&[0, 1, 2]).wait()? {
        let dataset = (loaders.rank() == 0).then(|| -> Result<Vec<Tensor>> {
            let data = Tensor::from_vec_shape((0..6).map(|x| x as f32).collect(), &[3, 2])?;
            // One row per member (a real loader would slice a file or a tensor here).
            let rows = data
                .as_slice::<f32>()?
                .chunks(2)
                .map(Tensor::from_slice)
                .collect();
            Ok(rows)
        });
        let shard = loaders
            .scatter(TensorSpec::new(&[2], DType::F32), dataset.transpose()?, 0)
            .wait()?;
        lines.push(format!("rank {}: shard {shard}", c.rank()));
    }
    let cfg = (c.rank() == 0).then_some(Config {
        epochs: 3,
        lr: 0.05,
    });
    let cfg = c.broadcast_object(cfg, 0).wait()?;
    lines.push(format!(
        "rank {}: config epochs={} lr={}",
        c.rank(),
        cfg.epochs,
        cfg.lr
    ));
    Ok(lines)
}

/// The example's output: the shards in rank order, then the configs.
pub(crate) fn lines() -> Result<Vec<String>> {
    let out = common::per_rank(4, run)?;
    let mut lines: Vec<String> = out
        .iter()
        .filter(|l| l.len() == 2)
        .map(|l| l[0].clone())
        .collect();
    lines.extend(out.iter().filter_map(|l| l.last().cloned()));
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
