//! Starting and stopping 1,000 worlds leaks neither threads nor memory. This file holds a
//! single test so that its counting allocator sees nothing else.

use collectix::{ReduceOp, Tensor, World};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

/// Counts live heap bytes (test-only; the library has no global state).
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as isize, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as isize, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static A: Counting = Counting;

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .map(|d| d.count())
        .unwrap_or(0)
}

fn cycle() {
    let w = World::local(4).unwrap_or_else(|e| panic!("{e}"));
    let works: Vec<_> = w
        .communicators()
        .iter()
        .map(|c| c.all_reduce(Tensor::from_vec(vec![1.0f32; 16]), ReduceOp::Sum))
        .collect();
    for wk in works {
        assert!(wk.wait().is_ok());
    }
    drop(w);
}

/// The threads listed for this process once it has at most `want`, or after ten seconds: a
/// joined thread can stay listed in /proc for a moment while the kernel finishes its exit,
/// and a loaded machine can stretch that moment (a leaked thread never goes).
fn settled(want: usize) -> usize {
    let mut n = threads();
    for _ in 0..1000 {
        if n <= want {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
        n = threads();
    }
    n
}

#[test]
fn a_thousand_worlds_leak_nothing() {
    let before_any = threads();
    for _ in 0..20 {
        cycle();
    }
    // The warm-up's worlds' threads gone (CI once counted one still exiting here, and then
    // one fewer after the thousand worlds than before them).
    let (t0, b0) = (settled(before_any), LIVE.load(Ordering::Relaxed));
    for _ in 0..1000 {
        cycle();
    }
    // CI once saw one still listed right after the last world.
    let t1 = settled(t0);
    let b1 = LIVE.load(Ordering::Relaxed);
    assert_eq!(t1, t0, "threads before/after 1000 worlds");
    // Live bytes may wobble by a few allocator-internal or lazily initialised buffers, but a
    // leak of even one small allocation per world would exceed this.
    assert!(
        b1 - b0 < 16 * 1024,
        "live heap grew by {} bytes over 1000 worlds",
        b1 - b0
    );
    println!("threads {t0} -> {t1}, live heap {b0} -> {b1} bytes");
}
