//! Decoding: whole frames, or only their heads, off the front of a stream's bytes, the
//! heartbeats before them skipped and every length checked against the limits first.

use super::reader::read_header;
use super::{
    DecodeError, Limits, DATA, HEARTBEAT_KIND, MAGIC, MAX_HEADER_BYTES, PREFIX_BYTES, PROBE,
    VERSION,
};
use crate::wire::message::{Header, Message};
use bytes::{Buf, Bytes, BytesMut};

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
    if !(DATA..=PROBE).contains(&kind) {
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
/// while more bytes are needed (then `buf` has lost only those heartbeats); on success the
/// frame's bytes are taken off `buf`, payload parts without a copy. An error means the stream
/// is not a valid collectix stream; drop the link.
pub fn decode(buf: &mut BytesMut, limits: &Limits) -> Result<Option<Decoded>, DecodeError> {
    let Some(p) = next_prefix(buf, limits)? else {
        return Ok(None);
    };
    if buf.len() < p.total {
        // A header that arrived whole is checked now, not once its payload (up to the
        // limits: gigabytes) is there, as `decode_head` checks it.
        let head = PREFIX_BYTES + 8 * p.parts.len();
        if let Some(h) = buf.get(head..head + p.header) {
            read_header(p.kind, Bytes::copy_from_slice(h))?;
        }
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
