//! The link's handshake: the secret's challenge–response, then the connecting rank's
//! [`Hello`] (magic, version, job, both ranks, the world's size: 32 bytes) and the accepting
//! rank's one-byte answer (accepted, refused with its reason, or "duplicate").

use crate::security::{Denied, Security};
use crate::sync::ReadUntil;
use collectix_runtime::{LinkFailure, LinkStep};
use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::Duration;

/// The link protocol's magic (the first bytes of every connection).
pub(crate) const MAGIC: [u8; 8] = *b"cx-link1";
/// The link protocol's version.
pub(crate) const VERSION: u32 = 3;
/// How long an accepting rank waits for a connection's hello.
pub(crate) const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// The answer to a hello: accepted.
const ACCEPTED: u8 = 0;
/// The answer to a hello: refused, followed by the reason's length (`u16`) and its text.
const REFUSED: u8 = 1;
/// The answer to a hello: the accepting rank is connecting the other way (see
/// [`Refused::Duplicate`]).
const DUPLICATE: u8 = 2;

/// What the connecting rank says first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Hello {
    /// The job's identity (every rank of one job has the same).
    pub job: u64,
    /// The connecting rank.
    pub from: u32,
    /// The rank it wants.
    pub to: u32,
    /// The world's size.
    pub world: u32,
    /// Which process of its rank the connecting one is: 0 first, one more for each restart
    /// (`COLLECTIX_INCARNATION`). A higher one replaces its rank's connection.
    pub incarnation: u32,
}

/// Bytes of a hello.
const HELLO_BYTES: usize = 36;

impl Hello {
    /// The hello as it goes on the wire.
    pub(super) fn to_bytes(self) -> [u8; HELLO_BYTES] {
        let mut b = [0u8; HELLO_BYTES];
        b[..8].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        b[12..20].copy_from_slice(&self.job.to_le_bytes());
        b[20..24].copy_from_slice(&self.from.to_le_bytes());
        b[24..28].copy_from_slice(&self.to.to_le_bytes());
        b[28..32].copy_from_slice(&self.world.to_le_bytes());
        b[32..36].copy_from_slice(&self.incarnation.to_le_bytes());
        b
    }

    /// Parses the bytes; `Err` with why they are not a hello of this version.
    fn parse(b: &[u8; HELLO_BYTES]) -> Result<Hello, LinkFailure> {
        let word = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        if b[..8] != MAGIC {
            return Err(LinkFailure::NotALink);
        }
        let version = word(8);
        if version != VERSION {
            return Err(LinkFailure::Version {
                theirs: version,
                ours: VERSION,
            });
        }
        let mut job = [0u8; 8];
        job.copy_from_slice(&b[12..20]);
        Ok(Hello {
            job: u64::from_le_bytes(job),
            from: word(20),
            to: word(24),
            world: word(28),
            incarnation: word(32),
        })
    }

    /// Checks a hello against the accepting rank (`me` of `world` in job `job`): `Ok` with
    /// the connecting rank.
    fn check(self, job: u64, me: u32, world: u32) -> Result<u32, LinkFailure> {
        if self.job != job {
            Err(LinkFailure::OtherJob {
                theirs: self.job,
                ours: job,
            })
        } else if self.world != world {
            Err(LinkFailure::WorldSize {
                theirs: self.world,
                ours: world,
            })
        } else if self.to != me {
            Err(LinkFailure::WrongRank {
                wanted: self.to,
                ours: me,
            })
        } else if self.from >= world || self.from == me {
            Err(LinkFailure::NotAPeer {
                rank: self.from,
                world,
            })
        } else {
            Ok(self.from)
        }
    }
}

/// Why a handshake did not give a link (on the connecting side, a hello the accepting rank
/// did not take arrives as [`LinkFailure::Refused`] with its reason; on the accepting side,
/// as the failure itself).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The accepting rank is connecting to this one at the same moment, and keeps its own
    /// connection: this one is not needed.
    Duplicate,
    /// The secret handshake failed (see [`Security`]).
    Auth(Denied),
    /// The connection failed, or a hello did not fit.
    Link(LinkFailure),
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::Duplicate => f.write_str("the peer is connecting to this rank already"),
            Refused::Auth(d) => write!(f, "authentication failed: {d}"),
            Refused::Link(l) => l.fmt(f),
        }
    }
}

/// The error of a failed read or write at `step`.
fn io(step: LinkStep) -> impl Fn(std::io::Error) -> Refused {
    move |e| {
        Refused::Link(LinkFailure::Io {
            step,
            detail: e.to_string(),
        })
    }
}

/// Connects: proves the secret (as `security` has it), writes `hello` on `s` and reads the
/// answer. `Err` with the accepting rank's reason (or the connection's failure).
pub(crate) fn connect(s: &mut TcpStream, hello: Hello, security: &Security) -> Result<(), Refused> {
    if let Err(d) = security.client(s, b"link") {
        // Closed at once, so that the accepting side hears of it now, not at its deadline.
        let _ = s.shutdown(Shutdown::Both);
        return Err(Refused::Auth(d));
    }
    s.write_all(&hello.to_bytes())
        .map_err(io(LinkStep::Hello))?;
    let mut status = [0u8; 1];
    s.read_exact(&mut status).map_err(io(LinkStep::Answer))?;
    match status[0] {
        ACCEPTED => return Ok(()),
        DUPLICATE => return Err(Refused::Duplicate),
        _ => {}
    }
    let mut len = [0u8; 2];
    s.read_exact(&mut len).map_err(io(LinkStep::Answer))?;
    let mut text = vec![0u8; u16::from_le_bytes(len) as usize];
    s.read_exact(&mut text).map_err(io(LinkStep::Answer))?;
    Err(Refused::Link(LinkFailure::Refused {
        reason: String::from_utf8_lossy(&text).into_owned(),
    }))
}

/// Accepts: checks the secret (as `security` has it; nothing else is read before it
/// passes), then reads the hello on `s` and checks it against this rank (`me` of `world` in
/// job `job`); answers it either way. `Ok` with the connecting rank and its incarnation. A
/// hello from a higher rank
/// that this rank is connecting to at the moment (`connecting(from)`) is answered
/// "duplicate" ([`Refused::Duplicate`]): this rank's own connection is the one both keep.
/// (A rank's listener runs the secret's part in its gate, `gate.rs`, then [`accept_hello`];
/// this whole form is the tests'.) The whole must have come within `hello` of now
/// ([`HELLO_TIMEOUT`] in use; tests shorten it).
#[cfg(test)]
pub(crate) fn accept(
    s: &mut TcpStream,
    job: u64,
    me: u32,
    world: u32,
    connecting: &dyn Fn(u32) -> bool,
    security: &Security,
    hello: Duration,
) -> Result<(u32, u32), Refused> {
    // A connection that does not say its hello within `hello` in all (a port scanner,
    // a stuck or trickling client) is dropped rather than left holding the accepting rank.
    let deadline = crate::sync::deadline_after(hello);
    let passed = security.server(&mut ReadUntil::new(s, deadline), b"link");
    if let Err(d) = passed {
        let _ = s.shutdown(Shutdown::Both);
        return Err(Refused::Auth(d));
    }
    accept_hello(s, job, me, world, connecting, deadline)
}

/// [`accept`]'s part after the secret: the hello, read by `deadline`, checked and answered.
pub(crate) fn accept_hello(
    s: &mut TcpStream,
    job: u64,
    me: u32,
    world: u32,
    connecting: &dyn Fn(u32) -> bool,
    deadline: std::time::Instant,
) -> Result<(u32, u32), Refused> {
    let mut b = [0u8; HELLO_BYTES];
    let read = ReadUntil::new(s, deadline).read_exact(&mut b);
    let _ = s.set_read_timeout(None);
    read.map_err(io(LinkStep::ReadHello))?;
    let verdict =
        Hello::parse(&b).and_then(|h| h.check(job, me, world).map(|f| (f, h.incarnation)));
    match verdict {
        Ok((from, _)) if from > me && connecting(from) => {
            let _ = s.write_all(&[DUPLICATE]);
            let _ = s.shutdown(Shutdown::Both);
            Err(Refused::Duplicate)
        }
        Ok(hello) => {
            s.write_all(&[ACCEPTED]).map_err(io(LinkStep::Answer))?;
            Ok(hello)
        }
        Err(why) => {
            let text = why.to_string();
            let text = &text.as_bytes()[..text.len().min(u16::MAX as usize)];
            let mut answer = vec![REFUSED];
            answer.extend_from_slice(&(text.len() as u16).to_le_bytes());
            answer.extend_from_slice(text);
            let _ = s.write_all(&answer);
            let _ = s.shutdown(Shutdown::Both);
            Err(Refused::Link(why))
        }
    }
}
