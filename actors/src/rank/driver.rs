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

mod board;
mod handoff;
mod links;
mod mail;
pub(crate) mod recorder;
mod state;
mod wait;

pub(crate) use board::{BoardSubmit, GroupBoard, Quick, Signal, Wake};
pub(crate) use handoff::Owed;
pub(crate) use links::{BoxedLink, LinkTable};
pub(crate) use mail::{GroupMail, MailPeer};
pub(crate) use state::{After, Core};
pub(crate) use wait::{
    spin_from_env, DEFAULT_SPIN, DEFAULT_SPIN_TCP, YIELD_TURNS, YIELD_TURNS_SPARSE,
};

use crate::sync::lock;
use actix::{Message as ActixMessage, Recipient};
use collectix_runtime::fast_hash::FastMap;
use collectix_runtime::lateness::LatenessSummary;
use collectix_runtime::progress::{CachePadded, Inbox};
use collectix_runtime::recovery::Evidence;
use collectix_runtime::wire::{Link, Message};
use collectix_runtime::{Engine, Error, GroupId, GroupInfo, Output, Plan, Result, Time};
use handoff::GRACE;
use state::Waiting;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex, MutexGuard, OnceLock, TryLockError};
use std::time::{Duration, Instant};
use wait::Bell;

/// Arrivals wait and no caller drives the rank (or the engine wants an earlier timer): the
/// background driver (the rank's actor) runs the engine. Sent once per burst
/// (`collectix_runtime::progress`).
#[derive(ActixMessage)]
#[rtype(result = "()")]
pub(crate) struct Kick;

/// What completes a call: takes the engine's output (boxed so the driver can hold completers
/// of every type in one map; [`Work::pair`](crate::work::Work) makes one).
pub(crate) type Done<I> = Box<dyn FnOnce(Result<I>) + Send>;

/// How long past a probe's own time [`Driver::probe`] waits for its outcome (a connector
/// that gave up reports the loss a moment after).
const PROBE_SLACK: Duration = Duration::from_millis(50);

/// A rank's links, one per global rank (its own included, unused).
pub(crate) type Links = Vec<Box<dyn Link<Message> + Send>>;

/// One rank's engine behind its lock, its inbox, and who drives it (see the module doc).
pub(crate) struct Driver {
    /// On lines of its own: peers touch the `Arc`'s counts and the inbox, never the lock.
    core: CachePadded<Mutex<Core>>,
    inbox: Inbox<Message>,
    /// Wakes the background driver: the rank's actor with a [`Kick`] (set once it started),
    /// or a seeded run's scheduler.
    kick: OnceLock<Box<dyn Fn() + Send + Sync>>,
    /// The rank's clock.
    clock: Clock,
    /// When the actor's timer fires, in ns since `origin` (`u64::MAX`: not armed).
    timer_at: CachePadded<AtomicU64>,
    /// How long a waiting caller drives the rank before it parks.
    spin: Duration,
    /// Every how many turns a spinning caller yields its core (0: never): every turn when
    /// the host's ranks outnumber its cores (the rank it waits for may need that core);
    /// now and then for a process's rank (its own progress threads may need it); never for
    /// the ranks of a world that have a core each.
    yield_every: u32,
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
    /// The transports whose arrivals a waiting caller reads itself (shared memory, TCP), by
    /// [`PollerKind`]: polled on every turn of a caller's drive (see [`Poller`]).
    pollers: [OnceLock<Arc<dyn Poller>>; 2],
    /// The rank's calls on boards (small calls in shared memory: `board.rs`).
    pub(crate) boards: board::Boards,
    /// The engine's [`board_epoch`](Engine::board_epoch), read without its lock; this
    /// driver counts its own quiescing there too.
    board_epoch: Arc<AtomicU64>,
    /// The engine's [`landings`](Engine::landings), for the transports' readers.
    landings: Arc<collectix_runtime::landing::Landings>,
    /// This process's shared heap, once its shared-memory transport made one.
    heap: OnceLock<Arc<collectix_runtime::tensor::shared_heap::SharedHeap>>,
    /// The rank's groups with mailboxes (`mail.rs`): every run reads them.
    mail: Mutex<Vec<Arc<GroupBoard>>>,
    /// Set by a sender after it wrote a message into a mailbox toward this rank, cleared by
    /// the run that reads them (`mail.rs`).
    mail_new: collectix_runtime::board::mail_wake::MailFlag,
}

/// A transport that a waiting caller drives itself: instead of a reader thread handing each
/// arrival over (a cross-thread wake-up), the caller that waits for its call reads the
/// transport's arrivals on every turn of its spin ([`Driver::drive_until`]).
/// Which transport a [`Poller`] reads (a rank has at most one of each).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PollerKind {
    /// The rings of the shared-memory transport.
    Shm = 0,
    /// The TCP connections.
    Tcp = 1,
}

pub(crate) trait Poller: Send + Sync {
    /// A caller starts driving the rank (the transport's senders need not wake anyone).
    fn enter(&self);
    /// Reads what arrived into the rank's inbox ([`Driver::deliver`]) and moves on what the
    /// rank's links have in progress; whether anything happened.
    fn poll(&self) -> bool;
    /// The caller stops driving (what arrives from now on is the transport's to hand over).
    fn leave(&self);
    /// The caller stops driving with its call not done (it parks): a transport that let its
    /// own threads sleep through arrivals while callers read them wakes them up for every
    /// arrival again. By default nothing.
    fn parking(&self) {}
    /// Takes what arrived before a peer's loss is handled (a peer's last messages before it
    /// closed its connection, which another transport reports).
    fn drain(&self);
}

impl Driver {
    /// A rank's driver, its engine holding the world group.
    pub(crate) fn new(
        mut engine: Engine,
        world: GroupInfo,
        spin: Duration,
        yield_every: u32,
    ) -> Driver {
        engine.add_group(world, Time::ZERO);
        let board_epoch = engine.board_epoch();
        let landings = engine.landings();
        Driver {
            board_epoch,
            landings,
            heap: OnceLock::new(),
            mail: Mutex::new(Vec::new()),
            mail_new: collectix_runtime::board::mail_wake::MailFlag::new(),
            core: CachePadded(Mutex::new(Core {
                engine,
                links: None,
                waiting: FastMap::default(),
                backlog: Vec::new(),
                quiesced: false,
                leaving: None,
                arrivals: Vec::new(),
                recorder: recorder::Recorder::default(),
                failing: false,
                mail_freed: Vec::new(),
            })),
            inbox: Inbox::new(),
            kick: OnceLock::new(),
            clock: Clock::Real(engine_clock()),
            timer_at: CachePadded(AtomicU64::new(u64::MAX)),
            spin,
            yield_every,
            closed: AtomicBool::new(false),
            wakeups: CachePadded(AtomicU64::new(0)),
            owed: Arc::default(),
            bell: CachePadded(Mutex::new(Bell::default())),
            sleeping: AtomicUsize::new(0),
            bell_rung: Condvar::new(),
            pollers: [OnceLock::new(), OnceLock::new()],
            boards: board::Boards::default(),
        }
    }

    /// Where the payloads of the messages the rank's calls expect go, for the transports'
    /// readers (`collectix_runtime::landing`).
    pub(crate) fn landings(&self) -> &collectix_runtime::landing::Landings {
        &self.landings
    }

    /// Gives the rank this process's shared heap: the tensors its communicator allocates
    /// shared are made there (`Communicator::alloc_shared`).
    pub(crate) fn use_shared_heap(
        &self,
        heap: Arc<collectix_runtime::tensor::shared_heap::SharedHeap>,
    ) {
        let _ = self.heap.set(heap);
    }

    /// This process's shared heap, if it has one.
    pub(crate) fn shared_heap(
        &self,
    ) -> Option<&Arc<collectix_runtime::tensor::shared_heap::SharedHeap>> {
        self.heap.get()
    }

    /// Sets a transport that waiting callers poll (once per kind).
    pub(crate) fn set_poller(&self, kind: PollerKind, p: Arc<dyn Poller>) {
        let _ = self.pollers[kind as usize].set(p);
    }

    /// The transports that waiting callers poll.
    fn pollers(&self) -> impl Iterator<Item = &Arc<dyn Poller>> {
        self.pollers.iter().filter_map(OnceLock::get)
    }

    /// Names the rank's actor, which drives the rank when no caller does.
    pub(crate) fn set_actor(&self, actor: Recipient<Kick>) {
        let _ = self.kick.set(Box::new(move || actor.do_send(Kick)));
    }

    /// Names what drives the rank when no caller does, by a function that asks it to (a
    /// seeded run's scheduler).
    pub(crate) fn set_kick(&self, kick: Box<dyn Fn() + Send + Sync>) {
        let _ = self.kick.set(kick);
    }

    /// This driver on a virtual clock: the engine's time is `clock` (ns), which a seeded
    /// run's scheduler advances.
    pub(crate) fn on_virtual_clock(mut self, clock: Arc<AtomicU64>) -> Driver {
        self.clock = Clock::Virtual(clock);
        self
    }

    /// The global rank.
    pub(crate) fn rank(&self) -> usize {
        lock(&self.core).engine.rank()
    }

    /// How long a waiting caller drives the rank before it parks.
    pub(crate) fn spin(&self) -> Duration {
        self.spin
    }

    /// How long a run waits for the peers it handed messages to to take them before it
    /// wakes their actors ([`settle`](Self::settle)): on a thread that runs rank actors,
    /// not at all (the peers may share this thread: they cannot take anything while it
    /// waits).
    pub(crate) fn grace(&self) -> Duration {
        if crate::rank::on_rank_thread() {
            Duration::ZERO
        } else {
            GRACE.min(self.spin)
        }
    }

    pub(crate) fn now(&self) -> Time {
        match &self.clock {
            Clock::Real(origin) => {
                let since = engine_clock().saturating_sub(*origin);
                Time::from_nanos(u64::try_from(since.as_nanos()).unwrap_or(u64::MAX))
            }
            Clock::Virtual(ns) => Time::from_nanos(ns.load(Ordering::Acquire)),
        }
    }

    /// Calls the rank has started (a seeded run's fault script counts them).
    pub(crate) fn calls_started(&self) -> u64 {
        lock(&self.core).recorder.count()
    }

    /// Whether the rank's actor has stopped (a link to it is closed).
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Whether the engine has calls in flight (a transport's thread must then read what
    /// comes, though no caller does); `true` while another thread runs it. Asked only on the
    /// rare path where a transport's thread is parked.
    pub(crate) fn has_calls_in_flight(&self) -> bool {
        match self.core.try_lock() {
            Ok(core) => core.engine.pending() > 0,
            Err(TryLockError::Poisoned(e)) => e.into_inner().engine.pending() > 0,
            Err(TryLockError::WouldBlock) => true,
        }
    }

    /// Times the rank's actor was woken to drive it (or re-arm its timer).
    pub(crate) fn wakeups(&self) -> u64 {
        self.wakeups.load(Ordering::Relaxed)
    }

    fn wake_actor(&self) {
        self.wakeups.fetch_add(1, Ordering::Relaxed);
        if let Some(kick) = self.kick.get() {
            kick();
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
        let (r, next) = self.run_with(core, f, Some(self.grace()));
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
        // Calls finished on a board since the last run are on the engine's record first.
        self.take_board_records(&mut core, now);
        // What arrived before this run goes first (a peer's abort before a `destroy`, as a
        // mailbox would have ordered them).
        if !self.inbox.looks_empty() {
            core.progress(&self.inbox, now, &mut after, &|c| self.read_mail(c));
        }
        self.take_mail(&mut core);
        let r = f(&mut core, now, &mut after);
        // Again after the run's own work: a sender that found this run's background request
        // still open wrote its message before the request was taken (`mail.rs`).
        self.take_mail(&mut core);
        core.progress(&self.inbox, now, &mut after, &|c| self.read_mail(c));
        self.free_mail(&mut core);
        let mut next = core.engine.poll_timeout();
        let (board_next, moved) = self.board_checks(&mut core, now, &mut after);
        if let Some(b) = board_next {
            next = Some(next.map_or(b, |n| n.min(b)));
        }
        drop(core);
        self.board_wake(moved);
        let any =
            !after.finished.is_empty() || !after.refused.is_empty() || !after.board.is_empty();
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
                let p2p = plan.is_p2p();
                if !p2p {
                    span.record("seq", seq);
                }
                let id = core.engine.submit(group, seq, plan, now);
                let record = recorder::Recorder::record(
                    group,
                    (!p2p).then_some(seq),
                    fp.kind,
                    fp.dtype,
                    count,
                    now,
                );
                core.recorder.started(recorder::Key::Op(id), record);
                let start = (!span.is_disabled()).then(Instant::now);
                core.waiting.insert(id, Waiting { done, span, start });
            },
            None,
        );
        self.check_timer(next);
        self.settle_driving(self.grace(), driving);
    }

    /// This rank's part of collective call `seq` of `group` failed before it started (its
    /// caller got `why`): the call takes its sequence number, and the other members hear at
    /// once (see `Engine::fail_call`).
    pub(crate) fn fail_call(&self, group: GroupId, seq: u64, why: &Error) {
        self.run(|core, _, _| {
            if !core.quiesced {
                core.engine.fail_call(group, seq, why);
            }
        });
    }

    /// Registers a group on the rank.
    pub(crate) fn add_group(&self, info: GroupInfo) {
        self.run(|core, now, _| core.engine.add_group(info, now));
    }

    /// Releases a group on the rank; its pending error, if it has one.
    pub(crate) fn destroy(&self, group: GroupId) -> Result<()> {
        // What a transport holds for this rank already (a peer's abort in a shared-memory
        // ring, read by nobody yet) came before this destroy: it goes in first, so that the
        // pending error it brings is returned, as an arrival in the inbox would be.
        for p in self.pollers() {
            p.drain();
        }
        // The run takes what the group's mailboxes hold first, as it does a transport's.
        let r = self.run(|core, _, _| {
            if core.quiesced {
                return Err(Error::Shutdown);
            }
            core.engine.destroy_group(group)
        });
        self.drop_mail(group);
        r
    }

    /// Call `seq` of `group`, on the NCCL path, finished its device operation (see
    /// `Engine::device_done`).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn device_done(&self, group: GroupId, seq: u64) {
        self.run(|core, _, _| core.engine.device_done(group, seq));
    }

    /// Revokes a group on the rank (see `Engine::revoke_group`).
    pub(crate) fn revoke(&self, group: GroupId) -> Result<()> {
        self.run(|core, _, _| {
            if core.quiesced {
                return Err(Error::Shutdown);
            }
            core.engine.revoke_group(group)
        })
    }

    /// Two threads of this rank issued calls on `group` at once (`e`, from
    /// `collectix_runtime::issuers`): see `Engine::abort_disordered`.
    pub(crate) fn abort_disordered(&self, group: GroupId, e: &Error) {
        self.run(|core, _, _| core.engine.abort_disordered(group, e.clone()));
    }

    /// The rank's flight record: its last calls, oldest first.
    pub(crate) fn flight_record(&self) -> Vec<recorder::CallRecord> {
        self.run(|core, _, _| core.recorder.calls())
    }

    /// Who came last to group `group`'s calls, as this rank saw them, with this rank's rank
    /// in the group (`None`: not a group of this rank).
    pub(crate) fn lateness(&self, group: GroupId) -> Option<(usize, LatenessSummary)> {
        self.run(|core, _, _| {
            let rank = core.engine.group(group)?.rank;
            Some((rank, core.engine.lateness(group)?.clone()))
        })
    }

    /// Every group of this rank: its id, its members (global ranks, in group order) and who
    /// came last to its calls as this rank saw them (nobody, if none was judged yet).
    pub(crate) fn lateness_all(&self) -> Vec<(GroupId, Vec<usize>, LatenessSummary)> {
        self.run(|core, _, _| {
            // Every group, with or without calls completed: its members are what
            // `collectix status --explain` knows it by (a wait cycle's groups may have none).
            core.engine
                .lateness_all()
                .map(|(g, s)| (g.id, g.members.to_vec(), s.clone()))
                .collect()
        })
    }

    /// The peers this rank saw lost (their links broke; not those that left in order).
    pub(crate) fn lost_peers(&self) -> BTreeSet<usize> {
        self.run(|core, _, _| core.engine.lost_peers().clone())
    }

    /// This rank's own evidence against the members of `group` (dead for certain, or
    /// suspected; not what others reported), and how many of its calls completed here
    /// without a gap (`None`: not a group of this rank).
    pub(crate) fn survivors_view(&self, group: GroupId) -> (Evidence, Option<u64>) {
        self.run(|core, _, _| {
            (
                core.engine.departed(group),
                core.engine.completed_calls(group),
            )
        })
    }

    /// Messages waiting in front of links that cannot take them yet (a connection still
    /// being made, a full writer queue), over all peers; a lost peer's are dropped.
    pub(crate) fn queued(&self) -> usize {
        self.run(|core, _, _| core.links.as_ref().map_or(0, LinkTable::queued))
    }

    /// Probes the links to `peers` (`Link::probe`: a lazy connection is made now) and waits,
    /// `within` and a moment more at most, until none of them is still being made: by then
    /// a peer that could not be reached is lost to the engine.
    pub(crate) fn probe(&self, peers: &[usize], within: Duration) {
        self.run(|core, _, _| {
            if let Some(links) = &mut core.links {
                for &p in peers {
                    if let Some(l) = links.get_mut(p) {
                        l.probe(within);
                    }
                }
            }
        });
        let until = crate::sync::deadline_after(within + PROBE_SLACK);
        let connecting = || {
            self.run(|core, _, _| {
                core.links.as_ref().is_some_and(|links| {
                    peers
                        .iter()
                        .any(|&p| links.get(p).is_some_and(|l| l.is_connecting()))
                })
            })
        };
        while connecting() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Installs the rank's links (once every peer's address is known) and sends what waited.
    pub(crate) fn set_links(&self, links: LinkTable) {
        self.run(|core, now, _| {
            core.links = Some(links);
            for (dst, msg) in std::mem::take(&mut core.backlog) {
                core.send(dst, msg, now);
            }
        });
    }

    /// Global rank `peer` was restarted in this process (a new incarnation, on a new
    /// driver): its link is replaced by `link`, what waited for the old one is dropped, and
    /// the engine hears that the old incarnation is lost for good and the new one may be a
    /// member of groups made from now on (`Engine::handle_peer_rejoined`).
    pub(crate) fn relink(&self, peer: usize, link: BoxedLink) {
        self.replace_link(peer, link, Engine::handle_peer_rejoined);
    }

    /// The link to global rank `peer` was cut (a network fault, `World::cut`): it is
    /// replaced by `link` (one that takes nothing), what waited for it is dropped, and the
    /// engine hears `peer` lost, as from a broken connection.
    pub(crate) fn cut(&self, peer: usize, link: BoxedLink) {
        crate::metrics::peer_lost();
        self.replace_link(peer, link, Engine::handle_peer_lost);
    }

    /// Replaces the link to `peer` with `link`, drops what waited for the old one, and tells
    /// the engine (`tell`), unless the rank is stopping.
    fn replace_link(&self, peer: usize, link: BoxedLink, tell: fn(&mut Engine, usize, Time)) {
        self.run(|core, now, _| {
            if core.quiesced {
                return;
            }
            if let Some(links) = &mut core.links {
                links.replace(peer, link);
            }
            tell(&mut core.engine, peer, now);
        });
    }

    /// The link to global rank `peer` can take messages again: what waits for it is sent.
    pub(crate) fn flush(&self, peer: usize) {
        self.run(|core, now, _| {
            let Some(links) = &mut core.links else {
                return;
            };
            let closed = links.flush(peer).is_err();
            if closed && !core.quiesced {
                core.engine.handle_peer_lost(peer, now);
            }
        });
    }

    /// Global rank `peer` is gone: the calls that need it fail and its groups abort. Its
    /// link broke or fell silent: it may be alive (see [`peer_dead`](Self::peer_dead)).
    pub(crate) fn peer_lost(&self, peer: usize) {
        crate::metrics::peer_lost();
        self.peer_gone(peer, Engine::handle_peer_lost);
    }

    /// Like [`peer_lost`](Self::peer_lost), for a peer dead for certain: the kernel closed
    /// or reset its connection, or its process is gone.
    pub(crate) fn peer_dead(&self, peer: usize) {
        crate::metrics::peer_lost();
        self.peer_gone(peer, Engine::handle_peer_dead);
    }

    /// A new incarnation of global rank `peer` connected (a restarted process): the previous
    /// one is lost for good (its groups abort, what waited for it goes), and the new one may
    /// be a member of groups made from now on.
    pub(crate) fn peer_rejoined(&self, peer: usize) {
        self.peer_gone(peer, Engine::handle_peer_rejoined);
    }

    /// What waited in front of `peer`'s link goes, and the engine hears (`tell`) unless the
    /// rank is stopping.
    fn peer_gone(&self, peer: usize, tell: fn(&mut Engine, usize, Time)) {
        for p in self.pollers() {
            p.drain();
        }
        self.run(|core, now, _| {
            if core.quiesced {
                return;
            }
            if let Some(links) = &mut core.links {
                links.clear(peer);
            }
            tell(&mut core.engine, peer, now);
        });
    }

    /// A run of the background driver: takes the arrivals (later ones ask again), drives the
    /// engine, and returns when the engine wants its next timer.
    pub(crate) fn background(&self) -> Option<Time> {
        let next = self
            .run_inner(lock(&self.core), |core, _, _| {
                let mut arrivals = std::mem::take(&mut core.arrivals);
                self.inbox.begin_background(&mut arrivals);
                core.arrivals = arrivals;
            })
            .1;
        self.board_progress();
        self.board_flush();
        next
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
            self.board_epoch.fetch_add(1, Ordering::Release);
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
            self.board_epoch.fetch_add(1, Ordering::Release);
            (core.links.take(), std::mem::take(&mut core.waiting))
        };
        drop(links);
        for (_, w) in waiting {
            w.finish(Err(Error::Shutdown));
        }
        // Its calls on boards end too (a run sees the rank quiesced).
        self.run(|_, _, _| ());
        self.completed();
    }
}

/// A rank's clock.
enum Clock {
    /// The engine's clock ([`engine_clock`]) from this reading on.
    Real(Duration),
    /// A seeded run's virtual time, in ns.
    Virtual(Arc<AtomicU64>),
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
