//! No allocation proportional to the data on the caller-buffer path: a counting allocator
//! (every thread of the process: callers, rank actors, transports) measures the bytes
//! allocated per call once the pools are warm, for FSDP's three calls — the in-place
//! all_gather of a flat parameter, reduce_scatter_tensor of its gradient with AVG, and an
//! in-place all_reduce — in one process and over TCP, at two sizes 16× apart. What is left
//! per call is bookkeeping (the call's state, its messages' headers, its handle), the same
//! at both sizes and far below one element per byte of data.
//!
//! One test in this binary: the allocator counts the whole process.

mod common;
use collectix::{Buffer, Communicator, DType, GroupOptions, ReduceOp, Tensor, World};
use common::{free_port, tcp_args};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

struct Counting;

static BYTES: AtomicU64 = AtomicU64::new(0);
static COUNT: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call is forwarded to the system allocator unchanged; the counters are atomics.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        BYTES.fetch_add(layout.size() as u64, Ordering::Relaxed);
        COUNT.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract for `alloc` is passed on as it is.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as for `alloc`.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        BYTES.fetch_add(new_size as u64, Ordering::Relaxed);
        COUNT.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as for `alloc`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

const WARM: usize = 3;
const CALLS: usize = 10;

/// One rank's FSDP step on caller buffers: gather the flat parameter in place, reduce-scatter
/// the gradient (AVG) into the shard, all_reduce a buffer in place. Buffers go round and
/// round; the gradient tensor is made once.
struct Step {
    flat: Option<Buffer>,
    shard: Option<Buffer>,
    sum: Option<Buffer>,
    grad: Tensor,
}

impl Step {
    fn new(c: &Communicator, elems: usize) -> Step {
        let w = c.size();
        let zeros = |n| Buffer::zeros(&[n], DType::F32).unwrap_or_else(|e| panic!("{e}"));
        Step {
            flat: Some(zeros(elems)),
            shard: Some(zeros(elems / w)),
            sum: Some(zeros(elems)),
            grad: Tensor::from_vec(vec![1.0f32; elems]),
        }
    }

    fn run(&mut self, c: &Communicator) -> Result<(), String> {
        let e = |e: collectix::Failed| e.to_string();
        let b = c.buffers();
        let flat = self.flat.take().ok_or("flat")?;
        self.flat = Some(b.all_gather_into_tensor_in_place(flat).wait().map_err(e)?);
        let shard = self.shard.take().ok_or("shard")?;
        let g = self.grad.clone();
        self.shard = Some(
            b.reduce_scatter_tensor(shard, g, ReduceOp::Avg)
                .wait()
                .map_err(e)?,
        );
        let sum = self.sum.take().ok_or("sum")?;
        self.sum = Some(b.all_reduce(sum, ReduceOp::Sum).wait().map_err(e)?);
        Ok(())
    }
}

/// Runs `WARM` then `CALLS` steps on every rank (each on its own thread, in step with a
/// barrier between the phases); the bytes and allocations counted during the `CALLS`.
fn measure(comms: &[Communicator], elems: usize) -> (u64, u64) {
    let barrier = std::sync::Barrier::new(comms.len() + 1);
    std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .map(|c| {
                let barrier = &barrier;
                s.spawn(move || -> Result<(), String> {
                    let mut step = Step::new(c, elems);
                    for _ in 0..WARM {
                        step.run(c)?;
                    }
                    barrier.wait();
                    barrier.wait();
                    for _ in 0..CALLS {
                        step.run(c)?;
                    }
                    barrier.wait();
                    Ok(())
                })
            })
            .collect();
        barrier.wait();
        let (b0, n0) = (BYTES.load(Ordering::SeqCst), COUNT.load(Ordering::SeqCst));
        barrier.wait();
        barrier.wait();
        let (b1, n1) = (BYTES.load(Ordering::SeqCst), COUNT.load(Ordering::SeqCst));
        for h in hs {
            assert_eq!(h.join().unwrap_or_else(|_| Err("panicked".into())), Ok(()));
        }
        (b1 - b0, n1 - n0)
    })
}

fn check(transport: &str, comms: &[Communicator]) {
    let w = comms.len() as u64;
    // Per rank and per call (three calls a step).
    let per_call =
        |(bytes, n): (u64, u64)| (bytes / (w * 3 * CALLS as u64), n / (w * 3 * CALLS as u64));
    let small = per_call(measure(comms, 64 << 10));
    let large = per_call(measure(comms, 1 << 20));
    println!(
        "{transport}: per rank and call, 256 KiB: {} B in {} allocations; 4 MiB: {} B in {} allocations",
        small.0, small.1, large.0, large.1
    );
    // A copy of the data would be 256 KiB and 4 MiB per call. Over TCP a window now and then
    // has one more receive buffer in flight than the warm-up had, and the pool allocates one
    // (a 1 MiB segment: about 17 KiB per call averaged over the window; seen in 1 run of 4):
    // the bound allows that, not a copy per call.
    assert!(small.0 < 64 << 10, "{transport}: {small:?} at 256 KiB");
    assert!(large.0 < 64 << 10, "{transport}: {large:?} at 4 MiB");
}

#[test]
fn the_caller_buffer_path_allocates_nothing_in_proportion_to_the_data() {
    let opts = GroupOptions::default().with_timeout(Duration::from_secs(60));
    let world = World::local_with(2, opts.clone()).unwrap_or_else(|e| panic!("{e}"));
    check("in one process", world.communicators());
    drop(world);

    let port = free_port();
    let procs: Vec<collectix::Process> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|r| {
                let opts = opts.clone();
                s.spawn(move || {
                    let args = tcp_args(port, r, 2, "the buffers_alloc test's secret", false);
                    collectix::init(&args, opts, Duration::from_secs(20))
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| panic!("join panicked"))
                    .unwrap_or_else(|e| panic!("{e}"))
            })
            .collect()
    });
    let comms: Vec<Communicator> = procs.iter().map(|p| p.communicator().clone()).collect();
    check("over TCP", &comms);
}
