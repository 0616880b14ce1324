//! `collectix bench`'s options, and what they mean in collectix's terms (its reduction, its
//! dtype, the sizes of the sweep).

use super::cell::Collective;
use clap::ValueEnum;
use collectix::{DType, ReduceOp};

/// `collectix bench`'s arguments.
#[derive(clap::Args, Clone)]
pub(crate) struct Args {
    /// The collective.
    #[arg(long, value_enum, default_value = "all_reduce")]
    pub(super) collective: Collective,
    /// Ranks in the world.
    #[arg(long, default_value_t = 2)]
    pub(super) ranks: usize,
    /// Smallest size (bytes; K, M, G suffixes).
    #[arg(short = 'b', long = "minbytes", default_value = "4", value_parser = parse_bytes)]
    pub(super) minbytes: usize,
    /// Largest size.
    #[arg(short = 'e', long = "maxbytes", default_value = "64M", value_parser = parse_bytes)]
    pub(super) maxbytes: usize,
    /// Factor between sizes.
    #[arg(short = 'f', long = "stepfactor", default_value_t = 2)]
    pub(super) stepfactor: usize,
    /// Reduction.
    #[arg(short = 'o', long = "op", value_enum, default_value = "sum")]
    pub(super) op: Reduction,
    /// Element type.
    #[arg(short = 'd', long = "dtype", value_enum, default_value = "float")]
    pub(super) dtype: Dt,
    /// Samples per size (the median is printed).
    #[arg(short = 'n', long = "iters", default_value_t = 20)]
    pub(super) iters: usize,
    /// Warm-up calls per size (also used to calibrate a sample).
    #[arg(short = 'w', long = "warmup", default_value_t = 5)]
    pub(super) warmup: usize,
    /// Check every output element (1, the default; `--check` alone is 1) or not (0).
    #[arg(short = 'c', long = "check", default_value_t = 1, num_args = 0..=1, default_missing_value = "1")]
    pub(super) check: u8,
    /// Root of rooted collectives.
    #[arg(short = 'r', long = "root", default_value_t = 0)]
    pub(super) root: usize,
    /// Where ranks run.
    #[arg(long, value_enum, default_value = "local")]
    pub(super) transport: Transport,
    /// Binding of the ranks' calling threads to cores: auto binds rank r (in one process),
    /// or the process of host-local rank r (`LOCAL_RANK`), to the r-th core it may use when
    /// the host has a core for every rank (Open MPI's default, `--bind-to core`, for 2
    /// ranks; with more ranks than cores it binds to the socket, which on one socket is no
    /// binding); none leaves placement to the scheduler, which may put two ranks on one core
    /// for a whole run.
    #[arg(long, value_enum, default_value = "auto")]
    pub(super) bind: Bind,
    /// How the ranks of an in-process world run the bench: threads (a thread of the bench's
    /// own per rank, blocking in `Work::wait`), tasks (an async task per rank on the threads
    /// the ranks' actors share, `World::spawn`), or auto: tasks when the ranks are more than
    /// 32 per core, else threads.
    #[arg(long, value_enum, default_value = "auto")]
    pub(super) bodies: Bodies,
    /// Algorithm: auto, or a name (ring, halving_doubling, recursive_doubling, binomial_tree,
    /// direct, dissemination, pairwise, reduce_scatter_gather, reduce_broadcast).
    #[arg(long, default_value = "auto")]
    pub(super) algorithm: String,
    /// Where the tensors live: cpu, cuda (rank r on GPU r mod the device count; needs the
    /// `cuda` feature), or standin (host memory posing as cuda:0, to measure the device
    /// paths' own costs without a GPU).
    #[arg(long, value_enum, default_value = "cpu")]
    pub(super) device: Dev,
    /// Backend for device tensors.
    #[arg(long, value_enum, default_value = "nccl")]
    pub(super) backend: Backend,
    /// Write every call's outputs into buffers this rank owns and reuses (the caller-buffer
    /// path, `Communicator::buffers`) instead of new tensors; host collectives only.
    #[arg(long)]
    pub(super) buffers: bool,
    /// Make every input a tensor in shared memory (`Communicator::to_shared`): between
    /// processes of one host (`--transport shm`) each byte of it crosses with one copy.
    #[arg(long)]
    pub(super) shared: bool,
    /// all_gather in place (`Communicator::all_gather_into_tensor_in_place`): each rank's
    /// block written once into an output buffer in shared memory that every call gathers
    /// into again (FSDP's flat parameter); other collectives as without it.
    #[arg(long)]
    pub(super) in_place: bool,
    /// Target length of one sample, in milliseconds.
    #[arg(long, default_value_t = 5.0)]
    pub(super) sample_ms: f64,
    /// Write every row as JSON to this file.
    #[arg(long)]
    pub(super) json: Option<std::path::PathBuf>,
    /// Draw busbw against size into this SVG file: this run's rows, and those of the
    /// `--plot-with` files beside them.
    #[arg(long)]
    pub(super) plot: Option<std::path::PathBuf>,
    /// Earlier `--json` files to draw beside this run (repeat the flag for several).
    #[arg(long = "plot-with", requires = "plot")]
    pub(super) plot_with: Vec<std::path::PathBuf>,
}

/// `-o`: the reduction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(super) enum Reduction {
    Sum,
    Prod,
    Min,
    Max,
    Avg,
}

/// `-d`: the element type, with nccl-tests' names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(super) enum Dt {
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

/// `--device`: where the tensors live.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(super) enum Dev {
    Cpu,
    Cuda,
    /// Host memory posing as cuda:0 (collectix's `StandIn`): the device paths' own costs
    /// (the NCCL backend's send/recv protocol, the staged backend's steps) without a GPU.
    Standin,
}

/// `--backend`: the backend for device tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(super) enum Backend {
    Nccl,
    Staged,
}

/// `--transport`: where the ranks run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(super) enum Transport {
    /// Ranks in this process, over the in-process transport.
    Local,
    /// Ranks in processes of their own, over TCP loopback: the bench starts `--ranks`
    /// processes of itself (torchrun's variables, a fresh secret), or, started by a launcher
    /// (`RANK` set), is one of them. Rank 0 prints the table.
    Tcp,
    /// Ranks in processes of their own, as with `tcp`, over shared memory between the
    /// processes of one host (`COLLECTIX_TRANSPORT=shm`).
    Shm,
}

impl Transport {
    /// Whether the ranks are processes of their own.
    pub(super) fn is_processes(self) -> bool {
        self != Transport::Local
    }
}

/// `--bind`: the ranks' calling threads' placement.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(super) enum Bind {
    /// Each rank's thread on a core of its own when the cores suffice, else unbound.
    Auto,
    /// Unbound.
    None,
}

/// `--bodies`: how an in-process world's ranks run the bench.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(super) enum Bodies {
    /// Tasks when the ranks are more than 32 per core, else threads.
    Auto,
    /// A thread per rank.
    Threads,
    /// An async task per rank on the ranks' shared threads.
    Tasks,
}

/// A size in bytes, with an optional K, M or G suffix (powers of 1024).
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

impl Reduction {
    /// collectix's reduction.
    pub(super) fn reduce_op(self) -> ReduceOp {
        match self {
            Reduction::Sum => ReduceOp::Sum,
            Reduction::Prod => ReduceOp::Product,
            Reduction::Min => ReduceOp::Min,
            Reduction::Max => ReduceOp::Max,
            Reduction::Avg => ReduceOp::Avg,
        }
    }
}

impl Dt {
    /// collectix's dtype.
    pub(super) fn dtype(self) -> DType {
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

impl Args {
    /// The sizes of the sweep: `-b` to `-e` by `-f` (at least 2), or the single size 0 of a
    /// barrier.
    pub(super) fn sizes(&self) -> Vec<usize> {
        if self.collective == Collective::Barrier {
            return vec![0];
        }
        let mut sizes = Vec::new();
        let mut s = self.minbytes.max(1);
        while s <= self.maxbytes {
            sizes.push(s);
            let next = s.saturating_mul(self.stepfactor.max(2));
            if next == s {
                break;
            }
            s = next;
        }
        sizes
    }
}
