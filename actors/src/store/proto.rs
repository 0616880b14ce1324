//! The TCP store's wire protocol: a frame is a 4-byte little-endian length and that many
//! bytes of a bincode-encoded [`Request`] or [`Response`] (control messages; no tensor data
//! travels here). A connection opens with the secret handshake ([`crate::Security`]); its first
//! frame then is [`Request::Hello`] with the protocol's
//! magic and version; a server answers anything else, or another version, by closing.
//!
//! Nothing from the wire is trusted: a length above [`MAX_FRAME`] is refused before anything
//! is allocated, the body is read into a buffer that grows only as bytes arrive, and bincode
//! decodes under the same limit (so no length inside a frame allocates more either).

use collectix_runtime::Error;
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};

/// Identifies the protocol in [`Request::Hello`].
pub(crate) const MAGIC: [u8; 8] = *b"cx-store";
/// The protocol's version; a server refuses any other.
pub(crate) const VERSION: u32 = 2;
/// The largest frame: keys and values are small (addresses, counters, ids); a value larger
/// than this is refused on both sides.
pub(crate) const MAX_FRAME: usize = 64 << 20;

/// What a client asks. Timeouts are in milliseconds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) enum Request {
    Hello {
        magic: [u8; 8],
        version: u32,
    },
    Set {
        key: String,
        value: Vec<u8>,
    },
    Get {
        key: String,
        timeout_ms: u64,
    },
    Add {
        key: String,
        delta: i64,
    },
    CompareSet {
        key: String,
        expected: Vec<u8>,
        desired: Vec<u8>,
    },
    Wait {
        keys: Vec<String>,
        timeout_ms: u64,
    },
    Check {
        keys: Vec<String>,
    },
    Delete {
        key: String,
    },
    NumKeys,
}

impl Request {
    /// The bytes of keys and values it carries: a lower bound on its frame's size, known
    /// without encoding it.
    pub(crate) fn carried_bytes(&self) -> usize {
        match self {
            Request::Set { key, value } => key.len().saturating_add(value.len()),
            Request::CompareSet {
                key,
                expected,
                desired,
            } => key
                .len()
                .saturating_add(expected.len())
                .saturating_add(desired.len()),
            Request::Get { key, .. } | Request::Add { key, .. } | Request::Delete { key } => {
                key.len()
            }
            Request::Wait { keys, .. } | Request::Check { keys } => {
                keys.iter().fold(0usize, |n, k| n.saturating_add(k.len()))
            }
            Request::Hello { .. } | Request::NumKeys => 0,
        }
    }

    /// Whether sending it twice does what sending it once does (a client retries these on a
    /// fresh connection when the old one broke mid-request).
    pub(crate) fn idempotent(&self) -> bool {
        !matches!(self, Request::Add { .. } | Request::CompareSet { .. })
    }

    /// Whether it changes the table (others may see its effect before its answer leaves).
    pub(crate) fn changes(&self) -> bool {
        matches!(
            self,
            Request::Set { .. }
                | Request::Add { .. }
                | Request::CompareSet { .. }
                | Request::Delete { .. }
        )
    }
}

/// What the server answers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) enum Response {
    Done,
    Value(Vec<u8>),
    Int(i64),
    Bool(bool),
    Count(u64),
    /// The request failed; the text and kind are the server's.
    Failed(Failure),
}

/// A failed request, as it travels.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) enum Failure {
    Timeout { what: String, waited_ms: u64 },
    Invalid(String),
}

impl From<Error> for Failure {
    fn from(e: Error) -> Failure {
        match e {
            Error::StoreTimeout { what, waited_ms } => Failure::Timeout { what, waited_ms },
            Error::InvalidArgument(s) => Failure::Invalid(s),
            other => Failure::Invalid(other.to_string()),
        }
    }
}

impl From<Failure> for Error {
    fn from(f: Failure) -> Error {
        match f {
            Failure::Timeout { what, waited_ms } => Error::StoreTimeout { what, waited_ms },
            Failure::Invalid(s) => Error::InvalidArgument(s),
        }
    }
}

/// Why a frame could not be read.
#[derive(Debug)]
pub(crate) enum FrameError {
    /// The connection failed or closed (`UnexpectedEof` for a close mid-frame).
    Io(std::io::Error),
    /// A length above [`MAX_FRAME`].
    TooLarge(u64),
    /// Bytes that are not a message.
    Malformed(String),
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::Io(e) => write!(f, "{e}"),
            FrameError::TooLarge(n) => {
                write!(f, "a frame of {n} bytes (the limit is {MAX_FRAME})")
            }
            FrameError::Malformed(s) => write!(f, "a malformed frame: {s}"),
        }
    }
}

fn config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<MAX_FRAME>()
}

/// Writes `msg` as one frame.
pub(crate) fn write<T: Serialize>(w: &mut impl Write, msg: &T) -> std::io::Result<()> {
    let body = bincode::serde::encode_to_vec(msg, config())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))?;
    if body.len() > MAX_FRAME {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "a store message of {} bytes (the limit is {MAX_FRAME})",
                body.len()
            ),
        ));
    }
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&(body.len() as u32).to_le_bytes());
    frame.extend_from_slice(&body);
    w.write_all(&frame)?;
    w.flush()
}

/// Reads one frame. `Ok(None)` when the peer closed between frames.
pub(crate) fn read<T: for<'de> Deserialize<'de>>(
    r: &mut impl Read,
) -> Result<Option<T>, FrameError> {
    let mut len = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        match r.read(&mut len[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => {
                return Err(FrameError::Io(std::io::ErrorKind::UnexpectedEof.into()));
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(FrameError::Io(e)),
        }
    }
    let n = u32::from_le_bytes(len) as u64;
    if n > MAX_FRAME as u64 {
        return Err(FrameError::TooLarge(n));
    }
    // Grows as bytes arrive: a peer that announces 64 MiB and sends 10 bytes costs 10 bytes.
    let mut body = Vec::with_capacity((n as usize).min(64 << 10));
    r.take(n).read_to_end(&mut body).map_err(FrameError::Io)?;
    if body.len() as u64 != n {
        return Err(FrameError::Io(std::io::ErrorKind::UnexpectedEof.into()));
    }
    let (msg, used) = bincode::serde::decode_from_slice(&body, config())
        .map_err(|e| FrameError::Malformed(e.to_string()))?;
    if used != body.len() {
        return Err(FrameError::Malformed(format!(
            "{} bytes after the message",
            body.len() - used
        )));
    }
    Ok(Some(msg))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_hostile_ones_are_refused_before_allocating() {
        let msgs = vec![
            Request::Hello {
                magic: MAGIC,
                version: VERSION,
            },
            Request::Set {
                key: "k".into(),
                value: vec![1, 2, 3],
            },
            Request::Wait {
                keys: vec!["a".into(), "b".into()],
                timeout_ms: 5,
            },
            Request::NumKeys,
        ];
        let mut buf = Vec::new();
        for m in &msgs {
            write(&mut buf, m).unwrap_or(());
        }
        let mut r = buf.as_slice();
        for m in &msgs {
            assert_eq!(read::<Request>(&mut r).ok().flatten().as_ref(), Some(m));
        }
        assert!(matches!(read::<Request>(&mut r), Ok(None)));
        // A length of 4 GiB: refused from the 4 bytes alone.
        let mut huge: &[u8] = &[0xff, 0xff, 0xff, 0xff, 1, 2];
        assert!(matches!(
            read::<Request>(&mut huge),
            Err(FrameError::TooLarge(4_294_967_295))
        ));
        // A frame cut short, garbage inside a frame, and a key length far beyond the frame.
        let mut cut: &[u8] = &[10, 0, 0, 0, 1, 2];
        assert!(matches!(read::<Request>(&mut cut), Err(FrameError::Io(_))));
        let mut junk: &[u8] = &[3, 0, 0, 0, 0xee, 0xee, 0xee];
        assert!(matches!(
            read::<Request>(&mut junk),
            Err(FrameError::Malformed(_))
        ));
        // Set { key: <a string claiming 2^60 bytes> }: bincode's limit refuses it.
        let mut claim = vec![0u8; 0];
        claim.extend_from_slice(&[11, 0, 0, 0]);
        claim.push(1); // variant Set
        claim.push(0xfd); // u64 length follows
        claim.extend_from_slice(&(1u64 << 60).to_le_bytes());
        claim.push(0);
        let mut c = claim.as_slice();
        assert!(matches!(
            read::<Request>(&mut c),
            Err(FrameError::Malformed(_))
        ));
    }
}
