//! The call interpreter: a collective's schedule run step by step — its sends posted (through
//! flow control), its receives checked and stored, its chunks reduced — until it finishes and
//! its output is assembled ([`super::output`]). Collective messages arrive here too: each is
//! routed to its call, or kept until this rank makes the call, and flow control's credits
//! are answered.

use super::flow::FlowOut;
use super::output::check_payload;
use super::{CollectiveState, Engine, Event, Finishing, OpId, PendingCall, State};
use crate::collective::Share;
use crate::data_plane::DataPlane;
use crate::error::{Error, ProtocolError};
use crate::ids::Fingerprint;
use crate::ids::GroupId;
use crate::schedule::Action;
use crate::tensor::reduce::ReduceOp;
use crate::time::Time;
use crate::wire::message::{Header, Message, Transmit};
use bytes::Bytes;

impl Engine {
    /// Starts collective call `id` (its op is `op`, in state [`State::Collective`]): registers
    /// its sequence number, delivers what arrived for it early, and runs it as far as it can
    /// go.
    pub(super) fn submit_collective(&mut self, id: OpId, op: PendingCall, now: Time) {
        let (group, seq) = (op.group, op.seq.unwrap_or_default());
        let Some(g) = self.groups.get_mut(&group) else {
            return;
        };
        if g.active.contains_key(&seq) || g.done.contains(seq) || seq < g.forgotten_below {
            // The communicator takes sequence numbers in order; a reused one is a driver bug.
            let e = Error::internal(format!(
                "sequence number {seq} of group {group} was already used"
            ));
            self.events.push_back(Event {
                op: id,
                result: Err(e),
            });
            return;
        }
        if g.failed.contains_key(&seq) {
            // A member's part of this call failed before it started: so does this one.
            if let Some(e) = self.failed_elsewhere(group, seq) {
                self.events.push_back(Event {
                    op: id,
                    result: Err(e),
                });
            }
            return;
        }
        g.active.insert(seq, id);
        g.lateness.issued(seq, now);
        let mut out = Vec::new();
        g.flow.on_made(seq, &mut out);
        let early = g.unexpected.remove(&seq).unwrap_or_default();
        self.ops.insert(id, Box::new(op));
        self.emit(group, out);
        for m in early {
            if self.ops.contains_key(&id) {
                self.deliver(id, m);
            } else {
                // The call already finished (or failed): what is left is checked like any
                // late message (a duplicate is a protocol error, never dropped).
                self.handle_message(m, now);
            }
        }
        if self.ops.contains_key(&id) {
            self.progress(id);
        }
    }

    /// A collective message from group-local `src` for call `seq` (whose fingerprint, at the
    /// sender, is `call`): beyond the window it aborts the group; otherwise it credits its
    /// sender's call and goes to the call if this rank has it in flight, aborts the group if
    /// the call is done (a stale message, or a mismatch), is dropped if the call is
    /// forgotten, and waits for the call (within the peer's byte budget) if it is not made
    /// yet.
    pub(super) fn on_data(
        &mut self,
        gid: GroupId,
        src: usize,
        seq: u64,
        call: Fingerprint,
        msg: Message,
    ) {
        let Some(g) = self.groups.get_mut(&gid) else {
            return;
        };
        if !g.flow.admits(seq) {
            // A conforming peer never sends beyond the window it was granted.
            let err = Error::Protocol {
                rank: msg.src,
                detail: ProtocolError::Window { seq },
            };
            self.abort(gid, err, None, true);
            return;
        }
        // A message of call `seq` shows that the peer has made that call: an implicit
        // credit, which releases what this rank holds for it without a round trip.
        let mut out = Vec::new();
        g.flow.on_credit(src, seq.saturating_add(1), &mut out);
        if !out.is_empty() {
            self.emit(gid, out);
        }
        let Some(g) = self.groups.get_mut(&gid) else {
            return;
        };
        if let Some(&id) = g.active.get(&seq) {
            self.deliver(id, msg);
        } else if let Some(&ours) = g.board.get(&seq) {
            // This rank runs the call on the board, which sends no messages: the sender is in
            // another call.
            let err = self.mismatch(gid, Some(seq), ours, msg.src, call);
            self.abort(gid, err, None, true);
        } else if let Some(entry) = g.done.entry(seq) {
            let Some(ours) = entry else {
                // The call failed on a member before it started: its late messages go.
                return;
            };
            let err = if ours == call {
                Error::Protocol {
                    rank: msg.src,
                    detail: ProtocolError::Stale { seq },
                }
            } else {
                self.mismatch(gid, Some(seq), ours, msg.src, call)
            };
            self.abort(gid, err, None, true);
        } else if seq < g.forgotten_below {
            tracing::warn!(rank = self.rank, seq, group = %gid, "message for a forgotten call dropped");
        } else {
            let bytes = msg.payload.iter().map(|b| b.len() as u64).sum();
            if let Err(total) = g.flow.early(src, seq, bytes) {
                // A conforming peer waits for this rank's call beyond its budget.
                let err = Error::Protocol {
                    rank: msg.src,
                    detail: ProtocolError::Budget {
                        seq,
                        bytes: total,
                        budget: g.flow.budget(),
                    },
                };
                self.abort(gid, err, None, true);
                return;
            }
            g.unexpected.entry(seq).or_default().push(msg);
        }
    }

    /// Routes a collective message to call `id`, checking it first.
    pub(super) fn deliver(&mut self, id: OpId, msg: Message) {
        let Some((gid, fp)) = self.ops.get(&id).map(|op| (op.group, op.fp)) else {
            return;
        };
        let Header::Data { tag, call, seq, .. } = msg.header else {
            return;
        };
        if call != fp {
            let err = self.mismatch(gid, Some(seq), fp, msg.src, call);
            self.abort(gid, err.clone(), Some((id, err)), true);
            return;
        }
        let Some(src) = self.groups.get(&gid).and_then(|g| g.info.local(msg.src)) else {
            return;
        };
        let dtype = fp.dtype;
        let Some(State::Collective(c)) = self.ops.get_mut(&id).map(|op| &mut op.state) else {
            return;
        };
        let checked = match c.expected(src, tag) {
            None => Err(ProtocolError::UnexpectedTag { seq, tag }),
            Some(_) if c.inbox.contains_key(&(src, tag)) => {
                Err(ProtocolError::Duplicate { seq, tag })
            }
            Some(chunks) => check_payload(msg.payload, &c.sched.layout.chunk_elems[chunks], dtype),
        };
        match checked {
            Ok(parts) => {
                c.inbox.insert((src, tag), parts);
                self.progress(id);
            }
            // In a call whose fingerprint carries no count (each rank states its own sizes,
            // as all_to_all's splits), a payload of another size is a disagreement between
            // the two ranks' arguments, not a protocol violation by the sender.
            Err(ProtocolError::Length { expected, got, .. }) if fp.count.is_none() => {
                let err = Error::SizeMismatch {
                    group: gid,
                    seq,
                    call: fp,
                    sender: msg.src,
                    receiver: self.rank,
                    expected,
                    got,
                };
                self.abort(gid, err.clone(), Some((id, err)), true);
            }
            Err(detail) => {
                let err = Error::Protocol {
                    rank: msg.src,
                    detail,
                };
                self.abort(gid, err.clone(), Some((id, err)), true);
            }
        }
    }

    /// Runs call `id` as far as the arrived messages allow.
    pub(super) fn progress(&mut self, id: OpId) {
        loop {
            let Some(op) = self.ops.get_mut(&id) else {
                return;
            };
            let State::Collective(c) = &mut op.state else {
                return;
            };
            let Some(step) = c.sched.steps.get(c.step) else {
                self.finish(id);
                return;
            };
            let Some(g) = self.groups.get_mut(&op.group) else {
                return;
            };
            if !c.posted {
                // The engine's scratch list, so that a step's sends allocate no list.
                let mut out = std::mem::take(&mut self.flow_out);
                for s in &step.sends {
                    let mut payload = Vec::with_capacity(s.chunks.len());
                    for ch in s.chunks.clone() {
                        match &c.chunks[ch] {
                            Some(b) => payload.push(b.clone()),
                            None => {
                                // A schedule bug, not a peer's fault: fail loudly, never hang.
                                let e = Error::internal(format!(
                                    "schedule sends chunk {ch} before it is filled"
                                ));
                                let gid = op.group;
                                self.abort(gid, e.clone(), Some((id, e)), true);
                                return;
                            }
                        }
                    }
                    let header = Header::Data {
                        group: op.group,
                        seq: c.seq,
                        tag: s.tag,
                        call: op.fp,
                    };
                    let dst = g.info.global(s.peer);
                    let bytes = payload.iter().map(|b| b.len() as u64).sum();
                    let t = Transmit {
                        dst,
                        msg: Message {
                            src: self.rank,
                            header,
                            payload,
                        },
                    };
                    g.flow.send(s.peer, c.seq, bytes, t, &mut out);
                }
                c.posted = true;
                let gid = op.group;
                self.emit_from(gid, &mut out);
                self.flow_out = out;
                continue;
            }
            // Arrivals are only taken out of the inbox by the step that receives them, so
            // what was counted ready stays so.
            while let Some(r) = step.recvs.get(c.ready) {
                if !c.inbox.contains_key(&(r.peer, r.tag)) {
                    return;
                }
                c.ready += 1;
            }
            if self.hold_reductions
                && !self.transmits.is_empty()
                && step
                    .recvs
                    .iter()
                    .any(|r| matches!(r.action, Action::Reduce { .. }))
            {
                // Messages wait to leave (this step's sends, or an earlier call's): let them
                // go before reducing; `poll_transmit` resumes this call once they have.
                if !self.reducing.contains(&id) {
                    self.reducing.push_back(id);
                }
                return;
            }
            let received = receive_step(self.plane.as_ref(), c, op.fp, op.reduce);
            let written = match (&received, &mut c.sink) {
                (Ok(()), Some(sink)) => sink.after_step(c.step, &mut c.chunks),
                _ => Ok(()),
            };
            if let Err(e) = received.and(written) {
                let gid = op.group;
                self.abort(gid, e.clone(), Some((id, e)), true);
                return;
            }
            c.step += 1;
            c.posted = false;
            c.ready = 0;
        }
    }

    pub(super) fn finish(&mut self, id: OpId) {
        let Some(op) = self.ops.remove(&id) else {
            return;
        };
        if let (Some(g), Some(seq)) = (self.groups.get_mut(&op.group), op.seq) {
            g.lateness.completed(seq);
        }
        self.forget(&op, id);
        if let (Some(g), Some(seq)) = (self.groups.get_mut(&op.group), op.seq) {
            if let Some(s) = g.done.insert(seq, Some(op.fp)) {
                g.forgotten_below = g.forgotten_below.max(s + 1);
            }
            // The host step of a call on the NCCL path: the call completes with its device
            // operation (`device_done`).
            if op.fp.path == crate::ids::DataPath::Nccl {
                g.device_open.insert(seq);
            }
        }
        match op.state {
            // The output is assembled when the event is polled, after the messages this call
            // (and the run that finished it) queued have been taken: a rank that joins a
            // large output must not hold back the peer waiting for those messages.
            State::Collective(c) => self.finishing.push_back(Finishing {
                op: id,
                coll: c,
                dtype: op.fp.dtype,
                reduce: op.reduce,
                group_size: op.group_size,
            }),
            State::Recv { .. } => self.events.push_back(Event {
                op: id,
                result: Err(Error::internal("receive finished as a collective")),
            }),
        }
    }

    /// Removes a call's traces from its group's indexes.
    pub(super) fn forget(&mut self, op: &PendingCall, id: OpId) {
        if let (Some(seq), State::Collective(c)) = (op.seq, &op.state) {
            if c.landed.is_some() {
                self.landings.forget(op.group, seq);
            }
        }
        if let Some(g) = self.groups.get_mut(&op.group) {
            if let Some(seq) = op.seq {
                if g.active.get(&seq) == Some(&id) {
                    g.active.remove(&seq);
                }
                // A failed call is not judged (a completed one was, just before).
                g.lateness.forget(seq);
            }
            g.p2p_posted.retain(|&p| p != id);
        }
    }

    /// Group-local `src` has made `calls` calls of group `gid` (flow control's credit).
    pub(super) fn on_credit(&mut self, gid: GroupId, src: usize, calls: u64) {
        let Some(g) = self.groups.get_mut(&gid) else {
            return;
        };
        let mut out = Vec::new();
        g.flow.on_credit(src, calls, &mut out);
        self.emit(gid, out);
    }

    /// Group-local `src` asks for credit to send its messages of call `seq` of group `gid`.
    pub(super) fn on_want_credit(&mut self, gid: GroupId, src: usize, seq: u64) {
        let Some(g) = self.groups.get_mut(&gid) else {
            return;
        };
        let mut out = Vec::new();
        g.flow.on_want(src, seq, &mut out);
        self.emit(gid, out);
    }

    /// Sends what the flow control of group `gid` released or asks for.
    pub(super) fn emit(&mut self, gid: GroupId, mut out: Vec<FlowOut<Transmit>>) {
        self.emit_from(gid, &mut out);
    }

    /// [`emit`](Engine::emit), leaving `out` empty (and its allocation for reuse).
    pub(super) fn emit_from(&mut self, gid: GroupId, out: &mut Vec<FlowOut<Transmit>>) {
        let Some(g) = self.groups.get(&gid) else {
            out.clear();
            return;
        };
        for o in out.drain(..) {
            let (dst, header) = match o {
                FlowOut::Send(t) => {
                    self.transmits.push_back(t);
                    continue;
                }
                FlowOut::Ask { peer, seq } => {
                    (g.info.global(peer), Header::WantCredit { group: gid, seq })
                }
                FlowOut::Credit { peer, calls } => {
                    (g.info.global(peer), Header::Credit { group: gid, calls })
                }
            };
            let msg = Message {
                src: self.rank,
                header,
                payload: Vec::new(),
            };
            self.transmits.push_back(Transmit { dst, msg });
        }
    }
}

/// Runs the receives of call `c`'s current step, all of which have arrived: copies,
/// reductions, and folds. A step that reduces several received values into the same chunks
/// folds them in one pass; this rank's folds go into the call's shared output if it has one.
fn receive_step(
    plane: &dyn DataPlane,
    c: &mut CollectiveState,
    fp: Fingerprint,
    rop: Option<ReduceOp>,
) -> Result<(), Error> {
    let Some(step) = c.sched.steps.get(c.step) else {
        return Ok(());
    };
    let dtype = fp.dtype;
    // Never a silent Sum: a schedule that reduces for a call without an op is a bug.
    let rop = || {
        rop.ok_or_else(|| Error::internal(format!("a reduce step in {fp}, which has no reduce op")))
    };
    let empty = || Error::internal("reduce into an empty chunk");
    let to_arena = matches!(&c.arena, Some((_, Share::Folds)));
    let folds = step.recvs.first().is_some_and(|first| {
        (step.recvs.len() > 1 || to_arena)
            && step
                .recvs
                .iter()
                .all(|r| matches!(r.action, Action::Reduce { .. }) && r.chunks == first.chunks)
    });
    if folds {
        let parts: Vec<(Vec<Bytes>, bool)> = step
            .recvs
            .iter()
            .map(|r| {
                let first = matches!(r.action, Action::Reduce { remote_first: true });
                (c.inbox.remove(&(r.peer, r.tag)).unwrap_or_default(), first)
            })
            .collect();
        let chunks = step.recvs.first().map_or(0..0, |r| r.chunks.clone());
        let mut others: Vec<(&[u8], bool)> = Vec::with_capacity(parts.len());
        for (i, ch) in chunks.enumerate() {
            let local = c.chunks[ch].as_ref().ok_or_else(empty)?;
            others.clear();
            others.extend(
                parts
                    .iter()
                    .map(|(p, f)| (p.get(i).map_or(&[][..], |b| &b[..]), *f)),
            );
            let into = match &c.arena {
                Some((a, Share::Folds)) => a.claim(c.output_range(ch, dtype.size())),
                _ => None,
            };
            let new = plane.fold(dtype, rop()?, local, &others, into)?;
            c.chunks[ch] = Some(new);
        }
        return Ok(());
    }
    for r in &step.recvs {
        let parts = c.inbox.remove(&(r.peer, r.tag)).unwrap_or_default();
        for (ch, part) in r.chunks.clone().zip(parts) {
            let new = match (r.action, &c.chunks[ch]) {
                (Action::Copy, _) => part,
                (Action::Reduce { remote_first }, Some(local)) => {
                    let (a, b) = if remote_first {
                        (&part, local)
                    } else {
                        (local, &part)
                    };
                    plane.combine(dtype, rop()?, a, b)?
                }
                (Action::Reduce { .. }, None) => return Err(empty()),
            };
            c.chunks[ch] = Some(new);
        }
    }
    Ok(())
}
