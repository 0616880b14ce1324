//! The survivors' agreement, as a state machine with no IO: who is alive, and which calls of
//! the failed group completed on every survivor.
//!
//! Every survivor runs one [`Agreement`] against the job's store, a linearizable key-value
//! register (the in-process memory store, or the TCP store's one server):
//!
//! 1. **Publish**: it writes its proposal under its own key: the number of the group's calls
//!    that completed on it without a gap (calls `0..completed`), and its own [`Evidence`]
//!    against the other members (whom it knows dead, whom it suspects). It publishes again
//!    whenever its evidence changes.
//! 2. **Look**: it reads the decision key and every member's proposal key, again and again,
//!    until a decision exists, or every member is accounted for, or the group's timeout has
//!    passed. A member is accounted for once it published, or is certainly dead (by this
//!    rank's evidence or any member's), or a strict majority of the members not certainly
//!    dead suspect it. A member that only this rank suspects, or that others only reported lost, is
//!    waited for: it may be alive, cut off from this rank alone. A member that another
//!    suspects and this rank has no evidence against, it probes first ([`Ask::Probe`]):
//!    with connections made on a link's first message, it may never have had one to it.
//! 3. **Decide**: only with a strict majority of the group's members published or certainly
//!    dead, it proposes a decision from what it saw, with one compare-and-set of the decision
//!    key from empty. Members: those that published and are not certainly dead, less as few
//!    as leave every two of them connected (see [`evidence`](super::evidence)); completed:
//!    the least of their proposals. Once it sees a link between two members broken, it first
//!    waits a moment ([`Agreement::settling_for`]) for the rest of the evidence. The store
//!    keeps the first decision written and hands it back to every later one: there is
//!    exactly one decision, whatever fails when. Without a majority by the deadline, the
//!    rank decides nothing: [`Error::NoMajority`].
//!
//! **Regrow.** Where a launcher restarts what died, the survivors wait for every member
//! ([`Agreement::waiting_for_everyone`]), and a lost member's new incarnation takes part as a
//! [`newcomer`](Agreement::newcomer): it publishes under its rank's key a proposal that
//! brings no state, and the decision names it among the [`joined`](Decision::joined)
//! members, whom the others give the group's state. Whoever has not published by the
//! deadline is left out, as in a shrink.
//!
//! A member known dead is not counted, even where its proposal is in the store (it
//! published, then died): a group with it would fail at once.
//!
//! A rank adopts the decision it reads: if it is a member, the decision is its new group; if
//! not, it was left out ([`Error::LeftOut`]) and stops. A second failure cannot split the
//! survivors: a rank that dies before publishing is left out by a decider that saw it lost
//! (or waited out the timeout); one that dies after publishing is in the decision, and the
//! new group's first call (or its creation, if the loss is known by then) fails with
//! [`Error::PeerLost`], so the survivors agree again, from the new group. A decider that
//! dies between its look and its compare-and-set leaves the key empty for the next one.

use super::evidence::{connected, Evidence, Proposal};
use crate::error::{Error, Result};
use crate::ids::{fnv1a, GroupId};
use crate::time::Time;
use std::collections::{BTreeMap, BTreeSet};

#[cfg(all(test, not(collectix_loom)))]
mod tests;

/// The decision's magic bytes, and the version of its layout.
const DECISION_MAGIC: [u8; 4] = *b"cxs3";
/// Bytes of a decision before its members: magic, decider, completed, member count.
const DECISION_HEAD: usize = 4 + 8 + 8 + 4;

/// What the survivors of a group agreed on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// The members of the new group (global ranks), in the new group's order: its group
    /// ranks are their positions. The failed group's members that go on keep their order;
    /// a standby that replaces a lost member takes that member's place
    /// ([`replaced`](Self::replaced)).
    pub members: Vec<usize>,
    /// Calls `0..completed` of the failed group (by sequence number) completed on every
    /// member of the new group; the rest must be made again (torchft's "should commit").
    pub completed: u64,
    /// The rank whose decision this is (global).
    pub decided_by: usize,
    /// The members that are new incarnations of a lost rank (restarted processes), in
    /// order: they have none of the group's state, which the others must give them.
    pub joined: Vec<usize>,
    /// The members that published but were left out because links between live members
    /// broke, each with a peer it could not reach (in order).
    pub cut_off: Vec<(usize, usize)>,
    /// The lost members that a standby replaces (a hot standby: a rank that joined the job
    /// outside the group, connected, and waits), each with its standby, in order: the
    /// standby takes the lost member's place in the new group, and is among
    /// [`joined`](Self::joined).
    pub replaced: Vec<(usize, usize)>,
    /// Ranks outside the failed group that came back into it (left out of an earlier
    /// decision, their links since healed: [`Agreement::standby`]), in order: they follow
    /// the failed group's members in the new group, and are among [`joined`](Self::joined).
    pub returned: Vec<usize>,
}

impl Decision {
    /// The new group's identity: the same on every member, and never the failed group's.
    pub fn group_id(&self, failed: GroupId) -> GroupId {
        let words = self.members.iter().map(|&m| m as u64);
        GroupId::derive(failed, u64::MAX, &[3, fnv1a(words)])
    }

    /// The decision as the store keeps it.
    pub fn encode(&self) -> Vec<u8> {
        let n = self.members.len() + self.joined.len() + 2 * self.cut_off.len();
        let mut v = Vec::with_capacity(
            DECISION_HEAD + 16 + 8 * (n + 2 * self.replaced.len() + self.returned.len()),
        );
        v.extend_from_slice(&DECISION_MAGIC);
        v.extend_from_slice(&(self.decided_by as u64).to_le_bytes());
        v.extend_from_slice(&self.completed.to_le_bytes());
        let pairs: Vec<usize> = self.cut_off.iter().flat_map(|&(a, b)| [a, b]).collect();
        let swaps: Vec<usize> = self.replaced.iter().flat_map(|&(a, b)| [a, b]).collect();
        for list in [&self.members, &self.joined, &pairs, &swaps, &self.returned] {
            v.extend_from_slice(&(list.len() as u32).to_le_bytes());
            for &m in list {
                v.extend_from_slice(&(m as u64).to_le_bytes());
            }
        }
        v
    }

    /// A decision read from the store, checked against the failed group's members (`old`):
    /// its members are distinct members of `old`, in order, its new incarnations some of
    /// them, in order, and its decider one of `old`.
    pub fn decode(bytes: &[u8], old: &[usize]) -> Result<Decision> {
        let bad =
            |what: &str| Error::Store(format!("the survivors' decision is malformed: {what}"));
        if bytes.len() < DECISION_HEAD + 4 || bytes[..4] != DECISION_MAGIC {
            return Err(bad("no decision header"));
        }
        let word = |at: usize| -> Option<u64> {
            let b: [u8; 8] = bytes.get(at..at + 8)?.try_into().ok()?;
            Some(u64::from_le_bytes(b))
        };
        let count = |at: usize| -> Option<usize> {
            let b: [u8; 4] = bytes.get(at..at + 4)?.try_into().ok()?;
            Some(u32::from_le_bytes(b) as usize)
        };
        let rank = |w: u64| usize::try_from(w).unwrap_or(usize::MAX);
        // Each list is checked against the bytes present before anything is allocated.
        let list = |at: usize| -> Option<(Vec<usize>, usize)> {
            let n = count(at)?;
            if n > bytes.len() / 8 || bytes.len() < at + 4 + 8 * n {
                return None;
            }
            let v = (0..n)
                .map(|i| word(at + 4 + 8 * i).map(rank))
                .collect::<Option<Vec<usize>>>()?;
            Some((v, at + 4 + 8 * n))
        };
        let (Some(decided_by), Some(completed)) = (word(4).map(rank), word(12)) else {
            return Err(bad("no decision header"));
        };
        let Some((members, at)) = list(20) else {
            return Err(bad("member count and length disagree"));
        };
        let Some((joined, at)) = list(at) else {
            return Err(bad("new incarnations' count and length disagree"));
        };
        let Some((pairs, at)) = list(at) else {
            return Err(bad("the cut-off members' count and length disagree"));
        };
        let Some((swaps, at)) = list(at) else {
            return Err(bad("the replaced members' count and length disagree"));
        };
        let Some((returned, end)) = list(at) else {
            return Err(bad("the returned ranks' count and length disagree"));
        };
        if end != bytes.len() || members.is_empty() || members.len() > old.len() + returned.len() {
            return Err(bad("member count and length disagree"));
        }
        let two = |v: &[usize]| -> Option<Vec<(usize, usize)>> {
            v.len()
                .is_multiple_of(2)
                .then(|| v.chunks_exact(2).map(|p| (p[0], p[1])).collect())
        };
        let (Some(cut_off), Some(replaced)) = (two(&pairs), two(&swaps)) else {
            return Err(bad("a list of pairs has an odd length"));
        };
        if !cut_off
            .iter()
            .all(|(a, b)| old.contains(a) && old.contains(b) && !members.contains(a))
        {
            return Err(bad("the cut-off members are not members left out"));
        }
        let standbys: Vec<usize> = replaced.iter().map(|r| r.1).collect();
        let distinct = |v: &[usize]| v.iter().collect::<BTreeSet<_>>().len() == v.len();
        if !distinct(&returned)
            || !returned
                .iter()
                .all(|r| !old.contains(r) && !standbys.contains(r) && members.contains(r))
        {
            return Err(bad("the returned ranks are not new members"));
        }
        if !distinct(&standbys)
            || !replaced.iter().all(|&(lost, s)| {
                old.contains(&lost)
                    && !members.contains(&lost)
                    && !old.contains(&s)
                    && members.contains(&s)
            })
        {
            return Err(bad(
                "the replaced members are not lost members, each with a standby",
            ));
        }
        let ordered = |v: &[usize]| v.windows(2).all(|w| w[0] < w[1]);
        let kept: Vec<usize> = members
            .iter()
            .copied()
            .filter(|m| old.contains(m))
            .collect();
        if !distinct(&members)
            || !ordered(&kept)
            || !members
                .iter()
                .all(|m| old.contains(m) || standbys.contains(m) || returned.contains(m))
        {
            return Err(bad(
                "members are not distinct members of the failed group, in order",
            ));
        }
        if !ordered(&joined) || !joined.iter().all(|m| members.contains(m)) {
            return Err(bad("new incarnations are not members, in order"));
        }
        if !old.contains(&decided_by) {
            return Err(bad("decided by a rank outside the failed group"));
        }
        Ok(Decision {
            members,
            completed,
            decided_by,
            joined,
            cut_off,
            replaced,
            returned,
        })
    }
}

/// The store key of the decision on the survivors of `group`.
pub fn decision_key(group: GroupId) -> String {
    format!("collectix/survivors/{group}/decision")
}

/// The store key that says an agreement on the survivors of `group` began: the survivors
/// of a regrow that may take standbys set it first, and the standbys, which follow the job's
/// chain of groups, join the agreement when they see it.
pub fn open_key(group: GroupId) -> String {
    format!("collectix/survivors/{group}/open")
}

/// The store key of rank `rank`'s proposal in the agreement on the survivors of `group`.
pub fn proposal_key(group: GroupId, rank: usize) -> String {
    format!("collectix/survivors/{group}/rank/{rank}")
}

/// What the driver of an [`Agreement`] does next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ask {
    /// Set `key` to `value`, then poll again.
    Publish {
        /// The key.
        key: String,
        /// The value.
        value: Vec<u8>,
    },
    /// Read `keys` and hand their values (`None` where absent), in order, to
    /// [`Agreement::looked`]. When that leaves the agreement looking, wait a little before
    /// asking again.
    Look {
        /// The keys.
        keys: Vec<String>,
    },
    /// Make sure each of `peers` can be reached within `within` ([`Link::probe`]: a lazy
    /// connection is made now), wait until each probe has its outcome (reached, or lost to
    /// this rank, which the driver's evidence says at the next look), then poll again.
    /// Asked for members that another member suspects and this rank has no evidence
    /// against (it may have had no connection to them at all). The probe takes half the
    /// settling time ([`Agreement::settling_for`]), so that its outcome is published
    /// before a rank that saw a broken link decides.
    ///
    /// [`Link::probe`]: crate::wire::Link::probe
    Probe {
        /// The members to reach (global ranks).
        peers: Vec<usize>,
        /// How long a probe may take.
        within: std::time::Duration,
    },
    /// Compare-and-set `key` from empty (absent) to `value`, and hand the value the key holds
    /// afterwards (the first decision written) to [`Agreement::decided`].
    Decide {
        /// The key.
        key: String,
        /// The value.
        value: Vec<u8>,
    },
    /// Over: see [`Agreement::outcome`].
    Done,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Step {
    Publish,
    Look,
    Decide(Vec<u8>),
    Done,
}

/// What a look leads to.
enum Verdict {
    Decide(Decision),
    Wait,
    Fail(Error),
}

/// Waiting, or once the deadline is `over`, failing with `e`.
fn wait_or(over: bool, e: impl FnOnce() -> Error) -> Verdict {
    if over {
        Verdict::Fail(e())
    } else {
        Verdict::Wait
    }
}

/// One rank's part in agreeing on a failed group's survivors: see the module docs.
#[derive(Debug)]
pub struct Agreement {
    group: GroupId,
    me: usize,
    members: Vec<usize>,
    /// Calls of the group completed here; `None` for a new incarnation (no state).
    completed: Option<u64>,
    /// Whether to wait (until the deadline) for every member, the lost ones' new
    /// incarnations included (a regrow), rather than for the members not accounted for.
    everyone: bool,
    deadline: Time,
    step: Step,
    /// This rank's evidence against the other members, as last given.
    evidence: Evidence,
    /// The evidence in this rank's proposal in the store (`None`: not published yet).
    published: Option<Evidence>,
    /// Proposals seen, by rank.
    seen: BTreeMap<usize, Proposal>,
    /// The job's standbys that may replace a lost member (global ranks, ascending; none
    /// but in a regrow), and the proposals seen of those that came.
    standbys: Vec<usize>,
    seen_standbys: BTreeMap<usize, Proposal>,
    /// Ranks outside the group that may come back into it (left out before; none but in a
    /// regrow), and the proposals seen of those that came.
    returning: Vec<usize>,
    seen_returning: BTreeMap<usize, Proposal>,
    /// Whether this rank is a standby itself: it publishes, looks, and never decides.
    standing_by: bool,
    /// Since when a broken link between two members that published has been seen.
    broken_since: Option<Time>,
    /// How long to wait from then for the rest of the evidence ([`SETTLE`]).
    settle: std::time::Duration,
    /// Members to probe, not handed out yet ([`Ask::Probe`]).
    to_probe: Vec<usize>,
    /// Members probed already.
    probed: BTreeSet<usize>,
    outcome: Option<Result<Decision>>,
}

/// How long a rank waits by default, once it sees a link between two members broken, for
/// the rest of the evidence before it decides (see [`Agreement::settling_for`]).
pub const SETTLE: std::time::Duration = std::time::Duration::from_millis(250);

impl Agreement {
    /// Global rank `me`'s agreement on the survivors of `group`, whose members are
    /// `members` (global ranks); calls `0..completed` of the group completed here. Before
    /// `deadline` it waits for every member not accounted for (a shrink); after, it decides
    /// without the members it has not heard from, if it can count a majority.
    pub fn new(
        group: GroupId,
        me: usize,
        members: Vec<usize>,
        completed: u64,
        deadline: Time,
    ) -> Agreement {
        Agreement {
            group,
            me,
            members,
            completed: Some(completed),
            everyone: false,
            deadline,
            step: Step::Publish,
            evidence: Evidence::default(),
            published: None,
            seen: BTreeMap::new(),
            standbys: Vec::new(),
            seen_standbys: BTreeMap::new(),
            returning: Vec::new(),
            seen_returning: BTreeMap::new(),
            standing_by: false,
            broken_since: None,
            settle: SETTLE,
            to_probe: Vec::new(),
            probed: BTreeSet::new(),
            outcome: None,
        }
    }

    /// This agreement with this rank's evidence against its peers from the start (what it
    /// publishes first; [`looked`](Self::looked) gives it anew each time).
    pub fn with_evidence(mut self, evidence: &Evidence) -> Agreement {
        self.evidence = evidence.within(&self.known(), self.me);
        self
    }

    /// This agreement waiting `settle`, once it sees a link between two members broken,
    /// for the rest of the evidence before it decides (by default [`SETTLE`]). The links of
    /// a rank cut off from the others do not all break at the same moment: each end notices
    /// when its own link falls silent, a heartbeat apart; which members are left out depends
    /// on all of them. The driver sets it to what its links need.
    pub fn settling_for(mut self, settle: std::time::Duration) -> Agreement {
        self.settle = settle;
        self
    }

    /// This agreement waiting (until its deadline) for every member, a lost one's new
    /// incarnation included: a regrow, for a job whose launcher restarts what died.
    pub fn waiting_for_everyone(mut self) -> Agreement {
        self.everyone = true;
        self
    }

    /// The part of global rank `me`, a new incarnation of a lost member (a restarted
    /// process), in the agreement of `group`'s survivors: it brings no state, waits for
    /// every member until `deadline`, and must be among the decision's
    /// [`joined`](Decision::joined) members (a decision that counted its previous
    /// incarnation as a survivor leaves it out: [`Error::LeftOut`]).
    pub fn newcomer(group: GroupId, me: usize, members: Vec<usize>, deadline: Time) -> Agreement {
        Agreement {
            completed: None,
            everyone: true,
            ..Agreement::new(group, me, members, 0, deadline)
        }
    }

    /// This regrow taking the job's `standbys` (global ranks outside the group, which wait
    /// with [`Agreement::standby`]): each lost member (certainly dead, suspected by a strict
    /// majority, or cut off) is replaced by a standby that came, in order, in this very
    /// round; only the lost members no standby replaces are waited for (their new
    /// incarnations) until the deadline.
    pub fn with_standbys(mut self, standbys: &[usize]) -> Agreement {
        let mut v: Vec<usize> = standbys
            .iter()
            .copied()
            .filter(|s| !self.members.contains(s))
            .collect();
        v.sort_unstable();
        v.dedup();
        self.standbys = v;
        self
    }

    /// This regrow taking back the ranks of `returning` (outside the group: left out of an
    /// earlier decision, say, their links since healed) that joined its agreement
    /// ([`Agreement::standby`]) by the time it decides, if they reach every member that goes
    /// on: they follow the members in the new group, among the joined. It does not wait for
    /// them.
    pub fn with_returning(mut self, returning: &[usize]) -> Agreement {
        let mut v: Vec<usize> = returning
            .iter()
            .copied()
            .filter(|s| !self.members.contains(s) && !self.standbys.contains(s))
            .collect();
        v.sort_unstable();
        v.dedup();
        self.returning = v;
        self
    }

    /// The part of global rank `me`, a standby (or a rank coming back) outside `group` (whose members are
    /// `members`), in the agreement of its survivors: it publishes that it is there (no
    /// state), and ends with the decision, in which it is a member (it replaced a lost one:
    /// [`Decision::replaced`]) or not (then [`Error::LeftOut`]: it stays a standby). It
    /// never decides; at `deadline` it gives up.
    pub fn standby(group: GroupId, me: usize, members: Vec<usize>, deadline: Time) -> Agreement {
        Agreement {
            completed: None,
            everyone: true,
            standing_by: true,
            ..Agreement::new(group, me, members, 0, deadline)
        }
    }

    /// The store key of the decision.
    pub fn decision_key(&self) -> String {
        decision_key(self.group)
    }

    /// The store key of rank `rank`'s proposal.
    pub fn proposal_key(&self, rank: usize) -> String {
        proposal_key(self.group, rank)
    }

    /// Whether the agreement is looking at the store, waiting (the driver waits a little
    /// before it asks again); not while a probe waits to be handed out. Unlike
    /// [`poll`](Self::poll), takes nothing out.
    pub fn is_looking(&self) -> bool {
        self.step == Step::Look && self.to_probe.is_empty()
    }

    /// What to do next. A publish is handed out once: the driver must carry out what this
    /// returns.
    pub fn poll(&mut self) -> Ask {
        if !self.to_probe.is_empty() && matches!(self.step, Step::Publish | Step::Look) {
            return Ask::Probe {
                peers: std::mem::take(&mut self.to_probe),
                within: self.settle / 2,
            };
        }
        match &self.step {
            Step::Publish => {
                self.step = Step::Look;
                let proposal = Proposal {
                    completed: self.completed,
                    evidence: self.evidence.clone(),
                };
                self.published = Some(self.evidence.clone());
                Ask::Publish {
                    key: self.proposal_key(self.me),
                    value: proposal.encode(),
                }
            }
            Step::Look => {
                let mut keys = vec![self.decision_key()];
                keys.extend(self.members.iter().map(|&m| self.proposal_key(m)));
                keys.extend(self.standbys.iter().map(|&m| self.proposal_key(m)));
                keys.extend(self.returning.iter().map(|&m| self.proposal_key(m)));
                Ask::Look { keys }
            }
            Step::Decide(value) => Ask::Decide {
                key: self.decision_key(),
                value: value.clone(),
            },
            Step::Done => Ask::Done,
        }
    }

    /// The values of the keys of the last [`Ask::Look`], at `now`, with this rank's
    /// evidence against its peers (global ranks) as it stands now.
    pub fn looked(&mut self, values: Vec<Option<Vec<u8>>>, now: Time, evidence: &Evidence) {
        if self.step != Step::Look {
            return;
        }
        let known = self.known();
        self.evidence = evidence.within(&known, self.me);
        let mut values = values.into_iter();
        if let Some(Some(d)) = values.next() {
            self.adopt(&d);
            return;
        }
        for (&m, v) in self.members.iter().zip(values.by_ref()) {
            // Anything that is not a proposal is not counted.
            if let Some(p) = v.and_then(|v| Proposal::decode(&v, &known)) {
                self.seen.insert(m, p);
            }
        }
        // A standby's or a returning rank's proposal brings no state.
        let fresh = |v: Option<Vec<u8>>| {
            v.and_then(|v| Proposal::decode(&v, &known))
                .filter(|p| p.completed.is_none())
        };
        for (&m, v) in self.standbys.iter().zip(values.by_ref()) {
            if let Some(p) = fresh(v) {
                self.seen_standbys.insert(m, p);
            }
        }
        for (&m, v) in self.returning.iter().zip(values) {
            if let Some(p) = fresh(v) {
                self.seen_returning.insert(m, p);
            }
        }
        // A rank that asks for a probe decides nothing before it has the outcome.
        let probing = self.probe_the_suspected() && now < self.deadline;
        let broken = self.broken();
        self.broken_since = match self.broken_since {
            Some(t) if broken => Some(t),
            _ => broken.then_some(now),
        };
        let verdict = if probing {
            Verdict::Wait
        } else {
            self.verdict(now)
        };
        match verdict {
            Verdict::Decide(d) => self.step = Step::Decide(d.encode()),
            Verdict::Fail(e) => self.fail(e),
            // The others decide from what this rank published: keep it current.
            Verdict::Wait if self.published.as_ref() != Some(&self.evidence) => {
                self.step = Step::Publish;
            }
            Verdict::Wait => {}
        }
    }

    /// Asks to probe the members that another member suspects and that this rank has no
    /// evidence against, once each: with lazy connections a rank may have no link to a
    /// member the others lost, and so nothing to say about it, which would leave its
    /// evidence to the few that had one (a rank cut off with two links broken looks no
    /// worse than the peer at the other end of one of them). Whether it asked.
    fn probe_the_suspected(&mut self) -> bool {
        if self.standing_by {
            return false;
        }
        let me = self.me;
        let mut fresh: Vec<usize> = self
            .seen
            .iter()
            .filter(|(&c, _)| c != me)
            .flat_map(|(_, p)| p.evidence.suspected.iter().copied())
            .filter(|&m| {
                m != me
                    && self.members.contains(&m)
                    && !self.probed.contains(&m)
                    && !self.evidence.dead.contains(&m)
                    && !self.evidence.suspected.contains(&m)
                    && !self.seen.values().any(|p| p.evidence.dead.contains(&m))
            })
            .collect();
        fresh.sort_unstable();
        fresh.dedup();
        if fresh.is_empty() {
            return false;
        }
        self.probed.extend(fresh.iter().copied());
        self.to_probe.extend(fresh);
        true
    }

    /// The members and the standbys: the ranks whose evidence matters.
    fn known(&self) -> Vec<usize> {
        let mut v = self.members.clone();
        v.extend(self.standbys.iter().copied());
        v.extend(self.returning.iter().copied());
        v
    }

    /// Whether some member that published suspects another that published: a broken link
    /// between two members that may both be alive.
    fn broken(&self) -> bool {
        self.seen.iter().any(|(&a, p)| {
            let s = if a == self.me {
                &self.evidence.suspected
            } else {
                &p.evidence.suspected
            };
            s.iter().any(|b| *b != a && self.seen.contains_key(b))
        })
    }

    /// Whether to decide now, and what; to wait; or to give up.
    fn verdict(&self, now: Time) -> Verdict {
        let me = self.me;
        let over = now >= self.deadline;
        if self.standing_by {
            // A standby only waits for the decision.
            return wait_or(over, || {
                Error::Store(format!(
                    "rank {me}, outside group {}, was not taken into the group made of it before its wait ran out",
                    self.group
                ))
            });
        }
        let majority = self.members.len() / 2 + 1;
        // Certainly dead, by this rank's evidence or any published (never this rank), among
        // the members and the standbys.
        let mut dead_known = self.evidence.dead.clone();
        for p in self.seen.values() {
            dead_known.extend(p.evidence.dead.iter().copied());
        }
        dead_known.remove(&me);
        let dead: BTreeSet<usize> = dead_known
            .iter()
            .copied()
            .filter(|m| self.members.contains(m))
            .collect();
        // A member known dead counts only as a new incarnation, and only in a regrow: the
        // proposal its lost incarnation may have published before it died is not counted
        // (it would make a group that fails at once).
        let fresh = |p: &Proposal| self.everyone && p.completed.is_none();
        let candidates: BTreeSet<usize> = self
            .seen
            .iter()
            .filter(|(&m, p)| m == me || fresh(p) || !dead.contains(&m))
            .map(|(&m, _)| m)
            .collect();
        // Suspicions of a new incarnation are of its lost one: they do not count.
        let suspects = |c: usize| -> BTreeSet<usize> {
            let of = if c == me {
                &self.evidence.suspected
            } else {
                match self.seen.get(&c) {
                    Some(p) => &p.evidence.suspected,
                    None => return BTreeSet::new(),
                }
            };
            of.iter()
                .copied()
                .filter(|s| !self.seen.get(s).is_some_and(fresh))
                .collect()
        };
        let votes = |m: usize| {
            candidates
                .iter()
                .filter(|&&c| suspects(c).contains(&m))
                .count()
        };
        // The ranks outside the group that came (`seen`) and that `group` can reach both
        // ways, in order: not dead, suspected by none of it, suspecting none of it.
        let reachable = |seen: &BTreeMap<usize, Proposal>, group: &BTreeSet<usize>| {
            seen.iter()
                .filter(|(r, p)| {
                    !dead_known.contains(r)
                        && !group.iter().any(|&c| suspects(c).contains(r))
                        && !p.evidence.suspected.iter().any(|c| group.contains(c))
                })
                .map(|(&r, _)| r)
                .collect::<Vec<usize>>()
        };
        // A member is lost once a strict majority of the members not certainly dead suspect
        // it: a rank cut off after another died is not waited for until its link heals.
        let outvoted = (self.members.len() - dead.len()) / 2 + 1;
        // The standbys that can reach every candidate; and the members a standby can replace
        // (lost: dead, or suspected by a majority), in order.
        let available = reachable(&self.seen_standbys, &candidates);
        let replaceable: Vec<usize> = self
            .members
            .iter()
            .copied()
            .filter(|m| !candidates.contains(m) && (dead.contains(m) || votes(*m) >= outvoted))
            .take(available.len())
            .collect();
        let accounted = |m: &usize| {
            candidates.contains(m)
                || (!self.everyone && (dead.contains(m) || votes(*m) >= outvoted))
                || replaceable.contains(m)
        };
        let quorum = candidates.union(&dead).count() >= majority;
        if !candidates.contains(&me) {
            // Never decide without this rank's own proposal: it is in the store before any
            // look.
            return wait_or(over, || {
                Error::Store(format!(
                    "this rank's proposal for the survivors of group {} never showed in the store",
                    self.group
                ))
            });
        }
        if !quorum {
            return wait_or(over, || Error::NoMajority {
                group: self.group,
                counted: candidates.union(&dead).count(),
                members: self.members.len(),
            });
        }
        if !over && !self.members.iter().all(accounted) {
            return Verdict::Wait;
        }

        if !over && self.broken_since.is_some_and(|t| now < t + self.settle) {
            return Verdict::Wait;
        }
        let (members, mut cut_off) = connected(&candidates, &suspects);
        // The members that never published, suspected by the others: each with a
        // suspecting member whose link to it broke.
        for &m in &self.members {
            if members.contains(&m) || dead.contains(&m) || cut_off.iter().any(|c| c.0 == m) {
                continue;
            }
            if let Some(&by) = members.iter().find(|&&c| suspects(c).contains(&m)) {
                cut_off.push((m, by));
            }
        }
        cut_off.sort_unstable();
        // Each member that does not go on takes a standby, in order, while standbys last.
        let replaced: Vec<(usize, usize)> = self
            .members
            .iter()
            .copied()
            .filter(|m| !members.contains(m))
            .zip(available.iter().copied())
            .collect();
        // The ranks coming back that reach every member that goes on.
        let returned = reachable(&self.seen_returning, &members);
        let proposal = |m: &usize| self.seen.get(m).map(|p| p.completed);
        let mut joined: Vec<usize> = members
            .iter()
            .copied()
            .filter(|m| proposal(m) == Some(None))
            .chain(replaced.iter().map(|r| r.1))
            .chain(returned.iter().copied())
            .collect();
        joined.sort_unstable();
        let order: Vec<usize> = self
            .members
            .iter()
            .filter_map(|m| {
                if members.contains(m) {
                    Some(*m)
                } else {
                    replaced.iter().find(|r| r.0 == *m).map(|r| r.1)
                }
            })
            .chain(returned.iter().copied())
            .collect();
        Verdict::Decide(Decision {
            completed: members
                .iter()
                .filter_map(proposal)
                .flatten()
                .min()
                .unwrap_or(0),
            joined,
            members: order,
            decided_by: me,
            cut_off,
            replaced,
            returned,
        })
    }

    /// The value the decision key holds after the compare-and-set of [`Ask::Decide`].
    pub fn decided(&mut self, current: &[u8]) {
        if matches!(self.step, Step::Decide(_)) {
            self.adopt(current);
        }
    }

    /// The store failed: the agreement ends with `e`.
    pub fn fail(&mut self, e: Error) {
        self.step = Step::Done;
        self.outcome.get_or_insert(Err(e));
    }

    /// The decision (if this rank is in it), or why not; `None` while it runs.
    pub fn outcome(&self) -> Option<&Result<Decision>> {
        self.outcome.as_ref()
    }

    /// Ends with the decision in `bytes`.
    fn adopt(&mut self, bytes: &[u8]) {
        let r = Decision::decode(bytes, &self.members).and_then(|d| {
            // A new incarnation counted as a survivor (its previous one's proposal) would be
            // taken for one that has the group's state: it is not in the group.
            let fresh_ok = self.completed.is_some() || d.joined.contains(&self.me);
            if d.members.contains(&self.me) && fresh_ok {
                Ok(d)
            } else {
                let me = self.me;
                Err(Error::LeftOut {
                    group: self.group,
                    decided_by: d.decided_by,
                    link_to: d.cut_off.iter().find(|c| c.0 == me).map(|c| c.1),
                })
            }
        });
        self.step = Step::Done;
        self.outcome = Some(r);
    }
}
