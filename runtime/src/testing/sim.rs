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

use crate::collective::{Output, Plan, Request};
use crate::engine::{Engine, OpId};
use crate::error::{Error, Result};
use crate::group::{CallOptions, GroupId, GroupInfo, GroupOptions};
use crate::time::Time;
use crate::wire::codec::{decode, encode, Limits};
use crate::wire::link::{Link, LinkError, Outbox};
use crate::wire::message::{Header, Transmit};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;
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

    /// Uniform in `0..=max`, to the nanosecond.
    pub fn up_to(&mut self, max: Duration) -> Duration {
        let n = u64::try_from(max.as_nanos()).unwrap_or(u64::MAX);
        if n == 0 {
            return Duration::ZERO;
        }
        Duration::from_nanos(self.next_u64() % n.saturating_add(1).max(1))
    }
}

/// The order in which messages in flight are delivered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Delivery {
    /// In order of delivery time (send time, latency, jitter, delay); ties broken at random.
    /// Virtual time is consistent, so time bounds can be checked.
    #[default]
    Timed,
    /// Like [`Timed`](Delivery::Timed), but each link delivers in the order it was sent on
    /// (a message is never delivered before one sent earlier on its link), as TCP and
    /// in-process channels do: what guarantees that rest on FIFO links are checked here.
    Fifo,
    /// Any message in flight, picked at random: every interleaving is possible, but the clock
    /// only follows the picks, so time bounds do not hold.
    AnyOrder,
}

/// The network and failure-detection model of a [`Sim`].
#[derive(Clone, Debug, PartialEq)]
pub struct SimOptions {
    /// How deliveries are ordered.
    pub delivery: Delivery,
    /// The latency every message has.
    pub latency: Duration,
    /// Each message gets an extra latency uniform in `0..=jitter`.
    pub jitter: Duration,
    /// Per mille of messages that are delayed, in addition, by up to
    /// [`max_delay`](Self::max_delay).
    pub delayed_per_mille: u32,
    /// The longest extra delay of a delayed message.
    pub max_delay: Duration,
    /// How long after [`Sim::isolate`] the other ranks learn the rank is lost.
    pub detect_after: Duration,
    /// Each observer learns of an isolation up to this much later than
    /// [`detect_after`](Self::detect_after) (seeded, per observer).
    pub detect_jitter: Duration,
    /// Per mille of send attempts on which a rank's link to a peer says "would block": the
    /// message waits in the link's [`Outbox`], in order, and is retried one latency later.
    /// Capped at 999 (a link that never takes anything would never deliver).
    pub would_block_per_mille: u32,
}

impl Default for SimOptions {
    /// 10 µs latency, up to 5 µs jitter, one message in ten delayed by up to 200 µs, timed
    /// delivery, isolation detected after one latency, links that would block on one send
    /// attempt in ten.
    fn default() -> Self {
        SimOptions {
            delivery: Delivery::Timed,
            latency: Duration::from_micros(10),
            jitter: Duration::from_micros(5),
            delayed_per_mille: 100,
            max_delay: Duration::from_micros(200),
            detect_after: Duration::from_micros(10),
            detect_jitter: Duration::ZERO,
            would_block_per_mille: 100,
        }
    }
}

impl SimOptions {
    /// With another delivery order.
    pub fn with_delivery(mut self, delivery: Delivery) -> Self {
        self.delivery = delivery;
        self
    }

    /// With another detection delay and jitter for [`Sim::isolate`].
    pub fn with_detection(mut self, after: Duration, jitter: Duration) -> Self {
        self.detect_after = after;
        self.detect_jitter = jitter;
        self
    }
}

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

/// What happened, for traces.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum TraceEvent {
    /// A message was delivered.
    Delivered {
        /// Sender (global).
        src: usize,
        /// Receiver (global).
        dst: usize,
        /// When it was sent.
        sent: Time,
        /// Its header.
        header: Header,
        /// Payload bytes.
        bytes: usize,
    },
    /// A message was dropped because its sender or receiver is cut off or dead.
    Dropped {
        /// Sender (global).
        src: usize,
        /// Receiver (global).
        dst: usize,
        /// Its header.
        header: Header,
    },
    /// [`Sim::isolate`] (`detected`) or [`Sim::partition`] (not `detected`).
    Cut {
        /// The rank cut off.
        rank: usize,
        /// Whether the others will be told.
        detected: bool,
    },
    /// [`Sim::kill`].
    Killed {
        /// The rank.
        rank: usize,
    },
    /// `observer`'s engine was told that `lost` is gone.
    Detected {
        /// The rank told.
        observer: usize,
        /// The rank lost.
        lost: usize,
    },
    /// A call completed or failed.
    Done {
        /// The rank (global).
        rank: usize,
        /// The call.
        op: OpId,
        /// Its error, if it failed.
        error: Option<Error>,
    },
}

/// One event of a run, at a virtual time.
#[derive(Clone, Debug)]
pub struct TraceEntry {
    /// Virtual time.
    pub at: Time,
    /// What happened.
    pub event: TraceEvent,
}

/// A header in a few words: kind, group, sequence number, tag (and call, for data).
fn header_text(h: &Header, src: usize, with_call: bool) -> String {
    match h {
        Header::Data {
            group,
            seq,
            tag,
            call,
        } if with_call => format!("data g={group} #{seq} tag={tag} {call}"),
        Header::Data {
            group, seq, tag, ..
        } => format!("data g={group} #{seq} tag={tag}"),
        Header::P2p {
            group,
            tag,
            seq,
            dtype,
            count,
            eager,
            ..
        } => {
            let how = if *eager { "eager" } else { "solicited" };
            format!("p2p g={group} tag={tag} #{seq} {dtype}x{count} {how}")
        }
        Header::Abort { group, reason } if with_call => {
            format!(
                "abort g={group}: {}",
                (**reason).clone().into_error(*group, src)
            )
        }
        Header::Abort { group, .. } => format!("abort g={group}"),
        Header::Credit { group, calls } => format!("credit g={group} calls={calls}"),
        Header::WantCredit { group, seq } => format!("want-credit g={group} #{seq}"),
        Header::P2pGrant { group, tag, upto } => format!("p2p-grant g={group} tag={tag} <{upto}"),
        Header::P2pConsumed { group, eager } => format!("p2p-consumed g={group} eager={eager}"),
        Header::Inquire { group, seq } => format!("inquire g={group} #{seq}"),
        Header::Status {
            group, seq, made, ..
        } => match made {
            Some(fp) if with_call => format!("status g={group} #{seq} made {fp}"),
            Some(_) => format!("status g={group} #{seq} made"),
            None => format!("status g={group} #{seq} not reached"),
        },
    }
}

impl fmt::Display for TraceEntry {
    /// One compact line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = self.at.as_nanos();
        match &self.event {
            TraceEvent::Delivered {
                src,
                dst,
                sent,
                header,
                bytes,
            } => write!(
                f,
                "t={t}ns {src}->{dst} +{}ns {} {bytes}B",
                self.at.saturating_since(*sent).as_nanos(),
                header_text(header, *src, true)
            ),
            TraceEvent::Dropped { src, dst, header } => {
                write!(
                    f,
                    "t={t}ns {src}->{dst} dropped {}",
                    header_text(header, *src, false)
                )
            }
            TraceEvent::Cut {
                rank,
                detected: true,
            } => write!(f, "t={t}ns isolate {rank}"),
            TraceEvent::Cut { rank, .. } => write!(f, "t={t}ns partition {rank} (silent)"),
            TraceEvent::Killed { rank } => write!(f, "t={t}ns kill {rank}"),
            TraceEvent::Detected { observer, lost } => {
                write!(f, "t={t}ns {observer} detects loss of {lost}")
            }
            TraceEvent::Done {
                rank,
                op,
                error: None,
            } => write!(f, "t={t}ns {rank} op{} ok", op.0),
            TraceEvent::Done {
                rank,
                op,
                error: Some(e),
            } => write!(f, "t={t}ns {rank} op{} err: {e}", op.0),
        }
    }
}

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

/// What [`Sim::step`] does next.
enum Next {
    Detect(usize),
    Deadline(Time),
    Deliver(usize),
    /// Retry the links that said "would block".
    Flush(Time),
}

/// Sort key of an engine's outgoing messages: destination and header, never emission order.
fn transmit_key(t: &Transmit) -> (usize, u64, u8, u64, u32) {
    let (group, kind, seq, tag) = match &t.msg.header {
        Header::Data {
            group, seq, tag, ..
        } => (group.0, 0, *seq, *tag),
        Header::P2p {
            group, tag, seq, ..
        } => (group.0, 1, *seq, *tag),
        Header::Abort { group, .. } => (group.0, 2, 0, 0),
        Header::Credit { group, calls } => (group.0, 3, *calls, 0),
        Header::WantCredit { group, seq } => (group.0, 4, *seq, 0),
        Header::P2pGrant { group, tag, upto } => (group.0, 5, *upto, *tag),
        Header::P2pConsumed { group, eager } => (group.0, 6, *eager, 0),
        Header::Inquire { group, seq } => (group.0, 7, *seq, 0),
        Header::Status { group, seq, .. } => (group.0, 8, *seq, 0),
    };
    (t.dst, group, kind, seq, tag)
}

/// A collective as seen from outside its engine: its schedule and the messages delivered to
/// it, up to its completion. An independent model of how far the call got.
struct Watch {
    group: GroupId,
    seq: u64,
    members: Vec<usize>,
    steps: Vec<WatchStep>,
    got: HashSet<(usize, u32)>,
    done: bool,
}

/// One step of a watched call, in group-local ranks.
struct WatchStep {
    /// The peers it sends to or receives from.
    peers: Vec<usize>,
    /// Its receives: (source, tag).
    recvs: Vec<(usize, u32)>,
}

impl Watch {
    /// The step the engine must be at: the first whose receives have not all arrived.
    fn step(&self) -> usize {
        self.steps
            .iter()
            .position(|st| !st.recvs.iter().all(|k| self.got.contains(k)))
            .unwrap_or(self.steps.len())
    }
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
}

/// What went through a simulator's links.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinkStats {
    /// Messages encoded into frames and decoded back.
    pub frames: u64,
    /// Send attempts a link refused with "would block".
    pub would_block: u64,
}

/// A simulated link: says "would block" at random; what it takes goes to `out`.
struct SimLink<'a> {
    rng: &'a mut Rng,
    per_mille: u32,
    out: &'a mut Vec<Transmit>,
    refused: &'a mut u64,
}

impl Link<Transmit> for SimLink<'_> {
    fn try_send(&mut self, t: Transmit) -> std::result::Result<(), LinkError<Transmit>> {
        if self.rng.below(1000) < self.per_mille.min(999) as usize {
            *self.refused += 1;
            return Err(LinkError::WouldBlock(t));
        }
        self.out.push(t);
        Ok(())
    }
}

/// The message as a transport would deliver it: encoded into a frame, decoded from one
/// contiguous buffer, the source stamped from the link. A failure is a codec bug.
fn through_the_wire(t: Transmit) -> Transmit {
    let mut buf = encode(&t.msg).to_contiguous();
    match decode(&mut buf, &Limits::default()) {
        Ok(Some(d)) if buf.is_empty() => Transmit {
            dst: t.dst,
            msg: d.into_message(t.msg.src),
        },
        other => panic!(
            "codec: a frame of {:?} came back as {other:?}",
            t.msg.header
        ),
    }
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

    /// Calls in flight on `rank`.
    pub fn pending(&self, rank: usize) -> usize {
        self.engines.get(rank).map_or(0, Engine::pending)
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
        self.submit_plan(rank, group, plan)
    }

    /// Submits a call planned already, such as a hand-made schedule
    /// ([`Plan::from_schedule`]) in a test that shows the simulator catches a broken one.
    pub fn submit_plan(&mut self, rank: usize, group: GroupId, plan: Plan) -> Result<OpId> {
        let info = self
            .groups
            .get(&(rank, group))
            .ok_or(Error::NotAMember { group, rank })?;
        let members = info.members.clone();
        let seq = if plan.is_p2p() {
            0
        } else {
            let s = self.seqs.entry((rank, group)).or_insert(0);
            *s += 1;
            *s - 1
        };
        let watch = plan.schedule().map(|sched| Watch {
            group,
            seq,
            members,
            steps: sched
                .steps
                .iter()
                .map(|st| {
                    let peers = st.sends.iter().map(|x| x.peer);
                    let peers = peers.chain(st.recvs.iter().map(|x| x.peer)).collect();
                    WatchStep {
                        peers,
                        recvs: st.recvs.iter().map(|x| (x.peer, x.tag)).collect(),
                    }
                })
                .collect(),
            got: HashSet::new(),
            done: false,
        });
        let now = self.now;
        let id = self.engines[rank].submit(group, seq, plan, now);
        if let Some(w) = watch {
            self.watched.insert((rank, group, seq), id);
            self.watches.insert((rank, id), w);
        }
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

    /// Global ranks whose messages collective `op` of `rank` was still waiting for in its
    /// current step when it completed (or now, if it has not): the sim's own model, from the
    /// call's schedule and the messages delivered to it, independent of the engine's state.
    /// `None` for point-to-point calls and unknown ones.
    pub fn awaited(&self, rank: usize, op: OpId) -> Option<Vec<usize>> {
        let w = self.watches.get(&(rank, op))?;
        let mut peers: Vec<usize> = match w.steps.get(w.step()) {
            None => Vec::new(),
            Some(st) => st
                .recvs
                .iter()
                .filter(|k| !w.got.contains(k))
                .map(|&(p, _)| w.members[p])
                .collect(),
        };
        peers.sort_unstable();
        peers.dedup();
        Some(peers)
    }

    /// Whether the rest of collective `op`'s schedule on `rank` (its current step, sends
    /// included, and every later one) exchanges messages with global rank `peer`, when it
    /// completed (or now): the sim's own model, like [`awaited`](Self::awaited).
    pub fn talks_to(&self, rank: usize, op: OpId, peer: usize) -> Option<bool> {
        let w = self.watches.get(&(rank, op))?;
        let Some(local) = w.members.iter().position(|&m| m == peer) else {
            return Some(false);
        };
        Some(
            w.steps[w.step()..]
                .iter()
                .any(|st| st.peers.contains(&local)),
        )
    }

    /// Everything that happened so far, in order.
    pub fn trace(&self) -> &[TraceEntry] {
        &self.trace
    }

    /// The trace, one compact line per event, after a line with the seed and the network
    /// model (for a failing seed's report; the same seed and calls give the same text).
    pub fn trace_text(&self) -> String {
        let o = &self.opts;
        let mut s = format!(
            "seed {}: {} ranks, {:?} delivery, latency {}ns + <={}ns, {}/1000 delayed <={}ns, detection after {}ns + <={}ns\n",
            self.seed,
            self.size(),
            o.delivery,
            o.latency.as_nanos(),
            o.jitter.as_nanos(),
            o.delayed_per_mille,
            o.max_delay.as_nanos(),
            o.detect_after.as_nanos(),
            o.detect_jitter.as_nanos(),
        );
        for t in &self.trace {
            s.push_str(&t.to_string());
            s.push('\n');
        }
        s
    }

    /// Cuts `rank` off and lets a failure detector notice: see the [module docs](self).
    pub fn isolate(&mut self, rank: usize) {
        self.cut_off(rank, true);
    }

    /// Cuts `rank` off silently (no detector; only timeouts notice): see the
    /// [module docs](self).
    pub fn partition(&mut self, rank: usize) {
        self.cut_off(rank, false);
    }

    fn cut_off(&mut self, rank: usize, detected: bool) {
        if rank >= self.size() || self.is_lost(rank) {
            return;
        }
        self.cut.insert(rank);
        self.log(TraceEvent::Cut { rank, detected });
        self.drop_in_flight(rank);
        if detected {
            for r in 0..self.size() {
                if r == rank || self.dead.contains(&r) {
                    continue;
                }
                for (observer, lost) in [(r, rank), (rank, r)] {
                    let at =
                        self.now + self.opts.detect_after + self.rng.up_to(self.opts.detect_jitter);
                    let tiebreak = self.rng.next_u64();
                    self.detections.push(Detection {
                        at,
                        tiebreak,
                        observer,
                        lost,
                    });
                }
            }
        }
    }

    /// Shuts `rank` down (see [`Engine::shutdown`]): its pending calls fail with `Shutdown`,
    /// and it keeps sending what flow control holds for at most `linger` (the simulator keeps
    /// delivering to it, as a driver does until the engine is drained).
    pub fn shutdown(&mut self, rank: usize, linger: Duration) {
        if rank >= self.size() {
            return;
        }
        let now = self.now;
        self.engines[rank].shutdown(now, linger);
        self.drain(rank);
    }

    /// Destroys group `group` on `rank` (see [`Engine::destroy_group`]) and returns its
    /// pending error; the rank keeps running.
    pub fn destroy_group(&mut self, rank: usize, group: GroupId) -> Result<()> {
        let Some(e) = self.engines.get_mut(rank) else {
            return Err(Error::invalid(format!("no rank {rank}")));
        };
        let r = e.destroy_group(group);
        self.groups.remove(&(rank, group));
        self.drain(rank);
        r
    }

    /// Kills `rank`: its engine stops, its messages are dropped, and every other rank that is
    /// not cut off is told at once, as a reset connection would.
    pub fn kill(&mut self, rank: usize) {
        if rank >= self.size() || self.dead.contains(&rank) {
            return;
        }
        self.dead.insert(rank);
        self.log(TraceEvent::Killed { rank });
        self.drop_in_flight(rank);
        self.detections.retain(|d| d.observer != rank);
        let now = self.now;
        for r in 0..self.size() {
            if !self.is_lost(r) {
                self.log(TraceEvent::Detected {
                    observer: r,
                    lost: rank,
                });
                self.engines[r].handle_peer_lost(rank, now);
                self.drain(r);
            }
        }
    }

    fn log(&mut self, event: TraceEvent) {
        self.trace.push(TraceEntry {
            at: self.now,
            event,
        });
    }

    /// Drops every message in flight to or from `rank`.
    fn drop_in_flight(&mut self, rank: usize) {
        for ((src, dst), o) in &mut self.links {
            if *src == rank || *dst == rank {
                o.clear();
            }
        }
        let mut kept = Vec::with_capacity(self.in_flight.len());
        for f in std::mem::take(&mut self.in_flight) {
            if f.t.dst == rank || f.t.msg.src == rank {
                self.log(TraceEvent::Dropped {
                    src: f.t.msg.src,
                    dst: f.t.dst,
                    header: f.t.msg.header,
                });
            } else {
                kept.push(f);
            }
        }
        self.in_flight = kept;
    }

    /// Collects what `rank`'s engine produced: messages go in flight (or are dropped),
    /// results are recorded.
    fn drain(&mut self, rank: usize) {
        let mut out = Vec::new();
        while let Some(t) = self.engines[rank].poll_transmit() {
            out.push(t);
        }
        out.sort_by_key(transmit_key);
        for t in out {
            let (src, dst) = (t.msg.src, t.dst);
            if self.is_lost(src) || self.is_lost(dst) {
                self.log(TraceEvent::Dropped {
                    src,
                    dst,
                    header: t.msg.header,
                });
                continue;
            }
            let mut taken = Vec::new();
            let mut link = SimLink {
                rng: &mut self.rng,
                per_mille: self.opts.would_block_per_mille,
                out: &mut taken,
                refused: &mut self.stats.would_block,
            };
            // A simulated link never closes (losses are modelled by isolate and kill).
            let _ = self.links.entry((src, dst)).or_default().send(&mut link, t);
            for t in taken {
                self.put_in_flight(t);
            }
            self.schedule_retry();
        }
        while let Some(ev) = self.engines[rank].poll_event() {
            self.log(TraceEvent::Done {
                rank,
                op: ev.op,
                error: ev.result.as_ref().err().cloned(),
            });
            if let Some(w) = self.watches.get_mut(&(rank, ev.op)) {
                w.done = true;
            }
            self.completed_at.insert((rank, ev.op), self.now);
            self.results.insert((rank, ev.op), ev.result);
        }
    }

    /// A message a link took: through the codec, then in flight with its latency.
    fn put_in_flight(&mut self, t: Transmit) {
        let t = through_the_wire(t);
        self.stats.frames += 1;
        let mut extra = self.rng.up_to(self.opts.jitter);
        if self.rng.below(1000) < self.opts.delayed_per_mille as usize {
            extra += self.rng.up_to(self.opts.max_delay);
        }
        let mut tiebreak = self.rng.next_u64();
        let mut at = self.now + self.opts.latency + extra;
        if self.opts.delivery == Delivery::Fifo {
            let last = self.fifo.entry((t.msg.src, t.dst)).or_insert(Time::ZERO);
            at = at.max(*last);
            *last = at;
            self.sent += 1;
            tiebreak = self.sent;
        }
        self.in_flight.push(Flight {
            at,
            sent: self.now,
            tiebreak,
            t,
        });
    }

    /// Retries every link with messages waiting; returns how many went.
    fn flush_links(&mut self) -> usize {
        let mut taken = Vec::new();
        for outbox in self.links.values_mut().filter(|o| !o.is_empty()) {
            let mut link = SimLink {
                rng: &mut self.rng,
                per_mille: self.opts.would_block_per_mille,
                out: &mut taken,
                refused: &mut self.stats.would_block,
            };
            let _ = outbox.flush(&mut link);
        }
        let n = taken.len();
        for t in taken {
            self.put_in_flight(t);
        }
        n
    }

    /// Retries the waiting links one latency from now (if none is scheduled earlier).
    fn schedule_retry(&mut self) {
        if self.waiting_in_links() {
            let at = self.now + self.opts.latency.max(Duration::from_nanos(1));
            self.retry_links = Some(self.retry_links.map_or(at, |r| r.min(at)));
        }
    }

    /// Messages waiting in links that said "would block".
    fn waiting_in_links(&self) -> bool {
        self.links.values().any(|o| !o.is_empty())
    }

    /// Records a collective message in the watch of the call it is for.
    fn watch_delivery(&mut self, dst: usize, t: &Transmit) {
        let Header::Data {
            group, seq, tag, ..
        } = t.msg.header
        else {
            return;
        };
        let Some(id) = self.watched.get(&(dst, group, seq)) else {
            return;
        };
        if let Some(w) = self.watches.get_mut(&(dst, *id)) {
            if let (false, Some(src)) = (w.done, w.members.iter().position(|&m| m == t.msg.src)) {
                debug_assert!(w.group == group && w.seq == seq);
                w.got.insert((src, tag));
            }
        }
    }

    /// Whether [`next`](Self::next) has something to do (without drawing a random number).
    fn has_work(&self, deadlines: bool) -> bool {
        self.retry_links.is_some()
            || !self.in_flight.is_empty()
            || !self.detections.is_empty()
            || (deadlines
                && (0..self.size())
                    .any(|r| !self.dead.contains(&r) && self.engines[r].poll_timeout().is_some()))
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

    fn advance(&mut self, deadlines: bool) -> bool {
        match self.next(deadlines) {
            None => false,
            Some(Next::Flush(t)) => {
                self.now = self.now.max(t);
                self.retry_links = None;
                self.flush_links();
                self.schedule_retry();
                true
            }
            Some(Next::Detect(i)) => {
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
                true
            }
            Some(Next::Deadline(t)) => {
                self.now = self.now.max(t);
                let now = self.now;
                for r in 0..self.size() {
                    let due = self.engines[r].poll_timeout().is_some_and(|d| d <= now);
                    if due && !self.dead.contains(&r) {
                        self.engines[r].handle_timeout(now);
                        self.drain(r);
                    }
                }
                true
            }
            Some(Next::Deliver(i)) => {
                let f = self.in_flight.swap_remove(i);
                self.now = self.now.max(f.at);
                let dst = f.t.dst;
                if dst >= self.size() || self.is_lost(dst) || self.is_lost(f.t.msg.src) {
                    self.log(TraceEvent::Dropped {
                        src: f.t.msg.src,
                        dst,
                        header: f.t.msg.header,
                    });
                    return true;
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
                true
            }
        }
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
        let stuck = (0..self.size()).any(|r| !self.is_lost(r) && self.engines[r].pending() > 0);
        if stuck {
            return Err(SimError::Stuck {
                pending: self.engines.iter().map(Engine::pending).collect(),
            });
        }
        Ok(())
    }
}
