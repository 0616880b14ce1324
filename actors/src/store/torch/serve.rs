//! Serving one client of torch's protocol (a Python process's `TCPStore(is_master=False)`, a
//! [`TorchStore`](super::TorchStore)) from a collectix store's table, on the connection's own
//! thread, as `store/tcp.rs` serves collectix's clients.
//!
//! torch's client puts `/` in front of every key; the server takes it off, so a key a Python
//! client sets as `k` is the key `k` a collectix client reads (a key without it, such as
//! torch's `init/`, stays as it is). A query the table refuses (an `add` to a value that is
//! not an integer) closes the connection, as torch's server does: its protocol has no error
//! answer.

use super::wire::{self, parse, Out, Query};
use crate::store::Table;
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// How often a parked `WAIT` looks for its client's `CANCEL_WAIT` (or its close).
const WAIT_TURN: Duration = Duration::from_millis(50);
/// The most room a connection's buffer keeps between queries.
const KEEP: usize = 1 << 20;

/// A key as the table holds it.
fn strip(k: String) -> String {
    match k.strip_prefix('/') {
        Some(rest) => rest.to_string(),
        None => k,
    }
}

/// What serving a connection ended with.
type Served = std::result::Result<(), String>;

/// Serves the torch client on `s` until it closes or breaks the protocol; its `VALIDATE` must
/// be whole by `deadline`. `owed` counts the queries that change the table, read and not
/// done yet (see `TcpStoreServer::wait_answered`).
pub(crate) fn serve(mut s: TcpStream, table: &Table, owed: &AtomicUsize, deadline: Instant) {
    let peer = s
        .peer_addr()
        .map_or_else(|_| "?".to_string(), |a| a.to_string());
    let _ = s.set_nodelay(true);
    if let Err(why) = run(&mut s, table, owed, deadline) {
        tracing::warn!(client = %peer, reason = %why, "store: torch client dropped");
    }
}

fn run(s: &mut TcpStream, table: &Table, owed: &AtomicUsize, deadline: Instant) -> Served {
    let mut buf: Vec<u8> = Vec::new();
    let mut validated = false;
    loop {
        let (q, used) = match parse(&buf)? {
            Some(q) => q,
            None => {
                let wait = if validated {
                    None
                } else {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err("no VALIDATE in time".into());
                    }
                    Some(left)
                };
                let _ = s.set_read_timeout(wait);
                match fill(s, &mut buf)? {
                    Filled::More => continue,
                    Filled::Closed => return Ok(()),
                    Filled::Quiet => return Err("no VALIDATE in time".into()),
                }
            }
        };
        buf.drain(..used);
        // A large query's room goes once it is read.
        if buf.capacity() > KEEP && buf.len() <= KEEP {
            buf.shrink_to(KEEP);
        }
        match q {
            Query::Validate(m) if !validated && m == wire::MAGIC => {
                validated = true;
                continue;
            }
            Query::Validate(m) if !validated => {
                return Err(format!("VALIDATE with magic {m:#x}, not torch's"))
            }
            _ if !validated => return Err(format!("{q:?} before VALIDATE")),
            _ => {}
        }
        if let Query::Wait { keys } = q {
            wait(s, table, &mut buf, keys.into_iter().map(strip).collect())?;
            continue;
        }
        let changes = q.changes();
        if changes {
            owed.fetch_add(1, Ordering::SeqCst);
        }
        let answer = handle(table, q);
        let written = match &answer {
            Ok(Some(out)) => s
                .write_all(&out.0)
                .map_err(|e| format!("cannot answer: {e}")),
            Ok(None) => Ok(()),
            Err(why) => Err(why.clone()),
        };
        if changes {
            owed.fetch_sub(1, Ordering::SeqCst);
        }
        written?;
    }
}

/// What a read of the connection gave.
enum Filled {
    /// More bytes, in the buffer.
    More,
    /// Nothing within the read timeout.
    Quiet,
    /// The client closed.
    Closed,
}

/// Reads more of the connection into `buf`.
fn fill(s: &mut TcpStream, buf: &mut Vec<u8>) -> std::result::Result<Filled, String> {
    let mut chunk = [0u8; 64 << 10];
    match s.read(&mut chunk) {
        Ok(0) => Ok(Filled::Closed),
        Ok(n) => {
            buf.extend_from_slice(&chunk[..n]);
            Ok(Filled::More)
        }
        Err(e) if e.kind() == ErrorKind::Interrupted => Ok(Filled::More),
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
            Ok(Filled::Quiet)
        }
        Err(e) => Err(e.to_string()),
    }
}

/// The answer to a query that does not wait (`None`: torch's protocol has none for it);
/// `Err` closes the connection.
fn handle(t: &Table, q: Query) -> std::result::Result<Option<Out>, String> {
    let value = |v: Option<Vec<u8>>| Out::default().bytes(&v.unwrap_or_default());
    Ok(match q {
        Query::Validate(_) => return Err("a second VALIDATE".into()),
        Query::Ping(n) => Some(Out::default().u32(n)),
        Query::Set { key, value } => {
            t.set(&strip(key), value);
            None
        }
        Query::CompareSet {
            key,
            expected,
            desired,
        } => Some(Out::default().bytes(&t.compare_set(&strip(key), &expected, desired))),
        // A torch client waits for its key first; another that does not gets an empty value
        // for a key that is not set, as from torch's own server.
        Query::Get { key } => Some(value(t.value(&strip(key)))),
        Query::Add { key, delta } => {
            let n = t.add(&strip(key), delta).map_err(|e| e.to_string())?;
            Some(Out::default().i64(n))
        }
        Query::Check { keys } => {
            let keys: Vec<String> = keys.into_iter().map(strip).collect();
            let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
            let ready = if t.check(&refs) {
                wire::READY
            } else {
                wire::NOT_READY
            };
            Some(Out::default().u8(ready))
        }
        Query::NumKeys => Some(Out::default().i64(t.num_keys() as i64)),
        Query::Delete { key } => Some(Out::default().i64(i64::from(t.delete(&strip(key))))),
        Query::Append { key, value } => {
            t.append(&strip(key), &value);
            None
        }
        Query::MultiGet { keys } => {
            let mut out = Out::default();
            for k in keys {
                out = out.bytes(&t.value(&strip(k)).unwrap_or_default());
            }
            Some(out)
        }
        Query::MultiSet { pairs } => {
            for (k, v) in pairs {
                t.set(&strip(k), v);
            }
            None
        }
        Query::CancelWait => Some(Out::default().u8(wire::WAIT_CANCELED)),
        Query::Wait { .. } => return Err("a WAIT inside a WAIT".into()),
    })
}

/// A `WAIT`: answered `STOP_WAITING` once every key is set; `WAIT_CANCELED` if the client
/// sends `CANCEL_WAIT` first (torch's client does at its timeout; it may have come in the
/// same read as the `WAIT`, and be in `buf` already). Nothing else may come meanwhile.
fn wait(s: &mut TcpStream, t: &Table, buf: &mut Vec<u8>, keys: Vec<String>) -> Served {
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let _ = s.set_read_timeout(Some(Duration::from_millis(1)));
    loop {
        if let Some((q, used)) = parse(buf)? {
            buf.drain(..used);
            let _ = s.set_read_timeout(None);
            return match q {
                Query::CancelWait => s
                    .write_all(&[wire::WAIT_CANCELED])
                    .map_err(|e| format!("cannot answer CANCEL_WAIT: {e}")),
                other => Err(format!("{other:?} while its WAIT was pending")),
            };
        }
        if t.wait_until(&refs, WAIT_TURN) {
            let _ = s.set_read_timeout(None);
            return s
                .write_all(&[wire::STOP_WAITING])
                .map_err(|e| format!("cannot answer a WAIT: {e}"));
        }
        if let Filled::Closed = fill(s, buf)? {
            return Ok(());
        }
    }
}
