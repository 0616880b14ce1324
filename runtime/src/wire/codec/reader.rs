//! A header's fields, read per kind: a typed error, never a panic, when the bytes run out or
//! a code names nothing.

use super::{
    DecodeError, ABORT, CREDIT, DATA, FAILED, INQUIRE, LEFT, MAX_REPORT, P2P, P2P_ASK,
    P2P_CONSUMED, P2P_GRANT, PROBE, STATUS, WANT_CREDIT,
};
use crate::error::{CallDesc, ProtocolError, RankCall, Wait};
use crate::ids::{DataPath, Fingerprint, GroupId, FINGERPRINT_BYTES};
use crate::op::{CodeError, OpKind};
use crate::tensor::dtype::DType;
use crate::wire::message::{AbortReason, Header};
use bytes::{Buf, Bytes};

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
                4 => RankCall::Late {
                    rank,
                    call: self.fingerprint()?,
                    after: std::time::Duration::from_nanos(self.u64("lateness")?),
                },
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
    fn waits(&mut self) -> Result<Vec<Wait>, DecodeError> {
        let n = self.u32("waits")? as usize;
        if n > super::MAX_WAITS {
            return Err(DecodeError::TooLarge {
                what: "waits",
                got: n as u64,
                limit: super::MAX_WAITS as u64,
            });
        }
        // Each wait is 34 bytes: checked against the bytes present first.
        self.need(n.saturating_mul(34), "waits")?;
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            out.push(Wait {
                rank: self.usize("waiting rank")?,
                group: self.group()?,
                seq: self.u64("seq")?,
                op: OpKind::try_from(self.u8("op kind")?)?,
                peer: self.usize("awaited rank")?,
                reached: self.bool("reached")?,
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

pub(super) fn read_header(kind: u8, b: Bytes) -> Result<Header, DecodeError> {
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
        P2P_ASK => Header::P2pAsk {
            group: r.group()?,
            tag: r.u32("tag")?,
            seq: r.u64("seq")?,
        },
        P2P_CONSUMED => Header::P2pConsumed {
            group: r.group()?,
            eager: r.u64("eager")?,
        },
        ABORT => Header::Abort {
            group: r.group()?,
            reason: Box::new(read_reason(&mut r)?),
        },
        LEFT => Header::Left {
            group: r.group()?,
            calls: r.u64("calls")?,
        },
        FAILED => Header::Failed {
            group: r.group()?,
            seq: r.u64("seq")?,
            reason: r.text()?,
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
            in_call_for: r.opt_u64("time in the call")?,
            elsewhere: r.bool("calls elsewhere")?,
        },
        PROBE => Header::Probe {
            group: r.group()?,
            path: Box::new(r.waits()?),
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
        9 => AbortReason::Revoked { by: r.u64("by")? },
        10 => AbortReason::WaitCycle { cycle: r.waits()? },
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
