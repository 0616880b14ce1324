//! Who issues a group's calls on one rank, and the rule that keeps two threads from mixing
//! them.
//!
//! A group's calls take their places in its order one after another, in the order they are
//! issued on each rank. Calls issued from two threads (or async tasks) of one rank at once
//! take an order that depends on how the threads were scheduled, and the other members may
//! not share it: their calls then meet other calls (a mismatch, or a hang once a member waits
//! in another group), or, when the two calls look alike (two all_reduces of one shape), each
//! thread silently gets the other's data. So a rank's calls on a group come from one issuer
//! at a time: a call whose issuer is not the issuer of the group's previous call must find
//! every earlier call of the group finished on this rank (its issuer waited for its last
//! call before the other went on). A call that does not is refused with
//! [`Error::ConcurrentCalls`], naming both call sites, and the caller aborts the group: the
//! calls in flight were ordered by chance. Streams that must run at once take lanes of the
//! group (each lane a group of the same members with an order of its own).
//!
//! An issuer is a token the caller chooses (a thread, or an async task, which may move from
//! thread to thread between its calls); `0` is never one. A call of the group's last issuer
//! from the site of its last call (a loop's) goes on after two loads and a store; a new site
//! or a new issuer takes the lock. The group's finished calls are one counter, counted up by
//! whoever finishes a call.

use crate::error::Error;
use crate::ids::GroupId;
use crate::sync::{lock, AtomicU64, AtomicUsize, Mutex, Ordering};

/// Where a call was made, and by whom.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CallSite {
    /// The source file, line and column of the call (`std::panic::Location`), or empty when
    /// unknown.
    pub at: String,
    /// The thread or task that made it, in words (`thread 'trainer'`).
    pub by: String,
}

impl std::fmt::Display for CallSite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.at.is_empty() {
            write!(f, "by {}", self.by)
        } else {
            write!(f, "at {} by {}", self.at, self.by)
        }
    }
}

/// The group's last issuer on this rank.
#[derive(Debug, Default)]
struct Last {
    /// Its token (`0`: no call yet).
    issuer: u64,
    /// Where its last call was made.
    at: Option<&'static std::panic::Location<'static>>,
    /// Who it is, in words (taken when it became the issuer).
    by: String,
}

/// One group's issuers on one rank (module doc).
#[derive(Debug, Default)]
pub struct Issuers {
    /// The last issuer's token and the address of its last call's site (compared, never
    /// followed), written under the lock: a call that finds both its own goes on without it.
    current: AtomicU64,
    current_at: AtomicUsize,
    /// The last issuer's last call's sequence number (written by its calls without the lock
    /// too).
    last_seq: AtomicU64,
    last: Mutex<Last>,
    /// The group's calls finished on this rank, on a cache line of its own: whoever
    /// completes a call counts it, often another thread than the caller's.
    finished: crate::progress::CachePadded<AtomicU64>,
}

impl Issuers {
    /// Call `seq` of group `group` (the group's next sequence number, taken by the caller)
    /// is issued by `issuer` from `at`; `who` says who the issuer is, asked only when the
    /// issuer changes. `Err`: another issuer's call is not finished here (module doc).
    pub fn issue(
        &self,
        group: GroupId,
        seq: u64,
        issuer: u64,
        at: Option<&'static std::panic::Location<'static>>,
        who: impl FnOnce() -> String,
    ) -> Result<(), Error> {
        let at_addr = at.map_or(0, |l| std::ptr::from_ref(l) as usize);
        if self.current.load(Ordering::Acquire) == issuer
            && self.current_at.load(Ordering::Relaxed) == at_addr
        {
            self.last_seq.store(seq, Ordering::Relaxed);
            return Ok(());
        }
        let mut last = lock(&self.last);
        if last.issuer == issuer {
            last.at = at;
            self.current_at.store(at_addr, Ordering::Relaxed);
            self.last_seq.store(seq, Ordering::Relaxed);
            return Ok(());
        }
        let by = who();
        let last_seq = self.last_seq.load(Ordering::Relaxed);
        // Calls are counted finished in any order; fewer finished than came before this one
        // (or before the last issuer's, which took its number after this one's but the lock
        // first: both were being issued at once) means one of them is in flight. A call of
        // a third number finished meanwhile may hide one in flight, and so may a call of the
        // last issuer that took its number after this one and went on without the lock while
        // this one held it: the rule may miss a race, never invent one.
        let before = seq.max(last_seq.saturating_add(1));
        if last.issuer != 0 && self.finished.load(Ordering::Acquire) < before {
            let site = |at: Option<&std::panic::Location<'_>>, by: &str| CallSite {
                at: at.map(|l| l.to_string()).unwrap_or_default(),
                by: by.to_owned(),
            };
            return Err(Error::ConcurrentCalls {
                group,
                seq,
                first: site(last.at, &last.by),
                first_seq: last_seq,
                second: site(at, &by),
            });
        }
        *last = Last { issuer, at, by };
        self.current_at.store(at_addr, Ordering::Relaxed);
        self.last_seq.store(seq, Ordering::Relaxed);
        self.current.store(issuer, Ordering::Release);
        Ok(())
    }

    /// One of the group's calls (one sequence number) finished on this rank, with any
    /// result; counted before its caller hears of it.
    pub fn finished(&self) {
        self.finished.fetch_add(1, Ordering::Release);
    }
}

#[cfg(all(test, not(collectix_loom)))]
mod tests {
    use super::*;

    fn here() -> Option<&'static std::panic::Location<'static>> {
        Some(std::panic::Location::caller())
    }

    #[test]
    fn one_issuer_never_waits_for_its_own_calls() {
        let i = Issuers::default();
        for seq in 0..10 {
            assert_eq!(i.issue(GroupId(1), seq, 7, here(), || "a".into()), Ok(()));
        }
    }

    #[test]
    fn a_second_issuer_goes_on_once_the_first_ones_calls_finished() {
        let i = Issuers::default();
        assert_eq!(i.issue(GroupId(1), 0, 1, here(), || "a".into()), Ok(()));
        assert_eq!(i.issue(GroupId(1), 1, 1, here(), || "a".into()), Ok(()));
        i.finished();
        i.finished();
        assert_eq!(i.issue(GroupId(1), 2, 2, here(), || "b".into()), Ok(()));
        i.finished();
        assert_eq!(i.issue(GroupId(1), 3, 1, here(), || "a".into()), Ok(()));
    }

    #[test]
    fn a_second_issuer_while_a_call_is_in_flight_is_refused_naming_both_sites() {
        let i = Issuers::default();
        let first = here();
        assert_eq!(
            i.issue(GroupId(1), 0, 1, first, || "thread 'a'".into()),
            Ok(())
        );
        i.finished();
        assert_eq!(
            i.issue(GroupId(1), 1, 1, first, || "thread 'a'".into()),
            Ok(())
        );
        let second = here();
        let Err(e) = i.issue(GroupId(1), 2, 2, second, || "thread 'b'".into()) else {
            panic!("call 1 is in flight");
        };
        let text = e.to_string();
        assert!(
            matches!(
                &e,
                Error::ConcurrentCalls {
                    seq: 2,
                    first_seq: 1,
                    ..
                }
            ),
            "{e:?}"
        );
        for want in [
            "thread 'a'",
            "thread 'b'",
            &first.map(|l| l.to_string()).unwrap_or_default(),
            &second.map(|l| l.to_string()).unwrap_or_default(),
        ] {
            assert!(text.contains(want), "{want:?} not in {text}");
        }
    }
}
