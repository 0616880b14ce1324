//! all_reduce on CUDA tensors over NCCL, as nccl-tests prints it: sizes from 1 MiB to 1 GiB
//! (f32, world of one: every rank this process drives is on GPU 0), then the per-call
//! overhead of a 4-byte all_reduce on the NCCL path, on the host path, and of the agreement
//! step alone. `bench/torch_nccl.py` prints the same for torch.distributed.
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

    for in_place in [true, false] {
        println!(
            "# {}",
            if in_place {
                "in place: each call's input moved in (NCCL writes over it, as torch does)"
            } else {
                "out of place: a clone passed, so the result is a new buffer (collectix's value semantics)"
            }
        );
        println!(
            "#{:>12} {:>12} {:>10} {:>11} {:>7}",
            "size(B)", "count", "time(us)", "algbw(GB/s)", "#wrong"
        );
        let mut mib = 1usize;
        while mib <= max_mib {
            let count = mib << 18; // f32 elements
            let iters = (200 / mib).clamp(5, 50);
            let one = Tensor::full(&[count], 1.0f32)?;
            for _ in 0..3 {
                c.all_reduce(one.to_device(gpu)?, ReduceOp::Sum).wait()?;
            }
            let shared = one.to_device(gpu)?;
            let inputs: Vec<Tensor> = (0..iters)
                .map(|_| {
                    if in_place {
                        one.to_device(gpu)
                    } else {
                        Ok(shared.clone())
                    }
                })
                .collect::<collectix::Result<_>>()?;
            let t0 = Instant::now();
            let works: Vec<_> = inputs
                .into_iter()
                .map(|t| c.all_reduce(t, ReduceOp::Sum))
                .collect();
            let mut last = None;
            for w in works {
                last = Some(w.wait()?);
            }
            let us = t0.elapsed().as_secs_f64() * 1e6 / iters as f64;
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
                " {:>12} {:>12} {:>10.1} {:>11.2} {:>7}",
                bytes,
                count,
                us,
                bytes as f64 / us / 1e3,
                wrong
            );
            mib *= 2;
        }
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
