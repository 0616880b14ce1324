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
//!  2       1           version (2)
//!  3       1           kind: 1 data, 2 p2p, 3 credit, 4 want-credit, 5 p2p-grant,
//!                      6 p2p-consumed, 7 abort, 8 inquire, 9 status, 10 heartbeat
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
//! `group u64, seq u64`; status `group u64, seq u64, made (flag, fingerprint), latest (flag,
//! seq u64, fingerprint)`; heartbeat: none (no header, no parts: [`HEARTBEAT`], 12 bytes, which
//! a link sends when it has had nothing to send for a while; [`decode`] takes it off the
//! stream and returns the next frame: it is never a message). A header must
//! be consumed exactly: trailing bytes are an error. The frame carries no source rank: the
//! transport stamps it from the link the frame came on.

use crate::error::{CallDesc, ProtocolError, RankCall};
use crate::ids::{DataPath, Fingerprint, GroupId, FINGERPRINT_BYTES};
use crate::op::{CodeError, OpKind};
use crate::tensor::dtype::DType;
use crate::wire::message::{AbortReason, Header, Message};
use bytes::{Buf, BufMut, Bytes, BytesMut};

/// The frame format's magic bytes.
pub const MAGIC: [u8; 2] = *b"CX";
/// The frame format's version; a frame of another version is refused.
pub const VERSION: u8 = 2;
/// Bytes of the fixed prefix.
pub const PREFIX_BYTES: usize = 12;
/// The largest header (every header is far smaller; abort reasons with long texts are cut).
pub const MAX_HEADER_BYTES: u32 = 64 << 10;
/// The longest text an abort reason carries (longer ones are cut at a char boundary).
const MAX_TEXT: usize = 4 << 10;

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

/// Encodes `msg` (its `src` is not encoded: the receiving transport knows it).
pub fn encode(msg: &Message) -> Frame {
    let mut head = BytesMut::with_capacity(PREFIX_BYTES + 8 * msg.payload.len() + 64);
    encode_head(msg, &mut head);
    Frame {
        head: head.freeze(),
        parts: msg.payload.clone(),
    }
}

/// Appends the frame head of `msg` (prefix, part lengths, header) to `head`: what
/// [`encode`] gives as [`Frame::head`], into a buffer the caller reuses, so that a transport
/// writing `head` and then the message's payload parts allocates nothing per frame.
pub fn encode_head(msg: &Message, head: &mut BytesMut) {
    let start = head.len();
    head.put_slice(&MAGIC);
    head.put_u8(VERSION);
    head.put_u8(0); // the kind, once known
    head.put_u32_le(0); // the header's length, once known
    head.put_u32_le(u32::try_from(msg.payload.len()).unwrap_or(u32::MAX));
    for p in &msg.payload {
        head.put_u64_le(p.len() as u64);
    }
    let header_start = head.len();
    let kind = put_header(head, &msg.header);
    // Headers are small by construction (texts are cut), so this never truncates.
    let len = u32::try_from(head.len() - header_start).unwrap_or(u32::MAX);
    head[start + 3] = kind;
    head[start + 4..start + 8].copy_from_slice(&len.to_le_bytes());
}

/// Writes the header's fields; returns its kind.
fn put_header(h: &mut BytesMut, header: &Header) -> u8 {
    match header {
        Header::Data {
            group,
            seq,
            tag,
            call,
        } => {
            h.put_u64_le(group.0);
            h.put_u64_le(*seq);
            h.put_u32_le(*tag);
            h.put_slice(&call.to_bytes());
            DATA
        }
        Header::P2p {
            group,
            tag,
            seq,
            dtype,
            count,
            eager,
            path,
        } => {
            h.put_u64_le(group.0);
            h.put_u32_le(*tag);
            h.put_u64_le(*seq);
            h.put_u8(dtype.code());
            h.put_u64_le(*count);
            h.put_u8(u8::from(*eager));
            h.put_u8(path.code());
            P2P
        }
        Header::Credit { group, calls } => {
            h.put_u64_le(group.0);
            h.put_u64_le(*calls);
            CREDIT
        }
        Header::WantCredit { group, seq } => {
            h.put_u64_le(group.0);
            h.put_u64_le(*seq);
            WANT_CREDIT
        }
        Header::P2pGrant { group, tag, upto } => {
            h.put_u64_le(group.0);
            h.put_u32_le(*tag);
            h.put_u64_le(*upto);
            P2P_GRANT
        }
        Header::P2pConsumed { group, eager } => {
            h.put_u64_le(group.0);
            h.put_u64_le(*eager);
            P2P_CONSUMED
        }
        Header::Abort { group, reason } => {
            h.put_u64_le(group.0);
            put_reason(h, reason);
            ABORT
        }
        Header::Inquire { group, seq } => {
            h.put_u64_le(group.0);
            h.put_u64_le(*seq);
            INQUIRE
        }
        Header::Status {
            group,
            seq,
            made,
            latest,
        } => {
            h.put_u64_le(group.0);
            h.put_u64_le(*seq);
            put_opt_fp(h, made.as_deref());
            put_latest(h, latest.as_deref());
            STATUS
        }
    }
}

fn put_opt_u64(h: &mut BytesMut, v: Option<u64>) {
    match v {
        Some(v) => {
            h.put_u8(1);
            h.put_u64_le(v);
        }
        None => h.put_u8(0),
    }
}

fn put_opt_fp(h: &mut BytesMut, fp: Option<&Fingerprint>) {
    match fp {
        Some(fp) => {
            h.put_u8(1);
            h.put_slice(&fp.to_bytes());
        }
        None => h.put_u8(0),
    }
}

fn put_latest(h: &mut BytesMut, latest: Option<&(u64, Fingerprint)>) {
    match latest {
        Some((seq, fp)) => {
            h.put_u8(1);
            h.put_u64_le(*seq);
            h.put_slice(&fp.to_bytes());
        }
        None => h.put_u8(0),
    }
}

/// The most lines of a desync report a frame carries (a group's size, in practice).
const MAX_REPORT: usize = 1024;

fn put_report(h: &mut BytesMut, report: &[RankCall]) {
    let n = report.len().min(MAX_REPORT);
    h.put_u32_le(n as u32);
    for r in &report[..n] {
        match r {
            RankCall::Made { rank, call } => {
                h.put_u8(1);
                h.put_u64_le(*rank as u64);
                h.put_slice(&call.to_bytes());
            }
            RankCall::NotReached { rank, latest } => {
                h.put_u8(2);
                h.put_u64_le(*rank as u64);
                put_latest(h, latest.as_ref());
            }
            RankCall::NoAnswer { rank } => {
                h.put_u8(3);
                h.put_u64_le(*rank as u64);
            }
        }
    }
}

fn put_text(h: &mut BytesMut, s: &str) {
    let mut end = s.len().min(MAX_TEXT);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    h.put_u32_le(end as u32);
    h.put_slice(&s.as_bytes()[..end]);
}

fn put_call(h: &mut BytesMut, c: &CallDesc) {
    h.put_u64_le(c.rank as u64);
    h.put_slice(&c.call.to_bytes());
}

fn put_reason(h: &mut BytesMut, r: &AbortReason) {
    match r {
        AbortReason::Mismatch {
            seq,
            ours,
            theirs,
            report,
        } => {
            h.put_u8(1);
            put_opt_u64(h, *seq);
            put_call(h, ours);
            put_call(h, theirs);
            put_report(h, report);
        }
        AbortReason::Timeout {
            seq,
            op,
            rank,
            waiting_for,
            report,
        } => {
            h.put_u8(2);
            put_opt_u64(h, *seq);
            h.put_u8(op.code());
            h.put_u64_le(*rank);
            // At most a group's size of ranks; cut so the header stays below its limit.
            let n = waiting_for.len().min(MAX_REPORT);
            h.put_u32_le(n as u32);
            for w in &waiting_for[..n] {
                h.put_u64_le(*w);
            }
            put_report(h, report);
        }
        AbortReason::PeerLost { rank } => {
            h.put_u8(3);
            h.put_u64_le(*rank);
        }
        AbortReason::PeerShutdown { rank, undelivered } => {
            h.put_u8(4);
            h.put_u64_le(*rank);
            h.put_u64_le(*undelivered);
        }
        AbortReason::Protocol { rank, detail } => {
            h.put_u8(5);
            h.put_u64_le(*rank);
            put_protocol(h, detail);
        }
        AbortReason::Other { text } => {
            h.put_u8(6);
            put_text(h, text);
        }
        AbortReason::Internal { text } => {
            h.put_u8(7);
            put_text(h, text);
        }
        AbortReason::SizeMismatch {
            seq,
            call,
            sender,
            receiver,
            expected,
            got,
        } => {
            h.put_u8(8);
            h.put_u64_le(*seq);
            h.put_slice(&call.to_bytes());
            for v in [*sender, *receiver, *expected, *got] {
                h.put_u64_le(v);
            }
        }
    }
}

fn put_protocol(h: &mut BytesMut, d: &ProtocolError) {
    match d {
        ProtocolError::UnexpectedTag { seq, tag } => {
            h.put_u8(1);
            h.put_u64_le(*seq);
            h.put_u32_le(*tag);
        }
        ProtocolError::Duplicate { seq, tag } => {
            h.put_u8(2);
            h.put_u64_le(*seq);
            h.put_u32_le(*tag);
        }
        ProtocolError::Length {
            part,
            expected,
            got,
        } => {
            h.put_u8(3);
            h.put_u64_le(*part as u64);
            h.put_u64_le(*expected);
            h.put_u64_le(*got);
        }
        ProtocolError::Parts { expected, got } => {
            h.put_u8(4);
            h.put_u64_le(*expected as u64);
            h.put_u64_le(*got as u64);
        }
        ProtocolError::InvalidElements { dtype } => {
            h.put_u8(5);
            h.put_u8(dtype.code());
        }
        ProtocolError::Stale { seq } => {
            h.put_u8(6);
            h.put_u64_le(*seq);
        }
        ProtocolError::Window { seq } => {
            h.put_u8(7);
            h.put_u64_le(*seq);
        }
        ProtocolError::Malformed(text) => {
            h.put_u8(8);
            put_text(h, text);
        }
        ProtocolError::Budget { seq, bytes, budget } => {
            h.put_u8(9);
            for v in [*seq, *bytes, *budget] {
                h.put_u64_le(v);
            }
        }
    }
}

/// A frame's prefix, once enough bytes have arrived to read it and the part lengths.
struct Prefix {
    kind: u8,
    header: usize,
    parts: Vec<usize>,
    total: usize,
}

fn read_prefix(buf: &[u8], limits: &Limits) -> Result<Option<Prefix>, DecodeError> {
    if buf.len() < PREFIX_BYTES {
        // Check what has arrived already, so garbage fails at once.
        if buf.len() >= 2 && buf[..2] != MAGIC {
            return Err(DecodeError::Magic([buf[0], buf[1]]));
        }
        return Ok(None);
    }
    if buf[..2] != MAGIC {
        return Err(DecodeError::Magic([buf[0], buf[1]]));
    }
    if buf[2] != VERSION {
        return Err(DecodeError::Version { got: buf[2] });
    }
    let kind = buf[3];
    if !(DATA..=HEARTBEAT_KIND).contains(&kind) {
        return Err(DecodeError::Kind(kind));
    }
    let u32_at = |i: usize| u32::from_le_bytes([buf[i], buf[i + 1], buf[i + 2], buf[i + 3]]);
    let header = u32_at(4);
    if header > MAX_HEADER_BYTES {
        return Err(DecodeError::TooLarge {
            what: "header length",
            got: u64::from(header),
            limit: u64::from(MAX_HEADER_BYTES),
        });
    }
    let nparts = u32_at(8);
    if nparts > limits.max_parts {
        return Err(DecodeError::TooLarge {
            what: "payload part count",
            got: u64::from(nparts),
            limit: u64::from(limits.max_parts),
        });
    }
    let lens_end = PREFIX_BYTES + 8 * nparts as usize;
    if buf.len() < lens_end {
        return Ok(None);
    }
    let mut parts = Vec::with_capacity(nparts as usize);
    let mut sum: u64 = 0;
    for i in 0..nparts as usize {
        let o = PREFIX_BYTES + 8 * i;
        let mut w = [0u8; 8];
        w.copy_from_slice(&buf[o..o + 8]);
        let len = u64::from_le_bytes(w);
        sum = sum.saturating_add(len);
        if sum > limits.max_payload_bytes {
            return Err(DecodeError::TooLarge {
                what: "payload length",
                got: sum,
                limit: limits.max_payload_bytes,
            });
        }
        // Below `max_payload_bytes`, which a caller sets to what this machine can address.
        parts.push(usize::try_from(len).map_err(|_| DecodeError::TooLarge {
            what: "payload part length",
            got: len,
            limit: usize::MAX as u64,
        })?);
    }
    let total = usize::try_from(sum)
        .ok()
        .and_then(|s| s.checked_add(lens_end + header as usize))
        .ok_or(DecodeError::TooLarge {
            what: "frame length",
            got: sum,
            limit: usize::MAX as u64,
        })?;
    Ok(Some(Prefix {
        kind,
        header: header as usize,
        parts,
        total,
    }))
}

/// A decoded frame: the header and the payload parts; the transport adds the source.
#[derive(Clone, Debug, PartialEq)]
pub struct Decoded {
    /// The header.
    pub header: Header,
    /// The payload parts.
    pub payload: Vec<Bytes>,
}

impl Decoded {
    /// The message, from global rank `src` (the link the frame came on).
    pub fn into_message(self, src: usize) -> Message {
        Message {
            src,
            header: self.header,
            payload: self.payload,
        }
    }
}

/// Decodes one frame from the front of `buf`, skipping the heartbeats before it: `Ok(None)`
/// while more bytes are needed (then `buf` has lost only those heartbeats); on success the frame's bytes are taken off `buf`, payload parts
/// without a copy. An error means the stream is not a valid collectix stream; drop the link.
pub fn decode(buf: &mut BytesMut, limits: &Limits) -> Result<Option<Decoded>, DecodeError> {
    let Some(p) = next_prefix(buf, limits)? else {
        return Ok(None);
    };
    if buf.len() < p.total {
        return Ok(None);
    }
    let mut frame = buf.split_to(p.total);
    frame.advance(PREFIX_BYTES + 8 * p.parts.len());
    let head = frame.split_to(p.header).freeze();
    let header = read_header(p.kind, head)?;
    let mut payload = Vec::with_capacity(p.parts.len());
    for len in p.parts {
        payload.push(frame.split_to(len).freeze());
    }
    Ok(Some(Decoded { header, payload }))
}

/// The prefix of the next frame that is not a heartbeat (the heartbeats before it are taken
/// off `buf`); `None` while more bytes are needed.
fn next_prefix(buf: &mut BytesMut, limits: &Limits) -> Result<Option<Prefix>, DecodeError> {
    loop {
        let Some(p) = read_prefix(buf, limits)? else {
            return Ok(None);
        };
        if p.kind != HEARTBEAT_KIND {
            return Ok(Some(p));
        }
        if !p.parts.is_empty() {
            return Err(DecodeError::TooLarge {
                what: "a heartbeat's payload part count",
                got: p.parts.len() as u64,
                limit: 0,
            });
        }
        if p.header != 0 {
            return Err(DecodeError::Trailing(p.header));
        }
        buf.advance(PREFIX_BYTES);
    }
}

/// A frame's head, decoded before its payload: what a transport that reads each payload part
/// into a buffer of its own (aligned, pooled, straight from the socket) needs.
#[derive(Clone, Debug, PartialEq)]
pub struct Head {
    /// The header.
    pub header: Header,
    /// Each payload part's length, in order (checked against the limits).
    pub parts: Vec<usize>,
}

/// Decodes the head of the frame at the front of `buf` (skipping heartbeats before it): the
/// header and its parts' lengths. `Ok(None)` while more bytes are needed (then `buf` has lost
/// only those heartbeats); on success the head's bytes are taken off `buf`, and the payload's
/// bytes — the parts, back to back — come next in the stream. Limits are checked as
/// [`decode`] checks them.
pub fn decode_head(buf: &mut BytesMut, limits: &Limits) -> Result<Option<Head>, DecodeError> {
    let Some(p) = next_prefix(buf, limits)? else {
        return Ok(None);
    };
    let head_len = PREFIX_BYTES + 8 * p.parts.len() + p.header;
    if buf.len() < head_len {
        return Ok(None);
    }
    let mut head = buf.split_to(head_len);
    head.advance(PREFIX_BYTES + 8 * p.parts.len());
    let header = read_header(p.kind, head.freeze())?;
    Ok(Some(Head {
        header,
        parts: p.parts,
    }))
}

/// Reads fixed-size fields off a header, failing (never panicking) when it runs out.
struct Reader {
    b: Bytes,
}

impl Reader {
    fn need(&self, n: usize, what: &'static str) -> Result<(), DecodeError> {
        if self.b.remaining() < n {
            return Err(DecodeError::Truncated {
                what,
                need: n - self.b.remaining(),
            });
        }
        Ok(())
    }
    fn u8(&mut self, what: &'static str) -> Result<u8, DecodeError> {
        self.need(1, what)?;
        Ok(self.b.get_u8())
    }
    fn u32(&mut self, what: &'static str) -> Result<u32, DecodeError> {
        self.need(4, what)?;
        Ok(self.b.get_u32_le())
    }
    fn u64(&mut self, what: &'static str) -> Result<u64, DecodeError> {
        self.need(8, what)?;
        Ok(self.b.get_u64_le())
    }
    fn usize(&mut self, what: &'static str) -> Result<usize, DecodeError> {
        let v = self.u64(what)?;
        usize::try_from(v).map_err(|_| DecodeError::TooLarge {
            what,
            got: v,
            limit: usize::MAX as u64,
        })
    }
    fn bool(&mut self, what: &'static str) -> Result<bool, DecodeError> {
        match self.u8(what)? {
            0 => Ok(false),
            1 => Ok(true),
            code => Err(CodeError { what, code }.into()),
        }
    }
    fn group(&mut self) -> Result<GroupId, DecodeError> {
        Ok(GroupId(self.u64("group")?))
    }
    fn fingerprint(&mut self) -> Result<Fingerprint, DecodeError> {
        self.need(FINGERPRINT_BYTES, "fingerprint")?;
        let mut f = [0u8; FINGERPRINT_BYTES];
        self.b.copy_to_slice(&mut f);
        Ok(Fingerprint::from_bytes(&f)?)
    }
    fn opt_u64(&mut self, what: &'static str) -> Result<Option<u64>, DecodeError> {
        Ok(if self.bool(what)? {
            Some(self.u64(what)?)
        } else {
            None
        })
    }
    fn text(&mut self) -> Result<String, DecodeError> {
        let n = self.u32("text length")? as usize;
        self.need(n, "text")?;
        let raw = self.b.split_to(n);
        String::from_utf8(raw.to_vec()).map_err(|_| DecodeError::Utf8)
    }
    fn call(&mut self) -> Result<CallDesc, DecodeError> {
        let rank = self.usize("rank")?;
        Ok(CallDesc {
            rank,
            call: self.fingerprint()?,
        })
    }
    fn opt_fp(&mut self) -> Result<Option<Fingerprint>, DecodeError> {
        Ok(if self.bool("fingerprint present")? {
            Some(self.fingerprint()?)
        } else {
            None
        })
    }
    fn latest(&mut self) -> Result<Option<(u64, Fingerprint)>, DecodeError> {
        Ok(if self.bool("latest call present")? {
            Some((self.u64("latest seq")?, self.fingerprint()?))
        } else {
            None
        })
    }
    fn report(&mut self) -> Result<Vec<RankCall>, DecodeError> {
        let n = self.u32("report lines")? as usize;
        if n > MAX_REPORT {
            return Err(DecodeError::TooLarge {
                what: "report lines",
                got: n as u64,
                limit: MAX_REPORT as u64,
            });
        }
        // Each line is at least 9 bytes: checked against the bytes present first.
        self.need(n.saturating_mul(9), "report")?;
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let code = self.u8("report line")?;
            let rank = self.usize("rank")?;
            out.push(match code {
                1 => RankCall::Made {
                    rank,
                    call: self.fingerprint()?,
                },
                2 => RankCall::NotReached {
                    rank,
                    latest: self.latest()?,
                },
                3 => RankCall::NoAnswer { rank },
                code => {
                    return Err(CodeError {
                        what: "report line",
                        code,
                    }
                    .into())
                }
            });
        }
        Ok(out)
    }
    fn done(self) -> Result<(), DecodeError> {
        match self.b.remaining() {
            0 => Ok(()),
            n => Err(DecodeError::Trailing(n)),
        }
    }
}

fn read_header(kind: u8, b: Bytes) -> Result<Header, DecodeError> {
    let mut r = Reader { b };
    let h = match kind {
        DATA => Header::Data {
            group: r.group()?,
            seq: r.u64("seq")?,
            tag: r.u32("tag")?,
            call: r.fingerprint()?,
        },
        P2P => Header::P2p {
            group: r.group()?,
            tag: r.u32("tag")?,
            seq: r.u64("seq")?,
            dtype: DType::try_from(r.u8("dtype")?)?,
            count: r.u64("count")?,
            eager: r.bool("eager")?,
            path: DataPath::try_from(r.u8("path")?)?,
        },
        CREDIT => Header::Credit {
            group: r.group()?,
            calls: r.u64("calls")?,
        },
        WANT_CREDIT => Header::WantCredit {
            group: r.group()?,
            seq: r.u64("seq")?,
        },
        P2P_GRANT => Header::P2pGrant {
            group: r.group()?,
            tag: r.u32("tag")?,
            upto: r.u64("upto")?,
        },
        P2P_CONSUMED => Header::P2pConsumed {
            group: r.group()?,
            eager: r.u64("eager")?,
        },
        ABORT => Header::Abort {
            group: r.group()?,
            reason: Box::new(read_reason(&mut r)?),
        },
        INQUIRE => Header::Inquire {
            group: r.group()?,
            seq: r.u64("seq")?,
        },
        STATUS => Header::Status {
            group: r.group()?,
            seq: r.u64("seq")?,
            made: r.opt_fp()?.map(Box::new),
            latest: r.latest()?.map(Box::new),
        },
        k => return Err(DecodeError::Kind(k)),
    };
    r.done()?;
    Ok(h)
}

fn read_reason(r: &mut Reader) -> Result<AbortReason, DecodeError> {
    Ok(match r.u8("abort reason")? {
        1 => AbortReason::Mismatch {
            seq: r.opt_u64("seq")?,
            ours: r.call()?,
            theirs: r.call()?,
            report: r.report()?,
        },
        2 => {
            let seq = r.opt_u64("seq")?;
            let op = OpKind::try_from(r.u8("op kind")?)?;
            let rank = r.u64("rank")?;
            let n = r.u32("waiting count")? as usize;
            // Checked against the bytes present before anything is allocated.
            r.need(n.saturating_mul(8), "waiting ranks")?;
            let mut waiting_for = Vec::with_capacity(n);
            for _ in 0..n {
                waiting_for.push(r.u64("waiting rank")?);
            }
            AbortReason::Timeout {
                seq,
                op,
                rank,
                waiting_for,
                report: r.report()?,
            }
        }
        3 => AbortReason::PeerLost {
            rank: r.u64("rank")?,
        },
        4 => AbortReason::PeerShutdown {
            rank: r.u64("rank")?,
            undelivered: r.u64("undelivered")?,
        },
        5 => AbortReason::Protocol {
            rank: r.u64("rank")?,
            detail: read_protocol(r)?,
        },
        6 => AbortReason::Other { text: r.text()? },
        7 => AbortReason::Internal { text: r.text()? },
        8 => AbortReason::SizeMismatch {
            seq: r.u64("seq")?,
            call: r.fingerprint()?,
            sender: r.u64("sender")?,
            receiver: r.u64("receiver")?,
            expected: r.u64("expected")?,
            got: r.u64("got")?,
        },
        code => {
            return Err(CodeError {
                what: "abort reason",
                code,
            }
            .into())
        }
    })
}

fn read_protocol(r: &mut Reader) -> Result<ProtocolError, DecodeError> {
    Ok(match r.u8("protocol error")? {
        1 => ProtocolError::UnexpectedTag {
            seq: r.u64("seq")?,
            tag: r.u32("tag")?,
        },
        2 => ProtocolError::Duplicate {
            seq: r.u64("seq")?,
            tag: r.u32("tag")?,
        },
        3 => ProtocolError::Length {
            part: r.usize("part")?,
            expected: r.u64("expected")?,
            got: r.u64("got")?,
        },
        4 => ProtocolError::Parts {
            expected: r.usize("expected")?,
            got: r.usize("got")?,
        },
        5 => ProtocolError::InvalidElements {
            dtype: DType::try_from(r.u8("dtype")?)?,
        },
        6 => ProtocolError::Stale { seq: r.u64("seq")? },
        7 => ProtocolError::Window { seq: r.u64("seq")? },
        8 => ProtocolError::Malformed(r.text()?),
        9 => ProtocolError::Budget {
            seq: r.u64("seq")?,
            bytes: r.u64("bytes")?,
            budget: r.u64("budget")?,
        },
        code => {
            return Err(CodeError {
                what: "protocol error",
                code,
            }
            .into())
        }
    })
}
