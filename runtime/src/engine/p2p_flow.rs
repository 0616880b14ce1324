//! Flow control of point-to-point messages: what one peer can make a rank buffer is bounded
//! per sending peer, whatever tags it uses, and a valid program never stalls.
//!
//! Two ways for a message to travel, as in MPI's eager and rendezvous protocols:
//! - **Solicited.** A sender that holds a message (below) *asks* its receiver for it
//!   ([`P2pOut::Ask`], once per held message). A receive posted for a peer and tag that finds
//!   no message waiting tells that peer (every member, for a receive from any source) a
//!   *grant* — its messages on the tag with a per-(peer, tag) sequence number below `upto` may
//!   come — if the peer asked for a message of the lane that its last grant did not cover, or
//!   if the receive is larger than the eager limit (a large message is held for sure); an ask
//!   that comes after the receive was posted is answered at once. A grant is cumulative and
//!   only grows: `upto` = messages of the lane consumed here + receives posted here that could
//!   match the lane. A solicited message is flagged as such. (Grants used to be sent for every
//!   receive that waited: over TCP that was a second frame per message, 5 µs of `sendmsg` on
//!   this project's VM, for messages that went eager anyway.)
//! - **Eager.** (`window` here is the group's window, at most [`P2P_WINDOW`].) Without a
//!   grant, a sender may still have at most `window` messages in flight
//!   toward a peer (over all tags of the group) that the peer has not consumed yet. The
//!   receiver counts the eager messages it consumes and reports the count (cumulative) once
//!   half a window has been consumed since its last report, which frees the sender's budget.
//!   Beyond the budget a message waits in the sender (it refers to the sender's own tensor).
//!
//! - **Large.** A message of more than `budget / window` bytes (`GroupOptions::
//!   peer_budget_bytes`) never goes eager: it waits for its grant (a rendezvous, as MPI's
//!   large messages do), while smaller ones may pass it.
//!
//! Bound: the receiver buffers at most `window` eager messages per peer, each of at most
//! `budget / window` bytes (a message beyond either is a protocol violation), plus solicited messages that a receive from any source
//! asked for and another peer's message then satisfied, which are bounded by the receives the
//! receiver itself posted.
//!
//! Liveness rests on asks and grants: when a receive waits, every earlier message of its lane
//! has been consumed (receives match in order per lane), so the message it needs is the
//! lane's next. The sender sends it at once, or holds it and asks for it; the ask reaches the
//! receiver before or after the receive is posted, and either way the receiver grants it
//! (the lane's next message is below `consumed + waiting`), and the sender sends it as soon as
//! the grant arrives; no eager budget is involved. The eager reports only let senders run
//! ahead without a round trip.

use crate::fast_hash::FastMap;
use crate::wire::message::{Header, Transmit};
use std::collections::{HashMap, VecDeque};

/// What the point-to-point flow state asks the engine to send, beyond released messages.
#[derive(Debug)]
pub(crate) enum P2pOut {
    /// A released (or never held) message.
    Send(Transmit),
    /// Tell `peer` that its messages on `tag` below `upto` may come.
    Grant { peer: usize, tag: u32, upto: u64 },
    /// Tell `peer` how many of its eager messages this rank has consumed.
    Consumed { peer: usize, eager: u64 },
    /// Ask `peer` for a grant of this rank's message `seq` on `tag`, which waits here.
    Ask { peer: usize, tag: u32, seq: u64 },
}

#[derive(Debug, Default)]
struct Peer {
    // Toward the peer.
    /// Eager messages sent to the peer.
    eager_sent: u64,
    /// Of those, how many the peer reported consumed.
    eager_done: u64,
    /// Per tag: lane sequence numbers below this were solicited by the peer.
    granted: HashMap<u32, u64>,
    /// Messages waiting for a grant or eager budget, in the order they were sent, with their
    /// payload bytes.
    held: VecDeque<(u32, u64, u64, Transmit)>,
    // From the peer.
    /// Eager messages of the peer buffered here, not consumed yet.
    eager_in: u64,
    /// Eager messages of the peer consumed here (cumulative), and the count last reported.
    eager_consumed: u64,
    eager_reported: u64,
    /// Per tag: the grant this rank sent the peer (tags of this rank's own receives).
    grants: FastMap<u32, u64>,
    /// Per tag: the peer holds its lane's messages below this for this rank (it asked).
    asked: HashMap<u32, u64>,
}

/// The point-to-point flow state of one group on one rank; peers are group-local ranks.
#[derive(Debug)]
pub(crate) struct P2pFlow {
    window: u64,
    /// The largest eager message (`budget / window`).
    eager_limit: u64,
    /// Per group-local peer (a member: the engine maps every sender into the group first).
    peers: FastMap<usize, Peer>,
}

/// Marks a point-to-point message eager or solicited.
fn flag(mut t: Transmit, eager: bool) -> Transmit {
    if let Header::P2p { eager: e, .. } = &mut t.msg.header {
        *e = eager;
    }
    t
}

/// The most eager point-to-point messages one peer may have in flight to a rank: a group's
/// window up to this (`GroupOptions::window`). It also sets the eager limit (the byte
/// budget over it), which a window of calls as large as the default would shrink to a few
/// hundred KiB, sending messages of 1 MiB through a rendezvous.
pub(crate) const P2P_WINDOW: u64 = 16;

impl P2pFlow {
    pub(crate) fn new(window: u64, budget: u64) -> Self {
        let window = window.max(1);
        P2pFlow {
            window,
            eager_limit: budget / window,
            peers: FastMap::default(),
        }
    }

    /// Message `seq` of lane (`peer`, `tag`), sent by this rank: it goes out (into `out`)
    /// or waits here, asking the peer for a grant.
    pub(crate) fn send(
        &mut self,
        peer: usize,
        tag: u32,
        seq: u64,
        t: Transmit,
        out: &mut Vec<P2pOut>,
    ) {
        let (w, limit) = (self.window, self.eager_limit);
        let bytes = t.msg.payload.iter().map(|b| b.len() as u64).sum();
        let p = self.peers.entry(peer).or_default();
        if p.granted.get(&tag).is_some_and(|&g| seq < g) {
            out.push(P2pOut::Send(flag(t, false)));
            return;
        }
        // Held messages that may go eager go first (oldest first), so a new one waits behind
        // them; large ones wait for their grants and hold nothing up.
        if bytes <= limit
            && p.held.iter().all(|h| h.2 > limit)
            && p.eager_sent.saturating_sub(p.eager_done) < w
        {
            p.eager_sent += 1;
            out.push(P2pOut::Send(flag(t, true)));
            return;
        }
        p.held.push_back((tag, seq, bytes, t));
        out.push(P2pOut::Ask { peer, tag, seq });
    }

    /// The largest message that may go eager.
    pub(crate) fn eager_limit(&self) -> u64 {
        self.eager_limit
    }

    /// `peer` solicited its messages on `tag` below `upto`.
    pub(crate) fn on_grant(&mut self, peer: usize, tag: u32, upto: u64, out: &mut Vec<P2pOut>) {
        let p = self.peers.entry(peer).or_default();
        let g = p.granted.entry(tag).or_insert(0);
        *g = (*g).max(upto);
        let g = *g;
        let (go, stay): (VecDeque<_>, VecDeque<_>) = std::mem::take(&mut p.held)
            .into_iter()
            .partition(|(tg, s, _, _)| *tg == tag && *s < g);
        p.held = stay;
        out.extend(
            go.into_iter()
                .map(|(_, _, _, t)| P2pOut::Send(flag(t, false))),
        );
        self.release_eager(peer, out);
    }

    /// `peer` consumed `eager` of this rank's eager messages (cumulative).
    pub(crate) fn on_consumed(&mut self, peer: usize, eager: u64, out: &mut Vec<P2pOut>) {
        let p = self.peers.entry(peer).or_default();
        p.eager_done = p.eager_done.max(eager.min(p.eager_sent));
        self.release_eager(peer, out);
    }

    /// Sends held messages that may go eager, oldest first, while the eager budget allows.
    fn release_eager(&mut self, peer: usize, out: &mut Vec<P2pOut>) {
        let (w, limit) = (self.window, self.eager_limit);
        let Some(p) = self.peers.get_mut(&peer) else {
            return;
        };
        let mut i = 0;
        while i < p.held.len() && p.eager_sent.saturating_sub(p.eager_done) < w {
            if p.held[i].2 > limit {
                i += 1;
                continue;
            }
            let Some((_, _, _, t)) = p.held.remove(i) else {
                break;
            };
            p.eager_sent += 1;
            out.push(P2pOut::Send(flag(t, true)));
        }
    }

    /// Whether a message of lane (`peer`, `tag`) may have been sent (receiver-side check).
    /// Admitting an eager message counts it as buffered.
    pub(crate) fn admit(&mut self, peer: usize, tag: u32, seq: u64, eager: bool) -> bool {
        let w = self.window;
        let p = self.peers.entry(peer).or_default();
        if eager {
            if p.eager_in >= w {
                return false;
            }
            p.eager_in += 1;
            true
        } else {
            p.grants.get(&tag).is_some_and(|&g| seq < g)
        }
    }

    /// A receive consumed a message of `peer`; an eager one may be reported.
    pub(crate) fn on_consume(&mut self, peer: usize, eager: bool, out: &mut Vec<P2pOut>) {
        if !eager {
            return;
        }
        let half = (self.window / 2).max(1);
        let p = self.peers.entry(peer).or_default();
        p.eager_in = p.eager_in.saturating_sub(1);
        p.eager_consumed += 1;
        if p.eager_consumed - p.eager_reported >= half {
            p.eager_reported = p.eager_consumed;
            out.push(P2pOut::Consumed {
                peer,
                eager: p.eager_consumed,
            });
        }
    }

    /// Receives wait here for `peer`'s messages on `tag` up to (not including) lane sequence
    /// `upto` (`big`: one of them is larger than the eager limit): solicit them, unless
    /// already solicited, if the peer asked for one the last grant did not cover or a
    /// receive is big.
    pub(crate) fn solicit(
        &mut self,
        peer: usize,
        tag: u32,
        upto: u64,
        big: bool,
        out: &mut Vec<P2pOut>,
    ) {
        let p = self.peers.entry(peer).or_default();
        let asked = p.asked.get(&tag).copied().unwrap_or(0);
        let g = p.grants.entry(tag).or_insert(0);
        if upto > *g && (big || asked > *g) {
            *g = upto;
            out.push(P2pOut::Grant { peer, tag, upto });
        }
    }

    /// `peer` holds its message `seq` on `tag` for this rank and asks for it (the engine
    /// solicits again).
    pub(crate) fn on_ask(&mut self, peer: usize, tag: u32, seq: u64) {
        let p = self.peers.entry(peer).or_default();
        let a = p.asked.entry(tag).or_insert(0);
        *a = (*a).max(seq.saturating_add(1));
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
mod tests {
    use super::*;
    use crate::group::GroupId;
    use crate::wire::message::Message;
    use crate::DType;

    fn msg(tag: u32, seq: u64) -> Transmit {
        Transmit {
            dst: 1,
            msg: Message {
                src: 0,
                header: Header::P2p {
                    group: GroupId::WORLD,
                    tag,
                    seq,
                    dtype: DType::U8,
                    count: 0,
                    eager: false,
                    path: crate::DataPath::Engine,
                },
                payload: Vec::new(),
            },
        }
    }

    fn sent(out: &[P2pOut]) -> Vec<(u32, u64, bool)> {
        out.iter()
            .filter_map(|o| match o {
                P2pOut::Send(Transmit {
                    msg:
                        Message {
                            header:
                                Header::P2p {
                                    tag, seq, eager, ..
                                },
                            ..
                        },
                    ..
                }) => Some((*tag, *seq, *eager)),
                _ => None,
            })
            .collect()
    }

    /// `f.send` of message `seq` on `tag` to rank 1: what it put out.
    fn send(f: &mut P2pFlow, tag: u32, seq: u64, t: Transmit) -> Vec<P2pOut> {
        let mut out = Vec::new();
        f.send(1, tag, seq, t, &mut out);
        out
    }

    fn big(tag: u32, seq: u64, bytes: usize) -> Transmit {
        let mut t = msg(tag, seq);
        t.msg.payload = vec![bytes::Bytes::from(vec![0u8; bytes])];
        t
    }

    #[test]
    fn a_message_above_budget_over_window_waits_for_its_grant_and_small_ones_pass_it() {
        // Window 2, budget 200: messages above 100 bytes never go eager.
        let mut f = P2pFlow::new(2, 200);
        assert_eq!(f.eager_limit(), 100);
        let o = send(&mut f, 5, 0, big(5, 0, 101));
        assert!(
            matches!(
                o.as_slice(),
                [P2pOut::Ask {
                    peer: 1,
                    tag: 5,
                    seq: 0
                }]
            ),
            "large: held, and asked for: {o:?}"
        );
        // A small one passes it, eager.
        let o = send(&mut f, 6, 0, big(6, 0, 100));
        assert_eq!(sent(&o), vec![(6, 0, true)]);
        // Consumed reports release small ones only.
        let mut out = Vec::new();
        f.on_consumed(1, 1, &mut out);
        assert!(out.is_empty(), "{out:?}");
        assert_eq!(f.held(), 1);
        // The receive for it grants it: it goes, solicited.
        f.on_grant(1, 5, 1, &mut out);
        assert_eq!(sent(&out), vec![(5, 0, false)]);
        assert_eq!(f.held(), 0);
    }

    #[test]
    fn the_eager_budget_spans_every_tag_and_grants_go_around_it() {
        let mut f = P2pFlow::new(2, u64::MAX);
        let mut out: Vec<P2pOut> = (0..5).flat_map(|t| send(&mut f, t, 0, msg(t, 0))).collect();
        assert_eq!(sent(&out), vec![(0, 0, true), (1, 0, true)]);
        let asks = out
            .iter()
            .filter(|o| matches!(o, P2pOut::Ask { .. }))
            .count();
        assert_eq!(asks, 3, "each held message asks once");
        assert_eq!(f.held(), 3);
        out.clear();
        // The peer posts a receive for tag 4: that message goes, solicited, out of turn.
        f.on_grant(1, 4, 1, &mut out);
        assert_eq!(sent(&out), vec![(4, 0, false)]);
        out.clear();
        // A stale or smaller grant changes nothing.
        f.on_grant(1, 4, 0, &mut out);
        assert!(out.is_empty());
        // One eager message consumed: the oldest held goes, eager.
        f.on_consumed(1, 1, &mut out);
        assert_eq!(sent(&out), vec![(2, 0, true)]);
        out.clear();
        // A report beyond what was sent is capped (it cannot open more than the window).
        f.on_consumed(1, 100, &mut out);
        assert_eq!(sent(&out), vec![(3, 0, true)]);
        assert_eq!(f.held(), 0);
        // A granted lane sends at once even with the budget spent.
        let mut g = P2pFlow::new(1, u64::MAX);
        assert_eq!(sent(&send(&mut g, 7, 0, msg(7, 0))).len(), 1);
        assert!(sent(&send(&mut g, 7, 1, msg(7, 1))).is_empty());
        g.on_grant(1, 7, 3, &mut out);
        out.clear();
        let o = send(&mut g, 7, 2, msg(7, 2));
        assert_eq!(sent(&o), vec![(7, 2, false)]);
    }

    #[test]
    fn a_grant_releases_exactly_the_messages_below_it() {
        let mut f = P2pFlow::new(1, u64::MAX);
        let mut out: Vec<P2pOut> = (0..4).flat_map(|q| send(&mut f, 3, q, msg(3, q))).collect();
        assert_eq!(sent(&out), vec![(3, 0, true)]);
        out.clear();
        // One receive waits after message 0 was consumed: messages below 2 are solicited.
        f.on_grant(1, 3, 2, &mut out);
        assert_eq!(sent(&out), vec![(3, 1, false)]);
        assert_eq!(f.held(), 2);
        assert_eq!(f.holding_for().collect::<Vec<_>>(), vec![(1, 2)]);
        f.clear();
        assert_eq!((f.held(), f.holding_for().count()), (0, 0));
    }

    #[test]
    fn consumption_is_reported_once_per_half_window_and_grants_are_not_repeated() {
        let mut f = P2pFlow::new(4, u64::MAX);
        let mut out = Vec::new();
        for _ in 0..4 {
            assert!(f.admit(1, 0, 0, true));
        }
        for _ in 0..4 {
            f.on_consume(1, true, &mut out);
        }
        let reports: Vec<u64> = out
            .iter()
            .filter_map(|o| match o {
                P2pOut::Consumed { eager, .. } => Some(*eager),
                _ => None,
            })
            .collect();
        assert_eq!(reports, vec![2, 4], "a report every half window of 4");
        out.clear();
        f.solicit(1, 9, 3, true, &mut out);
        f.solicit(1, 9, 3, true, &mut out);
        assert_eq!(out.len(), 1, "an equal grant is not sent again");
    }

    #[test]
    fn the_receiver_admits_a_window_of_eager_messages_and_only_what_it_solicited() {
        let mut f = P2pFlow::new(2, u64::MAX);
        let mut out = Vec::new();
        assert!(f.admit(1, 0, 0, true));
        assert!(f.admit(1, 9, 0, true));
        assert!(
            !f.admit(1, 3, 0, true),
            "a third eager message is beyond the window"
        );
        assert!(!f.admit(1, 3, 0, false), "not solicited");
        f.solicit(1, 3, 2, true, &mut out);
        assert!(matches!(
            out.as_slice(),
            [P2pOut::Grant {
                peer: 1,
                tag: 3,
                upto: 2
            }]
        ));
        out.clear();
        f.solicit(1, 3, 1, true, &mut out);
        assert!(out.is_empty(), "grants only grow");
        assert!(f.admit(1, 3, 1, false) && !f.admit(1, 3, 2, false));
        // Consuming eager messages frees the window and is reported every half window.
        f.on_consume(1, true, &mut out);
        assert!(matches!(
            out.as_slice(),
            [P2pOut::Consumed { peer: 1, eager: 1 }]
        ));
        assert!(f.admit(1, 4, 0, true));
        out.clear();
        f.on_consume(1, false, &mut out);
        assert!(out.is_empty(), "solicited messages are not eager budget");
    }

    #[test]
    fn a_small_receive_grants_only_what_its_sender_asked_for() {
        let mut f = P2pFlow::new(4, u64::MAX);
        let mut out = Vec::new();
        // Two small receives wait, nobody asked: no grant (the messages will come eager).
        f.solicit(1, 2, 2, false, &mut out);
        assert!(out.is_empty(), "{out:?}");
        // The sender holds message 0 and asks: both waiting receives are granted.
        f.on_ask(1, 2, 0);
        f.solicit(1, 2, 2, false, &mut out);
        assert!(matches!(
            out.as_slice(),
            [P2pOut::Grant {
                peer: 1,
                tag: 2,
                upto: 2
            }]
        ));
        out.clear();
        // A third receive: the sender's ask is covered by the last grant, so none.
        f.solicit(1, 2, 3, false, &mut out);
        assert!(out.is_empty(), "{out:?}");
        // It asks for message 2 (held too): granted.
        f.on_ask(1, 2, 2);
        f.solicit(1, 2, 3, false, &mut out);
        assert!(matches!(out.as_slice(), [P2pOut::Grant { upto: 3, .. }]));
        out.clear();
        // Another lane, big receive: granted without an ask.
        f.solicit(1, 8, 1, true, &mut out);
        assert!(matches!(
            out.as_slice(),
            [P2pOut::Grant {
                tag: 8,
                upto: 1,
                ..
            }]
        ));
    }
}
