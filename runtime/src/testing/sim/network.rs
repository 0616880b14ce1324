//! The simulated network: an engine's output through its links (which may say "would
//! block") and the codec into flight, with a latency, a jitter and sometimes a long delay.

use super::options::{Delivery, Rng};
use super::trace::TraceEvent;
use super::{Flight, Sim};
use crate::time::Time;
use crate::wire::codec::{decode, encode, Limits};
use crate::wire::link::{Link, LinkError};
use crate::wire::message::{Header, Transmit};
use std::time::Duration;

/// Sort key of an engine's outgoing messages: destination and header, never emission order.
fn transmit_key(t: &Transmit) -> (usize, u64, u8, u64, u32) {
    let (group, kind, seq, tag) = match &t.msg.header {
        Header::Data {
            group, seq, tag, ..
        } => (group.0, 0, *seq, *tag),
        Header::P2p {
            group, tag, seq, ..
        } => (group.0, 1, *seq, *tag),
        Header::Abort { group, .. } => (group.0, 2, 0, 0),
        Header::Credit { group, calls } => (group.0, 3, *calls, 0),
        Header::WantCredit { group, seq } => (group.0, 4, *seq, 0),
        Header::P2pGrant { group, tag, upto } => (group.0, 5, *upto, *tag),
        Header::P2pConsumed { group, eager } => (group.0, 6, *eager, 0),
        Header::P2pAsk { group, tag, seq } => (group.0, 11, *seq, *tag),
        Header::Inquire { group, seq } => (group.0, 7, *seq, 0),
        Header::Status { group, seq, .. } => (group.0, 8, *seq, 0),
        Header::Left { group, calls } => (group.0, 9, *calls, 0),
        Header::Failed { group, seq, .. } => (group.0, 10, *seq, 0),
        Header::Probe { group, path } => (
            group.0,
            12,
            path.first().map_or(0, |w| w.seq),
            u32::try_from(path.len()).unwrap_or(u32::MAX),
        ),
    };
    (t.dst, group, kind, seq, tag)
}

/// What went through a simulator's links.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinkStats {
    /// Messages encoded into frames and decoded back.
    pub frames: u64,
    /// Send attempts a link refused with "would block".
    pub would_block: u64,
}

/// A simulated link: says "would block" at random; what it takes goes to `out`.
struct SimLink<'a> {
    rng: &'a mut Rng,
    per_mille: u32,
    out: &'a mut Vec<Transmit>,
    refused: &'a mut u64,
}

impl Link<Transmit> for SimLink<'_> {
    fn try_send(&mut self, t: Transmit) -> std::result::Result<(), LinkError<Transmit>> {
        if self.rng.below(1000) < self.per_mille.min(999) as usize {
            *self.refused += 1;
            return Err(LinkError::WouldBlock(t));
        }
        self.out.push(t);
        Ok(())
    }
}

/// The message as a transport would deliver it: encoded into a frame, decoded from one
/// contiguous buffer, the source stamped from the link. A failure is a codec bug.
fn through_the_wire(t: Transmit) -> Transmit {
    let mut buf = encode(&t.msg).to_contiguous();
    match decode(&mut buf, &Limits::default()) {
        Ok(Some(d)) if buf.is_empty() => Transmit {
            dst: t.dst,
            msg: d.into_message(t.msg.src),
        },
        other => panic!(
            "codec: a frame of {:?} came back as {other:?}",
            t.msg.header
        ),
    }
}

impl Sim {
    /// Drops every message in flight to or from `rank`.
    pub(super) fn drop_in_flight(&mut self, rank: usize) {
        for ((src, dst), o) in &mut self.links {
            if *src == rank || *dst == rank {
                o.clear();
            }
        }
        let mut kept = Vec::with_capacity(self.in_flight.len());
        for f in std::mem::take(&mut self.in_flight) {
            if f.t.dst == rank || f.t.msg.src == rank {
                self.log(TraceEvent::Dropped {
                    src: f.t.msg.src,
                    dst: f.t.dst,
                    header: f.t.msg.header,
                });
            } else {
                kept.push(f);
            }
        }
        self.in_flight = kept;
    }

    /// Collects what `rank`'s engine produced: messages go in flight (or are dropped),
    /// results are recorded.
    pub(super) fn drain(&mut self, rank: usize) {
        let mut out = Vec::new();
        while let Some(t) = self.engines[rank].poll_transmit() {
            out.push(t);
        }
        out.sort_by_key(transmit_key);
        for t in out {
            let (src, dst) = (t.msg.src, t.dst);
            if self.is_lost(src) || self.is_lost(dst) {
                self.log(TraceEvent::Dropped {
                    src,
                    dst,
                    header: t.msg.header,
                });
                continue;
            }
            let mut taken = Vec::new();
            let mut link = SimLink {
                rng: &mut self.rng,
                per_mille: self.opts.would_block_per_mille,
                out: &mut taken,
                refused: &mut self.stats.would_block,
            };
            // A simulated link never closes (losses are modelled by isolate and kill).
            let _ = self.links.entry((src, dst)).or_default().send(&mut link, t);
            for t in taken {
                self.put_in_flight(t);
            }
            self.schedule_retry();
        }
        while let Some(ev) = self.engines[rank].poll_event() {
            if let Some(w) = self.watches.get_mut(&(rank, ev.op)) {
                w.done = true;
            }
            self.complete(rank, ev.op, ev.result);
        }
    }

    /// A message a link took: through the codec, then in flight with its latency.
    fn put_in_flight(&mut self, t: Transmit) {
        let t = through_the_wire(t);
        self.stats.frames += 1;
        let mut extra = self.rng.up_to(self.opts.jitter);
        if self.rng.below(1000) < self.opts.delayed_per_mille as usize {
            extra += self.rng.up_to(self.opts.max_delay);
        }
        let mut tiebreak = self.rng.next_u64();
        let mut at = self.now + self.opts.latency + extra;
        if self.opts.delivery == Delivery::Fifo {
            let last = self.fifo.entry((t.msg.src, t.dst)).or_insert(Time::ZERO);
            at = at.max(*last);
            *last = at;
            self.sent += 1;
            tiebreak = self.sent;
        }
        self.in_flight.push(Flight {
            at,
            sent: self.now,
            tiebreak,
            t,
        });
    }

    /// Retries every link with messages waiting; returns how many went.
    pub(super) fn flush_links(&mut self) -> usize {
        let mut taken = Vec::new();
        for outbox in self.links.values_mut().filter(|o| !o.is_empty()) {
            let mut link = SimLink {
                rng: &mut self.rng,
                per_mille: self.opts.would_block_per_mille,
                out: &mut taken,
                refused: &mut self.stats.would_block,
            };
            let _ = outbox.flush(&mut link);
        }
        let n = taken.len();
        for t in taken {
            self.put_in_flight(t);
        }
        n
    }

    /// Retries the waiting links one latency from now (if none is scheduled earlier).
    pub(super) fn schedule_retry(&mut self) {
        if self.waiting_in_links() {
            let at = self.now + self.opts.latency.max(Duration::from_nanos(1));
            self.retry_links = Some(self.retry_links.map_or(at, |r| r.min(at)));
        }
    }

    /// Messages waiting in links that said "would block".
    fn waiting_in_links(&self) -> bool {
        self.links.values().any(|o| !o.is_empty())
    }
}
