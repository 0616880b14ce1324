//! The sending side of a link: [`TcpLink`] (direct writes from the sending thread when the
//! writer is idle) and the connection's writer thread (the queue, heartbeats, vectored
//! writes). See the module doc of `tcp`.

use super::{Inbound, DIRECT_MAX, QUEUE};
use crate::sync::lock;
use bytes::BytesMut;
use collectix_runtime::wire::codec;
use collectix_runtime::wire::{Link, LinkError, Message};
use std::collections::VecDeque;
use std::io::{IoSlice, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// Slices of one vectored write kept on the writer's stack (a head and up to 15 parts).
const INLINE_SLICES: usize = 16;

/// The sending side of a connection to one peer (see the module doc).
pub(crate) struct TcpLink {
    pub(super) shared: Arc<Sending>,
}

impl TcpLink {
    /// The link over `shared` (whose writer thread is started by the caller).
    pub(super) fn new(shared: Arc<Sending>) -> TcpLink {
        TcpLink { shared }
    }
}

impl Sending {
    /// The sending side of `socket`, with nothing queued.
    pub(super) fn new(socket: TcpStream) -> Sending {
        Sending {
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
            socket,
        }
    }
}

/// What the link and the connection's writer thread share.
pub(super) struct Sending {
    pub(super) tx: Mutex<Tx>,
    /// The writer has messages to send, or the link was dropped.
    ready: Condvar,
    /// Set when the queue was found full; the writer then sends a flush.
    full: AtomicBool,
    /// The socket, for the link's direct writes.
    socket: TcpStream,
}

/// The sending side's state, under [`Sending::tx`].
pub(super) struct Tx {
    /// Messages for the writer thread, in order.
    pub(super) queue: VecDeque<Message>,
    /// Bytes of the front message's frame already written (by a direct write cut short).
    pub(super) written: usize,
    /// The writer thread is writing (outside the lock): nobody else may write now.
    pub(super) busy: bool,
    /// The link was dropped: the writer sends what is queued, then closes its side.
    pub(super) dropped: bool,
    /// The socket broke: the writer reported the peer lost and has ended.
    pub(super) broken: bool,
    /// The head of a direct write (reused: no allocation per frame).
    pub(super) head: BytesMut,
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

/// The writer thread: sends what the link queued, in order, and a heartbeat after
/// `heartbeat` of quiet; reports the peer lost (`lose`) when the socket breaks.
pub(super) fn write_loop(
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
                    return lose(&super::io_loss("write", &e));
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
            return lose(&super::io_loss("write", &e));
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
