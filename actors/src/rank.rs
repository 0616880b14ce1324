//! The rank actor: a thin driver of one [`Engine`]. Handlers feed the engine; [`RankActor::drive`]
//! drains its outputs to the transport, the waiting callers and one timer. No protocol
//! decision is made here.

use crate::transport::{Deliver, Transport};
use crate::work::Done;
use actix::{Actor, AsyncContext, Context, Handler, Message as ActixMessage, SpawnHandle};
use collectix_runtime::{Engine, GroupId, GroupInfo, OpId, Output, Plan, Time};
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
/// afterwards, and acknowledge. Sent to every rank before any rank stops, so that no rank
/// mistakes a peer's orderly stop for a lost peer.
#[derive(ActixMessage)]
#[rtype(result = "()")]
pub(crate) struct Quiesce(pub(crate) std::sync::mpsc::Sender<()>);

/// Installs the transport (once every peer's address is known).
#[derive(ActixMessage)]
#[rtype(result = "()")]
pub(crate) struct SetTransport(pub(crate) Box<dyn Transport>);

/// One rank: its engine, its transport, the callers waiting on it, and its timer.
pub(crate) struct RankActor {
    engine: Engine,
    transport: Option<Box<dyn Transport>>,
    waiting: HashMap<OpId, Done<Output>>,
    origin: Instant,
    timer: Option<(Time, SpawnHandle)>,
    /// Messages sent before the transport was installed.
    backlog: Vec<(usize, collectix_runtime::message::Message)>,
    /// Set by [`Quiesce`]: the world is shutting down.
    quiesced: bool,
}

impl RankActor {
    pub(crate) fn new(rank: usize, world: GroupInfo, origin: Instant) -> Self {
        let mut engine = Engine::new(rank);
        engine.add_group(world, Time::ZERO);
        RankActor {
            engine,
            transport: None,
            waiting: HashMap::new(),
            origin,
            timer: None,
            backlog: Vec::new(),
            quiesced: false,
        }
    }

    fn now(&self) -> Time {
        Time::from_nanos(u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX))
    }

    /// Drains the engine: messages out, results to callers, the timer re-armed.
    fn drive(&mut self, ctx: &mut Context<Self>) {
        loop {
            let mut progressed = false;
            while let Some(t) = self.engine.poll_transmit() {
                progressed = true;
                match &mut self.transport {
                    None => self.backlog.push((t.dst, t.msg)),
                    Some(tr) => {
                        if let Err(gone) = tr.send(t.dst, t.msg) {
                            let now = self.now();
                            self.engine.handle_peer_lost(gone.0, now);
                        }
                    }
                }
            }
            while let Some(ev) = self.engine.poll_event() {
                progressed = true;
                if let Some(done) = self.waiting.remove(&ev.op) {
                    done(ev.result);
                }
            }
            if !progressed {
                break;
            }
        }
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
            (m.done)(Err(collectix_runtime::Error::Shutdown));
            return;
        }
        let now = self.now();
        let id = self.engine.submit(m.group, m.seq, m.plan, now);
        self.waiting.insert(id, m.done);
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
        self.engine.handle_message(m.0, now);
        self.drive(ctx);
    }
}

impl Handler<Quiesce> for RankActor {
    type Result = ();
    fn handle(&mut self, m: Quiesce, ctx: &mut Context<Self>) {
        // Every rank of the world stops together, so nobody is left to take what flow control
        // holds, and no linger is needed: each rank's waiting calls fail with `Shutdown`. (A
        // rank of a multi-process job that stops alone lingers instead: `Engine::shutdown`.)
        self.quiesced = true;
        for (_, done) in self.waiting.drain() {
            done(Err(collectix_runtime::Error::Shutdown));
        }
        if let Some((_, h)) = self.timer.take() {
            ctx.cancel_future(h);
        }
        let _ = m.0.send(());
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

impl Handler<SetTransport> for RankActor {
    type Result = ();
    fn handle(&mut self, m: SetTransport, ctx: &mut Context<Self>) {
        let mut tr = m.0;
        for (dst, msg) in std::mem::take(&mut self.backlog) {
            if let Err(gone) = tr.send(dst, msg) {
                let now = self.now();
                self.engine.handle_peer_lost(gone.0, now);
            }
        }
        self.transport = Some(tr);
        self.drive(ctx);
    }
}
