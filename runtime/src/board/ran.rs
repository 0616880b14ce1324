//! The calls of a group that ran on a caller's quick path (from start to finish, with no
//! queue) and the engine has not heard of yet ([`Ran`]): kept as runs of consecutive calls
//! of one kind within one tick of the clock (a loop of barriers is one run per tick), and
//! handed to the engine with [`BoardEvent::Ran`](crate::engine::BoardEvent::Ran).

use crate::ids::Fingerprint;
use crate::time::Time;

/// Calls that ran on the quick path, as runs.
#[derive(Debug, Default)]
pub struct Ran {
    runs: Vec<Run>,
    calls: usize,
}

/// Calls `first..=last` of a group, each `fp`, all finished at `at`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    /// The first call's sequence number.
    pub first: u64,
    /// The last call's sequence number.
    pub last: u64,
    /// Each call's fingerprint.
    pub fp: Fingerprint,
    /// When they finished.
    pub at: Time,
}

impl Ran {
    /// Call `seq` (`fp`) finished at `at`.
    pub fn push(&mut self, seq: u64, fp: Fingerprint, at: Time) {
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

    /// How many calls ran.
    pub fn calls(&self) -> usize {
        self.calls
    }

    /// The runs, in order.
    pub fn runs(&self) -> &[Run] {
        &self.runs
    }

    /// Each call (sequence number, fingerprint), in order.
    pub fn each(&self) -> impl Iterator<Item = (u64, Fingerprint)> + '_ {
        self.runs
            .iter()
            .flat_map(|r| (r.first..=r.last).map(move |s| (s, r.fp)))
    }

    /// Forgets them (the engine has them).
    pub fn clear(&mut self) {
        self.runs.clear();
        self.calls = 0;
    }
}

#[cfg(all(test, not(collectix_loom)))]
mod tests {
    use super::*;
    use crate::ids::{DataPath, Fingerprint};
    use crate::op::OpKind;
    use crate::tensor::dtype::DType;

    fn fp(kind: OpKind) -> Fingerprint {
        Fingerprint {
            kind,
            dtype: DType::F32,
            count: Some(1),
            root: None,
            op: None,
            scalar: 0,
            algorithm: None,
            path: DataPath::Engine,
        }
    }

    #[test]
    fn consecutive_calls_of_one_kind_in_one_tick_are_one_run() {
        let (a, b) = (fp(OpKind::AllReduce), fp(OpKind::Broadcast));
        let t = Time::ZERO;
        let mut ran = Ran::default();
        for seq in 0..3 {
            ran.push(seq, a, t);
        }
        ran.push(3, b, t);
        ran.push(5, b, t);
        ran.push(6, b, t + std::time::Duration::from_millis(1));
        assert_eq!(ran.calls(), 6);
        let spans: Vec<(u64, u64)> = ran.runs().iter().map(|r| (r.first, r.last)).collect();
        assert_eq!(
            spans,
            vec![(0, 2), (3, 3), (5, 5), (6, 6)],
            "a gap, a tick: new runs"
        );
        let seqs: Vec<u64> = ran.each().map(|(s, _)| s).collect();
        assert_eq!(seqs, vec![0, 1, 2, 3, 5, 6]);
        ran.clear();
        assert_eq!((ran.calls(), ran.runs().len()), (0, 0));
    }
}
