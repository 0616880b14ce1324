//! The receiving side of a link: the connection's reader thread, which decodes frames and
//! reads each payload part straight into a pooled, 8-aligned buffer. See the module doc of
//! `tcp`.

use super::{Inbound, Liveness};
use bytes::{Buf, BytesMut};
use collectix_runtime::tensor::pool::Pool;
use collectix_runtime::wire::codec::{self, Limits};
use collectix_runtime::wire::Message;
use std::io::Read;
use std::net::TcpStream;
use std::time::Duration;

/// Bytes the reader asks the socket for, per read of heads.
const READ_CHUNK: usize = 256 << 10;
/// Parts up to this size are read into a pooled buffer taken whole; larger ones into a buffer
/// that grows by this much as the bytes arrive.
const BIG_PART: usize = 64 << 20;

/// The reader thread: hands each message to `inbound` with `peer` as its source, and
/// reports the peer lost (`lose`) when the connection closes, breaks, falls silent or
/// carries something that is not a frame.
pub(super) fn read_loop(
    mut s: TcpStream,
    peer: usize,
    limits: Limits,
    liveness: Liveness,
    pool: &Pool,
    inbound: &dyn Inbound,
    lose: &dyn Fn(&str),
) {
    // Heads (and what a read brought beyond them) gather in `buf`; each payload part goes
    // into an aligned buffer of its own from `pool`, read straight from the socket: one copy,
    // the kernel's, and no zeroing (`scratch` is zeroed once).
    let mut buf = BytesMut::with_capacity(READ_CHUNK);
    let mut scratch = vec![0u8; READ_CHUNK];
    let silence = liveness.silence.unwrap_or_default();
    loop {
        let head = loop {
            match codec::decode_head(&mut buf, &limits) {
                Ok(Some(h)) => break h,
                Ok(None) => {}
                Err(e) => return lose(&format!("not a collectix frame: {e}")),
            }
            match read_some(&mut s, &mut scratch, !buf.is_empty(), peer, silence) {
                Ok(n) => buf.extend_from_slice(&scratch[..n]),
                Err(why) => return lose(&why),
            }
        };
        let mut payload = Vec::with_capacity(head.parts.len());
        for &len in &head.parts {
            if len > BIG_PART {
                match read_big(&mut s, &mut buf, len, peer, silence) {
                    Ok(b) => payload.push(b),
                    Err(why) => return lose(&why),
                }
                continue;
            }
            let mut part = pool.take(len);
            let dst = part.bytes_mut();
            let have = buf.len().min(len);
            dst[..have].copy_from_slice(&buf[..have]);
            buf.advance(have);
            let mut at = have;
            while at < len {
                match read_some(&mut s, &mut dst[at..], true, peer, silence) {
                    Ok(n) => at += n,
                    Err(why) => return lose(&why),
                }
            }
            payload.push(part.freeze());
        }
        inbound.deliver(
            peer,
            Message {
                src: peer,
                header: head.header,
                payload,
            },
        );
    }
}

/// A part above [`BIG_PART`]: read into a buffer that grows as its bytes arrive (a length
/// announced by a peer is never allocated ahead of the data, beyond one step).
fn read_big(
    s: &mut TcpStream,
    buf: &mut BytesMut,
    len: usize,
    peer: usize,
    silence: Duration,
) -> Result<bytes::Bytes, String> {
    let mut words: Vec<u64> = Vec::new();
    let mut at = 0;
    while at < len {
        let upto = (at + BIG_PART).min(len);
        words.resize(upto.div_ceil(8), 0);
        let dst: &mut [u8] = bytemuck::cast_slice_mut(words.as_mut_slice());
        if at == 0 {
            let have = buf.len().min(upto);
            dst[..have].copy_from_slice(&buf[..have]);
            buf.advance(have);
            at = have;
        }
        while at < upto {
            at += read_some(s, &mut dst[at..upto], true, peer, silence)?;
        }
    }
    let mut b = collectix_runtime::tensor::bytes_from_vec(words);
    b.truncate(len);
    Ok(b)
}

/// One read into `dst` (not empty): how many bytes came, or why the connection is lost
/// (`mid`: in the middle of a frame).
fn read_some(
    s: &mut TcpStream,
    dst: &mut [u8],
    mid: bool,
    peer: usize,
    silence: Duration,
) -> Result<usize, String> {
    loop {
        return match s.read(dst) {
            Ok(0) if mid => Err("the peer closed the connection in the middle of a frame".into()),
            Ok(0) => Err(super::CLOSED_BY_PEER.into()),
            Ok(n) => Ok(n),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                Err(format!(
                    "nothing from rank {peer} for {silence:?}, not even a heartbeat: unreachable \
                     (a network partition, a host down, or a stopped process)"
                ))
            }
            Err(e) => Err(format!("read failed: {e}")),
        };
    }
}
