//! The flight recorder (torch's NCCL flight recorder, always on): each rank keeps its last
//! [`CALLS_KEPT`] calls — group, sequence number, collective, dtype, count, when it started
//! and ended, how it ended — in a ring behind the rank's lock, written on each call's submit
//! and completion. It is written out when a call fails (to `tracing`, and to
//! `COLLECTIX_FLIGHT_RECORDER/rank-R.txt` when that directory is set), and read on demand
//! (`Communicator::flight_record`, `collectix status`).

use collectix_runtime::{DType, Error, GroupId, OpId, OpKind, Time};
use std::collections::VecDeque;
use std::fmt;

/// Calls each rank keeps.
pub const CALLS_KEPT: usize = 64;

/// How a recorded call stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CallState {
    /// Still in flight.
    Pending,
    /// Completed.
    Completed,
    /// Failed, with the error's text.
    Failed(String),
}

/// One call in a rank's flight record.
#[derive(Clone, Debug, PartialEq)]
pub struct CallRecord {
    /// The group.
    pub group: GroupId,
    /// The call's sequence number in the group (`None`: point-to-point).
    pub seq: Option<u64>,
    /// What the call was.
    pub op: OpKind,
    /// Its element type.
    pub dtype: DType,
    /// Its element count, where it has one.
    pub count: Option<u64>,
    /// When it started, in milliseconds of the rank's clock.
    pub started_ms: f64,
    /// When it ended, if it has.
    pub ended_ms: Option<f64>,
    /// How it stands.
    pub state: CallState,
    /// The kind of its error if it failed (`Error::kind_name` of the root cause:
    /// `mismatch`, `timeout`, ...).
    pub error_kind: Option<&'static str>,
}

impl fmt::Display for CallRecord {
    /// One line: `group world #12 all_reduce float32 ×1024 @ 1234.5 ms: completed in 0.8 ms`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let seq = self.seq.map_or("p2p".to_string(), |s| format!("#{s}"));
        write!(f, "group {} {seq} {} {}", self.group, self.op, self.dtype)?;
        if let Some(c) = self.count {
            write!(f, " x{c}")?;
        }
        write!(f, " @ {:.1} ms: ", self.started_ms)?;
        let took = self.ended_ms.map(|e| e - self.started_ms);
        match (&self.state, took) {
            (CallState::Pending, _) => f.write_str("in flight"),
            (CallState::Completed, Some(t)) => write!(f, "completed in {t:.1} ms"),
            (CallState::Failed(e), Some(t)) => write!(f, "failed after {t:.1} ms: {e}"),
            (CallState::Completed, None) => f.write_str("completed"),
            (CallState::Failed(e), None) => write!(f, "failed: {e}"),
        }
    }
}

/// Which call a record is: an engine call, or a call on a group's board (by sequence
/// number).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Key {
    Op(OpId),
    Board(GroupId, u64),
}

/// The ring of a rank's last calls.
#[derive(Default)]
pub(crate) struct Recorder {
    calls: VecDeque<(Key, CallRecord)>,
    /// Calls started since the rank started.
    started: u64,
}

fn ms(t: Time) -> f64 {
    t.as_nanos() as f64 / 1e6
}

impl Recorder {
    /// Calls started since the rank started.
    pub(crate) fn count(&self) -> u64 {
        self.started
    }

    /// A call started.
    pub(crate) fn started(&mut self, op: Key, record: CallRecord) {
        self.started += 1;
        if self.calls.len() == CALLS_KEPT {
            self.calls.pop_front();
        }
        self.calls.push_back((op, record));
    }

    /// The record of a call that starts at `now`.
    pub(crate) fn record(
        group: GroupId,
        seq: Option<u64>,
        op: OpKind,
        dtype: DType,
        count: Option<u64>,
        now: Time,
    ) -> CallRecord {
        CallRecord {
            group,
            seq,
            op,
            dtype,
            count,
            started_ms: ms(now),
            ended_ms: None,
            state: CallState::Pending,
            error_kind: None,
        }
    }

    /// Call `op` ended at `now`, with `error` if it failed; whether it failed.
    pub(crate) fn ended(&mut self, op: Key, now: Time, error: Option<&Error>) -> bool {
        // The call is among the last few: look from the newest.
        if let Some((_, r)) = self.calls.iter_mut().rev().find(|(id, _)| *id == op) {
            r.ended_ms = Some(ms(now));
            r.state = match error {
                None => CallState::Completed,
                Some(e) => CallState::Failed(e.to_string()),
            };
            r.error_kind = error.map(|e| e.root_cause().kind_name());
        }
        error.is_some()
    }

    /// The calls kept, oldest first.
    pub(crate) fn calls(&self) -> Vec<CallRecord> {
        self.calls.iter().map(|(_, r)| r.clone()).collect()
    }

    /// The record as text, a line per call, oldest first.
    pub(crate) fn text(&self, rank: usize) -> String {
        let mut s = format!("rank {rank}: last {} calls\n", self.calls.len());
        for (_, r) in &self.calls {
            s.push_str(&format!("  {r}\n"));
        }
        s
    }
}

/// Who came last to each group's calls, as this rank saw them (`collectix_runtime::lateness`),
/// a line per group that judged a call: `group world: 40 calls judged; member 2 last in 40
/// (...)` (members by group rank). Empty if none did.
pub(crate) fn lateness_text(engine: &collectix_runtime::Engine) -> String {
    let mut lines: Vec<String> = engine
        .lateness_all()
        .filter(|(_, s)| s.calls > 0)
        .map(|(g, s)| format!("  group {}: {s}\n", g.id))
        .collect();
    lines.sort();
    if lines.is_empty() {
        return String::new();
    }
    format!("who came last:\n{}", lines.concat())
}

/// Writes rank `rank`'s record out after a failure: to `tracing` (at `warn`), and to
/// `COLLECTIX_FLIGHT_RECORDER/rank-R.txt` when that directory is set.
pub(crate) fn dump(rank: usize, text: &str) {
    tracing::warn!(rank, "flight recorder after a failed call:\n{text}");
    if let Some(dir) = std::env::var_os("COLLECTIX_FLIGHT_RECORDER") {
        let path = std::path::Path::new(&dir).join(format!("rank-{rank}.txt"));
        if let Err(e) = std::fs::write(&path, text) {
            tracing::warn!(rank, path = %path.display(), error = %e, "cannot write the flight record");
        }
    }
}
