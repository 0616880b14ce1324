//! The TCP transport's link: one connection per pair of ranks, opened with a handshake, carrying the core's frames ([`collectix_runtime::wire::codec`]).
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
//! message after which the queue had filled. Small messages thus wake no writer thread
//! (see `docs/performance.md` for what that saved). The writer encodes each message's head into one reused buffer
//! and writes the head and the payload parts (never copied) with vectored writes: no
//! allocation per frame (but for messages of more than 15 parts). `TCP_NODELAY` is on: the
//! frames are whole messages, and a rank waits for each. The socket buffers are left to the
//! kernel's autotuning (Linux grows them up to `net.ipv4.tcp_wmem`/`tcp_rmem`'s maximum, 4–6 MiB):
//! setting `SO_SNDBUF`/`SO_RCVBUF` would switch it off for that socket and cap the window at
//! the size set.
//!
//! **Receiving.** Whoever reads a connection decodes each frame's head
//! ([`codec::decode_head`]; its limits are checked before anything is allocated for the
//! frame), then reads each payload part straight from the socket into an 8-aligned buffer of
//! its own, recycled through a pool once the rank has dropped it: the kernel's copy is the
//! only one, and a part can be viewed as any dtype without realigning. The message goes to
//! the rank with the link's rank as its source. Two threads read: a caller of the rank that
//! waits for its call reads the rank's connections on every turn of its spin ([`Readers`],
//! the driver's poller), so the answer to a small call crosses no thread; the connection's
//! reader thread waits for the socket to be readable and takes what no caller took
//! ([`Inbound::deliver`], which wakes the rank if nobody drives it). Both read without
//! waiting, under the connection's lock, and hand each message over before they let it go:
//! one connection's messages reach the rank in order, whoever read them.
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
//!
//! Files: `handshake.rs` (the secret, the hello and its answer), `send.rs` (the link and its
//! writer thread), `recv.rs` (a connection's receiving state and its reader thread),
//! `poll.rs` (the callers' reads), `tests.rs`.

mod handshake;
mod poll;
mod recv;
mod send;
#[cfg(test)]
mod tests;

#[cfg(test)]
pub(crate) use handshake::accept;
pub(crate) use handshake::{accept_hello, connect, Hello, Refused, HELLO_TIMEOUT};
pub(crate) use poll::Readers;
pub(crate) use send::TcpLink;

use collectix_runtime::tensor::arena::ArenaPart;
use collectix_runtime::tensor::pool::Pool;
use collectix_runtime::wire::codec::Limits;
use collectix_runtime::wire::{Header, Message};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Messages a link queues for its writer before it says "would block".
pub(crate) const QUEUE: usize = 64;
/// Payloads up to this size are written by the sending thread itself when the writer is idle,
/// as far as the socket's buffer takes them without waiting (see the module doc); larger ones
/// always go to the writer, which copies them into the socket outside the rank's lock.
/// Raising it from 64 KiB to 4 MiB made mid-sized all_reduces over TCP faster
/// (`docs/performance.md`).
pub(crate) const DIRECT_MAX: usize = 4 << 20;
/// Free payload buffers a process's readers keep for reuse (one pool for all its
/// connections; see [`start`]).
pub(crate) const RECV_POOL_BYTES: usize = 256 << 20;

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

/// Where a link's arrivals and events go (the rank actor, or a test).
pub(crate) trait Inbound: Send + Sync + 'static {
    /// A message from global rank `src` (stamped by the link), read by the connection's reader
    /// thread.
    fn deliver(&self, src: usize, msg: Message);
    /// A message from global rank `src` read by a caller of the rank that drives it now (see
    /// [`Readers`]): nobody need be woken. By default, [`deliver`](Inbound::deliver).
    fn deliver_driving(&self, src: usize, msg: Message) {
        self.deliver(src, msg);
    }
    /// Where the parts of a message from global rank `src` go, given its decoded head, if
    /// the rank expects it (see `collectix_runtime::landing`). By default, nowhere: the
    /// parts are read into buffers of the reader's own.
    fn place(&self, _src: usize, _header: &Header, _lens: &[usize]) -> Option<Vec<ArenaPart>> {
        None
    }
    /// The link to `peer` can take messages again.
    fn flush(&self, peer: usize);
    /// The link to `peer` is gone: it broke or fell silent, and the peer may be alive.
    fn lost(&self, peer: usize);
    /// The link to `peer` is gone, and the peer with it for certain: its kernel closed or
    /// reset the connection. By default, [`lost`](Inbound::lost).
    fn dead(&self, peer: usize) {
        self.lost(peer);
    }
    /// A new incarnation of `peer` (a restarted process) connected: the previous one is gone
    /// for good, and this link is to the new one. By default, the previous one's loss.
    fn rejoined(&self, peer: usize) {
        self.lost(peer);
    }
}

/// The writer thread of one connection; joining it waits for the writer to send what was
/// queued. (The reader runs detached: it ends when the peer closes or the socket breaks.)
pub(crate) struct Connection {
    /// The writer (ends when the link is dropped and its queue is sent, or the socket
    /// breaks).
    pub(crate) writer: JoinHandle<()>,
}

/// Why a link ended when its peer closed the connection between two frames.
pub(crate) const CLOSED_BY_PEER: &str = "the peer closed the connection";

/// How the reason of a link that ended because the peer's kernel reset it begins.
pub(crate) const RESET_BY_PEER: &str = "the peer's kernel reset the connection";

/// Why a link ended, from the IO error `e` of `what` (a read, a write): a reset or a broken
/// pipe says so ([`RESET_BY_PEER`]), as the peer's process is gone for certain.
pub(crate) fn io_loss(what: &str, e: &std::io::Error) -> String {
    use std::io::ErrorKind::{BrokenPipe, ConnectionAborted, ConnectionReset};
    match e.kind() {
        ConnectionReset | BrokenPipe | ConnectionAborted => {
            format!("{RESET_BY_PEER} ({what}: {e})")
        }
        _ => format!("{what} failed: {e}"),
    }
}

/// Whether a link that ended for `why` tells that the peer is dead for certain: its kernel
/// closed the connection at a frame boundary or reset it (a process that exits or is killed
/// has its sockets closed by its kernel; a partition or a stopped process closes nothing).
pub(crate) fn certain_death(why: &str) -> bool {
    why == CLOSED_BY_PEER || why.starts_with(RESET_BY_PEER)
}

/// Starts the reader and writer of an accepted or connected `stream` to global rank `peer`;
/// what arrives goes to `inbound`, its payload parts in buffers from `pool` (shared by a
/// process's connections, [`RECV_POOL_BYTES`]). With `readers`, the rank's waiting callers
/// read the connection too ([`Readers`]).
pub(crate) fn start(
    stream: TcpStream,
    peer: usize,
    limits: Limits,
    inbound: Arc<dyn Inbound>,
    liveness: Liveness,
    pool: Pool,
    readers: Option<&Readers>,
) -> std::io::Result<(TcpLink, Connection)> {
    stream.set_nodelay(true)?;
    stream.set_read_timeout(liveness.silence)?;
    let receiving = Arc::new(recv::Receiving::new(
        stream.try_clone()?,
        stream.try_clone()?,
        peer,
        limits,
        pool,
        inbound.clone(),
    )?);
    let shared = Arc::new(send::Sending::new(stream.try_clone()?));
    let lost_once = Arc::new(AtomicBool::new(false));
    let lose = {
        let (inbound, lost_once) = (inbound.clone(), lost_once.clone());
        move |why: &str| {
            if !lost_once.swap(true, Ordering::SeqCst) {
                // A peer that closes its end at a frame boundary may have left in order (the
                // engine knows, and warns of a loss that matters); anything else is a fault.
                if why == CLOSED_BY_PEER {
                    tracing::debug!(peer, reason = why, "link closed");
                } else {
                    tracing::warn!(peer, reason = why, "link lost");
                }
                if certain_death(why) {
                    inbound.dead(peer);
                } else {
                    inbound.lost(peer);
                }
            }
        }
    };
    let writer = {
        let (shared, inbound, lose) = (shared.clone(), inbound.clone(), lose.clone());
        std::thread::Builder::new()
            .name(format!("collectix-tx-{peer}"))
            .spawn(move || {
                send::write_loop(
                    stream,
                    &shared,
                    peer,
                    liveness.heartbeat,
                    inbound.as_ref(),
                    &lose,
                )
            })?
    };
    let _reader = {
        let receiving = receiving.clone();
        std::thread::Builder::new()
            .name(format!("collectix-rx-{peer}"))
            .spawn(move || recv::read_loop(&receiving, liveness, &lose))?
    };
    if let Some(r) = readers {
        r.add(receiving);
    }
    Ok((TcpLink::new(shared), Connection { writer }))
}
