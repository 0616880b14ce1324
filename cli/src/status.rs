//! `collectix status`: asks every rank of a running job, through its store, for its flight
//! record (its last calls), prints each rank's last calls and says which rank is behind in
//! which call (torch's flight recorder and desync debug, on demand).

use std::process::ExitCode;
use std::time::Duration;

/// `collectix status`'s arguments.
#[derive(clap::Args)]
pub(crate) struct StatusArgs {
    /// The store's host (the job's `MASTER_ADDR`).
    #[arg(long = "master-addr", default_value = "127.0.0.1")]
    master_addr: String,
    /// The store's port (the job's `MASTER_PORT`).
    #[arg(long = "master-port", default_value_t = 29500)]
    master_port: u16,
    /// Calls shown per rank (the most recent).
    #[arg(long, default_value_t = 8)]
    calls: usize,
    /// How long to wait for the ranks' answers, in milliseconds.
    #[arg(long = "wait-ms", default_value_t = 1000)]
    wait_ms: u64,
    /// The store speaks torch's TCPStore protocol (a job under torchrun, or one whose ranks
    /// were told `COLLECTIX_STORE_PROTOCOL=torch`).
    #[arg(long)]
    torch: bool,
    /// Under torchrun, the job's attempt (its `TORCHELASTIC_RESTART_COUNT`: 0 until torchrun
    /// restarted it).
    #[arg(long, default_value_t = 0)]
    attempt: u32,
    /// One verdict per rank and group instead of the calls: healthy, slow, stuck, on a wait
    /// cycle, mismatch, failed or dead.
    #[arg(long)]
    explain: bool,
    /// With `--explain`: a call in flight this long (milliseconds) is stuck.
    #[arg(long = "stuck-ms", default_value_t = 1000)]
    stuck_ms: u64,
}

/// Prints the job's status; fails when the store cannot be reached.
pub(crate) fn run(a: &StatusArgs) -> ExitCode {
    match status(a) {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("collectix status: {e}");
            ExitCode::FAILURE
        }
    }
}

fn status(a: &StatusArgs) -> collectix::Result<String> {
    use collectix::Store;
    let security = collectix::Security::from_env()?;
    let host = if a.master_addr.contains(':') {
        format!("[{}]:{}", a.master_addr, a.master_port)
    } else {
        format!("{}:{}", a.master_addr, a.master_port)
    };
    let wait = Duration::from_secs(5);
    let store: std::sync::Arc<dyn Store> = if a.torch {
        std::sync::Arc::new(collectix::TorchStore::connect(host, wait)?)
    } else {
        std::sync::Arc::new(collectix::TcpStore::connect_secured(host, wait, security)?)
    };
    let store: std::sync::Arc<dyn Store> = match a.attempt {
        0 => store,
        n => std::sync::Arc::new(collectix::PrefixStore::new(
            format!("worker/attempt_{n}"),
            store,
        )),
    };
    // The job's size, as its first rank recorded it ("W R").
    let said = store.get("world_size", Duration::from_secs(1))?;
    let world = String::from_utf8_lossy(&said)
        .split(' ')
        .next()
        .and_then(|w| w.parse::<usize>().ok())
        .ok_or_else(|| collectix::Error::Store("the store holds no world size".into()))?;
    let s = collectix::job_status(&store, world, Duration::from_millis(a.wait_ms))?;
    let mut out = String::new();
    if a.explain {
        for v in s.explain(Duration::from_millis(a.stuck_ms)) {
            out.push_str(&format!("{v}\n"));
        }
        return Ok(out);
    }
    for r in &s.ranks {
        match &r.calls {
            Some(calls) => {
                out.push_str(&format!(
                    "rank {}: last {} calls\n",
                    r.rank,
                    calls.len().min(a.calls)
                ));
                for line in &calls[calls.len().saturating_sub(a.calls)..] {
                    // "GROUP SEQ STATE STARTED_MS OP text": the text is the line shown.
                    let text = line.splitn(6, ' ').nth(5).unwrap_or(line);
                    out.push_str(&format!("  {text}\n"));
                }
            }
            None => out.push_str(&format!("rank {}: no answer\n", r.rank)),
        }
    }
    if s.findings.is_empty() {
        out.push_str("every rank answered, and none is behind another\n");
    } else {
        for f in &s.findings {
            out.push_str(&format!("{f}\n"));
        }
    }
    Ok(out)
}
