use super::*;
use crate::test_support::env;
use std::net::{TcpListener, TcpStream};

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
                _ => Err(Denied::Io {
                    step: AuthStep::ReadProof,
                    detail: "the client left after the handshake".into(),
                }),
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
    assert_eq!(c, Err(Denied::Secret(SecretMismatch::PeerProofWrong)));
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
    assert_eq!(c, Err(Denied::Secret(SecretMismatch::NoneHere)));
    assert!(s.is_err(), "{s:?}");
    // The server asks for nothing, but the client leaves before sending anything more:
    // nothing it would have sent is read.
    let (c, s) = shake(
        with("the job's secret"),
        Security::default(),
        b"link",
        b"link",
    );
    assert_eq!(c, Err(Denied::Secret(SecretMismatch::PeerHasNone)));
    assert!(matches!(&s, Err(Denied::Io { .. })), "{s:?}");
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
