//! Flow control: a bounded window of calls per (group, peer), so that a rank that runs ahead
//! (a root issuing many broadcasts before its peers make them) cannot grow a peer's queues
//! without limit.
//!
//! A rank sends a message of call `seq` to a peer only while `seq < known + window`, where
//! `known` is how many calls of the group the peer has made, as far as this rank knows.
//! Otherwise the message waits here, in the sender's memory (it refers to the sender's own
//! tensors). Knowledge comes from `Credit { calls }` messages, which a peer sends in answer to
//! `WantCredit { seq }`: at once, and again once it has made enough calls to let through the
//! *lowest* `seq` it was asked about and has not granted yet, and again for the *last* one it
//! was asked about (the one the sender waits for), as each fits. A sender's ask always names its
//! lowest held call (it asks again whenever it holds an older one, and after every credit
//! that leaves messages held), so that answer is always the one that lets it go on.
//! A sender asks early, when it passes the middle of its window, so ranks that keep in step
//! never wait for a credit; they pay one small message pair per half window. A data message of
//! call `seq` is itself a credit of `seq + 1` (the peer has made that call), so ranks that
//! exchange data rarely need the explicit messages at all.
//!
//! **Bytes.** The window bounds calls; a byte budget (`GroupOptions::peer_budget_bytes`)
//! bounds what they carry. A message of a call the peer has not made yet, as far as this rank
//! knows, is sent *ahead*: it may end up buffered in the peer until the peer makes the call.
//! A rank sends a message ahead only while the bytes it has sent ahead to that peer (for calls
//! not yet known made) stay within the budget; otherwise the message waits here until the
//! peer has made its call — a rendezvous, as MPI does for large messages — and then goes
//! whatever its size. The receiver counts the bytes it buffers per peer for calls it has not
//! made and treats a count beyond the budget as a protocol violation: what it counts is a
//! subset of what the sender counted (the sender's knowledge of the peer's calls lags the
//! peer's own), so a conforming sender never trips it. To wait for "the peer has made call
//! `s`" a sender asks about call `s + window` (the peer answers once `s + window` is within
//! its window, that is once it has made `s`); a rank that has more than half its budget
//! ahead asks early, so that ranks in step rarely wait for the answer. Deadlock freedom is
//! the argument below with a window of 1: a rank blocked in a call has made it, so the
//! messages of that call held for bytes are released by the credit that follows.
//!
//! Point-to-point messages have flow control of their own ([`crate::engine::p2p_flow`]): a window of
//! eager messages per peer over all tags, and grants from posted receives.
//!
//! A call can complete while some of its messages still wait here for a peer's credit (a
//! broadcast root, for one, finishes once its part is posted). The rank sends them as soon as
//! the credit comes, as long as it runs. A rank that shuts down ([`crate::Engine::shutdown`])
//! keeps sending them for a bounded linger time, then tells each peer it still held messages
//! for (an abort with `Error::PeerShutdown`), so that peer's calls fail at once rather than at
//! their timeout. (An in-process world stops all its ranks together and needs no linger.)
//!
//! Deadlock freedom: a message is held only for a call at least `window` calls beyond the
//! peer's last known call. Let `s` be the lowest call the sender holds for a peer. The sender
//! has asked about `s` (or a lower call, which the peer has since granted, and the credit that
//! did so made the sender ask about `s`); the peer keeps the lowest call asked about and not
//! granted (and the last), so its record is at most `s`. If the peer has made call `s − window + 1`, it has
//! sent a credit at that point (at once, or when it made the call), which releases `s`; if it
//! has not, the calls it waits for are below `s − window + 1`, so none of their messages is
//! held. Either way the lowest held message is released or is not waited for, so `window >= 1`
//! suffices. (The peer used to keep the *highest* call asked about: it then answered only
//! once that one fitted, while the sender waited for its lowest — a valid program of a root
//! far ahead and a peer issuing one call at a time stalled at the window.) The receiver, in
//! turn, never buffers more than `window` calls per peer that it has not made yet, and treats
//! a message beyond that as a protocol violation.

use crate::fast_hash::FastMap;
use std::collections::VecDeque;

/// What the flow state asks the engine to send.
#[derive(Debug, PartialEq)]
pub(crate) enum FlowOut<T> {
    /// A message released (or never held).
    Send(T),
    /// Ask `peer` for credit up to call `seq`.
    Ask { peer: usize, seq: u64 },
    /// Tell `peer` how many calls this rank has made.
    Credit { peer: usize, calls: u64 },
}

#[derive(Debug)]
struct Peer<T> {
    /// Calls the peer has made, as far as this rank knows.
    known: u64,
    /// Messages waiting for credit, with their call's seq and payload bytes.
    held: Vec<(u64, u64, T)>,
    /// Bytes sent ahead (for calls not known made), by call.
    ahead: SeqBytes,
    /// Their sum.
    ahead_bytes: u64,
    /// Receiver side: bytes of the peer buffered here for calls this rank has not made, by
    /// call.
    early: SeqBytes,
    /// Their sum.
    early_bytes: u64,
    /// The highest seq this rank has asked the peer about.
    asked: Option<u64>,
    /// The lowest call the peer asked this rank about and has not been granted yet.
    want_lowest: Option<u64>,
    /// The call the peer asked about last, if not granted yet: the sender waits for the
    /// answer to its last ask, which need not be the lowest.
    want_last: Option<u64>,
}

impl<T> Peer<T> {
    /// Keeps the ask on the lowest held call: asks for it unless an ask at or below it is
    /// still outstanding (one that the known calls already satisfy is answered, not
    /// outstanding).
    fn ask_lowest(&mut self, peer: usize, w: u64, out: &mut Vec<FlowOut<T>>) {
        if self.asked.is_some_and(|a| a < self.known.saturating_add(w)) {
            self.asked = None;
        }
        let Some(first) = self.held.iter().map(|(s, _, _)| self.ask_for(*s, w)).min() else {
            return;
        };
        if self.asked.is_none_or(|a| first < a) {
            self.asked = Some(first);
            out.push(FlowOut::Ask { peer, seq: first });
        }
    }

    /// The call to ask about for a message of call `seq` held here: `seq` itself beyond the
    /// window; within it (held for bytes), `seq + w`, whose answer says the peer made `seq`.
    fn ask_for(&self, seq: u64, w: u64) -> u64 {
        if seq >= self.known.saturating_add(w) {
            seq
        } else {
            seq.saturating_add(w)
        }
    }

    /// Whether a message of call `seq` and `bytes` may go now; counts it if it goes ahead.
    fn may_send(&mut self, seq: u64, bytes: u64, w: u64, budget: u64) -> bool {
        if seq >= self.known.saturating_add(w) {
            return false;
        }
        if seq < self.known {
            return true;
        }
        if self.ahead_bytes.saturating_add(bytes) > budget {
            return false;
        }
        self.ahead_bytes += bytes;
        self.ahead.add(seq, bytes);
        true
    }

    /// The peer has made every call below `known`: what was sent ahead of them is not ahead
    /// any more.
    fn forget_ahead(&mut self) {
        let done = self.ahead.pop_below(self.known);
        self.ahead_bytes = self.ahead_bytes.saturating_sub(done);
    }
}

impl<T> Default for Peer<T> {
    fn default() -> Self {
        Peer {
            known: 0,
            held: Vec::new(),
            ahead: SeqBytes::default(),
            ahead_bytes: 0,
            early: SeqBytes::default(),
            early_bytes: 0,
            asked: None,
            want_lowest: None,
            want_last: None,
        }
    }
}

/// The flow state of one group on one rank.
/// Bytes per call (sequence number), in order: what was sent ahead to a peer, or what
/// arrived early from it. Calls come and go in about sequence order, so a sorted ring keeps
/// them with no allocation per call (a `BTreeMap` allocated a node whenever it went from
/// empty to one call, every call of a rank in step).
#[derive(Debug, Default)]
struct SeqBytes(VecDeque<(u64, u64)>);

impl SeqBytes {
    /// Adds `bytes` to call `seq`.
    fn add(&mut self, seq: u64, bytes: u64) {
        match self.0.back_mut() {
            Some((s, b)) if *s == seq => *b = b.saturating_add(bytes),
            Some((s, _)) if *s > seq => match self.0.binary_search_by_key(&seq, |(s, _)| *s) {
                Ok(i) => {
                    if let Some((_, b)) = self.0.get_mut(i) {
                        *b = b.saturating_add(bytes);
                    }
                }
                Err(i) => self.0.insert(i, (seq, bytes)),
            },
            _ => self.0.push_back((seq, bytes)),
        }
    }

    /// The lowest call.
    fn first(&self) -> Option<u64> {
        self.0.front().map(|(s, _)| *s)
    }

    /// Removes the calls below `limit`; the sum of their bytes.
    fn pop_below(&mut self, limit: u64) -> u64 {
        let mut sum = 0u64;
        while let Some(&(s, b)) = self.0.front() {
            if s >= limit {
                break;
            }
            sum = sum.saturating_add(b);
            self.0.pop_front();
        }
        sum
    }
}

#[derive(Debug)]
pub(crate) struct Flow<T> {
    window: u64,
    /// Bytes a peer may have sent ahead of this rank's calls (see the module doc).
    budget: u64,
    /// Calls this rank has made in the group (highest seq + 1).
    made: u64,
    peers: FastMap<usize, Peer<T>>,
}

impl<T> Flow<T> {
    pub(crate) fn new(window: u64, budget: u64) -> Self {
        Flow {
            window: window.max(1),
            budget,
            made: 0,
            peers: FastMap::default(),
        }
    }

    /// Whether a peer may have sent a message of call `seq` (receiver-side check).
    pub(crate) fn admits(&self, seq: u64) -> bool {
        seq < self.made.saturating_add(self.window)
    }

    /// A message of call `seq` with `bytes` of payload for `peer`.
    pub(crate) fn send(
        &mut self,
        peer: usize,
        seq: u64,
        bytes: u64,
        msg: T,
        out: &mut Vec<FlowOut<T>>,
    ) {
        let (w, budget) = (self.window, self.budget);
        let p = self.peers.entry(peer).or_default();
        if p.may_send(seq, bytes, w, budget) {
            out.push(FlowOut::Send(msg));
            // Ask early, so that ranks in step never stall on a credit: past half the window,
            // or past half the byte budget.
            let ahead = seq.saturating_add(w / 2);
            if seq >= p.known.saturating_add(w / 2) && p.asked.is_none_or(|a| a < ahead) {
                p.asked = Some(ahead);
                out.push(FlowOut::Ask { peer, seq: ahead });
            } else if p.ahead_bytes > budget / 2
                && p.asked.is_none_or(|a| a < p.known.saturating_add(w))
            {
                if let Some(first) = p.ahead.first() {
                    let q = first.saturating_add(w);
                    p.asked = Some(q);
                    out.push(FlowOut::Ask { peer, seq: q });
                }
            }
        } else {
            p.held.push((seq, bytes, msg));
            p.ask_lowest(peer, w, out);
        }
    }

    /// `peer` has made `calls` calls: release what that allows (lowest calls first).
    pub(crate) fn on_credit(&mut self, peer: usize, calls: u64, out: &mut Vec<FlowOut<T>>) {
        let (w, budget) = (self.window, self.budget);
        let p = self.peers.entry(peer).or_default();
        if calls > p.known {
            p.known = calls;
            p.forget_ahead();
            let mut held = std::mem::take(&mut p.held);
            held.sort_by_key(|(s, _, _)| *s);
            for (seq, bytes, m) in held {
                if p.may_send(seq, bytes, w, budget) {
                    out.push(FlowOut::Send(m));
                } else {
                    p.held.push((seq, bytes, m));
                }
            }
        }
        // Even a credit that brings nothing new answers the ask it replies to: ask again for
        // what is still held.
        p.ask_lowest(peer, w, out);
    }

    /// `peer` asks whether it may send call `seq`.
    pub(crate) fn on_want(&mut self, peer: usize, seq: u64, out: &mut Vec<FlowOut<T>>) {
        let made = self.made;
        let w = self.window;
        let p = self.peers.entry(peer).or_default();
        out.push(FlowOut::Credit { peer, calls: made });
        if seq >= made.saturating_add(w) {
            // Remember the lowest call asked about and the last, and answer each as soon as it
            // fits. The lowest is the one whose credit lets the sender go on (it releases its
            // held messages lowest first): keeping only the highest made the receiver wait for
            // a call that itself needed the held messages. The last is the one the sender
            // waits for (every ask it sends replaces the one it waits for): keeping only the
            // lowest lost it when the last was higher (an early ask for a message sent ahead),
            // and the sender waited for an answer that never came. Asks in between need no
            // record: every credit makes the sender ask again about its lowest held call if
            // that is below the ask it waits for.
            p.want_lowest = Some(p.want_lowest.map_or(seq, |x| x.min(seq)));
            p.want_last = Some(seq);
        }
    }

    /// `bytes` of `peer` arrived for call `seq`, which this rank has not made yet: counts
    /// them; `Err` with the count they would make if that is beyond the budget (a protocol
    /// violation: a conforming peer never gets there).
    pub(crate) fn early(&mut self, peer: usize, seq: u64, bytes: u64) -> Result<(), u64> {
        let budget = self.budget;
        let p = self.peers.entry(peer).or_default();
        let total = p.early_bytes.saturating_add(bytes);
        if total > budget {
            return Err(total);
        }
        p.early_bytes = total;
        p.early.add(seq, bytes);
        Ok(())
    }

    /// The byte budget.
    pub(crate) fn budget(&self) -> u64 {
        self.budget
    }

    /// This rank made call `seq`: answer the peers that were waiting for it.
    pub(crate) fn on_made(&mut self, seq: u64, out: &mut Vec<FlowOut<T>>) {
        self.made = self.made.max(seq.saturating_add(1));
        let limit = self.made.saturating_add(self.window);
        for (&peer, p) in &mut self.peers {
            // What arrived early for the calls made now is the calls' own.
            let done = p.early.pop_below(self.made);
            p.early_bytes = p.early_bytes.saturating_sub(done);
            let lowest = p.want_lowest.take_if(|s| *s < limit).is_some();
            let last = p.want_last.take_if(|s| *s < limit).is_some();
            if lowest || last {
                out.push(FlowOut::Credit {
                    peer,
                    calls: self.made,
                });
            }
        }
    }

    #[cfg(test)]
    fn asked_for_test(&mut self, peer: usize, seq: u64) {
        self.peers.entry(peer).or_default().asked = Some(seq);
    }

    /// Messages held, over all peers.
    pub(crate) fn held(&self) -> usize {
        self.peers.values().map(|p| p.held.len()).sum()
    }

    /// Peers this rank holds messages for, with how many.
    pub(crate) fn holding_for(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.peers
            .iter()
            .filter(|(_, p)| !p.held.is_empty())
            .map(|(&r, p)| (r, p.held.len()))
    }

    /// Drops everything held (the group was aborted).
    pub(crate) fn clear(&mut self) {
        for p in self.peers.values_mut() {
            p.held.clear();
        }
    }
}

#[cfg(test)]
#[path = "flow_tests.rs"]
mod tests;
