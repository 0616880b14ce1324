//! Runs one closure per rank of a 4-rank in-process world on its own thread and collects
//! each rank's output lines, in rank order.
#![allow(dead_code)]

use collectix::{Communicator, Error, Result, World};

/// Runs `f` on every rank; returns each rank's lines, in rank order.
pub(crate) fn per_rank(
    n: usize,
    f: fn(Communicator) -> Result<Vec<String>>,
) -> Result<Vec<Vec<String>>> {
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
    world.shutdown();
    Ok(out)
}

/// Prints lines.
pub(crate) fn print(lines: &[String]) {
    for l in lines {
        println!("{l}");
    }
}
