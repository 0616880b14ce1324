//! `collectix`: the command-line tool of collectix. `bench` prints nccl-tests' table for a
//! collective over a size sweep, with a correctness check; `plot` draws `--json` rows; `store`
//! runs a TCP store server for multi-process jobs; `launch` starts a job's processes; `status`
//! asks a running job's ranks for their last calls.
//!
//! ```text
//! collectix bench --collective all_reduce --ranks 4 -b 4 -e 64M -f 4 -c 1
//! collectix bench --device cuda -b 1M -e 1G -f 2          # with --features cuda
//! collectix bench -b 4 -e 64M -f 4 --json now.json --plot now.svg --plot-with before.json
//! collectix plot --out cmp.svg collectix.json mpi.json
//! ```
//!
//! The method is the peers' (`bench/peers/`): a sample is the slowest rank's time for `K`
//! back-to-back blocking calls after a barrier, `K` calibrated so that a sample lasts about
//! `--sample-ms`; the time printed is the median over `-n` samples, with the minimum and the
//! maximum beside it. Sizes follow nccl-tests: for all_gather, gather and all_to_all the size is
//! the full (gathered) size, for reduce_scatter and scatter the full input.

mod bench;
mod doctor;
mod launch;
mod plot;
mod status;
mod store;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "collectix",
    version,
    about = "Collective communication for Rust: tools"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// nccl-tests' table for one collective over a sweep of sizes.
    Bench(bench::Args),
    /// Starts the processes of a job on this host with torchrun's environment, prefixes
    /// their output with their rank, forwards SIGINT/SIGTERM, and stops them all when one
    /// fails.
    Launch(launch::LaunchArgs),
    /// Runs a TCP store server (the rendezvous of multi-process jobs) until interrupted.
    Store(store::StoreArgs),
    /// Asks every rank of a running job (through its store) for its last calls, and says
    /// which rank is behind in which call.
    Status(status::StatusArgs),
    /// Checks a job's links and settings before it runs: every pair of ranks exchanges data
    /// both ways on its transport; prints latency and bandwidth matrices and names a failed
    /// link by pair and a setting that differs by rank and field.
    Doctor(doctor::DoctorArgs),
    /// Draws busbw against size from `--json` files (collectix's, or peers' converted by
    /// `bench/peers/side_by_side.py`) into one SVG.
    Plot(plot::PlotArgs),
    /// How `launch` starts each process (not for direct use): dies with its parent, then
    /// becomes the program.
    #[command(hide = true)]
    Exec(ExecArgs),
}

/// `collectix exec`'s arguments.
#[derive(clap::Args)]
struct ExecArgs {
    /// The launcher's process id.
    #[arg(long)]
    parent: u32,
    /// The program and its arguments (after `--`).
    #[arg(required = true, last = true)]
    program: Vec<String>,
}

/// collectix's warnings on stderr (a client the store dropped, a handshake refused, a lost
/// peer), or what `RUST_LOG` asks for.
fn logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("collectix=warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colours only on a terminal: a log written to a file or through a launcher's pipe
        // stays plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

fn main() -> ExitCode {
    logging();
    match Cli::parse().command {
        Command::Bench(a) => bench::main(&a),
        Command::Launch(a) => ExitCode::from(launch::run(&a)),
        Command::Store(a) => store::run(a),
        Command::Status(a) => status::run(&a),
        Command::Doctor(a) => doctor::run(&a),
        Command::Plot(a) => plot::run(&a),
        Command::Exec(a) => ExitCode::from(launch::exec(a.parent, &a.program)),
    }
}
