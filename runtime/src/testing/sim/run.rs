//! The run loop: what comes next (a delivery, a detection, a deadline, a retry), and the
//! ways to run until nothing is left.

use super::options::Delivery;
use super::trace::TraceEvent;
use super::Sim;
use crate::time::Time;
use std::time::Duration;

/// Why a simulation did not settle.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SimError {
    /// The step bound was reached with work left (a livelock, or a bound set too low).
    StepBound {
        /// Steps taken.
        steps: usize,
    },
    /// Nothing in flight, calls pending, and no timeout allowed to end them (a deadlock).
    Stuck {
        /// Pending calls per rank.
        pending: Vec<usize>,
    },
}

/// What [`Sim::step`] does next.
enum Next {
    Detect(usize),
    Deadline(Time),
    Deliver(usize),
    /// Retry the links that said "would block".
    Flush(Time),
}

impl Sim {
    /// Whether [`next`](Self::next) has something to do (without drawing a random number).
    fn has_work(&self, deadlines: bool) -> bool {
        self.retry_links.is_some()
            || !self.in_flight.is_empty()
            || !self.detections.is_empty()
            || (deadlines
                && ((0..self.size())
                    .any(|r| !self.dead.contains(&r) && self.engines[r].poll_timeout().is_some())
                    || self.board_deadline().is_some()))
    }

    /// Picks the next event; deadlines only when `deadlines`.
    fn next(&mut self, deadlines: bool) -> Option<Next> {
        self.next_at(deadlines).map(|(_, n)| n)
    }

    /// What comes next, and when (the time is the event's own; under
    /// [`Delivery::AnyOrder`] it may be before the clock).
    fn next_at(&mut self, deadlines: bool) -> Option<(Time, Next)> {
        let detect = self
            .detections
            .iter()
            .enumerate()
            .min_by_key(|(_, d)| (d.at, d.tiebreak))
            .map(|(i, d)| (d.at, Next::Detect(i)));
        let flush = self.retry_links.map(|t| (t, Next::Flush(t)));
        let deadline = if deadlines {
            (0..self.size())
                .filter(|r| !self.dead.contains(r))
                .filter_map(|r| self.engines[r].poll_timeout())
                .chain(self.board_deadline())
                .min()
                .map(|t| (t, Next::Deadline(t)))
        } else {
            None
        };
        match self.opts.delivery {
            Delivery::Timed | Delivery::Fifo => {
                let deliver = self
                    .in_flight
                    .iter()
                    .enumerate()
                    .min_by_key(|(_, f)| (f.at, f.tiebreak))
                    .map(|(i, f)| (f.at, Next::Deliver(i)));
                // On a tie, failures are detected first, then deadlines fire, then messages
                // arrive, then links are retried.
                [detect, deadline, deliver, flush]
                    .into_iter()
                    .enumerate()
                    .filter_map(|(prio, c)| c.map(|(t, n)| (t, prio, n)))
                    .min_by_key(|(t, prio, _)| (*t, *prio))
                    .map(|(t, _, n)| (t, n))
            }
            Delivery::AnyOrder => match detect {
                Some((t, n)) if t <= self.now => Some((t, n)),
                _ if flush.is_some() && (self.in_flight.is_empty() || self.rng.below(4) == 0) => {
                    flush
                }
                _ if !self.in_flight.is_empty() => {
                    let i = self.rng.below(self.in_flight.len());
                    self.in_flight.get(i).map(|f| (f.at, Next::Deliver(i)))
                }
                _ => [detect, deadline]
                    .into_iter()
                    .flatten()
                    .min_by_key(|(t, _)| *t),
            },
        }
    }

    /// Takes the next event (deadlines only when `deadlines`); `false` when there is none.
    fn advance(&mut self, deadlines: bool) -> bool {
        match self.next(deadlines) {
            None => return false,
            Some(Next::Flush(t)) => self.flush_at(t),
            Some(Next::Detect(i)) => self.detect(i),
            Some(Next::Deadline(t)) => self.fire_deadlines(t),
            Some(Next::Deliver(i)) => self.deliver(i),
        }
        // The members' calls on the boards move after every event, as a driver's after
        // every run.
        self.step_boards();
        true
    }

    /// Retries the links that said "would block", at `t`.
    fn flush_at(&mut self, t: Time) {
        self.now = self.now.max(t);
        self.retry_links = None;
        self.flush_links();
        self.schedule_retry();
    }

    /// Carries out detection `i`: its observer learns of the loss (unless it is dead).
    fn detect(&mut self, i: usize) {
        let d = self.detections.swap_remove(i);
        self.now = self.now.max(d.at);
        if !self.dead.contains(&d.observer) {
            self.log(TraceEvent::Detected {
                observer: d.observer,
                lost: d.lost,
            });
            let now = self.now;
            self.engines[d.observer].handle_peer_lost(d.lost, now);
            self.drain(d.observer);
        }
    }

    /// Moves the clock to deadline `t` and fires every rank's deadline due by then.
    fn fire_deadlines(&mut self, t: Time) {
        self.now = self.now.max(t);
        let now = self.now;
        for r in 0..self.size() {
            let due = self.engines[r].poll_timeout().is_some_and(|d| d <= now);
            if due && !self.dead.contains(&r) {
                self.engines[r].handle_timeout(now);
                self.drain(r);
            }
        }
    }

    /// Delivers message `i` of those in flight (drops it when its sender or receiver is lost).
    fn deliver(&mut self, i: usize) {
        let f = self.in_flight.swap_remove(i);
        self.now = self.now.max(f.at);
        let dst = f.t.dst;
        if dst >= self.size() || self.is_lost(dst) || self.is_lost(f.t.msg.src) {
            self.log(TraceEvent::Dropped {
                src: f.t.msg.src,
                dst,
                header: f.t.msg.header,
            });
            return;
        }
        self.log(TraceEvent::Delivered {
            src: f.t.msg.src,
            dst,
            sent: f.sent,
            header: f.t.msg.header.clone(),
            bytes: f.t.msg.payload.iter().map(|b| b.len()).sum(),
        });
        self.watch_delivery(dst, &f.t);
        let now = self.now;
        self.engines[dst].handle_message(f.t.msg, now);
        self.drain(dst);
    }

    /// Takes the next step: delivers a message, tells a rank of a failure, or, when that is
    /// what comes next, moves the clock to the next deadline and fires it. `false` when
    /// nothing is left to do (no message in flight, no detection pending, no call pending
    /// on a rank that is not dead).
    pub fn step(&mut self) -> bool {
        self.advance(true)
    }

    /// Delivers messages, detections and deadlines due within `d` of now (under
    /// [`Delivery::Timed`]), then moves the clock to now + `d`: time passes while a test
    /// makes a rank late.
    pub fn run_for(&mut self, d: Duration) {
        let until = self.now + d;
        loop {
            match self.next_at(true) {
                Some((t, _)) if t <= until => {
                    self.step();
                }
                _ => break,
            }
        }
        self.now = self.now.max(until);
    }

    /// Delivers messages, detections and deadlines until nothing is left (every call on a
    /// rank that is not dead has a result), for at most `max_steps` steps.
    pub fn run(&mut self, max_steps: usize) -> std::result::Result<(), SimError> {
        let mut steps = 0;
        while self.step() {
            steps += 1;
            if steps >= max_steps && self.has_work(true) {
                return Err(SimError::StepBound { steps });
            }
        }
        Ok(())
    }

    /// Delivers what is in flight until nothing is left to deliver, never firing a deadline,
    /// and leaves calls that wait for calls not yet made pending (a driver that submits calls
    /// one at a time settles between them). Fails only at the step bound.
    pub fn settle(&mut self, max_steps: usize) -> std::result::Result<(), SimError> {
        let mut steps = 0;
        while self.advance(false) {
            steps += 1;
            if steps >= max_steps {
                return Err(SimError::StepBound { steps });
            }
        }
        Ok(())
    }

    /// Runs like [`run`](Self::run), but never fires a deadline: fails with
    /// [`SimError::Stuck`] when calls are left on ranks that are neither cut off nor dead
    /// once nothing is in flight. A correct set of calls completes without any timeout.
    pub fn run_no_timeouts(&mut self, max_steps: usize) -> std::result::Result<(), SimError> {
        let mut steps = 0;
        while self.advance(false) {
            steps += 1;
            if steps >= max_steps && self.has_work(false) {
                return Err(SimError::StepBound { steps });
            }
        }
        let stuck = (0..self.size()).any(|r| !self.is_lost(r) && self.pending(r) > 0);
        if stuck {
            return Err(SimError::Stuck {
                pending: (0..self.size()).map(|r| self.pending(r)).collect(),
            });
        }
        Ok(())
    }
}
