//! The receiving side of a link: what a connection has read and not yet handed over
//! ([`Rx`], a state machine that any thread may drive a step further), and the connection's
//! reader thread. See the module doc of `tcp`.
//!
//! Two threads read a connection: its reader thread, which waits for the socket to be
//! readable and then reads what is there, and a caller of the rank that polls the rank's
//! connections while it waits for its call ([`super::poll::Readers`]), so that a message to a
//! rank whose caller waits for it crosses no thread. Both read through the same [`Rx`] under
//! its lock, without waiting (`MSG_DONTWAIT`), and hand each message over before they let the
//! lock go: the messages of one connection reach the rank in the order they were sent,
//! whoever read them.

use super::{Inbound, Liveness};
use crate::sync::lock;
use bytes::{Buf, Bytes, BytesMut};
use collectix_runtime::tensor::arena::ArenaPart;
use collectix_runtime::tensor::pool::{Pool, PoolBuf};
use collectix_runtime::wire::codec::{self, Limits};
use collectix_runtime::wire::{Header, Message};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Bytes asked of the socket per read of heads.
const READ_CHUNK: usize = 256 << 10;
/// Parts up to this size are read into a pooled buffer taken whole; larger ones into a buffer
/// that grows by this much as the bytes arrive.
const BIG_PART: usize = 64 << 20;
/// How long the reader thread sleeps through arrivals, at most, while callers read the
/// connection (see [`read_loop`]): once no caller looked at it for this long, every arrival
/// wakes the reader again. A call left to the background is so delayed by at most about
/// twice this much (a caller that parks wakes the reader itself).
const LINGER: Duration = Duration::from_millis(2);
/// Most messages a caller's step hands over before it goes back to its call.
const BURST: usize = 64;
/// Frames of at least this many payload bytes are read by the reader thread, not by a
/// polling caller: the caller goes on with its call (sends, reductions) while the kernel
/// copies the frame on another thread, and the reader thread's wake-up is small beside the
/// frame's time on the wire.
const HANDOFF: usize = 256 << 10;

/// A connection's receiving side, shared by its reader thread and the rank's polling callers.
pub(crate) struct Receiving {
    /// The global rank at the other end.
    pub(super) peer: usize,
    /// A clone of the socket, to wait on without the state's lock.
    wait: TcpStream,
    state: Mutex<Rx>,
    /// Where messages go: to the rank's inbox.
    pub(super) inbound: std::sync::Arc<dyn Inbound>,
    /// When the last read that brought bytes was, whoever read (the reader thread or a
    /// polling caller), in nanoseconds since `born`; 0: none yet. The reader thread tells
    /// silence by it.
    heard: AtomicU64,
    /// When this receiving side was made.
    born: Instant,
    /// The connection ended (its loss is the reader thread's to report): pollers skip it.
    ended: AtomicBool,
    /// Counts callers' looks at the connection (the reader thread sleeps through arrivals
    /// while it moves).
    looks: AtomicU64,
    /// What the reader thread waits on.
    watch: Watch,
}

/// What a connection has read and not yet handed over (under [`Receiving::state`]).
struct Rx {
    sock: TcpStream,
    peer: usize,
    limits: Limits,
    pool: Pool,
    /// Heads, and what a read brought beyond them.
    buf: BytesMut,
    /// Where reads of heads land (zeroed once).
    scratch: Vec<u8>,
    /// The frame whose head is read and whose parts are not all here yet.
    frame: Option<Frame>,
    /// Why the connection ended, once it did: every later step says so again.
    ended: Option<String>,
    /// An arrival wakes the reader thread (its watch is armed).
    armed: bool,
    /// The step in progress is a polling caller's (which leaves big frames alone).
    caller: bool,
}

/// A frame whose head is decoded: its parts fill one after the other.
struct Frame {
    header: Header,
    parts: Vec<usize>,
    /// The places of the parts, if the message lands (`collectix_runtime::landing`; last
    /// part first).
    landed: Vec<ArenaPart>,
    done: Vec<Bytes>,
    filling: Option<Filling>,
    /// Its payload is at least [`HANDOFF`] bytes: the reader thread reads it.
    big: bool,
}

/// The part being read, straight from the socket into its own buffer: one copy, the
/// kernel's, and no zeroing.
enum Filling {
    /// A part of at most [`BIG_PART`] bytes: an 8-aligned buffer from the pool, taken whole.
    Pooled { part: PoolBuf, at: usize },
    /// A part that lands: into its place in the output of the call that expects it.
    Landed { part: ArenaPart, at: usize },
    /// A larger part: a buffer that grows by [`BIG_PART`] as its bytes arrive (a length
    /// announced by a peer is never allocated ahead of the data, beyond one step).
    Big {
        words: Vec<u64>,
        at: usize,
        len: usize,
    },
}

/// How one read ended.
enum Read {
    /// Bytes came.
    Got(usize),
    /// Nothing there now.
    Empty,
}

impl Receiving {
    /// The receiving side of `sock` (a clone of the connection's socket) from `peer`; `wait`,
    /// another clone, is waited on.
    pub(super) fn new(
        sock: TcpStream,
        wait: TcpStream,
        peer: usize,
        limits: Limits,
        pool: Pool,
        inbound: std::sync::Arc<dyn Inbound>,
    ) -> std::io::Result<Receiving> {
        let watch = Watch::new(&wait)?;
        Ok(Receiving {
            peer,
            wait,
            state: Mutex::new(Rx {
                sock,
                peer,
                limits,
                pool,
                buf: BytesMut::with_capacity(READ_CHUNK),
                scratch: vec![0u8; READ_CHUNK],
                frame: None,
                ended: None,
                armed: true,
                caller: false,
            }),
            inbound,
            heard: AtomicU64::new(0),
            born: Instant::now(),
            ended: AtomicBool::new(false),
            looks: AtomicU64::new(0),
            watch,
        })
    }

    /// The socket, to wait on.
    #[cfg(unix)]
    pub(super) fn socket(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.wait.as_fd()
    }

    /// Whether the connection ended (its loss is reported by its reader thread).
    pub(super) fn has_ended(&self) -> bool {
        self.ended.load(Ordering::Acquire)
    }

    /// A caller's step, unless another thread is reading the connection now: reads what is
    /// there without waiting and hands each whole message to the rank as its driver
    /// ([`Inbound::deliver_driving`]), up to a big frame, which it leaves to the reader
    /// thread ([`HANDOFF`]). Whether anything came.
    pub(super) fn poll(&self) -> bool {
        let Ok(mut rx) = self.state.try_lock() else {
            return false;
        };
        let mut came = false;
        if !rx.big_pending() {
            self.looks.fetch_add(1, Ordering::Relaxed);
            rx.caller = true;
            let got = rx.step(self.inbound.as_ref(), &mut |m| {
                self.inbound.deliver_driving(self.peer, m)
            });
            rx.caller = false;
            came = self.note(got);
            if !rx.big_pending() {
                return came;
            }
        }
        // A big frame is the reader thread's: its watch must be armed.
        self.arm_locked(&mut rx);
        came
    }

    /// Arms the reader thread's watch if it is not (every arrival wakes it again): for a
    /// caller that stops reading with its call not done, whose answer the reader thread then
    /// takes at once, or for the reader thread once callers stopped. `wait`: take the lock
    /// even if another thread holds it (else a busy lock is left: the reader thread arms its
    /// watch within [`LINGER`]).
    pub(super) fn arm(&self, wait: bool) {
        let rx = if wait {
            Some(lock(&self.state))
        } else {
            self.state.try_lock().ok()
        };
        if let Some(mut rx) = rx {
            self.arm_locked(&mut rx);
        }
    }

    fn arm_locked(&self, rx: &mut Rx) {
        if !rx.armed {
            match self.watch.arm(&self.wait) {
                Ok(()) => rx.armed = true,
                Err(e) => tracing::warn!(peer = self.peer, error = %e, "cannot watch a socket"),
            }
        }
    }

    /// The reader thread's step: as [`poll`](Self::poll), waiting for the lock, handing
    /// messages over with [`Inbound::deliver`]. `Err` once the connection ended.
    /// `woke`: the watch fired (and is disarmed now).
    fn read(&self, woke: bool) -> Result<bool, String> {
        let got = {
            let mut rx = lock(&self.state);
            if woke {
                rx.armed = false;
            }
            rx.step(self.inbound.as_ref(), &mut |m| {
                self.inbound.deliver(self.peer, m)
            })
        };
        match got {
            Ok(g) => Ok(self.note(Ok(g))),
            Err(why) => {
                self.ended.store(true, Ordering::Release);
                Err(why)
            }
        }
    }

    /// Counts a step that brought bytes; an ended connection is marked for the pollers.
    fn note(&self, got: Result<bool, String>) -> bool {
        match got {
            Ok(true) => {
                let at = u64::try_from(self.born.elapsed().as_nanos()).unwrap_or(u64::MAX);
                self.heard.fetch_max(at, Ordering::Relaxed);
                true
            }
            Ok(false) => false,
            Err(_) => {
                self.ended.store(true, Ordering::Release);
                false
            }
        }
    }
}

impl Rx {
    /// Whether a big frame is being read (the reader thread's: see [`HANDOFF`]).
    fn big_pending(&self) -> bool {
        self.frame.as_ref().is_some_and(|f| f.big)
    }

    /// Reads what the socket has, without waiting, and hands every whole message to
    /// `deliver`, in order. `Ok(true)` if bytes came; `Err(why)` once the connection ended
    /// (closed, broken, or carrying something that is not a frame).
    /// `to`: where messages the rank expects land.
    fn step(&mut self, to: &dyn Inbound, deliver: &mut dyn FnMut(Message)) -> Result<bool, String> {
        if let Some(why) = &self.ended {
            return Err(why.clone());
        }
        let got = self.step_inner(to, deliver);
        if let Err(why) = &got {
            self.ended = Some(why.clone());
        }
        got
    }

    fn step_inner(
        &mut self,
        to: &dyn Inbound,
        deliver: &mut dyn FnMut(Message),
    ) -> Result<bool, String> {
        let mut came = false;
        let mut handed = 0;
        loop {
            if self.frame.is_some() {
                match self.fill()? {
                    Some(msg) => deliver(msg),
                    None => return Ok(came),
                }
                // Parts read straight from the socket count as bytes that came.
                came = true;
                handed += 1;
                if self.caller && handed >= BURST {
                    // A caller goes back to its call (its rank runs what came) before it
                    // reads more: a peer that keeps sending cannot keep it here.
                    return Ok(true);
                }
                continue;
            }
            match codec::decode_head(&mut self.buf, &self.limits) {
                Ok(Some(h)) => {
                    let big = h.parts.iter().fold(0usize, |a, &p| a.saturating_add(p)) >= HANDOFF;
                    let mut landed = to.place(self.peer, &h.header, &h.parts).unwrap_or_default();
                    landed.reverse();
                    self.frame = Some(Frame {
                        header: h.header,
                        landed,
                        done: Vec::with_capacity(h.parts.len()),
                        parts: h.parts,
                        filling: None,
                        big,
                    });
                    if big && self.caller {
                        // Left to the reader thread (see `HANDOFF`).
                        return Ok(came);
                    }
                    continue;
                }
                Ok(None) => {}
                Err(e) => return Err(format!("not a collectix frame: {e}")),
            }
            let mid = !self.buf.is_empty();
            match read_now(&self.sock, &mut self.scratch, mid)? {
                Read::Got(n) => {
                    came = true;
                    self.buf.extend_from_slice(&self.scratch[..n]);
                }
                Read::Empty => return Ok(came),
            }
        }
    }

    /// Fills the frame in progress: its message once every part is here, `None` while the
    /// socket has no more for now.
    fn fill(&mut self) -> Result<Option<Message>, String> {
        let Some(f) = self.frame.as_mut() else {
            return Ok(None);
        };
        while f.done.len() < f.parts.len() {
            let filling = match &mut f.filling {
                Some(x) => x,
                None => {
                    let len = f.parts[f.done.len()];
                    let mut x = if let Some(part) = f.landed.pop() {
                        Filling::Landed { part, at: 0 }
                    } else if len > BIG_PART {
                        Filling::Big {
                            words: Vec::new(),
                            at: 0,
                            len,
                        }
                    } else {
                        Filling::Pooled {
                            part: self.pool.take(len),
                            at: 0,
                        }
                    };
                    // What the last read of heads brought beyond them is the part's start.
                    x.take_from(&mut self.buf);
                    f.filling.insert(x)
                }
            };
            while let Some(dst) = filling.room() {
                match read_now(&self.sock, dst, true)? {
                    Read::Got(n) => filling.advance(n),
                    Read::Empty => return Ok(None),
                }
            }
            if let Some(x) = f.filling.take() {
                f.done.push(x.freeze());
            }
        }
        let Some(f) = self.frame.take() else {
            return Ok(None);
        };
        Ok(Some(Message {
            src: self.peer,
            header: f.header,
            payload: f.done,
        }))
    }
}

impl Filling {
    /// Takes the part's first bytes from `buf` (what a read of heads brought).
    fn take_from(&mut self, buf: &mut BytesMut) {
        if buf.is_empty() {
            return;
        }
        if let Some(dst) = self.room() {
            let have = buf.len().min(dst.len());
            dst[..have].copy_from_slice(&buf[..have]);
            buf.advance(have);
            self.advance(have);
        }
    }

    /// Where the part's next bytes go (`None` once it is whole); a big part grows by one step
    /// when its last step is full.
    fn room(&mut self) -> Option<&mut [u8]> {
        match self {
            Filling::Pooled { part, at } => {
                let dst = part.bytes_mut();
                (*at < dst.len()).then(move || &mut dst[*at..])
            }
            Filling::Landed { part, at } => {
                let dst = part.bytes_mut();
                (*at < dst.len()).then(move || &mut dst[*at..])
            }
            Filling::Big { words, at, len } => {
                if *at >= *len {
                    return None;
                }
                let upto = (*at / BIG_PART + 1).saturating_mul(BIG_PART).min(*len);
                if words.len() < upto.div_ceil(8) {
                    words.resize(upto.div_ceil(8), 0);
                }
                let dst: &mut [u8] = bytemuck::cast_slice_mut(words.as_mut_slice());
                Some(&mut dst[*at..upto])
            }
        }
    }

    fn advance(&mut self, n: usize) {
        match self {
            Filling::Pooled { at, .. } | Filling::Landed { at, .. } | Filling::Big { at, .. } => {
                *at += n
            }
        }
    }

    fn freeze(self) -> Bytes {
        match self {
            Filling::Pooled { part, .. } => part.freeze(),
            Filling::Landed { part, .. } => part.freeze(),
            Filling::Big { words, len, .. } => {
                let mut b = collectix_runtime::tensor::bytes_from_vec(words);
                b.truncate(len);
                b
            }
        }
    }
}

/// The reader thread: waits for the socket to be readable and reads what is there (unless a
/// caller polling the connection took it first), handing each message to the rank; reports
/// the peer lost (`lose`) when the connection closes, breaks, falls silent (nothing at all
/// for the liveness's silence, whoever read) or carries something that is not a frame.
///
/// While callers read the connection this thread sleeps through arrivals: its watch, disarmed
/// by the wake-up that found callers looking, stays so, and it looks again every [`LINGER`];
/// once no caller looked for a whole turn, it arms the watch again ([`Watch`]).
pub(super) fn read_loop(rx: &Receiving, liveness: Liveness, lose: &dyn Fn(&str)) {
    // How long since anything came (since the connection was made, if nothing did). Timed
    // from the read that brought it, not from when this thread noticed: a caller may have
    // read the last heartbeat while this thread waited out the whole silence.
    let quiet = || {
        rx.born
            .elapsed()
            .saturating_sub(Duration::from_nanos(rx.heard.load(Ordering::Relaxed)))
    };
    let mut looks = rx.looks.load(Ordering::Relaxed);
    loop {
        let left = liveness.silence.map(|s| s.saturating_sub(quiet()));
        let armed = lock(&rx.state).armed;
        let wait = if armed {
            left
        } else {
            Some(left.map_or(LINGER, |l| l.min(LINGER)))
        };
        let woke = match rx.watch.wait(&rx.wait, wait) {
            Ok(w) => w,
            Err(why) => return lose(&why),
        };
        if let Err(why) = rx.read(woke) {
            return lose(&why);
        }
        let now = rx.looks.load(Ordering::Relaxed);
        if now == looks || lock(&rx.state).big_pending() {
            // No caller looked since the last turn, or a big frame is on its way: every
            // arrival wakes this thread again.
            rx.arm(true);
        }
        looks = now;
        if let Some(s) = liveness.silence {
            if quiet() >= s {
                rx.ended.store(true, Ordering::Release);
                return lose(&format!(
                    "nothing from rank {} for {s:?}, not even a heartbeat: unreachable \
                     (a network partition, a host down, or a stopped process)",
                    rx.peer
                ));
            }
        }
    }
}

/// What a reader thread waits on: its socket, armed for one wake-up at a time. On Linux an
/// epoll of its own with the socket registered `EPOLLONESHOT`: a wake-up disarms it, and the
/// reader thread arms it again unless callers are reading the connection, so that arrivals
/// the callers take wake nobody. Elsewhere `poll` (every arrival wakes the reader).
struct Watch {
    #[cfg(target_os = "linux")]
    ep: nix::sys::epoll::Epoll,
}

#[cfg(target_os = "linux")]
impl Watch {
    fn events() -> nix::sys::epoll::EpollEvent {
        use nix::sys::epoll::{EpollEvent, EpollFlags};
        EpollEvent::new(
            EpollFlags::EPOLLIN | EpollFlags::EPOLLRDHUP | EpollFlags::EPOLLONESHOT,
            0,
        )
    }

    /// A watch of `sock`, armed.
    fn new(sock: &TcpStream) -> std::io::Result<Watch> {
        use nix::sys::epoll::{Epoll, EpollCreateFlags};
        let ep = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
        ep.add(sock, Watch::events())?;
        Ok(Watch { ep })
    }

    /// Arms the watch again (an arrival that is there already wakes the reader at once).
    fn arm(&self, sock: &TcpStream) -> std::io::Result<()> {
        Ok(self.ep.modify(sock, &mut Watch::events())?)
    }

    /// Waits for an arrival (or the connection's end) for at most `left` (`None`: no limit);
    /// whether one woke it (the watch is disarmed then).
    fn wait(&self, _: &TcpStream, left: Option<Duration>) -> Result<bool, String> {
        let mut events = [nix::sys::epoll::EpollEvent::empty()];
        match self.ep.wait(&mut events, timeout(left)) {
            Ok(n) => Ok(n > 0),
            Err(nix::errno::Errno::EINTR) => Ok(false),
            Err(e) => Err(format!("waiting for the socket failed: {e}")),
        }
    }
}

#[cfg(not(target_os = "linux"))]
impl Watch {
    fn new(_: &TcpStream) -> std::io::Result<Watch> {
        Ok(Watch {})
    }

    fn arm(&self, _: &TcpStream) -> std::io::Result<()> {
        Ok(())
    }

    /// Waits until the socket is readable (or closed, or broken), for at most `left`;
    /// `false`: the watch is always armed.
    #[cfg(unix)]
    fn wait(&self, sock: &TcpStream, left: Option<Duration>) -> Result<bool, String> {
        use nix::poll::{poll, PollFd, PollFlags};
        use std::os::fd::AsFd;
        let mut fds = [PollFd::new(sock.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, timeout(left)) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => Ok(false),
            Err(e) => Err(format!("waiting for the socket failed: {e}")),
        }
    }

    /// Without `poll` the reader thread reads blocking (the socket's read timeout is the
    /// liveness's silence) and callers do not read.
    #[cfg(not(unix))]
    fn wait(&self, _: &TcpStream, _: Option<Duration>) -> Result<bool, String> {
        Ok(false)
    }
}

/// A wait of at most `left` (`None`: no limit), at least a millisecond so that a wait near its
/// end does not spin.
#[cfg(unix)]
fn timeout(left: Option<Duration>) -> nix::poll::PollTimeout {
    use nix::poll::PollTimeout;
    match left {
        None => PollTimeout::NONE,
        Some(d) => {
            PollTimeout::try_from(d.max(Duration::from_millis(1))).unwrap_or(PollTimeout::MAX)
        }
    }
}

/// One read into `dst` (not empty) that does not wait: what came, or why the connection is
/// lost (`mid`: in the middle of a frame).
fn read_now(s: &TcpStream, dst: &mut [u8], mid: bool) -> Result<Read, String> {
    loop {
        return match recv_now(s, dst) {
            Ok(0) if mid => Err("the peer closed the connection in the middle of a frame".into()),
            Ok(0) => Err(super::CLOSED_BY_PEER.into()),
            Ok(n) => Ok(Read::Got(n)),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                Ok(Read::Empty)
            }
            Err(e) => Err(super::io_loss("read", &e)),
        };
    }
}

/// `recv` with `MSG_DONTWAIT`: the socket stays blocking for the writer thread, which shares
/// its file description.
#[cfg(unix)]
fn recv_now(s: &TcpStream, dst: &mut [u8]) -> std::io::Result<usize> {
    use nix::sys::socket::{recv, MsgFlags};
    use std::os::fd::AsRawFd;
    recv(s.as_raw_fd(), dst, MsgFlags::MSG_DONTWAIT).map_err(std::io::Error::from)
}

/// Elsewhere the reader thread reads blocking (the socket's read timeout is the liveness's
/// silence) and callers do not poll.
#[cfg(not(unix))]
fn recv_now(mut s: &TcpStream, dst: &mut [u8]) -> std::io::Result<usize> {
    std::io::Read::read(&mut s, dst)
}

#[cfg(test)]
mod tests {
    use super::*;
    use collectix_runtime::wire::Header;
    use collectix_runtime::{DType, GroupId};
    use std::io::Write;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;

    /// Counts what reaches the rank, by the way it came.
    #[derive(Default)]
    struct Count {
        read: AtomicUsize,
        driven: AtomicUsize,
    }

    impl Inbound for Count {
        fn deliver(&self, _: usize, _: Message) {
            self.read.fetch_add(1, Ordering::SeqCst);
        }
        fn deliver_driving(&self, _: usize, _: Message) {
            self.driven.fetch_add(1, Ordering::SeqCst);
        }
        fn flush(&self, _: usize) {}
        fn lost(&self, _: usize) {}
    }

    #[test]
    fn a_callers_step_hands_over_at_most_a_burst_and_then_the_rest() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
        let addr = l.local_addr().unwrap_or_else(|e| panic!("{e}"));
        let mut a = TcpStream::connect(addr).unwrap_or_else(|e| panic!("{e}"));
        let (b, _) = l.accept().unwrap_or_else(|e| panic!("{e}"));
        let n = 3 * BURST + 5;
        let mut bytes = Vec::new();
        for seq in 0..n as u64 {
            let msg = Message {
                src: 0,
                header: Header::P2p {
                    group: GroupId::WORLD,
                    tag: 0,
                    seq,
                    dtype: DType::U8,
                    count: 1,
                    eager: true,
                    path: collectix_runtime::DataPath::Engine,
                },
                payload: vec![bytes::Bytes::from(vec![seq as u8])],
            };
            bytes.extend_from_slice(&codec::encode(&msg).to_contiguous());
        }
        a.write_all(&bytes).unwrap_or_else(|e| panic!("{e}"));
        let count = Arc::new(Count::default());
        let rx = Receiving::new(
            b.try_clone().unwrap_or_else(|e| panic!("{e}")),
            b,
            1,
            Limits::default(),
            Pool::new(1 << 20),
            count.clone(),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        // Every byte is in the socket before the first step (a peer that keeps sending).
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut steps = Vec::new();
        while count.driven.load(Ordering::SeqCst) < n && Instant::now() < deadline {
            let before = count.driven.load(Ordering::SeqCst);
            rx.poll();
            let got = count.driven.load(Ordering::SeqCst) - before;
            assert!(got <= BURST, "one step handed over {got}");
            if got > 0 {
                steps.push(got);
            }
        }
        assert_eq!(count.driven.load(Ordering::SeqCst), n, "steps: {steps:?}");
        assert_eq!(count.read.load(Ordering::SeqCst), 0);
        assert!(steps.len() >= 4, "steps: {steps:?}");
    }
}
