//! `collectix store`: a TCP store server (the rendezvous of multi-process jobs), serving
//! until the process is interrupted.

use std::process::ExitCode;

/// `collectix store`'s arguments.
#[derive(clap::Args)]
pub(crate) struct StoreArgs {
    /// The port to listen on.
    #[arg(long, default_value_t = 29500)]
    port: u16,
    /// The address to listen on: `::` (every IPv6 and, on a dual-stack host, IPv4 address),
    /// `0.0.0.0`, or one address. Default: `::` with a secret (`COLLECTIX_SECRET` or
    /// `COLLECTIX_SECRET_FILE`) or `COLLECTIX_INSECURE=1`, else `127.0.0.1` (without a secret
    /// the store listens on loopback only).
    #[arg(long)]
    host: Option<String>,
    /// Serve torch's clients too (`torch.distributed.TCPStore(host, port, is_master=False)`),
    /// on the same port, as with `COLLECTIX_STORE_PROTOCOL=torch`. torch's protocol has no
    /// authentication: anyone who reaches the port reads and writes every key.
    #[arg(long)]
    torch: bool,
}

/// Serves until interrupted; returns only when the server cannot start.
pub(crate) fn run(a: StoreArgs) -> ExitCode {
    let security = match collectix::Security::from_env() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("collectix: {e}");
            return ExitCode::FAILURE;
        }
    };
    let host = a.host.unwrap_or_else(|| {
        if security.any_address() {
            "::"
        } else {
            "127.0.0.1"
        }
        .to_string()
    });
    let ip: std::net::IpAddr = match host.parse() {
        Ok(ip) => ip,
        Err(e) => {
            eprintln!("collectix: --host {host}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let torch = match collectix::StoreProtocol::from_env() {
        Ok(p) => a.torch || p == Some(collectix::StoreProtocol::Torch),
        Err(e) => {
            eprintln!("collectix: {e}");
            return ExitCode::FAILURE;
        }
    };
    let server = if torch {
        collectix::TcpStoreServer::open_to_torch((ip, a.port), security)
    } else {
        collectix::TcpStoreServer::bind_secured((ip, a.port), security)
    };
    match server {
        Ok(server) => {
            let also = if torch { " (torch's clients too)" } else { "" };
            println!("collectix store: serving on {}{also}", server.local_addr());
            // Serves until the process is interrupted.
            loop {
                std::thread::park();
            }
        }
        Err(e) => {
            eprintln!("collectix: {e}");
            ExitCode::FAILURE
        }
    }
}
