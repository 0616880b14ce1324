//! What the engine and the flight recorder hear of the calls that ran on a board: the
//! quick path's runs of calls ([`Ran`]), and each queued call's [`Record`], both through
//! the engine's one board input ([`BoardEvent`]).

use super::super::recorder::{CallState, Key, Recorder, CALLS_KEPT};
use super::super::Core;
use collectix_runtime::board::queue::Record;
use collectix_runtime::board::ran::Ran;
use collectix_runtime::{BoardEvent, GroupId, Time};

impl Core {
    /// Gives the engine and the flight recorder the records of group `gid`'s calls that ran
    /// on its quick path (and empties `ran`): the engine each call, the flight recorder the
    /// last [`CALLS_KEPT`] (it keeps no more).
    pub(super) fn take_ran(&mut self, gid: GroupId, ran: &mut Ran) {
        if ran.calls() == 0 {
            return;
        }
        let skip = ran.calls().saturating_sub(CALLS_KEPT);
        let mut i = 0;
        for r in ran.runs() {
            let n = usize::try_from(r.last - r.first + 1).unwrap_or(usize::MAX);
            for seq in (r.first..=r.last).skip(skip.saturating_sub(i).min(n)) {
                let fp = r.fp;
                let mut record =
                    Recorder::record(gid, Some(seq), fp.kind, fp.dtype, fp.count, r.at);
                record.ended_ms = Some(record.started_ms);
                record.state = CallState::Completed;
                self.recorder.started(Key::Board(gid, seq), record);
            }
            i = i.saturating_add(n);
        }
        self.engine.board(gid, BoardEvent::Ran(ran));
    }

    /// Gives the engine and the flight recorder the record of a call that ended on a board.
    pub(super) fn board_record(&mut self, gid: GroupId, r: Record, now: Time) {
        match &r {
            Record::Finished(seq, _, at, _) => {
                self.recorder.ended(Key::Board(gid, *seq), *at, None);
            }
            Record::Failed(seq, e) => {
                self.recorder.ended(Key::Board(gid, *seq), now, Some(&**e));
            }
            Record::Disagreed(..) => {}
        }
        self.engine.board(gid, BoardEvent::Record(r));
    }
}
