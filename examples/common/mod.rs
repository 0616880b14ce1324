//! Runs one closure per rank of a 4-rank in-process world on its own thread and collects
//! each rank's output lines, in rank order.
#![allow(dead_code)]

use collectix::{Communicator, Error, Result, World};

/// Logs to stderr what `RUST_LOG` asks for (e.g. `RUST_LOG=collectix=debug`: every call as
/// a span with its outcome and duration, aborts, timeouts and lost peers); nothing without it.
pub(crate) fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .try_init();
}

/// Runs `f` on every rank; returns each rank's lines, in rank order.
pub(crate) fn per_rank(
    n: usize,
    f: fn(Communicator) -> Result<Vec<String>>,
) -> Result<Vec<Vec<String>>> {
    init_tracing();
    let world = World::local(n)?;
    let threads: Vec<_> = world
        .communicators()
        .iter()
        .cloned()
        .map(|c| std::thread::spawn(move || f(c)))
        .collect();
    let mut out = Vec::new();
    for t in threads {
        out.push(t.join().map_err(|_| Error::Shutdown)??);
    }
    world.shutdown()?;
    Ok(out)
}

/// Prints lines.
pub(crate) fn print(lines: &[String]) {
    for l in lines {
        println!("{l}");
    }
}
