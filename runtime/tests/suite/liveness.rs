//! Liveness: every valid program completes, however its ranks are scheduled — in the
//! patterns users have: all calls at once, one at a time (issue → wait), in batches, one rank
//! ahead by 0, w, 2w+2 or 100 calls, and "greedy" loops, where each rank in turn runs its
//! issue → wait loop as far as it goes (a root, a non-root of reduce or gather, a sender
//! complete at once, so they run ahead by themselves). For every collective and for
//! send/recv, with windows 1, 2, 4 and the default, on 2 and 3 ranks; every call must complete
//! with the right value, and where a rank gets more than a window ahead, messages must really
//! have been held (the test exercises flow control rather than passing around it).

use collectix_runtime::group::{CallOptions, GroupId, GroupOptions};
use collectix_runtime::testing::sim::Sim;
use collectix_runtime::testing::{sequence_call, COLLECTIVES};
use collectix_runtime::OpKind;
use collectix_runtime::{DType, Output, Request, Tensor};

#[derive(Clone, Copy, Debug)]
enum Pattern {
    AllAtOnce,
    OneAtATime,
    Batches(usize),
    /// Rank 0 makes this many calls first, the others then follow one at a time.
    Ahead(u64),
    Greedy,
}

/// What the sweep runs: a collective, or send/recv from rank 0 to rank 1.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Coll(OpKind),
    P2p,
}

const CALLS: u64 = 40;
const STEPS: usize = 5_000_000;

/// The call rank `r` makes as its `k`-th, and what it must get (`None`: the rank makes no
/// call; send/recv involve ranks 0 and 1 only).
fn call(kind: Kind, w: usize, r: usize, k: u64) -> Option<(Request, Output)> {
    let kind = match kind {
        Kind::Coll(k) => Some(k),
        Kind::P2p => None,
    };
    sequence_call(kind, w, r, k)
}

struct Driver {
    sim: Sim,
    kind: Kind,
    w: usize,
    next: Vec<u64>,
    /// Calls in flight per rank: (k, op).
    open: Vec<Vec<(u64, collectix_runtime::OpId)>>,
    max_held: usize,
    label: String,
}

impl Driver {
    fn new(kind: Kind, w: usize, window: u64, budget: u64, seed: u64, label: String) -> Driver {
        let opts = GroupOptions {
            window,
            peer_budget_bytes: budget,
            ..GroupOptions::default()
        };
        Driver {
            sim: Sim::with_options(w, seed, opts),
            kind,
            w,
            next: vec![0; w],
            open: vec![Vec::new(); w],
            max_held: 0,
            label,
        }
    }

    fn active(&self, r: usize) -> bool {
        call(self.kind, self.w, r, 0).is_some()
    }

    /// Rank `r` issues its next call (false if it has none left).
    fn issue(&mut self, r: usize) -> bool {
        let k = self.next[r];
        if k >= CALLS || !self.active(r) {
            return false;
        }
        let Some((req, _)) = call(self.kind, self.w, r, k) else {
            return false;
        };
        let op = self
            .sim
            .submit(r, GroupId::WORLD, req, &CallOptions::default())
            .unwrap_or_else(|e| panic!("{}: submit: {e}", self.label));
        self.open[r].push((k, op));
        self.next[r] += 1;
        true
    }

    /// Delivers what can be delivered and checks what completed.
    fn settle(&mut self) {
        self.sim
            .settle(STEPS)
            .unwrap_or_else(|e| panic!("{}: {e:?}", self.label));
        let held = (0..self.w)
            .filter_map(|r| self.sim.engine(r).map(|e| e.held()))
            .sum();
        self.max_held = self.max_held.max(held);
        for r in 0..self.w {
            let open = std::mem::take(&mut self.open[r]);
            for (k, op) in open {
                match self.sim.take(r, op) {
                    None => self.open[r].push((k, op)),
                    Some(got) => {
                        let want = call(self.kind, self.w, r, k).map(|(_, o)| o);
                        assert_eq!(got.ok(), want, "{}: rank {r} call {k}", self.label);
                    }
                }
            }
        }
    }

    fn done(&self) -> bool {
        (0..self.w).all(|r| !self.active(r) || (self.next[r] == CALLS && self.open[r].is_empty()))
    }

    /// Every rank in turn: while it has no call open, it issues its next one (issue → wait).
    fn one_at_a_time_round(&mut self, batch: usize, greedy: bool) -> bool {
        let mut progressed = false;
        for r in 0..self.w {
            loop {
                if !self.open[r].is_empty() {
                    break;
                }
                let mut issued = false;
                for _ in 0..batch {
                    issued |= self.issue(r);
                }
                if !issued {
                    break;
                }
                progressed = true;
                self.settle();
                if !greedy {
                    break;
                }
            }
        }
        progressed
    }

    fn run(&mut self, pattern: Pattern) {
        match pattern {
            Pattern::AllAtOnce => {
                for r in 0..self.w {
                    while self.issue(r) {}
                }
                self.settle();
            }
            Pattern::Ahead(a) => {
                for _ in 0..a {
                    self.issue(0);
                }
                self.settle();
            }
            _ => {}
        }
        let (batch, greedy) = match pattern {
            Pattern::Batches(b) => (b, false),
            Pattern::Greedy => (1, true),
            _ => (1, false),
        };
        while !self.done() {
            if !self.one_at_a_time_round(batch, greedy) {
                // Nobody could issue: every rank waits on an open call that cannot complete.
                let open: Vec<usize> = self.open.iter().map(Vec::len).collect();
                panic!(
                    "{}: stuck, open calls per rank {open:?}, next {:?}\n{}",
                    self.label,
                    self.next,
                    self.sim.trace_text()
                );
            }
        }
        for r in 0..self.w {
            let e = self.sim.engine(r);
            assert_eq!(
                e.map(|e| (e.held(), e.buffered())),
                Some((0, 0)),
                "{}: rank {r} left messages behind",
                self.label
            );
        }
    }
}

fn kinds() -> Vec<Kind> {
    let mut v: Vec<Kind> = COLLECTIVES.into_iter().map(Kind::Coll).collect();
    v.push(Kind::P2p);
    v
}

fn sweep(ws: &[usize], windows: &[u64], patterns: &[Pattern]) -> usize {
    sweep_with(
        ws,
        windows,
        GroupOptions::default().peer_budget_bytes,
        patterns,
    )
}

/// The sweep with a byte budget per peer (`GroupOptions::peer_budget_bytes`).
fn sweep_with(ws: &[usize], windows: &[u64], budget: u64, patterns: &[Pattern]) -> usize {
    let mut n = 0;
    for &w in ws {
        for kind in kinds() {
            for &window in windows {
                for &pattern in patterns {
                    let label =
                        format!("{kind:?} w={w} window={window} budget={budget} {pattern:?}");
                    let mut d = Driver::new(kind, w, window, budget, 7 + n as u64, label.clone());
                    d.run(pattern);
                    // A rank more than a window ahead must have made the sender hold.
                    let one_way = matches!(
                        kind,
                        Kind::P2p | Kind::Coll(OpKind::Broadcast) | Kind::Coll(OpKind::Scatter)
                    );
                    if let Pattern::Ahead(a) = pattern {
                        // Beyond the window, or carrying more than the budget (12 bytes).
                        if (a > window || (budget < 12 && a > 2)) && one_way {
                            assert!(d.max_held > 0, "{label}: nothing was held");
                        }
                    }
                    n += 1;
                }
            }
        }
    }
    n
}

#[test]
fn every_valid_schedule_completes_on_two_ranks() {
    let n = sweep(
        &[2],
        &[1, 2, 4, 16],
        &[
            Pattern::AllAtOnce,
            Pattern::OneAtATime,
            Pattern::Batches(3),
            Pattern::Ahead(0),
            Pattern::Ahead(4),
            Pattern::Ahead(10),
            Pattern::Ahead(34),
            Pattern::Greedy,
        ],
    );
    assert!(n > 0);
}

#[test]
fn every_valid_schedule_completes_on_three_ranks() {
    let n = sweep(
        &[3],
        &[1, 2, 16],
        &[
            Pattern::OneAtATime,
            Pattern::Ahead(2),
            Pattern::Ahead(6),
            Pattern::Ahead(34),
            Pattern::Greedy,
        ],
    );
    assert!(n > 0);
}

/// A byte budget of 8: the calls carry 4, 8 or 12 bytes per message, so some go ahead and
/// some wait for the peer's call (a rendezvous); with windows above 1 every point-to-point
/// message waits for its receive's grant (the eager limit, 8 / window, is below 4 bytes).
#[test]
fn every_valid_schedule_completes_with_a_tight_byte_budget() {
    let patterns = [
        Pattern::AllAtOnce,
        Pattern::OneAtATime,
        Pattern::Ahead(4),
        Pattern::Ahead(34),
        Pattern::Greedy,
    ];
    let n = sweep_with(&[2], &[1, 4, 16], 8, &patterns) + sweep_with(&[3], &[2], 8, &patterns);
    assert!(n > 0);
}

#[test]
fn a_root_far_ahead_then_a_peer_one_call_at_a_time_completes() {
    // The report: W=2, window 16, rank 0 makes 100 broadcasts as root at once, then rank 1
    // makes its 100 one at a time.
    let opts = GroupOptions {
        window: 16,
        ..GroupOptions::default()
    };
    let mut sim = Sim::with_options(2, 1, opts);
    let data = |k: u64| Tensor::from_vec(vec![k as i64; 2]);
    for k in 0..100 {
        let req = Request::Broadcast {
            tensor: data(k),
            root: 0,
        };
        sim.submit(0, GroupId::WORLD, req, &CallOptions::default())
            .unwrap_or_else(|e| panic!("{e}"));
    }
    sim.settle(STEPS).unwrap_or_else(|e| panic!("{e:?}"));
    assert!(
        sim.engine(0).is_some_and(|e| e.held() > 0),
        "the root holds"
    );
    for k in 0..100 {
        let req = Request::Broadcast {
            tensor: Tensor::zeros(&[2], DType::I64).unwrap_or_else(|e| panic!("{e}")),
            root: 0,
        };
        let op = sim
            .submit(1, GroupId::WORLD, req, &CallOptions::default())
            .unwrap_or_else(|e| panic!("{e}"));
        sim.settle(STEPS).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(
            sim.take(1, op),
            Some(Ok(Output::Tensor(data(k)))),
            "rank 1 call {k}"
        );
    }
}
