//! What a rank knows of its peers' fate when its group fails, and how the survivors' decision
//! is made from what every member published: who is certainly dead, who is only suspected,
//! and which live members cannot reach each other.
//!
//! A rank keeps apart what it saw itself from what it was told:
//! - **dead**: certain. The kernel closed or reset the peer's connection, or the process is
//!   gone (a rank killed in one process), or the peer left the group in order.
//! - **suspected**: its link to the peer broke or fell silent (a cut link, a partition, a
//!   stopped process). The peer may be alive and reach everyone else.
//! - **reported**: another member said the peer was lost. That is no evidence of its own: it
//!   is not published, and the agreement waits for such a peer as for any other.
//!
//! Every member publishes its evidence with its proposal, and republishes it when it grows.
//! The decision leaves out the certainly dead, and then, of the members that published, as
//! few as it can so that every two members left can reach each other: while a broken link
//! remains between two of them (either end suspects the other), the member with the most
//! broken links goes, the higher rank on a tie. A single cut link therefore costs exactly
//! one of its ends, the higher rank, on whichever rank decides.

use std::collections::{BTreeMap, BTreeSet};

/// One rank's own evidence against its peers (global ranks): see the module docs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Evidence {
    /// Peers certainly dead (or that left the group in order).
    pub dead: BTreeSet<usize>,
    /// Peers whose link to this rank broke or fell silent, not known dead.
    pub suspected: BTreeSet<usize>,
}

impl Evidence {
    /// Whether this rank has any evidence against `peer`.
    pub fn against(&self, peer: usize) -> bool {
        self.dead.contains(&peer) || self.suspected.contains(&peer)
    }

    /// The evidence against `members` only, leaving out `me`: what matters to a group.
    pub fn within(&self, members: &[usize], me: usize) -> Evidence {
        let keep = |s: &BTreeSet<usize>| {
            s.iter()
                .copied()
                .filter(|&r| r != me && members.contains(&r))
                .collect::<BTreeSet<usize>>()
        };
        let dead = keep(&self.dead);
        let suspected = keep(&self.suspected).difference(&dead).copied().collect();
        Evidence { dead, suspected }
    }
}

/// One member's proposal, as the store keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Proposal {
    /// Calls of the group completed there; `None` for a new incarnation (no state).
    pub(crate) completed: Option<u64>,
    /// Its evidence against the other members.
    pub(crate) evidence: Evidence,
}

/// Bytes of a proposal before its evidence: a flag (0: a survivor, 1: a new incarnation,
/// with no state) and the calls completed.
const PROPOSAL_HEAD: usize = 9;

impl Proposal {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let n = self.evidence.dead.len() + self.evidence.suspected.len();
        let mut v = Vec::with_capacity(PROPOSAL_HEAD + 8 + 8 * n);
        v.push(u8::from(self.completed.is_none()));
        v.extend_from_slice(&self.completed.unwrap_or(0).to_le_bytes());
        for set in [&self.evidence.dead, &self.evidence.suspected] {
            v.extend_from_slice(&(set.len() as u32).to_le_bytes());
            for &r in set {
                v.extend_from_slice(&(r as u64).to_le_bytes());
            }
        }
        v
    }

    /// A proposal read from the store for a group of `members`; `None` if it is not one
    /// (it is then not counted). Every count is checked against the group's size and the
    /// bytes present before anything is allocated; ranks outside the group are dropped.
    pub(crate) fn decode(bytes: &[u8], members: &[usize]) -> Option<Proposal> {
        let word = |at: usize| -> Option<u64> {
            Some(u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?))
        };
        let count = |at: usize| -> Option<usize> {
            Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?) as usize)
        };
        let set = |at: usize| -> Option<(BTreeSet<usize>, usize)> {
            let n = count(at)?;
            if n > members.len() || bytes.len() < at + 4 + 8 * n {
                return None;
            }
            let mut s = BTreeSet::new();
            for i in 0..n {
                let r = usize::try_from(word(at + 4 + 8 * i)?).ok()?;
                if members.contains(&r) {
                    s.insert(r);
                }
            }
            Some((s, at + 4 + 8 * n))
        };
        let completed = match bytes.first()? {
            0 => Some(word(1)?),
            1 => None,
            _ => return None,
        };
        let (dead, at) = set(PROPOSAL_HEAD)?;
        let (suspected, end) = set(at)?;
        (end == bytes.len()).then_some(Proposal {
            completed,
            evidence: Evidence { dead, suspected },
        })
    }
}

/// The members that go on, from `candidates` (members that published and are not certainly
/// dead) and each one's suspicions (`suspects`): while a broken link remains between two of
/// them, the one with the most broken links goes, the higher rank on a tie. Also, for each
/// member left out this way, a peer whose link to it broke.
pub(crate) fn connected(
    candidates: &BTreeSet<usize>,
    suspects: &dyn Fn(usize) -> BTreeSet<usize>,
) -> (BTreeSet<usize>, Vec<(usize, usize)>) {
    let mut broken: BTreeMap<usize, BTreeSet<usize>> =
        candidates.iter().map(|&c| (c, BTreeSet::new())).collect();
    for &a in candidates {
        for b in suspects(a) {
            if a != b && candidates.contains(&b) {
                broken.entry(a).or_default().insert(b);
                broken.entry(b).or_default().insert(a);
            }
        }
    }
    let mut cut_off = Vec::new();
    loop {
        // The most broken links, then the highest rank.
        let worst = broken
            .iter()
            .filter(|(_, peers)| !peers.is_empty())
            .max_by_key(|(&r, peers)| (peers.len(), r))
            .map(|(&r, peers)| (r, peers.iter().next().copied()));
        let Some((r, Some(peer))) = worst else {
            break;
        };
        if let Some(peers) = broken.remove(&r) {
            for p in peers {
                if let Some(s) = broken.get_mut(&p) {
                    s.remove(&r);
                }
            }
        }
        cut_off.push((r, peer));
    }
    cut_off.sort_unstable();
    (broken.into_keys().collect(), cut_off)
}

#[cfg(all(test, not(collectix_loom)))]
mod tests {
    use super::*;

    fn set(v: &[usize]) -> BTreeSet<usize> {
        v.iter().copied().collect()
    }

    #[test]
    fn a_proposal_round_trips_and_a_malformed_one_is_none() {
        let members = [0, 1, 2, 3];
        let p = Proposal {
            completed: Some(7),
            evidence: Evidence {
                dead: set(&[3]),
                suspected: set(&[1]),
            },
        };
        let bytes = p.encode();
        assert_eq!(Proposal::decode(&bytes, &members), Some(p.clone()));
        for cut in 0..bytes.len() {
            assert_eq!(Proposal::decode(&bytes[..cut], &members), None, "{cut}");
        }
        let mut long = bytes.clone();
        long.push(0);
        assert_eq!(Proposal::decode(&long, &members), None);
        // A count beyond the group's size is refused before anything is allocated.
        let mut huge = bytes[..PROPOSAL_HEAD].to_vec();
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(Proposal::decode(&huge, &members), None);
        // Ranks outside the group are dropped.
        assert_eq!(
            Proposal::decode(&bytes, &[0, 2]).map(|p| p.evidence),
            Some(Evidence {
                dead: set(&[]),
                suspected: set(&[])
            })
        );
        let fresh = Proposal {
            completed: None,
            evidence: Evidence::default(),
        };
        assert_eq!(Proposal::decode(&fresh.encode(), &members), Some(fresh));
    }

    #[test]
    fn a_cut_link_costs_its_higher_end_and_an_isolated_rank_only_itself() {
        let all = set(&[0, 1, 2, 3, 4]);
        // Link 1–2 cut: seen from one end, or from both.
        for both in [false, true] {
            let (go_on, out) = connected(&all, &|r| match r {
                1 => set(&[2]),
                2 if both => set(&[1]),
                _ => set(&[]),
            });
            assert_eq!(go_on, set(&[0, 1, 3, 4]));
            assert_eq!(out, vec![(2, 1)]);
        }
        // Rank 0 isolated: it goes, whatever its rank.
        let (go_on, out) = connected(&all, &|r| {
            if r == 0 {
                set(&[1, 2, 3, 4])
            } else {
                set(&[0])
            }
        });
        assert_eq!(go_on, set(&[1, 2, 3, 4]));
        assert_eq!(out, vec![(0, 1)]);
        // A partition {0, 1, 2} | {3, 4}: the larger side goes on.
        let side = |r: usize| if r < 3 { set(&[3, 4]) } else { set(&[0, 1, 2]) };
        assert_eq!(connected(&all, &side).0, set(&[0, 1, 2]));
        // Two equal sides: the lower ranks, on every rank.
        let four = set(&[0, 1, 2, 3]);
        let halves = |r: usize| if r < 2 { set(&[2, 3]) } else { set(&[0, 1]) };
        assert_eq!(connected(&four, &halves).0, set(&[0, 1]));
        // Suspicions of ranks that are not candidates do not count.
        assert_eq!(connected(&set(&[0, 1]), &|_| set(&[2, 3])).0, set(&[0, 1]));
    }

    #[test]
    fn evidence_within_a_group_leaves_out_others_and_counts_death_once() {
        let e = Evidence {
            dead: set(&[1, 7]),
            suspected: set(&[1, 2, 0, 9]),
        };
        assert_eq!(
            e.within(&[0, 1, 2, 3], 0),
            Evidence {
                dead: set(&[1]),
                suspected: set(&[2])
            }
        );
        assert!(e.against(2) && !e.against(3));
    }
}
