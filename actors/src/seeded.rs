//! Seeded, deterministic runs of an SPMD program ([`Seeded`]): every rank's body and every
//! rank's progress run on one thread, under a scheduler that picks the next step with a
//! seeded generator, on a virtual clock. A run is a sequence of [`Step`]s: a rank's body
//! polled, a rank driven, a message delivered, a timer fired. The same seed gives the same
//! steps, the same results and the same error texts; a timeout fires in virtual time (a 30 s
//! timeout costs no wall time); faults ([`Fault`]) happen where the script says.
//!
//! What the scheduler reorders: which rank runs next, and which link's next message arrives
//! next (each link delivers in order, as a connection does). Ranks run the engine's path
//! (no boards), with the same engine, links and drivers as a [`World`](crate::World).
//! Recovery (`shrink`, `regrow`) is not part of a seeded run yet: its agreement runs on a
//! thread of its own against a store, in real time.

use crate::assemble::{assemble, Birth, SETTLE_IN_PROCESS};
use crate::comm::Communicator;
use crate::member::Spawner;
use crate::rank::driver::{BoxedLink, Driver, LinkTable, DEFAULT_SPIN};
use crate::store::{MemoryStore, Store};
use crate::supervise::Guarded;
use crate::sync::lock;
use crate::transport::local;
use crate::work::guarded;
use collectix_runtime::data_plane::Arenas;
use collectix_runtime::engine::POOL_BYTES;
use collectix_runtime::wire::{Link, LinkError, Message};
use collectix_runtime::{Engine, Error, GroupId, GroupInfo, GroupOptions, Locality, Result, Time};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::future::Future;
use std::ops::Range;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Wake, Waker};
use std::time::Duration;

/// The variable that names the seed of a run to replay ([`Seeded::new`] reads it).
pub const SEED_VARIABLE: &str = "COLLECTIX_SEED";

/// The most steps a seeded run takes before it gives up (a program that never ends).
const MAX_STEPS: u64 = 50_000_000;

/// A fault a seeded run injects where its script says (ranks are global ranks, times
/// virtual, from the run's start).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// A rank dies as a killed process would (its peers hear of it at once) when it starts
    /// its `at_call`-th call (counted from 1, over every group).
    Kill {
        /// The rank.
        rank: usize,
        /// Which of its calls.
        at_call: u64,
    },
    /// The link between two ranks is cut (both ends see it broken).
    Cut {
        /// One end.
        a: usize,
        /// The other.
        b: usize,
        /// When.
        at: Duration,
    },
    /// Every message between two ranks (both ways) arrives `by` after it is sent.
    Delay {
        /// One end.
        a: usize,
        /// The other.
        b: usize,
        /// The delay.
        by: Duration,
    },
    /// A rank's body is slow: between two of its steps, `by` passes.
    Straggler {
        /// The rank.
        rank: usize,
        /// The time between two steps of its body.
        by: Duration,
    },
    /// A rank is stopped (as by SIGSTOP) for a while: nothing of it runs and nothing reaches
    /// it meanwhile; then it goes on.
    Stop {
        /// The rank.
        rank: usize,
        /// When it stops.
        at: Duration,
        /// For how long.
        pause: Duration,
    },
}

/// One step of a seeded run: what the scheduler chose.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// A rank's body (`task` 0) or a task of one of its calls was polled.
    Poll {
        /// The rank.
        rank: usize,
        /// 0 for its body, else the task's number in the run.
        task: usize,
    },
    /// A rank's body ended.
    Done {
        /// The rank.
        rank: usize,
    },
    /// A rank ran its engine on what had arrived (its background driver).
    Drive {
        /// The rank.
        rank: usize,
    },
    /// The next message on a link arrived.
    Deliver {
        /// The sender.
        from: usize,
        /// The receiver.
        to: usize,
    },
    /// A rank's timer fired.
    Timer {
        /// The rank.
        rank: usize,
        /// When (virtual, since the start).
        at: Duration,
    },
    /// A fault of the script happened.
    Fault(Fault),
}

/// What a seeded run did: its seed, each rank's result (in rank order), its steps, and the
/// virtual time it took.
#[derive(Debug)]
pub struct Run<T> {
    /// The seed.
    pub seed: u64,
    /// Each rank's result, in rank order.
    pub results: Vec<Result<T>>,
    /// The steps, in order.
    pub trace: Vec<Step>,
    /// The virtual time the run took.
    pub elapsed: Duration,
    /// The faults the run was given: the script's, then those its seed drew
    /// ([`Seeded::random_faults`]).
    pub faults: Vec<Fault>,
}

impl<T: std::fmt::Debug> Run<T> {
    /// Panics, naming the seed and how to replay it, unless `ok(self)`.
    pub fn check(self, ok: impl FnOnce(&Run<T>) -> bool) -> Run<T> {
        if !ok(&self) {
            panic!(
                "seeded run failed with seed {seed} (replay: {SEED_VARIABLE}={seed}): {:?}",
                self.results,
                seed = self.seed
            );
        }
        self
    }
}

/// A seeded run of `n` ranks (see the module doc).
///
/// ```
/// use collectix_actors::{Fault, Seeded};
/// use collectix_runtime::{ReduceOp, Tensor};
///
/// let run = Seeded::new(4).seed(7).run(|c| async move {
///     let t = Tensor::from_vec(vec![c.rank() as i64]);
///     c.all_reduce(t, ReduceOp::Sum).await?.to_vec::<i64>()
/// });
/// assert!(run.results.iter().all(|r| r == &Ok(vec![6])));
/// // The same seed, the same steps.
/// let again = Seeded::new(4).seed(7).run(|c| async move {
///     let t = Tensor::from_vec(vec![c.rank() as i64]);
///     c.all_reduce(t, ReduceOp::Sum).await?.to_vec::<i64>()
/// });
/// assert_eq!(run.trace, again.trace);
/// ```
#[derive(Clone, Debug)]
#[must_use = "a seeded run does nothing until `run`"]
pub struct Seeded {
    n: usize,
    seed: u64,
    faults: Vec<Fault>,
    /// How many faults the seed draws.
    random: usize,
    options: GroupOptions,
}

impl Seeded {
    /// `n` ranks, the seed [`SEED_VARIABLE`] names (0 without it), no faults, default group
    /// options.
    pub fn new(n: usize) -> Seeded {
        let seed = seed_from(std::env::var(SEED_VARIABLE).ok().as_deref());
        Seeded {
            n,
            seed,
            faults: Vec::new(),
            random: 0,
            options: GroupOptions::default(),
        }
    }

    /// The seed.
    pub fn seed(mut self, seed: u64) -> Seeded {
        self.seed = seed;
        self
    }

    /// A fault of the script.
    pub fn fault(mut self, f: Fault) -> Seeded {
        self.faults.push(f);
        self
    }

    /// `count` faults drawn by the seed (besides the script's): each a kill at one of a
    /// rank's first 4 calls, a cut in the first 2 s, a delay of up to 0.5 s, a straggler
    /// of up to 0.1 s per step, or a stop of up to a minute in the first second, of ranks
    /// the seed picks. A seed search then varies the faults with the interleavings; the run
    /// names those it drew ([`Run::faults`]).
    pub fn random_faults(mut self, count: usize) -> Seeded {
        self.random = count;
        self
    }

    /// The faults of a run: the script's, then those the seed draws.
    fn faults(&self) -> Vec<Fault> {
        let mut faults = self.faults.clone();
        let n = self.n.max(1);
        // A stream of its own, so that drawing faults leaves the interleavings' alone.
        let mut g = SplitMix(self.seed ^ 0x6A09_E667_F3BC_C908);
        let ms = |g: &mut SplitMix, most: usize| Duration::from_millis(1 + g.below(most) as u64);
        for _ in 0..self.random {
            let rank = g.below(n);
            let other = (rank + 1 + g.below(n.saturating_sub(1).max(1))) % n;
            faults.push(match g.below(5) {
                0 => Fault::Kill {
                    rank,
                    at_call: 1 + g.below(4) as u64,
                },
                1 if other != rank => Fault::Cut {
                    a: rank,
                    b: other,
                    at: ms(&mut g, 2000),
                },
                2 if other != rank => Fault::Delay {
                    a: rank,
                    b: other,
                    by: ms(&mut g, 500),
                },
                3 => Fault::Straggler {
                    rank,
                    by: ms(&mut g, 100),
                },
                _ => Fault::Stop {
                    rank,
                    at: ms(&mut g, 1000),
                    pause: ms(&mut g, 60_000),
                },
            });
        }
        faults
    }

    /// The world group's options (its timeout, above all: in virtual time).
    pub fn options(mut self, options: GroupOptions) -> Seeded {
        self.options = options;
        self
    }

    /// Runs `body` on every rank, with the seed; returns what every rank's body returned
    /// (a panic is [`Error::Panic`], a rank killed by the script [`Error::Shutdown`]).
    pub fn run<T, F, Fut>(&self, body: F) -> Run<T>
    where
        T: Send + 'static,
        F: Fn(Communicator) -> Fut + Send + Sync,
        Fut: Future<Output = Result<T>> + Send + 'static,
    {
        std::thread::scope(|s| {
            match std::thread::Builder::new()
                .name(format!("collectix-seeded-{}", self.seed))
                .spawn_scoped(s, || self.run_here(&body))
            {
                Ok(h) => h
                    .join()
                    .unwrap_or_else(|_| self.failed("the run's thread panicked")),
                Err(e) => self.failed(&format!("cannot start the run's thread: {e}")),
            }
        })
    }

    /// Runs `body` with each seed of `seeds` in turn; the first run that `ok` rejects.
    pub fn search<T, F, Fut>(
        &self,
        seeds: Range<u64>,
        body: F,
        ok: impl Fn(&Run<T>) -> bool,
    ) -> Option<Run<T>>
    where
        T: Send + 'static,
        F: Fn(Communicator) -> Fut + Send + Sync,
        Fut: Future<Output = Result<T>> + Send + 'static,
    {
        seeds
            .map(|seed| self.clone().seed(seed).run(&body))
            .find(|run| !ok(run))
    }

    fn failed<T>(&self, why: &str) -> Run<T> {
        self.refused(&Error::internal(why))
    }

    /// A run that could not start: every rank's result is `e`.
    fn refused<T>(&self, e: &Error) -> Run<T> {
        Run {
            seed: self.seed,
            results: (0..self.n).map(|_| Err(e.clone())).collect(),
            trace: Vec::new(),
            elapsed: Duration::ZERO,
            faults: self.faults(),
        }
    }

    /// The run, on the calling thread (a thread of its own: it is marked as one that runs
    /// ranks, so that a body's `Work` never blocks or spins).
    fn run_here<T, F, Fut>(&self, body: &F) -> Run<T>
    where
        T: Send + 'static,
        F: Fn(Communicator) -> Fut + Send + Sync,
        Fut: Future<Output = Result<T>> + Send + 'static,
    {
        crate::rank::mark_rank_thread();
        let n = self.n;
        if n == 0 {
            return self.failed("a seeded run needs at least one rank");
        }
        let faults = self.faults();
        if let Some(e) = faults.iter().find_map(|f| invalid(f, n)) {
            return self.refused(&e);
        }
        let shared = Arc::new(Shared::default());
        let mut options = self.options.clone();
        options.locality = Locality::Process;
        let infos =
            match GroupInfo::for_each(GroupId::WORLD, (0..n).collect::<Vec<_>>(), 0..n, &options) {
                Ok(i) => i,
                Err(e) => return self.failed(&e.to_string()),
            };
        let arenas = Arenas::new(POOL_BYTES);
        let drivers: Vec<Arc<Driver>> = infos
            .iter()
            .enumerate()
            .map(|(r, info)| {
                let engine = Engine::in_process(r, arenas.clone());
                let d = Driver::new(engine, info.clone(), DEFAULT_SPIN, 0)
                    .on_virtual_clock(shared.clock.clone());
                Arc::new(d)
            })
            .collect();
        for (r, d) in drivers.iter().enumerate() {
            let sh = shared.clone();
            d.set_kick(Box::new(move || {
                lock(&sh.state).kicked.insert(r);
            }));
        }
        for f in &faults {
            if let Fault::Delay { a, b, by } = f {
                let mut st = lock(&shared.state);
                st.delays.insert((*a, *b), *by);
                st.delays.insert((*b, *a), *by);
            }
        }
        let me = std::thread::current().id();
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let table: Arc<[Arc<Driver>]> = drivers.clone().into();
        let mut sched = Scheduler {
            rng: SplitMix(self.seed),
            shared: shared.clone(),
            drivers: drivers.clone(),
            tasks: Vec::new(),
            timers: vec![None; n],
            results: (0..n).map(|_| None).collect(),
            faults: faults.clone(),
            dead: BTreeSet::new(),
            last_poll: BTreeMap::new(),
            trace: Vec::new(),
        };
        for (r, info) in infos.into_iter().enumerate() {
            let links = sim_links(r, table.clone(), shared.clone());
            let rank = assemble(Birth {
                rank: r,
                world: n,
                standbys: 0,
                incarnation: 0,
                driver: drivers[r].clone(),
                actor: (
                    None,
                    Spawner::Seeded(Tasks {
                        shared: shared.clone(),
                        rank: r,
                    }),
                    me,
                ),
                threads: vec![me],
                links,
                store: store.clone(),
                hub: None,
                boards: None,
                settle: SETTLE_IN_PROCESS,
            });
            let comm = Communicator::new(rank, info);
            let (tx, slot) = (shared.clone(), r);
            let fut = match guarded(|| Ok(body(comm))) {
                Ok(f) => Box::pin(async move {
                    let out: Result<T> = Guarded::new(f).await;
                    lock(&tx.state)
                        .finished
                        .push((slot, Ok(Box::new(out) as Boxed)));
                }) as BoxedTask,
                Err(e) => {
                    sched.results[r] = Some(Err(e));
                    continue;
                }
            };
            sched.add_task(r, true, fut);
        }
        sched.go();
        let results = sched
            .results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(Error::internal("the rank's body never ended"))));
        let results = results.map(downcast::<T>).collect();
        let elapsed = Duration::from_nanos(shared.clock.load(Ordering::Acquire));
        // Every rank stops: what still waits fails, and the links (which hold the peers'
        // drivers) are dropped.
        for d in &drivers {
            d.quiesce();
            d.stopped();
        }
        Run {
            seed: self.seed,
            results,
            trace: sched.trace,
            elapsed,
            faults,
        }
    }
}

/// Why fault `f` cannot happen in a run of `n` ranks, if it cannot.
fn invalid(f: &Fault, n: usize) -> Option<Error> {
    let (ranks, pair) = match f {
        Fault::Kill { rank, .. } | Fault::Straggler { rank, .. } | Fault::Stop { rank, .. } => {
            (vec![*rank], false)
        }
        Fault::Cut { a, b, .. } | Fault::Delay { a, b, .. } => (vec![*a, *b], true),
    };
    if let Some(r) = ranks.iter().find(|&&r| r >= n) {
        return Some(Error::invalid(format!(
            "the fault {f:?} names rank {r}, in a run of {n} ranks"
        )));
    }
    (pair && ranks[0] == ranks[1]).then(|| {
        Error::invalid(format!(
            "the fault {f:?} names a link from a rank to itself"
        ))
    })
}

/// The seed a value of [`SEED_VARIABLE`] names: a number, else 0 (a value that is not one
/// is reported, not silently taken for 0).
fn seed_from(value: Option<&str>) -> u64 {
    let Some(v) = value else { return 0 };
    match v.trim().parse() {
        Ok(seed) => seed,
        Err(_) => {
            tracing::warn!(value = v, "{SEED_VARIABLE} is not a number: seed 0");
            0
        }
    }
}

/// A task's future, boxed.
type BoxedTask = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A body's result, boxed so the scheduler holds every rank's alike.
type Boxed = Box<dyn std::any::Any + Send>;

fn downcast<T: 'static>(b: Result<Boxed>) -> Result<T> {
    b.and_then(|b| {
        b.downcast::<Result<T>>()
            .map_err(|_| Error::internal("a body's result of another type"))
            .and_then(|r| *r)
    })
}

/// What the scheduler and the ranks' links, kicks and wakers share (all on the run's one
/// thread; the lock is for the types' sake, never contended).
#[derive(Default)]
struct Shared {
    clock: Arc<AtomicU64>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Tasks woken, by id.
    ready: BTreeSet<usize>,
    /// Ranks whose background driver was asked for.
    kicked: BTreeSet<usize>,
    /// Tasks spawned by ranks' calls (`Spawner::Seeded`), not yet taken.
    spawned: Vec<(usize, BoxedTask)>,
    /// Messages in flight, per link, in order, each with when it may arrive (ns).
    links: BTreeMap<(usize, usize), VecDeque<(u64, Message)>>,
    /// The delay of each delayed link.
    delays: BTreeMap<(usize, usize), Duration>,
    /// Bodies that ended, with their results.
    finished: Vec<(usize, Result<Boxed>)>,
}

/// A rank's handle on a seeded run's tasks ([`Spawner::Seeded`]).
#[derive(Clone)]
pub(crate) struct Tasks {
    shared: Arc<Shared>,
    rank: usize,
}

impl Tasks {
    pub(crate) fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) -> bool {
        lock(&self.shared.state)
            .spawned
            .push((self.rank, Box::pin(task)));
        true
    }
}

/// A link of a seeded run: what it takes waits in the scheduler until it delivers it.
struct SimLink {
    src: usize,
    dst: usize,
    peer: Arc<Driver>,
    shared: Arc<Shared>,
}

impl Link<Message> for SimLink {
    fn try_send(&mut self, msg: Message) -> std::result::Result<(), LinkError<Message>> {
        if self.peer.is_closed() {
            return Err(LinkError::Closed);
        }
        let now = self.shared.clock.load(Ordering::Acquire);
        let mut st = lock(&self.shared.state);
        let delay = st.delays.get(&(self.src, self.dst)).copied();
        let at = now.saturating_add(delay.map_or(0, nanos));
        st.links
            .entry((self.src, self.dst))
            .or_default()
            .push_back((at, msg));
        Ok(())
    }
}

fn sim_links(src: usize, peers: Arc<[Arc<Driver>]>, shared: Arc<Shared>) -> LinkTable {
    LinkTable::lazy(Box::new(move |p| {
        Some(Box::new(SimLink {
            src,
            dst: p,
            peer: peers.get(p)?.clone(),
            shared: shared.clone(),
        }) as BoxedLink)
    }))
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// A task of the run: whose, whether it is the rank's body, and its future.
struct Task {
    rank: usize,
    body: bool,
    future: Option<BoxedTask>,
    waker: Waker,
}

struct TaskWaker {
    id: usize,
    shared: Arc<Shared>,
}

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        lock(&self.shared.state).ready.insert(self.id);
    }
}

/// SplitMix64: a small, fast generator whose whole state is the seed.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number below `n` (`n > 0`).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// What the scheduler may do next.
#[derive(Clone, Copy, Debug)]
enum Choice {
    Poll(usize),
    Drive(usize),
    Deliver(usize, usize),
}

struct Scheduler {
    rng: SplitMix,
    shared: Arc<Shared>,
    drivers: Vec<Arc<Driver>>,
    tasks: Vec<Task>,
    /// Each rank's armed timer.
    timers: Vec<Option<Time>>,
    results: Vec<Option<Result<Boxed>>>,
    /// The script's faults not yet happened.
    faults: Vec<Fault>,
    /// Ranks killed.
    dead: BTreeSet<usize>,
    /// A straggler's body: when it may next be polled (ns).
    last_poll: BTreeMap<usize, u64>,
    trace: Vec<Step>,
}

impl Scheduler {
    fn now(&self) -> u64 {
        self.shared.clock.load(Ordering::Acquire)
    }

    fn add_task(
        &mut self,
        rank: usize,
        body: bool,
        future: Pin<Box<dyn Future<Output = ()> + Send>>,
    ) {
        let id = self.tasks.len();
        let waker = Waker::from(Arc::new(TaskWaker {
            id,
            shared: self.shared.clone(),
        }));
        self.tasks.push(Task {
            rank,
            body,
            future: Some(future),
            waker,
        });
        lock(&self.shared.state).ready.insert(id);
    }

    /// Whether rank `r` is stopped by the script now.
    fn stopped(&self, r: usize) -> bool {
        let now = self.now();
        self.dead.contains(&r)
            || self.faults.iter().any(|f| {
                matches!(f, Fault::Stop { rank, at, pause }
                    if *rank == r && nanos(*at) <= now && now < nanos(*at).saturating_add(nanos(*pause)))
            })
    }

    fn straggling(&self, r: usize) -> Option<u64> {
        self.faults.iter().find_map(|f| match f {
            Fault::Straggler { rank, by } if *rank == r => Some(nanos(*by)),
            _ => None,
        })
    }

    fn bodies_left(&self) -> bool {
        self.results
            .iter()
            .enumerate()
            .any(|(r, x)| x.is_none() && !self.dead.contains(&r))
    }

    fn go(&mut self) {
        let mut steps: u64 = 0;
        while self.bodies_left() {
            steps += 1;
            if steps > MAX_STEPS {
                self.give_up("the run took more than its steps");
                return;
            }
            self.take_spawned();
            self.cuts(self.now());
            self.kills();
            let choices = self.choices();
            if choices.is_empty() {
                if !self.advance() {
                    self.give_up("no rank can go on and nothing is due: the program is stuck");
                    return;
                }
                continue;
            }
            let c = choices[self.rng.below(choices.len())];
            self.step(c);
            self.take_finished();
        }
    }

    fn give_up(&mut self, why: &str) {
        for r in self.results.iter_mut().filter(|r| r.is_none()) {
            *r = Some(Err(Error::internal(why)));
        }
    }

    fn take_spawned(&mut self) {
        let spawned = std::mem::take(&mut lock(&self.shared.state).spawned);
        for (rank, f) in spawned {
            self.add_task(rank, false, f);
        }
    }

    fn take_finished(&mut self) {
        let finished = std::mem::take(&mut lock(&self.shared.state).finished);
        for (r, out) in finished {
            self.trace.push(Step::Done { rank: r });
            if let Some(slot) = self.results.get_mut(r) {
                *slot = Some(out);
            }
        }
    }

    /// What may happen now, in a fixed order (the seed picks among them).
    fn choices(&self) -> Vec<Choice> {
        let now = self.now();
        let st = lock(&self.shared.state);
        let mut c = Vec::new();
        for &id in &st.ready {
            let Some(t) = self.tasks.get(id) else {
                continue;
            };
            if t.future.is_none() || self.stopped(t.rank) {
                continue;
            }
            if t.body && self.last_poll.get(&t.rank).is_some_and(|&at| now < at) {
                continue;
            }
            c.push(Choice::Poll(id));
        }
        for &r in &st.kicked {
            if !self.stopped(r) {
                c.push(Choice::Drive(r));
            }
        }
        for (&(from, to), q) in &st.links {
            if q.front().is_some_and(|(at, _)| *at <= now) && !self.stopped(to) {
                c.push(Choice::Deliver(from, to));
            }
        }
        c
    }

    fn step(&mut self, c: Choice) {
        match c {
            Choice::Poll(id) => {
                lock(&self.shared.state).ready.remove(&id);
                let Some(t) = self.tasks.get_mut(id) else {
                    return;
                };
                let (rank, body) = (t.rank, t.body);
                let waker = t.waker.clone();
                let Some(f) = t.future.as_mut() else { return };
                self.trace.push(Step::Poll {
                    rank,
                    task: if body { 0 } else { id },
                });
                let mut cx = Context::from_waker(&waker);
                if f.as_mut().poll(&mut cx).is_ready() {
                    t.future = None;
                }
                if body {
                    if let Some(by) = self.straggling(rank) {
                        self.last_poll.insert(rank, self.now().saturating_add(by));
                    }
                }
            }
            Choice::Drive(r) => {
                lock(&self.shared.state).kicked.remove(&r);
                self.trace.push(Step::Drive { rank: r });
                if let Some(d) = self.drivers.get(r).cloned() {
                    let next = d.background();
                    self.arm(r, next);
                }
            }
            Choice::Deliver(from, to) => {
                let msg = {
                    let mut st = lock(&self.shared.state);
                    let m = st.links.get_mut(&(from, to)).and_then(VecDeque::pop_front);
                    if st.links.get(&(from, to)).is_some_and(VecDeque::is_empty) {
                        st.links.remove(&(from, to));
                    }
                    m
                };
                self.trace.push(Step::Deliver { from, to });
                if let (Some((_, m)), Some(d)) = (msg, self.drivers.get(to)) {
                    d.deliver(from, m);
                }
            }
        }
    }

    /// Arms rank `r`'s timer for `next` if that is earlier than the one armed (as the
    /// rank's actor does).
    fn arm(&mut self, r: usize, next: Option<Time>) {
        let Some(slot) = self.timers.get_mut(r) else {
            return;
        };
        *slot = match (*slot, next) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if let Some(d) = self.drivers.get(r) {
            d.timer_armed(*slot);
        }
    }

    /// Nothing can happen now: the clock moves on to the next thing due (a timer, a delayed
    /// message, a straggler's next step, a fault of the script), and the timers due fire.
    /// `false` if nothing is due at all.
    fn advance(&mut self) -> bool {
        let now = self.now();
        let mut due: Vec<u64> = Vec::new();
        // A running rank's timer fires even if it is due already; what else is due now and
        // could not happen waits for something later (the end of a stop).
        for (r, t) in self.timers.iter().enumerate() {
            if let Some(t) = t {
                if !self.stopped(r) {
                    due.push(t.as_nanos().max(now));
                }
            }
        }
        let timers = due.len();
        {
            let st = lock(&self.shared.state);
            due.extend(
                st.links
                    .values()
                    .filter_map(|q| q.front().map(|(at, _)| *at))
                    .filter(|&at| at > now),
            );
        }
        due.extend(self.last_poll.values().copied().filter(|&at| at > now));
        for f in &self.faults {
            match f {
                Fault::Cut { at, .. } => due.push(nanos(*at)),
                Fault::Stop { at, pause, .. } => {
                    due.push(nanos(*at));
                    due.push(nanos(*at).saturating_add(nanos(*pause)));
                }
                _ => {}
            }
        }
        // Besides the running ranks' timers (first in the list), only what lies ahead:
        // a cut due is made at every step, a stop's start needs nothing done.
        let Some(next) = due
            .into_iter()
            .enumerate()
            .filter(|&(i, t)| t > now || i < timers)
            .map(|(_, t)| t)
            .min()
        else {
            return false;
        };
        self.shared.clock.store(next, Ordering::Release);
        self.last_poll.retain(|_, at| *at > next);
        self.cuts(next);
        // Every timer now due fires, in rank order.
        for r in 0..self.timers.len() {
            let due = self.timers[r].is_some_and(|t| t.as_nanos() <= next);
            if due && !self.stopped(r) {
                self.timers[r] = None;
                self.trace.push(Step::Timer {
                    rank: r,
                    at: Duration::from_nanos(next),
                });
                if let Some(d) = self.drivers.get(r).cloned() {
                    d.timer_armed(None);
                    let again = d.timeout();
                    self.arm(r, again);
                }
            }
        }
        true
    }

    /// The script's cuts due by `now` happen.
    fn cuts(&mut self, now: u64) {
        let due: Vec<Fault> = self
            .faults
            .iter()
            .filter(|f| matches!(f, Fault::Cut { at, .. } if nanos(*at) <= now))
            .cloned()
            .collect();
        self.faults.retain(|f| !due.contains(f));
        for f in due {
            if let Fault::Cut { a, b, .. } = f {
                {
                    let mut st = lock(&self.shared.state);
                    st.links.remove(&(a, b));
                    st.links.remove(&(b, a));
                }
                if let (Some(da), Some(db)) = (self.drivers.get(a), self.drivers.get(b)) {
                    da.cut(b, local::cut());
                    db.cut(a, local::cut());
                }
                self.trace.push(Step::Fault(f));
            }
        }
    }

    /// The script's kills due: a rank that has started its call.
    fn kills(&mut self) {
        let due: Vec<Fault> = self
            .faults
            .iter()
            .filter(|f| match f {
                Fault::Kill { rank, at_call } => self
                    .drivers
                    .get(*rank)
                    .is_some_and(|d| d.calls_started() >= *at_call),
                _ => false,
            })
            .cloned()
            .collect();
        self.faults.retain(|f| !due.contains(f));
        for f in due {
            let Fault::Kill { rank, .. } = f else {
                continue;
            };
            self.trace.push(Step::Fault(f));
            self.dead.insert(rank);
            for t in self.tasks.iter_mut().filter(|t| t.rank == rank) {
                t.future = None;
            }
            {
                let mut st = lock(&self.shared.state);
                st.links
                    .retain(|(from, to), _| *from != rank && *to != rank);
                st.kicked.remove(&rank);
            }
            if let Some(slot) = self.results.get_mut(rank) {
                if slot.is_none() {
                    *slot = Some(Err(Error::Shutdown));
                }
            }
            if let Some(d) = self.drivers.get(rank) {
                d.stopped();
            }
            for (i, d) in self.drivers.iter().enumerate() {
                if i != rank {
                    d.peer_dead(rank);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fault_naming_a_rank_the_run_lacks_is_refused_on_every_rank() {
        let run = Seeded::new(3)
            .fault(Fault::Kill {
                rank: 3,
                at_call: 1,
            })
            .run(|_| async { Ok(()) });
        assert_eq!(run.results.len(), 3);
        for r in &run.results {
            assert!(
                matches!(r, Err(Error::InvalidArgument(m)) if m.contains("names rank 3")),
                "{r:?}"
            );
        }
        let run = Seeded::new(2)
            .fault(Fault::Cut {
                a: 1,
                b: 1,
                at: Duration::ZERO,
            })
            .run(|_| async { Ok(()) });
        assert!(run.results.iter().all(|r| r.is_err()), "{:?}", run.results);
    }

    #[test]
    fn the_seed_comes_from_the_variable_as_written() {
        assert_eq!(seed_from(None), 0);
        assert_eq!(seed_from(Some("1234")), 1234);
        assert_eq!(seed_from(Some(" 18446744073709551615\n")), u64::MAX);
        assert_eq!(seed_from(Some("abc")), 0);
    }

    #[test]
    fn the_generator_is_the_same_for_a_seed_and_covers_its_range() {
        let draw = |seed| {
            let mut g = SplitMix(seed);
            (0..1000).map(|_| g.below(7)).collect::<Vec<_>>()
        };
        assert_eq!(draw(5), draw(5));
        assert_ne!(draw(5), draw(6));
        let d = draw(5);
        assert!((0..7).all(|k| d.contains(&k)));
    }
}
