//! loom models of the protocol core: real [`Engine`]s on 2–3 loom threads, connected by loom
//! channels, and the completion slot behind `Work` between two loom threads.
//!
//! Built only with `RUSTFLAGS="--cfg collectix_loom"` (see `docs/testing.md`, section
//! "loom", and `.ci/loom`). Every model runs through [`check`], which counts the executions
//! loom explored and prints them with the model's wall time (`--nocapture` shows them).
//!
//! The world harness ([`run_world`]) gives each rank one [`Receiver`] and a [`Sender`] per
//! peer. A rank thread submits its calls, then loops `recv → handle → forward
//! poll_transmit → collect poll_event` until every call it submitted produced an event, so
//! loops end by op count and nothing spins. loom has no clock and reports a dropped sender
//! whose receiver blocks as a deadlock, so:
//! - every sender and receiver lives until all rank threads are joined (threads hand theirs
//!   back to the main thread, which drops them last);
//! - a timeout is an explicit [`Input::Tick`] the main thread sends at a point loom chooses,
//!   and a lost peer is an explicit [`Input::PeerLost`] the "crashing" rank sends to every
//!   other rank before its thread ends, as a closed connection would.
//!
//! Model groups, one file each: [`collectives`] (every collective completes with the right
//! result), [`concurrent`] (two calls in flight, same group and overlapping groups),
//! [`faults`] (mismatch, timeout, peer loss end in errors on every rank), [`completion`]
//! (the slot: wait/poll/drop/timeout racing completion), [`bugs`] (deliberate bugs the
//! models must catch) and [`progress`] (who takes a rank's arrivals: a driving caller, a
//! leaving one, or the background driver); [`agreement`] (the survivors' agreement on a
//! failed group, with one and two failures at each step); [`board`] (the board of small
//! calls: a disagreement seen at the call, a slot reused only once every member is done);
//! [`board_wake`] (a member that moves the board and a rank's last driver that leaves never
//! both miss each other); [`issuers`] (a group handed from one thread to another once its
//! call finished is never refused; two threads' overlapping calls are refused once); [`ring`] (a shared-memory ring's frames across its wrap, and its doorbell protocol with a
//! sender, a caller and the owner's progress thread: no wake-up lost).

mod agreement;
mod board;
mod board_wake;
mod bugs;
mod collectives;
mod completion;
mod concurrent;
mod faults;
mod issuers;
mod mail;
mod progress;
mod ring;

use crate::collective::{Output, Plan};
use crate::engine::{Engine, OpId};
use crate::error::{Error, Result};
use crate::group::{CallOptions, GroupId, GroupInfo, GroupOptions};
use crate::testing::Case;
use crate::time::Time;
use crate::wire::message::{Header, Message};
use loom::sync::mpsc::{channel, Receiver, Sender};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The preemption bound used when `LOOM_MAX_PREEMPTIONS` is not set: without one, loom's
/// search is unbounded.
const DEFAULT_PREEMPTIONS: usize = 2;

/// The smallest preemption bound any model runs with. Every model here stays well under a
/// second at 3 (the largest explores about 4,500 executions), so the suite searches one
/// level deeper than the `LOOM_MAX_PREEMPTIONS=2` of the CI command; a larger
/// `LOOM_MAX_PREEMPTIONS` raises the bound of every model.
const MIN_PREEMPTIONS: usize = 3;

/// Runs `f` under loom with the environment's settings (`LOOM_MAX_PREEMPTIONS`, default
/// [`DEFAULT_PREEMPTIONS`], at least [`MIN_PREEMPTIONS`]) and prints how many executions
/// loom explored and how long it took, as `loom model NAME: N iterations in T`.
pub(super) fn check<F>(name: &str, f: F)
where
    F: Fn() + Sync + Send + 'static,
{
    let iterations = std::sync::Arc::new(AtomicUsize::new(0));
    explore(name, iterations, f);
}

/// Like [`check`], counting executions in `iterations` (which stays readable when loom
/// panics, so a deliberate-bug test can tell on which execution the bug showed).
pub(super) fn explore<F>(name: &str, iterations: std::sync::Arc<AtomicUsize>, f: F)
where
    F: Fn() + Sync + Send + 'static,
{
    explore_from(name, MIN_PREEMPTIONS, iterations, f)
}

/// Like [`check`] with a smallest preemption bound of `min` (for the models whose state
/// space at [`MIN_PREEMPTIONS`] takes minutes; each says what it takes there).
pub(super) fn check_from<F>(name: &str, min: usize, f: F)
where
    F: Fn() + Sync + Send + 'static,
{
    explore_from(name, min, std::sync::Arc::new(AtomicUsize::new(0)), f)
}

/// [`explore`] with a smallest preemption bound of `min`.
pub(super) fn explore_from<F>(name: &str, min: usize, iterations: std::sync::Arc<AtomicUsize>, f: F)
where
    F: Fn() + Sync + Send + 'static,
{
    let counter = iterations.clone();
    let mut builder = loom::model::Builder::new();
    let bound = builder
        .preemption_bound
        .unwrap_or(DEFAULT_PREEMPTIONS)
        .max(min);
    builder.preemption_bound = Some(bound);
    let start = Instant::now();
    builder.check(move || {
        counter.fetch_add(1, Ordering::Relaxed);
        f();
    });
    println!(
        "loom model {name}: {} iterations in {:.2?} (preemption bound {bound})",
        iterations.load(Ordering::Relaxed),
        start.elapsed()
    );
}

/// Runs a model that must fail: returns loom's (or the model's) panic message and the
/// number of the execution that failed, and panics if every execution passed.
pub(super) fn must_fail<F>(name: &str, f: F) -> (String, usize)
where
    F: Fn() + Sync + Send + 'static,
{
    must_fail_from(name, MIN_PREEMPTIONS, f)
}

/// [`must_fail`] with a smallest preemption bound of `min`.
pub(super) fn must_fail_from<F>(name: &str, min: usize, f: F) -> (String, usize)
where
    F: Fn() + Sync + Send + 'static,
{
    let iterations = std::sync::Arc::new(AtomicUsize::new(0));
    let counter = iterations.clone();
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        explore_from(name, min, counter, f)
    }));
    let n = iterations.load(Ordering::Relaxed);
    match outcome {
        Ok(()) => panic!("loom model {name}: the bug went unnoticed in {n} executions"),
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            println!("loom model {name}: caught on execution {n}: {msg}");
            (msg, n)
        }
    }
}

/// What a rank thread receives.
#[derive(Debug)]
pub(super) enum Input {
    /// A message from a peer (or from itself).
    Msg(Message),
    /// The transport saw this global rank go away.
    PeerLost(usize),
    /// The clock says it is now this late: the rank calls `handle_timeout`.
    Tick(Time),
}

/// When a rank submits its calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Submit {
    /// All at once, before handling any message (torch's `async_op=True`).
    Eager,
    /// Each one once the previous one produced its event (a blocking caller), so messages
    /// of a later call may arrive before the rank made it.
    Lazy,
}

/// One call a rank makes.
pub(super) struct Call {
    /// The group.
    group: GroupId,
    /// The call's sequence number in the group (ignored for point-to-point calls).
    seq: u64,
    /// The planned call.
    plan: Plan,
}

/// What one rank does in a model.
pub(super) struct Script {
    /// Global rank.
    rank: usize,
    /// The groups it registers before calling anything.
    groups: Vec<GroupInfo>,
    /// Its calls, in order.
    calls: Vec<Call>,
    /// How it submits them.
    submit: Submit,
    /// Crash (stop, and tell every peer it is gone) after handling this many inputs.
    crash_after: Option<usize>,
    /// Revoke the world group after handling this many inputs.
    revoke_after: Option<usize>,
    /// A deliberate driver bug: throw away collective messages for calls this rank has not
    /// submitted yet, instead of handing them to the engine to keep.
    drop_unexpected: bool,
    /// Register every group but the first just before the first call on it (so messages
    /// for it can arrive before the engine knows the group).
    late_groups: bool,
}

impl Script {
    /// A rank with no groups and no calls, submitting eagerly.
    pub(super) fn new(rank: usize) -> Script {
        Script {
            rank,
            groups: Vec::new(),
            calls: Vec::new(),
            submit: Submit::Eager,
            crash_after: None,
            revoke_after: None,
            drop_unexpected: false,
            late_groups: false,
        }
    }

    /// Registers `info` at start.
    pub(super) fn group(mut self, info: GroupInfo) -> Script {
        self.groups.push(info);
        self
    }

    /// Adds a call.
    pub(super) fn call(mut self, group: GroupId, seq: u64, plan: Plan) -> Script {
        self.calls.push(Call { group, seq, plan });
        self
    }

    /// Submits each call only when the previous one finished.
    pub(super) fn lazy(mut self) -> Script {
        self.submit = Submit::Lazy;
        self
    }

    /// Crashes after handling `inputs` inputs (0: right after submitting).
    pub(super) fn crash_after(mut self, inputs: usize) -> Script {
        self.crash_after = Some(inputs);
        self
    }

    /// Revokes the world group after handling `inputs` inputs (0: right after submitting).
    pub(super) fn revoke_after(mut self, inputs: usize) -> Script {
        self.revoke_after = Some(inputs);
        self
    }

    /// Registers every group but the first only just before the first call on it.
    pub(super) fn late_groups(mut self) -> Script {
        self.late_groups = true;
        self
    }

    /// Makes this rank's driver drop messages for calls it has not made yet (a deliberate
    /// bug, for the tests that show the models catch it).
    pub(super) fn drop_unexpected(mut self) -> Script {
        self.drop_unexpected = true;
        self
    }
}

/// Each call's result, in call order; `None` where the rank crashed before it finished.
pub(super) type Results = Vec<Option<Result<Output>>>;

/// What a rank thread hands back: its results, and its channel ends, which must outlive
/// every rank thread (loom reports a dropped sender whose receiver waits as a deadlock).
type RankEnd = (Results, Receiver<Input>, Vec<Sender<Input>>);

/// Runs one thread per script (script `i` must be global rank `i`), connected by loom
/// channels, while the main thread sends `ticks` (`(rank, time)`: a timeout event) in
/// order. Returns each rank's results.
pub(super) fn run_world(scripts: Vec<Script>, ticks: Vec<(usize, Time)>) -> Vec<Results> {
    let n = scripts.len();
    let (txs, rxs): (Vec<Sender<Input>>, Vec<Receiver<Input>>) = (0..n).map(|_| channel()).unzip();
    let handles: Vec<_> = scripts
        .into_iter()
        .zip(rxs)
        .enumerate()
        .map(|(i, (script, rx))| {
            assert_eq!(script.rank, i, "script {i} is for rank {}", script.rank);
            let txs = txs.clone();
            loom::thread::spawn(move || run_rank(script, rx, txs))
        })
        .collect();
    for (rank, at) in ticks {
        txs[rank]
            .send(Input::Tick(at))
            .unwrap_or_else(|_| panic!("rank {rank}'s channel closed"));
    }
    let ends: Vec<RankEnd> = handles
        .into_iter()
        .enumerate()
        .map(|(i, h)| {
            h.join()
                .unwrap_or_else(|_| panic!("rank {i}'s thread panicked"))
        })
        .collect();
    // Only now, with every rank thread finished, may the channel ends go.
    let mut results = Vec::with_capacity(n);
    let mut keep = Vec::with_capacity(n);
    for (r, rx, senders) in ends {
        results.push(r);
        keep.push((rx, senders));
    }
    drop(keep);
    drop(txs);
    results
}

/// Sends everything the engine wants sent and collects its events.
fn flush(
    e: &mut Engine,
    txs: &[Sender<Input>],
    local: &mut VecDeque<Message>,
    events: &mut HashMap<OpId, Result<Output>>,
) {
    let me = e.rank();
    while let Some(t) = e.poll_transmit() {
        if t.dst == me {
            local.push_back(t.msg);
            continue;
        }
        let tx = txs
            .get(t.dst)
            .unwrap_or_else(|| panic!("rank {me} sent to rank {}, outside the world", t.dst));
        tx.send(Input::Msg(t.msg))
            .unwrap_or_else(|_| panic!("rank {me}: rank {}'s channel closed", t.dst));
    }
    while let Some(ev) = e.poll_event() {
        let old = events.insert(ev.op, ev.result);
        assert!(old.is_none(), "rank {me}: two events for {:?}", ev.op);
    }
}

/// One rank's thread: submit, then handle inputs until every submitted call has an event
/// (or the script's crash point is reached).
fn run_rank(script: Script, rx: Receiver<Input>, txs: Vec<Sender<Input>>) -> RankEnd {
    let Script {
        rank: me,
        groups,
        calls,
        submit,
        crash_after,
        revoke_after,
        drop_unexpected,
        late_groups,
    } = script;
    let now = Time::ZERO;
    let mut e = Engine::new(me);
    let mut later: Vec<GroupInfo> = Vec::new();
    for (i, g) in groups.into_iter().enumerate() {
        if late_groups && i > 0 {
            later.push(g);
        } else {
            e.add_group(g, now);
        }
    }
    let total = calls.len();
    let mut calls = calls.into_iter();
    let mut ids: Vec<OpId> = Vec::with_capacity(total);
    let mut made: Vec<(GroupId, u64)> = Vec::with_capacity(total);
    let mut events: HashMap<OpId, Result<Output>> = HashMap::new();
    let mut local: VecDeque<Message> = VecDeque::new();
    let mut handled = 0usize;
    loop {
        loop {
            let due = submit == Submit::Eager || ids.iter().all(|id| events.contains_key(id));
            let Some(c) = due.then(|| calls.next()).flatten() else {
                break;
            };
            if let Some(i) = later.iter().position(|g| g.id == c.group) {
                e.add_group(later.swap_remove(i), now);
                flush(&mut e, &txs, &mut local, &mut events);
            }
            made.push((c.group, c.seq));
            ids.push(e.submit(c.group, c.seq, c.plan, now));
            flush(&mut e, &txs, &mut local, &mut events);
        }
        if revoke_after == Some(handled) {
            let r = e.revoke_group(GroupId::WORLD);
            assert!(r.is_ok(), "rank {me}: revoke refused: {r:?}");
            flush(&mut e, &txs, &mut local, &mut events);
        }
        if ids.len() == total && ids.iter().all(|id| events.contains_key(id)) {
            break;
        }
        if crash_after == Some(handled) {
            for (r, tx) in txs.iter().enumerate() {
                if r != me {
                    tx.send(Input::PeerLost(me))
                        .unwrap_or_else(|_| panic!("rank {me}: rank {r}'s channel closed"));
                }
            }
            break;
        }
        let input = match local.pop_front() {
            Some(m) => Input::Msg(m),
            None => rx
                .recv()
                .unwrap_or_else(|_| panic!("rank {me}: every sender dropped")),
        };
        match input {
            Input::Msg(m) => {
                let early = match &m.header {
                    Header::Data { group, seq, .. } => !made.contains(&(*group, *seq)),
                    _ => false,
                };
                if !(drop_unexpected && early) {
                    e.handle_message(m, now);
                }
            }
            Input::PeerLost(r) => e.handle_peer_lost(r, now),
            Input::Tick(at) => e.handle_timeout(at),
        }
        handled += 1;
        flush(&mut e, &txs, &mut local, &mut events);
    }
    let results = ids.iter().map(|id| events.remove(id)).collect();
    (results, rx, txs)
}

/// The world group of `n` ranks as rank `r` sees it, default options.
pub(super) fn world(n: usize, r: usize) -> GroupInfo {
    world_with(n, r, GroupOptions::default())
}

/// The world group of `n` ranks as rank `r` sees it, with `opts`.
pub(super) fn world_with(n: usize, r: usize, opts: GroupOptions) -> GroupInfo {
    GroupInfo::world(n, r, opts).unwrap_or_else(|e| panic!("world({n}, {r}): {e}"))
}

/// The group `id` of `members` as global rank `me` sees it, default options.
pub(super) fn subgroup(id: GroupId, members: &[usize], me: usize) -> GroupInfo {
    GroupInfo::new(id, members.to_vec(), me, GroupOptions::default())
        .unwrap_or_else(|e| panic!("group {members:?} on {me}: {e}"))
}

/// `case`'s call for the member of `info`, planned with `case.algorithm` forced.
pub(super) fn case_plan(case: &Case, info: &GroupInfo) -> Plan {
    let opts = CallOptions {
        algorithm: case.algorithm,
        timeout: None,
    };
    Plan::new(case.request(info.rank), info, &opts)
        .unwrap_or_else(|e| panic!("{case:?} on rank {}: {e}", info.rank))
}

/// A plan for `req` on the member of `info`, default call options.
pub(super) fn plan(req: crate::collective::Request, info: &GroupInfo) -> Plan {
    Plan::new(req, info, &CallOptions::default())
        .unwrap_or_else(|e| panic!("plan on rank {}: {e}", info.rank))
}

/// Asserts that `got` is `Ok(want)`; the panic says "wrong result" (the deliberate-bug
/// tests look for that).
pub(super) fn assert_output(what: &str, got: &Option<Result<Output>>, want: &Output) {
    match got {
        Some(Ok(out)) if out == want => {}
        _ => panic!("wrong result: {what}: got {got:?}, expected Ok({want:?})"),
    }
}

/// Asserts that `got` failed and that the root cause of its failure satisfies `cause`.
pub(super) fn assert_failed(
    what: &str,
    got: &Option<Result<Output>>,
    cause: impl Fn(&Error) -> bool,
) {
    match got {
        Some(Err(e)) if cause(e.root_cause()) => {}
        _ => panic!("{what}: expected an error, got {got:?}"),
    }
}

/// A deadline far past any call's timeout, for [`Input::Tick`].
pub(super) fn far_future() -> Time {
    Time::ZERO + Duration::from_secs(1 << 20)
}
