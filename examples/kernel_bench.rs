//! Micro-benchmark of the reduce kernels (not a test): element-wise `a (op) b` into a new
//! buffer, for 16 Ki elements per operand (cache-resident, repeated) and 16 Mi (memory), best
//! of 5. Prints GB/s counted as the bytes read and written (3 × operand size): the small size
//! tells a vectorized loop from a scalar one; the large one includes the page faults of the
//! fresh output buffer. Run with `cargo run --release --example kernel_bench`.

use collectix::runtime::testing::input;
use collectix::{DType, ReduceOp, Tensor};
use std::time::Instant;

fn main() -> collectix::Result<()> {
    println!(
        "{:>9} {:>6} {:>10} {:>8}",
        "dtype", "op", "elements", "GB/s"
    );
    for (n, reps) in [(16 << 10, 2000), (16 << 20, 1)] {
        run(n, reps)?;
    }
    Ok(())
}

fn run(n: usize, reps: usize) -> collectix::Result<()> {
    for (dtype, op) in [
        (DType::F32, ReduceOp::Sum),
        (DType::F32, ReduceOp::Max),
        (DType::F64, ReduceOp::Sum),
        (DType::I32, ReduceOp::Sum),
        (DType::I64, ReduceOp::Product),
        (DType::U8, ReduceOp::BXor),
        (DType::BF16, ReduceOp::Sum),
        (DType::F16, ReduceOp::Sum),
    ] {
        let a = input(dtype, op, 0, 0, n);
        let b = input(dtype, op, 1, 0, n);
        let mut best = f64::MAX;
        for _ in 0..5 {
            let t = Instant::now();
            for _ in 0..reps {
                let r: Tensor =
                    collectix::runtime::tensor::reduce::reference(op, &[a.clone(), b.clone()])?;
                std::hint::black_box(r);
            }
            best = best.min(t.elapsed().as_secs_f64() / reps as f64);
        }
        let bytes = 3.0 * a.nbytes() as f64;
        println!(
            "{:>9} {:>6} {:>10} {:>8.2}",
            dtype.name(),
            op.to_string(),
            n,
            bytes / best / 1e9
        );
    }
    Ok(())
}
