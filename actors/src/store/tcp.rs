//! The TCP store: [`TcpStoreServer`] serves a [`Table`] to any number of [`TcpStore`]
//! clients, one thread per connection (a rendezvous has one connection per process, and a
//! `get` or `wait` holds its connection's thread while it waits).
//!
//! Every connection first passes the secret handshake ([`Security`], context `store`): a
//! client without the job's secret is refused before any request of its is read. Without a
//! secret the server listens on loopback only ([`Security::check_bind`]). The one exception
//! is a server open to torch's clients ([`TcpStoreServer::open_to_torch`]): a connection
//! that opens with torch's `VALIDATE` is served in torch's protocol, which has no
//! authentication, at most `MAX_TORCH_CLIENTS` at once.
//!
//! A client that sends something that is not the protocol (a wrong hello, a frame above the
//! limit, bytes that do not decode), or disconnects mid-request, is dropped with a logged
//! reason; the server keeps serving the others. A client reconnects by itself when its
//! connection broke, and repeats the request if it was idempotent (not `add` or
//! `compare_set`, whose effect is then unknown: that is an error saying so).

use super::proto::{self, Failure, FrameError, Request, Response, MAGIC, VERSION};
use super::torch::{self, StoreProtocol};
use super::{Store, Table};
use crate::gate::{Gate, Limits, Pass};
use crate::security::{Denied, Security};
use crate::sync::{lock, ReadUntil};
use collectix_runtime::{Error, Result};
use std::collections::HashMap;
use std::net::{
    IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs,
};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How much longer than a request's own wait a client waits for the answer before it
/// calls the connection broken.
const ANSWER_SLACK: Duration = Duration::from_secs(30);

/// A TCP store server (torch's `TCPStore` with `is_master=True`). It stops when dropped or
/// [`shutdown`](TcpStoreServer::shutdown).
pub struct TcpStoreServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
    conns: Arc<Mutex<HashMap<u64, TcpStream>>>,
    /// Requests that change the table, read and not answered yet (a `set` counts from
    /// before it takes effect until its answer is written; a `wait` or `get`, which may be
    /// held for long and changes nothing, does not count).
    owed: Arc<AtomicUsize>,
}

impl TcpStoreServer {
    /// Listens on `addr` (`"127.0.0.1:29500"`, port 0 for any free port) and starts serving,
    /// without a secret: loopback addresses only (see [`bind_secured`](Self::bind_secured)).
    pub fn bind(addr: impl ToSocketAddrs + std::fmt::Debug) -> Result<TcpStoreServer> {
        TcpStoreServer::bind_secured(addr, Security::loopback_only())
    }

    /// Serves a job's store on `port`, as its rank 0 or its launcher does: on every address
    /// when `security` has a secret (or is insecure), else on the loopback address `host`
    /// names (any other is refused: [`Security::check_bind`]).
    ///
    /// With [`StoreProtocol::Torch`] it serves torch's clients too (as
    /// [`open_to_torch`](Self::open_to_torch)).
    pub fn for_job(
        host: &str,
        port: u16,
        security: &Security,
        protocol: StoreProtocol,
    ) -> Result<TcpStoreServer> {
        let torch = protocol == StoreProtocol::Torch;
        let bind = |addr: SocketAddr| {
            TcpStoreServer::bind_with(addr, security.clone(), Limits::default(), torch)
        };
        if security.any_address() {
            return bind((Ipv6Addr::UNSPECIFIED, port).into())
                .or_else(|_| bind((Ipv4Addr::UNSPECIFIED, port).into()));
        }
        let ip = crate::addr::resolve_ip(host).unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
        bind((ip, port).into())
    }

    /// [`bind_secured`](Self::bind_secured) that also serves clients of torch's `TCPStore`
    /// protocol (a Python process's `TCPStore(host, port, is_master=False)`), on the same
    /// port: a connection that opens with torch's `VALIDATE` is served as torch's server
    /// serves it, from the same keys (torch's `/` in front of each key taken off).
    ///
    /// torch's protocol has no authentication: anyone who reaches the port reads and writes
    /// every key, whatever `security` says of collectix's own clients. Give it an address
    /// only trusted hosts reach.
    pub fn open_to_torch(
        addr: impl ToSocketAddrs + std::fmt::Debug,
        security: Security,
    ) -> Result<TcpStoreServer> {
        TcpStoreServer::bind_with(addr, security, Limits::default(), true)
    }

    /// Listens on `addr` (`"0.0.0.0:29500"`, `"[::]:29500"`, port 0 for any free port) and
    /// starts serving clients that pass `security`'s handshake. An address beyond loopback
    /// needs a secret, or [`Security::insecure`].
    pub fn bind_secured(
        addr: impl ToSocketAddrs + std::fmt::Debug,
        security: Security,
    ) -> Result<TcpStoreServer> {
        TcpStoreServer::bind_with(addr, security, Limits::default(), false)
    }

    /// [`bind_secured`](Self::bind_secured) with the gate's `limits` (tests shorten the
    /// handshake's deadline), serving torch's clients too if `torch`.
    fn bind_with(
        addr: impl ToSocketAddrs + std::fmt::Debug,
        security: Security,
        limits: Limits,
        torch: bool,
    ) -> Result<TcpStoreServer> {
        for a in addr
            .to_socket_addrs()
            .map_err(|e| Error::Store(format!("cannot resolve {addr:?}: {e}")))?
        {
            security.check_bind(a.ip(), "the store")?;
            if torch && !a.ip().is_loopback() {
                tracing::warn!(
                    addr = %a,
                    "the store serves torch's clients, whose protocol has no authentication: \
                     anyone who reaches this address reads and writes every key"
                );
            }
        }
        let listener = TcpListener::bind(&addr)
            .map_err(|e| Error::Store(format!("cannot listen on {addr:?}: {e}")))?;
        let local = listener
            .local_addr()
            .map_err(|e| Error::Store(format!("no local address: {e}")))?;
        let stop = Arc::new(AtomicBool::new(false));
        let conns: Arc<Mutex<HashMap<u64, TcpStream>>> = Arc::default();
        let table = Arc::new(Table::default());
        let owed = Arc::new(AtomicUsize::new(0));
        let gate = gate_for(table, owed.clone(), conns.clone(), security, limits, torch)
            .map_err(|e| Error::Resource(format!("cannot start the store's gate: {e}")))?;
        let s = stop.clone();
        let accept = std::thread::Builder::new()
            .name("collectix-store".into())
            .spawn(move || accept_loop(listener, s, gate))
            .map_err(|e| Error::Resource(format!("cannot start the store's thread: {e}")))?;
        tracing::debug!(addr = %local, "store serving");
        Ok(TcpStoreServer {
            addr: local,
            stop,
            accept: Some(accept),
            conns,
            owed,
        })
    }

    /// The address it listens on (with the port chosen, if 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// An address a client on this host can connect to: the listening address, with a
    /// wildcard (`0.0.0.0`, `::`) replaced by the loopback of its family.
    pub fn connect_addr(&self) -> SocketAddr {
        let mut a = self.addr;
        if a.ip().is_unspecified() {
            a.set_ip(if a.is_ipv4() {
                std::net::Ipv4Addr::LOCALHOST.into()
            } else {
                std::net::Ipv6Addr::LOCALHOST.into()
            });
        }
        a
    }

    /// Clients connected now.
    pub fn clients(&self) -> usize {
        lock(&self.conns).len()
    }

    /// Waits until no client is connected, for at most `within`; whether none is. (A rank
    /// that serves the store and is about to stop gives the others the time to finish
    /// with it.)
    pub fn wait_idle(&self, within: Duration) -> bool {
        let deadline = crate::sync::deadline_after(within);
        while self.clients() > 0 {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        true
    }

    /// Waits until every request that changed the table so far has its answer written, for
    /// at most `within`; whether every one has. A rank that serves the store and saw the others' last keys
    /// (`set` by them) calls this before it stops: the effect of a `set` is seen before its
    /// answer leaves, and a client whose answer is cut off by the close would retry, find
    /// nobody listening, and wait out its connect timeout.
    pub fn wait_answered(&self, within: Duration) -> bool {
        let deadline = crate::sync::deadline_after(within);
        while self.owed.load(Ordering::SeqCst) > 0 {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        true
    }

    /// Stops listening and closes every connection.
    pub fn shutdown(mut self) {
        self.stop_now();
    }

    fn stop_now(&mut self) {
        if self.stop.swap(true, Ordering::SeqCst) {
            return;
        }
        if let Some(t) = self.accept.take() {
            crate::sync::wake_acceptor(t, self.connect_addr(), "the store's acceptor");
        }
        for (_, c) in lock(&self.conns).drain() {
            let _ = c.shutdown(Shutdown::Both);
        }
    }
}

impl Drop for TcpStoreServer {
    fn drop(&mut self) {
        self.stop_now();
    }
}

/// The store's gate: a client that passes the handshake gets a thread that reads its hello
/// (by the deadline the gate gives) and serves it; with `torch`, a client of torch's
/// protocol gets one that serves it so.
fn gate_for(
    table: Arc<Table>,
    owed: Arc<AtomicUsize>,
    conns: Arc<Mutex<HashMap<u64, TcpStream>>>,
    security: Security,
    limits: Limits,
    torch: bool,
) -> std::io::Result<Gate> {
    let next = Arc::new(AtomicU64::new(0));
    // `cap`: the most connections served so at once (torch's clients, which no handshake
    // vouches for); past it a newcomer is closed.
    let pass_with = |serve_it: fn(TcpStream, &Table, &AtomicUsize, Instant), cap: usize| -> Pass {
        let (table, owed, conns, next) = (table.clone(), owed.clone(), conns.clone(), next.clone());
        let live = Arc::new(AtomicUsize::new(0));
        Box::new(move |stream, deadline| {
            if live.load(Ordering::SeqCst) >= cap {
                tracing::warn!(
                    cap,
                    "store: too many torch clients at once; closing a newcomer"
                );
                let _ = stream.shutdown(Shutdown::Both);
                return;
            }
            let id = next.fetch_add(1, Ordering::Relaxed);
            let (table, owed) = (table.clone(), owed.clone());
            let counted = Counted::new(&live);
            start_conn(
                stream,
                id,
                &conns,
                move |s| {
                    let _counted = counted;
                    serve_it(s, &table, &owed, deadline);
                },
                |job| {
                    std::thread::Builder::new()
                        .name("collectix-store-conn".into())
                        .spawn(job)
                        .map(drop)
                },
            );
        })
    };
    Gate::start_with(
        "collectix-store-gate",
        "the store",
        security,
        b"store",
        pass_with(serve, usize::MAX),
        torch.then(|| pass_with(super::torch::serve, MAX_TORCH_CLIENTS)),
        limits,
    )
}

/// The most clients of torch's protocol a store serves at once.
pub(crate) const MAX_TORCH_CLIENTS: usize = 1024;

/// One in a count of live connections, until dropped (with its connection's job, whether
/// that ran or not).
struct Counted(Arc<AtomicUsize>);

impl Counted {
    fn new(live: &Arc<AtomicUsize>) -> Counted {
        live.fetch_add(1, Ordering::SeqCst);
        Counted(live.clone())
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Accepts connections and hands them to the gate, until `stop`; the gate (and the
/// connections still in it) goes with it.
fn accept_loop(listener: TcpListener, stop: Arc<AtomicBool>, gate: Gate) {
    for stream in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        match stream {
            Ok(s) => gate.admit(s),
            Err(e) => {
                tracing::warn!(error = %e, "store: accept failed");
                // Out of descriptors, say: not a busy loop.
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

/// A connection's job on its thread.
type ConnJob = Box<dyn FnOnce() + Send>;

/// Registers `stream` as connection `id` (so that stopping the server closes it) and starts
/// `serve_it` on it with `spawn`. When no thread can be started, the connection is closed at
/// once and forgotten: its client sees the close instead of waiting out its timeout, and no
/// socket is left in CLOSE_WAIT.
fn start_conn(
    stream: TcpStream,
    id: u64,
    conns: &Arc<Mutex<HashMap<u64, TcpStream>>>,
    serve_it: impl FnOnce(TcpStream) + Send + 'static,
    spawn: impl FnOnce(ConnJob) -> std::io::Result<()>,
) {
    if let Ok(c) = stream.try_clone() {
        lock(conns).insert(id, c);
    }
    let mine = conns.clone();
    let job: ConnJob = Box::new(move || {
        serve_it(stream);
        lock(&mine).remove(&id);
    });
    if let Err(e) = spawn(job) {
        tracing::warn!(error = %e, "store: cannot start a connection's thread; closing it");
        if let Some(c) = lock(conns).remove(&id) {
            let _ = c.shutdown(Shutdown::Both);
        }
    }
}

/// Serves one client that passed the handshake, until it closes or breaks the protocol; its
/// hello must come by `deadline`. `owed` counts the requests that change the table, read and
/// not answered yet.
fn serve(mut s: TcpStream, table: &Table, owed: &AtomicUsize, deadline: Instant) {
    let peer = s
        .peer_addr()
        .map_or_else(|_| "?".to_string(), |a| a.to_string());
    let _ = s.set_nodelay(true);
    let drop_client = |why: String| {
        tracing::warn!(client = %peer, reason = %why, "store: client dropped");
    };
    // The hello by the gate's deadline: a silent or trickling client holds nothing for long.
    let hello = proto::read::<Request>(&mut ReadUntil::new(&mut s, deadline));
    match hello {
        Ok(Some(Request::Hello { magic, version })) if magic == MAGIC && version == VERSION => {
            let _ = s.set_read_timeout(None);
            if proto::write(&mut s, &Response::Done).is_err() {
                return;
            }
        }
        Ok(Some(Request::Hello { magic, version })) if magic == MAGIC => {
            let why = format!("store protocol version {version}; this server speaks {VERSION}");
            let _ = proto::write(&mut s, &Response::Failed(Failure::Invalid(why.clone())));
            return drop_client(why);
        }
        Ok(Some(other)) => return drop_client(format!("{other:?} before the hello")),
        Ok(None) => return,
        Err(e) => return drop_client(e.to_string()),
    }
    loop {
        let req = match proto::read::<Request>(&mut s) {
            Ok(Some(r)) => r,
            Ok(None) => return,
            Err(FrameError::Io(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                return drop_client("closed in the middle of a request".into())
            }
            Err(e) => return drop_client(e.to_string()),
        };
        let changes = req.changes();
        if changes {
            owed.fetch_add(1, Ordering::SeqCst);
        }
        let answer = handle(table, req);
        let written = proto::write(&mut s, &answer);
        if changes {
            owed.fetch_sub(1, Ordering::SeqCst);
        }
        if let Err(e) = written {
            return drop_client(format!("cannot answer: {e}"));
        }
    }
}

pub(crate) fn handle(t: &Table, req: Request) -> Response {
    let ms = Duration::from_millis;
    let failed = |e: Error| Response::Failed(Failure::from(e));
    match req {
        Request::Hello { .. } => Response::Failed(Failure::Invalid("a second hello".into())),
        Request::Set { key, value } => {
            t.set(&key, value);
            Response::Done
        }
        Request::Get { key, timeout_ms } => t
            .get(&key, ms(timeout_ms))
            .map_or_else(failed, Response::Value),
        Request::Add { key, delta } => t.add(&key, delta).map_or_else(failed, Response::Int),
        Request::CompareSet {
            key,
            expected,
            desired,
        } => Response::Value(t.compare_set(&key, &expected, desired)),
        Request::Wait { keys, timeout_ms } => {
            let k: Vec<&str> = keys.iter().map(String::as_str).collect();
            t.wait(&k, ms(timeout_ms))
                .map_or_else(failed, |()| Response::Done)
        }
        Request::Check { keys } => {
            let k: Vec<&str> = keys.iter().map(String::as_str).collect();
            Response::Bool(t.check(&k))
        }
        Request::Delete { key } => Response::Bool(t.delete(&key)),
        Request::NumKeys => Response::Count(t.num_keys()),
    }
}

/// A client of a [`TcpStoreServer`] (torch's `TCPStore` with `is_master=False`): one
/// connection, made (and remade after a break) within the connect timeout, so that clients
/// may start before the server. `Send + Sync`; requests from several threads take turns.
pub struct TcpStore {
    addr: String,
    /// How long a connection that broke is tried again (the connect timeout, unless set
    /// with [`reconnect_within`](Self::reconnect_within)).
    reconnect_timeout: Duration,
    security: Security,
    conn: Mutex<Option<TcpStream>>,
}

impl TcpStore {
    /// Connects to the server at `addr` (`"host:port"`; names resolve to IPv4 or IPv6),
    /// retrying until `timeout` while the server is not up yet; without a secret.
    pub fn connect(addr: impl Into<String>, timeout: Duration) -> Result<TcpStore> {
        TcpStore::connect_secured(addr, timeout, Security::loopback_only())
    }

    /// [`connect`](Self::connect), proving `security`'s secret to the server (and checking
    /// the server's proof) on every connection.
    pub fn connect_secured(
        addr: impl Into<String>,
        timeout: Duration,
        security: Security,
    ) -> Result<TcpStore> {
        let store = TcpStore {
            addr: addr.into(),
            reconnect_timeout: timeout,
            security,
            conn: Mutex::new(None),
        };
        let c = store.open(timeout)?;
        *lock(&store.conn) = Some(c);
        Ok(store)
    }

    /// Once connected, a connection that broke is tried again for at most `within` (zero:
    /// once) rather than the connect timeout: for a client that has nothing to wait for
    /// once the server is gone (a rank's status responder, whose server closes as the job
    /// ends).
    pub fn reconnect_within(mut self, within: Duration) -> TcpStore {
        self.reconnect_timeout = within;
        self
    }

    /// A new connection, hello exchanged, tried for at most `within`.
    fn open(&self, within: Duration) -> Result<TcpStream> {
        super::dial(&self.addr, within, "the store", |mut s, a| {
            let _ = s.set_nodelay(true);
            let handshake = self.hello(&mut s, a).and_then(|nc| {
                let _ = s.set_read_timeout(Some(ANSWER_SLACK));
                self.security.client_finish(&mut s, b"store", &nc)
            });
            match handshake {
                Ok(()) => {}
                Err(Denied::Secret(why)) => {
                    return Err(Error::Unauthenticated {
                        peer: format!("the store at {}", self.addr),
                        reason: why.to_string(),
                    })
                }
                Err(d) => return Err(Error::Store(format!("{}: {d}", self.addr))),
            }
            let hello = Request::Hello {
                magic: MAGIC,
                version: VERSION,
            };
            proto::write(&mut s, &hello)
                .map_err(|e| Error::Store(format!("{}: hello: {e}", self.addr)))?;
            match proto::read::<Response>(&mut s) {
                Ok(Some(Response::Done)) => Ok(s),
                Ok(Some(Response::Failed(f))) => Err(Error::Store(format!(
                    "{} refused the connection: {}",
                    self.addr,
                    Error::from(f)
                ))),
                Ok(other) => Err(Error::Store(format!(
                    "{} answered the hello with {other:?}: not a collectix store",
                    self.addr
                ))),
                Err(e) => Err(Error::Store(format!(
                    "{} answered the hello with {e}: not a collectix store",
                    self.addr
                ))),
            }
        })
    }

    /// The handshake's first step on a fresh connection to `a`: the hello, sent; its nonce.
    /// A server that says nothing within torch's probe time, or closes at once, is asked on
    /// a connection of its own whether it speaks torch's `TCPStore` protocol: if it does,
    /// the error says so now, not at the handshake's timeout.
    fn hello(&self, s: &mut TcpStream, a: SocketAddr) -> std::result::Result<[u8; 32], Denied> {
        let nc = Security::client_hello(s)?;
        let answered = |s: &mut TcpStream, within: Duration| {
            let _ = s.set_read_timeout(Some(within));
            let mut b = [0u8; 1];
            matches!(s.peek(&mut b), Ok(n) if n > 0)
        };
        // A store open to torch's clients answers torch's question too: one that is merely
        // slow has a moment more to answer its own first.
        if !answered(s, torch::PROBE) && torch::speaks_torch(a) && !answered(s, torch::PROBE) {
            return Err(Denied::Foreign(
                "it speaks torch's TCPStore protocol, not collectix's: set \
                 COLLECTIX_STORE_PROTOCOL=torch (torch's protocol has no authentication; see \
                 docs/deployment.md, \"The store\")"
                    .into(),
            ));
        }
        Ok(nc)
    }

    /// Sends `req`, which the server may hold for up to `wait`, and returns the answer.
    fn call(&self, req: Request, wait: Duration) -> Result<Response> {
        // Refused here, before anything is sent: the server would refuse the frame (and a
        // failed write would look like a broken connection).
        let carried = req.carried_bytes();
        if carried > proto::MAX_FRAME {
            return Err(Error::invalid(format!(
                "store: a request carrying {carried} bytes of keys and values; a store message carries at most {} bytes",
                proto::MAX_FRAME
            )));
        }
        let mut conn = lock(&self.conn);
        for attempt in 0..2 {
            let s = match conn.as_mut() {
                Some(s) => s,
                None => conn.insert(self.open(self.reconnect_timeout)?),
            };
            let _ = s.set_read_timeout(Some(wait.saturating_add(ANSWER_SLACK)));
            let written = proto::write(s, &req);
            if let Err(e) = &written {
                if e.kind() == std::io::ErrorKind::InvalidInput {
                    // Nothing was sent: the message cannot be encoded within the limit.
                    return Err(Error::invalid(format!("store: {e}")));
                }
            }
            let sent = written.is_ok();
            let answer = match written {
                Ok(()) => proto::read::<Response>(s),
                Err(e) => Err(FrameError::Io(e)),
            };
            match answer {
                Ok(Some(Response::Failed(f))) => return Err(f.into()),
                Ok(Some(r)) => return Ok(r),
                Ok(None) | Err(FrameError::Io(_)) => {
                    *conn = None;
                    if !req.idempotent() && sent {
                        return Err(Error::Store(format!(
                            "the connection to the store at {} broke during {req:?}; whether it took effect is unknown",
                            self.addr
                        )));
                    }
                    if attempt == 1 {
                        return Err(Error::Store(format!(
                            "the connection to the store at {} broke twice during {req:?}",
                            self.addr
                        )));
                    }
                }
                Err(e) => {
                    *conn = None;
                    return Err(Error::Store(format!(
                        "the store at {} answered {e}",
                        self.addr
                    )));
                }
            }
        }
        Err(Error::internal("store request loop ended"))
    }

    fn unexpected<T>(&self, what: &str, r: Response) -> Result<T> {
        Err(Error::Store(format!(
            "the store at {} answered {r:?} to {what}",
            self.addr
        )))
    }
}

impl Store for TcpStore {
    fn set(&self, key: &str, value: Vec<u8>) -> Result<()> {
        let req = Request::Set {
            key: key.into(),
            value,
        };
        match self.call(req, Duration::ZERO)? {
            Response::Done => Ok(()),
            r => self.unexpected("set", r),
        }
    }

    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        let req = Request::Get {
            key: key.into(),
            timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
        };
        match self.call(req, timeout)? {
            Response::Value(v) => Ok(v),
            r => self.unexpected("get", r),
        }
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        let req = Request::Add {
            key: key.into(),
            delta,
        };
        match self.call(req, Duration::ZERO)? {
            Response::Int(v) => Ok(v),
            r => self.unexpected("add", r),
        }
    }

    fn compare_set(&self, key: &str, expected: &[u8], desired: Vec<u8>) -> Result<Vec<u8>> {
        let req = Request::CompareSet {
            key: key.into(),
            expected: expected.to_vec(),
            desired,
        };
        match self.call(req, Duration::ZERO)? {
            Response::Value(v) => Ok(v),
            r => self.unexpected("compare_set", r),
        }
    }

    fn wait(&self, keys: &[&str], timeout: Duration) -> Result<()> {
        let req = Request::Wait {
            keys: keys.iter().map(|k| (*k).to_owned()).collect(),
            timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
        };
        match self.call(req, timeout)? {
            Response::Done => Ok(()),
            r => self.unexpected("wait", r),
        }
    }

    fn check(&self, keys: &[&str]) -> Result<bool> {
        let req = Request::Check {
            keys: keys.iter().map(|k| (*k).to_owned()).collect(),
        };
        match self.call(req, Duration::ZERO)? {
            Response::Bool(b) => Ok(b),
            r => self.unexpected("check", r),
        }
    }

    fn delete(&self, key: &str) -> Result<bool> {
        match self.call(Request::Delete { key: key.into() }, Duration::ZERO)? {
            Response::Bool(b) => Ok(b),
            r => self.unexpected("delete", r),
        }
    }

    fn num_keys(&self) -> Result<u64> {
        match self.call(Request::NumKeys, Duration::ZERO)? {
            Response::Count(n) => Ok(n),
            r => self.unexpected("num_keys", r),
        }
    }
}

#[cfg(test)]
mod tests;
