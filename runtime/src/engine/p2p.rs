//! Point-to-point calls: sends (through [`super::p2p_flow`]), receives posted and matched
//! with arrived messages in FIFO order per (source, tag), and the grants that solicit what
//! posted receives wait for.

use super::p2p_flow::P2pOut;
use super::{Engine, Event, OpId, PendingCall, State};
use crate::collective::TensorSpec;
use crate::collective::{p2p_fp, Output};
use crate::error::Result;
use crate::error::{Error, ProtocolError};
use crate::fast_hash::FastMap;
use crate::ids::{DataPath, Fingerprint, GroupId};
use crate::op::OpKind;
use crate::tensor::{validate_storage, Tensor};
use crate::wire::message::{Header, Message, Transmit, TICKET_MAX};
use bytes::Bytes;

impl Engine {
    /// Sends `data` (`count` elements of `fp`'s dtype, or a ticket for them when `fp`'s path
    /// is [`DataPath::Nccl`]) to group rank `dst` on `tag`; the call completes at once (the
    /// message may wait in flow control: [`super::p2p_flow`]).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn submit_send(
        &mut self,
        id: OpId,
        group: GroupId,
        fp: Fingerprint,
        dst: usize,
        tag: u32,
        data: Bytes,
        count: u64,
    ) {
        let Fingerprint { dtype, path, .. } = fp;
        let Some(g) = self.groups.get_mut(&group) else {
            return;
        };
        let s = g.p2p_send_seq.entry((dst, tag)).or_insert(0);
        let header = Header::P2p {
            group,
            tag,
            seq: *s,
            dtype,
            count,
            eager: false,
            path,
        };
        let q = *s;
        *s += 1;
        let t = Transmit {
            dst: g.info.global(dst),
            msg: Message {
                src: self.rank,
                header,
                payload: vec![data],
            },
        };
        let mut out = Vec::new();
        g.p2p_flow.send(dst, tag, q, t, &mut out);
        self.emit_p2p(group, out);
        self.events.push_back(Event {
            op: id,
            result: Ok(Output::None),
        });
    }

    /// Posts receive `id` (its op is `op`, in state [`State::Recv`]) and matches it.
    pub(super) fn submit_recv(&mut self, id: OpId, op: PendingCall) {
        let group = op.group;
        let Some(g) = self.groups.get_mut(&group) else {
            return;
        };
        g.p2p_posted.push(id);
        self.ops.insert(id, Box::new(op));
        self.match_p2p(group);
        // What is still posted waits for messages not here yet: ask for them. Only a new
        // receive or a sender's ask can raise a grant (a consumed message moves one from
        // "waiting" to "consumed", which leaves every lane's sum as it was), so other
        // arrivals skip this.
        self.solicit(group);
    }

    /// Sends what the point-to-point flow control of group `gid` released or tells.
    pub(super) fn emit_p2p(&mut self, gid: GroupId, out: Vec<P2pOut>) {
        let Some(g) = self.groups.get(&gid) else {
            return;
        };
        for o in out {
            let (dst, header) = match o {
                P2pOut::Send(t) => {
                    self.transmits.push_back(t);
                    continue;
                }
                P2pOut::Grant { peer, tag, upto } => (
                    g.info.global(peer),
                    Header::P2pGrant {
                        group: gid,
                        tag,
                        upto,
                    },
                ),
                P2pOut::Ask { peer, tag, seq } => (
                    g.info.global(peer),
                    Header::P2pAsk {
                        group: gid,
                        tag,
                        seq,
                    },
                ),
                P2pOut::Consumed { peer, eager } => (
                    g.info.global(peer),
                    Header::P2pConsumed { group: gid, eager },
                ),
            };
            let msg = Message {
                src: self.rank,
                header,
                payload: Vec::new(),
            };
            self.transmits.push_back(Transmit { dst, msg });
        }
    }

    /// Group-local `src` granted messages on `tag` below `upto` (point-to-point flow control).
    pub(super) fn on_p2p_grant(&mut self, gid: GroupId, src: usize, tag: u32, upto: u64) {
        let Some(g) = self.groups.get_mut(&gid) else {
            return;
        };
        let mut out = Vec::new();
        g.p2p_flow.on_grant(src, tag, upto, &mut out);
        self.emit_p2p(gid, out);
    }

    /// Group-local `src` holds its message `seq` on `tag` for this rank and asks for a grant:
    /// a receive posted for it now grants it.
    pub(super) fn on_p2p_ask(&mut self, gid: GroupId, src: usize, tag: u32, seq: u64) {
        let Some(g) = self.groups.get_mut(&gid) else {
            return;
        };
        g.p2p_flow.on_ask(src, tag, seq);
        self.solicit(gid);
    }

    /// Group-local `src` reported that it has consumed `eager` of this rank's eager messages
    /// (point-to-point flow control).
    pub(super) fn on_p2p_consumed(&mut self, gid: GroupId, src: usize, eager: u64) {
        let Some(g) = self.groups.get_mut(&gid) else {
            return;
        };
        let mut out = Vec::new();
        g.p2p_flow.on_consumed(src, eager, &mut out);
        self.emit_p2p(gid, out);
    }

    /// Solicits the messages that the receives posted in group `gid` wait for: per (peer,
    /// tag), the lane's consumed messages plus the receives that could match it (see
    /// [`crate::engine::p2p_flow`]).
    pub(super) fn solicit(&mut self, gid: GroupId) {
        let Some(g) = self.groups.get_mut(&gid) else {
            return;
        };
        if g.p2p_posted.is_empty() {
            return;
        }
        // Per lane: receives waiting, and whether one of them is above the eager limit (keys
        // of this rank's own receives).
        let limit = g.p2p_flow.eager_limit();
        let mut named: FastMap<(usize, u32), (u64, bool)> = FastMap::default();
        let mut any: FastMap<u32, (u64, bool)> = FastMap::default();
        for rid in &g.p2p_posted {
            if let Some(PendingCall {
                state: State::Recv { src, tag, spec },
                ..
            }) = self.ops.get(rid).map(|b| &**b)
            {
                let big = spec
                    .numel()
                    .ok()
                    .and_then(|n| n.checked_mul(spec.dtype.size()))
                    .is_none_or(|b| b as u64 > limit);
                let e = match src {
                    Some(s) => named.entry((*s, *tag)).or_insert((0, false)),
                    None => any.entry(*tag).or_insert((0, false)),
                };
                e.0 += 1;
                e.1 |= big;
            }
        }
        let me = g.info.rank;
        let mut lanes = named;
        for (&tag, &(n, big)) in &any {
            for peer in (0..g.info.size()).filter(|&p| p != me) {
                let e = lanes.entry((peer, tag)).or_insert((0, false));
                e.0 += n;
                e.1 |= big;
            }
        }
        let mut out = Vec::new();
        for ((peer, tag), (waiting, big)) in lanes {
            let consumed = g.p2p_recv_seq.get(&(peer, tag)).copied().unwrap_or(0);
            g.p2p_flow
                .solicit(peer, tag, consumed.saturating_add(waiting), big, &mut out);
        }
        self.emit_p2p(gid, out);
    }

    /// A point-to-point message from group-local `src` on `tag`, the `seq`th of its lane:
    /// a replay, an eager message above the eager limit or one beyond the window aborts the
    /// group; otherwise it is stored and matched with the receives posted.
    pub(super) fn on_p2p(
        &mut self,
        gid: GroupId,
        src: usize,
        tag: u32,
        seq: u64,
        eager: bool,
        msg: Message,
    ) {
        if self.p2p_replayed(gid, src, tag, seq, msg.src) {
            return;
        }
        let Some(g) = self.groups.get_mut(&gid) else {
            return;
        };
        let bytes: u64 = msg.payload.iter().map(|b| b.len() as u64).sum();
        if eager && bytes > g.p2p_flow.eager_limit() {
            // A conforming peer sends a message this large only when asked for it.
            let err = Error::Protocol {
                rank: msg.src,
                detail: ProtocolError::Budget {
                    seq,
                    bytes,
                    budget: g.p2p_flow.eager_limit(),
                },
            };
            self.abort(gid, err, None, true);
            return;
        }
        if !g.p2p_flow.admit(src, tag, seq, eager) {
            let err = Error::Protocol {
                rank: msg.src,
                detail: ProtocolError::Window { seq },
            };
            self.abort(gid, err, None, true);
            return;
        }
        self.store_p2p(gid, (src, tag, seq), msg, false);
    }

    /// Whether message `seq` of the lane from group rank `src` on `tag` was consumed
    /// already or is here already: a replay (or a group that is gone), never stored twice
    /// (it would also count twice against the window). A replay aborts the group, naming
    /// global rank `from`.
    fn p2p_replayed(&mut self, gid: GroupId, src: usize, tag: u32, seq: u64, from: usize) -> bool {
        let Some(g) = self.groups.get(&gid) else {
            return true;
        };
        let consumed = g.p2p_recv_seq.get(&(src, tag)).copied().unwrap_or(0);
        if seq < consumed || g.p2p_arrived.contains_key(&(src, tag, seq)) {
            let err = Error::Protocol {
                rank: from,
                detail: ProtocolError::Duplicate { seq, tag },
            };
            self.abort(gid, err, None, true);
            return true;
        }
        false
    }

    /// Stores an arrived point-to-point message under `key` (source, tag, lane sequence
    /// number) in arrival order, marks it as read from a mailbox when it was (its
    /// consumption frees a slot), and matches the receives posted.
    fn store_p2p(&mut self, gid: GroupId, key: (usize, u32, u64), msg: Message, via_mail: bool) {
        let n = self.arrivals;
        self.arrivals += 1;
        if let Some(g) = self.groups.get_mut(&gid) {
            g.p2p_arrived.insert(key, (n, msg));
            if via_mail {
                g.p2p_mail.insert(key, ());
            }
        }
        self.match_p2p(gid);
    }

    /// Matches posted point-to-point receives of group `gid` with arrived messages, in FIFO
    /// order per (source, tag); a receive from any source takes the earliest arrival.
    pub(super) fn match_p2p(&mut self, gid: GroupId) {
        loop {
            let Some(g) = self.groups.get(&gid) else {
                return;
            };
            let mut found = None;
            for &rid in &g.p2p_posted {
                let Some(PendingCall {
                    state: State::Recv { src, tag, .. },
                    ..
                }) = self.ops.get(&rid).map(|b| &**b)
                else {
                    continue;
                };
                let best = g
                    .p2p_arrived
                    .iter()
                    .filter(|((s, t, q), _)| {
                        *t == *tag
                            && src.is_none_or(|want| want == *s)
                            && *q == g.p2p_recv_seq.get(&(*s, *t)).copied().unwrap_or(0)
                    })
                    .min_by_key(|(_, (n, _))| *n)
                    .map(|(k, _)| *k);
                if let Some(k) = best {
                    found = Some((rid, k));
                    break;
                }
            }
            let Some((rid, key)) = found else {
                return;
            };
            let Some(msg) = self.consume_p2p(gid, key) else {
                return;
            };
            let Some(g) = self.groups.get_mut(&gid) else {
                return;
            };
            g.p2p_posted.retain(|&p| p != rid);
            let Some(op) = self.ops.remove(&rid) else {
                return;
            };
            let State::Recv { spec, .. } = &op.state else {
                return;
            };
            let spec = spec.clone();
            match self.received(key.0, msg, &spec, op.fp) {
                Ok(result) => self.events.push_back(Event { op: rid, result }),
                Err(Some(err)) => {
                    let err = self.mismatch(gid, None, op.fp, err.0, err.1);
                    self.ops.insert(rid, op);
                    self.abort(gid, err.clone(), Some((rid, err)), true);
                    return;
                }
                Err(None) => return,
            }
        }
    }

    /// Takes arrived message `key` of group `gid` off the group's record as consumed: the
    /// lane's count goes up, and its flow control (or its mailbox) hears of it.
    fn consume_p2p(&mut self, gid: GroupId, key: (usize, u32, u64)) -> Option<Message> {
        let g = self.groups.get_mut(&gid)?;
        let (_, msg) = g.p2p_arrived.remove(&key)?;
        let consumed = g.p2p_recv_seq.entry((key.0, key.1)).or_insert(0);
        *consumed += 1;
        if g.p2p_mail.remove(&key).is_some() {
            // Its slot in the sender's mailbox may be written again.
            self.mail_freed.push((gid, key.0));
            return Some(msg);
        }
        let eager = matches!(msg.header, Header::P2p { eager: true, .. });
        let mut out = Vec::new();
        g.p2p_flow.on_consume(key.0, eager, &mut out);
        self.emit_p2p(gid, out);
        Some(msg)
    }

    /// What a receive of `spec` (fingerprint `ours`) gets from `msg`, the message of group
    /// rank `src` it matched: the result, or `Err(Some((sender, its fingerprint)))` when the
    /// two calls do not match (`Err(None)`: not a point-to-point message).
    #[allow(clippy::type_complexity)]
    fn received(
        &self,
        src: usize,
        msg: Message,
        spec: &TensorSpec,
        ours: Fingerprint,
    ) -> std::result::Result<Result<Output>, Option<(usize, Fingerprint)>> {
        let Header::P2p {
            dtype, count, path, ..
        } = msg.header
        else {
            return Err(None);
        };
        let theirs = Fingerprint {
            path,
            ..p2p_fp(OpKind::Send, dtype, count)
        };
        if dtype != spec.dtype
            || Some(count) != spec.numel().ok().map(|n| n as u64)
            || path != ours.path
        {
            return Err(Some((msg.src, theirs)));
        }
        if path == DataPath::Nccl {
            // A ticket: the data follows on NCCL; the receiver gets the ticket's bytes.
            let ticket = msg.payload.concat();
            return Ok(if ticket.len() <= TICKET_MAX {
                Ok(Output::Received {
                    tensor: Tensor::from_vec(ticket),
                    src,
                })
            } else {
                Err(Error::Protocol {
                    rank: msg.src,
                    detail: ProtocolError::Length {
                        part: 0,
                        expected: TICKET_MAX as u64,
                        got: ticket.len() as u64,
                    },
                })
            });
        }
        Ok(
            match msg
                .payload
                .into_iter()
                .next()
                .map(|b| validate_storage(b, dtype))
            {
                Some(Ok(b)) if b.len() as u64 == count * dtype.size() as u64 => {
                    Ok(Output::Received {
                        tensor: Tensor::from_parts(b, dtype, spec.shape.clone()),
                        src,
                    })
                }
                _ => Err(Error::Protocol {
                    rank: msg.src,
                    detail: ProtocolError::InvalidElements { dtype },
                }),
            },
        )
    }

    /// The lane sequence number of this rank's send to group rank `dst` on `tag` that goes
    /// through the group's mailbox ([`crate::board::mail`]) instead of the engine's
    /// transports, drawn as the engine draws a send's: the call is done (buffered, as an
    /// eager send). `None` when the send must go through the engine, which makes its
    /// outcome: the rank is closing, the group is not one of its groups or was aborted, a
    /// member left it, or `dst` is this rank or no member.
    pub fn p2p_mail_seq(&mut self, group: GroupId, dst: usize, tag: u32) -> Option<u64> {
        if self.closing.is_some() {
            return None;
        }
        let g = self.groups.get_mut(&group)?;
        if g.aborted.is_some() || !g.left.is_empty() || dst >= g.info.size() || dst == g.info.rank {
            return None;
        }
        let s = g.p2p_send_seq.entry((dst, tag)).or_insert(0);
        let q = *s;
        *s += 1;
        Some(q)
    }

    /// A message of group rank `src` read from its mailbox ([`crate::board::mail`]): stored
    /// and matched as a message from a transport, outside the eager window (the mailbox
    /// bounds what it holds); its consumption frees its slot (`take_mail_freed`). A replay
    /// of a lane's message aborts the group, as from a transport.
    pub fn on_p2p_mail(&mut self, group: GroupId, src: usize, mail: crate::board::mail::Mail) {
        let Some(g) = self.groups.get_mut(&group) else {
            return;
        };
        if src >= g.info.size() {
            return;
        }
        let crate::board::mail::Mail {
            tag,
            seq,
            dtype,
            bytes,
        } = mail;
        let count = (bytes.len() / dtype.size()) as u64;
        let msg = Message {
            src: g.info.global(src),
            header: Header::P2p {
                group,
                tag,
                seq,
                dtype,
                count,
                eager: false,
                path: DataPath::Engine,
            },
            payload: vec![Bytes::from(bytes)],
        };
        if self.p2p_replayed(group, src, tag, seq, msg.src) {
            return;
        }
        self.store_p2p(group, (src, tag, seq), msg, true);
    }

    /// A receive of `spec` from group rank `src` on `tag` that the message already here
    /// completes now, without a pending call: its result, or `None` when the receive must be
    /// posted as any (the lane's next message is not here, a receive posted before could
    /// take it, the group was aborted or a member left, or the rank is closing). A message
    /// that does not match the receive aborts the group, as a posted receive's would, and
    /// is the receive's error.
    pub fn p2p_take(
        &mut self,
        group: GroupId,
        src: usize,
        tag: u32,
        spec: &TensorSpec,
    ) -> Option<Result<Output>> {
        if self.closing.is_some() {
            return None;
        }
        let g = self.groups.get(&group)?;
        if g.aborted.is_some() || !g.left.is_empty() || !g.p2p_posted.is_empty() {
            return None;
        }
        let next = g.p2p_recv_seq.get(&(src, tag)).copied().unwrap_or(0);
        let key = (src, tag, next);
        if !g.p2p_arrived.contains_key(&key) {
            return None;
        }
        let ours = p2p_fp(OpKind::Recv, spec.dtype, spec.numel().ok()? as u64);
        let msg = self.consume_p2p(group, key)?;
        match self.received(src, msg, spec, ours) {
            Ok(r) => Some(r),
            Err(Some((peer, theirs))) => {
                let err = self.mismatch(group, None, ours, peer, theirs);
                self.abort(group, err.clone(), None, true);
                Some(Err(err))
            }
            Err(None) => None,
        }
    }

    /// Group rank `e.member`'s mailbox held something that is not a message: the group is
    /// aborted with a protocol error naming it, and every member is told.
    pub fn mail_broken(&mut self, group: GroupId, e: &crate::board::BoardError) {
        let Some(g) = self.groups.get(&group) else {
            return;
        };
        let err = Error::Protocol {
            rank: g.info.global(e.member),
            detail: ProtocolError::Malformed(e.to_string()),
        };
        self.abort(group, err, None, true);
    }

    /// The (group, sender) of each message through a mailbox consumed since the last call,
    /// one entry per message, moved into `out`.
    pub fn take_mail_freed(&mut self, out: &mut Vec<(GroupId, usize)>) {
        out.append(&mut self.mail_freed);
    }
}
