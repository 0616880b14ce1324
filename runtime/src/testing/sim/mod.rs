//! A deterministic driver of N engines: no threads, no clock, one seed.
//!
//! ```text
//!            submit ──▶ Engine 0 ─┐                       ┌─▶ Engine 1 ──▶ results, completed_at
//!                                 └─ Transmit ──▶ in flight (virtual time: send + latency
//!                                                  + seeded jitter + sometimes a long delay)
//!   faults: isolate / partition / kill ──▶ drops · detection events ──▶ handle_peer_lost
//!   idle:   the clock jumps to the next deadline ──▶ handle_timeout
//! ```
//!
//! # Delivery
//! Every message gets a delivery time: its send time plus [`SimOptions::latency`], plus a
//! seeded jitter up to [`SimOptions::jitter`], plus, for a seeded fraction of messages
//! ([`SimOptions::delayed_per_mille`]), an extra delay up to [`SimOptions::max_delay`]. With
//! [`Delivery::Timed`] (the default) messages arrive in delivery-time order, so a delayed
//! message arrives after messages sent later, on the same link or another, and the virtual
//! clock means something: one *propagation delay* is at most
//! [`Sim::max_propagation`]. With [`Delivery::AnyOrder`] each delivery picks any message in
//! flight at random (every interleaving is possible; the clock only moves forward, so time
//! bounds do not hold there). [`Delivery::Fifo`] is timed delivery where each link keeps its
//! send order, as TCP and in-process channels do.
//!
//! Each event (a delivery, a failure detection, a deadline) is one *step*; [`Sim::run`] takes
//! a step bound, so a livelock fails with [`SimError::StepBound`] instead of hanging, and
//! [`Sim::run_no_timeouts`] fails with [`SimError::Stuck`] when calls are left that only a
//! timeout could end (a deadlock).
//!
//! # Faults
//! Three ways to lose a rank, from a crash to a silent network cut:
//! - [`Sim::kill`]: the process dies. Its engine gets no more input; every message to or from
//!   it is dropped; every other rank that is not cut off learns at once (a reset
//!   connection): `handle_peer_lost` runs on each before `kill` returns.
//! - [`Sim::isolate`]: the network cuts the rank off, and a failure detector (a heartbeat, a
//!   TCP keep-alive) notices: messages to and from it are dropped from now on (those in flight
//!   included), and after [`SimOptions::detect_after`] (plus a seeded jitter up to
//!   [`SimOptions::detect_jitter`], drawn per observer) every other rank gets
//!   `handle_peer_lost(rank)` and the isolated rank gets `handle_peer_lost` for every other
//!   one. The rank itself stays alive: its deadlines still fire.
//! - [`Sim::partition`]: the same cut with no detector: only the calls' timeouts can end what
//!   waits on the rank.
//!
//! # What the simulator knows of a call
//! Besides results ([`Sim::take`]) and completion times ([`Sim::completed_at`]), the sim keeps
//! its own model of each collective, built from the call's schedule and the messages it
//! delivered to it, independent of the engine's state: [`Sim::awaited`] (whose messages the
//! current step still waits for) and [`Sim::talks_to`] (whether the rest of the schedule
//! exchanges messages with a rank). Fault tests judge the engine's errors against it.
//!
//! # Determinism and replay
//! Everything random comes from one [`Rng`] seeded with the seed; the messages an engine
//! emits for one input are ordered by destination and header before they draw their delays,
//! so not even a `HashMap`'s iteration order inside an engine leaks into the run. The same
//! seed and the same calls give the same [`Sim::trace_text`], line for line: a failing test
//! prints it (it starts with the seed), and rerunning the case with that seed replays it.
//! One line per event (a ring all_reduce of three ranks, rank 2 isolated after four
//! deliveries, seed 42):
//!
//! ```text
//! seed 42: 3 ranks, Timed delivery, latency 10000ns + <=5000ns, 100/1000 delayed <=200000ns, detection after 10000ns + <=0ns
//! t=11891ns 0->1 +11891ns data g=world #0 tag=0 all_reduce(float32, count 4, sum, ring) 4B
//! t=13096ns 1->2 +13096ns data g=world #0 tag=0 all_reduce(float32, count 4, sum, ring) 8B
//! t=13439ns 2->0 +13439ns data g=world #0 tag=0 all_reduce(float32, count 4, sum, ring) 4B
//! t=22829ns 1->2 +10938ns data g=world #0 tag=1 all_reduce(float32, count 4, sum, ring) 4B
//! t=22829ns isolate 2
//! t=22829ns 2->0 dropped data g=world #0 tag=1
//! t=32829ns 1 detects loss of 2
//! t=32829ns 1 op0 err: peer rank 2 was lost
//! t=42917ns 1->0 +10088ns abort g=world: peer rank 2 was lost 0B
//! ```
//!
//! (`t=` is the virtual time of the event, `+` a message's time in flight, `#` the call's
//! sequence number in its group, then the sender's call and the payload size.)

mod losses;
mod network;
mod options;
mod run;
mod trace;
mod watch;

pub use network::LinkStats;
pub use options::{Delivery, Rng, SimOptions};
pub use run::SimError;
pub use trace::{TraceEntry, TraceEvent};

use crate::collective::{Output, Plan, Request};
use crate::engine::{Engine, OpId};
use crate::error::{Error, Result};
use crate::group::{CallOptions, GroupId, GroupInfo, GroupOptions};
use crate::time::Time;
use crate::wire::link::Outbox;
use crate::wire::message::Transmit;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;
use watch::Watch;

mod boards;

/// A message on its way.
struct Flight {
    at: Time,
    sent: Time,
    tiebreak: u64,
    t: Transmit,
}

/// A failure detection on its way: `observer` will learn that `lost` is gone.
struct Detection {
    at: Time,
    tiebreak: u64,
    observer: usize,
    lost: usize,
}

/// N engines and the messages between them.
pub struct Sim {
    engines: Vec<Engine>,
    opts: SimOptions,
    in_flight: Vec<Flight>,
    detections: Vec<Detection>,
    rng: Rng,
    now: Time,
    cut: BTreeSet<usize>,
    dead: BTreeSet<usize>,
    seqs: HashMap<(usize, GroupId), u64>,
    groups: HashMap<(usize, GroupId), GroupInfo>,
    results: HashMap<(usize, OpId), Result<Output>>,
    completed_at: HashMap<(usize, OpId), Time>,
    trace: Vec<TraceEntry>,
    watches: HashMap<(usize, OpId), Watch>,
    watched: HashMap<(usize, GroupId, u64), OpId>,
    /// Each (source, destination) link's outbox: messages its link refused ("would block").
    links: BTreeMap<(usize, usize), Outbox<Transmit>>,
    /// When the links with messages waiting are retried (one latency after they refused).
    retry_links: Option<Time>,
    /// Frames that went through the codec, and send attempts a link refused.
    stats: LinkStats,
    seed: u64,
    /// Under [`Delivery::Fifo`]: each link's latest delivery time, and a counter that
    /// breaks ties in send order.
    fifo: HashMap<(usize, usize), Time>,
    sent: u64,
    /// Each group's board and its members' calls, when boards are on ([`Sim::with_boards`]).
    boards: Option<boards::SimBoards>,
}

impl Sim {
    /// `n` ranks with the world group, default group options and the default network.
    pub fn new(n: usize, seed: u64) -> Sim {
        Sim::with_options(n, seed, GroupOptions::default())
    }

    /// `n` ranks with the world group and `opts`, on the default network.
    pub fn with_options(n: usize, seed: u64, opts: GroupOptions) -> Sim {
        Sim::with_config(n, seed, opts, SimOptions::default())
    }

    /// `n` ranks with the world group and `opts`, on the network `net`.
    pub fn with_config(n: usize, seed: u64, opts: GroupOptions, net: SimOptions) -> Sim {
        let mut sim = Sim {
            engines: (0..n).map(Engine::new).collect(),
            opts: net,
            in_flight: Vec::new(),
            fifo: HashMap::new(),
            sent: 0,
            detections: Vec::new(),
            rng: Rng::new(seed),
            now: Time::ZERO,
            cut: BTreeSet::new(),
            dead: BTreeSet::new(),
            seqs: HashMap::new(),
            groups: HashMap::new(),
            results: HashMap::new(),
            completed_at: HashMap::new(),
            trace: Vec::new(),
            watches: HashMap::new(),
            watched: HashMap::new(),
            links: BTreeMap::new(),
            retry_links: None,
            stats: LinkStats::default(),
            seed,
            boards: None,
        };
        for r in 0..n {
            if let Ok(info) = GroupInfo::world(n, r, opts.clone()) {
                sim.add_group(r, info);
            }
        }
        sim
    }

    /// What went through the links so far: frames through the codec, "would block" refusals.
    pub fn link_stats(&self) -> LinkStats {
        self.stats
    }

    /// Rank `rank`'s engine (to inspect its queues).
    pub fn engine(&self, rank: usize) -> Option<&Engine> {
        self.engines.get(rank)
    }

    /// Rank `rank`'s engine, to tell it what its driver would (a device operation's end).
    pub fn engine_mut(&mut self, rank: usize) -> Option<&mut Engine> {
        self.engines.get_mut(rank)
    }

    /// The seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The network model.
    pub fn options(&self) -> &SimOptions {
        &self.opts
    }

    /// World size.
    pub fn size(&self) -> usize {
        self.engines.len()
    }

    /// Virtual now.
    pub fn now(&self) -> Time {
        self.now
    }

    /// The longest a message can take from send to delivery (latency, jitter and delay):
    /// one propagation delay, under [`Delivery::Timed`].
    pub fn max_propagation(&self) -> Duration {
        self.opts.latency + self.opts.jitter + self.opts.max_delay
    }

    /// The longest an isolation takes to reach every observer.
    pub fn max_detection(&self) -> Duration {
        self.opts.detect_after + self.opts.detect_jitter
    }

    /// Whether `rank` was cut off ([`isolate`](Self::isolate), [`partition`](Self::partition))
    /// or [`kill`](Self::kill)ed.
    pub fn is_lost(&self, rank: usize) -> bool {
        self.cut.contains(&rank) || self.dead.contains(&rank)
    }

    /// Calls in flight on `rank` (on its engine and its boards).
    pub fn pending(&self, rank: usize) -> usize {
        self.engines.get(rank).map_or(0, Engine::pending) + self.board_pending(rank)
    }

    /// Global rank `rank`'s view of group `group` (to plan calls with [`Plan::new`] and
    /// [`submit_plan`](Self::submit_plan) them).
    pub fn group(&self, rank: usize, group: GroupId) -> Result<GroupInfo> {
        self.groups
            .get(&(rank, group))
            .cloned()
            .ok_or(Error::NotAMember { group, rank })
    }

    /// Registers a group on global rank `rank`.
    pub fn add_group(&mut self, rank: usize, info: GroupInfo) {
        self.groups.insert((rank, info.id), info.clone());
        let now = self.now;
        if let Some(e) = self.engines.get_mut(rank) {
            e.add_group(info, now);
            self.drain(rank);
        }
    }

    /// Registers, on each member, a group of `members` (global ranks, in group-rank order)
    /// with `id`.
    pub fn add_group_everywhere(&mut self, id: GroupId, members: &[usize], opts: GroupOptions) {
        for &m in members {
            if let Ok(info) = GroupInfo::new(id, members.to_vec(), m, opts.clone()) {
                self.add_group(m, info);
            }
        }
    }

    /// Plans and submits a call on global rank `rank`; argument errors come back at once.
    /// As a communicator does, a collective whose arguments fail their checks still takes
    /// its sequence number, and the other members are told ([`Engine::fail_call`]).
    ///
    /// [`Engine::fail_call`]: crate::Engine::fail_call
    pub fn submit(
        &mut self,
        rank: usize,
        group: GroupId,
        req: Request,
        opts: &CallOptions,
    ) -> Result<OpId> {
        let info = self
            .groups
            .get(&(rank, group))
            .cloned()
            .ok_or(Error::NotAMember { group, rank })?;
        let p2p = req.is_p2p();
        let planned = match self.submit_on_board(rank, &info, &req, opts) {
            Some(Ok(id)) => return Ok(id),
            Some(Err(e)) => Err(e),
            None => Plan::new(req, &info, opts),
        };
        match planned {
            Ok(plan) => self.submit_plan(rank, group, plan),
            Err(e) => {
                if !p2p {
                    let seq = self.next_seq(rank, group);
                    self.engines[rank].fail_call(group, seq, &e);
                    self.drain(rank);
                }
                Err(e)
            }
        }
    }

    /// Takes rank `rank`'s next sequence number of group `group`.
    fn next_seq(&mut self, rank: usize, group: GroupId) -> u64 {
        let s = self.seqs.entry((rank, group)).or_insert(0);
        *s += 1;
        *s - 1
    }

    /// Submits a call planned already, such as a hand-made schedule
    /// ([`Plan::from_schedule`]) in a test that shows the simulator catches a broken one.
    pub fn submit_plan(&mut self, rank: usize, group: GroupId, plan: Plan) -> Result<OpId> {
        let info = self
            .groups
            .get(&(rank, group))
            .ok_or(Error::NotAMember { group, rank })?;
        let info = info.clone();
        let members = info.members.clone();
        let seq = if plan.is_p2p() {
            0
        } else {
            self.next_seq(rank, group)
        };
        if !plan.is_p2p() {
            // A member's slot of this call on the board: the calls differ (as the driver's
            // `clash`); the call ends with the mismatch, never reaching the engine.
            if let Some(e) = self.clash_on_board(rank, &info, seq, plan.fingerprint()) {
                let id = self.board_op_id();
                self.complete(rank, id, Err(e));
                return Ok(id);
            }
        }
        let watch = plan
            .schedule()
            .map(|sched| Watch::new(group, seq, members.to_vec(), sched));
        let now = self.now;
        let id = self.engines[rank].submit(group, seq, plan, now);
        if let Some(w) = watch {
            self.watched.insert((rank, group, seq), id);
            self.watches.insert((rank, id), w);
        }
        self.drain(rank);
        Ok(id)
    }

    /// Runs `f` on rank `rank`'s engine as its driver would between two inputs (a
    /// mailbox read, a receive taken at once), then takes what the engine made of it:
    /// messages to send, calls completed.
    pub fn on_engine<R>(&mut self, rank: usize, f: impl FnOnce(&mut Engine) -> R) -> Option<R> {
        let r = f(self.engines.get_mut(rank)?);
        self.drain(rank);
        Some(r)
    }

    /// The result of a call, once it has one.
    pub fn result(&self, rank: usize, op: OpId) -> Option<&Result<Output>> {
        self.results.get(&(rank, op))
    }

    /// Takes the result of a call.
    pub fn take(&mut self, rank: usize, op: OpId) -> Option<Result<Output>> {
        self.results.remove(&(rank, op))
    }

    /// When a call completed, in virtual time.
    pub fn completed_at(&self, rank: usize, op: OpId) -> Option<Time> {
        self.completed_at.get(&(rank, op)).copied()
    }
}
