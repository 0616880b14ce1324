//! Who is late to a group's calls, as one rank sees it: for each collective call, when this
//! rank made it and when each peer's first message of it arrived, and from those, once the
//! call completes, which member came last and by how much.
//!
//! Nothing is sent for it: the arrivals are the call's own messages, stamped with the time
//! the driver passes in. A peer's first message of a call leaves when that peer makes the call
//! (or, in a schedule whose first step receives before it sends, when what it waited for
//! came), so its arrival less this rank's own issue is the peer's offset: positive when the
//! peer came later than this rank, negative when its message was here first and waited. The
//! call's late-comer is the member with the largest offset, this rank counted at zero: a rank
//! whose peers' messages all waited for it names itself. It is late by the largest offset
//! less the smallest (how long the earliest member it heard of waited for it).
//!
//! A rank hears only from the peers its schedule receives from (every member in the direct
//! and tree schedules of small calls, one neighbour in a ring), so one rank's view may miss
//! the late-comer; every rank's summaries together name it (the members that hear from it
//! name it; it names itself): [`LatenessSummary::combined`]. A summary counts a late-comer
//! only when it came at least [`NOTABLE`] after the earliest member (a message's own
//! flight, microseconds, and the clock's ticks name a neighbour otherwise); the last verdict is kept whatever
//! its size.
//!
//! Its resolution is the driver's clock's: the rank actors pass the engine's coarse clock
//! (Linux's `CLOCK_MONOTONIC_COARSE`, 4 ms on this project's VM), so a lateness is known to a
//! few milliseconds per call and better on average.
//!
//! Bounded: at most [`KEPT`] calls' arrivals are kept (a peer runs at most a window of calls
//! ahead; the oldest go first), each with the peers heard from; a member's summary is a few
//! counters.

use crate::time::Time;
use std::collections::BTreeMap;
use std::time::Duration;

/// Calls whose arrivals one group keeps at most (calls made or heard of, not yet completed).
pub const KEPT: usize = 1024;

/// The least lateness a summary counts (module doc): above the resolution of the clock the
/// rank actors pass (4 ms on this project's VM: a message a few microseconds late, stamped
/// just after a tick, reads 4 ms late).
pub const NOTABLE: Duration = Duration::from_millis(10);

/// One member's record as the late-comer of a group's calls, as one rank saw them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemberLateness {
    /// Calls in which it came last.
    pub last: u64,
    /// Its lateness summed over those calls.
    pub total: Duration,
    /// The most it was late by.
    pub max: Duration,
    /// Its lateness in the last call it came last in.
    pub recent: Duration,
}

impl MemberLateness {
    /// Its mean lateness over the calls it came last in.
    pub fn mean(&self) -> Duration {
        match u32::try_from(self.last) {
            Ok(0) => Duration::ZERO,
            Ok(n) => self.total / n,
            Err(_) => Duration::from_nanos(
                u64::try_from(self.total.as_nanos() / u128::from(self.last)).unwrap_or(u64::MAX),
            ),
        }
    }
}

/// Which member came last to one call, as one rank saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// The call's sequence number in its group.
    pub seq: u64,
    /// The late-comer, a group-local rank (this rank's own, if its peers' messages waited).
    pub late: usize,
    /// How long after the earliest member it heard of it came.
    pub by: Duration,
    /// How many peers this rank heard from in the call.
    pub heard: usize,
}

/// A group's late-comers as one rank saw them: per member, how often and by how much it came
/// last (by at least [`NOTABLE`]), over the calls that completed here.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LatenessSummary {
    /// Calls judged (completed here, with at least one peer heard from).
    pub calls: u64,
    /// By group-local rank.
    pub members: Vec<MemberLateness>,
    /// The last call judged.
    pub last: Option<Verdict>,
}

impl LatenessSummary {
    /// The member that came last most often, with its record (`None` if none came last by
    /// [`NOTABLE`] or more).
    pub fn most_often_last(&self) -> Option<(usize, &MemberLateness)> {
        self.members
            .iter()
            .enumerate()
            .filter(|(_, m)| m.last > 0)
            .max_by_key(|(_, m)| (m.last, m.total))
    }

    /// The member to name as the group's late-comer (in a combined view): the one that came
    /// last most often, if it did in more than one call and in more than half of the calls
    /// judged. One late call is not a culprit: the first call after a join, which the ranks
    /// reach at different times, names whoever joined last.
    pub fn culprit(&self) -> Option<(usize, &MemberLateness)> {
        self.most_often_last()
            .filter(|(_, r)| r.last > 1 && r.last.saturating_mul(2) > self.calls)
    }

    /// The group's view from its members' views (`views[r]` is group-local rank `r`'s): each
    /// member's record as the view that saw it come last most often has it (its peers that
    /// hear from it, or itself), the most calls any view judged, and no last verdict. A
    /// member whose own view names another member in most of its calls waited itself: what
    /// it sent was late because what it forwards was (a schedule whose first step receives
    /// before it sends), so it is not counted.
    pub fn combined(views: &[LatenessSummary]) -> LatenessSummary {
        let members = views.iter().map(|v| v.members.len()).max().unwrap_or(0);
        let waited = |m: usize| {
            views
                .get(m)
                .and_then(|v| v.most_often_last().map(|(k, r)| (k, r.last, v.calls)))
                .is_some_and(|(k, last, calls)| k != m && last * 2 > calls)
        };
        LatenessSummary {
            calls: views.iter().map(|v| v.calls).max().unwrap_or(0),
            members: (0..members)
                .map(|m| {
                    if waited(m) {
                        return MemberLateness::default();
                    }
                    views
                        .iter()
                        .filter_map(|v| v.members.get(m))
                        .max_by_key(|r| (r.last, r.total))
                        .cloned()
                        .unwrap_or_default()
                })
                .collect(),
            last: None,
        }
    }
}

impl std::fmt::Display for LatenessSummary {
    /// One line: `40 calls judged; member 2 last in 40 (mean 50.1 ms, max 52.0 ms, recent
    /// 48.0 ms)`, or `...; nobody late by 10 ms or more`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        write!(f, "{} calls judged", self.calls)?;
        let mut any = false;
        for (m, r) in self.members.iter().enumerate().filter(|(_, r)| r.last > 0) {
            any = true;
            write!(
                f,
                "; member {m} last in {} (mean {:.1} ms, max {:.1} ms, recent {:.1} ms)",
                r.last,
                ms(r.mean()),
                ms(r.max),
                ms(r.recent)
            )?;
        }
        if !any {
            write!(f, "; nobody late by {} ms or more", NOTABLE.as_millis())?;
        }
        Ok(())
    }
}

/// When this rank made a call and when its peers' first messages of it came.
#[derive(Debug)]
struct Arrivals {
    issued: Option<Time>,
    /// Each peer heard from (group-local) and when its first message came, in arrival order
    /// (a few peers in most schedules: a list, not a slot per member).
    first: Vec<(usize, Time)>,
}

/// The arrivals of one group's calls on one rank, and its summary (module doc).
#[derive(Debug)]
pub struct Lateness {
    me: usize,
    members: usize,
    calls: BTreeMap<u64, Arrivals>,
    summary: LatenessSummary,
}

impl Lateness {
    /// For the group-local rank `me` of a group of `members`.
    pub fn new(me: usize, members: usize) -> Lateness {
        Lateness {
            me,
            members,
            calls: BTreeMap::new(),
            summary: LatenessSummary {
                members: vec![MemberLateness::default(); members],
                ..LatenessSummary::default()
            },
        }
    }

    fn entry(&mut self, seq: u64) -> &mut Arrivals {
        if !self.calls.contains_key(&seq) && self.calls.len() >= KEPT {
            self.calls.pop_first();
        }
        self.calls.entry(seq).or_insert_with(|| Arrivals {
            issued: None,
            first: Vec::new(),
        })
    }

    /// This rank made call `seq` at `now`.
    pub fn issued(&mut self, seq: u64, now: Time) {
        self.entry(seq).issued.get_or_insert(now);
    }

    /// A message of call `seq` from `peer` (group-local) came at `now`; only the first of
    /// each peer counts.
    pub fn arrived(&mut self, seq: u64, peer: usize, now: Time) {
        if peer >= self.members || peer == self.me {
            return;
        }
        let first = &mut self.entry(seq).first;
        if !first.iter().any(|&(p, _)| p == peer) {
            first.push((peer, now));
        }
    }

    /// Call `seq` completed here: its verdict, counted in the summary (`None` if this rank
    /// did not make it or heard from nobody in it).
    pub fn completed(&mut self, seq: u64) -> Option<Verdict> {
        let a = self.calls.remove(&seq)?;
        let issued = i128::from(a.issued?.as_nanos());
        let mut heard = 0;
        // Offsets from this rank's issue, in nanoseconds: (latest, its member), earliest.
        let (mut late, mut earliest) = ((0i128, self.me), 0i128);
        for &(m, t) in &a.first {
            heard += 1;
            let off = i128::from(t.as_nanos()) - issued;
            if off > late.0 {
                late = (off, m);
            }
            earliest = earliest.min(off);
        }
        if heard == 0 {
            return None;
        }
        let by = Duration::from_nanos(u64::try_from(late.0 - earliest).unwrap_or(u64::MAX));
        let v = Verdict {
            seq,
            late: late.1,
            by,
            heard,
        };
        self.count(v);
        Some(v)
    }

    /// Call `seq`, which ran on a board (no messages: its driver saw the slots), waited `by`
    /// for member `late`'s slot, the last it needed; counted as a verdict that heard one
    /// peer. A board call that waited for nobody is not judged (this rank cannot tell how
    /// long the members' slots waited for it).
    pub fn judged(&mut self, seq: u64, late: usize, by: Duration) {
        self.calls.remove(&seq);
        if late < self.members {
            self.count(Verdict {
                seq,
                late,
                by,
                heard: 1,
            });
        }
    }

    fn count(&mut self, v: Verdict) {
        let by = v.by;
        self.summary.calls += 1;
        self.summary.last = Some(v);
        if by < NOTABLE {
            return;
        }
        if let Some(m) = self.summary.members.get_mut(v.late) {
            m.last += 1;
            m.total = m.total.saturating_add(by);
            m.max = m.max.max(by);
            m.recent = by;
        }
    }

    /// Call `seq` failed (or will not be judged): its arrivals go.
    pub fn forget(&mut self, seq: u64) {
        self.calls.remove(&seq);
    }

    /// The summary so far.
    pub fn summary(&self) -> &LatenessSummary {
        &self.summary
    }

    /// Calls whose arrivals are kept now.
    pub fn kept(&self) -> usize {
        self.calls.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Time {
        Time::from_nanos(n * 1_000_000)
    }

    #[test]
    fn a_peer_that_comes_after_this_rank_is_the_late_comer_by_its_offset() {
        let mut l = Lateness::new(0, 4);
        l.issued(7, ms(100));
        l.arrived(7, 1, ms(101));
        l.arrived(7, 2, ms(300));
        l.arrived(7, 2, ms(301)); // a second message of the same peer does not count
        l.arrived(7, 3, ms(99));
        let v = l.completed(7);
        assert_eq!(
            v,
            Some(Verdict {
                seq: 7,
                late: 2,
                by: Duration::from_millis(201),
                heard: 3
            })
        );
        let s = l.summary();
        assert_eq!((s.calls, s.members[2].last, s.members[0].last), (1, 1, 0));
        assert_eq!(
            s.to_string(),
            "1 calls judged; member 2 last in 1 (mean 201.0 ms, max 201.0 ms, recent 201.0 ms)"
        );
        assert_eq!(
            LatenessSummary::default().to_string(),
            "0 calls judged; nobody late by 10 ms or more"
        );
        assert_eq!(s.most_often_last().map(|(m, _)| m), Some(2));
        assert_eq!(l.kept(), 0);
    }

    #[test]
    fn a_rank_whose_peers_messages_waited_for_it_names_itself() {
        let mut l = Lateness::new(2, 3);
        // The peers' messages came before this rank made the call.
        l.arrived(0, 0, ms(10));
        l.arrived(0, 1, ms(12));
        l.issued(0, ms(210));
        let v = l.completed(0).map(|v| (v.late, v.by));
        assert_eq!(v, Some((2, Duration::from_millis(200))));
    }

    #[test]
    fn calls_heard_from_nobody_or_not_made_here_are_not_judged() {
        let mut l = Lateness::new(0, 2);
        l.issued(0, ms(1));
        assert_eq!(l.completed(0), None, "no peer heard");
        l.arrived(1, 1, ms(2));
        assert_eq!(l.completed(1), None, "not made here");
        assert_eq!(l.completed(9), None, "unknown");
        l.arrived(2, 1, ms(3));
        l.forget(2);
        l.arrived(3, 5, ms(3)); // not a member: ignored
        l.arrived(3, 0, ms(3)); // this rank: ignored
        l.issued(3, ms(4));
        assert_eq!((l.completed(3), l.summary().calls), (None, 0));
    }

    #[test]
    fn the_summary_counts_each_member_and_keeps_its_mean_and_max() {
        let mut l = Lateness::new(0, 3);
        for seq in 0..10u64 {
            l.issued(seq, ms(seq * 1000));
            // Member 1 comes 200 ms late in nine calls of ten, member 2 15 ms late in the other.
            let (one, two) = if seq == 4 { (0, 15) } else { (200 + seq, 1) };
            l.arrived(seq, 1, ms(seq * 1000 + one));
            l.arrived(seq, 2, ms(seq * 1000 + two));
            l.completed(seq);
        }
        let s = l.summary();
        assert_eq!((s.calls, s.members[1].last, s.members[2].last), (10, 9, 1));
        let (m, rec) = s.most_often_last().unwrap_or_else(|| panic!("none"));
        assert_eq!(m, 1);
        assert_eq!(rec.max, Duration::from_millis(209));
        assert_eq!(rec.recent, Duration::from_millis(209));
        let mean = rec.mean().as_secs_f64() * 1e3;
        assert!((mean - 1841.0 / 9.0).abs() < 0.01, "{mean}");
    }

    #[test]
    fn lateness_below_the_floor_is_judged_but_not_counted_and_views_combine() {
        let ns = |n: u64| Time::from_nanos(1_000_000_000 + n);
        // Rank 0 of a ring hears only rank 3, a few microseconds after its own issue.
        let mut zero = Lateness::new(0, 4);
        // Rank 3 hears rank 2, which came 200 ms late.
        let mut three = Lateness::new(3, 4);
        for seq in 0..5 {
            zero.issued(seq, ns(0));
            zero.arrived(seq, 3, ns(4_000));
            three.issued(seq, ns(0));
            three.arrived(seq, 2, ns(200_000_000));
            assert_eq!(zero.completed(seq).map(|v| v.late), Some(3));
            assert_eq!(three.completed(seq).map(|v| v.late), Some(2));
        }
        let z = zero.summary();
        assert_eq!((z.calls, z.most_often_last().map(|(m, _)| m)), (5, None));
        let none = LatenessSummary::default();
        let all =
            LatenessSummary::combined(&[z.clone(), none.clone(), none, three.summary().clone()]);
        let (m, rec) = all.most_often_last().unwrap_or_else(|| panic!("none"));
        assert_eq!(
            (m, rec.last, rec.recent),
            (2, 5, Duration::from_millis(200))
        );
        assert_eq!(all.calls, 5);
        assert_eq!(all.culprit().map(|(m, _)| m), Some(2));
    }

    #[test]
    fn a_member_late_once_or_in_few_calls_is_no_culprit() {
        let mut l = Lateness::new(0, 2);
        let late = |l: &mut Lateness, seq: u64, ms_late: u64| {
            l.issued(seq, ms(seq * 1000));
            l.arrived(seq, 1, ms(seq * 1000 + ms_late));
            l.completed(seq);
        };
        late(&mut l, 0, 30); // the first call after a join
        late(&mut l, 1, 0);
        assert_eq!(l.summary().most_often_last().map(|(m, _)| m), Some(1));
        assert_eq!(l.summary().culprit().map(|(m, _)| m), None, "late once");
        late(&mut l, 2, 30);
        late(&mut l, 3, 0);
        late(&mut l, 4, 0);
        assert_eq!(l.summary().culprit().map(|(m, _)| m), None, "2 of 5");
        late(&mut l, 5, 30);
        late(&mut l, 6, 30);
        assert_eq!(l.summary().culprit().map(|(m, _)| m), Some(1), "4 of 7");
    }

    #[test]
    fn arrivals_kept_are_bounded() {
        let mut l = Lateness::new(0, 2);
        for seq in 0..(KEPT as u64 + 100) {
            l.arrived(seq, 1, ms(seq));
        }
        assert_eq!(l.kept(), KEPT);
        // The oldest went first.
        l.issued(0, ms(0));
        assert_eq!(l.completed(0), None);
        l.issued(KEPT as u64 + 99, ms(0));
        assert!(l.completed(KEPT as u64 + 99).is_some());
    }
}
