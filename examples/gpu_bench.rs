//! all_reduce on CUDA tensors over NCCL: sizes from 1 MiB to 1 GiB (f32, world of one: every
//! rank this process drives is on GPU 0), then the per-call overhead of a 4-byte all_reduce
//! on the NCCL path, on the host path, and of the agreement step alone.
//! `bench/torch_nccl.py` prints the same columns for torch.distributed: in place; out of
//! place issued in a loop (the loop's first run at a size, then again) with every result
//! kept until the clock stops; out of place blocking (each call issued, then waited).
//!
//! ```text
//! cargo run --release --features cuda --example gpu_bench [-- MAX_MIB]
//! ```
//! (The `collectix bench` command comes with its own issue; this is the GPU part of it.)

use collectix::runtime::collective::TensorSpec;
use collectix::{DType, Device, ReduceOp, Tensor, TensorDeviceExt, World};
use std::time::Instant;

fn main() -> collectix::Result<()> {
    let max_mib: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1024);
    let n = collectix::device::cuda_devices()?;
    let v = collectix::device::nccl_version()?;
    let lib = collectix::device::cuda::nccl::Nccl::load()?;
    println!(
        "# collectix gpu_bench: {n} CUDA device(s), NCCL {v} from {}, world of 1 on cuda:0, f32 sum",
        lib.path()
    );
    if std::env::var_os("RETAIN_FREED_MEMORY").is_some() {
        collectix::device::cuda::retain_freed_memory(0)?;
        println!("# freed device memory stays in the pool (retain_freed_memory)");
    }
    let world = World::local(1)?;
    let c = &world.communicators()[0];
    let gpu = Device::Cuda(0);

    println!(
        "# in place: each call's input moved in (NCCL writes over it, as torch does); out of \
         place: a clone passed, so the result is a new buffer (collectix's value semantics).\n\
         # 'issued' columns: ITERS calls issued, then waited (as torch's script); 'first' is \
         the first such loop at a size (the output pool grows), 'again' the same loop once \
         more; 'blocking': each call issued then waited. Times per call."
    );
    println!(
        "#{:>12} {:>6} {:>10} {:>10} {:>10} {:>10} {:>11} {:>7}",
        "size(B)",
        "iters",
        "inplace",
        "oop-first",
        "oop-again",
        "oop-block",
        "algbw(GB/s)",
        "#wrong"
    );
    let mut mib = 1usize;
    while mib <= max_mib {
        let count = mib << 18; // f32 elements
        let iters = (200 / mib).clamp(5, 50);
        let one = Tensor::full(&[count], 1.0f32)?;
        for _ in 0..3 {
            c.all_reduce(one.to_device(gpu)?, ReduceOp::Sum).wait()?;
        }
        // In place: inputs made before the clock starts, each moved into its call.
        let inputs: Vec<Tensor> = (0..iters)
            .map(|_| one.to_device(gpu))
            .collect::<collectix::Result<_>>()?;
        let (inplace, _) = issued(c, inputs)?;
        // Out of place: every call is given a clone of one tensor.
        let shared = one.to_device(gpu)?;
        let (first, _) = issued(c, vec![shared.clone(); iters])?;
        let (again, last) = issued(c, vec![shared.clone(); iters])?;
        let t0 = Instant::now();
        for _ in 0..iters {
            c.all_reduce(shared.clone(), ReduceOp::Sum).wait()?;
        }
        let block = t0.elapsed().as_secs_f64() * 1e6 / iters as f64;
        let wrong = match last {
            Some(t) => t
                .to_host()?
                .as_slice::<f32>()?
                .iter()
                .filter(|&&x| x != 1.0)
                .count(),
            None => count,
        };
        let bytes = count * 4;
        println!(
            " {:>12} {:>6} {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>11.2} {:>7}",
            bytes,
            iters,
            inplace,
            first,
            again,
            block,
            bytes as f64 / again / 1e3,
            wrong
        );
        mib *= 2;
    }

    let per_call = |label: &str, f: &dyn Fn() -> collectix::Result<()>| -> collectix::Result<()> {
        for _ in 0..100 {
            f()?;
        }
        let n = 2000;
        let t0 = Instant::now();
        for _ in 0..n {
            f()?;
        }
        println!(
            "# per call, issue then wait, {label}: {:.1} us",
            t0.elapsed().as_secs_f64() * 1e6 / n as f64
        );
        Ok(())
    };
    let small = Tensor::from_vec(vec![1.0f32]).to_device(gpu)?;
    per_call(
        "4 B all_reduce on cuda:0, out of place (agreement + NCCL + event)",
        &|| c.all_reduce(small.clone(), ReduceOp::Sum).wait().map(drop),
    )?;
    let cell = std::sync::Mutex::new(Some(small.clone()));
    per_call(
        "4 B all_reduce on cuda:0, in place (the result fed back in)",
        &|| {
            let t = cell
                .lock()
                .ok()
                .and_then(|mut g| g.take())
                .ok_or(collectix::Error::Shutdown)?;
            let out = c.all_reduce(t, ReduceOp::Sum).wait()?;
            if let Ok(mut g) = cell.lock() {
                *g = Some(out);
            }
            Ok(())
        },
    )?;
    let host = Tensor::from_vec(vec![1.0f32]);
    per_call("4 B all_reduce on the host engine", &|| {
        c.all_reduce(host.clone(), ReduceOp::Sum).wait().map(drop)
    })?;
    let block = Tensor::from_vec(vec![0u8; 208]);
    per_call(
        "the agreement step alone (208 B all_gather on the host engine)",
        &|| {
            c.all_gather_into_tensor(TensorSpec::new(&[208], DType::U8), block.clone())
                .wait()
                .map(drop)
        },
    )?;
    Ok(())
}

/// Issues an all_reduce of each of `inputs` before waiting for any, then waits for all: the
/// time per call (µs), and the last result. The results are kept until the clock stops (as
/// torch's script keeps its outputs), so that no free is timed.
fn issued(
    c: &collectix::Communicator,
    inputs: Vec<Tensor>,
) -> collectix::Result<(f64, Option<Tensor>)> {
    let n = inputs.len().max(1);
    let t0 = Instant::now();
    let works: Vec<_> = inputs
        .into_iter()
        .map(|t| c.all_reduce(t, ReduceOp::Sum))
        .collect();
    let mut outs = Vec::with_capacity(n);
    for w in works {
        outs.push(w.wait()?);
    }
    let us = t0.elapsed().as_secs_f64() * 1e6 / n as f64;
    Ok((us, outs.pop()))
}
