//! Fuzz targets (proptest) for what a peer that has not proved anything can send: the secret
//! handshake, both sides, and the store's protocol, the server's request handling included.
//! The frame codec's targets are `runtime/tests/suite/codec.rs`; the engine's, `runtime/tests/
//! engine_fuzz.rs`. Each target takes arbitrary bytes, and valid transcripts or frames with
//! bytes flipped, cut or appended (the seeds: every kind of request, a whole handshake), and
//! must end in a value or a typed error — never a panic, a hang, or an allocation beyond the
//! limits.
//!
//! Inputs per target: `COLLECTIX_FUZZ_CASES` (default 2 000, what CI runs). A long run
//! (`docs/testing.md`):
//!
//! ```text
//! COLLECTIX_FUZZ_CASES=10000000 cargo test --release -p collectix-actors --lib fuzz -- --test-threads=4
//! ```

use crate::security::{Secret, Security};
use crate::store::proto::{self, Request, Response, MAGIC, VERSION};
use crate::store::tcp::handle;
use crate::store::Table;
use proptest::prelude::*;
use std::io::{Cursor, Read, Write};

/// Inputs per target.
fn cases() -> u32 {
    std::env::var("COLLECTIX_FUZZ_CASES")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(2_000)
}

fn config() -> ProptestConfig {
    // A failing input is kept (proptest's regression file beside this one) and run first
    // from then on.
    ProptestConfig {
        cases: cases(),
        ..ProptestConfig::default()
    }
}

/// A connection whose peer's bytes are given; what this side writes is kept.
struct Scripted {
    input: Cursor<Vec<u8>>,
    output: Vec<u8>,
}

impl Scripted {
    fn new(input: Vec<u8>) -> Scripted {
        Scripted {
            input: Cursor::new(input),
            output: Vec::new(),
        }
    }
}

impl Read for Scripted {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.input.read(buf)
    }
}

impl Write for Scripted {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.output.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn secured() -> Security {
    Security::with_secret(Secret::new("the fuzz targets' secret").unwrap_or_else(|e| panic!("{e}")))
}

/// Flips, cuts and appends: `edits` applied to `base`.
fn mutate(mut base: Vec<u8>, edits: &[(usize, u8, u8)]) -> Vec<u8> {
    for &(at, how, byte) in edits {
        if base.is_empty() {
            base.push(byte);
            continue;
        }
        let i = at % base.len();
        match how % 4 {
            0 => base[i] ^= byte | 1,
            1 => base.truncate(i),
            2 => base.insert(i, byte),
            _ => base.push(byte),
        }
    }
    base
}

/// A real client's bytes for a server (with the secret): its hello, then its proof for the
/// server's answer, which a scripted server cannot know in advance — so the proof is the one
/// for a fixed nonce and fails; the bytes still walk the server through every step.
fn client_transcript() -> Vec<u8> {
    let mut v = b"cx-auth1".to_vec();
    v.extend_from_slice(&[7u8; 32]);
    v.extend_from_slice(&[9u8; 32]);
    v
}

/// Every kind of store request, encoded as frames one after another.
fn request_frames() -> Vec<u8> {
    let reqs = [
        Request::Hello {
            magic: MAGIC,
            version: VERSION,
        },
        Request::Set {
            key: "k".into(),
            value: b"v".to_vec(),
        },
        Request::Get {
            key: "k".into(),
            timeout_ms: 0,
        },
        Request::Add {
            key: "n".into(),
            delta: 3,
        },
        Request::CompareSet {
            key: "k".into(),
            expected: b"v".to_vec(),
            desired: b"w".to_vec(),
        },
        Request::Wait {
            keys: vec!["k".into(), "n".into()],
            timeout_ms: 0,
        },
        Request::Check {
            keys: vec!["k".into()],
        },
        Request::Delete { key: "k".into() },
        Request::NumKeys,
    ];
    let mut out = Vec::new();
    for r in &reqs {
        let _ = proto::write(&mut out, r);
    }
    out
}

/// Reads requests off `bytes` as the server does and handles each (waits cut to zero, so that
/// a decoded timeout cannot stall the run); how many were read.
fn serve_bytes(bytes: Vec<u8>) -> usize {
    let table = Table::default();
    let mut c = Cursor::new(bytes);
    let mut n = 0;
    while let Ok(Some(req)) = proto::read::<Request>(&mut c) {
        let req = match req {
            Request::Get { key, .. } => Request::Get { key, timeout_ms: 0 },
            Request::Wait { keys, .. } => Request::Wait {
                keys,
                timeout_ms: 0,
            },
            other => other,
        };
        let answer = handle(&table, req);
        let mut sink = Vec::new();
        let _ = proto::write(&mut sink, &answer);
        n += 1;
    }
    n
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn fuzz_handshake_server_takes_any_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        for sec in [secured(), Security::loopback_only()] {
            let mut s = Scripted::new(bytes.clone());
            let _ = sec.server(&mut s, b"store");
            // The server never writes more than its answer and its verdict.
            prop_assert!(s.output.len() <= 1 + 64 + 1);
        }
    }

    #[test]
    fn fuzz_handshake_server_takes_a_mangled_client(
        edits in proptest::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 0..6)
    ) {
        let bytes = mutate(client_transcript(), &edits);
        let mut s = Scripted::new(bytes);
        // The proof cannot be right: whatever the edits, the server refuses.
        prop_assert!(secured().server(&mut s, b"link").is_err());
    }

    #[test]
    fn fuzz_handshake_client_takes_any_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        for sec in [secured(), Security::loopback_only()] {
            let mut s = Scripted::new(bytes.clone());
            let r = sec.client(&mut s, b"link");
            // No server without the secret can prove it holds it.
            if sec.has_secret() {
                prop_assert!(r.is_err());
            }
        }
    }

    #[test]
    fn fuzz_store_server_takes_any_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = serve_bytes(bytes);
    }

    #[test]
    fn fuzz_store_server_takes_mangled_requests(
        edits in proptest::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 0..8)
    ) {
        let _ = serve_bytes(mutate(request_frames(), &edits));
    }

    #[test]
    fn fuzz_store_client_takes_any_answer(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let mut c = Cursor::new(bytes);
        while let Ok(Some(_)) = proto::read::<Response>(&mut c) {}
    }
}

#[test]
fn the_seeds_are_valid() {
    // Unmangled, every seed request is read and handled.
    assert_eq!(serve_bytes(request_frames()), 9);
    let mut s = Scripted::new(client_transcript());
    assert!(Security::loopback_only().server(&mut s, b"store").is_ok());
}
