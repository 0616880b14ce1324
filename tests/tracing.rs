//! With `tracing` on, each call is a span (rank, group, sequence number, collective, dtype,
//! count, algorithm, bytes) closed with its outcome and duration, and a failure shows as a
//! failed call and an aborted group. This test binary installs a process-wide
//! subscriber that writes into a buffer, so it lives in a file of its own.

use collectix::{ReduceOp, Tensor, World};
use std::io::Write;
use std::sync::{Arc, Mutex};

#[derive(Clone, Default)]
struct Buf(Arc<Mutex<Vec<u8>>>);

impl Write for Buf {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn calls_are_spans_with_their_outcome_and_failures_are_events() {
    let buf = Buf::default();
    let sink = buf.clone();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("collectix=debug"))
        .with_ansi(false)
        .with_writer(move || sink.clone())
        .init();
    let w = World::local(2).unwrap_or_else(|e| panic!("{e}"));
    let c = w.communicators();
    let works: Vec<_> = c
        .iter()
        .map(|c| c.all_reduce(Tensor::from_vec(vec![1.0f32, 2.0]), ReduceOp::Sum))
        .collect();
    for wk in works {
        wk.wait().unwrap_or_else(|e| panic!("{e}"));
    }
    // One on the engine (too large for the board).
    let works: Vec<_> = c
        .iter()
        .map(|c| c.all_reduce(Tensor::from_vec(vec![1.0f32; 64]), ReduceOp::Sum))
        .collect();
    for wk in works {
        wk.wait().unwrap_or_else(|e| panic!("{e}"));
    }
    // A mismatch: rank 0 reduces 2 elements, rank 1 three.
    let a = c[0].all_reduce(Tensor::from_vec(vec![1i64, 2]), ReduceOp::Sum);
    let b = c[1].all_reduce(Tensor::from_vec(vec![1i64, 2, 3]), ReduceOp::Sum);
    assert!(a.wait().is_err() && b.wait().is_err());
    // Both ranks heard of the mismatch from their calls: nothing was swallowed.
    assert_eq!(w.shutdown(), Ok(()));
    // A world dropped with a failure no call returned logs it: the root's broadcast completed
    // early, and only rank 1 saw that the counts differ.
    let w = World::local(2).unwrap_or_else(|e| panic!("{e}"));
    let c = w.communicators();
    assert!(c[0]
        .broadcast(Tensor::from_vec(vec![1i64, 2]), 0)
        .wait()
        .is_ok());
    assert!(c[1]
        .broadcast(Tensor::from_vec(vec![0i64; 3]), 0)
        .wait()
        .is_err());
    drop(w);
    let log = String::from_utf8_lossy(&buf.0.lock().unwrap_or_else(|e| e.into_inner())).to_string();
    for want in [
        "call completed",
        "op=all_reduce",
        "dtype=float32",
        "count=2",
        "bytes=8",
        "seq=0",
        "algorithm=\"board\"",
        "algorithm=\"recursive_doubling\"",
        "count=64",
        "micros=",
        "call failed",
        "group aborted",
        "mismatched calls",
        "pending error at shutdown",
        "swallowed this failure",
    ] {
        assert!(log.contains(want), "no {want:?} in:\n{log}");
    }
}
