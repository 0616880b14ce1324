//! The fault matrix, shared by the simulator's run of it
//! (`runtime/tests/suite/fault_matrix.rs`) and the actors' (`tests/suite/fault_matrix.rs`): in a group
//! of `w` ranks, one rank (`m`) departs from what the others do —
//! - it makes another collective (every ordered pair of the twelve), or the same one with
//!   another dtype, count, root, reduce op or algorithm ([`Fault::Differ`]);
//! - it never calls ([`Fault::Missing`]);
//! - it calls twice ([`Fault::Twice`]);
//! - it takes two groups in the opposite order ([`Fault::Opposite`])
//!
//! — and then every rank that takes part ends with a `monitored_barrier`, the call a careful
//! program ends with. [`Scenario::program`] gives each rank's calls; [`Scenario::check_rank`]
//! judges what one rank got: it heard of the fault (from a call, or as a pending error), each
//! error is the right variant naming the right ranks ([`Scenario::right`]), and no call
//! returned `Ok` after a failure on its group had reached the rank. Time bounds are each
//! driver's own (virtual or wall-clock).

use super::{reduces, rooted, Case, COLLECTIVES};
use crate::collective::Request;
use crate::error::Error;
use crate::op::{Algorithm, OpKind};
use crate::tensor::dtype::DType;
use crate::tensor::reduce::ReduceOp;

/// How rank `m` departs.
#[derive(Clone, Debug)]
pub enum Fault {
    /// It calls this where the others call the scenario's case.
    Differ(Box<Case>),
    /// It never calls.
    Missing,
    /// It calls the case twice.
    Twice,
    /// It calls the case on group B, then on A; the others on A, then B.
    Opposite,
}

/// Which group a call is on: A is the world, B a second group of every rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum On {
    /// The world.
    A,
    /// A second group with the same members.
    B,
}

/// One call of a rank's program.
#[derive(Clone, Debug)]
pub struct Call {
    /// The group.
    pub on: On,
    /// The request.
    pub req: Request,
    /// The algorithm to force, if any.
    pub algorithm: Option<Algorithm>,
}

impl Call {
    /// Whether it is the closing `monitored_barrier` (whose non-roots wait one desync grace
    /// longer than its timeout).
    pub fn is_monitored_barrier(&self) -> bool {
        matches!(self.req, Request::MonitoredBarrier)
    }
}

/// One cell of the matrix.
#[derive(Clone, Debug)]
pub struct Scenario {
    /// Ranks.
    pub w: usize,
    /// The rank that departs.
    pub m: usize,
    /// What the others call.
    pub case: Case,
    /// How `m` departs.
    pub fault: Fault,
}

/// What one call of a rank did, for [`Scenario::check_rank`].
#[derive(Clone, Debug)]
pub struct Outcome {
    /// Its group.
    pub on: On,
    /// When it completed (any clock; only the order matters).
    pub completed_nanos: u64,
    /// Its result.
    pub result: Result<(), Error>,
}

fn base(kind: OpKind, w: usize) -> Case {
    Case {
        kind,
        size: w,
        count: 4,
        dtype: DType::I32,
        op: ReduceOp::Sum,
        root: 0,
        algorithm: kind.algorithms().first().copied(),
    }
}

/// Every way the odd rank's call can differ from `case` (which forces its kind's first
/// algorithm; `m` forces the second, where there is one).
fn differences(case: &Case) -> Vec<Case> {
    let mut out: Vec<Case> = COLLECTIVES
        .into_iter()
        .filter(|&k| k != case.kind)
        .map(|kind| Case {
            kind,
            algorithm: None,
            ..case.clone()
        })
        .collect();
    if case.kind == OpKind::Barrier {
        return out;
    }
    out.push(Case {
        dtype: DType::F32,
        ..case.clone()
    });
    out.push(Case {
        count: case.count + 1,
        ..case.clone()
    });
    if rooted(case.kind) {
        out.push(Case {
            root: 1,
            ..case.clone()
        });
    }
    if reduces(case.kind) {
        out.push(Case {
            op: ReduceOp::Max,
            ..case.clone()
        });
    }
    if let [_, b, ..] = case.kind.algorithms() {
        out.push(Case {
            algorithm: Some(*b),
            ..case.clone()
        });
    }
    out
}

/// The kinds that run on the board of small calls (`crate::board`), at most 28 bytes with no
/// algorithm forced, in a group that has a board.
const ON_THE_BOARD: [OpKind; 4] = [
    OpKind::Barrier,
    OpKind::AllReduce,
    OpKind::Broadcast,
    OpKind::Reduce,
];

impl Scenario {
    /// Every scenario for `w` ranks on the engine: each base case forces its kind's first
    /// algorithm (which keeps it off the board); `m` rotates over the ranks.
    pub fn all(w: usize) -> Vec<Scenario> {
        Scenario::all_of(w, base(OpKind::Barrier, w).count)
    }

    /// [`Scenario::all`] with `count` elements per rank (per block in the list forms; the
    /// odd count is `count + 1`): from 16 Ki (`i32`, 64 KiB) a payload out of a tensor in
    /// shared memory is read straight from the sender's heap.
    pub fn all_of(w: usize, count: usize) -> Vec<Scenario> {
        let base = |kind| Case {
            count,
            ..base(kind, w)
        };
        let mut out = Vec::new();
        for (i, kind) in COLLECTIVES.into_iter().enumerate() {
            Scenario::departures(&mut out, i, base(kind));
        }
        for kind in [OpKind::AllReduce, OpKind::Barrier, OpKind::AllGather] {
            out.push(Scenario {
                w,
                m: w - 1,
                case: base(kind),
                fault: Fault::Opposite,
            });
        }
        out
    }

    /// The matrix on the board of small calls: each base case is one `i32` (4 bytes) with
    /// no algorithm forced, so that it runs on the board of a group that has one (every
    /// group of an in-process world, the world group of a job on one host over shared
    /// memory); the odd rank's call differs in kind (another small call, or a collective
    /// that goes to the engine), dtype, count (2: still small), root, op or algorithm (a
    /// forced one: the engine), or it never calls, or calls twice. Over TCP the same
    /// programs run on the engine.
    pub fn board(w: usize) -> Vec<Scenario> {
        let mut out = Vec::new();
        for (i, kind) in ON_THE_BOARD.into_iter().enumerate() {
            let case = Case {
                count: 1,
                algorithm: None,
                ..base(kind, w)
            };
            Scenario::departures(&mut out, i, case);
        }
        out
    }

    /// Every way one rank departs from `case` but the opposite order (each difference, never
    /// calling, calling twice), the departing rank rotating with `i` and the departure.
    fn departures(out: &mut Vec<Scenario>, i: usize, case: Case) {
        let w = case.size;
        for (j, theirs) in differences(&case).into_iter().enumerate() {
            out.push(Scenario {
                w,
                m: (i + j) % w,
                case: case.clone(),
                fault: Fault::Differ(Box::new(theirs)),
            });
        }
        for (k, fault) in [Fault::Missing, Fault::Twice].into_iter().enumerate() {
            out.push(Scenario {
                w,
                m: (i + k) % w,
                case: case.clone(),
                fault,
            });
        }
    }

    /// Whether the program uses group B.
    pub fn uses_b(&self) -> bool {
        matches!(self.fault, Fault::Opposite)
    }

    /// Rank `r`'s calls, in order.
    pub fn program(&self, r: usize) -> Vec<Call> {
        let call = |on, c: &Case| Call {
            on,
            req: c.request(r),
            algorithm: c.algorithm,
        };
        let mut p = match (&self.fault, r == self.m) {
            (Fault::Missing, true) => return Vec::new(),
            (Fault::Differ(theirs), true) => vec![call(On::A, theirs)],
            (Fault::Twice, true) => vec![call(On::A, &self.case), call(On::A, &self.case)],
            (Fault::Opposite, true) => vec![call(On::B, &self.case), call(On::A, &self.case)],
            (Fault::Opposite, false) => vec![call(On::A, &self.case), call(On::B, &self.case)],
            _ => vec![call(On::A, &self.case)],
        };
        p.push(Call {
            on: On::A,
            req: Request::MonitoredBarrier,
            algorithm: None,
        });
        p
    }

    /// Whether `e` (a root cause) is the right verdict: the variant for the fault, naming
    /// `m` where it should.
    pub fn right(&self, e: &Error) -> bool {
        let m = self.m;
        match (&self.fault, e) {
            (Fault::Differ(_) | Fault::Twice, Error::Mismatch { ours, theirs, .. }) => {
                ours.rank == m || theirs.rank == m
            }
            // all_to_all's fingerprint has no count (each rank states its own split sizes):
            // sizes that disagree show when a payload arrives, between m and a peer.
            (
                Fault::Differ(theirs),
                Error::SizeMismatch {
                    sender, receiver, ..
                },
            ) if theirs.count != self.case.count
                && matches!(self.case.kind, OpKind::AllToAll | OpKind::AllToAllSingle) =>
            {
                *sender == m || *receiver == m
            }
            // The ranks that made the call name m (with, perhaps, ranks stuck in an earlier
            // call behind m, which indeed have not made it).
            (Fault::Missing, Error::Timeout { waiting_for, .. }) => waiting_for.contains(&m),
            // A wait cycle across the two groups, through m (which waits on it, and is waited
            // for).
            (Fault::Opposite, Error::WaitCycle { cycle }) => {
                cycle.iter().any(|w| w.rank == m) && cycle.iter().any(|w| w.peer == m)
            }
            _ => false,
        }
    }

    /// Judges what rank `r` got: its calls' outcomes, in program order, and its pending
    /// errors at the end. `all_at_once`: the calls were issued together (then the
    /// opposite-order program is valid: a rank's calls on two groups proceed independently
    /// in collectix, where torch's blocking calls deadlock). `last_must_fail`: the rank
    /// waited for each call before the next, on links that keep their order, so its closing
    /// `monitored_barrier` must return the fault if no earlier call did.
    pub fn check_rank(
        &self,
        r: usize,
        calls: &[Outcome],
        pending: &[Error],
        all_at_once: bool,
        last_must_fail: bool,
    ) -> Result<(), String> {
        let valid = self.uses_b() && all_at_once;
        let mut heard = false;
        for (i, c) in calls.iter().enumerate() {
            match &c.result {
                Ok(()) if valid => {}
                Ok(()) => {
                    // Ok only before any failure on the group reached this rank. (Issued all
                    // at once, a later call can complete before an earlier one fails: the
                    // earlier one's error is how the rank hears.)
                    let failed_before = calls.iter().any(|d| {
                        d.on == c.on && d.result.is_err() && d.completed_nanos < c.completed_nanos
                    });
                    // The closing monitored_barrier must fail unless the rank already heard
                    // of the fault from an earlier call: in the opposite-order program the
                    // fault is on one group, and the other can be healthy (rank 1's late
                    // call on A can still complete rank 0's, which was waiting in its desync
                    // inquiry; then only B failed, and the barrier on A rightly succeeds).
                    let heard_before = calls[..i].iter().any(|d| d.result.is_err());
                    if failed_before || (last_must_fail && i + 1 == calls.len() && !heard_before) {
                        return Err(format!(
                            "rank {r} call {i}: Ok after a failure it should have heard of"
                        ));
                    }
                }
                Err(e) if valid => return Err(format!("rank {r} call {i}: {e}")),
                Err(e) => {
                    heard = true;
                    if !self.right(e.root_cause()) {
                        return Err(format!("rank {r} call {i}: the wrong verdict: {e}"));
                    }
                }
            }
        }
        for e in pending {
            heard = true;
            if !self.right(e.root_cause()) {
                return Err(format!("rank {r}: the wrong pending error: {e}"));
            }
        }
        if !heard && !valid {
            return Err(format!("rank {r} never heard of the fault"));
        }
        Ok(())
    }
}
