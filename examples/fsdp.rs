//! Fully sharded data parallelism, as torch's FSDP2 (and ZeRO-3) does it, in plain Rust: an
//! MLP of 8 layers (tanh, `--width` units each) learns a nonlinear map by SGD with momentum,
//! and **no rank holds the whole model**. Each layer's parameters are one flat buffer, cut
//! into W equal shards; rank r keeps shard r (and its momentum) only. For each step:
//!
//! - **forward**: before layer l runs, its flat parameter is gathered in place
//!   (`buffers().all_gather_into_tensor_in_place`: this rank's shard is its slice of the
//!   flat buffer), and **the gather of layer l + 1 is already on its way** (prefetch) while
//!   layer l computes; a layer's gathered parameters are dropped once it ran;
//! - **backward**: layers are gathered again, last first (prefetching the one before), each
//!   layer's local gradient is computed, and its `reduce_scatter_tensor(Avg)` into this rank's
//!   gradient shard starts at once, running while the layers before it compute;
//! - **the optimizer** updates this rank's shards only.
//!
//! With `--replicas R` it is HSDP: the W ranks form R replicas of W/R shards
//! (`Communicator::mesh_2d`); gradients are reduce-scattered within a replica, then the shard
//! is all-reduced (Avg) across the replicas. `--single` trains the same model in one process,
//! without communication, as the reference; it takes `--ranks` and `--replicas` to add up the
//! gradients in the order the collectives do (the direct algorithms, forced here: each rank
//! reduces its block starting from its own value, then the others' in rank order), so that in
//! f32 the losses are **equal bit for bit**, not close.
//!
//! ```text
//! cargo run --example fsdp                          # 4 in-process ranks
//! cargo run --example fsdp -- --replicas 2          # HSDP: 2 replicas × 2 shards
//! cargo run --example fsdp -- --single --ranks 4    # the reference
//! collectix launch --nproc-per-node 4 -- target/debug/examples/fsdp
//! cargo run --release --example fsdp -- --overlap --width 256   # step time, with and without prefetch
//! ```
//! Each rank prints `rank R: step S loss L` for every step, `rank R: final loss L`, and
//! `rank R: param bytes held peak P of T`: its shards (T/W) and the gathered layers it held at
//! once (two with prefetch, one without), never the whole model.

mod common;
use collectix::runtime::schedule::partition;
use collectix::{
    Algorithm, Buffer, BufferWork, CallOptions, Communicator, DType, Error, ReduceOp, Result,
    Tensor,
};
use common::Rng;
use std::time::Instant;

/// Layers.
pub(crate) const LAYERS: usize = 8;
/// Rows per step, over all ranks.
const BATCH: usize = 32;
/// Rows in the generated data set.
const ROWS: usize = 256;
/// Learning rate and momentum.
const LR: f32 = 0.05;
const MOMENTUM: f32 = 0.9;

/// What to train, and how.
#[derive(Clone, Debug)]
pub(crate) struct Config {
    /// Ranks (in one process, or what `--single` adds up as).
    pub(crate) ranks: usize,
    /// Replicas (HSDP); 1 is plain FSDP.
    pub(crate) replicas: usize,
    /// Training steps.
    pub(crate) steps: usize,
    /// Units per layer.
    pub(crate) width: usize,
    /// Gather the next layer while this one computes.
    pub(crate) prefetch: bool,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            ranks: 4,
            replicas: 1,
            steps: 20,
            width: 16,
            prefetch: true,
        }
    }
}

impl Config {
    fn shards(&self) -> usize {
        self.ranks / self.replicas.max(1)
    }

    /// Elements of one layer's flat parameter: its weights (out × in) and biases.
    fn params(&self) -> usize {
        self.width * self.width + self.width
    }

    /// [`params`](Self::params) padded to a multiple of the shards.
    fn padded(&self) -> usize {
        self.params().div_ceil(self.shards()) * self.shards()
    }

    fn check(&self) -> Result<()> {
        if self.replicas == 0 || !self.ranks.is_multiple_of(self.replicas) {
            return Err(Error::invalid(format!(
                "{} ranks do not make {} replicas",
                self.ranks, self.replicas
            )));
        }
        if !BATCH.is_multiple_of(self.ranks) {
            return Err(Error::invalid(format!(
                "the batch of {BATCH} rows does not split evenly over {} ranks",
                self.ranks
            )));
        }
        Ok(())
    }
}

/// The data set: rows of `width` inputs and their targets `t = 0.8 tanh(A x)`.
fn data(width: usize) -> (Vec<Vec<f32>>, Vec<Vec<f32>>) {
    let mut rng = Rng(0xf5d9_da7a);
    let a: Vec<f32> = (0..width * width).map(|_| rng.next()).collect();
    let xs: Vec<Vec<f32>> = (0..ROWS)
        .map(|_| (0..width).map(|_| rng.next()).collect())
        .collect();
    let ts = xs
        .iter()
        .map(|x| {
            (0..width)
                .map(|j| {
                    let z: f32 = a[j * width..(j + 1) * width]
                        .iter()
                        .zip(x)
                        .map(|(a, x)| a * x)
                        .sum();
                    0.8 * (z / (width as f32).sqrt()).tanh()
                })
                .collect()
        })
        .collect();
    (xs, ts)
}

/// Layer `l`'s initial flat parameter, padded with zeros to `cfg.padded()`.
fn initial(cfg: &Config, l: usize) -> Vec<f32> {
    let mut rng = Rng(0x1417 + l as u64);
    let scale = 1.5 / (cfg.width as f32).sqrt();
    let mut p: Vec<f32> = (0..cfg.width * cfg.width)
        .map(|_| scale * rng.next())
        .collect();
    p.resize(cfg.padded(), 0.0);
    p
}

/// One layer forward over `rows` inputs: `tanh(W x + b)` for each.
fn forward(width: usize, p: &[f32], xs: &[Vec<f32>]) -> Vec<Vec<f32>> {
    let (w, b) = p.split_at(width * width);
    xs.iter()
        .map(|x| {
            (0..width)
                .map(|j| {
                    let z: f32 = w[j * width..(j + 1) * width]
                        .iter()
                        .zip(x)
                        .map(|(w, x)| w * x)
                        .sum();
                    (z + b[j]).tanh()
                })
                .collect()
        })
        .collect()
}

/// One layer backward: from the gradient `dys` at its outputs `ys` (inputs `xs`), its flat
/// gradient (padded to `padded`) and the gradient at its inputs.
fn backward(
    width: usize,
    padded: usize,
    p: &[f32],
    xs: &[Vec<f32>],
    ys: &[Vec<f32>],
    dys: &[Vec<f32>],
) -> (Vec<f32>, Vec<Vec<f32>>) {
    let w = &p[..width * width];
    let mut g = vec![0f32; padded];
    let mut dxs = Vec::with_capacity(xs.len());
    for ((x, y), dy) in xs.iter().zip(ys).zip(dys) {
        let mut dx = vec![0f32; width];
        for j in 0..width {
            let dz = dy[j] * (1.0 - y[j] * y[j]);
            g[width * width + j] += dz;
            for k in 0..width {
                g[j * width + k] += dz * x[k];
                dx[k] += w[j * width + k] * dz;
            }
        }
        dxs.push(dx);
    }
    (g, dxs)
}

/// The loss `Σ ½|y − t|²` over the rows and its gradient for their mean loss.
fn loss(ys: &[Vec<f32>], ts: &[&Vec<f32>]) -> (f32, Vec<Vec<f32>>) {
    let scale = 1.0 / ys.len() as f32;
    let mut sum = 0f32;
    let grads = ys
        .iter()
        .zip(ts)
        .map(|(y, t)| {
            y.iter()
                .zip(t.iter())
                .map(|(y, t)| {
                    let e = y - t;
                    sum += 0.5 * e * e;
                    scale * e
                })
                .collect()
        })
        .collect();
    (sum, grads)
}

/// SGD with momentum on one flat parameter (or shard of one).
fn sgd(p: &mut [f32], m: &mut [f32], g: &[f32]) {
    for ((p, m), g) in p.iter_mut().zip(m.iter_mut()).zip(g) {
        *m = MOMENTUM * *m + g;
        *p -= LR * *m;
    }
}

/// World rank `g`'s rows of step `step`'s batch.
fn rows<'a>(
    cfg: &Config,
    xs: &'a [Vec<f32>],
    ts: &'a [Vec<f32>],
    step: usize,
    g: usize,
) -> (Vec<Vec<f32>>, Vec<&'a Vec<f32>>) {
    let per = BATCH / cfg.ranks;
    let idx: Vec<usize> = (g * per..(g + 1) * per)
        .map(|i| (step * BATCH + i) % ROWS)
        .collect();
    (
        idx.iter().map(|&i| xs[i].clone()).collect(),
        idx.iter().map(|&i| &ts[i]).collect(),
    )
}

/// The direct algorithms' sum of `parts` over `blocks`: block b starts from `parts[b]` and
/// adds the others in rank order, then everything is divided by the number of parts (`Avg`).
fn direct_avg(parts: &[&[f32]], blocks: &[usize]) -> Vec<f32> {
    let n = parts.len();
    let mut out = Vec::new();
    let mut at = 0;
    for (b, &len) in blocks.iter().enumerate() {
        for i in at..at + len {
            let mut acc = parts[b][i];
            for (p, part) in parts.iter().enumerate() {
                if p != b {
                    acc += part[i];
                }
            }
            out.push(acc / n as f32);
        }
        at += len;
    }
    out
}

/// Training in one process without communication, adding up the ranks' gradients as the
/// collectives do. Returns the loss before each step.
pub(crate) fn single(cfg: &Config) -> Result<Vec<f32>> {
    cfg.check()?;
    let (xs, ts) = data(cfg.width);
    let (s_n, r_n, padded) = (cfg.shards(), cfg.replicas, cfg.padded());
    let n = padded / s_n;
    let mut params: Vec<Vec<f32>> = (0..LAYERS).map(|l| initial(cfg, l)).collect();
    let mut momentum = vec![vec![0f32; padded]; LAYERS];
    let mut losses = Vec::with_capacity(cfg.steps);
    for step in 0..cfg.steps {
        let mut grads = Vec::with_capacity(cfg.ranks); // [rank][layer]
        let mut total = 0f32;
        for g in 0..cfg.ranks {
            let (x, t) = rows(cfg, &xs, &ts, step, g);
            let mut acts = vec![x];
            for p in &params {
                let y = forward(cfg.width, p, acts.last().map_or(&[][..], |a| a));
                acts.push(y);
            }
            let (sse, mut dy) = loss(acts.last().map_or(&[][..], |a| a), &t);
            total += sse;
            let mut gl = vec![Vec::new(); LAYERS];
            for l in (0..LAYERS).rev() {
                let (gp, dx) = backward(cfg.width, padded, &params[l], &acts[l], &acts[l + 1], &dy);
                gl[l] = gp;
                dy = dx;
            }
            grads.push(gl);
        }
        losses.push(total / BATCH as f32);
        for l in 0..LAYERS {
            let mut g_full = Vec::with_capacity(padded);
            for s in 0..s_n {
                // Each replica's reduce_scatter: shard s is reduced on the row's rank s,
                // starting from its own gradient, then the others' in rank order.
                let rows_avg: Vec<Vec<f32>> = (0..r_n)
                    .map(|q| {
                        let part = |k: usize| &grads[q * s_n + k][l][s * n..(s + 1) * n];
                        let mut owner_first = vec![part(s)];
                        owner_first.extend((0..s_n).filter(|&k| k != s).map(part));
                        direct_avg(&owner_first, &[n])
                    })
                    .collect();
                let shard = if r_n == 1 {
                    rows_avg.into_iter().next().unwrap_or_default()
                } else {
                    // The replicas' all_reduce of the shard: block q owned by replica q.
                    let parts: Vec<&[f32]> = rows_avg.iter().map(Vec::as_slice).collect();
                    direct_avg(&parts, &partition(n, r_n))
                };
                g_full.extend(shard);
            }
            sgd(&mut params[l], &mut momentum[l], &g_full);
        }
    }
    Ok(losses)
}

/// What one rank of the sharded job reports.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Report {
    /// The loss before each step (the same on every rank).
    pub(crate) losses: Vec<f32>,
    /// The most parameter bytes it held at once (its shards and the gathered layers).
    pub(crate) peak_bytes: usize,
    /// The model's parameter bytes.
    pub(crate) total_bytes: usize,
    /// Mean wall time of a step after the first, in milliseconds.
    pub(crate) step_ms: f64,
}

/// One rank's parameters: its shards, their momentum, and the flat buffers that layers are
/// gathered into (made when first needed, reused after; their count is what it holds).
struct Sharded<'a> {
    cfg: &'a Config,
    shard: &'a Communicator,
    shards: Vec<Vec<f32>>,
    momentum: Vec<Vec<f32>>,
    free: Vec<Buffer>,
    made: usize,
}

impl Sharded<'_> {
    fn held(&self) -> usize {
        let n = self.cfg.padded() / self.cfg.shards();
        (LAYERS * n + self.made * self.cfg.padded()) * 4
    }

    /// Starts gathering layer `l` into a flat buffer (this rank's shard written into its
    /// slice first).
    fn gather(&mut self, l: usize) -> Result<BufferWork<Buffer>> {
        let mut flat = match self.free.pop() {
            Some(b) => b,
            None => {
                self.made += 1;
                Buffer::zeros(&[self.cfg.padded()], DType::F32)?
            }
        };
        let n = self.shards[l].len();
        let at = self.shard.rank() * n;
        flat.as_mut_slice::<f32>()?[at..at + n].copy_from_slice(&self.shards[l]);
        Ok(self.shard.buffers().all_gather_into_tensor_in_place(flat))
    }
}

/// This rank's part of sharded training over `world` (its communicator of the whole job).
pub(crate) fn train(cfg: &Config, world: &Communicator) -> Result<Report> {
    let cfg = &Config {
        ranks: world.size(),
        ..cfg.clone()
    };
    cfg.check()?;
    let mesh = world.mesh_2d(cfg.replicas, cfg.shards()).wait()?;
    let (s, padded) = (mesh.shard.rank(), cfg.padded());
    let n = padded / cfg.shards();
    // The direct algorithms, whose order of additions `single` repeats.
    let direct = CallOptions {
        algorithm: Some(Algorithm::Direct),
        timeout: None,
    };
    let (xs, ts) = data(cfg.width);
    let mut me = Sharded {
        cfg,
        shard: &mesh.shard,
        shards: (0..LAYERS)
            .map(|l| initial(cfg, l)[s * n..(s + 1) * n].to_vec())
            .collect(),
        momentum: vec![vec![0f32; n]; LAYERS],
        free: Vec::new(),
        made: 0,
    };
    let mut grad_shards: Vec<Option<Buffer>> = (0..LAYERS)
        .map(|_| Buffer::zeros(&[n], DType::F32).map(Some))
        .collect::<Result<_>>()?;
    let mut peak = me.held();
    let mut losses = Vec::with_capacity(cfg.steps);
    let mut times = Vec::new();
    let err = |f: collectix::Failed| f.error;
    for step in 0..cfg.steps {
        let t0 = Instant::now();
        let (x, t) = rows(cfg, &xs, &ts, step, world.rank());
        // Forward: gather layer l + 1 while layer l computes.
        let mut acts = vec![x];
        let mut next = Some(me.gather(0)?);
        for l in 0..LAYERS {
            let flat = next
                .take()
                .ok_or_else(|| Error::internal("no gather"))?
                .wait()
                .map_err(err)?;
            if cfg.prefetch && l + 1 < LAYERS {
                next = Some(me.gather(l + 1)?);
            }
            peak = peak.max(me.held());
            let y = forward(
                cfg.width,
                flat.as_slice::<f32>()?,
                acts.last().map_or(&[][..], |a| a),
            );
            acts.push(y);
            me.free.push(flat); // resharded: the gathered layer is dropped
            if !cfg.prefetch && l + 1 < LAYERS {
                next = Some(me.gather(l + 1)?);
            }
        }
        let (sse, mut dy) = loss(acts.last().map_or(&[][..], |a| a), &t);
        // Backward: gather again, last layer first; each layer's gradient is reduce-scattered
        // at once, while the layers before it compute.
        let mut scattering = Vec::with_capacity(LAYERS);
        let mut next = Some(me.gather(LAYERS - 1)?);
        for l in (0..LAYERS).rev() {
            let flat = next
                .take()
                .ok_or_else(|| Error::internal("no gather"))?
                .wait()
                .map_err(err)?;
            if cfg.prefetch && l > 0 {
                next = Some(me.gather(l - 1)?);
            }
            peak = peak.max(me.held());
            let (g, dx) = backward(
                cfg.width,
                padded,
                flat.as_slice::<f32>()?,
                &acts[l],
                &acts[l + 1],
                &dy,
            );
            dy = dx;
            me.free.push(flat);
            let out = grad_shards[l]
                .take()
                .ok_or_else(|| Error::internal("no gradient shard"))?;
            let rs = mesh
                .shard
                .buffers()
                .with_options(&direct)
                .reduce_scatter_tensor(out, Tensor::from_vec(g), ReduceOp::Avg);
            scattering.push((l, rs));
            if !cfg.prefetch && l > 0 {
                next = Some(me.gather(l - 1)?);
            }
        }
        // Across the replicas (HSDP): the averaged shard, averaged again.
        let mut averaging = Vec::with_capacity(LAYERS);
        for (l, rs) in scattering {
            let g = rs.wait().map_err(err)?;
            averaging.push((
                l,
                if cfg.replicas > 1 {
                    Some(
                        mesh.replicate
                            .buffers()
                            .with_options(&direct)
                            .all_reduce(g, ReduceOp::Avg),
                    )
                } else {
                    grad_shards[l] = Some(g);
                    None
                },
            ));
        }
        for (l, w) in averaging {
            if let Some(w) = w {
                grad_shards[l] = Some(w.wait().map_err(err)?);
            }
        }
        for (l, g) in grad_shards.iter().enumerate() {
            let g = g.as_ref().ok_or_else(|| Error::internal("no gradient"))?;
            sgd(&mut me.shards[l], &mut me.momentum[l], g.as_slice::<f32>()?);
        }
        // The step's loss: every rank's, added in rank order (as `single` does).
        let all = world.all_gather_into_tensor(
            collectix::TensorSpec::new(&[world.size()], DType::F32),
            Tensor::from_vec(vec![sse]),
        );
        let total = all.wait()?.to_vec::<f32>()?.iter().fold(0f32, |a, x| a + x);
        losses.push(total / BATCH as f32);
        if step > 0 {
            times.push(t0.elapsed().as_secs_f64() * 1e3);
        }
    }
    let step_ms = times.iter().sum::<f64>() / times.len().max(1) as f64;
    Ok(Report {
        losses,
        peak_bytes: peak,
        total_bytes: LAYERS * cfg.params() * 4,
        step_ms,
    })
}

/// The lines rank `r` prints for its report.
pub(crate) fn lines(r: usize, rep: &Report) -> Vec<String> {
    let mut out: Vec<String> = rep
        .losses
        .iter()
        .enumerate()
        .map(|(s, l)| format!("rank {r}: step {s} loss {l}"))
        .collect();
    if let Some(l) = rep.losses.last() {
        out.push(format!("rank {r}: final loss {l}"));
    }
    out.push(format!(
        "rank {r}: param bytes held peak {} of {}",
        rep.peak_bytes, rep.total_bytes
    ));
    out
}

/// Every rank's report, of `cfg.ranks` in-process ranks, in rank order.
pub(crate) fn in_process(cfg: &Config) -> Result<Vec<Report>> {
    let cfg = cfg.clone();
    common::per_rank(cfg.ranks, move |c| train(&cfg, &c))
}

fn parse() -> Result<(Config, bool, bool)> {
    let mut cfg = Config::default();
    let (mut single_, mut overlap) = (false, false);
    let mut args = std::env::args().skip(1);
    let num = |v: Option<String>, what: &str| -> Result<usize> {
        v.and_then(|v| v.parse().ok())
            .ok_or_else(|| Error::invalid(format!("{what} takes a number")))
    };
    while let Some(a) = args.next() {
        match a.as_str() {
            "--single" => single_ = true,
            "--overlap" => overlap = true,
            "--no-prefetch" => cfg.prefetch = false,
            "--ranks" => cfg.ranks = num(args.next(), "--ranks")?,
            "--replicas" => cfg.replicas = num(args.next(), "--replicas")?,
            "--steps" => cfg.steps = num(args.next(), "--steps")?,
            "--width" => cfg.width = num(args.next(), "--width")?,
            other => return Err(Error::invalid(format!("unknown argument {other}"))),
        }
    }
    Ok((cfg, single_, overlap))
}

#[allow(dead_code)]
fn main() -> common::Main {
    common::Main(body())
}

/// What `main` does.
fn body() -> collectix::Result<()> {
    common::init_tracing();
    let (cfg, single_, overlap) = parse()?;
    if single_ {
        for (s, l) in single(&cfg)?.iter().enumerate() {
            println!("single: step {s} loss {l}");
        }
        return Ok(());
    }
    let runs: Vec<Config> = if overlap {
        vec![
            Config {
                prefetch: true,
                ..cfg.clone()
            },
            Config {
                prefetch: false,
                ..cfg.clone()
            },
        ]
    } else {
        vec![cfg.clone()]
    };
    let launched = common::launched();
    let process = if launched {
        Some(common::join()?)
    } else {
        None
    };
    let mut times = Vec::new();
    for run in &runs {
        let reports = match &process {
            Some(p) => vec![(p.communicator().rank(), train(run, p.communicator())?)],
            None => in_process(run)?.into_iter().enumerate().collect(),
        };
        for (r, rep) in &reports {
            if !overlap {
                for l in lines(*r, rep) {
                    println!("{l}");
                }
            }
            times.push((*r, run.prefetch, rep.step_ms));
        }
    }
    if overlap {
        for (r, prefetch, ms) in times {
            let how = if prefetch { "with" } else { "without" };
            println!("rank {r}: step time {ms:.3} ms {how} prefetch");
        }
    }
    if let Some(p) = process {
        p.shutdown()?;
    }
    Ok(())
}
