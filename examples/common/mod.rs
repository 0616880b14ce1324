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
        // Colours only on a terminal: a log written to a file or through a launcher's pipe
        // stays plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

/// Runs `f` on every rank of a world of `n`, each on a thread of its own; returns what each
/// returned (its lines, in most examples), in rank order.
pub(crate) fn per_rank<T: Send + 'static>(
    n: usize,
    f: impl Fn(Communicator) -> Result<T> + Clone + Send + 'static,
) -> Result<Vec<T>> {
    init_tracing();
    let world = World::local(n)?;
    let threads: Vec<_> = world
        .communicators()
        .iter()
        .cloned()
        .map(|c| {
            let f = f.clone();
            std::thread::spawn(move || f(c))
        })
        .collect();
    let mut out = Vec::new();
    for t in threads {
        out.push(t.join().map_err(|_| Error::Shutdown)??);
    }
    world.shutdown()?;
    Ok(out)
}

/// Whether this process was started as one rank of a multi-process job (by
/// `collectix launch`, torchrun, `mpirun`, `mpiexec`, `srun` or a Kubernetes job: any
/// launcher of `docs/deployment.md`'s table): then it joins the job with `collectix::init`
/// instead of starting its own world.
pub(crate) fn launched() -> bool {
    collectix::Launcher::detect().is_some()
}

/// Joins the job this process was launched into (its environment says how), waiting up to
/// 2 minutes for the others.
pub(crate) fn join() -> Result<collectix::Process> {
    collectix::init(
        &collectix::InitArgs::default(),
        collectix::GroupOptions::default(),
        std::time::Duration::from_secs(120),
    )
}

/// xorshift64*: the same numbers on every rank and in every run (the training examples'
/// data and initial weights).
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    /// Uniform in [-1, 1).
    pub(crate) fn next(&mut self) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let bits = self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 40; // 24 bits
        bits as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// As one rank of a launched job: joins it, runs `f` on this rank's communicator, prints its
/// lines, and leaves in order.
pub(crate) fn run_launched(f: fn(Communicator) -> Result<Vec<String>>) -> Result<()> {
    init_tracing();
    let p = join()?;
    let lines = f(p.communicator().clone())?;
    print(&lines);
    p.shutdown()
}

/// Prints lines.
pub(crate) fn print(lines: &[String]) {
    for l in lines {
        println!("{l}");
    }
}

/// What the examples' `main` returns: on an error, `Error: ` and the error's text, as
/// `docs/errors.md` shows it ("no store at 127.0.0.1:29500 after 120 s: …"), in one write,
/// and exit status 1. (Rust's own report of an `Err` from `main` writes `Error: ` and the
/// value apart: the ranks of a job share one stderr, and another rank's line came between
/// the two, "Error: Error: store: …".)
pub(crate) struct Main(pub(crate) Result<()>);

impl std::process::Termination for Main {
    fn report(self) -> std::process::ExitCode {
        match self.0 {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                use std::io::Write;
                let line = format!("Error: {e}\n");
                let _ = std::io::stderr().lock().write_all(line.as_bytes());
                std::process::ExitCode::FAILURE
            }
        }
    }
}
