//! A deterministic driver of N engines: no threads, no clock, one seed.
//!
//! Messages in flight form a pool; each delivery picks one at random (seeded), so every
//! interleaving and reordering is possible, including a later step's message overtaking an
//! earlier one. When nothing is in flight but calls are pending, the virtual clock jumps to
//! the next deadline. A step bound turns a livelock or deadlock into an error instead of a
//! hang. [`Sim::isolate`] cuts a rank off (its messages are dropped, in both directions);
//! [`Sim::kill`] does so and tells the others' engines the peer is lost.

use crate::collective::{Output, Plan, Request};
use crate::engine::{Engine, OpId};
use crate::error::{Error, Result};
use crate::group::{CallOptions, GroupId, GroupInfo, GroupOptions};
use crate::message::Transmit;
use crate::time::Time;
use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

/// SplitMix64: a small, good-enough seeded generator (no dependency).
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator with `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
}

/// Why a simulation did not settle.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SimError {
    /// The step bound was reached with messages still in flight.
    StepBound {
        /// Deliveries made.
        steps: usize,
    },
    /// Nothing in flight, calls pending, and no deadline to advance to.
    Stuck {
        /// Pending calls per rank.
        pending: Vec<usize>,
    },
}

/// One delivered message, for traces.
#[derive(Clone, Debug)]
pub struct TraceEntry {
    /// Virtual time.
    pub at: Time,
    /// Sender.
    pub src: usize,
    /// Receiver.
    pub dst: usize,
    /// The header.
    pub header: crate::message::Header,
}

/// N engines and the messages between them.
pub struct Sim {
    engines: Vec<Engine>,
    in_flight: Vec<(Time, Transmit)>,
    rng: Rng,
    now: Time,
    latency: Duration,
    isolated: BTreeSet<usize>,
    seqs: HashMap<(usize, GroupId), u64>,
    groups: HashMap<(usize, GroupId), GroupInfo>,
    results: HashMap<(usize, OpId), Result<Output>>,
    completed_at: HashMap<(usize, OpId), Time>,
    trace: Vec<TraceEntry>,
    seed: u64,
}

impl Sim {
    /// `n` ranks with the world group and default options.
    pub fn new(n: usize, seed: u64) -> Sim {
        Sim::with_options(n, seed, GroupOptions::default())
    }

    /// `n` ranks with the world group and `opts`.
    pub fn with_options(n: usize, seed: u64, opts: GroupOptions) -> Sim {
        let mut sim = Sim {
            engines: (0..n).map(Engine::new).collect(),
            in_flight: Vec::new(),
            rng: Rng::new(seed),
            now: Time::ZERO,
            latency: Duration::from_micros(10),
            isolated: BTreeSet::new(),
            seqs: HashMap::new(),
            groups: HashMap::new(),
            results: HashMap::new(),
            completed_at: HashMap::new(),
            trace: Vec::new(),
            seed,
        };
        for r in 0..n {
            if let Ok(info) = GroupInfo::world(n, r, opts.clone()) {
                sim.add_group(r, info);
            }
        }
        sim
    }

    /// The seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// World size.
    pub fn size(&self) -> usize {
        self.engines.len()
    }

    /// Virtual now.
    pub fn now(&self) -> Time {
        self.now
    }

    /// Registers a group on global rank `rank`.
    pub fn add_group(&mut self, rank: usize, info: GroupInfo) {
        self.groups.insert((rank, info.id), info.clone());
        let now = self.now;
        if let Some(e) = self.engines.get_mut(rank) {
            e.add_group(info, now);
        }
        self.drain(rank);
    }

    /// Registers, on each member, a group of `members` (global ranks) with `id`.
    pub fn add_group_everywhere(&mut self, id: GroupId, members: &[usize], opts: GroupOptions) {
        for &m in members {
            if let Ok(info) = GroupInfo::new(id, members.to_vec(), m, opts.clone()) {
                self.add_group(m, info);
            }
        }
    }

    /// Plans and submits a call on global rank `rank`; argument errors come back at once.
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
            .ok_or(Error::NotAMember { group, rank })?;
        let plan = Plan::new(req, info, opts)?;
        let seq = if plan.is_p2p() {
            0
        } else {
            let s = self.seqs.entry((rank, group)).or_insert(0);
            *s += 1;
            *s - 1
        };
        let now = self.now;
        let id = self.engines[rank].submit(group, seq, plan, now);
        self.drain(rank);
        Ok(id)
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

    /// The messages delivered so far.
    pub fn trace(&self) -> &[TraceEntry] {
        &self.trace
    }

    /// The trace, one line per message (for a failing seed's report).
    pub fn trace_text(&self) -> String {
        let mut s = format!("seed {}\n", self.seed);
        for t in &self.trace {
            s.push_str(&format!(
                "{:>10}ns {} -> {}: {:?}\n",
                t.at.as_nanos(),
                t.src,
                t.dst,
                t.header
            ));
        }
        s
    }

    /// Cuts `rank` off silently: everything to or from it is dropped from now on.
    pub fn isolate(&mut self, rank: usize) {
        self.isolated.insert(rank);
        self.in_flight
            .retain(|(_, t)| t.dst != rank && t.msg.src != rank);
    }

    /// Isolates `rank` and tells every other engine, as a closed connection would.
    pub fn kill(&mut self, rank: usize) {
        self.isolate(rank);
        let now = self.now;
        for r in 0..self.engines.len() {
            if !self.isolated.contains(&r) {
                self.engines[r].handle_peer_lost(rank, now);
                self.drain(r);
            }
        }
    }

    fn drain(&mut self, rank: usize) {
        let at = self.now + self.latency;
        while let Some(t) = self.engines[rank].poll_transmit() {
            if !self.isolated.contains(&rank) && !self.isolated.contains(&t.dst) {
                self.in_flight.push((at, t));
            }
        }
        while let Some(ev) = self.engines[rank].poll_event() {
            self.completed_at.insert((rank, ev.op), self.now);
            self.results.insert((rank, ev.op), ev.result);
        }
    }

    /// Delivers one message chosen at random; `false` when none is in flight.
    pub fn step(&mut self) -> bool {
        if self.in_flight.is_empty() {
            return false;
        }
        let i = self.rng.below(self.in_flight.len());
        let (at, t) = self.in_flight.swap_remove(i);
        self.now = self.now.max(at);
        self.trace.push(TraceEntry {
            at: self.now,
            src: t.msg.src,
            dst: t.dst,
            header: t.msg.header.clone(),
        });
        let dst = t.dst;
        if let Some(e) = self.engines.get_mut(dst) {
            e.handle_message(t.msg, self.now);
            self.drain(dst);
        }
        true
    }

    /// Runs until nothing is in flight and nothing is pending, advancing the clock to
    /// deadlines when stuck, for at most `max_steps` deliveries.
    pub fn run(&mut self, max_steps: usize) -> std::result::Result<(), SimError> {
        let mut steps = 0;
        loop {
            while self.step() {
                steps += 1;
                if steps >= max_steps {
                    return Err(SimError::StepBound { steps });
                }
            }
            let live = |r: &usize| !self.isolated.contains(r);
            let next = (0..self.engines.len())
                .filter(live)
                .filter_map(|r| self.engines[r].poll_timeout())
                .min();
            match next {
                None => return Ok(()),
                Some(t) => {
                    self.now = self.now.max(t);
                    let now = self.now;
                    for r in 0..self.engines.len() {
                        if !self.isolated.contains(&r) {
                            self.engines[r].handle_timeout(now);
                            self.drain(r);
                        }
                    }
                    if self.in_flight.is_empty()
                        && (0..self.engines.len())
                            .filter(|r| !self.isolated.contains(r))
                            .all(|r| self.engines[r].pending() == 0)
                    {
                        return Ok(());
                    }
                    steps += 1;
                    if steps >= max_steps {
                        return Err(SimError::Stuck {
                            pending: self.engines.iter().map(Engine::pending).collect(),
                        });
                    }
                }
            }
        }
    }

    /// Runs until quiescent, like [`run`](Self::run), but fails when the clock had to move:
    /// a correct set of calls completes without any timeout firing.
    pub fn run_no_timeouts(&mut self, max_steps: usize) -> std::result::Result<(), SimError> {
        let mut steps = 0;
        while self.step() {
            steps += 1;
            if steps >= max_steps {
                return Err(SimError::StepBound { steps });
            }
        }
        let pending: Vec<usize> = self.engines.iter().map(Engine::pending).collect();
        if pending.iter().any(|&p| p > 0) {
            return Err(SimError::Stuck { pending });
        }
        Ok(())
    }
}
