//! The state behind a rank's lock ([`Core`]): its engine, its links and the messages waiting
//! in front of them, and the callers waiting for their calls; a run of the engine feeds it
//! the inbox's arrivals and drains its outputs, and leaves the completions for after the
//! lock ([`After`]).

use super::{Done, LinkTable};
use collectix_runtime::fast_hash::FastMap;
use collectix_runtime::progress::Inbox;
use collectix_runtime::wire::Message;
use collectix_runtime::{Engine, Error, OpId, Output, Result, Time};
use std::sync::mpsc;
use std::time::Instant;

/// A caller waiting for a call: where the result goes, the call's `tracing` span and when it
/// started.
pub(super) struct Waiting {
    pub(super) done: Done<Output>,
    pub(super) span: tracing::Span,
    /// When the call started (`None` when no subscriber records its span: reading the
    /// clock twice per call is a measurable part of a small call).
    pub(super) start: Option<Instant>,
}
impl Waiting {
    /// Hands the result over and closes the span with the outcome and duration.
    pub(super) fn finish(self, result: Result<Output>) {
        Self::log(&self.span, self.start, &result);
        (self.done)(result);
    }

    /// Closes a call's `span` (started at `start`) with its outcome and duration.
    pub(super) fn log(span: &tracing::Span, start: Option<Instant>, result: &Result<Output>) {
        if let Some(start) = start {
            let micros = u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX);
            match result {
                Ok(_) => tracing::debug!(parent: span, micros, "call completed"),
                Err(e) => tracing::warn!(parent: span, micros, error = %e, "call failed"),
            }
        } else if let Err(e) = result {
            tracing::warn!(error = %e, "call failed");
        }
    }
}
/// What a run of the engine leaves to do once the lock is released.
#[derive(Default)]
pub(crate) struct After {
    pub(super) finished: Vec<(Waiting, Result<Output>)>,
    pub(super) refused: Vec<Done<Output>>,
    /// Calls on a board that ended in the run (see `board.rs`).
    pub(super) board: Vec<(Waiting, Result<Output>)>,
    /// The flight record to write out (a call failed): the rank and the text.
    pub(super) dump: Option<(usize, String)>,
}
impl After {
    pub(super) fn complete(self) {
        if let Some((rank, text)) = &self.dump {
            super::recorder::dump(*rank, text);
        }
        for (w, r) in self.finished {
            w.finish(r);
        }
        for done in self.refused {
            done(Err(Error::Shutdown));
        }
        for (w, r) in self.board {
            w.finish(r);
        }
    }
}
/// The state behind the rank's lock.
pub(crate) struct Core {
    pub(crate) engine: Engine,
    /// The rank's links, with the messages they refused waiting in front of them.
    pub(super) links: Option<LinkTable>,
    /// Callers waiting, each with its call's span (closed with the outcome) and start.
    pub(super) waiting: FastMap<OpId, Waiting>,
    /// Messages sent before the links were installed.
    pub(super) backlog: Vec<(usize, Message)>,
    /// The world is shutting down: arrivals are dropped and calls refused.
    pub(super) quiesced: bool,
    /// Set when the rank leaves its job: its pending errors, and who waits for it to drain.
    pub(super) leaving: Option<(Vec<Error>, mpsc::Sender<Vec<Error>>)>,
    /// Arrivals taken from the inbox (kept to reuse its allocation).
    pub(super) arrivals: Vec<Message>,
    /// The rank's last calls (the flight recorder).
    pub(super) recorder: super::recorder::Recorder,
    /// Whether the last call to end failed (the record is written out once per run of
    /// failures).
    pub(super) failing: bool,
    /// Mailbox messages the engine consumed, whose slots are freed next (kept to reuse its
    /// allocation: `mail.rs`).
    pub(super) mail_freed: Vec<(collectix_runtime::GroupId, usize)>,
}
impl Core {
    /// Sends `msg` to global rank `dst` through its link (or its outbox, if the link would
    /// block); a link that is gone is a lost peer.
    pub(super) fn send(&mut self, dst: usize, msg: Message, now: Time) {
        let Some(links) = &mut self.links else {
            self.backlog.push((dst, msg));
            return;
        };
        if links.send(dst, msg).is_err() {
            self.engine.handle_peer_lost(dst, now);
        }
    }

    /// Drains the engine's outputs: messages to the links, results to `after`. Whether
    /// anything came out.
    pub(super) fn drain(&mut self, now: Time, after: &mut After) -> bool {
        let mut any = false;
        loop {
            let mut progressed = false;
            while let Some(t) = self.engine.poll_transmit() {
                progressed = true;
                self.send(t.dst, t.msg, now);
            }
            while let Some(ev) = self.engine.poll_event() {
                progressed = true;
                let failed = self.recorder.ended(
                    super::recorder::Key::Op(ev.op),
                    now,
                    ev.result.as_ref().err(),
                );
                if failed && !self.failing {
                    let mut text = self.recorder.text(self.engine.rank());
                    text.push_str(&super::recorder::lateness_text(&self.engine));
                    after.dump = Some((self.engine.rank(), text));
                }
                self.failing = failed;
                if let Some(w) = self.waiting.remove(&ev.op) {
                    after.finished.push((w, ev.result));
                }
            }
            if !progressed {
                return any;
            }
            any = true;
        }
    }

    /// Feeds the inbox's arrivals to the engine and drains it, until neither gives more;
    /// `mail` hands every mailbox's messages to the engine, and runs before an arrival that
    /// wants them first ([`Message::wants_mail_first`]: a peer's departure).
    pub(super) fn progress(
        &mut self,
        inbox: &Inbox<Message>,
        now: Time,
        after: &mut After,
        mail: &dyn Fn(&mut Core),
    ) {
        loop {
            // What the engine has to send leaves first: a peer may be waiting for it, and
            // handling the arrivals first would hold it back.
            let drained = self.drain(now, after);
            // An empty inbox is not locked: its lock is the line the peers' pushes write.
            if !inbox.looks_empty() {
                inbox.take(&mut self.arrivals);
            }
            let arrived = !self.arrivals.is_empty();
            let mut arrivals = std::mem::take(&mut self.arrivals);
            if !self.quiesced && arrivals.iter().any(Message::wants_mail_first) {
                mail(self);
            }
            for msg in arrivals.drain(..) {
                if self.quiesced {
                    continue;
                }
                self.engine.handle_message(msg, now);
            }
            self.arrivals = arrivals;
            if !drained && !arrived {
                break;
            }
        }
        self.check_left();
    }

    /// A leaving rank with nothing left to send (in the engine or in front of a link) says so.
    /// (Looked at only while leaving: a run must not cost a look at every peer's outbox.)
    pub(super) fn check_left(&mut self) {
        if self.leaving.is_none() || !self.engine.is_drained() {
            return;
        }
        let outboxes_empty = self.links.as_ref().is_none_or(LinkTable::all_sent);
        if outboxes_empty {
            if let Some((pending, done)) = self.leaving.take() {
                let _ = done.send(pending);
            }
        }
    }
}
