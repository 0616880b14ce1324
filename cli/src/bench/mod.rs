//! `collectix bench`: nccl-tests' table for one collective over a sweep of sizes, with a
//! correctness check (the method is in the crate's documentation).
//!
//! - `args`: the options, and the sizes of the sweep.
//! - `cell`: one collective at one size: what each rank calls and what it must get back.
//! - `ranks`: the ranks this process drives (threads of an in-process world, or its own rank
//!   of a TCP job), and `spawn`: the processes of a TCP job the bench starts itself.
//! - `measure`: one rank's check, warm-up and samples of a cell.
//! - `run`: the sweep; `report`: the rows, the table, the summary and the files.

mod args;
mod cell;
mod measure;
mod ranks;
mod report;
mod run;
mod spawn;

pub(crate) use args::Args;
use std::process::ExitCode;

/// `collectix bench`: the sweep (or, for `--transport tcp`/`shm` started by hand, the processes
/// that run it), then the files; fails on an error or on wrong results.
pub(crate) fn main(args: &Args) -> ExitCode {
    if args.transport.is_processes() && std::env::var_os("RANK").is_none() {
        return spawn::spawn_ranks(args);
    }
    match run::run(args) {
        Ok(None) => ExitCode::SUCCESS,
        Ok(Some(rows)) => {
            if let Err(e) = report::write_json(args, &rows) {
                eprintln!("collectix: {e}");
                return ExitCode::FAILURE;
            }
            if let Err(e) = report::plot_run(args, &rows) {
                eprintln!("collectix: cannot plot: {e}");
                return ExitCode::FAILURE;
            }
            if rows.iter().any(|r| r.wrong.is_some_and(|w| w > 0)) {
                eprintln!("collectix: wrong results");
                return ExitCode::FAILURE;
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("collectix: {e}");
            ExitCode::FAILURE
        }
    }
}
