//! `--transport tcp` or `shm` started by hand: the bench starts its ranks as processes of its own.

use super::args::Args;
use std::process::{Child, ExitCode, Stdio};

/// `--transport tcp` or `shm` started by hand: runs `--ranks` processes of this program as the job's
/// ranks (torchrun's variables, a free port, a fresh secret); rank 0's output is this one's.
pub(super) fn spawn_ranks(a: &Args) -> ExitCode {
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("collectix: cannot find this program to start its ranks: {e}");
            return ExitCode::FAILURE;
        }
    };
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_or(29_500, |a| a.port());
    let secret = match collectix::Secret::random_text() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("collectix: {e}");
            return ExitCode::FAILURE;
        }
    };
    let w = a.ranks.max(1);
    let mut children = Vec::with_capacity(w);
    for r in 0..w {
        match start_rank(&exe, r, w, port, &secret) {
            Ok(c) => children.push(c),
            Err(e) => {
                eprintln!("collectix: cannot start rank {r}: {e}");
                for mut c in children {
                    let _ = c.kill();
                    let _ = c.wait();
                }
                return ExitCode::FAILURE;
            }
        }
    }
    let mut ok = true;
    for (r, mut c) in children.into_iter().enumerate() {
        match c.wait() {
            Ok(s) if s.success() => {}
            other => {
                eprintln!("collectix: bench rank {r} ended with {other:?}");
                ok = false;
            }
        }
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Starts `exe`, with this process's arguments, as rank `r` of `w` (the store on `port`,
/// the job's `secret`); only rank 0's stdout is kept.
fn start_rank(
    exe: &std::path::Path,
    r: usize,
    w: usize,
    port: u16,
    secret: &str,
) -> std::io::Result<Child> {
    std::process::Command::new(exe)
        .args(std::env::args_os().skip(1))
        .env("RANK", r.to_string())
        .env("WORLD_SIZE", w.to_string())
        .env("LOCAL_RANK", r.to_string())
        .env("LOCAL_WORLD_SIZE", w.to_string())
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string())
        .env("COLLECTIX_SECRET", secret)
        .env_remove("COLLECTIX_SECRET_FILE")
        .stdout(if r == 0 {
            Stdio::inherit()
        } else {
            Stdio::null()
        })
        .spawn()
}
