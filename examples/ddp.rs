//! Data-parallel training, the way torch's `DistributedDataParallel` does it, in plain Rust: a
//! two-layer MLP (8 inputs, 16 tanh units, 1 output) learns a nonlinear function of generated
//! data by SGD on the mean squared error. Every rank holds the same model; each step's global
//! batch of 64 rows is split among the ranks; each rank computes the gradients of its shard's
//! mean loss, and the gradients are averaged over the ranks in **buckets** (64 elements here;
//! DDP's default is 25 MiB): backward produces them last layer first, and a bucket's
//! `all_reduce(Avg)` is started as soon as it is full, while the gradients of earlier layers
//! are still being computed. Then every rank takes the same step. The loss printed is the
//! global batch's, summed over the ranks before the step.
//!
//! Averaging the shards' mean gradients is the full batch's mean gradient, so the loss curve
//! is single-process training's on the same data, up to the order of float additions.
//!
//! ```text
//! cargo run --example ddp                 # 4 in-process ranks; prints rank 0's curve
//! cargo run --example ddp -- --single     # one process, no communication: the reference
//! collectix launch --nproc-per-node 4 -- target/debug/examples/ddp   # 4 processes
//! ```
//! Each prints `step S: loss L` for the 40 steps (under the launcher, every rank prints its
//! own, the same).

mod common;
use collectix::{Communicator, Error, ReduceOp, Result, Tensor, Work, World};
use common::Rng;

/// Inputs per row.
const D: usize = 8;
/// Hidden units.
const H: usize = 16;
/// Rows in the generated data set.
const ROWS: usize = 512;
/// Rows per step, over all ranks.
const BATCH: usize = 64;
/// Training steps.
pub(crate) const STEPS: usize = 40;
/// Learning rate.
const LR: f32 = 0.5;
/// Gradient elements per bucket.
const BUCKET: usize = 64;

/// The data set: rows of `D` inputs and their targets, `t = 0.5 a·x + tanh(x0 x1) + noise`.
fn data() -> (Vec<[f32; D]>, Vec<f32>) {
    let mut rng = Rng(0x5eed_da7a);
    let a: Vec<f32> = (0..D).map(|_| rng.next()).collect();
    let mut xs = Vec::with_capacity(ROWS);
    let mut ts = Vec::with_capacity(ROWS);
    for _ in 0..ROWS {
        let mut x = [0f32; D];
        x.iter_mut().for_each(|v| *v = rng.next());
        let linear: f32 = a.iter().zip(&x).map(|(a, x)| a * x).sum();
        ts.push(0.5 * linear + (x[0] * x[1]).tanh() + 0.01 * rng.next());
        xs.push(x);
    }
    (xs, ts)
}

/// The model: `y = w2 · tanh(W1 x + b1) + b2`.
struct Model {
    w1: Vec<f32>,
    b1: Vec<f32>,
    w2: Vec<f32>,
    b2: f32,
}

impl Model {
    /// The same initial weights everywhere (DDP broadcasts rank 0's; a fixed seed does here).
    fn new() -> Model {
        let mut rng = Rng(0x1417);
        let scale = 1.0 / (D as f32).sqrt();
        Model {
            w1: (0..H * D).map(|_| scale * rng.next()).collect(),
            b1: vec![0.0; H],
            w2: (0..H).map(|_| 0.25 * rng.next()).collect(),
            b2: 0.0,
        }
    }

    /// The hidden activations and the output for one row.
    fn forward(&self, x: &[f32; D]) -> ([f32; H], f32) {
        let mut h = [0f32; H];
        for (j, hj) in h.iter_mut().enumerate() {
            let z: f32 = self.w1[j * D..(j + 1) * D]
                .iter()
                .zip(x)
                .map(|(w, x)| w * x)
                .sum();
            *hj = (z + self.b1[j]).tanh();
        }
        let y = self.w2.iter().zip(&h).map(|(w, h)| w * h).sum::<f32>() + self.b2;
        (h, y)
    }

    /// Backward over `rows` for the loss `scale × Σ ½(y − t)²`: hands the gradients to `emit`
    /// layer by layer, last layer first (`b2`, `w2`, then `b1`, `W1`), as autograd produces
    /// them. Returns `Σ (y − t)²` over the rows.
    fn backward(
        &self,
        rows: &[([f32; D], f32)],
        scale: f32,
        emit: &mut dyn FnMut(&[f32]) -> Result<()>,
    ) -> Result<f32> {
        let mut sse = 0f32;
        let (mut g_b2, mut g_w2) = (0f32, vec![0f32; H]);
        let mut g_b1 = vec![0f32; H];
        let mut g_w1 = vec![0f32; H * D];
        let mut hidden = Vec::with_capacity(rows.len());
        // The output layer's gradients first...
        for (x, t) in rows {
            let (h, y) = self.forward(x);
            let e = y - t;
            sse += e * e;
            g_b2 += scale * e;
            g_w2.iter_mut()
                .zip(&h)
                .for_each(|(g, h)| *g += scale * e * h);
            hidden.push((h, e));
        }
        emit(&[g_b2])?;
        emit(&g_w2)?;
        // ...then the hidden layer's, while the first buckets are on their way.
        for ((x, _), (h, e)) in rows.iter().zip(&hidden) {
            for j in 0..H {
                let dz = scale * e * self.w2[j] * (1.0 - h[j] * h[j]);
                g_b1[j] += dz;
                g_w1[j * D..(j + 1) * D]
                    .iter_mut()
                    .zip(x)
                    .for_each(|(g, x)| *g += dz * x);
            }
        }
        emit(&g_b1)?;
        emit(&g_w1)?;
        Ok(sse)
    }

    /// One SGD step with the gradients in backward order (`b2`, `w2`, `b1`, `W1`).
    fn step(&mut self, g: &[f32]) {
        let (g_b2, rest) = g.split_at(1);
        let (g_w2, rest) = rest.split_at(H);
        let (g_b1, g_w1) = rest.split_at(H);
        self.b2 -= LR * g_b2[0];
        for (p, g) in [
            (&mut self.w2, g_w2),
            (&mut self.b1, g_b1),
            (&mut self.w1, g_w1),
        ] {
            p.iter_mut().zip(g).for_each(|(p, g)| *p -= LR * g);
        }
    }
}

/// Gradient buckets: filled in backward order; each full one is averaged over the group at
/// once (asynchronously); `finish` sends the last and waits for all, in order.
struct Buckets<'a> {
    comm: Option<&'a Communicator>,
    filling: Vec<f32>,
    sent: Vec<Sent>,
}

/// A bucket on its way (or, alone, already averaged).
enum Sent {
    Averaging(Work<Tensor>),
    Alone(Tensor),
}

impl Buckets<'_> {
    fn push(&mut self, grads: &[f32]) -> Result<()> {
        self.filling.extend_from_slice(grads);
        while self.filling.len() >= BUCKET {
            let rest = self.filling.split_off(BUCKET);
            let full = std::mem::replace(&mut self.filling, rest);
            self.send(full);
        }
        Ok(())
    }

    fn send(&mut self, bucket: Vec<f32>) {
        let t = Tensor::from_vec(bucket);
        self.sent.push(match self.comm {
            Some(c) => Sent::Averaging(c.all_reduce(t, ReduceOp::Avg)),
            None => Sent::Alone(t),
        });
    }

    /// The averaged gradients, in backward order.
    fn finish(mut self) -> Result<Vec<f32>> {
        if !self.filling.is_empty() {
            let last = std::mem::take(&mut self.filling);
            self.send(last);
        }
        let mut out = Vec::new();
        for bucket in self.sent {
            let t = match bucket {
                Sent::Averaging(w) => w.wait()?,
                Sent::Alone(t) => t,
            };
            out.extend(t.to_vec::<f32>()?);
        }
        Ok(out)
    }
}

/// Trains; with a communicator, as its rank of a data-parallel group (each rank takes its
/// share of every batch), else alone on whole batches. Returns the loss before each step.
pub(crate) fn train(comm: Option<&Communicator>) -> Result<Vec<f32>> {
    let (r, w) = comm.map_or((0, 1), |c| (c.rank(), c.size()));
    if !BATCH.is_multiple_of(w) {
        return Err(Error::invalid(format!(
            "the batch of {BATCH} rows does not split evenly over {w} ranks"
        )));
    }
    let (xs, ts) = data();
    let mut model = Model::new();
    let mut losses = Vec::with_capacity(STEPS);
    let shard = BATCH / w;
    for step in 0..STEPS {
        // This rank's rows of the step's batch.
        let rows: Vec<([f32; D], f32)> = (r * shard..(r + 1) * shard)
            .map(|i| (step * BATCH + i) % ROWS)
            .map(|i| (xs[i], ts[i]))
            .collect();
        let mut buckets = Buckets {
            comm,
            filling: Vec::with_capacity(BUCKET),
            sent: Vec::new(),
        };
        let sse = model.backward(&rows, 1.0 / shard as f32, &mut |g| buckets.push(g))?;
        let grads = buckets.finish()?;
        let total = match comm {
            Some(c) => c
                .all_reduce(Tensor::from_vec(vec![sse]), ReduceOp::Sum)
                .wait()?
                .to_vec::<f32>()?[0],
            None => sse,
        };
        losses.push(total / BATCH as f32);
        model.step(&grads);
    }
    Ok(losses)
}

/// The curve of `w` in-process ranks (each rank's must be the same; rank 0's is returned).
pub(crate) fn in_process(w: usize) -> Result<Vec<f32>> {
    let world = World::local(w)?;
    let threads: Vec<_> = world
        .communicators()
        .iter()
        .cloned()
        .map(|c| std::thread::spawn(move || train(Some(&c))))
        .collect();
    let mut curves = Vec::new();
    for t in threads {
        curves.push(t.join().map_err(|_| Error::Shutdown)??);
    }
    world.shutdown()?;
    if curves.iter().any(|c| c != &curves[0]) {
        return Err(Error::Internal(
            "the ranks' loss curves differ: their models diverged".into(),
        ));
    }
    Ok(curves.swap_remove(0))
}

fn print(losses: &[f32]) {
    for (s, l) in losses.iter().enumerate() {
        println!("step {s}: loss {l:.6}");
    }
}

#[allow(dead_code)]
fn main() -> common::Main {
    common::Main(body())
}

/// What `main` does.
fn body() -> collectix::Result<()> {
    common::init_tracing();
    if std::env::args().any(|a| a == "--single") {
        print(&train(None)?);
    } else if common::launched() {
        let p = common::join()?;
        print(&train(Some(p.communicator()))?);
        p.shutdown()?;
    } else {
        print(&in_process(4)?);
    }
    Ok(())
}
