//! Encoding: a [`Message`] into a [`Frame`], or only its head into a buffer the caller reuses.

use super::{
    Frame, ABORT, CREDIT, DATA, FAILED, INQUIRE, LEFT, MAGIC, MAX_REPORT, MAX_TEXT, P2P, P2P_ASK,
    P2P_CONSUMED, P2P_GRANT, PREFIX_BYTES, PROBE, STATUS, VERSION, WANT_CREDIT,
};
use crate::error::{CallDesc, ProtocolError, RankCall, Wait};
use crate::ids::Fingerprint;
use crate::wire::message::{AbortReason, Header, Message};
use bytes::{BufMut, BytesMut};

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
        Header::P2pAsk { group, tag, seq } => {
            h.put_u64_le(group.0);
            h.put_u32_le(*tag);
            h.put_u64_le(*seq);
            P2P_ASK
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
        Header::Left { group, calls } => {
            h.put_u64_le(group.0);
            h.put_u64_le(*calls);
            LEFT
        }
        Header::Failed { group, seq, reason } => {
            h.put_u64_le(group.0);
            h.put_u64_le(*seq);
            put_text(h, reason);
            FAILED
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
            in_call_for,
            elsewhere,
        } => {
            h.put_u64_le(group.0);
            h.put_u64_le(*seq);
            put_opt_fp(h, made.as_deref());
            put_latest(h, latest.as_deref());
            put_opt_u64(h, *in_call_for);
            h.put_u8(u8::from(*elsewhere));
            STATUS
        }
        Header::Probe { group, path } => {
            h.put_u64_le(group.0);
            put_waits(h, path);
            PROBE
        }
    }
}

/// A probe's or a cycle's waits (at most [`super::MAX_WAITS`]: the engine sends no longer
/// ones; a longer list is cut, as a report is).
fn put_waits(h: &mut BytesMut, waits: &[Wait]) {
    let n = waits.len().min(super::MAX_WAITS);
    h.put_u32_le(n as u32);
    for w in &waits[..n] {
        h.put_u64_le(w.rank as u64);
        h.put_u64_le(w.group.0);
        h.put_u64_le(w.seq);
        h.put_u8(w.op.code());
        h.put_u64_le(w.peer as u64);
        h.put_u8(u8::from(w.reached));
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
            RankCall::Late { rank, call, after } => {
                h.put_u8(4);
                h.put_u64_le(*rank as u64);
                h.put_slice(&call.to_bytes());
                h.put_u64_le(u64::try_from(after.as_nanos()).unwrap_or(u64::MAX));
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
        AbortReason::Revoked { by } => {
            h.put_u8(9);
            h.put_u64_le(*by);
        }
        AbortReason::WaitCycle { cycle } => {
            h.put_u8(10);
            put_waits(h, cycle);
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
