//! The TCP transport's link (issue 11, first part): one connection per pair of ranks, opened
//! with a handshake, carrying the core's frames ([`collectix_runtime::wire::codec`]).
//!
//! **Handshake.** The connection first proves both sides hold the job's secret
//! ([`Security`]'s challenge–response, context `link`; nothing is exchanged in the clear
//! beyond nonces and proofs before it passes). Then the connecting rank writes a [`Hello`]: the link's magic, its version, the
//! job's identity, both ranks and the world's size (32 bytes). The accepting rank checks it
//! before it reads anything else and answers with one byte (accepted), a refusal with its
//! reason, which the connecting rank reports, or "duplicate": the accepting rank, the lower
//! of the two, is connecting the other way at this moment, and its connection is the one
//! both keep ([`Refused::Duplicate`]; see [`super::mesh`]). A connection from another job, another version
//! or a rank out of range is so refused on both sides, and no frame is read from it.
//!
//! **Sending.** [`TcpLink::try_send`] writes a message (a payload of at most [`DIRECT_MAX`]
//! bytes) itself when nothing is queued and the connection's writer thread is idle: one
//! `sendmsg` that does not wait (`MSG_DONTWAIT`), from the thread that sends (the rank's
//! caller, usually), so the frame crosses no thread on its way out. What the socket's
//! buffer does not take then, and every larger message, goes to the writer thread through a
//! bounded queue ([`QUEUE`] messages), in order, a frame cut short first; a full queue is
//! "would block", and the writer tells the rank ([`Inbound::flush`]) once it has taken the
//! message after which the queue had filled. Measured with `collectix bench --transport tcp
//! -b 4 -e 4` (two builds alternating, 6 runs each): the writer's wake-ups went from about
//! 97 000 `futex` calls per 1 000 calls of a 2-rank all_reduce to 177 (`strace -f -c`), and the
//! 4-rank all_reduce of 4 bytes from 113 to 90 µs; the 2-rank one stayed at 36 µs, whose time
//! is the reader's wake-up. The writer encodes each message's head into one reused buffer
//! and writes the head and the payload parts (never copied) with vectored writes: no
//! allocation per frame (but for messages of more than 15 parts). `TCP_NODELAY` is on: the
//! frames are whole messages, and a rank waits for each. The socket buffers are left to the
//! kernel's autotuning (Linux grows them up to `net.ipv4.tcp_wmem`/`tcp_rmem`'s maximum, 4–6 MiB):
//! setting `SO_SNDBUF`/`SO_RCVBUF` would switch it off for that socket and cap the window at
//! the size set.
//!
//! **Receiving.** A reader thread decodes each frame's head ([`codec::decode_head`]; its
//! limits are checked before anything is allocated for the frame), then reads each payload
//! part straight from the socket into an 8-aligned buffer of its own, recycled through a pool
//! once the rank has dropped it: the kernel's copy is the only one, and a part can be viewed
//! as any dtype without realigning. The message goes to the rank with the link's rank as its
//! source ([`Inbound::deliver`]).
//!
//! **Silence.** A writer with nothing to send for [`Liveness::heartbeat`] (1 s) sends a
//! heartbeat frame ([`codec::HEARTBEAT`], 12 bytes; the decoder skips it). A reader that gets
//! nothing at all, not even a heartbeat, for [`Liveness::silence`] (10 s;
//! `COLLECTIX_LINK_TIMEOUT`) reports the peer lost: a partition that drops packets without a
//! FIN or a reset, a host that went down, or a process stopped cold. TCP alone would notice
//! none of them while this side only waits to receive.
//!
//! **Loss.** A connection that closes, breaks, falls silent, or carries something that is not
//! a frame (logged with the reason) is reported once as a lost peer ([`Inbound::lost`]).

use super::Link;
use crate::security::{Denied, Security};
use crate::sync::lock;
use bytes::{Buf, BytesMut};
use collectix_runtime::tensor::pool::Pool;
use collectix_runtime::wire::codec::{self, Limits};
use collectix_runtime::wire::{LinkError, Message};
use std::collections::VecDeque;
use std::io::{IoSlice, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// The link protocol's magic (the first bytes of every connection).
pub const MAGIC: [u8; 8] = *b"cx-link1";
/// The link protocol's version.
pub const VERSION: u32 = 2;
/// Messages a link queues for its writer before it says "would block".
pub const QUEUE: usize = 64;
/// How long an accepting rank waits for a connection's hello.
pub const HELLO_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// Payloads up to this size are written by the sending thread itself when the writer is idle,
/// as far as the socket's buffer takes them without waiting (see the module doc); larger ones
/// always go to the writer, which copies them into the socket outside the rank's lock. (At
/// 64 KiB, the all_reduce of 1 MiB over TCP took 1.74 ms at W = 4 and 0.56 at W = 2; at
/// 4 MiB, 1.47 and 0.53: medians of 4 alternating runs.)
pub const DIRECT_MAX: usize = 4 << 20;
/// Slices of one vectored write kept on the writer's stack (a head and up to 15 parts).
const INLINE_SLICES: usize = 16;
/// Bytes the reader asks the socket for, per read of heads.
const READ_CHUNK: usize = 256 << 10;
/// Parts up to this size are read into a pooled buffer taken whole; larger ones into a buffer
/// that grows by this much as the bytes arrive.
const BIG_PART: usize = 64 << 20;
/// Free payload buffers a process's readers keep for reuse (one pool for all its
/// connections; see [`start`]).
pub const RECV_POOL_BYTES: usize = 256 << 20;

/// How a link tells a silent peer from a quiet one (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Liveness {
    /// A heartbeat goes after this long with nothing else sent.
    pub heartbeat: Duration,
    /// A peer from which nothing, not even a heartbeat, came for this long is lost (`None`:
    /// never, however long it is silent).
    pub silence: Option<Duration>,
}

impl Default for Liveness {
    /// A heartbeat every second of quiet; lost after 10 s of silence.
    fn default() -> Self {
        Liveness {
            heartbeat: Duration::from_secs(1),
            silence: Some(Duration::from_secs(10)),
        }
    }
}

impl Liveness {
    /// Silence of `timeout` is loss (`None`: never), with heartbeats ten times as often (at
    /// most one a second).
    pub fn with_timeout(timeout: Option<Duration>) -> Liveness {
        Liveness {
            heartbeat: timeout.map_or(Duration::from_secs(1), |t| {
                (t / 10).clamp(Duration::from_millis(1), Duration::from_secs(1))
            }),
            silence: timeout,
        }
    }

    /// From `COLLECTIX_LINK_TIMEOUT` (seconds, fractions allowed; `0` for never); unset is
    /// the default (10 s).
    pub fn from_env() -> collectix_runtime::Result<Liveness> {
        match std::env::var("COLLECTIX_LINK_TIMEOUT") {
            Err(_) => Ok(Liveness::default()),
            Ok(v) => match v.trim().parse::<f64>() {
                Ok(0.0) => Ok(Liveness::with_timeout(None)),
                Ok(secs) if secs.is_finite() && secs > 0.0 && secs < 1e9 => {
                    Ok(Liveness::with_timeout(Some(Duration::from_secs_f64(secs))))
                }
                _ => Err(collectix_runtime::Error::invalid(format!(
                    "COLLECTIX_LINK_TIMEOUT is {v:?}; give seconds (0 for never)"
                ))),
            },
        }
    }
}

/// What the connecting rank says first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hello {
    /// The job's identity (every rank of one job has the same).
    pub job: u64,
    /// The connecting rank.
    pub from: u32,
    /// The rank it wants.
    pub to: u32,
    /// The world's size.
    pub world: u32,
}

impl Hello {
    fn to_bytes(self) -> [u8; 32] {
        let mut b = [0u8; 32];
        b[..8].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        b[12..20].copy_from_slice(&self.job.to_le_bytes());
        b[20..24].copy_from_slice(&self.from.to_le_bytes());
        b[24..28].copy_from_slice(&self.to.to_le_bytes());
        b[28..32].copy_from_slice(&self.world.to_le_bytes());
        b
    }

    /// Parses the 32 bytes; `Err` with why they are not a hello of this version.
    fn parse(b: &[u8; 32]) -> Result<Hello, String> {
        let word = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        if b[..8] != MAGIC {
            return Err("not a collectix link (wrong magic)".into());
        }
        let version = word(8);
        if version != VERSION {
            return Err(format!(
                "link protocol version {version}; this rank speaks {VERSION}"
            ));
        }
        let mut job = [0u8; 8];
        job.copy_from_slice(&b[12..20]);
        Ok(Hello {
            job: u64::from_le_bytes(job),
            from: word(20),
            to: word(24),
            world: word(28),
        })
    }
}

/// Why a hello was not accepted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refused {
    /// The accepting rank is connecting to this one at the same moment, and keeps its own
    /// connection: this one is not needed.
    Duplicate,
    /// Refused, with the accepting rank's reason, or the connection failed.
    Why(String),
    /// The secret handshake failed (see [`Security`]).
    Auth(Denied),
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::Duplicate => f.write_str("the peer is connecting to this rank already"),
            Refused::Why(why) => f.write_str(why),
            Refused::Auth(d) => write!(f, "authentication failed: {d}"),
        }
    }
}

/// Connects: proves the secret (as `security` has it), writes `hello` on `s` and reads the
/// answer. `Err` with the accepting rank's reason (or the connection's failure).
pub fn connect(s: &mut TcpStream, hello: Hello, security: &Security) -> Result<(), Refused> {
    security.client(s, b"link").map_err(Refused::Auth)?;
    let fail = |what: &str, e: std::io::Error| Refused::Why(format!("{what}: {e}"));
    s.write_all(&hello.to_bytes())
        .map_err(|e| fail("cannot send the hello", e))?;
    let mut status = [0u8; 1];
    s.read_exact(&mut status)
        .map_err(|e| fail("no answer to the hello", e))?;
    match status[0] {
        0 => return Ok(()),
        2 => return Err(Refused::Duplicate),
        _ => {}
    }
    let mut len = [0u8; 2];
    s.read_exact(&mut len)
        .map_err(|e| fail("refused, without a reason", e))?;
    let mut text = vec![0u8; u16::from_le_bytes(len) as usize];
    s.read_exact(&mut text)
        .map_err(|e| fail("refused, without a reason", e))?;
    Err(Refused::Why(format!(
        "refused: {}",
        String::from_utf8_lossy(&text)
    )))
}

/// Accepts: checks the secret (as `security` has it; nothing else is read before it
/// passes), then reads the hello on `s` and checks it against this rank (`me` of `world` in
/// job `job`); answers it either way. `Ok` with the connecting rank. A hello from a higher rank
/// that this rank is connecting to at the moment (`connecting(from)`) is answered
/// "duplicate": this rank's own connection is the one both keep.
pub fn accept(
    s: &mut TcpStream,
    job: u64,
    me: u32,
    world: u32,
    connecting: &dyn Fn(u32) -> bool,
    security: &Security,
) -> Result<u32, String> {
    // A connection that does not say its hello in time (a port scanner, a stuck client) is
    // dropped rather than left holding the accepting rank.
    s.set_read_timeout(Some(HELLO_TIMEOUT))
        .map_err(|e| format!("cannot set a timeout: {e}"))?;
    if let Err(d) = security.server(s, b"link") {
        let _ = s.shutdown(Shutdown::Both);
        return Err(format!("authentication failed: {d}"));
    }
    let mut b = [0u8; 32];
    let read = s.read_exact(&mut b);
    let _ = s.set_read_timeout(None);
    read.map_err(|e| format!("no hello within {HELLO_TIMEOUT:?}: {e}"))?;
    let verdict = Hello::parse(&b).and_then(|h| {
        if h.job != job {
            Err(format!(
                "a connection from job {:#x}; this is job {job:#x}",
                h.job
            ))
        } else if h.world != world {
            Err(format!(
                "the peer's world has {} ranks; this one has {world}",
                h.world
            ))
        } else if h.to != me {
            Err(format!("the peer wants rank {}; this is rank {me}", h.to))
        } else if h.from >= world || h.from == me {
            Err(format!(
                "rank {} is not a peer in a world of {world}",
                h.from
            ))
        } else {
            Ok(h.from)
        }
    });
    match &verdict {
        Ok(from) if *from > me && connecting(*from) => {
            let _ = s.write_all(&[2]);
            let _ = s.shutdown(Shutdown::Both);
            return Err(format!(
                "rank {from}: a duplicate of this rank's connection to it"
            ));
        }
        Ok(_) => s
            .write_all(&[0])
            .map_err(|e| format!("cannot answer the hello: {e}"))?,
        Err(why) => {
            let text = &why.as_bytes()[..why.len().min(u16::MAX as usize)];
            let mut answer = vec![1u8];
            answer.extend_from_slice(&(text.len() as u16).to_le_bytes());
            answer.extend_from_slice(text);
            let _ = s.write_all(&answer);
            let _ = s.shutdown(Shutdown::Both);
        }
    }
    verdict
}

/// Where a link's arrivals and events go (the rank actor, or a test).
pub trait Inbound: Send + Sync + 'static {
    /// A message from global rank `src` (stamped by the link).
    fn deliver(&self, src: usize, msg: Message);
    /// The link to `peer` can take messages again.
    fn flush(&self, peer: usize);
    /// The link to `peer` is gone.
    fn lost(&self, peer: usize);
}

/// The sending side of a connection to one peer (see the module doc).
pub struct TcpLink {
    shared: Arc<Sending>,
}

/// What the link and the connection's writer thread share.
struct Sending {
    tx: Mutex<Tx>,
    /// The writer has messages to send, or the link was dropped.
    ready: Condvar,
    /// Set when the queue was found full; the writer then sends a flush.
    full: AtomicBool,
    /// The socket, for the link's direct writes.
    socket: TcpStream,
}

/// The sending side's state, under [`Sending::tx`].
struct Tx {
    /// Messages for the writer thread, in order.
    queue: VecDeque<Message>,
    /// Bytes of the front message's frame already written (by a direct write cut short).
    written: usize,
    /// The writer thread is writing (outside the lock): nobody else may write now.
    busy: bool,
    /// The link was dropped: the writer sends what is queued, then closes its side.
    dropped: bool,
    /// The socket broke: the writer reported the peer lost and has ended.
    broken: bool,
    /// The head of a direct write (reused: no allocation per frame).
    head: BytesMut,
}

impl Link<Message> for TcpLink {
    fn try_send(&mut self, msg: Message) -> Result<(), LinkError<Message>> {
        let sh = &*self.shared;
        let mut tx = lock(&sh.tx);
        if tx.broken {
            return Err(LinkError::Closed);
        }
        if tx.queue.is_empty() && !tx.busy && frame_len_at_most(&msg, DIRECT_MAX) {
            // Nothing queued and the writer idle: this thread writes the frame itself, so a
            // small message crosses no thread on its way out. Whatever the socket's buffer
            // does not take now goes to the writer, ahead of anything sent later.
            let Tx { head, .. } = &mut *tx;
            head.clear();
            codec::encode_head(&msg, head);
            let n = write_now(&sh.socket, head, &msg);
            let total = head.len() + msg.payload.iter().map(|p| p.len()).sum::<usize>();
            if n == total {
                return Ok(());
            }
            tx.written = n;
            tx.queue.push_back(msg);
            sh.ready.notify_one();
            return Ok(());
        }
        if tx.queue.len() >= QUEUE {
            sh.full.store(true, Ordering::SeqCst);
            return Err(LinkError::WouldBlock(msg));
        }
        tx.queue.push_back(msg);
        sh.ready.notify_one();
        Ok(())
    }
}

impl Drop for TcpLink {
    fn drop(&mut self) {
        lock(&self.shared.tx).dropped = true;
        self.shared.ready.notify_one();
    }
}

/// Whether `msg`'s payload is at most `max` bytes (a direct write's bound).
fn frame_len_at_most(msg: &Message, max: usize) -> bool {
    let mut n = 0usize;
    msg.payload.iter().all(|p| {
        n = n.saturating_add(p.len());
        n <= max
    })
}

/// Writes as much of the frame (`head`, then `msg`'s payload) as the socket takes without
/// waiting; the bytes written (0 if it took none, or failed: the writer, writing the rest,
/// meets the failure and reports it).
fn write_now(s: &TcpStream, head: &[u8], msg: &Message) -> usize {
    let mut slices = [IoSlice::new(&[]); INLINE_SLICES];
    let n = 1 + msg.payload.len();
    if n > INLINE_SLICES {
        return 0;
    }
    slices[0] = IoSlice::new(head);
    for (slot, part) in slices[1..].iter_mut().zip(&msg.payload) {
        *slot = IoSlice::new(part);
    }
    let mut slices = &mut slices[..n];
    let mut written = 0;
    while !slices.is_empty() {
        match send_now(s, slices) {
            Ok(0) | Err(_) => break,
            Ok(k) => {
                written += k;
                IoSlice::advance_slices(&mut slices, k);
            }
        }
    }
    written
}

/// One `sendmsg` that does not wait (`MSG_DONTWAIT`: the socket stays blocking for the
/// writer thread, which shares its file description) and raises no `SIGPIPE`.
#[cfg(unix)]
fn send_now(s: &TcpStream, slices: &[IoSlice<'_>]) -> std::io::Result<usize> {
    use nix::sys::socket::{sendmsg, MsgFlags};
    use std::os::fd::AsRawFd;
    loop {
        match sendmsg::<()>(
            s.as_raw_fd(),
            slices,
            &[],
            MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL,
            None,
        ) {
            Err(nix::errno::Errno::EINTR) => {}
            r => return r.map_err(std::io::Error::from),
        }
    }
}

/// Without `MSG_DONTWAIT`, the link never writes itself: every frame goes to the writer.
#[cfg(not(unix))]
fn send_now(_: &TcpStream, _: &[IoSlice<'_>]) -> std::io::Result<usize> {
    Ok(0)
}

/// The threads of one connection; joining waits for the writer to send what was queued.
pub struct Connection {
    /// The writer (ends when the link is dropped and its queue is sent, or the socket
    /// breaks).
    pub writer: JoinHandle<()>,
    /// The reader (ends when the peer closes or the socket breaks).
    pub reader: JoinHandle<()>,
}

/// Starts the reader and writer of an accepted or connected `stream` to global rank `peer`;
/// what arrives goes to `inbound`, its payload parts in buffers from `pool` (shared by a
/// process's connections, [`RECV_POOL_BYTES`]).
pub fn start(
    stream: TcpStream,
    peer: usize,
    limits: Limits,
    inbound: Arc<dyn Inbound>,
    liveness: Liveness,
    pool: Pool,
) -> std::io::Result<(TcpLink, Connection)> {
    stream.set_nodelay(true)?;
    stream.set_read_timeout(liveness.silence)?;
    let reading = stream.try_clone()?;
    let shared = Arc::new(Sending {
        tx: Mutex::new(Tx {
            queue: VecDeque::new(),
            written: 0,
            busy: false,
            dropped: false,
            broken: false,
            head: BytesMut::with_capacity(256),
        }),
        ready: Condvar::new(),
        full: AtomicBool::new(false),
        socket: stream.try_clone()?,
    });
    let lost_once = Arc::new(AtomicBool::new(false));
    let lose = {
        let (inbound, lost_once) = (inbound.clone(), lost_once.clone());
        move |why: &str| {
            if !lost_once.swap(true, Ordering::SeqCst) {
                tracing::warn!(peer, reason = why, "link lost");
                inbound.lost(peer);
            }
        }
    };
    let writer = {
        let (shared, inbound, lose) = (shared.clone(), inbound.clone(), lose.clone());
        std::thread::Builder::new()
            .name(format!("collectix-tx-{peer}"))
            .spawn(move || {
                write_loop(
                    stream,
                    &shared,
                    peer,
                    liveness.heartbeat,
                    inbound.as_ref(),
                    &lose,
                )
            })?
    };
    let reader = std::thread::Builder::new()
        .name(format!("collectix-rx-{peer}"))
        .spawn(move || {
            read_loop(
                reading,
                peer,
                limits,
                liveness,
                &pool,
                inbound.as_ref(),
                &lose,
            )
        })?;
    Ok((TcpLink { shared }, Connection { writer, reader }))
}

fn write_loop(
    mut s: TcpStream,
    sh: &Sending,
    peer: usize,
    heartbeat: Duration,
    inbound: &dyn Inbound,
    lose: &dyn Fn(&str),
) {
    // One head buffer for every frame, and the slices on the stack for up to
    // `INLINE_SLICES - 1` parts: no allocation per frame.
    let mut head = BytesMut::with_capacity(256);
    let mut tx = lock(&sh.tx);
    loop {
        let Some(msg) = tx.queue.pop_front() else {
            if tx.dropped {
                break;
            }
            let (t, waited) = sh
                .ready
                .wait_timeout(tx, heartbeat)
                .unwrap_or_else(|e| e.into_inner());
            tx = t;
            if waited.timed_out() && tx.queue.is_empty() && !tx.dropped {
                tx.busy = true;
                drop(tx);
                let r = s.write_all(&codec::HEARTBEAT);
                tx = lock(&sh.tx);
                tx.busy = false;
                if let Err(e) = r {
                    tx.broken = true;
                    drop(tx);
                    return lose(&format!("write failed: {e}"));
                }
            }
            continue;
        };
        let skip = std::mem::take(&mut tx.written);
        tx.busy = true;
        drop(tx);
        head.clear();
        codec::encode_head(&msg, &mut head);
        let n = 1 + msg.payload.len();
        let written = if n <= INLINE_SLICES {
            let mut slices = [IoSlice::new(&[]); INLINE_SLICES];
            slices[0] = IoSlice::new(&head);
            for (slot, part) in slices[1..].iter_mut().zip(&msg.payload) {
                *slot = IoSlice::new(part);
            }
            let mut slices = &mut slices[..n];
            IoSlice::advance_slices(&mut slices, skip);
            write_all_vectored(&mut s, slices)
        } else {
            let mut slices: Vec<IoSlice<'_>> = Vec::with_capacity(n);
            slices.push(IoSlice::new(&head));
            slices.extend(msg.payload.iter().map(|p| IoSlice::new(p)));
            let mut slices = &mut slices[..];
            IoSlice::advance_slices(&mut slices, skip);
            write_all_vectored(&mut s, slices)
        };
        drop(msg);
        if let Err(e) = written {
            let mut t = lock(&sh.tx);
            t.broken = true;
            t.busy = false;
            t.queue.clear();
            drop(t);
            return lose(&format!("write failed: {e}"));
        }
        if sh.full.swap(false, Ordering::SeqCst) {
            inbound.flush(peer);
        }
        tx = lock(&sh.tx);
        tx.busy = false;
    }
    drop(tx);
    // The link was dropped and its queue is sent: an orderly end of the sending side.
    let _ = s.flush();
    let _ = s.shutdown(Shutdown::Write);
}

fn write_all_vectored(s: &mut TcpStream, mut slices: &mut [IoSlice<'_>]) -> std::io::Result<()> {
    while !slices.is_empty() {
        match s.write_vectored(slices) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut slices, n),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn read_loop(
    mut s: TcpStream,
    peer: usize,
    limits: Limits,
    liveness: Liveness,
    pool: &Pool,
    inbound: &dyn Inbound,
    lose: &dyn Fn(&str),
) {
    // Heads (and what a read brought beyond them) gather in `buf`; each payload part goes
    // into an aligned buffer of its own from `pool`, read straight from the socket: one copy,
    // the kernel's, and no zeroing (`scratch` is zeroed once).
    let mut buf = BytesMut::with_capacity(READ_CHUNK);
    let mut scratch = vec![0u8; READ_CHUNK];
    let silence = liveness.silence.unwrap_or_default();
    loop {
        let head = loop {
            match codec::decode_head(&mut buf, &limits) {
                Ok(Some(h)) => break h,
                Ok(None) => {}
                Err(e) => return lose(&format!("not a collectix frame: {e}")),
            }
            match read_some(&mut s, &mut scratch, !buf.is_empty(), peer, silence) {
                Ok(n) => buf.extend_from_slice(&scratch[..n]),
                Err(why) => return lose(&why),
            }
        };
        let mut payload = Vec::with_capacity(head.parts.len());
        for &len in &head.parts {
            if len > BIG_PART {
                match read_big(&mut s, &mut buf, len, peer, silence) {
                    Ok(b) => payload.push(b),
                    Err(why) => return lose(&why),
                }
                continue;
            }
            let mut part = pool.take(len);
            let dst = part.bytes_mut();
            let have = buf.len().min(len);
            dst[..have].copy_from_slice(&buf[..have]);
            buf.advance(have);
            let mut at = have;
            while at < len {
                match read_some(&mut s, &mut dst[at..], true, peer, silence) {
                    Ok(n) => at += n,
                    Err(why) => return lose(&why),
                }
            }
            payload.push(part.freeze());
        }
        inbound.deliver(
            peer,
            Message {
                src: peer,
                header: head.header,
                payload,
            },
        );
    }
}

/// A part above [`BIG_PART`]: read into a buffer that grows as its bytes arrive (a length
/// announced by a peer is never allocated ahead of the data, beyond one step).
fn read_big(
    s: &mut TcpStream,
    buf: &mut BytesMut,
    len: usize,
    peer: usize,
    silence: Duration,
) -> Result<bytes::Bytes, String> {
    let mut words: Vec<u64> = Vec::new();
    let mut at = 0;
    while at < len {
        let upto = (at + BIG_PART).min(len);
        words.resize(upto.div_ceil(8), 0);
        let dst: &mut [u8] = bytemuck::cast_slice_mut(words.as_mut_slice());
        if at == 0 {
            let have = buf.len().min(upto);
            dst[..have].copy_from_slice(&buf[..have]);
            buf.advance(have);
            at = have;
        }
        while at < upto {
            at += read_some(s, &mut dst[at..upto], true, peer, silence)?;
        }
    }
    let mut b = collectix_runtime::tensor::bytes_from_vec(words);
    b.truncate(len);
    Ok(b)
}

/// One read into `dst` (not empty): how many bytes came, or why the connection is lost
/// (`mid`: in the middle of a frame).
fn read_some(
    s: &mut TcpStream,
    dst: &mut [u8],
    mid: bool,
    peer: usize,
    silence: Duration,
) -> Result<usize, String> {
    loop {
        return match s.read(dst) {
            Ok(0) if mid => Err("the peer closed the connection in the middle of a frame".into()),
            Ok(0) => Err("the peer closed the connection".into()),
            Ok(n) => Ok(n),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                Err(format!(
                    "nothing from rank {peer} for {silence:?}, not even a heartbeat: unreachable \
                     (a network partition, a host down, or a stopped process)"
                ))
            }
            Err(e) => Err(format!("read failed: {e}")),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use collectix_runtime::wire::{Header, Outbox};
    use collectix_runtime::{DType, GroupId};
    use std::net::TcpListener;
    use std::sync::mpsc::{channel, Receiver, Sender};
    use std::sync::Mutex;
    use std::time::Duration;

    #[derive(Debug)]
    enum Event {
        Msg(usize, Message),
        Flush(usize),
        Lost(usize),
    }

    struct Chan(Mutex<Sender<Event>>);

    impl Inbound for Chan {
        fn deliver(&self, src: usize, msg: Message) {
            let _ = self.0.lock().map(|t| t.send(Event::Msg(src, msg)));
        }
        fn flush(&self, peer: usize) {
            let _ = self.0.lock().map(|t| t.send(Event::Flush(peer)));
        }
        fn lost(&self, peer: usize) {
            let _ = self.0.lock().map(|t| t.send(Event::Lost(peer)));
        }
    }

    /// Starts `stream`'s link to `peer` with default limits, `live`, and a pool of its own.
    fn started(
        stream: TcpStream,
        peer: usize,
        inb: Arc<dyn Inbound>,
        live: Liveness,
    ) -> (TcpLink, Connection) {
        start(
            stream,
            peer,
            Limits::default(),
            inb,
            live,
            Pool::new(RECV_POOL_BYTES),
        )
        .unwrap_or_else(|e| panic!("{e}"))
    }

    /// The tests' job secret.
    fn secured() -> Security {
        match crate::security::Secret::new("a test job's secret") {
            Ok(k) => Security::with_secret(k),
            Err(e) => panic!("{e}"),
        }
    }

    fn inbound() -> (Arc<dyn Inbound>, Receiver<Event>) {
        let (tx, rx) = channel();
        (Arc::new(Chan(Mutex::new(tx))), rx)
    }

    /// Two connected sockets with the handshake done: (rank 0's end, rank 1's end).
    fn pair(job: u64) -> (TcpStream, TcpStream) {
        pair_via(job, None)
    }

    /// Copies `from` to `to`, each chunk `delay` after it was read (a delay line).
    fn delay_line(mut from: TcpStream, mut to: TcpStream, delay: Duration) {
        let (tx, rx) = channel::<(std::time::Instant, Vec<u8>)>();
        std::thread::spawn(move || {
            let mut b = vec![0u8; 64 << 10];
            while let Ok(n) = from.read(&mut b) {
                if n == 0
                    || tx
                        .send((std::time::Instant::now() + delay, b[..n].to_vec()))
                        .is_err()
                {
                    break;
                }
            }
        });
        std::thread::spawn(move || {
            for (due, chunk) in rx {
                std::thread::sleep(due.saturating_duration_since(std::time::Instant::now()));
                if to.write_all(&chunk).is_err() {
                    break;
                }
            }
        });
    }

    /// Two connected sockets with the handshake done, through a proxy that delays every byte
    /// by `delay` each way when one is given: (rank 0's end, rank 1's end).
    fn pair_via(job: u64, delay: Option<Duration>) -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
        let mut addr = l.local_addr().unwrap_or_else(|e| panic!("{e}"));
        let t = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap_or_else(|e| panic!("{e}"));
            let from = accept(&mut s, job, 1, 2, &|_| false, &secured());
            (s, from)
        });
        if let Some(delay) = delay {
            let proxy = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
            let (target, at) = (addr, proxy.local_addr().unwrap_or_else(|e| panic!("{e}")));
            std::thread::spawn(move || {
                let (a, _) = proxy.accept().unwrap_or_else(|e| panic!("{e}"));
                let b = TcpStream::connect(target).unwrap_or_else(|e| panic!("{e}"));
                let (a2, b2) = (a.try_clone(), b.try_clone());
                if let (Ok(a2), Ok(b2)) = (a2, b2) {
                    delay_line(a, b, delay);
                    delay_line(b2, a2, delay);
                }
            });
            addr = at;
        }
        let mut c = TcpStream::connect(addr).unwrap_or_else(|e| panic!("{e}"));
        let hello = Hello {
            job,
            from: 0,
            to: 1,
            world: 2,
        };
        assert_eq!(connect(&mut c, hello, &secured()), Ok(()));
        let (s, from) = t.join().unwrap_or_else(|_| panic!("accept panicked"));
        assert_eq!(from, Ok(0));
        (c, s)
    }

    fn data(seq: u64, payload: Vec<Bytes>) -> Message {
        Message {
            src: 99,
            header: Header::P2p {
                group: GroupId::WORLD,
                tag: 1,
                seq,
                dtype: DType::U8,
                count: payload.iter().map(|p| p.len() as u64).sum(),
                eager: true,
                path: collectix_runtime::DataPath::Engine,
            },
            payload,
        }
    }

    /// A listener accepting one connection as rank `me` of 2 in job 7 (`connecting`: what
    /// it says about connecting the other way): its address, and the accept's outcome.
    fn accepting(
        me: u32,
        connecting: bool,
    ) -> (
        std::net::SocketAddr,
        std::thread::JoinHandle<Result<u32, String>>,
    ) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
        let addr = l.local_addr().unwrap_or_else(|e| panic!("{e}"));
        let t = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap_or_else(|e| panic!("{e}"));
            accept(&mut s, 7, me, 2, &|_| connecting, &secured())
        });
        (addr, t)
    }

    #[test]
    fn the_handshake_refuses_another_job_version_or_rank_on_both_sides() {
        let cases: Vec<(Hello, &str)> = vec![
            (
                Hello {
                    job: 8,
                    from: 0,
                    to: 1,
                    world: 2,
                },
                "job",
            ),
            (
                Hello {
                    job: 7,
                    from: 5,
                    to: 1,
                    world: 2,
                },
                "world",
            ),
            (
                Hello {
                    job: 7,
                    from: 5,
                    to: 1,
                    world: 9,
                },
                "world",
            ),
            (
                Hello {
                    job: 7,
                    from: 2,
                    to: 1,
                    world: 2,
                },
                "not a peer",
            ),
            (
                Hello {
                    job: 7,
                    from: 0,
                    to: 0,
                    world: 2,
                },
                "wants rank 0",
            ),
        ];
        for (hello, why) in cases {
            let (addr, t) = accepting(1, false);
            let mut c = TcpStream::connect(addr).unwrap_or_else(|e| panic!("{e}"));
            let told = connect(&mut c, hello, &secured());
            let saw = t.join().unwrap_or_else(|_| panic!("accept panicked"));
            assert!(
                matches!(&told, Err(Refused::Why(m)) if m.contains(why)),
                "{hello:?}: {told:?}"
            );
            assert!(
                matches!(&saw, Err(m) if m.contains(why)),
                "{hello:?}: {saw:?}"
            );
        }
        // Another version (after the secret), and something that is not collectix at all.
        for (authenticate, bytes) in [
            (true, {
                let mut b = Hello {
                    job: 7,
                    from: 0,
                    to: 1,
                    world: 2,
                }
                .to_bytes();
                b[8] = 9;
                b.to_vec()
            }),
            (
                false,
                b"GET / HTTP/1.1\r\nHost: collectix.example\r\n\r\n".to_vec(),
            ),
        ] {
            let (addr, t) = accepting(1, false);
            let mut c = TcpStream::connect(addr).unwrap_or_else(|e| panic!("{e}"));
            if authenticate {
                assert_eq!(secured().client(&mut c, b"link"), Ok(()));
            }
            let _ = c.write_all(&bytes);
            let saw = t.join().unwrap_or_else(|_| panic!("accept panicked"));
            assert!(
                matches!(&saw, Err(m) if m.contains("version 9") || m.contains("not a collectix connection")),
                "{saw:?}"
            );
        }
        // The wrong secret, or none: refused before the hello is read, on both sides.
        let wrong = match crate::security::Secret::new("another job's secret") {
            Ok(k) => Security::with_secret(k),
            Err(e) => panic!("{e}"),
        };
        for security in [wrong, Security::default()] {
            let (addr, t) = accepting(1, false);
            let mut c = TcpStream::connect(addr).unwrap_or_else(|e| panic!("{e}"));
            let hello = Hello {
                job: 7,
                from: 0,
                to: 1,
                world: 2,
            };
            let told = connect(&mut c, hello, &security);
            let saw = t.join().unwrap_or_else(|_| panic!("accept panicked"));
            assert!(matches!(&told, Err(Refused::Auth(_))), "{told:?}");
            assert!(
                matches!(&saw, Err(m) if m.starts_with("authentication failed")),
                "{saw:?}"
            );
        }
    }

    #[test]
    fn a_lower_rank_connecting_the_other_way_answers_duplicate_and_a_higher_one_accepts() {
        // (accepting rank, connecting rank, whether the accepting rank is connecting to it)
        let cases = [(0u32, 1u32, true), (1, 0, true), (0, 1, false)];
        for (me, from, connecting) in cases {
            let (addr, t) = accepting(me, connecting);
            let mut c = TcpStream::connect(addr).unwrap_or_else(|e| panic!("{e}"));
            let hello = Hello {
                job: 7,
                from,
                to: me,
                world: 2,
            };
            let told = connect(&mut c, hello, &secured());
            let saw = t.join().unwrap_or_else(|_| panic!("accept panicked"));
            if me < from && connecting {
                assert_eq!(told, Err(Refused::Duplicate));
                assert!(matches!(&saw, Err(m) if m.contains("duplicate")), "{saw:?}");
            } else {
                assert_eq!(told, Ok(()), "{me} <- {from}");
                assert_eq!(saw, Ok(from));
            }
        }
    }

    /// A connected pair with both links started: rank 0's link to rank 1 and its
    /// connection, rank 0's and rank 1's events, and rank 1's side (kept alive).
    #[allow(clippy::type_complexity)]
    fn linked(
        job: u64,
    ) -> (
        TcpLink,
        Connection,
        Receiver<Event>,
        Receiver<Event>,
        (TcpLink, Connection),
    ) {
        let (a, b) = pair(job);
        let (in_a, rx_a) = inbound();
        let (in_b, rx_b) = inbound();
        let (link, conn_a) = started(a, 1, in_a, Liveness::default());
        let b_side = started(b, 0, in_b, Liveness::default());
        (link, conn_a, rx_a, rx_b, b_side)
    }

    #[test]
    fn messages_arrive_whole_and_in_order_with_the_links_rank_as_source() {
        let (mut link, conn_a, _rx_a, rx_b, _b) = linked(1);
        // Small messages, an empty one, and one of 8 MiB in three parts.
        let big: Vec<Bytes> = (0..3u8)
            .map(|i| Bytes::from(vec![i; (8 << 20) / 3]))
            .collect();
        let mut sent = Vec::new();
        for seq in 0..200u64 {
            let payload = match seq {
                7 => Vec::new(),
                100 => big.clone(),
                _ => vec![Bytes::from(seq.to_le_bytes().to_vec())],
            };
            sent.push(payload.clone());
            let mut outbox = Outbox::default();
            assert!(outbox.send(&mut link, data(seq, payload)).is_ok());
            // Whatever the link refused goes as soon as it can.
            while !outbox.is_empty() {
                std::thread::sleep(Duration::from_millis(1));
                assert!(outbox.flush(&mut link).is_ok());
            }
        }
        for (seq, want) in sent.iter().enumerate() {
            match rx_b.recv_timeout(Duration::from_secs(30)) {
                Ok(Event::Msg(src, m)) => {
                    assert_eq!(src, 0, "the link's rank, not the message's claim (99)");
                    assert_eq!(m.src, 0);
                    assert!(matches!(m.header, Header::P2p { seq: s, .. } if s == seq as u64));
                    assert_eq!(&m.payload, want, "message {seq}");
                }
                other => panic!("message {seq}: {other:?}"),
            }
        }
        // Dropping the link ends the writer once its queue is sent; the peer sees the close.
        drop(link);
        let _ = conn_a.writer.join();
        assert!(matches!(
            rx_b.recv_timeout(Duration::from_secs(30)),
            Ok(Event::Lost(0))
        ));
    }

    #[test]
    fn direct_writes_cut_short_by_a_full_socket_finish_in_order_through_the_writer() {
        // Rank 1 reads nothing at first: the socket's buffers fill, a direct write is cut
        // short, its rest and what follows go through the writer, in order.
        let (a, b) = pair(5);
        let (in_a, _rx_a) = inbound();
        let (mut link, _conn_a) = started(a, 1, in_a, Liveness::default());
        let mut outbox = Outbox::default();
        let mut sent = Vec::new();
        let mut queued_behind_a_cut_write = false;
        for seq in 0..400u64 {
            // Small enough to be written directly, each with bytes of its own; every 50th
            // one of 3 MiB, which no socket buffer takes whole while nobody reads.
            let len = if seq % 50 == 49 {
                DIRECT_MAX.min(3 << 20)
            } else {
                DIRECT_MAX.min(64 << 10) - 8
            };
            let part = Bytes::from((0..len).map(|i| (i as u64 ^ seq) as u8).collect::<Vec<_>>());
            sent.push(vec![part.clone()]);
            assert!(outbox.send(&mut link, data(seq, vec![part])).is_ok());
            let tx = lock(&link.shared.tx);
            queued_behind_a_cut_write |= tx.written > 0 || !tx.queue.is_empty();
        }
        assert!(
            queued_behind_a_cut_write,
            "49 MiB never filled the socket's buffers"
        );
        // Now rank 1 reads.
        let (in_b, rx_b) = inbound();
        let _b_side = started(b, 0, in_b, Liveness::default());
        let mut next = 0;
        while next < sent.len() {
            while !outbox.is_empty() {
                assert!(outbox.flush(&mut link).is_ok());
                if !outbox.is_empty() {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            match rx_b.recv_timeout(Duration::from_secs(30)) {
                Ok(Event::Msg(_, m)) => {
                    assert!(
                        matches!(m.header, Header::P2p { seq, .. } if seq == next as u64),
                        "message {next} out of order"
                    );
                    assert!(m.payload == sent[next], "message {next} changed");
                    next += 1;
                }
                other => panic!("message {next}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_full_queue_would_block_and_a_flush_follows() {
        let (mut link, _conn_a, rx_a, rx_b, _b) = linked(2);
        // Messages of 1 MiB, faster than the writer sends them: the queue fills.
        let chunk = Bytes::from(vec![5u8; 1 << 20]);
        let mut refused = None;
        for seq in 0..(4 * QUEUE as u64) {
            match link.try_send(data(seq, vec![chunk.clone()])) {
                Ok(()) => {}
                Err(LinkError::WouldBlock(m)) => {
                    refused = Some(m);
                    break;
                }
                Err(LinkError::Closed) => panic!("closed"),
            }
        }
        assert!(refused.is_some(), "the queue never filled");
        // The writer says when it has room again.
        let mut flushed = false;
        while let Ok(ev) = rx_a.recv_timeout(Duration::from_secs(30)) {
            if matches!(ev, Event::Flush(1)) {
                flushed = true;
                break;
            }
        }
        assert!(flushed, "no flush after the queue was full");
        drop(rx_b);
    }

    #[test]
    fn a_peer_that_dies_or_sends_garbage_is_lost_once() {
        // Dies: its socket closes without a goodbye.
        let (a, b) = pair(3);
        let (in_a, rx_a) = inbound();
        let (_link, _conn) = started(a, 1, in_a, Liveness::default());
        drop(b);
        assert!(matches!(
            rx_a.recv_timeout(Duration::from_secs(30)),
            Ok(Event::Lost(1))
        ));
        assert!(
            rx_a.recv_timeout(Duration::from_millis(200)).is_err(),
            "lost once"
        );
        // Garbage after the handshake: not a frame; dropped, reported lost, with the reason
        // logged.
        let (a, mut b) = pair(4);
        let (in_a, rx_a) = inbound();
        let (_link, _conn) = started(a, 1, in_a, Liveness::default());
        let _ = b.write_all(&[0xde; 64]);
        assert!(matches!(
            rx_a.recv_timeout(Duration::from_secs(30)),
            Ok(Event::Lost(1))
        ));
        // A frame header announcing more parts than the limits allow: refused from its prefix.
        let (a, mut b) = pair(5);
        let (in_a, rx_a) = inbound();
        let tight = Limits {
            max_parts: 1,
            max_payload_bytes: 16,
        };
        let (_link, _conn) = start(
            a,
            1,
            tight,
            in_a,
            Liveness::default(),
            Pool::new(RECV_POOL_BYTES),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let frame = codec::encode(&data(0, vec![Bytes::from(vec![1u8; 1000])]));
        let _ = b.write_all(&frame.to_contiguous());
        assert!(matches!(
            rx_a.recv_timeout(Duration::from_secs(30)),
            Ok(Event::Lost(1))
        ));
    }

    /// A path that delays every byte by 20 ms each way (tc netem's delay, in user space):
    /// with a link timeout of 400 ms, ten times the heartbeat, neither side calls the other
    /// lost over 3 s, and messages still arrive whole and in order.
    #[test]
    fn a_delayed_path_raises_no_false_alarm() {
        let quick = Liveness::with_timeout(Some(Duration::from_millis(400)));
        let (a, b) = pair_via(9, Some(Duration::from_millis(20)));
        let (in_a, rx_a) = inbound();
        let (in_b, rx_b) = inbound();
        let (mut link, _ca) = started(a, 1, in_a, quick);
        let _b = started(b, 0, in_b, quick);
        for seq in 0..20u64 {
            assert!(link
                .try_send(data(seq, vec![Bytes::from(vec![seq as u8; 100])]))
                .is_ok());
            std::thread::sleep(Duration::from_millis(150));
        }
        std::thread::sleep(Duration::from_secs(1));
        let mut got = Vec::new();
        while let Ok(ev) = rx_b.try_recv() {
            match ev {
                Event::Msg(_, m) => got.push(m.payload.concat()),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(got.len(), 20);
        for (seq, p) in got.iter().enumerate() {
            assert_eq!(p, &vec![seq as u8; 100]);
        }
        assert!(rx_a.try_recv().is_err(), "a false alarm on rank 0's side");
    }

    #[test]
    fn a_peer_that_falls_silent_is_lost_and_a_quiet_one_is_not() {
        let quick = Liveness::with_timeout(Some(Duration::from_millis(400)));
        // Quiet: both sides run their links and send nothing for 3 s; the heartbeats (every
        // 40 ms) keep each side from calling the other lost.
        let (a, b) = pair(6);
        let (in_a, rx_a) = inbound();
        let (in_b, rx_b) = inbound();
        let _a = started(a, 1, in_a, quick);
        let _b = started(b, 0, in_b, quick);
        std::thread::sleep(Duration::from_secs(3));
        assert!(
            rx_a.try_recv().is_err() && rx_b.try_recv().is_err(),
            "a false alarm"
        );
        // Silent: the peer's socket stays open (no FIN, no reset) and says nothing, as behind
        // a partition: lost once the silence has lasted.
        let (a, b) = pair(7);
        let (in_a, rx_a) = inbound();
        let _a = started(a, 1, in_a, quick);
        assert!(matches!(
            rx_a.recv_timeout(Duration::from_secs(30)),
            Ok(Event::Lost(1))
        ));
        drop(b);
        // Never, when asked so: a silent peer stays.
        let (a, b) = pair(8);
        let (in_a, rx_a) = inbound();
        let never = Liveness::with_timeout(None);
        let _a = started(a, 1, in_a, never);
        assert!(rx_a.recv_timeout(Duration::from_secs(2)).is_err());
        drop(b);
    }
}
