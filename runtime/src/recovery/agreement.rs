//! The survivors' agreement, as a state machine with no IO: who is alive, and which calls of
//! the failed group completed on every survivor.
//!
//! Every survivor runs one [`Agreement`] against the job's store, a linearizable key-value
//! register (the in-process memory store, or the TCP store's one server):
//!
//! 1. **Publish**: it writes its proposal, the number of the group's calls that completed on
//!    it without a gap (calls `0..completed`), under its own key.
//! 2. **Look**: it reads the decision key and every member's proposal key, again and again,
//!    until a decision exists, or every member has either published or is known lost to it,
//!    or the group's timeout has passed.
//! 3. **Decide**: it proposes a decision from what it saw (members: the ranks that
//!    published, in order; completed: the least of their proposals) with one
//!    compare-and-set of the decision key from empty. The store keeps the first decision
//!    written and hands it back to every later one: there is exactly one decision, whatever
//!    fails when.
//!
//! **Regrow.** Where a launcher restarts what died, the survivors wait for every member
//! ([`Agreement::waiting_for_everyone`]), and a lost member's new incarnation takes part as a
//! [`newcomer`](Agreement::newcomer): it publishes under its rank's key a proposal that
//! brings no state, and the decision names it among the [`joined`](Decision::joined)
//! members, whom the others give the group's state. Whoever has not published by the
//! deadline is left out, as in a shrink.
//!
//! A member this rank knows lost is not counted, even where its proposal is in the store
//! (it published, then died): a group with it would fail at once.
//!
//! A rank adopts the decision it reads: if it is a member, the decision is its new group; if
//! not, it was left out ([`Error::LeftOut`]) and stops. A second failure cannot split the
//! survivors: a rank that dies before publishing is left out by a decider that saw it lost
//! (or waited out the timeout); one that dies after publishing is in the decision, and the
//! new group's first call (or its creation, if the loss is known by then) fails with
//! [`Error::PeerLost`], so the survivors agree again, from the new group. A decider that
//! dies between its look and its compare-and-set leaves the key empty for the next one.

use crate::error::{Error, Result};
use crate::ids::{fnv1a, GroupId};
use crate::time::Time;
use std::collections::{BTreeMap, BTreeSet};

#[cfg(all(test, not(collectix_loom)))]
mod tests;

/// The decision's magic bytes, and the version of its layout.
const DECISION_MAGIC: [u8; 4] = *b"cxs2";
/// Bytes of a decision before its members: magic, decider, completed, member count.
const DECISION_HEAD: usize = 4 + 8 + 8 + 4;
/// Bytes of a proposal: a flag (0: a survivor, 1: a new incarnation, with no state) and the
/// calls completed.
const PROPOSAL_LEN: usize = 9;

/// What the survivors of a group agreed on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// The members of the new group (global ranks, ascending): the new group ranks are
    /// their positions.
    pub members: Vec<usize>,
    /// Calls `0..completed` of the failed group (by sequence number) completed on every
    /// member of the new group; the rest must be made again (torchft's "should commit").
    pub completed: u64,
    /// The rank whose decision this is (global).
    pub decided_by: usize,
    /// The members that are new incarnations of a lost rank (restarted processes), in
    /// order: they have none of the group's state, which the others must give them.
    pub joined: Vec<usize>,
}

impl Decision {
    /// The new group's identity: the same on every member, and never the failed group's.
    pub fn group_id(&self, failed: GroupId) -> GroupId {
        let words = self.members.iter().map(|&m| m as u64);
        GroupId::derive(failed, u64::MAX, &[3, fnv1a(words)])
    }

    /// The decision as the store keeps it.
    pub fn encode(&self) -> Vec<u8> {
        let n = self.members.len() + self.joined.len();
        let mut v = Vec::with_capacity(DECISION_HEAD + 4 + 8 * n);
        v.extend_from_slice(&DECISION_MAGIC);
        v.extend_from_slice(&(self.decided_by as u64).to_le_bytes());
        v.extend_from_slice(&self.completed.to_le_bytes());
        for list in [&self.members, &self.joined] {
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
        // Each list is checked against the failed group's size and the bytes present before
        // anything is allocated.
        let list = |at: usize| -> Option<(Vec<usize>, usize)> {
            let n = count(at)?;
            if n > old.len() || bytes.len() < at + 4 + 8 * n {
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
        let Some((joined, end)) = list(at) else {
            return Err(bad("new incarnations' count and length disagree"));
        };
        if end != bytes.len() || members.is_empty() {
            return Err(bad("member count and length disagree"));
        }
        let ordered = |v: &[usize]| v.windows(2).all(|w| w[0] < w[1]);
        if !ordered(&members) || !members.iter().all(|m| old.contains(m)) {
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
        })
    }
}

/// The store key of the decision on the survivors of `group`.
pub fn decision_key(group: GroupId) -> String {
    format!("collectix/survivors/{group}/decision")
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

/// One rank's part in agreeing on a failed group's survivors: see the module docs.
#[derive(Debug)]
pub struct Agreement {
    group: GroupId,
    me: usize,
    members: Vec<usize>,
    /// Calls of the group completed here; `None` for a new incarnation (no state).
    completed: Option<u64>,
    /// Whether to wait (until the deadline) for every member, the lost ones' new
    /// incarnations included (a regrow), rather than for the members not known lost.
    everyone: bool,
    deadline: Time,
    step: Step,
    /// Proposals seen: rank → calls completed (`None`: a new incarnation).
    seen: BTreeMap<usize, Option<u64>>,
    outcome: Option<Result<Decision>>,
}

impl Agreement {
    /// Global rank `me`'s agreement on the survivors of `group`, whose members are
    /// `members` (global ranks); calls `0..completed` of the group completed here. After
    /// `deadline` it decides without the members it has not heard from; before, it waits
    /// for every member it does not know lost (a shrink).
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
            seen: BTreeMap::new(),
            outcome: None,
        }
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

    /// The store key of the decision.
    pub fn decision_key(&self) -> String {
        decision_key(self.group)
    }

    /// The store key of rank `rank`'s proposal.
    pub fn proposal_key(&self, rank: usize) -> String {
        proposal_key(self.group, rank)
    }

    /// What to do next.
    pub fn poll(&mut self) -> Ask {
        match &self.step {
            Step::Publish => {
                self.step = Step::Look;
                let mut value = Vec::with_capacity(PROPOSAL_LEN);
                value.push(u8::from(self.completed.is_none()));
                value.extend_from_slice(&self.completed.unwrap_or(0).to_le_bytes());
                Ask::Publish {
                    key: self.proposal_key(self.me),
                    value,
                }
            }
            Step::Look => {
                let mut keys = vec![self.decision_key()];
                keys.extend(self.members.iter().map(|&m| self.proposal_key(m)));
                Ask::Look { keys }
            }
            Step::Decide(value) => Ask::Decide {
                key: self.decision_key(),
                value: value.clone(),
            },
            Step::Done => Ask::Done,
        }
    }

    /// The values of the keys of the last [`Ask::Look`], at `now`, with the peers this rank
    /// knows lost (global ranks).
    pub fn looked(&mut self, values: Vec<Option<Vec<u8>>>, now: Time, lost: &BTreeSet<usize>) {
        if self.step != Step::Look {
            return;
        }
        let mut values = values.into_iter();
        if let Some(Some(d)) = values.next() {
            self.adopt(&d);
            return;
        }
        for (&m, v) in self.members.iter().zip(values) {
            // A proposal is a flag and 8 bytes; anything else is not one (and is not counted).
            let Some(v) = v.filter(|v| v.len() == PROPOSAL_LEN) else {
                continue;
            };
            let mut c = [0u8; 8];
            c.copy_from_slice(&v[1..]);
            match v[0] {
                0 => self.seen.insert(m, Some(u64::from_le_bytes(c))),
                1 => self.seen.insert(m, None),
                _ => continue,
            };
        }
        // A member this rank knows lost counts only as a new incarnation, and only in a
        // regrow: the proposal its lost incarnation may have published before it died is
        // not counted (it would make a group that fails at once).
        let me = self.me;
        let everyone = self.everyone;
        let heard: BTreeMap<usize, Option<u64>> = self
            .seen
            .iter()
            .filter(|(&m, c)| m == me || !lost.contains(&m) || (everyone && c.is_none()))
            .map(|(&m, &c)| (m, c))
            .collect();
        let heard_all = self
            .members
            .iter()
            .all(|m| heard.contains_key(m) || (!everyone && lost.contains(m) && *m != me));
        // Never decide without this rank's own proposal: it is in the store before any look.
        if heard.contains_key(&me) && (heard_all || now >= self.deadline) {
            let decision = Decision {
                members: heard.keys().copied().collect(),
                completed: heard.values().flatten().copied().min().unwrap_or(0),
                decided_by: me,
                joined: heard
                    .iter()
                    .filter(|(_, c)| c.is_none())
                    .map(|(&m, _)| m)
                    .collect(),
            };
            self.step = Step::Decide(decision.encode());
        } else if now >= self.deadline {
            self.fail(Error::Store(format!(
                "this rank's proposal for the survivors of group {} never showed in the store",
                self.group
            )));
        }
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
                Err(Error::LeftOut {
                    group: self.group,
                    decided_by: d.decided_by,
                })
            }
        });
        self.step = Step::Done;
        self.outcome = Some(r);
    }
}
