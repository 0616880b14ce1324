//! Frames: a [`Message`] as bytes on a stream, sans-IO. Encoding gives the frame's head (a
//! fixed prefix, the payload parts' lengths and the header) and the payload parts as
//! separate `Bytes`, so that a socket writes them with one vectored write and no copy.
//! Decoding takes bytes as they arrive, checks every length against limits before anything is
//! allocated, returns typed errors and never panics; payload parts are split off the input
//! buffer without copying.
//!
//! ```text
//!  offset  size        field
//!  0       2           magic "CX"
//!  2       1           version (7)
//!  3       1           kind: 1 data, 2 p2p, 3 credit, 4 want-credit, 5 p2p-grant,
//!                      6 p2p-consumed, 7 abort, 8 inquire, 9 status, 10 heartbeat,
//!                      11 left, 12 failed, 13 p2p-ask, 14 probe
//!  4       4           header length H (u32, little-endian; at most MAX_HEADER_BYTES)
//!  8       4           payload parts P (u32; at most Limits::max_parts)
//!  12      8 × P       each part's length (u64; their sum at most Limits::max_payload_bytes)
//!  12+8P   H           the header's fields, per kind (below)
//!  …       Σ lengths   the parts, back to back
//! ```
//!
//! Header fields (integers little-endian; a fingerprint is [`Fingerprint::to_bytes`]):
//! data `group u64, seq u64, tag u32, fingerprint`; p2p `group u64, tag u32, seq u64,
//! dtype u8, count u64, eager u8, path u8`; credit `group u64, calls u64`; want-credit `group u64,
//! seq u64`; p2p-grant `group u64, tag u32, upto u64`; p2p-consumed `group u64, eager u64`;
//! abort `group u64, reason` (a code byte and its fields; see [`AbortReason`]); inquire
//! `group u64, seq u64`; left `group u64, calls u64`; failed `group u64, seq u64, reason
//! (u32 length, UTF-8, at most 4 KiB)`; status `group u64, seq u64, made (flag, fingerprint), latest (flag,
//! seq u64, fingerprint), in-call-for (flag, u64), elsewhere u8`; probe `group u64, waits (u32
//! count, at most MAX_WAITS; each rank u64, group u64, seq u64, op u8, peer u64, reached
//! u8)`; heartbeat: none (no header, no parts: [`HEARTBEAT`], 12 bytes, which
//! a link sends when it has had nothing to send for a while; [`decode`] takes it off the
//! stream and returns the next frame: it is never a message). A header must
//! be consumed exactly: trailing bytes are an error. The frame carries no source rank: the
//! transport stamps it from the link the frame came on.
//!
//! [`Fingerprint::to_bytes`]: crate::Fingerprint::to_bytes
//! [`AbortReason`]: crate::wire::message::AbortReason
//! [`Message`]: crate::wire::message::Message

mod decoding;
mod encoding;
mod reader;

pub use decoding::{decode, decode_head, Decoded, Head};
pub use encoding::{encode, encode_head};

use crate::error::ProtocolError;
use crate::op::CodeError;
use bytes::{Bytes, BytesMut};

/// The frame format's magic bytes.
pub const MAGIC: [u8; 2] = *b"CX";
/// The frame format's version; a frame of another version is refused.
pub const VERSION: u8 = 7;
/// Bytes of the fixed prefix.
pub const PREFIX_BYTES: usize = 12;
/// The largest header (every header is far smaller; abort reasons with long texts are cut).
pub const MAX_HEADER_BYTES: u32 = 64 << 10;
/// The longest text an abort reason carries (longer ones are cut at a char boundary).
const MAX_TEXT: usize = 4 << 10;
/// The most lines of a desync report a frame carries (a group's size, in practice).
const MAX_REPORT: usize = 1024;
/// The most waits a wait-cycle probe or a cycle carries: a probe that would grow longer is
/// not sent on (a cycle of more ranks than this is not named; its calls time out).
pub const MAX_WAITS: usize = 64;

/// What a decoder accepts: limits checked before anything is allocated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Most payload parts in one frame.
    pub max_parts: u32,
    /// Most payload bytes in one frame.
    pub max_payload_bytes: u64,
}

impl Default for Limits {
    /// 2^14 parts (a pipelined layout's segment limit) and 64 GiB (the default
    /// `GroupOptions::max_call_bytes`).
    fn default() -> Self {
        Limits {
            max_parts: 1 << 14,
            max_payload_bytes: 64 << 30,
        }
    }
}

/// Why bytes are not a frame.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The frame does not start with [`MAGIC`].
    #[error("not a collectix frame (magic {0:02x?})")]
    Magic([u8; 2]),
    /// Another version of the format.
    #[error("frame version {got}, this build speaks {VERSION}")]
    Version {
        /// The frame's version.
        got: u8,
    },
    /// An unknown message kind.
    #[error("unknown frame kind {0}")]
    Kind(u8),
    /// A field beyond a limit.
    #[error("{what} of {got} is above the limit of {limit}")]
    TooLarge {
        /// Which field.
        what: &'static str,
        /// Its value.
        got: u64,
        /// The limit.
        limit: u64,
    },
    /// The header ends before its fields do.
    #[error("header truncated: {what} needs {need} more bytes")]
    Truncated {
        /// The field being read.
        what: &'static str,
        /// Bytes missing.
        need: usize,
    },
    /// The header has bytes after its last field.
    #[error("{0} bytes after the header's last field")]
    Trailing(usize),
    /// A code byte that names nothing.
    #[error(transparent)]
    Code(#[from] CodeError),
    /// A text that is not UTF-8.
    #[error("text field is not UTF-8")]
    Utf8,
}

impl From<DecodeError> for ProtocolError {
    fn from(e: DecodeError) -> ProtocolError {
        ProtocolError::Malformed(e.to_string())
    }
}

/// An encoded message: the head and the payload parts, to be written back to back.
#[derive(Clone, Debug)]
pub struct Frame {
    /// Prefix, part lengths and header.
    pub head: Bytes,
    /// The payload parts (shared with the message, not copied).
    pub parts: Vec<Bytes>,
}

impl Frame {
    /// Total bytes on the wire.
    pub fn len(&self) -> usize {
        self.head.len() + self.parts.iter().map(Bytes::len).sum::<usize>()
    }

    /// Whether the frame is empty (never: a frame has at least its prefix).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The frame as one contiguous buffer (a copy; for tests and simple transports).
    pub fn to_contiguous(&self) -> BytesMut {
        let mut b = BytesMut::with_capacity(self.len());
        b.extend_from_slice(&self.head);
        for p in &self.parts {
            b.extend_from_slice(p);
        }
        b
    }
}

const DATA: u8 = 1;
const P2P: u8 = 2;
const CREDIT: u8 = 3;
const WANT_CREDIT: u8 = 4;
const P2P_GRANT: u8 = 5;
const P2P_CONSUMED: u8 = 6;
const ABORT: u8 = 7;
const INQUIRE: u8 = 8;
const STATUS: u8 = 9;
const HEARTBEAT_KIND: u8 = 10;
const LEFT: u8 = 11;
const FAILED: u8 = 12;
const P2P_ASK: u8 = 13;
const PROBE: u8 = 14;

/// The heartbeat frame: a link's "still here" when it has nothing else to send. [`decode`]
/// skips it.
pub const HEARTBEAT: [u8; PREFIX_BYTES] = [
    MAGIC[0],
    MAGIC[1],
    VERSION,
    HEARTBEAT_KIND,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
];
