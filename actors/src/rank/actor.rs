//! The rank actor: the background driver of one rank's [`Driver`] (see the `driver` module).
//! Callers issue calls on the engine and drive it while they wait; the actor runs it when a
//! transport hands over an arrival that no waiting caller will take ([`Kick`]), owns the
//! rank's one timer, and carries out its shutdown ([`Quiesce`]) and its leaving ([`Leave`]).
//! No protocol decision is made here.

use super::driver::{Driver, Kick};
use actix::{Actor, AsyncContext, Context, Handler, Message as ActixMessage, SpawnHandle};
use collectix_runtime::{Error, Time};
use std::sync::Arc;

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

/// One rank's background driver: its [`Driver`] and its timer.
pub(crate) struct RankActor {
    driver: Arc<Driver>,
    timer: Option<(Time, SpawnHandle)>,
}

impl RankActor {
    pub(crate) fn new(driver: Arc<Driver>) -> Self {
        RankActor {
            driver,
            timer: None,
        }
    }

    /// Arms the timer for `next` if that is earlier than the one armed (a later deadline
    /// leaves the armed timer alone: it fires early and re-arms, which is cheaper than
    /// re-arming on every call).
    fn arm(&mut self, next: Option<Time>, ctx: &mut Context<Self>) {
        let Some(at) = next else { return };
        if self.timer.as_ref().is_some_and(|t| t.0 <= at) {
            return;
        }
        if let Some((_, h)) = self.timer.take() {
            ctx.cancel_future(h);
        }
        let delay = at.saturating_since(self.driver.now());
        let h = ctx.run_later(delay, |act, ctx| {
            act.timer = None;
            let next = act.driver.timeout();
            act.arm(next, ctx);
        });
        self.timer = Some((at, h));
        self.driver.timer_armed(Some(at));
    }
}

impl Actor for RankActor {
    type Context = Context<Self>;

    fn stopped(&mut self, _: &mut Context<Self>) {
        self.driver.stopped();
    }
}

impl Handler<Kick> for RankActor {
    type Result = ();
    fn handle(&mut self, _: Kick, ctx: &mut Context<Self>) {
        let next = self.driver.background();
        self.arm(next, ctx);
    }
}

impl Handler<Leave> for RankActor {
    type Result = ();
    fn handle(&mut self, m: Leave, ctx: &mut Context<Self>) {
        let next = self.driver.leave(m.linger, m.done);
        self.arm(next, ctx);
    }
}

impl Handler<Quiesce> for RankActor {
    type Result = ();
    fn handle(&mut self, m: Quiesce, ctx: &mut Context<Self>) {
        // Every rank of the world stops together, so nobody is left to take what flow control
        // holds, and no linger is needed: each rank's waiting calls fail with `Shutdown`. (A
        // rank of a multi-process job that stops alone lingers instead: `Engine::shutdown`.)
        let pending = self.driver.quiesce();
        for e in &pending {
            tracing::warn!(rank = self.driver.rank(), error = %e, "pending error at shutdown");
        }
        if let Some((_, h)) = self.timer.take() {
            ctx.cancel_future(h);
        }
        self.driver.timer_armed(None);
        let _ = m.0.send((self.driver.rank(), pending));
    }
}
