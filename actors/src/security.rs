//! Who may connect to a job, and where it listens.
//!
//! **The secret.** Every rank and every store client of a job holds the same secret
//! ([`Secret`]): `COLLECTIX_SECRET`, or the file named by `COLLECTIX_SECRET_FILE`
//! ([`Security::from_env`]). `collectix launch` makes one per job and hands it to its processes;
//! under `mpirun`, `srun` or torchrun the user exports it (`mpirun -x COLLECTIX_SECRET`).
//!
//! **The handshake.** Every TCP connection collectix accepts (a peer's link, a store client's)
//! opens with a challenge–response before anything else is read from it:
//!
//! ```text
//! client → server   "cx-auth1", Nc                 (a fresh 32-byte nonce)
//! server → client   1, Ns, HMAC(K, "server" ‖ ctx ‖ Nc ‖ Ns)     (0 alone: no secret here)
//! client → server   HMAC(K, "client" ‖ ctx ‖ Nc ‖ Ns)
//! server → client   0 (accepted) or 1 (refused)
//! ```
//!
//! HMAC-SHA256 (the `hmac` and `sha2` crates; nonces from the OS through `getrandom`), each
//! proof checked in constant time. Both sides prove they hold `K`, each over a nonce the other
//! chose, so neither a recorded exchange nor the server's own answer can be replayed; the
//! labels keep a server's proof from passing for a client's, and `ctx` (`link` or `store`) one
//! protocol's for another's. A connection whose proof is wrong is refused before any of its
//! data is read, logged with its address, and the job carries on. What this does **not** do:
//! encrypt, or protect a connection that an attacker on the path takes over once it is up
//! (see `docs/deployment.md`, "Security model").
//!
//! **Where to listen.** Without a secret, collectix listens on loopback only: an address that
//! other hosts can reach needs a secret, or an explicit opt-in (`COLLECTIX_INSECURE=1`, or
//! [`Security::insecure`]), which logs a warning ([`Security::check_bind`]). Which address a
//! rank is reached at is chosen in `addr.rs`.

use collectix_runtime::{Error, Result};
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use std::io::{Read, Write};
use std::net::IpAddr;
use std::sync::Arc;

/// The handshake's magic (the first bytes a client sends).
const MAGIC: [u8; 8] = *b"cx-auth1";
/// Bytes of a nonce, and of a proof.
const NONCE: usize = 32;
/// The longest secret accepted (a file named by `COLLECTIX_SECRET_FILE` is checked against it
/// before it is read).
pub const MAX_SECRET_BYTES: usize = 4096;
/// Secrets shorter than this are accepted with a warning.
const SHORT_SECRET: usize = 16;

/// A job's shared secret. Its `Debug` shows nothing of it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Arc<[u8]>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secret({} bytes)", self.0.len())
    }
}

impl Secret {
    /// A secret of these bytes: not empty, at most [`MAX_SECRET_BYTES`]. Below 16 bytes it is
    /// accepted with a warning (a guessable secret protects little).
    pub fn new(bytes: impl Into<Vec<u8>>) -> Result<Secret> {
        let bytes = bytes.into();
        if bytes.is_empty() {
            return Err(Error::invalid("the secret is empty"));
        }
        if bytes.len() > MAX_SECRET_BYTES {
            return Err(Error::invalid(format!(
                "the secret has {} bytes; at most {MAX_SECRET_BYTES}",
                bytes.len()
            )));
        }
        if bytes.len() < SHORT_SECRET {
            tracing::warn!(
                bytes = bytes.len(),
                "the secret is short: use 32 random bytes (`collectix launch` makes such a one)"
            );
        }
        Ok(Secret(bytes.into()))
    }

    /// A fresh secret as text: 32 bytes from the OS's random source, in hex (64 characters),
    /// fit for `COLLECTIX_SECRET`.
    pub fn random_text() -> Result<String> {
        let mut b = [0u8; 32];
        getrandom::fill(&mut b)
            .map_err(|e| Error::Resource(format!("no random bytes from the OS: {e}")))?;
        Ok(b.iter().map(|x| format!("{x:02x}")).collect())
    }

    /// The MAC over the handshake's values (HMAC takes keys of any length, so `None` never
    /// comes; it is a failed handshake, not a panic, if it ever did).
    fn mac(
        &self,
        label: &[u8],
        ctx: &[u8],
        nc: &[u8; NONCE],
        ns: &[u8; NONCE],
    ) -> Option<Hmac<Sha256>> {
        let mut m = <Hmac<Sha256> as KeyInit>::new_from_slice(&self.0).ok()?;
        for part in [label, ctx, nc, ns] {
            m.update(&(part.len() as u32).to_le_bytes());
            m.update(part);
        }
        Some(m)
    }

    fn proof(
        &self,
        label: &[u8],
        ctx: &[u8],
        nc: &[u8; NONCE],
        ns: &[u8; NONCE],
    ) -> Result<[u8; NONCE], Denied> {
        let m = self
            .mac(label, ctx, nc, ns)
            .ok_or(Denied::Secret(SecretMismatch::NotAKey))?;
        let mut out = [0u8; NONCE];
        out.copy_from_slice(&m.finalize().into_bytes());
        Ok(out)
    }

    /// Whether `got` is the proof for these values (in constant time).
    fn verify(
        &self,
        label: &[u8],
        ctx: &[u8],
        nc: &[u8; NONCE],
        ns: &[u8; NONCE],
        got: &[u8],
    ) -> bool {
        self.mac(label, ctx, nc, ns)
            .is_some_and(|m| m.verify_slice(got).is_ok())
    }
}

/// What a process demands of those who connect to it, and where it may listen.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Security {
    secret: Option<Secret>,
    insecure: bool,
}

/// Why a handshake failed, as the side that saw it puts it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub(crate) enum Denied {
    /// The other side is not a collectix endpoint of this version (wrong magic).
    NotCollectix,
    /// The peer speaks another protocol, which this says.
    Foreign(String),
    /// The secrets differ, or one side has one and the other none.
    Secret(SecretMismatch),
    /// The connection failed or timed out at `step`; `detail` is the system's word for it.
    Io {
        /// What this side was doing.
        step: AuthStep,
        /// The operating system's error text.
        detail: String,
    },
}

/// How the two sides' secrets disagree ([`Denied::Secret`]), as one side sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub(crate) enum SecretMismatch {
    /// The server has no secret and this client has one.
    PeerHasNone,
    /// The server demands a secret and this client has none.
    NoneHere,
    /// The server's proof is wrong: it does not know this job's secret.
    PeerProofWrong,
    /// The server refused this client's proof: the secrets differ.
    OwnProofRefused,
    /// The client's proof is wrong: it does not know the secret.
    ClientProofWrong,
    /// This process's secret cannot key HMAC-SHA256.
    NotAKey,
}

impl std::fmt::Display for SecretMismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SecretMismatch::PeerHasNone => {
                "it has no secret, and this process has one: give every rank the same \
                 COLLECTIX_SECRET"
            }
            SecretMismatch::NoneHere => {
                "it demands a secret, and this process has none: set COLLECTIX_SECRET \
                 (the job's) or COLLECTIX_SECRET_FILE"
            }
            SecretMismatch::PeerProofWrong => {
                "it does not know this job's secret (its proof is wrong): the secrets differ"
            }
            SecretMismatch::OwnProofRefused => {
                "it refused this process's proof: the secrets differ"
            }
            SecretMismatch::ClientProofWrong => "a wrong proof: it does not know the secret",
            SecretMismatch::NotAKey => "the secret is not an HMAC key",
        })
    }
}

/// A step of the secret handshake ([`Denied::Io`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub(crate) enum AuthStep {
    /// Drawing a nonce from the operating system.
    Nonce,
    /// The client sending its challenge.
    SendChallenge,
    /// The server reading the challenge.
    ReadChallenge,
    /// The server answering the challenge.
    AnswerChallenge,
    /// The client reading the answer to its challenge.
    ReadAnswer,
    /// The client sending its proof.
    SendProof,
    /// The server reading the client's proof.
    ReadProof,
    /// The server answering the proof.
    AnswerProof,
    /// The client reading the verdict on its proof.
    ReadVerdict,
}

impl std::fmt::Display for AuthStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            AuthStep::Nonce => "no random bytes from the OS",
            AuthStep::SendChallenge => "cannot send the challenge",
            AuthStep::ReadChallenge => "no challenge",
            AuthStep::AnswerChallenge => "cannot answer the challenge",
            AuthStep::ReadAnswer => "no answer to the challenge",
            AuthStep::SendProof => "cannot send the proof",
            AuthStep::ReadProof => "no proof",
            AuthStep::AnswerProof => "cannot answer the proof",
            AuthStep::ReadVerdict => "no answer to the proof",
        })
    }
}

impl std::fmt::Display for Denied {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Denied::NotCollectix => {
                f.write_str("not a collectix connection (or an older version of collectix)")
            }
            Denied::Foreign(what) => f.write_str(what),
            Denied::Secret(why) => why.fmt(f),
            Denied::Io { step, detail } => write!(f, "{step}: {detail}"),
        }
    }
}

fn io(step: AuthStep) -> impl Fn(std::io::Error) -> Denied {
    move |e| Denied::Io {
        step,
        detail: e.to_string(),
    }
}

impl Security {
    /// No secret, loopback only (the default).
    pub fn loopback_only() -> Security {
        Security::default()
    }

    /// Connections must prove they hold `secret`; any address may be listened on.
    pub fn with_secret(secret: Secret) -> Security {
        Security {
            secret: Some(secret),
            insecure: false,
        }
    }

    /// No secret, and any address may be listened on (with a warning when it is not
    /// loopback): anyone who can reach the port can join the job or read the store.
    pub fn insecure() -> Security {
        Security {
            secret: None,
            insecure: true,
        }
    }

    /// From the environment: the secret from `COLLECTIX_SECRET` or the file named by
    /// `COLLECTIX_SECRET_FILE` (one of them; surrounding whitespace is not part of it), and
    /// `COLLECTIX_INSECURE` (`1`, `true` or `yes`).
    pub fn from_env() -> Result<Security> {
        Security::resolve(&|k| std::env::var(k).ok())
    }

    /// [`from_env`](Security::from_env) over any source of variables (for tests).
    pub fn resolve(env: &dyn Fn(&str) -> Option<String>) -> Result<Security> {
        let text = env("COLLECTIX_SECRET").filter(|s| !s.trim().is_empty());
        let file = env("COLLECTIX_SECRET_FILE").filter(|s| !s.trim().is_empty());
        let secret = match (text, file) {
            (Some(_), Some(_)) => {
                return Err(Error::invalid(
                    "both COLLECTIX_SECRET and COLLECTIX_SECRET_FILE are set: set one",
                ))
            }
            (Some(t), None) => Some(Secret::new(t.trim().as_bytes())?),
            (None, Some(path)) => Some(read_secret_file(path.trim())?),
            (None, None) => None,
        };
        let insecure = match env("COLLECTIX_INSECURE").as_deref().map(str::trim) {
            None | Some("" | "0" | "false" | "no") => false,
            Some("1" | "true" | "yes") => true,
            Some(other) => {
                return Err(Error::invalid(format!(
                    "COLLECTIX_INSECURE is {other:?}; set it to 1 or leave it unset"
                )))
            }
        };
        Ok(Security { secret, insecure })
    }

    /// Whether connections must prove they hold a secret.
    pub fn has_secret(&self) -> bool {
        self.secret.is_some()
    }

    /// Whether any address may be listened on: with a secret, or insecure.
    pub fn any_address(&self) -> bool {
        self.secret.is_some() || self.insecure
    }

    /// Whether listening on `ip` is allowed: always with a secret; without one only on a
    /// loopback address, unless insecure was asked for (then with a warning). `what` names
    /// the listener in the error and the warning.
    pub fn check_bind(&self, ip: IpAddr, what: &str) -> Result<()> {
        if self.secret.is_some() || ip.is_loopback() {
            return Ok(());
        }
        if self.insecure {
            tracing::warn!(
                %ip,
                what,
                "listening beyond loopback without a secret (COLLECTIX_INSECURE): anyone who reaches the port can join the job"
            );
            return Ok(());
        }
        Err(Error::invalid(format!(
            "{what} would listen on {ip}, which other hosts can reach, and no secret is set: \
             set COLLECTIX_SECRET (the same on every rank; `collectix launch` makes one) or \
             COLLECTIX_SECRET_FILE, or COLLECTIX_INSECURE=1 to run without one"
        )))
    }

    /// The client's side of the handshake (see the module doc), on a fresh connection.
    /// `ctx` names the protocol (`b"link"`, `b"store"`).
    pub(crate) fn client<S: Read + Write>(&self, s: &mut S, ctx: &[u8]) -> Result<(), Denied> {
        let nc = Security::client_hello(s)?;
        self.client_finish(s, ctx, &nc)
    }

    /// The client's first step: its hello (the magic and its nonce), sent; the nonce.
    pub(crate) fn client_hello<S: Write>(s: &mut S) -> Result<[u8; NONCE], Denied> {
        let nc = nonce()?;
        let mut hello = [0u8; MAGIC.len() + NONCE];
        hello[..MAGIC.len()].copy_from_slice(&MAGIC);
        hello[MAGIC.len()..].copy_from_slice(&nc);
        s.write_all(&hello).map_err(io(AuthStep::SendChallenge))?;
        Ok(nc)
    }

    /// The rest of the client's side, once its hello (with nonce `nc`) is sent.
    pub(crate) fn client_finish<S: Read + Write>(
        &self,
        s: &mut S,
        ctx: &[u8],
        nc: &[u8; NONCE],
    ) -> Result<(), Denied> {
        let nc = *nc;
        let mut mode = [0u8; 1];
        s.read_exact(&mut mode).map_err(io(AuthStep::ReadAnswer))?;
        let secret = match (mode[0], &self.secret) {
            (0, None) => return Ok(()),
            (0, Some(_)) => return Err(Denied::Secret(SecretMismatch::PeerHasNone)),
            (1, None) => return Err(Denied::Secret(SecretMismatch::NoneHere)),
            (1, Some(k)) => k,
            _ => return Err(Denied::NotCollectix),
        };
        let mut answer = [0u8; 2 * NONCE];
        s.read_exact(&mut answer)
            .map_err(io(AuthStep::ReadAnswer))?;
        let mut ns = [0u8; NONCE];
        ns.copy_from_slice(&answer[..NONCE]);
        if !secret.verify(b"server", ctx, &nc, &ns, &answer[NONCE..]) {
            return Err(Denied::Secret(SecretMismatch::PeerProofWrong));
        }
        s.write_all(&secret.proof(b"client", ctx, &nc, &ns)?)
            .map_err(io(AuthStep::SendProof))?;
        let mut verdict = [0u8; 1];
        s.read_exact(&mut verdict)
            .map_err(io(AuthStep::ReadVerdict))?;
        match verdict[0] {
            0 => Ok(()),
            _ => Err(Denied::Secret(SecretMismatch::OwnProofRefused)),
        }
    }

    /// The server's side of the handshake (see the module doc): `Ok` once the client has
    /// proved it holds the secret (or at once, without a secret). Nothing else is read
    /// from a connection before this returns `Ok`. ([`ServerHandshake`] over a blocking
    /// stream; the gate drives the same steps over many connections at once.)
    pub(crate) fn server<S: Read + Write>(&self, s: &mut S, ctx: &[u8]) -> Result<(), Denied> {
        let mut hs = ServerHandshake::new(self, ctx);
        let mut buf = [0u8; MAGIC.len() + NONCE];
        loop {
            let (want, read_step, write_step) = hs.step();
            s.read_exact(&mut buf[..want]).map_err(io(read_step))?;
            let fed = hs.feed(&buf[..want]);
            match fed.end {
                // A refusal's verdict byte goes if it can.
                Some(Err(d)) => {
                    let _ = s.write_all(&fed.write);
                    return Err(d);
                }
                end => {
                    if !fed.write.is_empty() {
                        s.write_all(&fed.write).map_err(io(write_step))?;
                    }
                    if let Some(end) = end {
                        return end;
                    }
                }
            }
        }
    }
}

/// The server's side of the handshake as steps without IO: bytes from the client in, bytes
/// to send back out, until the client is accepted or refused. [`Security::server`] drives it
/// over one blocking stream; `gate.rs` drives many over non-blocking ones, without a thread
/// each.
pub(crate) struct ServerHandshake {
    secret: Option<Secret>,
    ctx: Vec<u8>,
    /// Waiting for the proof (else for the hello).
    proof: bool,
    got: Vec<u8>,
    nc: [u8; NONCE],
    ns: [u8; NONCE],
}

/// What [`ServerHandshake::feed`] gives: bytes to send the client, and the outcome once there
/// is one (on a refusal, the bytes are its verdict, sent if they can be).
pub(crate) struct Fed {
    pub(crate) write: Vec<u8>,
    pub(crate) end: Option<Result<(), Denied>>,
}

impl ServerHandshake {
    /// A handshake for a fresh connection, under `sec`'s secret (if any), for protocol `ctx`.
    pub(crate) fn new(sec: &Security, ctx: &[u8]) -> ServerHandshake {
        ServerHandshake {
            secret: sec.secret.clone(),
            ctx: ctx.to_vec(),
            proof: false,
            got: Vec::with_capacity(MAGIC.len() + NONCE),
            nc: [0; NONCE],
            ns: [0; NONCE],
        }
    }

    /// Whether nothing of the client's hello has come yet.
    pub(crate) fn fresh(&self) -> bool {
        !self.proof && self.got.is_empty()
    }

    /// The bytes still to read for this step, and the steps a failed read or write is.
    pub(crate) fn step(&self) -> (usize, AuthStep, AuthStep) {
        if self.proof {
            (
                NONCE - self.got.len(),
                AuthStep::ReadProof,
                AuthStep::AnswerProof,
            )
        } else {
            (
                MAGIC.len() + NONCE - self.got.len(),
                AuthStep::ReadChallenge,
                AuthStep::AnswerChallenge,
            )
        }
    }

    /// Takes bytes the client sent (at most what [`step`](Self::step) asks for; more is an
    /// error of the caller's, refused as not collectix).
    pub(crate) fn feed(&mut self, bytes: &[u8]) -> Fed {
        let (want, _, _) = self.step();
        let nothing = |end| Fed {
            write: Vec::new(),
            end,
        };
        if bytes.len() > want {
            return nothing(Some(Err(Denied::NotCollectix)));
        }
        self.got.extend_from_slice(bytes);
        // Not the magic's first bytes: refused now, not once the whole hello is there (a
        // client of another protocol learns it at once, not at the deadline).
        let seen = self.got.len().min(MAGIC.len());
        if !self.proof && self.got[..seen] != MAGIC[..seen] {
            return nothing(Some(Err(Denied::NotCollectix)));
        }
        if bytes.len() < want {
            return nothing(None);
        }
        if !self.proof {
            if self.got[..MAGIC.len()] != MAGIC {
                return nothing(Some(Err(Denied::NotCollectix)));
            }
            self.nc.copy_from_slice(&self.got[MAGIC.len()..]);
            self.got.clear();
            let Some(secret) = &self.secret else {
                return Fed {
                    write: vec![0],
                    end: Some(Ok(())),
                };
            };
            let ns = match nonce() {
                Ok(n) => n,
                Err(d) => return nothing(Some(Err(d))),
            };
            let proof = match secret.proof(b"server", &self.ctx, &self.nc, &ns) {
                Ok(p) => p,
                Err(d) => return nothing(Some(Err(d))),
            };
            self.ns = ns;
            self.proof = true;
            let mut answer = Vec::with_capacity(1 + 2 * NONCE);
            answer.push(1);
            answer.extend_from_slice(&ns);
            answer.extend_from_slice(&proof);
            return Fed {
                write: answer,
                end: None,
            };
        }
        let ok = self
            .secret
            .as_ref()
            .is_some_and(|k| k.verify(b"client", &self.ctx, &self.nc, &self.ns, &self.got));
        if ok {
            Fed {
                write: vec![0],
                end: Some(Ok(())),
            }
        } else {
            Fed {
                write: vec![1],
                end: Some(Err(Denied::Secret(SecretMismatch::ClientProofWrong))),
            }
        }
    }
}

fn nonce() -> Result<[u8; NONCE], Denied> {
    let mut n = [0u8; NONCE];
    getrandom::fill(&mut n).map_err(|e| Denied::Io {
        step: AuthStep::Nonce,
        detail: e.to_string(),
    })?;
    Ok(n)
}

/// Reads a secret file: its size is checked before it is read.
fn read_secret_file(path: &str) -> Result<Secret> {
    let bad = |e: std::io::Error| Error::invalid(format!("COLLECTIX_SECRET_FILE {path:?}: {e}"));
    let meta = std::fs::metadata(path).map_err(bad)?;
    if meta.len() > MAX_SECRET_BYTES as u64 + 2 {
        return Err(Error::invalid(format!(
            "COLLECTIX_SECRET_FILE {path:?} has {} bytes; a secret has at most {MAX_SECRET_BYTES}",
            meta.len()
        )));
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if meta.permissions().mode() & 0o077 != 0 {
            tracing::warn!(
                path,
                "the secret file can be read by others than its owner: chmod 600 it"
            );
        }
    }
    let text = std::fs::read(path).map_err(bad)?;
    Secret::new(text.trim_ascii())
}

#[cfg(test)]
mod tests;
