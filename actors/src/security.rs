//! Who may connect to a job, and where it listens (issue 12).
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
//! rank is reached at is [`own_ip`]'s choice: `COLLECTIX_ADDR`, else the address of
//! `COLLECTIX_SOCKET_IFNAME` (Gloo's `GLOO_SOCKET_IFNAME`), else the interface of the route
//! to the store's host.

use collectix_runtime::{Error, Result};
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use std::io::{Read, Write};
use std::net::{IpAddr, ToSocketAddrs, UdpSocket};
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
            .ok_or_else(|| Denied::Secret("the secret is not an HMAC key".into()))?;
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
pub enum Denied {
    /// The other side is not a collectix endpoint of this version (wrong magic).
    NotCollectix,
    /// The proofs disagree, or one side has a secret and the other none: the text says which.
    Secret(String),
    /// The connection failed or timed out.
    Io(String),
}

impl std::fmt::Display for Denied {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Denied::NotCollectix => {
                f.write_str("not a collectix connection (or an older version of collectix)")
            }
            Denied::Secret(why) | Denied::Io(why) => f.write_str(why),
        }
    }
}

fn io(what: &str) -> impl Fn(std::io::Error) -> Denied + '_ {
    move |e| Denied::Io(format!("{what}: {e}"))
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
        let nc = nonce()?;
        let mut hello = [0u8; MAGIC.len() + NONCE];
        hello[..MAGIC.len()].copy_from_slice(&MAGIC);
        hello[MAGIC.len()..].copy_from_slice(&nc);
        s.write_all(&hello)
            .map_err(io("cannot send the challenge"))?;
        let mut mode = [0u8; 1];
        s.read_exact(&mut mode)
            .map_err(io("no answer to the challenge"))?;
        let secret = match (mode[0], &self.secret) {
            (0, None) => return Ok(()),
            (0, Some(_)) => {
                return Err(Denied::Secret(
                    "it has no secret, and this process has one: give every rank the same \
                     COLLECTIX_SECRET"
                        .into(),
                ))
            }
            (1, None) => {
                return Err(Denied::Secret(
                    "it demands a secret, and this process has none: set COLLECTIX_SECRET \
                     (the job's) or COLLECTIX_SECRET_FILE"
                        .into(),
                ))
            }
            (1, Some(k)) => k,
            _ => return Err(Denied::NotCollectix),
        };
        let mut answer = [0u8; 2 * NONCE];
        s.read_exact(&mut answer)
            .map_err(io("no answer to the challenge"))?;
        let mut ns = [0u8; NONCE];
        ns.copy_from_slice(&answer[..NONCE]);
        if !secret.verify(b"server", ctx, &nc, &ns, &answer[NONCE..]) {
            return Err(Denied::Secret(
                "it does not know this job's secret (its proof is wrong): the secrets differ"
                    .into(),
            ));
        }
        s.write_all(&secret.proof(b"client", ctx, &nc, &ns)?)
            .map_err(io("cannot send the proof"))?;
        let mut verdict = [0u8; 1];
        s.read_exact(&mut verdict)
            .map_err(io("no answer to the proof"))?;
        match verdict[0] {
            0 => Ok(()),
            _ => Err(Denied::Secret(
                "it refused this process's proof: the secrets differ".into(),
            )),
        }
    }

    /// The server's side of the handshake (see the module doc): `Ok` once the client has
    /// proved it holds the secret (or at once, without a secret). Nothing else is read
    /// from a connection before this returns `Ok`.
    pub(crate) fn server<S: Read + Write>(&self, s: &mut S, ctx: &[u8]) -> Result<(), Denied> {
        let mut hello = [0u8; MAGIC.len() + NONCE];
        s.read_exact(&mut hello).map_err(io("no challenge"))?;
        if hello[..MAGIC.len()] != MAGIC {
            return Err(Denied::NotCollectix);
        }
        let mut nc = [0u8; NONCE];
        nc.copy_from_slice(&hello[MAGIC.len()..]);
        let Some(secret) = &self.secret else {
            s.write_all(&[0])
                .map_err(io("cannot answer the challenge"))?;
            return Ok(());
        };
        let ns = nonce()?;
        let mut answer = [0u8; 1 + 2 * NONCE];
        answer[0] = 1;
        answer[1..=NONCE].copy_from_slice(&ns);
        answer[1 + NONCE..].copy_from_slice(&secret.proof(b"server", ctx, &nc, &ns)?);
        s.write_all(&answer)
            .map_err(io("cannot answer the challenge"))?;
        let mut proof = [0u8; NONCE];
        s.read_exact(&mut proof).map_err(io("no proof"))?;
        if secret.verify(b"client", ctx, &nc, &ns, &proof) {
            s.write_all(&[0]).map_err(io("cannot answer the proof"))?;
            Ok(())
        } else {
            let _ = s.write_all(&[1]);
            Err(Denied::Secret(
                "a wrong proof: it does not know the secret".into(),
            ))
        }
    }
}

fn nonce() -> Result<[u8; NONCE], Denied> {
    let mut n = [0u8; NONCE];
    getrandom::fill(&mut n).map_err(|e| Denied::Io(format!("no random bytes from the OS: {e}")))?;
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

/// The address this process is reached at by its peers, in order of preference:
/// `COLLECTIX_ADDR` (an address or a name, as given), the first address of the interface
/// named by `COLLECTIX_SOCKET_IFNAME` (IPv4 before IPv6), the local end of the route to the
/// store's host (no packet is sent), loopback.
pub fn own_ip(store_host: Option<&str>) -> Result<String> {
    own_ip_from(store_host, &|k| std::env::var(k).ok())
}

/// [`own_ip`] over any source of variables.
pub fn own_ip_from(
    store_host: Option<&str>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<String> {
    if let Some(a) = env("COLLECTIX_ADDR").filter(|a| !a.trim().is_empty()) {
        return Ok(a.trim().to_string());
    }
    if let Some(name) = env("COLLECTIX_SOCKET_IFNAME").filter(|a| !a.trim().is_empty()) {
        return interface_ip(name.trim()).map(|ip| ip.to_string());
    }
    let route = store_host.and_then(|h| {
        let target = (h, 9).to_socket_addrs().ok()?.next()?;
        let bind = if target.is_ipv4() {
            "0.0.0.0:0"
        } else {
            "[::]:0"
        };
        let s = UdpSocket::bind(bind).ok()?;
        s.connect(target).ok()?;
        s.local_addr().ok().map(|a| a.ip().to_string())
    });
    Ok(route.unwrap_or_else(|| "127.0.0.1".into()))
}

/// The address of the interface `name` (an IPv4 one if it has one; an IPv6 one that is not
/// link-local otherwise); an address given in its place is taken as it is.
pub fn interface_ip(name: &str) -> Result<IpAddr> {
    if let Ok(ip) = name.parse::<IpAddr>() {
        return Ok(ip);
    }
    let found = interface_addrs(name)?;
    let pick = found
        .iter()
        .find(|ip| ip.is_ipv4())
        .or_else(|| {
            found
                .iter()
                .find(|ip| matches!(ip, IpAddr::V6(v6) if (v6.segments()[0] & 0xffc0) != 0xfe80))
        })
        .copied();
    pick.ok_or_else(|| {
        Error::invalid(format!(
            "COLLECTIX_SOCKET_IFNAME={name}: no such interface with an address on this host{}",
            interface_names()
                .map(|n| format!(" (it has {})", n.join(", ")))
                .unwrap_or_default()
        ))
    })
}

#[cfg(unix)]
fn interface_addrs(name: &str) -> Result<Vec<IpAddr>> {
    let all = nix::ifaddrs::getifaddrs()
        .map_err(|e| Error::Resource(format!("cannot list the network interfaces: {e}")))?;
    Ok(all
        .filter(|i| i.interface_name == name)
        .filter_map(|i| {
            let a = i.address?;
            if let Some(v4) = a.as_sockaddr_in() {
                Some(IpAddr::V4(v4.ip()))
            } else {
                a.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip()))
            }
        })
        .collect())
}

#[cfg(unix)]
fn interface_names() -> Option<Vec<String>> {
    let mut names: Vec<String> = nix::ifaddrs::getifaddrs()
        .ok()?
        .map(|i| i.interface_name)
        .collect();
    names.sort();
    names.dedup();
    Some(names)
}

#[cfg(not(unix))]
fn interface_addrs(name: &str) -> Result<Vec<IpAddr>> {
    Err(Error::invalid(format!(
        "COLLECTIX_SOCKET_IFNAME={name}: interface names are read on Unix only; give an address (COLLECTIX_ADDR)"
    )))
}

#[cfg(not(unix))]
fn interface_names() -> Option<Vec<String>> {
    None
}

/// The IP address of `host` (a name or an address), the first it resolves to.
pub(crate) fn resolve_ip(host: &str) -> Option<IpAddr> {
    let h = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = h.parse::<IpAddr>() {
        return Some(ip);
    }
    (h, 0).to_socket_addrs().ok()?.next().map(|a| a.ip())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let v: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| v.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
    }

    fn with(secret: &str) -> Security {
        Security::with_secret(Secret::new(secret.as_bytes()).unwrap_or_else(|e| panic!("{e}")))
    }

    /// Runs the handshake over a real connection: (client's outcome, server's outcome).
    fn shake(
        client: Security,
        server: Security,
        cctx: &'static [u8],
        sctx: &'static [u8],
    ) -> (Result<(), Denied>, Result<(), Denied>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
        let addr = l.local_addr().unwrap_or_else(|e| panic!("{e}"));
        let t = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap_or_else(|e| panic!("{e}"));
            // What the server reads next must be what the client sent after the handshake
            // (a marker byte); a client that left instead is the server's failure too.
            server.server(&mut s, sctx).and_then(|()| {
                let mut m = [0u8; 1];
                match s.read_exact(&mut m) {
                    Ok(()) if m[0] == 0xab => Ok(()),
                    _ => Err(Denied::Io("the client left after the handshake".into())),
                }
            })
        });
        let mut c = TcpStream::connect(addr).unwrap_or_else(|e| panic!("{e}"));
        let r = client.client(&mut c, cctx);
        if r.is_ok() {
            let _ = c.write_all(&[0xab]);
        }
        drop(c);
        (r, t.join().unwrap_or_else(|_| panic!("server panicked")))
    }

    #[test]
    fn the_same_secret_passes_and_anything_else_is_refused_on_both_sides() {
        let secret = |r: &Result<(), Denied>| matches!(r, Err(Denied::Secret(_)));
        let (c, s) = shake(
            with("the job's secret"),
            with("the job's secret"),
            b"link",
            b"link",
        );
        assert_eq!((c, s), (Ok(()), Ok(())));
        let (c, s) = shake(Security::default(), Security::default(), b"link", b"link");
        assert_eq!((c, s), (Ok(()), Ok(())));
        // Different secrets: the client sees the server's proof fail and leaves; the server
        // then has no proof.
        let (c, s) = shake(
            with("the job's secret"),
            with("another secret!!"),
            b"link",
            b"link",
        );
        assert!(secret(&c), "{c:?}");
        assert!(s.is_err(), "{s:?}");
        // The same secret in another protocol does not pass either.
        let (c, s) = shake(
            with("the job's secret"),
            with("the job's secret"),
            b"link",
            b"store",
        );
        assert!(secret(&c) && s.is_err(), "{c:?} {s:?}");
        // A client without the secret; a client with one, at a server without.
        let (c, s) = shake(
            Security::default(),
            with("the job's secret"),
            b"link",
            b"link",
        );
        assert!(secret(&c) && s.is_err(), "{c:?} {s:?}");
        // The server asks for nothing, but the client leaves before sending anything more:
        // nothing it would have sent is read.
        let (c, s) = shake(
            with("the job's secret"),
            Security::default(),
            b"link",
            b"link",
        );
        assert!(secret(&c), "{c:?}");
        assert!(matches!(&s, Err(Denied::Io(_))), "{s:?}");
    }

    /// A listener running the server's side of the handshake (context `link`) for one
    /// connection: its address, and the outcome.
    fn serving(
        server: Security,
    ) -> (
        std::net::SocketAddr,
        std::thread::JoinHandle<Result<(), Denied>>,
    ) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
        let addr = l.local_addr().unwrap_or_else(|e| panic!("{e}"));
        let t = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap_or_else(|e| panic!("{e}"));
            server.server(&mut s, b"link")
        });
        (addr, t)
    }

    #[test]
    fn a_client_that_echoes_the_servers_proof_or_guesses_is_refused() {
        let (addr, t) = serving(with("the job's secret"));
        // A forger: sends a challenge, then hands the server's own proof back.
        let mut c = TcpStream::connect(addr).unwrap_or_else(|e| panic!("{e}"));
        let mut hello = MAGIC.to_vec();
        hello.extend_from_slice(&[7u8; NONCE]);
        assert!(c.write_all(&hello).is_ok());
        let mut answer = [0u8; 1 + 2 * NONCE];
        assert!(c.read_exact(&mut answer).is_ok());
        assert_eq!(answer[0], 1);
        assert!(c.write_all(&answer[1 + NONCE..]).is_ok());
        let mut verdict = [0u8; 1];
        assert!(c.read_exact(&mut verdict).is_ok());
        assert_eq!(verdict[0], 1, "refused");
        let s = t.join().unwrap_or_else(|_| panic!("server panicked"));
        assert!(matches!(s, Err(Denied::Secret(_))), "{s:?}");
        // Something that is not collectix at all.
        let (addr, t) = serving(with("the job's secret"));
        let mut c = TcpStream::connect(addr).unwrap_or_else(|e| panic!("{e}"));
        assert!(c
            .write_all(b"GET / HTTP/1.1\r\nHost: collectix.example\r\n\r\n")
            .is_ok());
        let s = t.join().unwrap_or_else(|_| panic!("server panicked"));
        assert_eq!(s, Err(Denied::NotCollectix));
    }

    #[test]
    fn secrets_come_from_one_variable_or_a_file_checked_before_it_is_read() {
        let s = Security::resolve(&env(&[("COLLECTIX_SECRET", " abcdefabcdefabcdef\n")]));
        assert!(matches!(&s, Ok(s) if s.has_secret()), "{s:?}");
        let s = Security::resolve(&env(&[]));
        assert!(matches!(&s, Ok(s) if !s.has_secret() && !s.insecure));
        let dir = std::env::temp_dir().join(format!("cx-secret-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let file = dir.join("secret");
        assert!(std::fs::write(&file, "0123456789abcdef0123\n").is_ok());
        let path = file.to_string_lossy().into_owned();
        let from_file = Security::resolve(&env(&[("COLLECTIX_SECRET_FILE", &path)]));
        let from_text = Security::resolve(&env(&[("COLLECTIX_SECRET", "0123456789abcdef0123")]));
        // The file's secret is the text's (the newline is not part of it): they shake hands.
        match (from_file, from_text) {
            (Ok(a), Ok(b)) => assert_eq!(shake(a, b, b"link", b"link"), (Ok(()), Ok(()))),
            other => panic!("{other:?}"),
        }
        // Too large: refused from its size.
        assert!(std::fs::write(&file, vec![b'x'; 10_000]).is_ok());
        let big = Security::resolve(&env(&[("COLLECTIX_SECRET_FILE", &path)]));
        assert!(matches!(&big, Err(Error::InvalidArgument(m)) if m.contains("10000 bytes")));
        let _ = std::fs::remove_dir_all(&dir);
        for (pairs, says) in [
            (
                vec![("COLLECTIX_SECRET", "a"), ("COLLECTIX_SECRET_FILE", "/x")],
                "set one",
            ),
            (
                vec![("COLLECTIX_SECRET_FILE", "/no/such/file")],
                "/no/such/file",
            ),
            (vec![("COLLECTIX_INSECURE", "maybe")], "COLLECTIX_INSECURE"),
        ] {
            let r = Security::resolve(&env(&pairs));
            assert!(
                matches!(&r, Err(Error::InvalidArgument(m)) if m.contains(says)),
                "{pairs:?}: {r:?}"
            );
        }
    }

    #[test]
    fn without_a_secret_only_loopback_may_be_listened_on_unless_insecure_is_asked() {
        let v4: IpAddr = "10.1.2.3".parse().unwrap_or_else(|e| panic!("{e}"));
        let any: IpAddr = "::".parse().unwrap_or_else(|e| panic!("{e}"));
        for lo in ["127.0.0.1", "::1"] {
            let ip: IpAddr = lo.parse().unwrap_or_else(|e| panic!("{e}"));
            assert!(Security::default().check_bind(ip, "x").is_ok());
        }
        for ip in [v4, any] {
            let r = Security::default().check_bind(ip, "the store");
            assert!(
                matches!(&r, Err(Error::InvalidArgument(m)) if m.contains("COLLECTIX_SECRET") && m.contains("the store")),
                "{r:?}"
            );
            assert!(Security::insecure().check_bind(ip, "x").is_ok());
            assert!(with("the job's secret").check_bind(ip, "x").is_ok());
        }
        let s = Security::resolve(&env(&[("COLLECTIX_INSECURE", "1")]));
        assert!(matches!(s, Ok(s) if s.check_bind(v4, "x").is_ok()));
    }

    #[test]
    fn the_address_comes_from_collectix_addr_then_the_interface_then_the_route() {
        let e = env(&[
            ("COLLECTIX_ADDR", "node07"),
            ("COLLECTIX_SOCKET_IFNAME", "lo"),
        ]);
        assert_eq!(
            own_ip_from(Some("127.0.0.1"), &e).ok().as_deref(),
            Some("node07")
        );
        let e = env(&[("COLLECTIX_SOCKET_IFNAME", "lo")]);
        assert_eq!(
            own_ip_from(Some("192.0.2.1"), &e).ok().as_deref(),
            Some("127.0.0.1")
        );
        let e = env(&[("COLLECTIX_SOCKET_IFNAME", "192.0.2.9")]);
        assert_eq!(own_ip_from(None, &e).ok().as_deref(), Some("192.0.2.9"));
        let e = env(&[("COLLECTIX_SOCKET_IFNAME", "no-such-if0")]);
        let r = own_ip_from(None, &e);
        assert!(
            matches!(&r, Err(Error::InvalidArgument(m)) if m.contains("no-such-if0") && m.contains("lo")),
            "{r:?}"
        );
        assert_eq!(
            own_ip_from(Some("127.0.0.1"), &env(&[])).ok().as_deref(),
            Some("127.0.0.1")
        );
        assert_eq!(
            own_ip_from(None, &env(&[])).ok().as_deref(),
            Some("127.0.0.1")
        );
    }

    #[test]
    fn a_random_secret_is_64_hex_characters_and_fresh() {
        let (a, b) = (Secret::random_text(), Secret::random_text());
        match (a, b) {
            (Ok(a), Ok(b)) => {
                assert_eq!(a.len(), 64);
                assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
                assert_ne!(a, b);
            }
            other => panic!("{other:?}"),
        }
        assert!(format!("{:?}", Secret::new("hidden-value-123456")).contains("19 bytes"));
        assert!(!format!("{:?}", Secret::new("hidden-value-123456")).contains("hidden"));
    }
}
