//! `collectix doctor`: a preflight check of a job's links and settings. It launches a job of
//! its own on this host (`--nproc-per-node`, as `collectix launch` does) whose ranks run
//! `collectix doctor --rank` (`collectix::doctor`): every pair of ranks exchanges data both
//! ways on the transport it uses, every rank's settings are compared, and rank 0 prints the
//! latency and bandwidth matrices and the findings. Under another launcher (torchrun,
//! `mpirun`, Slurm), run `collectix doctor --rank` as the job's program.

use std::process::ExitCode;
use std::time::Duration;

/// `collectix doctor`'s arguments.
#[derive(clap::Args, Debug)]
pub(crate) struct DoctorArgs {
    /// Processes to check on this host (a job of its own, as `collectix launch` starts).
    #[arg(long = "nproc-per-node", default_value_t = 2)]
    nproc_per_node: usize,
    /// The store's host.
    #[arg(long = "master-addr", default_value = "127.0.0.1")]
    master_addr: String,
    /// The store's port (0: any free one).
    #[arg(long = "master-port", default_value_t = 0)]
    master_port: u16,
    /// Bytes each rank of a pair sends the other (bandwidth).
    #[arg(long, default_value_t = 1 << 20)]
    bytes: usize,
    /// Checks in a row, `--interval-ms` apart (a link that fails later shows in a later one).
    #[arg(long, default_value_t = 1)]
    passes: u64,
    /// Milliseconds between the starts of two checks.
    #[arg(long = "interval-ms", default_value_t = 2000)]
    interval_ms: u64,
    /// Milliseconds per round of pairs (default: 1200 shared among the rounds, at least 40).
    #[arg(long = "slot-ms")]
    slot_ms: Option<u64>,
    /// Run as one rank of the job (the launcher's environment says which).
    #[arg(long)]
    rank: bool,
}

/// Launches the check, or runs one rank of it.
pub(crate) fn run(a: &DoctorArgs) -> ExitCode {
    if a.rank {
        return match rank(a) {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => ExitCode::from(1),
            Err(e) => {
                eprintln!("collectix doctor: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let exe = match std::env::current_exe() {
        Ok(p) => p.to_string_lossy().into_owned(),
        Err(e) => {
            eprintln!("collectix doctor: cannot find this program: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut program = vec![
        exe,
        "doctor".to_string(),
        "--rank".to_string(),
        format!("--bytes={}", a.bytes),
        format!("--passes={}", a.passes),
        format!("--interval-ms={}", a.interval_ms),
    ];
    if let Some(s) = a.slot_ms {
        program.push(format!("--slot-ms={s}"));
    }
    let launch = crate::launch::LaunchArgs::local(
        a.nproc_per_node,
        a.master_addr.clone(),
        a.master_port,
        program,
    );
    ExitCode::from(crate::launch::run(&launch))
}

/// One rank: joins the job, checks it `passes` times; rank 0 prints each report. `false`
/// when a check found something.
fn rank(a: &DoctorArgs) -> collectix::Result<bool> {
    let p = collectix::init(
        &collectix::InitArgs::default(),
        collectix::GroupOptions::default(),
        Duration::from_secs(60),
    )?;
    let mut clean = true;
    let start = std::time::Instant::now();
    for pass in 0..a.passes {
        let at = start + Duration::from_millis(a.interval_ms.saturating_mul(pass));
        std::thread::sleep(at.saturating_duration_since(std::time::Instant::now()));
        let o = collectix::doctor::DoctorOptions {
            bytes: a.bytes,
            slot: a.slot_ms.map(Duration::from_millis),
            pass,
            ..collectix::doctor::DoctorOptions::default()
        };
        if let Some(report) = collectix::doctor::doctor(&p, &o)? {
            if a.passes > 1 {
                println!("check {} of {}:", pass + 1, a.passes);
            }
            println!("{report}");
            clean &= report.findings.is_empty();
        }
    }
    // Rank 0 judged from the store; the others are done once they wrote. A rank that cannot
    // leave in order (a peer it cannot reach) does not change the verdict.
    let _ = p.shutdown();
    Ok(clean)
}
