//! What the engine and the flight recorder hear of the calls that ran on a board: the
//! quick path's runs of calls ([`Ran`]), and each queued call's [`Record`].

use super::super::recorder::{Key, Recorder};
use super::super::Core;
use collectix_runtime::board::queue::Record;
use collectix_runtime::Time;

/// The calls of a group that ran on its quick path and the engine has not heard of yet, as
/// runs of consecutive calls of one kind within one tick of the engine's clock (a loop of
/// barriers is one run per tick): kept under the group's issue lock, which the quick path
/// holds anyway, and taken by the engine's next run (or every [`RECORDS_BATCH`] calls).
#[derive(Default)]
pub(crate) struct Ran {
    runs: Vec<Run>,
    pub(super) calls: usize,
}

/// Calls `first..=last` of a group, each `fp`, all finished at `at`.
struct Run {
    first: u64,
    last: u64,
    fp: collectix_runtime::Fingerprint,
    at: Time,
}

impl Ran {
    /// Call `seq` (`fp`) finished at `at`.
    pub(super) fn push(&mut self, seq: u64, fp: collectix_runtime::Fingerprint, at: Time) {
        match self.runs.last_mut() {
            Some(r) if r.fp == fp && r.at == at && r.last.checked_add(1) == Some(seq) => {
                r.last = seq;
            }
            _ => self.runs.push(Run {
                first: seq,
                last: seq,
                fp,
                at,
            }),
        }
        self.calls += 1;
    }
}

impl Core {
    /// Gives the engine and the flight recorder the records of group `gid`'s calls that ran
    /// on its quick path (and empties `ran`): the engine each call, the flight recorder the
    /// last [`CALLS_KEPT`](super::super::recorder::CALLS_KEPT) (it keeps no more).
    pub(super) fn take_ran(&mut self, gid: collectix_runtime::GroupId, ran: &mut Ran) {
        if ran.calls == 0 {
            return;
        }
        self.engine.board_ran(
            gid,
            ran.runs
                .iter()
                .flat_map(|r| (r.first..=r.last).map(move |s| (s, r.fp))),
        );
        let skip = ran.calls.saturating_sub(super::super::recorder::CALLS_KEPT);
        let mut i = 0;
        for r in &ran.runs {
            let n = usize::try_from(r.last - r.first + 1).unwrap_or(usize::MAX);
            for seq in (r.first..=r.last).skip(skip.saturating_sub(i).min(n)) {
                let fp = r.fp;
                let mut record =
                    Recorder::record(gid, Some(seq), fp.kind, fp.dtype, fp.count, r.at);
                record.ended_ms = Some(record.started_ms);
                record.state = super::super::recorder::CallState::Completed;
                self.recorder.started(Key::Board(gid, seq), record);
            }
            i = i.saturating_add(n);
        }
        ran.runs.clear();
        ran.calls = 0;
    }

    /// Gives the engine and the flight recorder the record of a call that ended on a board.
    pub(super) fn board_record(&mut self, gid: collectix_runtime::GroupId, r: Record, now: Time) {
        match r {
            Record::Finished(seq, fp, at) => {
                self.engine.board_finished(gid, seq, fp);
                self.recorder.ended(Key::Board(gid, seq), at, None);
            }
            Record::Failed(seq, e) => {
                self.recorder.ended(Key::Board(gid, seq), now, Some(&e));
                self.engine.board_failed(gid, seq, *e);
            }
            Record::Disagreed(seq, e) => self.engine.board_disagreed(gid, seq, *e),
        }
    }
}
