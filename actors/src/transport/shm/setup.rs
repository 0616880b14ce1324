//! How the processes of one host get each other's segments: each listens on an abstract Unix
//! socket whose name it publishes through the store (with its host's identity); for each
//! pair, the higher rank connects to the lower. On the connection:
//! 1. the peer's user must be this process's (`SO_PEERCRED`), and both sides run the job's
//!    challenge–response ([`Security`], context `shm`): a process without the job's secret,
//!    or of another user, gets nothing;
//! 2. each side sends a hello (magic, job, its rank, the rank it wants, whether it has a
//!    segment) with its segment's memfd attached (`SCM_RIGHTS`), and checks the other's. A
//!    rank that could not make its segment still says so, so that nobody waits for it.
//!
//! The memfds have no name: once mapped they are closed, and nothing is left in `/dev/shm`
//! or anywhere else when a process dies. The sockets close when the exchange is done.

use super::os;
use crate::security::Security;
use crate::sync::lock;
use collectix_runtime::{Error, Result};
use nix::sys::socket::{
    getsockopt, recvmsg, sendmsg, sockopt, ControlMessage, ControlMessageOwned, MsgFlags,
};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::io::{IoSlice, IoSliceMut};
use std::net::Shutdown;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// The exchange's magic.
const MAGIC: [u8; 8] = *b"cx-shm-2";
/// Bytes of a hello: magic, job (u64), from (u32), to (u32), has a segment (u8), the
/// address of the sender's probe word (u64: see `os::PROBE`), has a shared heap (u8), the
/// heap's address in the sender (u64).
const HELLO: usize = 42;
/// Context of the secret's challenge–response on these sockets.
const CONTEXT: &[u8] = b"shm";

/// A rank's listening socket, bound before it publishes its name.
pub(crate) struct Listener {
    socket: UnixListener,
    /// The abstract name (without its leading NUL), as published.
    pub(crate) name: String,
}

impl Listener {
    /// Binds an abstract socket with an unguessable name for `rank` of `job`.
    pub(crate) fn bind(job_hint: u64, rank: usize) -> Result<Listener> {
        let mut random = [0u8; 16];
        getrandom::fill(&mut random)
            .map_err(|e| Error::Resource(format!("no randomness for a socket name: {e}")))?;
        let hex: String = random.iter().map(|b| format!("{b:02x}")).collect();
        let name = format!("collectix/{job_hint:x}/{rank}/{hex}");
        let addr = SocketAddr::from_abstract_name(name.as_bytes())
            .map_err(|e| Error::Resource(format!("an abstract socket name: {e}")))?;
        let socket = UnixListener::bind_addr(&addr)
            .map_err(|e| Error::Resource(format!("cannot listen on a Unix socket: {e}")))?;
        Ok(Listener { socket, name })
    }
}

/// What the exchange needs to know of the job.
pub(crate) struct Exchange<'a> {
    pub(crate) job: u64,
    pub(crate) rank: usize,
    /// The ranks of this host (this one included) and their sockets' names.
    pub(crate) local: &'a BTreeMap<usize, String>,
    pub(crate) security: &'a Security,
    pub(crate) deadline: Instant,
}

/// What this rank offers its peers: its segment's memfd and its shared heap's, with the
/// heap's address in this process, each if it has one.
#[derive(Default)]
pub(crate) struct Offer {
    pub(crate) segment: Option<OwnedFd>,
    pub(crate) heap: Option<(OwnedFd, u64)>,
}

impl Offer {
    fn try_clone(&self) -> std::io::Result<Offer> {
        Ok(Offer {
            segment: self.segment.as_ref().map(OwnedFd::try_clone).transpose()?,
            heap: match &self.heap {
                Some((fd, at)) => Some((fd.try_clone()?, *at)),
                None => None,
            },
        })
    }
}

/// What a peer sent and is.
pub(crate) struct Peer {
    /// Its segment's memfd, or `None` if it has none.
    pub(crate) fd: Option<OwnedFd>,
    /// Its shared heap's memfd and the heap's address in the peer, if it has one.
    pub(crate) heap: Option<(OwnedFd, u64)>,
    /// Its pid, as the kernel says (`SO_PEERCRED`).
    pub(crate) pid: i32,
    /// Where its probe word is, as it says.
    pub(crate) probe: u64,
}

/// What each peer sent, by rank.
pub(crate) type Got = BTreeMap<usize, Peer>;

/// Connects to every lower local rank and accepts every higher one, sending `own` (this
/// rank's segment, if it could make one) to each; returns what each peer sent, by rank. A
/// failure with one peer leaves it out of the result (and is logged); the exchange goes on
/// with the others, within the deadline.
pub(crate) fn exchange(x: &Exchange<'_>, listener: Listener, own: &Offer) -> Result<Got> {
    let mut got = BTreeMap::new();
    let higher = x.local.keys().filter(|&&r| r > x.rank).count();
    // Lower ranks first: each connects to the ones below it, which are accepting (every rank
    // accepts while it connects: the accepting half runs on a thread of its own).
    let (acc, own_dup) = (
        listener,
        own.try_clone()
            .map_err(|e| Error::Resource(format!("dup of a memfd: {e}")))?,
    );
    let (job, rank, deadline, security) = (x.job, x.rank, x.deadline, x.security.clone());
    let local: Vec<usize> = x.local.keys().copied().collect();
    let accepting = std::thread::Builder::new()
        .name("collectix-shm-setup".into())
        .spawn(move || {
            accept_all(
                &acc, higher, job, rank, &local, &own_dup, &security, deadline,
            )
        })
        .map_err(|e| Error::Resource(format!("cannot start a thread: {e}")))?;
    for (&peer, name) in x.local.range(..x.rank) {
        match connect_one(x, peer, name, own) {
            Ok(fd) => {
                got.insert(peer, fd);
            }
            Err(e) => tracing::warn!(peer, error = %e, "no shared memory with a rank of this host"),
        }
    }
    let accepted = accepting
        .join()
        .map_err(|_| Error::internal("the shared-memory setup thread panicked"))?;
    got.extend(accepted);
    Ok(got)
}

fn left(deadline: Instant) -> Duration {
    deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1))
}

fn setup_err(peer: usize, what: impl std::fmt::Display) -> Error {
    Error::Resource(format!(
        "shared memory with rank {peer} could not be set up: {what}"
    ))
}

/// The connecting side, to a lower rank.
fn connect_one(x: &Exchange<'_>, peer: usize, name: &str, own: &Offer) -> Result<Peer> {
    let addr = SocketAddr::from_abstract_name(name.as_bytes()).map_err(|e| setup_err(peer, e))?;
    let mut s = loop {
        match UnixStream::connect_addr(&addr) {
            Ok(s) => break s,
            Err(e) if Instant::now() < x.deadline => {
                tracing::debug!(peer, error = %e, "retrying the shared-memory socket");
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => {
                return Err(setup_err(
                    peer,
                    format!("cannot connect to its socket: {e}"),
                ))
            }
        }
    };
    prepare(&s, x.deadline).map_err(|e| setup_err(peer, e))?;
    let pid = same_user(&s).map_err(|e| setup_err(peer, e))?;
    x.security
        .client(&mut s, CONTEXT)
        .map_err(|e| setup_err(peer, e))?;
    send_hello(&s, x.job, x.rank, peer, own).map_err(|e| setup_err(peer, e))?;
    let (from, mut peer_got) = recv_hello(&s, x.job, x.rank).map_err(|e| setup_err(peer, e))?;
    if from != peer {
        return Err(setup_err(peer, format!("it says it is rank {from}")));
    }
    peer_got.pid = pid;
    Ok(peer_got)
}

/// Connections that may be in their handshake on the accepting side at once: a newcomer
/// beyond that closes the one that has waited longest (as the TCP listeners' gate does).
const MAX_HANDSHAKES: usize = 64;

/// A connection accepted and still in its handshake (on a thread of its own).
struct Handshaking {
    id: u64,
    /// A handle on its socket, to close it (which ends its thread's read).
    socket: UnixStream,
    /// Its process, as the kernel says (`SO_PEERCRED`; 0 if it would not say).
    pid: i32,
}

/// What the accepting side needs of the job, for the threads that run each handshake.
#[derive(Clone)]
struct Accepting {
    job: u64,
    rank: usize,
    local: Arc<[usize]>,
    security: Security,
    /// Higher ranks whose hello was taken (each once: a second connection claiming one is
    /// refused before it gets this rank's segment).
    claimed: Arc<Mutex<BTreeSet<usize>>>,
}

/// The accepting side: `n` connections from higher local ranks (those that did not come by
/// the deadline are left out, with a warning).
///
/// Anyone of this host can connect to the abstract socket (its name is listed in
/// `/proc/net/unix`), so each accepted connection runs its handshake on a thread of its
/// own, within [`HELLO_TIMEOUT`](crate::gate::HELLO_TIMEOUT) of its accept (and the
/// exchange's deadline): a silent or slow client costs its own thread that long and delays
/// nobody; at most [`MAX_HANDSHAKES`] run at once, a newcomer beyond that closing the
/// oldest. What a connection that failed was is logged with its pid, and so are those still
/// in their handshake when the exchange gives up.
#[allow(clippy::too_many_arguments)]
fn accept_all(
    l: &Listener,
    n: usize,
    job: u64,
    rank: usize,
    local: &[usize],
    own: &Offer,
    security: &Security,
    deadline: Instant,
) -> Got {
    let mut got = BTreeMap::new();
    if let Err(e) = l.socket.set_nonblocking(true) {
        tracing::warn!(error = %e, "a Unix socket cannot be made non-blocking");
        return got;
    }
    let ctx = Accepting {
        job,
        rank,
        local: local.into(),
        security: security.clone(),
        claimed: Arc::new(Mutex::new(BTreeSet::new())),
    };
    let (tx, rx) = mpsc::channel::<(u64, i32, std::result::Result<(usize, Peer), String>)>();
    let mut waiting: VecDeque<Handshaking> = VecDeque::new();
    let mut next_id: u64 = 0;
    while got.len() < n {
        while let Ok((id, pid, r)) = rx.try_recv() {
            waiting.retain(|h| h.id != id);
            match r {
                Ok((from, peer)) => {
                    got.insert(from, peer);
                }
                Err(why) => {
                    tracing::warn!(pid, reason = %why, "a shared-memory connection refused")
                }
            }
        }
        if got.len() >= n {
            break;
        }
        let s = match l.socket.accept() {
            Ok((s, _)) => s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    let missing: Vec<usize> = local
                        .iter()
                        .copied()
                        .filter(|r| *r > rank && !got.contains_key(r))
                        .collect();
                    let stalled: Vec<i32> = waiting.iter().map(|h| h.pid).collect();
                    tracing::warn!(
                        ?missing,
                        stalled_pids = ?stalled,
                        "ranks of this host never connected for shared memory (stalled_pids: connections still in their handshake, by process)"
                    );
                    break;
                }
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
            Err(e) => {
                tracing::warn!(error = %e, "accept on a Unix socket failed");
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
        };
        let pid = getsockopt(&s, sockopt::PeerCredentials).map_or(0, |c| c.pid());
        let (handle, own) = match (s.try_clone(), own.try_clone()) {
            (Ok(h), Ok(o)) => (h, o),
            (Err(e), _) | (_, Err(e)) => {
                tracing::warn!(pid, error = %e, "a shared-memory connection dropped: no descriptor for it");
                continue;
            }
        };
        if waiting.len() >= MAX_HANDSHAKES {
            if let Some(old) = waiting.pop_front() {
                tracing::warn!(
                    pid = old.pid,
                    "a shared-memory connection closed in its handshake: too many at once"
                );
                let _ = old.socket.shutdown(Shutdown::Both);
            }
        }
        let until = deadline.min(Instant::now() + crate::gate::HELLO_TIMEOUT);
        let (id, ctx, tx) = (next_id, ctx.clone(), tx.clone());
        next_id += 1;
        let spawned = std::thread::Builder::new()
            .name("collectix-shm-hello".into())
            .spawn(move || {
                let r = handshake(s, &ctx, &own, until);
                let _ = tx.send((id, pid, r));
            });
        match spawned {
            Ok(_) => waiting.push_back(Handshaking {
                id,
                socket: handle,
                pid,
            }),
            Err(e) => {
                tracing::warn!(pid, error = %e, "a shared-memory connection dropped: no thread for it")
            }
        }
    }
    // Whatever is still in its handshake is no rank this one waits for: closed, which ends
    // its thread.
    for h in waiting {
        let _ = h.socket.shutdown(Shutdown::Both);
    }
    got
}

/// The accepting side's handshake on one connection, by `until`: the peer's user, the
/// secret, its hello (a higher rank of this host not yet taken), then this rank's hello.
fn handshake(
    mut s: UnixStream,
    x: &Accepting,
    own: &Offer,
    until: Instant,
) -> std::result::Result<(usize, Peer), String> {
    s.set_nonblocking(false).map_err(|e| e.to_string())?;
    prepare(&s, until)?;
    let pid = same_user(&s)?;
    x.security
        .server(&mut s, CONTEXT)
        .map_err(|e| e.to_string())?;
    let (from, mut peer) = recv_hello(&s, x.job, x.rank)?;
    peer.pid = pid;
    let fresh = from > x.rank && x.local.contains(&from) && lock(&x.claimed).insert(from);
    if !fresh {
        return Err(format!(
            "a hello from rank {from}, not a higher rank of this host still expected"
        ));
    }
    send_hello(&s, x.job, x.rank, from, own)?;
    Ok((from, peer))
}

fn prepare(s: &UnixStream, deadline: Instant) -> std::result::Result<(), String> {
    s.set_read_timeout(Some(left(deadline)))
        .and_then(|()| s.set_write_timeout(Some(left(deadline))))
        .map_err(|e| e.to_string())
}

/// The peer runs as this process's user; its pid.
fn same_user(s: &UnixStream) -> std::result::Result<i32, String> {
    let cred = getsockopt(s, sockopt::PeerCredentials).map_err(|e| e.to_string())?;
    let me = nix::unistd::getuid().as_raw();
    if cred.uid() != me {
        return Err(format!(
            "the peer runs as user {}, this process as {me}",
            cred.uid()
        ));
    }
    Ok(cred.pid())
}

fn send_hello(
    s: &UnixStream,
    job: u64,
    from: usize,
    to: usize,
    own: &Offer,
) -> std::result::Result<(), String> {
    let mut b = [0u8; HELLO];
    b[..8].copy_from_slice(&MAGIC);
    b[8..16].copy_from_slice(&job.to_le_bytes());
    b[16..20].copy_from_slice(&(from as u32).to_le_bytes());
    b[20..24].copy_from_slice(&(to as u32).to_le_bytes());
    b[24] = u8::from(own.segment.is_some());
    b[25..33].copy_from_slice(&super::os::probe_addr().to_le_bytes());
    b[33] = u8::from(own.heap.is_some());
    b[34..42].copy_from_slice(&own.heap.as_ref().map_or(0, |h| h.1).to_le_bytes());
    // The segment's descriptor first, then the heap's.
    let fds: Vec<RawFd> = (own.segment.iter())
        .chain(own.heap.iter().map(|h| &h.0))
        .map(|f| f.as_raw_fd())
        .collect();
    let with_fd = [ControlMessage::ScmRights(&fds)];
    let cmsg: &[ControlMessage<'_>] = if fds.is_empty() { &[] } else { &with_fd };
    let n = sendmsg::<()>(
        s.as_raw_fd(),
        &[IoSlice::new(&b)],
        cmsg,
        MsgFlags::MSG_NOSIGNAL,
        None,
    )
    .map_err(|e| format!("sending the hello: {e}"))?;
    if n != HELLO {
        return Err("the hello went short".into());
    }
    Ok(())
}

/// Reads a hello and its memfds; the sender's rank and what it sent (its pid left 0 for the
/// caller, who asks the kernel).
fn recv_hello(s: &UnixStream, job: u64, me: usize) -> std::result::Result<(usize, Peer), String> {
    let mut b = [0u8; HELLO];
    let mut space = nix::cmsg_space!([RawFd; 2]);
    let (n, truncated, mut fds) = {
        let mut iov = [IoSliceMut::new(&mut b)];
        let msg = recvmsg::<()>(
            s.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )
        .map_err(|e| format!("reading the hello: {e}"))?;
        let mut fds = Vec::new();
        for c in msg.cmsgs().map_err(|e| e.to_string())? {
            if let ControlMessageOwned::ScmRights(raw) = c {
                // Each descriptor received is this process's to close.
                fds.extend(raw.into_iter().map(os::owned));
            }
        }
        (msg.bytes, msg.flags.contains(MsgFlags::MSG_CTRUNC), fds)
    };
    if n != HELLO || truncated || b[..8] != MAGIC {
        return Err(format!("not a collectix shared-memory hello ({n} bytes)"));
    }
    let word = |at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]) as usize;
    let (got_job, from, to) = (
        u64::from_le_bytes([b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]]),
        word(16),
        word(20),
    );
    if got_job != job || to != me {
        return Err(format!(
            "a hello for job {got_job:x}, rank {to} (this is job {job:x}, rank {me})"
        ));
    }
    if b[24] > 1 || b[33] > 1 || fds.len() != usize::from(b[24]) + usize::from(b[33]) {
        return Err(format!(
            "{} descriptors with a hello that says {} and {}",
            fds.len(),
            b[24],
            b[33]
        ));
    }
    let u64_at = |at: usize| {
        b.get(at..at + 8)
            .and_then(|x| x.try_into().ok())
            .map_or(0, u64::from_le_bytes)
    };
    let heap = if b[33] == 1 { fds.pop() } else { None };
    Ok((
        from,
        Peer {
            fd: fds.pop(),
            heap: heap.map(|fd| (fd, u64_at(34))),
            pid: 0,
            probe: u64_at(25),
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::security::Secret;

    /// Ranks `0..w` of one host exchanging with no segments, each on a thread, with `secret`;
    /// `before` runs with rank 0's socket name once it listens, before the others start.
    /// What each rank got (its peers' ranks) and how long its exchange took.
    fn exchange_with(
        w: usize,
        secret: Option<&str>,
        before: impl FnOnce(&str),
    ) -> Vec<(Vec<usize>, Duration)> {
        let security = match secret {
            Some(s) => Security::with_secret(Secret::new(s).unwrap_or_else(|e| panic!("{e}"))),
            None => Security::loopback_only(),
        };
        let listeners: Vec<Listener> = (0..w)
            .map(|r| Listener::bind(0x5e7, r).unwrap_or_else(|e| panic!("{e}")))
            .collect();
        let local: BTreeMap<usize, String> = listeners
            .iter()
            .enumerate()
            .map(|(r, l)| (r, l.name.clone()))
            .collect();
        before(&local[&0]);
        let deadline = Instant::now() + Duration::from_secs(25);
        std::thread::scope(|s| {
            let hs: Vec<_> = listeners
                .into_iter()
                .enumerate()
                .map(|(rank, l)| {
                    let (local, security) = (&local, &security);
                    s.spawn(move || {
                        let t0 = Instant::now();
                        let x = Exchange {
                            job: 7,
                            rank,
                            local,
                            security,
                            deadline,
                        };
                        let got =
                            exchange(&x, l, &Offer::default()).unwrap_or_else(|e| panic!("{e}"));
                        (got.keys().copied().collect::<Vec<_>>(), t0.elapsed())
                    })
                })
                .collect();
            hs.into_iter()
                .map(|h| h.join().unwrap_or_else(|_| panic!("a rank panicked")))
                .collect()
        })
    }

    #[test]
    fn a_silent_client_on_a_setup_socket_delays_nobody() {
        // Anyone of the host may connect to rank 0's abstract socket and say nothing: the
        // ranks still get each other at once (the handshakes run side by side, each within
        // its own deadline), with or without a secret. On the code before, rank 0 read the
        // silent client's handshake until the exchange's deadline (25 s here), and the
        // others' connections waited behind it.
        for secret in [Some("the setup tests' secret"), None] {
            let mut intruders = Vec::new();
            let got = exchange_with(3, secret, |name| {
                let addr = SocketAddr::from_abstract_name(name.as_bytes())
                    .unwrap_or_else(|e| panic!("{e}"));
                for _ in 0..2 {
                    intruders
                        .push(UnixStream::connect_addr(&addr).unwrap_or_else(|e| panic!("{e}")));
                }
            });
            for (rank, (peers, took)) in got.iter().enumerate() {
                let want: Vec<usize> = (0..3).filter(|&r| r != rank).collect();
                assert_eq!(peers, &want, "rank {rank} (secret: {secret:?})");
                assert!(
                    *took < crate::gate::HELLO_TIMEOUT,
                    "rank {rank} took {took:?} (secret: {secret:?})"
                );
            }
            // Closed by rank 0 once its exchange was done: the silent clients read the end.
            for mut s in intruders {
                use std::io::Read;
                s.set_read_timeout(Some(Duration::from_secs(5)))
                    .unwrap_or_else(|e| panic!("{e}"));
                let mut rest = Vec::new();
                let r = s.read_to_end(&mut rest);
                assert!(r.is_ok(), "the silent client was not closed: {r:?}");
            }
        }
    }
}
