//! `collectix`: the command-line tool of collectix. `bench` prints nccl-tests' table for a
//! collective over a size sweep, with a correctness check; `plot` draws `--json` rows; `store`
//! runs a TCP store server for multi-process jobs.
//!
//! ```text
//! collectix bench --collective all_reduce --ranks 4 -b 4 -e 64M -f 4 -c 1
//! collectix bench --device cuda -b 1M -e 1G -f 2          # with --features cuda
//! collectix bench -b 4 -e 64M -f 4 --json now.json --plot now.svg --plot-with before.json
//! collectix plot --out cmp.svg collectix.json mpi.json
//! ```
//!
//! The method is the peers' (`bench/peers/`): a sample is the slowest rank's time for `K`
//! back-to-back blocking calls after a barrier, `K` calibrated so that a sample lasts about
//! `--sample-ms`; the time printed is the median over `-n` samples, with the minimum and the
//! maximum beside it. Sizes follow nccl-tests: for all_gather, gather and all_to_all the size is
//! the full (gathered) size, for reduce_scatter and scatter the full input.

mod bench;
mod launch;
mod plot;

use bench::{count_wrong, flatten, Cell, Coll};
use clap::{Parser, Subcommand, ValueEnum};
use collectix::runtime::collective::{Output, Request};
use collectix::{
    Algorithm, CallOptions, Communicator, DType, Device, DeviceBackend, ReduceOp, Result, World,
};
use std::io::Write;
use std::time::Instant;

#[derive(Parser)]
#[command(
    name = "collectix",
    version,
    about = "Collective communication for Rust: tools"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// nccl-tests' table for one collective over a sweep of sizes.
    Bench(Args),
    /// Starts the processes of a job on this host with torchrun's environment, prefixes
    /// their output with their rank, forwards SIGINT/SIGTERM, and stops them all when one
    /// fails.
    Launch(launch::LaunchArgs),
    /// Runs a TCP store server (the rendezvous of multi-process jobs) until interrupted.
    Store(StoreArgs),
    /// Draws busbw against size from `--json` files (collectix's, or peers' converted by
    /// `bench/peers/side_by_side.py`) into one SVG.
    Plot(PlotArgs),
}

#[derive(clap::Args)]
struct StoreArgs {
    /// The port to listen on.
    #[arg(long, default_value_t = 29500)]
    port: u16,
    /// The address to listen on: `::` (every IPv6 and, on a dual-stack host, IPv4 address),
    /// `0.0.0.0`, or one address. Default: `::` with a secret (`COLLECTIX_SECRET` or
    /// `COLLECTIX_SECRET_FILE`) or `COLLECTIX_INSECURE=1`, else `127.0.0.1` (without a secret
    /// the store listens on loopback only).
    #[arg(long)]
    host: Option<String>,
}

#[derive(clap::Args)]
struct PlotArgs {
    /// The SVG file to write.
    #[arg(long)]
    out: std::path::PathBuf,
    /// The title.
    #[arg(long, default_value = "busbw against size")]
    title: String,
    /// `--json` files; each line is labelled with its file's stem (or its rows' `source`).
    #[arg(required = true)]
    json: Vec<std::path::PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Op {
    Sum,
    Prod,
    Min,
    Max,
    Avg,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Dt {
    Float,
    Double,
    Half,
    Bfloat16,
    Int32,
    Int64,
    Int8,
    Uint8,
    Int16,
    Uint16,
    Uint32,
    Uint64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Dev {
    Cpu,
    Cuda,
    /// Host memory posing as cuda:0 (collectix's `StandIn`): the device paths' own costs
    /// (the NCCL backend's send/recv protocol, the staged backend's steps) without a GPU.
    Standin,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Backend {
    Nccl,
    Staged,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Transport {
    /// Ranks in this process, over the in-process transport.
    Local,
    /// Ranks in processes of their own, over TCP loopback: the bench starts `--ranks`
    /// processes of itself (torchrun's variables, a fresh secret), or, started by a launcher
    /// (`RANK` set), is one of them. Rank 0 prints the table.
    Tcp,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Bind {
    /// Each rank's thread on a core of its own when the cores suffice, else unbound.
    Auto,
    /// Unbound.
    None,
}

#[derive(clap::Args)]
struct Args {
    /// The collective.
    #[arg(long, value_enum, default_value = "all_reduce")]
    collective: Coll,
    /// Ranks in the world.
    #[arg(long, default_value_t = 2)]
    ranks: usize,
    /// Smallest size (bytes; K, M, G suffixes).
    #[arg(short = 'b', long = "minbytes", default_value = "4", value_parser = parse_bytes)]
    minbytes: usize,
    /// Largest size.
    #[arg(short = 'e', long = "maxbytes", default_value = "64M", value_parser = parse_bytes)]
    maxbytes: usize,
    /// Factor between sizes.
    #[arg(short = 'f', long = "stepfactor", default_value_t = 2)]
    stepfactor: usize,
    /// Reduction.
    #[arg(short = 'o', long = "op", value_enum, default_value = "sum")]
    op: Op,
    /// Element type.
    #[arg(short = 'd', long = "dtype", value_enum, default_value = "float")]
    dtype: Dt,
    /// Samples per size (the median is printed).
    #[arg(short = 'n', long = "iters", default_value_t = 20)]
    iters: usize,
    /// Warm-up calls per size (also used to calibrate a sample).
    #[arg(short = 'w', long = "warmup", default_value_t = 5)]
    warmup: usize,
    /// Check every output element (1) or not (0).
    #[arg(short = 'c', long = "check", default_value_t = 1)]
    check: u8,
    /// Root of rooted collectives.
    #[arg(short = 'r', long = "root", default_value_t = 0)]
    root: usize,
    /// Where ranks run.
    #[arg(long, value_enum, default_value = "local")]
    transport: Transport,
    /// Binding of the in-process ranks' threads to cores: auto binds rank r to the r-th
    /// core this process may use when there are enough cores for every rank (Open MPI's
    /// default, `--bind-to core`, for 2 ranks; with more ranks than cores it binds to the
    /// socket, which on one socket is no binding); none leaves placement to the scheduler,
    /// which may put two ranks on one core for a whole run.
    #[arg(long, value_enum, default_value = "auto")]
    bind: Bind,
    /// Algorithm: auto, or a name (ring, halving_doubling, recursive_doubling, binomial_tree,
    /// direct, dissemination, pairwise, reduce_scatter_gather, reduce_broadcast).
    #[arg(long, default_value = "auto")]
    algorithm: String,
    /// Where the tensors live: cpu, cuda (rank r on GPU r mod the device count; needs the
    /// `cuda` feature), or standin (host memory posing as cuda:0, to measure the device
    /// paths' own costs without a GPU).
    #[arg(long, value_enum, default_value = "cpu")]
    device: Dev,
    /// Backend for device tensors.
    #[arg(long, value_enum, default_value = "nccl")]
    backend: Backend,
    /// Target length of one sample, in milliseconds.
    #[arg(long, default_value_t = 5.0)]
    sample_ms: f64,
    /// Write every row as JSON to this file.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
    /// Draw busbw against size into this SVG file: this run's rows, and those of the
    /// `--plot-with` files beside them.
    #[arg(long)]
    plot: Option<std::path::PathBuf>,
    /// Earlier `--json` files to draw beside this run (repeat the flag for several).
    #[arg(long = "plot-with", requires = "plot")]
    plot_with: Vec<std::path::PathBuf>,
}

fn parse_bytes(s: &str) -> std::result::Result<usize, String> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().last() {
        Some((i, 'K' | 'k')) => (&s[..i], 1usize << 10),
        Some((i, 'M' | 'm')) => (&s[..i], 1 << 20),
        Some((i, 'G' | 'g')) => (&s[..i], 1 << 30),
        _ => (s, 1),
    };
    let n: usize = num.parse().map_err(|e| format!("{s}: {e}"))?;
    n.checked_mul(mult).ok_or_else(|| format!("{s}: too large"))
}

impl Op {
    fn reduce_op(self) -> ReduceOp {
        match self {
            Op::Sum => ReduceOp::Sum,
            Op::Prod => ReduceOp::Product,
            Op::Min => ReduceOp::Min,
            Op::Max => ReduceOp::Max,
            Op::Avg => ReduceOp::Avg,
        }
    }
}

impl Dt {
    fn dtype(self) -> DType {
        match self {
            Dt::Float => DType::F32,
            Dt::Double => DType::F64,
            Dt::Half => DType::F16,
            Dt::Bfloat16 => DType::BF16,
            Dt::Int32 => DType::I32,
            Dt::Int64 => DType::I64,
            Dt::Int8 => DType::I8,
            Dt::Uint8 => DType::U8,
            Dt::Int16 => DType::I16,
            Dt::Uint16 => DType::U16,
            Dt::Uint32 => DType::U32,
            Dt::Uint64 => DType::U64,
        }
    }
}

/// One row of the table (and of `--json`).
#[derive(serde::Serialize)]
struct Row {
    collective: Coll,
    ranks: usize,
    device: String,
    size: usize,
    count: usize,
    dtype: String,
    redop: String,
    root: Option<usize>,
    samples: usize,
    calls_per_sample: usize,
    time_us: f64,
    time_min_us: f64,
    time_max_us: f64,
    algbw_gbs: f64,
    busbw_gbs: f64,
    wrong: Option<usize>,
}

fn submit_all(c: &Communicator, reqs: &[Request], opts: &CallOptions) -> Result<Vec<Output>> {
    let works: Vec<_> = reqs.iter().map(|q| c.submit(q.clone(), opts)).collect();
    works.into_iter().map(|w| w.wait()).collect()
}

/// Every rank, on a thread of its own, runs `f(rank, comm)`; the results in rank order.
fn on_every_rank<T: Send>(
    comms: &[Communicator],
    bind: bool,
    f: impl Fn(usize, &Communicator) -> Result<T> + Sync,
) -> Result<Vec<T>> {
    std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .enumerate()
            .map(|(r, c)| {
                let f = &f;
                s.spawn(move || {
                    if bind && !bind_to_core(r) {
                        eprintln!("collectix: bench rank {r}: could not bind its thread to a core");
                    }
                    f(r, c)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(collectix::Error::Shutdown)))
            .collect()
    })
}

/// Binds the calling thread to the `i`-th core this process may run on; whether it could.
#[cfg(target_os = "linux")]
fn bind_to_core(i: usize) -> bool {
    use nix::sched::{sched_getaffinity, sched_setaffinity, CpuSet};
    use nix::unistd::Pid;
    let me = Pid::from_raw(0);
    let Ok(allowed) = sched_getaffinity(me) else {
        return false;
    };
    let Some(cpu) = (0..CpuSet::count())
        .filter(|&c| allowed.is_set(c).unwrap_or(false))
        .nth(i)
    else {
        return false;
    };
    let mut one = CpuSet::new();
    one.set(cpu).is_ok() && sched_setaffinity(me, &one).is_ok()
}

#[cfg(not(target_os = "linux"))]
fn bind_to_core(_: usize) -> bool {
    false
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Resets this process's peak RSS to its current RSS (Linux: `clear_refs` with 5), so that
/// the next [`peak_rss_mib`] covers only what ran since; whether it could.
fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

fn peak_rss_mib() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

/// The ranks this process drives: every rank of an in-process world, or its own rank of a
/// job over TCP.
enum Ranks {
    Local(World, Vec<Communicator>),
    Tcp(Box<collectix::Process>, Communicator),
}

impl Ranks {
    fn size(&self) -> usize {
        match self {
            Ranks::Local(_, c) => c.len(),
            Ranks::Tcp(_, c) => c.size(),
        }
    }

    /// Whether this process prints the table (and writes the files).
    fn prints(&self) -> bool {
        match self {
            Ranks::Local(..) => true,
            Ranks::Tcp(_, c) => c.rank() == 0,
        }
    }

    /// `f(rank, comm)` on every rank this process drives (each on a thread of its own); the
    /// first one's result (`measure` makes every rank's the same).
    fn run<T: Send>(
        &self,
        bind: bool,
        f: impl Fn(usize, &Communicator) -> Result<T> + Sync,
    ) -> Result<T> {
        let mut got = match self {
            Ranks::Local(_, comms) => on_every_rank(comms, bind, f)?,
            Ranks::Tcp(_, c) => vec![f(c.rank(), c)?],
        };
        if got.is_empty() {
            return Err(collectix::Error::internal("no rank ran"));
        }
        Ok(got.swap_remove(0))
    }

    fn shutdown(self) -> Result<()> {
        match self {
            Ranks::Local(world, _) => world.shutdown(),
            Ranks::Tcp(p, _) => p.shutdown(),
        }
    }
}

/// One cell as one rank measured it, made the same on every rank by collectives: the wrong
/// elements over all ranks, the calls per sample, and each sample's slowest rank's time.
struct Measured {
    wrong: Option<usize>,
    calls: usize,
    slowest: Vec<f64>,
    /// The rank actor's wake-ups per call during the samples (the most on any rank): how
    /// often progress was left to the background driver instead of a waiting caller.
    wakeups: f64,
    /// Rank 0's process's peak RSS during the warm-up and samples (MiB), and whether it
    /// covers only them (the peak was reset after the inputs were made and checked) or the
    /// whole run so far.
    peak: Option<(f64, bool)>,
}

/// `v` reduced elementwise over every rank with `op`.
fn over_ranks(c: &Communicator, v: Vec<f64>, op: ReduceOp) -> Result<Vec<f64>> {
    c.all_reduce(collectix::Tensor::from_vec(v), op)
        .wait()?
        .to_vec::<f64>()
}

/// Rank `r`'s part of one cell: the check (one call, every output element compared), the
/// warm-up (which calibrates `K`, the calls per sample, from the slowest rank), and the
/// samples (barrier, `K` calls); what each rank saw is combined with all_reduces outside the
/// timed parts.
fn measure(
    a: &Args,
    c: &Communicator,
    r: usize,
    cell: &Cell,
    opts: &CallOptions,
) -> Result<Measured> {
    let reqs = cell.requests(r)?;
    let (op, dtype) = (cell.op, cell.dtype);
    let wrong = if a.check != 0 && a.collective != Coll::Barrier {
        let out = submit_all(c, &reqs, opts)?;
        let want = cell.expected(r).unwrap_or_default();
        let mine = count_wrong(&flatten(&out)?, &want, op, dtype) as f64;
        Some(over_ranks(c, vec![mine], ReduceOp::Sum)?[0] as usize)
    } else {
        None
    };
    c.barrier().wait()?;
    // Every rank has made its inputs and finished its check: the peak from here on is the
    // calls' own (inputs, outputs and what the calls hold), not the check's reference copies.
    let reset = r == 0 && reset_peak_rss();
    let t0 = Instant::now();
    for _ in 0..a.warmup.max(1) {
        submit_all(c, &reqs, opts)?;
    }
    let mine = t0.elapsed().as_secs_f64() / a.warmup.max(1) as f64;
    let per_call = over_ranks(c, vec![mine], ReduceOp::Max)?[0].max(1e-9);
    let calls = ((a.sample_ms / 1e3 / per_call).ceil() as usize).clamp(1, 100_000);
    let mut v = Vec::with_capacity(a.iters);
    let mut woken = 0;
    for _ in 0..a.iters.max(1) {
        c.barrier().wait()?;
        let before = c.background_wakeups();
        let t0 = Instant::now();
        for _ in 0..calls {
            submit_all(c, &reqs, opts)?;
        }
        v.push(t0.elapsed().as_secs_f64() / calls as f64);
        woken += c.background_wakeups() - before;
    }
    let per_call = woken as f64 / (calls * a.iters.max(1) * reqs.len().max(1)) as f64;
    let peak = if r == 0 {
        peak_rss_mib().map(|m| (m, reset))
    } else {
        None
    };
    Ok(Measured {
        wrong,
        calls,
        slowest: over_ranks(c, v, ReduceOp::Max)?,
        wakeups: over_ranks(c, vec![per_call], ReduceOp::Max)?[0],
        peak,
    })
}

/// `--transport tcp` started by hand: runs `--ranks` processes of this program as the job's
/// ranks (torchrun's variables, a free port, a fresh secret); rank 0's output is this one's.
fn spawn_ranks(a: &Args) -> std::process::ExitCode {
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("collectix: cannot find this program to start its ranks: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_or(29_500, |a| a.port());
    let secret = match collectix::Secret::random_text() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("collectix: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let w = a.ranks.max(1);
    let mut children = Vec::with_capacity(w);
    for r in 0..w {
        let spawned = std::process::Command::new(&exe)
            .args(std::env::args_os().skip(1))
            .env("RANK", r.to_string())
            .env("WORLD_SIZE", w.to_string())
            .env("LOCAL_RANK", r.to_string())
            .env("LOCAL_WORLD_SIZE", w.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string())
            .env("COLLECTIX_SECRET", &secret)
            .env_remove("COLLECTIX_SECRET_FILE")
            .stdout(if r == 0 {
                std::process::Stdio::inherit()
            } else {
                std::process::Stdio::null()
            })
            .spawn();
        match spawned {
            Ok(c) => children.push(c),
            Err(e) => {
                eprintln!("collectix: cannot start rank {r}: {e}");
                for mut c in children {
                    let _ = c.kill();
                    let _ = c.wait();
                }
                return std::process::ExitCode::FAILURE;
            }
        }
    }
    let mut ok = true;
    for (r, mut c) in children.into_iter().enumerate() {
        match c.wait() {
            Ok(s) if s.success() => {}
            other => {
                eprintln!("collectix: bench rank {r} ended with {other:?}");
                ok = false;
            }
        }
    }
    if ok {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    }
}

/// The sweep on the ranks this process drives; `None` where it is a rank other than 0 of a
/// TCP job (which prints nothing).
fn run(a: &Args) -> Result<Option<Vec<Row>>> {
    let (dtype, op) = (a.dtype.dtype(), a.op.reduce_op());
    let algorithm = match a.algorithm.as_str() {
        "auto" => None,
        name => Some(
            Algorithm::from_name(name)
                .ok_or_else(|| collectix::Error::invalid(format!("unknown algorithm {name}")))?,
        ),
    };
    let opts = CallOptions {
        algorithm,
        timeout: None,
    };
    let gpus = match a.device {
        Dev::Cpu | Dev::Standin => 1,
        Dev::Cuda => collectix::device::cuda_devices()?.max(1),
    };
    let device_of = |r: usize| match a.device {
        Dev::Cpu => Device::Host,
        Dev::Cuda | Dev::Standin => Device::Cuda((r as u32) % gpus),
    };
    let backend = match a.backend {
        Backend::Nccl => DeviceBackend::Nccl,
        Backend::Staged => DeviceBackend::HostStaged,
    };
    let ranks = match a.transport {
        Transport::Local => {
            let world = World::local(a.ranks.max(1))?;
            let comms: Vec<Communicator> = world
                .communicators()
                .iter()
                .map(|c| c.with_device_backend(backend))
                .collect();
            Ranks::Local(world, comms)
        }
        Transport::Tcp => {
            let p = collectix::init(
                &collectix::InitArgs::default(),
                collectix::GroupOptions::default(),
                std::time::Duration::from_secs(120),
            )?;
            let c = p.communicator().with_device_backend(backend);
            Ranks::Tcp(Box::new(p), c)
        }
    };
    let w = ranks.size();
    let prints = ranks.prints();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let bind = a.bind == Bind::Auto && a.transport == Transport::Local && w <= cores;
    let transport = format!("{:?}", a.transport).to_lowercase();

    let mut sizes = Vec::new();
    let mut s = a.minbytes.max(1);
    while s <= a.maxbytes {
        sizes.push(s);
        let next = s.saturating_mul(a.stepfactor.max(2));
        if next == s {
            break;
        }
        s = next;
    }
    if a.collective == Coll::Barrier {
        sizes = vec![0];
    }
    // Only the printing process prints: every line below goes through `say`.
    let say = |line: String| {
        if prints {
            println!("{line}");
        }
    };
    say(format!(
        "# collectix bench: {}, {w} ranks, transport {transport}{}, device {}{}, {dtype}, op {op}, {} samples",
        a.collective.name(),
        if bind { " (ranks bound to cores)" } else { "" },
        format!("{:?}", a.device).to_lowercase(),
        if a.device == Dev::Cpu { String::new() } else { format!(" ({backend:?})") },
        a.iters
    ));
    say(format!(
        "#{:>11} {:>11} {:>8} {:>6} {:>5} {:>10} {:>10} {:>10} {:>8} {:>8} {:>7}",
        "size(B)",
        "count",
        "type",
        "redop",
        "root",
        "time(us)",
        "min(us)",
        "max(us)",
        "algbw",
        "busbw",
        "#wrong"
    ));
    let mut rows = Vec::new();
    let mut woken = Vec::new();
    let mut peaks: Vec<(f64, bool)> = Vec::new();
    for (k, &bytes) in sizes.iter().enumerate() {
        if prints {
            eprint!("\rbench: size {} of {} ({bytes} B)   ", k + 1, sizes.len());
            let _ = std::io::stderr().flush();
        }
        // Each rank's device can differ; the cell's device is rank 0's, and each rank's
        // requests are made on its own.
        let cells: Vec<Cell> = match (0..w)
            .map(|r| {
                Cell::new(a.collective, w, bytes, dtype, op, a.root, device_of(r))
                    .map(|c| c.with_stand_in(a.device == Dev::Standin))
            })
            .collect::<std::result::Result<Vec<_>, String>>()
        {
            Ok(c) => c,
            Err(why) => {
                say(format!("# {bytes} B skipped: {why}"));
                continue;
            }
        };
        let Measured {
            wrong,
            calls,
            mut slowest,
            wakeups,
            peak,
        } = ranks.run(bind, |r, c| measure(a, c, r, &cells[r], &opts))?;
        woken.push((bytes, wakeups));
        peaks.extend(peak);
        let t = median(&mut slowest);
        let (tmin, tmax) = (
            slowest.first().copied().unwrap_or(0.0),
            slowest.last().copied().unwrap_or(0.0),
        );
        let algbw = if t > 0.0 { bytes as f64 / t / 1e9 } else { 0.0 };
        let row = Row {
            collective: a.collective,
            ranks: w,
            device: format!("{:?}", a.device).to_lowercase(),
            size: bytes,
            count: cells[0].count,
            dtype: dtype.to_string(),
            redop: if a.collective.reduces() {
                op.to_string()
            } else {
                "none".into()
            },
            root: matches!(
                a.collective,
                Coll::Broadcast | Coll::Reduce | Coll::Gather | Coll::Scatter
            )
            .then_some(cells[0].root),
            samples: a.iters.max(1),
            calls_per_sample: calls,
            time_us: t * 1e6,
            time_min_us: tmin * 1e6,
            time_max_us: tmax * 1e6,
            algbw_gbs: algbw,
            busbw_gbs: algbw * a.collective.busbw_factor(w),
            wrong,
        };
        say(format!(
            " {:>11} {:>11} {:>8} {:>6} {:>5} {:>10.2} {:>10.2} {:>10.2} {:>8.3} {:>8.3} {:>7}",
            row.size,
            row.count,
            row.dtype,
            row.redop,
            row.root.map_or("-".into(), |r| r.to_string()),
            row.time_us,
            row.time_min_us,
            row.time_max_us,
            row.algbw_gbs,
            row.busbw_gbs,
            row.wrong.map_or("N/A".into(), |w| w.to_string()),
        ));
        rows.push(row);
    }
    if prints {
        eprint!("\r{:60}\r", "");
    }
    let wrong: usize = rows.iter().filter_map(|r| r.wrong).sum();
    say(format!("# #wrong in total: {wrong}"));
    let woken: Vec<String> = woken
        .iter()
        .map(|(b, w)| format!("{b} B: {w:.2}"))
        .collect();
    say(format!(
        "# rank actor wake-ups per call (most on one rank): {}",
        woken.join(", ")
    ));
    let whose = if matches!(ranks, Ranks::Tcp(..)) {
        " (rank 0's process)"
    } else {
        ""
    };
    if let Some(&(mib, true)) = peaks.iter().max_by(|x, y| x.0.total_cmp(&y.0)) {
        // Each size's peak covers its warm-up and samples only: what the calls themselves
        // hold (inputs made before them included), not the check's reference copies.
        say(format!(
            "# peak RSS{whose}: {mib:.1} MiB (during the timed calls, the largest over sizes)"
        ));
    } else if let Some(mib) = peak_rss_mib() {
        say(format!(
            "# peak RSS{whose}: {mib:.1} MiB (the whole run, checks included)"
        ));
    }
    ranks.shutdown()?;
    Ok(prints.then_some(rows))
}

/// This run's rows as points of a plot.
fn points(rows: &[Row]) -> Vec<plot::Point> {
    rows.iter()
        .map(|r| plot::Point {
            source: "this run".into(),
            collective: r.collective.name().into(),
            ranks: r.ranks as u64,
            size: r.size as f64,
            busbw: r.busbw_gbs,
        })
        .collect()
}

/// Draws this run and the earlier files it is to be compared with.
fn plot_run(args: &Args, rows: &[Row]) -> std::result::Result<(), String> {
    let Some(out) = &args.plot else {
        return Ok(());
    };
    let mut pts = points(rows);
    for f in &args.plot_with {
        pts.extend(plot::load(f)?);
    }
    let title = format!(
        "collectix bench: {}, {} ranks, {}",
        args.collective.name(),
        args.ranks,
        args.dtype.dtype()
    );
    plot::draw(out, &title, &pts)
}

fn bench(args: &Args) -> std::process::ExitCode {
    if args.transport == Transport::Tcp && std::env::var_os("RANK").is_none() {
        return spawn_ranks(args);
    }
    match run(args) {
        Ok(None) => std::process::ExitCode::SUCCESS,
        Ok(Some(rows)) => {
            if let Some(path) = &args.json {
                let text = serde_json::to_string_pretty(&rows).unwrap_or_default();
                if let Err(e) = std::fs::write(path, text) {
                    eprintln!("collectix: cannot write {}: {e}", path.display());
                    return std::process::ExitCode::FAILURE;
                }
            }
            if let Err(e) = plot_run(args, &rows) {
                eprintln!("collectix: cannot plot: {e}");
                return std::process::ExitCode::FAILURE;
            }
            if rows.iter().any(|r| r.wrong.is_some_and(|w| w > 0)) {
                eprintln!("collectix: wrong results");
                return std::process::ExitCode::FAILURE;
            }
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("collectix: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn main() -> std::process::ExitCode {
    match Cli::parse().command {
        Command::Bench(args) => bench(&args),
        Command::Launch(a) => std::process::ExitCode::from(launch::run(&a)),
        Command::Store(a) => {
            let security = match collectix::Security::from_env() {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("collectix: {e}");
                    return std::process::ExitCode::FAILURE;
                }
            };
            let host = a.host.unwrap_or_else(|| {
                if security.any_address() {
                    "::"
                } else {
                    "127.0.0.1"
                }
                .to_string()
            });
            let ip: std::net::IpAddr = match host.parse() {
                Ok(ip) => ip,
                Err(e) => {
                    eprintln!("collectix: --host {host}: {e}");
                    return std::process::ExitCode::FAILURE;
                }
            };
            match collectix::TcpStoreServer::bind_secured((ip, a.port), security) {
                Ok(server) => {
                    println!("collectix store: serving on {}", server.local_addr());
                    // Serves until the process is interrupted.
                    loop {
                        std::thread::park();
                    }
                }
                Err(e) => {
                    eprintln!("collectix: {e}");
                    std::process::ExitCode::FAILURE
                }
            }
        }
        Command::Plot(p) => {
            let pts: std::result::Result<Vec<_>, String> =
                p.json.iter().map(|f| plot::load(f)).collect();
            match pts.and_then(|pts| plot::draw(&p.out, &p.title, &pts.concat())) {
                Ok(()) => std::process::ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("collectix: cannot plot: {e}");
                    std::process::ExitCode::FAILURE
                }
            }
        }
    }
}
