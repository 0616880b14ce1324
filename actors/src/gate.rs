//! The gate: accepted connections wait here, without a thread each, until they have proved
//! they hold the job's secret (the server's side of the handshake, [`ServerHandshake`]).
//!
//! One thread per listener polls every connection still in its handshake (non-blocking
//! sockets, one `poll` over all of them and a wake-up socket). A connection that passes is
//! handed, blocking again, to the listener's `pass` (which starts what serves it); one that
//! fails, closes, or has not passed [`HELLO_TIMEOUT`] after it was accepted is closed. At most
//! [`MAX_WAITING`] wait at once; a newcomer beyond that pushes out the one that has waited
//! longest, so a flood of idle or trickling connections cannot keep a client that answers
//! at once from getting in, and costs a socket each, not a thread.
//!
//! A store's gate may also let torch's clients in ([`Gate::start_with`]'s `torch`): a
//! connection whose first bytes are torch's `VALIDATE` goes to that pass instead, without a
//! handshake (torch's protocol has none).

use crate::security::{Security, ServerHandshake};
use crate::store::torch::wire::VALIDATE as TORCH_HELLO;
use crate::sync::{deadline_after, lock};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a connection has, from its accept, to pass the handshake.
pub(crate) const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// Connections that may wait in the handshake at once.
pub(crate) const MAX_WAITING: usize = 4096;

/// Connections from one address that may wait in the handshake at once.
pub(crate) const MAX_PER_SOURCE: usize = 1024;

/// How many connections may wait (in all, and from one address), and for how long each.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    pub(crate) waiting: usize,
    pub(crate) per_source: usize,
    /// From the accept, to pass the handshake ([`HELLO_TIMEOUT`]; tests shorten it).
    pub(crate) hello: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            waiting: MAX_WAITING,
            per_source: MAX_PER_SOURCE,
            hello: HELLO_TIMEOUT,
        }
    }
}

/// What a listener does with a connection that passed, and by when it must have said the
/// rest of its hello.
pub(crate) type Pass = Box<dyn FnMut(TcpStream, Instant) + Send>;

/// A listener's gate (see the module doc). Dropping it closes the connections still waiting
/// and ends its thread.
pub(crate) struct Gate {
    inbox: Arc<Mutex<Vec<TcpStream>>>,
    wake: UnixStream,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Gate {
    /// Starts the gate's thread (named `name`) for connections of protocol `ctx` under
    /// `security`; `what` names the listener in its log lines.
    pub(crate) fn start(
        name: &str,
        what: &'static str,
        security: Security,
        ctx: &'static [u8],
        pass: Pass,
    ) -> std::io::Result<Gate> {
        Gate::start_with(name, what, security, ctx, pass, None, Limits::default())
    }

    /// [`start`](Gate::start) with other limits (tests shorten them), and `torch`: where the
    /// connections of torch's clients go, if they may come in (`None`: they are refused as
    /// any other that is not collectix).
    pub(crate) fn start_with(
        name: &str,
        what: &'static str,
        security: Security,
        ctx: &'static [u8],
        pass: Pass,
        torch: Option<Pass>,
        limits: Limits,
    ) -> std::io::Result<Gate> {
        let (wake, woken) = UnixStream::pair()?;
        woken.set_nonblocking(true)?;
        // A full wake-up socket already wakes the gate: admitting never blocks on it.
        wake.set_nonblocking(true)?;
        let inbox = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let keeper = Keeper {
            inbox: inbox.clone(),
            woken,
            stop: stop.clone(),
            what,
            security,
            ctx,
            pass,
            torch,
            limits,
            waiting: Vec::new(),
        };
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || keeper.run())?;
        Ok(Gate {
            inbox,
            wake,
            stop,
            thread: Some(thread),
        })
    }

    /// Hands a connection just accepted to the gate.
    pub(crate) fn admit(&self, s: TcpStream) {
        lock(&self.inbox).push(s);
        // Would block only when full of wake-ups not read yet: the gate wakes either way.
        let _ = (&self.wake).write(&[1]);
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = (&self.wake).write(&[1]);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A connection in its handshake.
struct Waiting {
    s: TcpStream,
    /// The address it came from.
    from: Option<std::net::IpAddr>,
    hs: ServerHandshake,
    /// Passed the handshake; waits for the first byte of its hello.
    passed: bool,
    deadline: Instant,
}

/// The gate's thread.
struct Keeper {
    inbox: Arc<Mutex<Vec<TcpStream>>>,
    woken: UnixStream,
    stop: Arc<AtomicBool>,
    what: &'static str,
    security: Security,
    ctx: &'static [u8],
    pass: Pass,
    /// Where torch's clients go, if they may come in.
    torch: Option<Pass>,
    limits: Limits,
    waiting: Vec<Waiting>,
}

/// What a turn made of one waiting connection.
enum Turn {
    Wait,
    Passed,
    /// A client of torch's protocol, which this gate lets in.
    Torch,
    Closed(String),
}

impl Keeper {
    fn run(mut self) {
        loop {
            if self.stop.load(Ordering::SeqCst) {
                return;
            }
            self.take_new();
            let ready = self.poll_once();
            if self.stop.load(Ordering::SeqCst) {
                return;
            }
            let now = Instant::now();
            // From the last: `swap_remove` moves an entry already seen into the place freed.
            for i in (0..self.waiting.len()).rev() {
                let turn = if ready.get(i).copied().unwrap_or(false) {
                    self.turn(i)
                } else if now >= self.waiting[i].deadline {
                    Turn::Closed(format!("no handshake within {:?}", self.limits.hello))
                } else {
                    Turn::Wait
                };
                match turn {
                    Turn::Wait => {}
                    Turn::Passed => {
                        let w = self.waiting.swap_remove(i);
                        let _ = w.s.set_nonblocking(false);
                        (self.pass)(w.s, w.deadline);
                    }
                    Turn::Torch => {
                        let w = self.waiting.swap_remove(i);
                        let _ = w.s.set_nonblocking(false);
                        if let Some(torch) = self.torch.as_mut() {
                            torch(w.s, w.deadline);
                        }
                    }
                    Turn::Closed(why) => {
                        let w = self.waiting.swap_remove(i);
                        let peer =
                            w.s.peer_addr()
                                .map_or_else(|_| "?".into(), |a| a.to_string());
                        let _ = w.s.shutdown(std::net::Shutdown::Both);
                        crate::metrics::refused(self.ctx, "handshake");
                        tracing::warn!(
                            listener = self.what,
                            client = %peer,
                            reason = %why,
                            "client dropped in its handshake"
                        );
                    }
                }
            }
        }
    }

    /// Takes the connections admitted since the last turn; beyond the limits, the longest
    /// waiting go (of the newcomer's address, past the limit per address).
    fn take_new(&mut self) {
        let new = std::mem::take(&mut *lock(&self.inbox));
        for s in new {
            if s.set_nonblocking(true).is_err() {
                continue;
            }
            let from = s.peer_addr().ok().map(|a| a.ip());
            let same = self.waiting.iter().filter(|w| w.from == from).count();
            let evict = if same >= self.limits.per_source {
                self.oldest(|w| w.from == from)
            } else if self.waiting.len() >= self.limits.waiting {
                self.oldest(|_| true)
            } else {
                None
            };
            if let Some(i) = evict {
                let w = self.waiting.swap_remove(i);
                let _ = w.s.shutdown(std::net::Shutdown::Both);
                crate::metrics::refused(self.ctx, "limit");
                tracing::warn!(
                    listener = self.what,
                    waiting = self.waiting.len() + 1,
                    "too many connections in their handshake: the longest waiting closed"
                );
            }
            self.waiting.push(Waiting {
                s,
                from,
                hs: ServerHandshake::new(&self.security, self.ctx),
                passed: false,
                deadline: deadline_after(self.limits.hello),
            });
        }
    }

    /// The waiting connection of `which` that has waited longest.
    fn oldest(&self, which: impl Fn(&Waiting) -> bool) -> Option<usize> {
        (0..self.waiting.len())
            .filter(|&i| which(&self.waiting[i]))
            .min_by_key(|&i| self.waiting[i].deadline)
    }

    /// Waits until a connection has bytes, a newcomer or a stop wakes the gate, or the
    /// nearest deadline; which connections have bytes (or closed).
    fn poll_once(&mut self) -> Vec<bool> {
        let now = Instant::now();
        let next = self
            .waiting
            .iter()
            .map(|w| w.deadline)
            .min()
            .map_or(Duration::from_secs(1), |d| d.saturating_duration_since(now))
            .min(Duration::from_secs(1));
        let timeout =
            PollTimeout::try_from(next.as_millis().max(1) as i32).unwrap_or(PollTimeout::MAX);
        let mut fds: Vec<PollFd<'_>> = Vec::with_capacity(self.waiting.len() + 1);
        fds.push(PollFd::new(self.woken.as_fd(), PollFlags::POLLIN));
        for w in &self.waiting {
            fds.push(PollFd::new(w.s.as_fd(), PollFlags::POLLIN));
        }
        let n = poll(&mut fds, timeout).unwrap_or(0);
        let ready: Vec<bool> = if n > 0 {
            fds[1..]
                .iter()
                .map(|f| f.revents().is_some_and(|r| !r.is_empty()))
                .collect()
        } else {
            Vec::new()
        };
        drop(fds);
        // Empty the wake-up socket.
        let mut sink = [0u8; 64];
        while matches!((&self.woken).read(&mut sink), Ok(n) if n > 0) {}
        ready
    }

    /// Reads what connection `i` sent and takes the handshake's next step; a connection that
    /// passed goes on once it has sent the first byte of what follows (its hello), so that
    /// one that passes and then says nothing costs no thread either.
    fn turn(&mut self, i: usize) -> Turn {
        let w = &mut self.waiting[i];
        if w.passed {
            let mut b = [0u8; 1];
            return match w.s.peek(&mut b) {
                Ok(0) => Turn::Closed("closed before its hello".into()),
                Ok(_) => Turn::Passed,
                Err(e)
                    if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted =>
                {
                    Turn::Wait
                }
                Err(e) => Turn::Closed(e.to_string()),
            };
        }
        if self.torch.is_some() && w.hs.fresh() {
            let mut first = [0u8; TORCH_HELLO.len()];
            match w.s.peek(&mut first) {
                Ok(0) => return Turn::Closed("closed in its handshake".into()),
                Ok(n) if n == TORCH_HELLO.len() && first == TORCH_HELLO => return Turn::Torch,
                // Part of it: torch's clients send it whole, in their first write (torch's
                // own server closes such a connection too). Waiting for the rest here would
                // turn the gate's loop on bytes it does not take.
                Ok(n) if first[..n] == TORCH_HELLO[..n] => {
                    return Turn::Closed("torch's VALIDATE in pieces".into())
                }
                Ok(_) => {}
                Err(e)
                    if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted =>
                {
                    return Turn::Wait
                }
                Err(e) => return Turn::Closed(e.to_string()),
            }
        }
        let (want, _, _) = w.hs.step();
        let mut buf = [0u8; 64];
        let n = match w.s.read(&mut buf[..want.min(64)]) {
            Ok(0) => return Turn::Closed("closed in its handshake".into()),
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => {
                return Turn::Wait
            }
            Err(e) => return Turn::Closed(e.to_string()),
        };
        let fed = w.hs.feed(&buf[..n]);
        // Answers are at most 65 bytes on a fresh connection: they fit its send buffer.
        if !fed.write.is_empty() && w.s.write_all(&fed.write).is_err() && fed.end.is_none() {
            return Turn::Closed("cannot answer its challenge".into());
        }
        match fed.end {
            None => Turn::Wait,
            Some(Ok(())) => {
                w.passed = true;
                Turn::Wait
            }
            Some(Err(d)) => Turn::Closed(format!("authentication failed: {d}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// Whether `s`'s other end closed within `within` (it sends nothing).
    fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
        let _ = s.set_read_timeout(Some(within));
        let mut b = [0u8; 1];
        matches!(s.read(&mut b), Ok(0))
            || matches!(s.read(&mut b), Err(ref e) if e.kind() == ErrorKind::ConnectionReset)
    }

    #[test]
    fn past_the_limit_per_address_the_longest_waiting_goes() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
        let addr = l.local_addr().unwrap_or_else(|e| panic!("{e}"));
        let limits = Limits {
            waiting: 8,
            per_source: 4,
            ..Limits::default()
        };
        let gate = Gate::start_with(
            "test-gate",
            "a test",
            Security::loopback_only(),
            b"link",
            Box::new(|_, _| {}),
            None,
            limits,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let mut clients = Vec::new();
        for _ in 0..5 {
            clients.push(TcpStream::connect(addr).unwrap_or_else(|e| panic!("{e}")));
            let (s, _) = l.accept().unwrap_or_else(|e| panic!("{e}"));
            gate.admit(s);
            // In order, so that "longest waiting" is well defined.
            std::thread::sleep(Duration::from_millis(20));
        }
        // The fifth from 127.0.0.1 pushed the first out; the others still wait.
        assert!(
            closed_within(&mut clients[0], Duration::from_secs(2)),
            "the oldest still waits"
        );
        for (i, c) in clients.iter_mut().enumerate().skip(1) {
            assert!(
                !closed_within(c, Duration::from_millis(100)),
                "client {i} was closed"
            );
        }
    }

    #[test]
    fn a_connection_that_passes_and_then_says_nothing_gets_no_thread() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
        let addr = l.local_addr().unwrap_or_else(|e| panic!("{e}"));
        let passed = Arc::new(AtomicBool::new(false));
        let p = passed.clone();
        let gate = Gate::start(
            "test-gate",
            "a test",
            Security::loopback_only(),
            b"link",
            Box::new(move |_, _| p.store(true, Ordering::SeqCst)),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let mut c = TcpStream::connect(addr).unwrap_or_else(|e| panic!("{e}"));
        let (s, _) = l.accept().unwrap_or_else(|e| panic!("{e}"));
        gate.admit(s);
        // The whole handshake (no secret: the hello, and the answer 0).
        let mut hello = b"cx-auth1".to_vec();
        hello.resize(40, 7);
        c.write_all(&hello).unwrap_or_else(|e| panic!("{e}"));
        let mut answer = [9u8; 1];
        c.read_exact(&mut answer).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(answer, [0]);
        std::thread::sleep(Duration::from_millis(300));
        assert!(!passed.load(Ordering::SeqCst), "handed on before its hello");
        // Its hello starts: now it goes on.
        c.write_all(&[1]).unwrap_or_else(|e| panic!("{e}"));
        let t0 = Instant::now();
        while !passed.load(Ordering::SeqCst) && t0.elapsed() < Duration::from_secs(2) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(
            passed.load(Ordering::SeqCst),
            "not handed on after its hello began"
        );
    }
}
