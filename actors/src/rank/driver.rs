//! The hot path every transport shares: a rank's [`Driver`].
//!
//! A rank's [`Engine`] sits behind one lock, in a [`Driver`] that the rank's communicators,
//! its actor and its transports share. Whoever is at hand makes progress:
//! - **a caller** issues its call on the engine itself (no mailbox), and a caller that waits
//!   for a call (`Work::wait`, or the first poll of a `Work` future) drives the rank while it
//!   waits: it takes the rank's arrivals, feeds them to the engine and completes the calls
//!   they finish, spinning for at most the rank's spin budget (`COLLECTIX_SPIN_US`; 50 µs by
//!   default in one process, 200 µs for a rank of a multi-process job, whose messages cross
//!   a writer and a reader thread) before it parks on its call's completion slot;
//! - **the rank's actor** (the background driver) when no caller drives: a transport that
//!   hands over an arrival while nobody drives wakes it, once per burst
//!   ([`collectix_runtime::progress`] holds that protocol, which loom checks). The actor also
//!   owns the rank's timer, its shutdown and its leaving.
//!
//! Every transport delivers the same way, with [`Driver::deliver`]: the in-process links
//! from the sending caller's thread, a TCP connection from its reader thread. So a small
//! all_reduce between two in-process ranks whose callers wait crosses no thread at all.
//!
//! User code (a result's mapping, a future's waker) never runs under the lock: a run of the
//! engine collects the finished calls and completes them once the lock is released, so that
//! code may issue calls on the same rank.

use crate::sync::lock;
use actix::{Message as ActixMessage, Recipient};
use collectix_runtime::fast_hash::FastMap;
use collectix_runtime::progress::{CachePadded, Driving, Inbox};
use collectix_runtime::wire::{Link, Message, Outbox};
use collectix_runtime::{Engine, Error, GroupId, GroupInfo, OpId, Output, Plan, Result, Time};
use std::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex, MutexGuard, OnceLock, TryLockError};
use std::time::{Duration, Instant};

/// Arrivals wait and no caller drives the rank (or the engine wants an earlier timer): the
/// background driver (the rank's actor) runs the engine. Sent once per burst
/// (`collectix_runtime::progress`).
#[derive(ActixMessage)]
#[rtype(result = "()")]
pub(crate) struct Kick;

/// What completes a call: takes the engine's output (boxed so the driver can hold completers
/// of every type in one map; [`Work::pair`](crate::work::Work) makes one).
pub(crate) type Done<I> = Box<dyn FnOnce(Result<I>) + Send>;

/// A rank's links, one per global rank (its own included, unused).
pub(crate) type Links = Vec<Box<dyn Link<Message> + Send>>;

/// How long a waiting caller drives its rank before it parks, unless `COLLECTIX_SPIN_US`
/// says otherwise.
pub(crate) const DEFAULT_SPIN: Duration = Duration::from_micros(50);

/// How long a caller that handed a peer a message while nobody drove that peer looks again
/// before it wakes the peer's actor (at most the spin budget): a peer between two calls
/// takes it itself a moment later.
const GRACE: Duration = Duration::from_micros(20);

/// Spin turns between two yields of a caller whose process has more ranks than cores.
const YIELD_TURNS: u32 = 1;

/// Peers a rank's caller handed messages to while nobody drove them: it owes each an
/// `Inbox::ask_if_unattended` (see `Driver::settle`).
pub(crate) type Owed = Arc<OwedPeers>;

/// The list behind [`Owed`], with a flag that lets the common case (nothing owed) skip the
/// lock. Only the owing rank's own runs push to it, and each run settles what it pushed, so
/// a stale `false` read by another thread's settle never leaves a debt unpaid.
/// On cache lines of its own (the ranks' lists are allocated one after another, and each
/// rank's calls read its flag).
#[derive(Default)]
#[repr(align(128))]
pub(crate) struct OwedPeers {
    any: AtomicBool,
    peers: Mutex<Vec<Arc<Driver>>>,
}

impl OwedPeers {
    /// Records that `peer` is owed a look (once).
    fn push(&self, peer: &Arc<Driver>) {
        let mut o = lock(&self.peers);
        if !o.iter().any(|d| Arc::ptr_eq(d, peer)) {
            o.push(peer.clone());
        }
        self.any.store(true, Ordering::Release);
    }

    /// Moves the peers owed into `out`.
    fn take_into(&self, out: &mut Vec<Arc<Driver>>) {
        if !self.any.load(Ordering::Acquire) {
            return;
        }
        let mut o = lock(&self.peers);
        self.any.store(false, Ordering::Release);
        out.append(&mut o);
    }
}

/// The default spin budget of a rank of a multi-process job: a message over TCP crosses two
/// more threads (the sender's writer, the receiver's reader), each hand-off 20–30 µs on a
/// small VM, so a caller spinning only [`DEFAULT_SPIN`] would park before most answers came.
pub(crate) const DEFAULT_SPIN_TCP: Duration = Duration::from_micros(200);

/// The spin budget from `COLLECTIX_SPIN_US` (microseconds; 0: a waiting caller parks at
/// once and the actor does all the work), or `default`.
pub(crate) fn spin_from_env(default: Duration) -> Duration {
    match std::env::var("COLLECTIX_SPIN_US") {
        Err(_) => default,
        Ok(v) => match v.trim().parse::<u64>() {
            Ok(us) => Duration::from_micros(us.min(1_000_000)),
            Err(_) => {
                tracing::warn!(value = %v, "COLLECTIX_SPIN_US is not a number of microseconds; using the default");
                default
            }
        },
    }
}

/// A caller waiting for a call: where the result goes, the call's `tracing` span and when it
/// started.
pub(crate) struct Waiting {
    done: Done<Output>,
    span: tracing::Span,
    /// When the call started (`None` when no subscriber records its span: reading the
    /// clock twice per call is a measurable part of a small call).
    start: Option<Instant>,
}

impl Waiting {
    /// Hands the result over and closes the span with the outcome and duration.
    fn finish(self, result: Result<Output>) {
        if let Some(start) = self.start {
            let micros = u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX);
            match &result {
                Ok(_) => tracing::debug!(parent: &self.span, micros, "call completed"),
                Err(e) => tracing::warn!(parent: &self.span, micros, error = %e, "call failed"),
            }
        } else if let Err(e) = &result {
            tracing::warn!(error = %e, "call failed");
        }
        (self.done)(result);
    }
}

/// What a run of the engine leaves to do once the lock is released.
#[derive(Default)]
pub(crate) struct After {
    finished: Vec<(Waiting, Result<Output>)>,
    refused: Vec<Done<Output>>,
}

impl After {
    fn complete(self) {
        for (w, r) in self.finished {
            w.finish(r);
        }
        for done in self.refused {
            done(Err(Error::Shutdown));
        }
    }
}

/// The state behind the rank's lock.
pub(crate) struct Core {
    pub(crate) engine: Engine,
    /// One link per global rank, with the messages it refused waiting in front of it.
    links: Option<(Links, Vec<Outbox<Message>>)>,
    /// Callers waiting, each with its call's span (closed with the outcome) and start.
    waiting: FastMap<OpId, Waiting>,
    /// Messages sent before the links were installed.
    backlog: Vec<(usize, Message)>,
    /// The world is shutting down: arrivals are dropped and calls refused.
    quiesced: bool,
    /// Set when the rank leaves its job: its pending errors, and who waits for it to drain.
    leaving: Option<(Vec<Error>, mpsc::Sender<Vec<Error>>)>,
    /// Arrivals taken from the inbox (kept to reuse its allocation).
    arrivals: Vec<Message>,
}

impl Core {
    /// Sends `msg` to global rank `dst` through its link (or its outbox, if the link would
    /// block); a link that is gone is a lost peer.
    fn send(&mut self, dst: usize, msg: Message, now: Time) {
        let Some((links, outboxes)) = &mut self.links else {
            self.backlog.push((dst, msg));
            return;
        };
        let sent = match (links.get_mut(dst), outboxes.get_mut(dst)) {
            (Some(link), Some(outbox)) => outbox.send(link.as_mut(), msg).is_ok(),
            _ => false,
        };
        if !sent {
            self.engine.handle_peer_lost(dst, now);
        }
    }

    /// Drains the engine's outputs: messages to the links, results to `after`. Whether
    /// anything came out.
    fn drain(&mut self, now: Time, after: &mut After) -> bool {
        let mut any = false;
        loop {
            let mut progressed = false;
            while let Some(t) = self.engine.poll_transmit() {
                progressed = true;
                self.send(t.dst, t.msg, now);
            }
            while let Some(ev) = self.engine.poll_event() {
                progressed = true;
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

    /// Feeds the inbox's arrivals to the engine and drains it, until neither gives more.
    fn progress(&mut self, inbox: &Inbox<Message>, now: Time, after: &mut After) {
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
}

/// One rank's engine behind its lock, its inbox, and who drives it (see the module doc).
pub(crate) struct Driver {
    /// On lines of its own: peers touch the `Arc`'s counts and the inbox, never the lock.
    core: CachePadded<Mutex<Core>>,
    inbox: Inbox<Message>,
    /// The background driver: the rank's actor (set once it started), woken with [`Kick`].
    actor: OnceLock<Recipient<Kick>>,
    /// The engine's clock at the rank's start (see [`engine_clock`]).
    origin: Duration,
    /// When the actor's timer fires, in ns since `origin` (`u64::MAX`: not armed).
    timer_at: CachePadded<AtomicU64>,
    /// How long a waiting caller drives the rank before it parks.
    spin: Duration,
    /// Whether a spinning caller yields its core now and then: when the process's ranks
    /// outnumber the cores, the rank it waits for may need that core to run.
    yields: bool,
    /// The rank's actor has stopped: links to this rank are closed.
    closed: AtomicBool,
    /// Times the actor was woken (a statistic for the bench).
    wakeups: CachePadded<AtomicU64>,
    /// Peers this rank's runs handed messages to while nobody drove them.
    owed: Owed,
    /// Callers parked in `Work::wait` on this rank: the background driver's work goes to
    /// one of them before the actor (see [`Driver::sleep_until`]). The fields this rank's
    /// own threads write on every call or wake-up (`bell`, `timer_at`, `wakeups`) sit on
    /// lines of their own, apart from those peers read on every message (`closed`).
    bell: CachePadded<Mutex<Bell>>,
    /// `bell.sleepers`, readable without the lock (see [`Driver::completed`]).
    sleeping: AtomicUsize,
    bell_rung: Condvar,
}

/// The parked callers of a rank, and whether one of them was asked to run it.
#[derive(Default)]
struct Bell {
    sleepers: usize,
    /// A background run was asked for and handed to a sleeper.
    rung: bool,
}

impl Driver {
    /// A rank's driver, its engine holding the world group.
    pub(crate) fn new(
        mut engine: Engine,
        world: GroupInfo,
        spin: Duration,
        yields: bool,
    ) -> Driver {
        engine.add_group(world, Time::ZERO);
        Driver {
            core: CachePadded(Mutex::new(Core {
                engine,
                links: None,
                waiting: FastMap::default(),
                backlog: Vec::new(),
                quiesced: false,
                leaving: None,
                arrivals: Vec::new(),
            })),
            inbox: Inbox::new(),
            actor: OnceLock::new(),
            origin: engine_clock(),
            timer_at: CachePadded(AtomicU64::new(u64::MAX)),
            spin,
            yields,
            closed: AtomicBool::new(false),
            wakeups: CachePadded(AtomicU64::new(0)),
            owed: Arc::default(),
            bell: CachePadded(Mutex::new(Bell::default())),
            sleeping: AtomicUsize::new(0),
            bell_rung: Condvar::new(),
        }
    }

    /// Names the rank's actor, which drives the rank when no caller does.
    pub(crate) fn set_actor(&self, actor: Recipient<Kick>) {
        let _ = self.actor.set(actor);
    }

    /// The global rank.
    pub(crate) fn rank(&self) -> usize {
        lock(&self.core).engine.rank()
    }

    /// How long a waiting caller drives the rank before it parks.
    pub(crate) fn spin(&self) -> Duration {
        self.spin
    }

    pub(crate) fn now(&self) -> Time {
        let since = engine_clock().saturating_sub(self.origin);
        Time::from_nanos(u64::try_from(since.as_nanos()).unwrap_or(u64::MAX))
    }

    /// An arrival from global rank `src` (the link's word for it), from any transport.
    pub(crate) fn deliver(&self, src: usize, mut msg: Message) {
        // The source is the link's, never the message's own claim.
        msg.src = src;
        if self.inbox.push(msg) {
            self.wake_background();
        }
    }

    /// An arrival handed over by a run of a peer rank in this process, which records in
    /// `owed` (the peer's) that it must look again if nobody drives this rank now.
    pub(crate) fn deliver_from_peer(self: &Arc<Self>, src: usize, mut msg: Message, owed: &Owed) {
        msg.src = src;
        if self.inbox.push_deferred(msg) {
            owed.push(self);
        }
    }

    /// An arrival handed over by a connection's reader thread, which looks again for up to
    /// the grace before it wakes the actor if nobody drives this rank now (a caller between
    /// two calls takes it itself a moment later); the next frame waits meanwhile.
    pub(crate) fn deliver_read(&self, src: usize, mut msg: Message) {
        msg.src = src;
        if self.inbox.push_deferred(msg) {
            wait_attended(|| self.inbox.looks_attended(), GRACE.min(self.spin));
            if self.inbox.ask_if_unattended() {
                self.wake_background();
            }
        }
    }

    /// Where this rank's in-process links record the peers it owes a look.
    pub(crate) fn owed(&self) -> Owed {
        self.owed.clone()
    }

    /// Settles what this rank's runs owe its peers: waits up to `grace` for each to be
    /// attended (its caller took the message, or drives), then wakes the actor of any still
    /// unattended.
    fn settle(&self, grace: Duration) {
        let mut owed = Vec::new();
        self.owed.take_into(&mut owed);
        if owed.is_empty() {
            return;
        }
        wait_attended(|| owed.iter().all(|p| p.inbox.looks_attended()), grace);
        Driver::ask_owed(owed);
    }

    /// Asks for a background run of each owed peer still unattended.
    fn ask_owed(owed: Vec<Arc<Driver>>) {
        for p in owed {
            if p.inbox.ask_if_unattended() {
                p.wake_background();
            }
        }
    }

    /// [`settle`](Driver::settle) for a caller that issued a call, which counts as a driver of
    /// its rank from the start of its call (`driving`): peers that hand the rank messages
    /// meanwhile owe it nothing, since this caller takes them before it leaves. While it
    /// waits for its peers to attend, it drives its own rank (takes and runs what arrives).
    /// Two ranks that send to each other between their calls thus never wait on each other
    /// here: each one's arrivals are attended by its own settling caller.
    fn settle_driving(&self, grace: Duration, driving: Driving<'_, Message>) {
        let mut owed: Vec<Arc<Driver>> = Vec::new();
        self.owed.take_into(&mut owed);
        // The common case skips the loop: the peers drive, or took their messages already.
        if !owed.iter().all(|p| p.inbox.looks_attended()) {
            let start = Instant::now();
            let mut turns: u32 = 0;
            loop {
                self.owed.take_into(&mut owed);
                if owed.iter().all(|p| p.inbox.looks_attended()) {
                    break;
                }
                if !self.inbox.looks_empty() {
                    self.try_run_unsettled();
                }
                turns = turns.wrapping_add(1);
                if turns.is_multiple_of(64) && start.elapsed() >= grace {
                    break;
                }
                self.pause(turns);
            }
        }
        if driving.leave() {
            let core = lock(&self.core);
            self.run_with(core, |_, _, _| (), None);
        }
        self.owed.take_into(&mut owed);
        Driver::ask_owed(owed);
    }

    /// A run if nobody holds the rank now, leaving what it owes peers to the caller.
    fn try_run_unsettled(&self) {
        let core = match self.core.try_lock() {
            Ok(c) => c,
            Err(TryLockError::Poisoned(e)) => e.into_inner(),
            Err(TryLockError::WouldBlock) => return,
        };
        let (_, next) = self.run_with(core, |_, _, _| (), None);
        self.check_timer(next);
    }

    /// Whether the rank's actor has stopped (a link to it is closed).
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Times the rank's actor was woken to drive it (or re-arm its timer).
    pub(crate) fn wakeups(&self) -> u64 {
        self.wakeups.load(Ordering::Relaxed)
    }

    fn wake_actor(&self) {
        self.wakeups.fetch_add(1, Ordering::Relaxed);
        if let Some(a) = self.actor.get() {
            a.do_send(Kick);
        }
    }

    /// Wakes whoever makes the asked-for background run: a caller parked on this rank if
    /// there is one (it then drives the rank again, as in its wait), else the actor.
    fn wake_background(&self) {
        {
            let mut b = lock(&self.bell);
            if b.sleepers > 0 {
                b.rung = true;
                self.bell_rung.notify_one();
                return;
            }
        }
        self.wake_actor();
    }

    /// Tells the parked callers that calls completed (theirs may be among them).
    fn completed(&self) {
        // Pairs with the fence in `sleep_until`: the results were set before this fence, so a
        // caller counted after it sees its call completed and does not park.
        fence(Ordering::SeqCst);
        if self.sleeping.load(Ordering::Relaxed) == 0 {
            return;
        }
        let b = lock(&self.bell);
        if b.sleepers > 0 {
            self.bell_rung.notify_all();
        }
    }

    /// Wakes the callers parked on this rank to look at their calls again: for a call
    /// completed outside a run of the engine (a device transfer completed by its worker
    /// thread), which the engine's own completions would not announce.
    pub(crate) fn notify(&self) {
        self.completed();
    }

    /// Parks a caller until `done()` (its call completed) or the bell asks it to run the
    /// rank: then it makes the background run and drives the rank while arrivals keep
    /// coming, as in its wait, before it parks again. A long call whose caller parked while
    /// its peers were late is thus still driven by its caller, with no actor hand-off per
    /// message.
    pub(crate) fn sleep_until(&self, done: &dyn Fn() -> bool) {
        if done() {
            // Not counted as a sleeper: nobody handed this caller a run.
            return;
        }
        loop {
            let rung = {
                let mut b = lock(&self.bell);
                b.sleepers += 1;
                self.sleeping.store(b.sleepers, Ordering::Relaxed);
                // Pairs with the fence in `completed`: a completion that did not see this
                // count is seen by `done()` below.
                fence(Ordering::SeqCst);
                while !b.rung && !done() {
                    b = self.bell_rung.wait(b).unwrap_or_else(|e| e.into_inner());
                }
                b.sleepers -= 1;
                self.sleeping.store(b.sleepers, Ordering::Relaxed);
                std::mem::take(&mut b.rung)
            };
            if rung {
                // The run asked for must happen even if this caller's call is done now; the
                // actor still owns the timer.
                if let Some(at) = self.background() {
                    if at.as_nanos() < self.timer_at.load(Ordering::SeqCst) && self.inbox.ask() {
                        self.wake_actor();
                    }
                }
            }
            if done() {
                return;
            }
            self.drive_until(done, self.spin, Duration::MAX);
            if done() {
                return;
            }
        }
    }

    /// Runs `f` on the core, then the engine until it has nothing more to do; completes the
    /// calls that finished once the lock is released, and asks the actor for an earlier
    /// timer if the engine needs one.
    pub(crate) fn run<R>(&self, f: impl FnOnce(&mut Core, Time, &mut After) -> R) -> R {
        self.run_locked(lock(&self.core), f)
    }

    fn run_locked<R>(
        &self,
        core: MutexGuard<'_, Core>,
        f: impl FnOnce(&mut Core, Time, &mut After) -> R,
    ) -> R {
        let (r, next) = self.run_with(core, f, Some(GRACE.min(self.spin)));
        self.check_timer(next);
        r
    }

    /// Asks the actor for an earlier timer if the engine wants one before the armed one.
    fn check_timer(&self, next: Option<Time>) {
        if let Some(at) = next {
            if at.as_nanos() < self.timer_at.load(Ordering::SeqCst) && self.inbox.ask() {
                self.wake_actor();
            }
        }
    }

    /// [`run`](Driver::run) without the timer check (for the actor, which arms its timer
    /// itself, and which settles what it owes peers at once): also returns when the engine
    /// wants its next timer.
    fn run_inner<R>(
        &self,
        core: MutexGuard<'_, Core>,
        f: impl FnOnce(&mut Core, Time, &mut After) -> R,
    ) -> (R, Option<Time>) {
        self.run_with(core, f, Some(Duration::ZERO))
    }

    /// A run, then the completions, then what it owes peers settled within `grace` (`None`:
    /// left to the caller, which settles them itself).
    fn run_with<R>(
        &self,
        mut core: MutexGuard<'_, Core>,
        f: impl FnOnce(&mut Core, Time, &mut After) -> R,
        grace: Option<Duration>,
    ) -> (R, Option<Time>) {
        let mut after = After::default();
        let now = self.now();
        // What arrived before this run goes first (a peer's abort before a `destroy`, as a
        // mailbox would have ordered them).
        if !self.inbox.looks_empty() {
            core.progress(&self.inbox, now, &mut after);
        }
        let r = f(&mut core, now, &mut after);
        core.progress(&self.inbox, now, &mut after);
        let next = core.engine.poll_timeout();
        drop(core);
        let any = !after.finished.is_empty() || !after.refused.is_empty();
        after.complete();
        if any {
            self.completed();
        }
        if let Some(grace) = grace {
            self.settle(grace);
        }
        (r, next)
    }

    /// A run of the engine if nobody holds it now (whoever does will look at the inbox).
    fn try_run(&self) {
        let core = match self.core.try_lock() {
            Ok(c) => c,
            Err(TryLockError::Poisoned(e)) => e.into_inner(),
            Err(TryLockError::WouldBlock) => return,
        };
        self.run_locked(core, |_, _, _| ());
    }

    /// Issues a call: the engine takes it now, on the caller's thread; `done` gets its result.
    pub(crate) fn submit(&self, group: GroupId, seq: u64, plan: Plan, done: Done<Output>) {
        let driving = self.inbox.enter();
        let core = lock(&self.core);
        let ((), next) = self.run_with(
            core,
            |core, now, after| {
                if core.quiesced {
                    after.refused.push(done);
                    return;
                }
                let fp = plan.fingerprint();
                // new_group's agreement step carries a hash of the members where a count would be.
                let count = fp
                    .count
                    .filter(|_| fp.kind != collectix_runtime::OpKind::NewGroup);
                let span = tracing::debug_span!(
                    "call",
                    rank = core.engine.rank(),
                    group = %group,
                    seq = tracing::field::Empty,
                    op = %fp.kind,
                    dtype = %fp.dtype,
                    count,
                    algorithm = fp.algorithm.map(|a| a.name()),
                    bytes = count.map(|c| c.saturating_mul(fp.dtype.size() as u64)),
                );
                if !plan.is_p2p() {
                    span.record("seq", seq);
                }
                let id = core.engine.submit(group, seq, plan, now);
                let start = (!span.is_disabled()).then(Instant::now);
                core.waiting.insert(id, Waiting { done, span, start });
            },
            None,
        );
        self.check_timer(next);
        self.settle_driving(GRACE.min(self.spin), driving);
    }

    /// Registers a group on the rank.
    pub(crate) fn add_group(&self, info: GroupInfo) {
        self.run(|core, now, _| core.engine.add_group(info, now));
    }

    /// Releases a group on the rank; its pending error, if it has one.
    pub(crate) fn destroy(&self, group: GroupId) -> Result<()> {
        self.run(|core, _, _| {
            if core.quiesced {
                return Err(Error::Shutdown);
            }
            core.engine.destroy_group(group)
        })
    }

    /// Installs the rank's links (once every peer's address is known) and sends what waited.
    pub(crate) fn set_links(&self, links: Links) {
        self.run(|core, now, _| {
            let outboxes = links.iter().map(|_| Outbox::default()).collect();
            core.links = Some((links, outboxes));
            for (dst, msg) in std::mem::take(&mut core.backlog) {
                core.send(dst, msg, now);
            }
        });
    }

    /// The link to global rank `peer` can take messages again: what waits for it is sent.
    pub(crate) fn flush(&self, peer: usize) {
        self.run(|core, now, _| {
            let Some((links, outboxes)) = &mut core.links else {
                return;
            };
            let closed = match (links.get_mut(peer), outboxes.get_mut(peer)) {
                (Some(link), Some(outbox)) => outbox.flush(link.as_mut()).is_err(),
                _ => false,
            };
            if closed && !core.quiesced {
                core.engine.handle_peer_lost(peer, now);
            }
        });
    }

    /// Global rank `peer` is gone: the calls that need it fail and its groups abort.
    pub(crate) fn peer_lost(&self, peer: usize) {
        self.run(|core, now, _| {
            if core.quiesced {
                return;
            }
            if let Some((_, outboxes)) = &mut core.links {
                if let Some(o) = outboxes.get_mut(peer) {
                    o.clear();
                }
            }
            core.engine.handle_peer_lost(peer, now);
        });
    }

    /// A run of the background driver: takes the arrivals (later ones ask again), drives the
    /// engine, and returns when the engine wants its next timer.
    pub(crate) fn background(&self) -> Option<Time> {
        self.run_inner(lock(&self.core), |core, _, _| {
            let mut arrivals = std::mem::take(&mut core.arrivals);
            self.inbox.begin_background(&mut arrivals);
            core.arrivals = arrivals;
        })
        .1
    }

    /// The engine's timer fired: returns when it wants the next one.
    pub(crate) fn timeout(&self) -> Option<Time> {
        self.timer_at.store(u64::MAX, Ordering::SeqCst);
        self.run_inner(lock(&self.core), |core, now, _| {
            core.engine.handle_timeout(now)
        })
        .1
    }

    /// The actor armed its timer for `at` (`None`: not armed).
    pub(crate) fn timer_armed(&self, at: Option<Time>) {
        self.timer_at
            .store(at.map_or(u64::MAX, Time::as_nanos), Ordering::SeqCst);
    }

    /// The world is shutting down: every waiting call fails with `Shutdown`, later arrivals
    /// are dropped and later calls refused. Returns the rank's pending errors.
    pub(crate) fn quiesce(&self) -> Vec<Error> {
        self.run_inner(lock(&self.core), |core, _, after| {
            let pending = core.engine.pending_errors();
            core.quiesced = true;
            for (_, w) in core.waiting.drain() {
                after.finished.push((w, Err(Error::Shutdown)));
            }
            pending
        })
        .0
    }

    /// This rank leaves its job (see `rank::Leave`): returns when the engine wants its next
    /// timer.
    pub(crate) fn leave(&self, linger: Duration, done: mpsc::Sender<Vec<Error>>) -> Option<Time> {
        self.run_inner(lock(&self.core), |core, now, _| {
            let pending = core.engine.pending_errors();
            for e in &pending {
                tracing::warn!(rank = core.engine.rank(), error = %e, "pending error at shutdown");
            }
            core.leaving = Some((pending, done));
            core.engine.shutdown(now, linger);
        })
        .1
    }

    /// The rank's actor stopped: links to this rank close, its own links are dropped (they
    /// hold its peers), and calls still waiting fail with `Shutdown`.
    pub(crate) fn stopped(&self) {
        self.closed.store(true, Ordering::Release);
        let (links, waiting) = {
            let mut core = lock(&self.core);
            core.quiesced = true;
            (core.links.take(), std::mem::take(&mut core.waiting))
        };
        drop(links);
        for (_, w) in waiting {
            w.finish(Err(Error::Shutdown));
        }
        self.completed();
    }

    /// Drives the rank until `done()` says so, for at most `limit` in all, and until it has
    /// been idle (nothing arrived) for `idle`: a long call that keeps receiving is driven by
    /// its caller to the end, a call waiting for a slow peer parks. Then it stops driving
    /// (taking what arrived meanwhile, so that nothing is left behind for nobody); the caller
    /// parks on its call's slot if it is not done, and the actor finishes the work.
    pub(crate) fn drive_until(&self, done: &dyn Fn() -> bool, idle: Duration, limit: Duration) {
        if idle.is_zero() || limit.is_zero() || done() {
            return;
        }
        let driving = self.inbox.enter();
        let start = Instant::now();
        let mut active = start;
        let mut turns: u32 = 0;
        loop {
            if !self.inbox.looks_empty() {
                self.try_run();
                turns = 0;
                active = Instant::now();
            }
            if done() {
                break;
            }
            turns = turns.wrapping_add(1);
            if turns.is_multiple_of(64) {
                let now = Instant::now();
                if now.duration_since(active) >= idle || now.duration_since(start) >= limit {
                    break;
                }
            }
            self.pause(turns);
        }
        if driving.leave() {
            self.run(|_, _, _| ());
        }
    }

    /// One turn of a spin: a pause, and every `YIELD_TURNS` turns, when the process's
    /// ranks outnumber the cores, the core itself (the rank we wait for may need it).
    fn pause(&self, turns: u32) {
        if self.yields && turns.is_multiple_of(YIELD_TURNS) {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }

    /// One run of the engine if arrivals wait and nobody drives it now (a `Work` polled
    /// again).
    pub(crate) fn poke(&self) {
        if !self.inbox.looks_empty() {
            self.try_run();
        }
    }
}

/// Spins until `attended()` (the peers owed a look have had their arrivals taken, or a
/// caller drives them), for at most `grace`.
fn wait_attended(attended: impl Fn() -> bool, grace: Duration) {
    if grace.is_zero() || attended() {
        return;
    }
    let start = Instant::now();
    let mut turns: u32 = 0;
    while !attended() {
        turns = turns.wrapping_add(1);
        if turns.is_multiple_of(64) && start.elapsed() >= grace {
            return;
        }
        std::hint::spin_loop();
    }
}

/// The engine's clock: monotonic and coarse. Its deadlines are seconds (call timeouts) or
/// tens of milliseconds (graces), and it is read on every run of every call, so Linux's
/// coarse clock (a few milliseconds of resolution, read in a few nanoseconds rather than
/// twenty) serves; a timer that fires before the coarse clock reaches its deadline re-arms
/// for the rest.
#[cfg(target_os = "linux")]
fn engine_clock() -> Duration {
    use nix::time::{clock_gettime, ClockId};
    match clock_gettime(ClockId::CLOCK_MONOTONIC_COARSE) {
        Ok(t) => Duration::from(t),
        Err(_) => fallback_clock(),
    }
}

#[cfg(not(target_os = "linux"))]
fn engine_clock() -> Duration {
    fallback_clock()
}

/// Monotonic time since the first read in this process.
fn fallback_clock() -> Duration {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed()
}
