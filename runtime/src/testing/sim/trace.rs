//! What happened in a run, event by event, and its text: one line per event, for a failing
//! seed's report.

use super::Sim;
use crate::engine::OpId;
use crate::error::Error;
use crate::time::Time;
use crate::wire::message::Header;
use std::fmt;

/// What happened, for traces.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum TraceEvent {
    /// A message was delivered.
    Delivered {
        /// Sender (global).
        src: usize,
        /// Receiver (global).
        dst: usize,
        /// When it was sent.
        sent: Time,
        /// Its header.
        header: Header,
        /// Payload bytes.
        bytes: usize,
    },
    /// A message was dropped because its sender or receiver is cut off or dead.
    Dropped {
        /// Sender (global).
        src: usize,
        /// Receiver (global).
        dst: usize,
        /// Its header.
        header: Header,
    },
    /// [`Sim::isolate`] (`detected`) or [`Sim::partition`] (not `detected`).
    Cut {
        /// The rank cut off.
        rank: usize,
        /// Whether the others will be told.
        detected: bool,
    },
    /// [`Sim::kill`].
    Killed {
        /// The rank.
        rank: usize,
    },
    /// `observer`'s engine was told that `lost` is gone.
    Detected {
        /// The rank told.
        observer: usize,
        /// The rank lost.
        lost: usize,
    },
    /// A call completed or failed.
    Done {
        /// The rank (global).
        rank: usize,
        /// The call.
        op: OpId,
        /// Its error, if it failed.
        error: Option<Error>,
    },
}

/// One event of a run, at a virtual time.
#[derive(Clone, Debug)]
pub struct TraceEntry {
    /// Virtual time.
    pub at: Time,
    /// What happened.
    pub event: TraceEvent,
}

/// A header in a few words: kind, group, sequence number, tag (and call, for data).
fn header_text(h: &Header, src: usize, with_call: bool) -> String {
    match h {
        Header::Data {
            group,
            seq,
            tag,
            call,
        } if with_call => format!("data g={group} #{seq} tag={tag} {call}"),
        Header::Data {
            group, seq, tag, ..
        } => format!("data g={group} #{seq} tag={tag}"),
        Header::P2p {
            group,
            tag,
            seq,
            dtype,
            count,
            eager,
            ..
        } => {
            let how = if *eager { "eager" } else { "solicited" };
            format!("p2p g={group} tag={tag} #{seq} {dtype}x{count} {how}")
        }
        Header::Abort { group, reason } if with_call => {
            format!(
                "abort g={group}: {}",
                (**reason).clone().into_error(*group, src)
            )
        }
        Header::Abort { group, .. } => format!("abort g={group}"),
        Header::Failed { group, seq, reason } if with_call => {
            format!("failed g={group} #{seq}: {reason}")
        }
        Header::Failed { group, seq, .. } => format!("failed g={group} #{seq}"),
        Header::Credit { group, calls } => format!("credit g={group} calls={calls}"),
        Header::WantCredit { group, seq } => format!("want-credit g={group} #{seq}"),
        Header::P2pGrant { group, tag, upto } => format!("p2p-grant g={group} tag={tag} <{upto}"),
        Header::P2pConsumed { group, eager } => format!("p2p-consumed g={group} eager={eager}"),
        Header::P2pAsk { group, tag, seq } => format!("p2p-ask g={group} tag={tag} #{seq}"),
        Header::Inquire { group, seq } => format!("inquire g={group} #{seq}"),
        Header::Left { group, calls } => format!("left g={group} after {calls} calls"),
        Header::Probe { group, path } => {
            let hops: Vec<String> = path
                .iter()
                .map(|w| format!("{}>{}@{}#{}", w.rank, w.peer, w.group, w.seq))
                .collect();
            format!("probe g={group} {}", hops.join(","))
        }
        Header::Status {
            group, seq, made, ..
        } => match made {
            Some(fp) if with_call => format!("status g={group} #{seq} made {fp}"),
            Some(_) => format!("status g={group} #{seq} made"),
            None => format!("status g={group} #{seq} not reached"),
        },
    }
}

impl fmt::Display for TraceEntry {
    /// One compact line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = self.at.as_nanos();
        match &self.event {
            TraceEvent::Delivered {
                src,
                dst,
                sent,
                header,
                bytes,
            } => write!(
                f,
                "t={t}ns {src}->{dst} +{}ns {} {bytes}B",
                self.at.saturating_since(*sent).as_nanos(),
                header_text(header, *src, true)
            ),
            TraceEvent::Dropped { src, dst, header } => {
                write!(
                    f,
                    "t={t}ns {src}->{dst} dropped {}",
                    header_text(header, *src, false)
                )
            }
            TraceEvent::Cut {
                rank,
                detected: true,
            } => write!(f, "t={t}ns isolate {rank}"),
            TraceEvent::Cut { rank, .. } => write!(f, "t={t}ns partition {rank} (silent)"),
            TraceEvent::Killed { rank } => write!(f, "t={t}ns kill {rank}"),
            TraceEvent::Detected { observer, lost } => {
                write!(f, "t={t}ns {observer} detects loss of {lost}")
            }
            TraceEvent::Done {
                rank,
                op,
                error: None,
            } => write!(f, "t={t}ns {rank} op{} ok", op.0),
            TraceEvent::Done {
                rank,
                op,
                error: Some(e),
            } => write!(f, "t={t}ns {rank} op{} err: {e}", op.0),
        }
    }
}

impl Sim {
    /// Everything that happened so far, in order.
    pub fn trace(&self) -> &[TraceEntry] {
        &self.trace
    }

    /// The trace, one compact line per event, after a line with the seed and the network
    /// model (for a failing seed's report; the same seed and calls give the same text).
    pub fn trace_text(&self) -> String {
        let o = &self.opts;
        let mut s = format!(
            "seed {}: {} ranks, {:?} delivery, latency {}ns + <={}ns, {}/1000 delayed <={}ns, detection after {}ns + <={}ns\n",
            self.seed,
            self.size(),
            o.delivery,
            o.latency.as_nanos(),
            o.jitter.as_nanos(),
            o.delayed_per_mille,
            o.max_delay.as_nanos(),
            o.detect_after.as_nanos(),
            o.detect_jitter.as_nanos(),
        );
        for t in &self.trace {
            s.push_str(&t.to_string());
            s.push('\n');
        }
        s
    }

    pub(super) fn log(&mut self, event: TraceEvent) {
        self.trace.push(TraceEntry {
            at: self.now,
            event,
        });
    }
}
