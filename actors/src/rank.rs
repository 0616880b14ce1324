//! The rank actor: a thin driver of one [`Engine`]. Handlers feed the engine; [`RankActor::drive`]
//! drains its outputs to the transport, the waiting callers and one timer. No protocol
//! decision is made here.

use crate::transport::{Deliver, Flush, Links, PeerLost};
use crate::work::Done;
use actix::{Actor, AsyncContext, Context, Handler, Message as ActixMessage, SpawnHandle};
use collectix_runtime::wire::Message;
use collectix_runtime::wire::Outbox;
use collectix_runtime::{Engine, Error, GroupId, GroupInfo, OpId, Output, Plan, Time};
use std::collections::HashMap;
use std::time::Instant;

/// Starts a call on the rank.
#[derive(ActixMessage)]
#[rtype(result = "()")]
pub(crate) struct Submit {
    pub(crate) group: GroupId,
    pub(crate) seq: u64,
    pub(crate) plan: Plan,
    pub(crate) done: Done<Output>,
}

/// Registers a group on the rank.
#[derive(ActixMessage)]
#[rtype(result = "()")]
pub(crate) struct AddGroup(pub(crate) GroupInfo);

/// The world is shutting down: fail every waiting call with `Shutdown`, ignore what comes
/// afterwards, and acknowledge with the rank's pending errors (failures of its groups that
/// no call of this rank returned). Sent to every rank before any rank stops, so that no rank
/// mistakes a peer's orderly stop for a lost peer.
#[derive(ActixMessage)]
#[rtype(result = "()")]
pub(crate) struct Quiesce(pub(crate) std::sync::mpsc::Sender<(usize, Vec<Error>)>);

/// This rank leaves a multi-process job: its calls still waiting fail with `Shutdown`, its
/// peers in calls with it are told, and what flow control holds for peers goes on being sent
/// as they grant credit, for at most `linger` (`Engine::shutdown`). `done` gets the rank's
/// pending errors once nothing is left to send.
#[derive(ActixMessage)]
#[rtype(result = "()")]
pub(crate) struct Leave {
    pub(crate) linger: std::time::Duration,
    pub(crate) done: std::sync::mpsc::Sender<Vec<Error>>,
}

/// Releases a group on this rank (`Communicator::destroy`); `done` gets its pending error.
#[derive(ActixMessage)]
#[rtype(result = "()")]
pub(crate) struct Destroy {
    pub(crate) group: GroupId,
    pub(crate) done: Done<()>,
}

/// Installs the rank's links (once every peer's address is known).
#[derive(ActixMessage)]
#[rtype(result = "()")]
pub(crate) struct SetLinks(pub(crate) Links);

/// A caller waiting for a call: where the result goes, the call's `tracing` span and when it
/// started.
struct Waiting {
    done: Done<Output>,
    span: tracing::Span,
    start: Instant,
}

impl Waiting {
    /// Hands the result over and closes the span with the outcome and duration.
    fn finish(self, result: collectix_runtime::Result<Output>) {
        let micros = u64::try_from(self.start.elapsed().as_micros()).unwrap_or(u64::MAX);
        match &result {
            Ok(_) => tracing::debug!(parent: &self.span, micros, "call completed"),
            Err(e) => tracing::warn!(parent: &self.span, micros, error = %e, "call failed"),
        }
        (self.done)(result);
    }
}

/// One rank: its engine, its transport, the callers waiting on it, and its timer.
pub(crate) struct RankActor {
    engine: Engine,
    /// One link per global rank, with the messages it refused waiting in front of it.
    links: Option<(Links, Vec<Outbox<Message>>)>,
    /// Callers waiting, each with its call's span (closed with the outcome) and start.
    waiting: HashMap<OpId, Waiting>,
    origin: Instant,
    timer: Option<(Time, SpawnHandle)>,
    /// Messages sent before the links were installed.
    backlog: Vec<(usize, Message)>,
    /// Set by [`Quiesce`]: the world is shutting down.
    quiesced: bool,
    /// Set by [`Leave`]: the rank's pending errors, and who waits for the rank to be drained.
    leaving: Option<(Vec<Error>, std::sync::mpsc::Sender<Vec<Error>>)>,
}

impl RankActor {
    pub(crate) fn new(rank: usize, world: GroupInfo, origin: Instant) -> Self {
        let mut engine = Engine::new(rank);
        engine.add_group(world, Time::ZERO);
        RankActor {
            engine,
            links: None,
            waiting: HashMap::new(),
            origin,
            timer: None,
            backlog: Vec::new(),
            quiesced: false,
            leaving: None,
        }
    }

    /// A leaving rank with nothing left to send (in the engine or in front of a link) says so.
    fn check_left(&mut self) {
        let outboxes_empty = self
            .links
            .as_ref()
            .is_none_or(|(_, o)| o.iter().all(Outbox::is_empty));
        if self.leaving.is_some() && self.engine.is_drained() && outboxes_empty {
            if let Some((pending, done)) = self.leaving.take() {
                let _ = done.send(pending);
            }
        }
    }

    fn now(&self) -> Time {
        Time::from_nanos(u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX))
    }

    /// Sends `msg` to global rank `dst` through its link (or its outbox, if the link would
    /// block); a link that is gone is a lost peer.
    fn send(&mut self, dst: usize, msg: Message) {
        let Some((links, outboxes)) = &mut self.links else {
            return;
        };
        let sent = match (links.get_mut(dst), outboxes.get_mut(dst)) {
            (Some(link), Some(outbox)) => outbox.send(link.as_mut(), msg).is_ok(),
            _ => false,
        };
        if !sent {
            let now = self.now();
            self.engine.handle_peer_lost(dst, now);
        }
    }

    /// Drains the engine: messages out, results to callers, the timer re-armed.
    fn drive(&mut self, ctx: &mut Context<Self>) {
        loop {
            let mut progressed = false;
            while let Some(t) = self.engine.poll_transmit() {
                progressed = true;
                if self.links.is_none() {
                    self.backlog.push((t.dst, t.msg));
                } else {
                    self.send(t.dst, t.msg);
                }
            }
            while let Some(ev) = self.engine.poll_event() {
                progressed = true;
                if let Some(w) = self.waiting.remove(&ev.op) {
                    w.finish(ev.result);
                }
            }
            if !progressed {
                break;
            }
        }
        self.check_left();
        let next = self.engine.poll_timeout();
        if self.timer.as_ref().map(|t| t.0) != next {
            if let Some((_, h)) = self.timer.take() {
                ctx.cancel_future(h);
            }
            if let Some(at) = next {
                let delay = at.saturating_since(self.now());
                let h = ctx.run_later(delay, |act, ctx| {
                    act.timer = None;
                    let now = act.now();
                    act.engine.handle_timeout(now);
                    act.drive(ctx);
                });
                self.timer = Some((at, h));
            }
        }
    }
}

impl Actor for RankActor {
    type Context = Context<Self>;
}

impl Handler<Submit> for RankActor {
    type Result = ();
    fn handle(&mut self, m: Submit, ctx: &mut Context<Self>) {
        if self.quiesced {
            (m.done)(Err(Error::Shutdown));
            return;
        }
        let fp = m.plan.fingerprint();
        // new_group's agreement step carries a hash of the members where a count would be.
        let count = fp
            .count
            .filter(|_| fp.kind != collectix_runtime::OpKind::NewGroup);
        let span = tracing::debug_span!(
            "call",
            rank = self.engine.rank(),
            group = %m.group,
            seq = tracing::field::Empty,
            op = %fp.kind,
            dtype = %fp.dtype,
            count,
            algorithm = fp.algorithm.map(|a| a.name()),
            bytes = count.map(|c| c.saturating_mul(fp.dtype.size() as u64)),
        );
        if !m.plan.is_p2p() {
            span.record("seq", m.seq);
        }
        let now = self.now();
        let id = self.engine.submit(m.group, m.seq, m.plan, now);
        self.waiting.insert(
            id,
            Waiting {
                done: m.done,
                span,
                start: Instant::now(),
            },
        );
        self.drive(ctx);
    }
}

impl Handler<Deliver> for RankActor {
    type Result = ();
    fn handle(&mut self, m: Deliver, ctx: &mut Context<Self>) {
        if self.quiesced {
            return;
        }
        let now = self.now();
        // The source is the link's, never the message's own claim.
        let mut msg = m.msg;
        msg.src = m.src;
        self.engine.handle_message(msg, now);
        self.drive(ctx);
    }
}

impl Handler<Flush> for RankActor {
    type Result = ();
    fn handle(&mut self, m: Flush, ctx: &mut Context<Self>) {
        let Some((links, outboxes)) = &mut self.links else {
            return;
        };
        let closed = match (links.get_mut(m.0), outboxes.get_mut(m.0)) {
            (Some(link), Some(outbox)) => outbox.flush(link.as_mut()).is_err(),
            _ => false,
        };
        if closed && !self.quiesced {
            let now = self.now();
            self.engine.handle_peer_lost(m.0, now);
            self.drive(ctx);
        }
        self.check_left();
    }
}

impl Handler<Leave> for RankActor {
    type Result = ();
    fn handle(&mut self, m: Leave, ctx: &mut Context<Self>) {
        let pending = self.engine.pending_errors();
        for e in &pending {
            tracing::warn!(rank = self.engine.rank(), error = %e, "pending error at shutdown");
        }
        self.leaving = Some((pending, m.done));
        let now = self.now();
        self.engine.shutdown(now, m.linger);
        self.drive(ctx);
    }
}

impl Handler<PeerLost> for RankActor {
    type Result = ();
    fn handle(&mut self, m: PeerLost, ctx: &mut Context<Self>) {
        if self.quiesced {
            return;
        }
        if let Some((_, outboxes)) = &mut self.links {
            if let Some(o) = outboxes.get_mut(m.0) {
                o.clear();
            }
        }
        let now = self.now();
        self.engine.handle_peer_lost(m.0, now);
        self.drive(ctx);
    }
}

impl Handler<Quiesce> for RankActor {
    type Result = ();
    fn handle(&mut self, m: Quiesce, ctx: &mut Context<Self>) {
        // Every rank of the world stops together, so nobody is left to take what flow control
        // holds, and no linger is needed: each rank's waiting calls fail with `Shutdown`. (A
        // rank of a multi-process job that stops alone lingers instead: `Engine::shutdown`.)
        let pending = self.engine.pending_errors();
        for e in &pending {
            tracing::warn!(rank = self.engine.rank(), error = %e, "pending error at shutdown");
        }
        self.quiesced = true;
        for (_, w) in self.waiting.drain() {
            w.finish(Err(Error::Shutdown));
        }
        if let Some((_, h)) = self.timer.take() {
            ctx.cancel_future(h);
        }
        let _ = m.0.send((self.engine.rank(), pending));
    }
}

impl Handler<Destroy> for RankActor {
    type Result = ();
    fn handle(&mut self, m: Destroy, ctx: &mut Context<Self>) {
        if self.quiesced {
            (m.done)(Err(Error::Shutdown));
            return;
        }
        let result = self.engine.destroy_group(m.group);
        self.drive(ctx);
        (m.done)(result);
    }
}

impl Handler<AddGroup> for RankActor {
    type Result = ();
    fn handle(&mut self, m: AddGroup, ctx: &mut Context<Self>) {
        let now = self.now();
        self.engine.add_group(m.0, now);
        self.drive(ctx);
    }
}

impl Handler<SetLinks> for RankActor {
    type Result = ();
    fn handle(&mut self, m: SetLinks, ctx: &mut Context<Self>) {
        let outboxes = m.0.iter().map(|_| Outbox::default()).collect();
        self.links = Some((m.0, outboxes));
        for (dst, msg) in std::mem::take(&mut self.backlog) {
            self.send(dst, msg);
        }
        self.drive(ctx);
    }
}
