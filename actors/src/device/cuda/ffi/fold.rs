//! The device-local backend's reduction kernel (`kernels/fold.cu`, committed as PTX and
//! loaded by the driver when a device first needs it), launched over spans of device memory
//! that are checked against their buffers: the code that plans a local call holds no raw
//! pointer.

use super::super::cuda_err;
use collectix_runtime::{DType, Error, ReduceOp, Result};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DeviceRepr, LaunchConfig,
    PushKernelArg, SyncOnDrop,
};
use cudarc::nvrtc::Ptx;
use std::ops::Range;
use std::sync::Arc;

/// The kernels, as NVRTC compiled them (`bench/gen_ptx.py`).
const PTX: &str = include_str!("../kernels/fold.ptx");

/// Sources (and outputs) one launch takes; a fold over more sources runs in several
/// launches, each folding into the first output.
pub(crate) const MAX_PTRS: usize = 32;

/// Threads per block of a launch.
const THREADS: u32 = 256;
/// At most this many blocks; each thread strides over the rest.
const MAX_BLOCKS: u64 = 4096;

/// The kernel's `struct Ptrs`: device addresses, by value.
#[repr(C)]
#[derive(Clone, Copy)]
struct Ptrs {
    p: [u64; MAX_PTRS],
}

// SAFETY: `Ptrs` is plain data laid out as the kernel's `struct Ptrs` (32 unsigned 64-bit
// integers, no padding), passed by value as a kernel parameter.
unsafe impl DeviceRepr for Ptrs {}

/// The pairwise operation for `op` on `dtype` (the kernel's `OP_*`; bool is reduced as u8,
/// its sum and max as OR, its product and min as AND, as on the host).
fn combine_code(op: ReduceOp, dtype: DType) -> Result<i32> {
    op.check(dtype)?;
    let bool_ = dtype == DType::Bool;
    Ok(match op {
        ReduceOp::Sum | ReduceOp::Avg | ReduceOp::PremulSum(_) if !bool_ => 0,
        ReduceOp::Product if !bool_ => 1,
        ReduceOp::Min if !bool_ => 2,
        ReduceOp::Max if !bool_ => 3,
        ReduceOp::Product | ReduceOp::Min | ReduceOp::BAnd => 4,
        ReduceOp::Sum | ReduceOp::Max | ReduceOp::BOr => 5,
        ReduceOp::BXor => 6,
        other => return Err(Error::invalid(format!("no device kernel for {other}"))),
    })
}

/// The name of the kernel for `dtype` (a dtype without one is an error when launched).
fn kernel_name(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "fold_f32",
        DType::F64 => "fold_f64",
        DType::F16 => "fold_f16",
        DType::BF16 => "fold_bf16",
        DType::U8 | DType::Bool => "fold_u8",
        DType::I8 => "fold_i8",
        DType::U16 => "fold_u16",
        DType::I16 => "fold_i16",
        DType::U32 => "fold_u32",
        DType::I32 => "fold_i32",
        DType::U64 => "fold_u64",
        DType::I64 => "fold_i64",
        _ => "none",
    }
}

/// Every dtype has a kernel.
const DTYPES: [DType; 12] = [
    DType::F32,
    DType::F64,
    DType::F16,
    DType::BF16,
    DType::U8,
    DType::I8,
    DType::U16,
    DType::I16,
    DType::U32,
    DType::I32,
    DType::U64,
    DType::I64,
];

/// The fold kernels, loaded into one device's context.
pub(crate) struct FoldKernels {
    fns: Vec<(&'static str, CudaFunction)>,
}

impl FoldKernels {
    /// Loads the PTX into `ctx` (the driver compiles it for the device).
    pub(crate) fn load(ctx: &Arc<CudaContext>) -> Result<FoldKernels> {
        let module = ctx
            .load_module(Ptx::from_src(PTX))
            .map_err(cuda_err("cuModuleLoadData"))?;
        let fns = DTYPES
            .iter()
            .map(|&d| {
                let name = kernel_name(d);
                module
                    .load_function(name)
                    .map(|f| (name, f))
                    .map_err(cuda_err("cuModuleGetFunction"))
            })
            .collect::<Result<_>>()?;
        Ok(FoldKernels { fns })
    }

    fn function(&self, dtype: DType) -> Result<&CudaFunction> {
        let name = kernel_name(dtype);
        self.fns
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, f)| f)
            .ok_or_else(|| Error::internal(format!("no kernel {name}")))
    }
}

/// Bytes `range` of a device buffer.
#[derive(Clone)]
pub(crate) struct Span<'a> {
    pub(crate) buf: &'a CudaSlice<u8>,
    pub(crate) range: Range<usize>,
}

/// One fold: `count` elements of `dtype` from each source, in order, into every output.
pub(crate) struct Fold<'s, 'a> {
    pub(crate) dtype: DType,
    pub(crate) op: ReduceOp,
    pub(crate) count: usize,
    /// The number of ranks Avg divides by.
    pub(crate) group_size: usize,
    pub(crate) srcs: &'s [Span<'a>],
    /// At most [`MAX_PTRS`].
    pub(crate) outs: &'s [Span<'a>],
}

/// A span's address, checked to lie in its buffer, hold `bytes` bytes and live on the
/// stream's device; its guard orders the launch after the buffer's last write and records
/// the use (so later users, and the buffer's free, wait for the launch).
fn address<'a>(
    s: &Span<'a>,
    bytes: usize,
    stream: &'a CudaStream,
) -> Result<(u64, SyncOnDrop<'a>)> {
    let Span { buf, range } = s;
    if range.start > range.end || range.end > buf.len() || range.len() != bytes {
        return Err(Error::internal(format!(
            "a fold over bytes {range:?} of a buffer of {} (needs {bytes})",
            buf.len()
        )));
    }
    if buf.ordinal() != stream.context().ordinal() {
        return Err(Error::invalid(format!(
            "a fold on cuda:{} with memory on cuda:{}",
            stream.context().ordinal(),
            buf.ordinal()
        )));
    }
    let (p, g) = buf.device_ptr(stream);
    Ok((p + range.start as u64, g))
}

impl FoldKernels {
    /// Enqueues `f` on `stream`: the outputs get the sources folded left to right, with the
    /// op's pre and post steps, as the host reference computes them.
    pub(crate) fn fold(&self, stream: &CudaStream, f: &Fold<'_, '_>) -> Result<()> {
        if f.count == 0 {
            return Ok(());
        }
        if f.srcs.is_empty() || f.outs.is_empty() || f.outs.len() > MAX_PTRS {
            return Err(Error::internal(
                "a fold needs sources and at most 32 outputs",
            ));
        }
        let code = combine_code(f.op, f.dtype)?;
        let bytes = f
            .count
            .checked_mul(f.dtype.size())
            .ok_or_else(|| Error::invalid("fold size overflows"))?;
        let (premul, scalar) = match f.op {
            ReduceOp::PremulSum(s) => (1i32, s),
            _ => (0, 0.0),
        };
        let divide = match f.op {
            ReduceOp::Avg => i32::try_from(f.group_size)
                .map_err(|_| Error::invalid("group too large for a device average"))?,
            _ => 0,
        };
        let func = self.function(f.dtype)?;
        let mut outs = Ptrs { p: [0; MAX_PTRS] };
        let mut guards = Vec::with_capacity(f.srcs.len() + f.outs.len());
        for (i, o) in f.outs.iter().enumerate() {
            let (p, g) = address(o, bytes, stream)?;
            outs.p[i] = p;
            guards.push(g);
        }
        let n = f.count as u64;
        let blocks = n.div_ceil(THREADS as u64).clamp(1, MAX_BLOCKS) as u32;
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let chunks: Vec<&[Span<'_>]> = f.srcs.chunks(MAX_PTRS).collect();
        let last = chunks.len() - 1;
        for (c, chunk) in chunks.iter().enumerate() {
            let mut srcs = Ptrs { p: [0; MAX_PTRS] };
            for (i, s) in chunk.iter().enumerate() {
                let (p, g) = address(s, bytes, stream)?;
                srcs.p[i] = p;
                guards.push(g);
            }
            // Earlier chunks fold into the first output only; the last writes them all and
            // applies the post step.
            let (nout, div) = if c == last {
                (f.outs.len() as i32, divide)
            } else {
                (1, 0)
            };
            let nsrc = chunk.len() as i32;
            let acc_first = i32::from(c > 0);
            let mut b = stream.launch_builder(func);
            b.arg(&srcs)
                .arg(&nsrc)
                .arg(&outs)
                .arg(&nout)
                .arg(&n)
                .arg(&code)
                .arg(&scalar)
                .arg(&premul)
                .arg(&div)
                .arg(&acc_first);
            // SAFETY: the arguments match the kernel's signature (`fold.cu`'s ENTRY: Ptrs,
            // int, Ptrs, int, u64, int, double, int, int, int), by value; every address in
            // `srcs` and `outs` is a checked span of `count` elements of `dtype` on this
            // stream's device (`address`), and the buffers outlive the launch: the guards
            // record its use, cudarc frees a buffer only after its recorded uses, and the
            // backend keeps every input and output until the call's completion event.
            unsafe { b.launch(cfg) }.map_err(cuda_err("cuLaunchKernel"))?;
        }
        drop(guards);
        Ok(())
    }
}
