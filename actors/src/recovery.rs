//! Going on after a failure (MPI ULFM's revoke and shrink, NCCL's `ncclCommRevoke` and
//! `ncclCommShrink`, torchft's "should commit"): [`Communicator::revoke`] ends a group for
//! every member, and [`Communicator::shrink`] makes the survivors of a failed group a new,
//! smaller group, after they agree through the job's store on who is alive and on which
//! calls of the old group completed on all of them (see `collectix_runtime::recovery`).
//!
//! ```
//! use collectix_actors::World;
//! use collectix_runtime::{ReduceOp, Tensor};
//!
//! let world = World::local(3).unwrap();
//! let ranks = world.communicators().to_vec();
//! world.kill(2).unwrap(); // rank 2 dies, as a killed process would
//! let survivors: Vec<_> = ranks[..2]
//!     .iter()
//!     .map(|c| c.shrink())
//!     .collect::<Vec<_>>()
//!     .into_iter()
//!     .map(|w| w.wait().unwrap())
//!     .collect();
//! assert_eq!(survivors[0].communicator.size(), 2);
//! assert_eq!(survivors[1].left_out, vec![2]);
//! let sums: Vec<_> = survivors
//!     .iter()
//!     .map(|s| s.communicator.all_reduce(Tensor::from_vec(vec![1.0f32]), ReduceOp::Sum))
//!     .collect::<Vec<_>>()
//!     .into_iter()
//!     .map(|w| w.wait().unwrap().to_vec::<f32>().unwrap())
//!     .collect();
//! assert_eq!(sums, vec![vec![2.0], vec![2.0]]);
//! world.shutdown().unwrap();
//! ```

use crate::comm::Communicator;
use crate::store::Store;
use crate::work::Work;
use collectix_runtime::recovery::{Agreement, Ask, Decision};
use collectix_runtime::{Error, GroupInfo, Result};
use std::sync::Arc;
use std::time::Duration;

/// How long a survivor waits between two looks at the store while the others join the
/// agreement.
const LOOK_EVERY: Duration = Duration::from_millis(2);

/// What [`Communicator::shrink`] gives a survivor.
#[derive(Debug)]
pub struct Shrunk {
    /// This rank's handle on the new group of the survivors (ranks renumbered in the order
    /// of their old ranks).
    pub communicator: Communicator,
    /// Calls `0..completed` of the old group (in the order they were made) completed on
    /// every survivor; calls from `completed` on must be made again on the new group, even
    /// where they returned `Ok` on this rank (torchft's "should commit").
    pub completed: u64,
    /// The old group's members that are not in the new one (world ranks, in order).
    pub left_out: Vec<usize>,
}

impl Communicator {
    /// Revokes the group for every member (MPI ULFM's `MPI_Comm_revoke`): every pending and
    /// later call on it, on every member, fails with [`Error::GroupAborted`] whose cause is
    /// [`Error::Revoked`] naming this rank. The others hear at once (one message each). A
    /// group that already failed stays failed with its first cause; revoking it is `Ok`.
    pub fn revoke(&self) -> Result<()> {
        self.member.rank.driver.revoke(self.member.group.info.id)
    }

    /// The survivors of this group make a new group of themselves (MPI ULFM's
    /// `MPI_Comm_shrink`): collective over the survivors (each calls it, on any handle of
    /// the group), after a failure (a lost peer, a revoke, a timeout) or to end a healthy
    /// group. The group is revoked first, so every member hears.
    ///
    /// The survivors agree through the job's store (the world's memory store in one process,
    /// the rendezvous store of a TCP job) on who is alive — every member that joins the
    /// agreement before each survivor has heard from every member it does not know lost, or
    /// before the group's timeout — and on how many of the group's calls completed on all of
    /// them ([`Shrunk::completed`]). There is one decision whatever fails when; a member
    /// left out of it gets [`Error::LeftOut`]. A survivor that fails during the agreement may
    /// be in the new group: its first call then fails with [`Error::PeerLost`] (or the group
    /// fails at once, if the loss is known by then), and the survivors shrink that group.
    ///
    /// The agreement needs the store: in a TCP job whose store is served by a rank that
    /// died (rank 0 under `init`), it fails with a store error on every survivor, never
    /// with two groups. Run the store apart (`collectix store`, or `collectix launch`) to
    /// survive the loss of any rank.
    pub fn shrink(&self) -> Work<Shrunk> {
        let member = &self.member;
        let info = &member.group.info;
        let driver = &member.rank.driver;
        // Already failed, revoked or destroyed here: what matters is that the others hear.
        let _ = driver.revoke(info.id);
        let (_, completed) = driver.survivors_view(info.id);
        let Some(completed) = completed else {
            return member.ready(Err(Error::invalid(format!(
                "group {} was destroyed on this rank; its survivors can no longer agree with it",
                info.id
            ))));
        };
        let agreement = Agreement::new(
            info.id,
            member.rank.rank,
            info.members.clone(),
            completed,
            driver.now() + info.options.timeout,
        );
        let (c, work) = Work::raw(member.rank.rank_threads.clone());
        let me = self.clone();
        let spawned = std::thread::Builder::new()
            .name("collectix-shrink".into())
            .spawn(move || c.complete(me.agree(agreement)));
        match spawned {
            Ok(_) => work,
            Err(e) => member.ready(Err(Error::Resource(format!(
                "cannot start the survivors' agreement: {e}"
            )))),
        }
    }

    /// Runs this rank's part of the agreement against the store (blocking), then makes the
    /// new group.
    fn agree(&self, mut ag: Agreement) -> Result<Shrunk> {
        let rank = &self.member.rank;
        let store: &Arc<dyn Store> = &rank.store;
        let old = &self.member.group.info;
        loop {
            match ag.poll() {
                Ask::Publish { key, value } => {
                    if let Err(e) = store.set(&key, value) {
                        ag.fail(e);
                    }
                }
                Ask::Look { keys } => match look(store.as_ref(), &keys) {
                    Ok(values) => {
                        let (lost, _) = rank.driver.survivors_view(old.id);
                        ag.looked(values, rank.driver.now(), &lost);
                        if matches!(ag.poll(), Ask::Look { .. }) {
                            std::thread::sleep(LOOK_EVERY);
                        }
                    }
                    Err(e) => ag.fail(e),
                },
                Ask::Decide { key, value } => match store.compare_set(&key, b"", value) {
                    Ok(current) => ag.decided(&current),
                    Err(e) => ag.fail(e),
                },
                Ask::Done => break,
            }
        }
        let decision: Decision = match ag.outcome() {
            Some(Ok(d)) => d.clone(),
            Some(Err(e)) => return Err(e.clone()),
            None => return Err(Error::internal("the survivors' agreement ended undecided")),
        };
        let info = GroupInfo::new(
            decision.group_id(old.id),
            decision.members.clone(),
            rank.rank,
            old.options.clone(),
        )?;
        rank.driver.add_group(info.clone());
        let left_out = old
            .members
            .iter()
            .copied()
            .filter(|m| !decision.members.contains(m))
            .collect();
        tracing::info!(rank = rank.rank, group = %old.id, new_group = %info.id, size = info.size(), completed = decision.completed, "the survivors agreed on a new group");
        Ok(Shrunk {
            communicator: Communicator::new(rank.clone(), info)
                .with_device_backend(self.device_backend),
            completed: decision.completed,
            left_out,
        })
    }
}

/// The values of `keys` in the store (`None` where absent).
fn look(store: &dyn Store, keys: &[String]) -> Result<Vec<Option<Vec<u8>>>> {
    keys.iter()
        .map(|k| {
            if store.check(&[k.as_str()])? {
                store.get(k, Duration::from_secs(1)).map(Some)
            } else {
                Ok(None)
            }
        })
        .collect()
}
