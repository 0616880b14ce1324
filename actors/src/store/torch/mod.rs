//! torch's own store protocol: [`TorchStore`], a client of torch's `TCPStore` (torchrun's
//! agent store, or a Python process's `TCPStore(is_master=True)`), and the serving of torch's
//! clients by a [`TcpStoreServer`](super::TcpStoreServer) that allows them (`serve.rs`).
//!
//! torch's protocol has no authentication: whoever reaches the port reads and writes every
//! key. collectix's own protocol (`store/tcp.rs`, with the job's secret) stays the default;
//! this one is chosen by `COLLECTIX_STORE_PROTOCOL=torch` or [`StoreProtocol::Torch`], and
//! under torchrun, whose agent serves torch's store (see `docs/deployment.md`).
//!
//! Like torch's own client, [`TorchStore`] puts `/` in front of every key, so a key set from
//! Rust is the key a Python client of the same store reads.

mod serve;
pub(crate) mod wire;

pub(crate) use serve::serve;

use super::Store;
use crate::sync::lock;
use collectix_runtime::{Error, Result};
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Mutex;
use std::time::Duration;
use wire::{kind, Out};

/// Which protocol a job's ranks speak to its TCP store.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StoreProtocol {
    /// collectix's own, authenticated with the job's secret (the default).
    #[default]
    Collectix,
    /// torch's `TCPStore` protocol (torchrun's agent store, a Python process's store): no
    /// authentication.
    Torch,
}

impl StoreProtocol {
    /// From `COLLECTIX_STORE_PROTOCOL` (`collectix` or `torch`); `None` when unset.
    pub fn from_env() -> Result<Option<StoreProtocol>> {
        match std::env::var("COLLECTIX_STORE_PROTOCOL") {
            Err(_) => Ok(None),
            Ok(v) => StoreProtocol::from_word(&v).map(Some),
        }
    }

    /// From its name (`collectix`, `torch`).
    pub fn from_word(w: &str) -> Result<StoreProtocol> {
        match w.trim() {
            "collectix" => Ok(StoreProtocol::Collectix),
            "torch" => Ok(StoreProtocol::Torch),
            other => Err(Error::invalid(format!(
                "COLLECTIX_STORE_PROTOCOL is {other:?}; set it to collectix or torch"
            ))),
        }
    }
}

/// How long a server has to answer a query that does not wait (and the `PING` of a new
/// connection): past it, the connection is taken as broken.
const ANSWER: Duration = Duration::from_secs(30);
/// How long a collectix client's hello may go unanswered before it asks whether the server
/// speaks torch's protocol (a collectix server that is merely slow refuses the question at
/// once, and the hello goes on waiting), and how long that question waits for torch's answer.
pub(crate) const PROBE: Duration = Duration::from_millis(500);
/// How long the server has to answer `CANCEL_WAIT`.
const CANCEL: Duration = Duration::from_secs(5);

/// A client of a store that speaks torch's `TCPStore` protocol: one connection, queries in
/// turn. Keys are sent with a `/` in front, as torch's client sends them. torch's server
/// closes a connection on a query it refuses (an `add` to a value that is not an integer):
/// that query is an error, and the next one opens a new connection.
pub struct TorchStore {
    addr: String,
    conn: Mutex<Option<TcpStream>>,
}

/// How long a connection that broke is tried again.
const RECONNECT: Duration = Duration::from_secs(5);

impl TorchStore {
    /// Connects to torch's store at `addr` (`"host:port"`), retrying until `timeout` while
    /// nobody listens there yet, and checks that it answers torch's `PING`. A server that
    /// closes the connection at torch's hello (a collectix store that does not allow torch's
    /// clients) is an error naming it, at once.
    pub fn connect(addr: impl Into<String>, timeout: Duration) -> Result<TorchStore> {
        let addr = addr.into();
        let conn = open(&addr, timeout)?;
        Ok(TorchStore {
            addr,
            conn: Mutex::new(Some(conn)),
        })
    }

    /// The store's address, as given.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// A broken exchange, as the error it is: which store, which protocol, what it did not
    /// answer.
    fn broken(&self, what: &str, e: &std::io::Error) -> Error {
        let why = match e.kind() {
            ErrorKind::WouldBlock | ErrorKind::TimedOut => "no answer in time".to_string(),
            ErrorKind::UnexpectedEof | ErrorKind::ConnectionReset => {
                "the server closed the connection (torch's server does when it refuses a query)"
                    .to_string()
            }
            _ => e.to_string(),
        };
        Error::Store(format!(
            "torch's store at {} (torch's TCPStore protocol): {what}: {why}",
            self.addr
        ))
    }

    /// Runs `f` on the connection (opened again first if the last one broke); an IO error
    /// breaks it.
    fn with_conn<T>(
        &self,
        what: &str,
        f: impl FnOnce(&mut TcpStream) -> std::io::Result<T>,
    ) -> Result<T> {
        let mut conn = lock(&self.conn);
        let s = match conn.as_mut() {
            Some(s) => s,
            None => conn.insert(open(&self.addr, RECONNECT)?),
        };
        f(s).map_err(|e| {
            *conn = None;
            self.broken(what, &e)
        })
    }

    /// Sends `q` and reads its answer with `read`, within [`ANSWER`].
    fn ask<T>(
        &self,
        what: &str,
        q: Out,
        read: impl FnOnce(&mut TcpStream) -> std::io::Result<T>,
    ) -> Result<T> {
        self.with_conn(what, |s| {
            s.set_read_timeout(Some(ANSWER))?;
            s.write_all(&q.0)?;
            read(s)
        })
    }

    /// `WAIT` for `keys` (with the prefix), for at most `timeout`: whether they came (else
    /// torch's `CANCEL_WAIT` was answered; a `STOP_WAITING` that crossed it counts as come).
    fn wait_keys(&self, keys: &[String], timeout: Duration) -> Result<bool> {
        let q = Out::query(kind::WAIT).keys(keys.iter().map(String::as_str));
        self.with_conn("wait", |s| {
            s.write_all(&q.0)?;
            s.set_read_timeout(Some(timeout.max(Duration::from_millis(1))))?;
            match read_u8(s) {
                Ok(wire::STOP_WAITING) => return Ok(true),
                Ok(b) => return Err(odd("wait", b)),
                Err(e) if !matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    return Err(e)
                }
                Err(_) => {}
            }
            // Out of time: torch's cancel, answered by WAIT_CANCELED (after a STOP_WAITING
            // that crossed it, if the keys came meanwhile).
            s.set_read_timeout(Some(CANCEL))?;
            s.write_all(&[kind::CANCEL_WAIT])?;
            let mut b = read_u8(s)?;
            let came = b == wire::STOP_WAITING;
            if came {
                b = read_u8(s)?;
            }
            if b != wire::WAIT_CANCELED {
                return Err(odd("cancel a wait", b));
            }
            Ok(came)
        })
    }
}

/// An answer torch's protocol does not give, as an error that breaks the connection.
fn odd(what: &str, b: u8) -> std::io::Error {
    std::io::Error::new(
        ErrorKind::InvalidData,
        format!("answered {what} with {b}, which torch's TCPStore protocol does not"),
    )
}

/// A connection to torch's store at `addr`, its hello answered, tried until `timeout` while
/// nobody listens there yet.
fn open(addr: &str, timeout: Duration) -> Result<TcpStream> {
    super::dial(addr, timeout, "torch's store", |s, _| {
        hello(s, ANSWER).map_err(|why| Error::Store(format!("torch's store at {addr}: {why}")))
    })
}

/// A key as torch's client sends it.
fn key(k: &str) -> String {
    format!("/{k}")
}

/// torch's hello on a fresh connection: `VALIDATE` and a `PING`, in one write (a server reads
/// them as one); the echo within `answer`.
fn hello(mut s: TcpStream, answer: Duration) -> std::result::Result<TcpStream, String> {
    let _ = s.set_nodelay(true);
    let nonce = std::process::id() ^ 0x636f_6c6c;
    let mut first = wire::VALIDATE.to_vec();
    first.extend_from_slice(&Out::query(kind::PING).u32(nonce).0);
    s.write_all(&first)
        .map_err(|e| format!("cannot send torch's hello: {e}"))?;
    let _ = s.set_read_timeout(Some(answer));
    let mut echo = [0u8; 4];
    let got = s.read_exact(&mut echo);
    match got {
        Ok(()) if u32::from_le_bytes(echo) == nonce => {
            let _ = s.set_read_timeout(None);
            Ok(s)
        }
        Ok(()) => Err(format!(
            "answered torch's PING with {:02x?}, not its nonce: not torch's TCPStore protocol",
            echo
        )),
        Err(e)
            if matches!(
                e.kind(),
                ErrorKind::UnexpectedEof
                    | ErrorKind::ConnectionReset
                    | ErrorKind::ConnectionAborted
            ) =>
        {
            Err(
                "closed the connection at torch's hello: it does not speak torch's TCPStore \
                 protocol (a collectix store speaks its own unless it allows torch's clients; \
                 set COLLECTIX_STORE_PROTOCOL=collectix to speak collectix's)"
                    .into(),
            )
        }
        Err(e) => Err(format!("no answer to torch's PING: {e}")),
    }
}

/// Whether the server at `addr` answers torch's hello within [`PROBE`] (asked on a
/// connection of its own, when a collectix client's challenge went unanswered).
pub(crate) fn speaks_torch(addr: SocketAddr) -> bool {
    TcpStream::connect_timeout(&addr, PROBE)
        .ok()
        .is_some_and(|s| hello(s, PROBE).is_ok())
}

fn read_u8(s: &mut impl Read) -> std::io::Result<u8> {
    let mut b = [0u8; 1];
    s.read_exact(&mut b)?;
    Ok(b[0])
}

fn read_i64(s: &mut impl Read) -> std::io::Result<i64> {
    let mut b = [0u8; 8];
    s.read_exact(&mut b)?;
    Ok(i64::from_le_bytes(b))
}

/// A value: its length (checked before anything is allocated), then its bytes.
fn read_bytes(s: &mut impl Read) -> std::io::Result<Vec<u8>> {
    let n = read_i64(s)? as u64;
    match usize::try_from(n) {
        Ok(n) if n <= wire::MAX_VALUE => {
            let mut v = vec![0u8; n];
            s.read_exact(&mut v)?;
            Ok(v)
        }
        _ => Err(std::io::Error::new(
            ErrorKind::InvalidData,
            format!("a value of {n} bytes; at most {}", wire::MAX_VALUE),
        )),
    }
}

impl Store for TorchStore {
    fn set(&self, k: &str, value: Vec<u8>) -> Result<()> {
        let q = Out::query(kind::SET).bytes(key(k).as_bytes()).bytes(&value);
        // No answer: torch's SET has none.
        self.ask("set", q, |_| Ok(()))
    }

    fn get(&self, k: &str, timeout: Duration) -> Result<Vec<u8>> {
        self.wait(&[k], timeout)?;
        let q = Out::query(kind::GET).bytes(key(k).as_bytes());
        self.ask("get", q, read_bytes)
    }

    fn add(&self, k: &str, delta: i64) -> Result<i64> {
        let q = Out::query(kind::ADD).bytes(key(k).as_bytes()).i64(delta);
        self.ask("add", q, read_i64)
    }

    fn compare_set(&self, k: &str, expected: &[u8], desired: Vec<u8>) -> Result<Vec<u8>> {
        let q = Out::query(kind::COMPARE_SET)
            .bytes(key(k).as_bytes())
            .bytes(expected)
            .bytes(&desired);
        self.ask("compare_set", q, read_bytes)
    }

    fn wait(&self, keys: &[&str], timeout: Duration) -> Result<()> {
        let full: Vec<String> = keys.iter().map(|k| key(k)).collect();
        if self.wait_keys(&full, timeout)? {
            return Ok(());
        }
        // Name the keys still missing, not all of them.
        let mut missing = Vec::new();
        for k in keys {
            if !self.check(&[k])? {
                missing.push(*k);
            }
        }
        if missing.is_empty() {
            // They came as the wait ran out.
            return Ok(());
        }
        Err(Error::StoreTimeout {
            what: missing.join(", "),
            waited_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
        })
    }

    fn check(&self, keys: &[&str]) -> Result<bool> {
        let full: Vec<String> = keys.iter().map(|k| key(k)).collect();
        let q = Out::query(kind::CHECK).keys(full.iter().map(String::as_str));
        self.ask("check", q, |s| match read_u8(s)? {
            wire::READY => Ok(true),
            wire::NOT_READY => Ok(false),
            b => Err(odd("check", b)),
        })
    }

    fn delete(&self, k: &str) -> Result<bool> {
        let q = Out::query(kind::DELETE_KEY).bytes(key(k).as_bytes());
        Ok(self.ask("delete_key", q, read_i64)? > 0)
    }

    fn num_keys(&self) -> Result<u64> {
        let n = self.ask("num_keys", Out::query(kind::GETNUMKEYS), read_i64)?;
        u64::try_from(n)
            .map_err(|_| Error::Store(format!("torch's store at {} counts {n} keys", self.addr)))
    }
}

#[cfg(test)]
mod tests;
