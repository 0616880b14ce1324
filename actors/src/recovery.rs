//! Going on after a failure (MPI ULFM's revoke and shrink, NCCL's `ncclCommRevoke`,
//! `ncclCommShrink` and growing, torchft's "should commit"): [`Communicator::revoke`] ends a
//! group for every member; [`Communicator::shrink`] makes the survivors of a failed group a
//! new, smaller group, after they agree through the job's store on who is alive and on which
//! calls of the old group completed on all of them (see `collectix_runtime::recovery`);
//! [`Communicator::regrow`] waits for the lost ranks' restarted processes, which join with
//! [`Process::rejoin`](crate::Process::rejoin), and makes the group whole again.
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

use crate::backend::DeviceBackend;
use crate::comm::Communicator;
use crate::member::RankShared;
use crate::store::Store;
use crate::work::Work;
use collectix_runtime::recovery::{decision_key, open_key, Agreement, Ask, Decision};
use collectix_runtime::{Error, GroupId, GroupInfo, GroupOptions, Result};
use std::sync::Arc;
use std::time::Duration;

/// How long a rank waits between two looks at the store while the others join the
/// agreement.
const LOOK_EVERY: Duration = Duration::from_millis(2);

/// What [`Communicator::shrink`], [`Communicator::regrow`] and
/// [`Process::rejoin`](crate::Process::rejoin) give a member of the new group.
#[derive(Debug)]
pub struct Recovered {
    /// This rank's handle on the new group (ranks renumbered in the order of their world
    /// ranks).
    pub communicator: Communicator,
    /// Calls `0..completed` of the failed group (in the order they were made) completed on
    /// every member that was in it; calls from `completed` on must be made again on the new
    /// group, even where they returned `Ok` on this rank (torchft's "should commit").
    pub completed: u64,
    /// The failed group's members that are not in the new one (world ranks, in order).
    pub left_out: Vec<usize>,
    /// The new group's members that are restarted processes (world ranks, in order): they
    /// have none of the group's state, which the others must send them (a broadcast from a
    /// member that is not among them).
    pub joined: Vec<usize>,
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
    /// them ([`Recovered::completed`]). There is one decision whatever fails when; a member
    /// left out of it gets [`Error::LeftOut`]. A survivor that fails during the agreement may
    /// be in the new group: its first call then fails with [`Error::PeerLost`] (or the group
    /// fails at once, if the loss is known by then), and the survivors shrink that group.
    ///
    /// The agreement needs the store: in a TCP job whose store is served by a rank that
    /// died (rank 0 under `init`, torchrun or mpirun), it fails with a store error on every
    /// survivor, never with two groups. `collectix launch` serves the store itself, so the
    /// loss of any rank is survived there.
    pub fn shrink(&self) -> Work<Recovered> {
        let timeout = self.member.group.info.options.timeout;
        self.measure("shrink", 0, || self.recover(timeout, false))
    }

    /// Like [`shrink`](Self::shrink), but the survivors wait up to `wait` for every lost
    /// member's restarted process (`collectix launch --max-restarts`), which joins with
    /// [`Process::rejoin`](crate::Process::rejoin): the new group then has every member
    /// again, the restarted ones named in [`Recovered::joined`] (send them the state). A
    /// member that has not come within `wait` is left out, as in a shrink.
    pub fn regrow(&self, wait: Duration) -> Work<Recovered> {
        self.measure("regrow", 0, || self.recover(wait, true))
    }

    fn recover(&self, wait: Duration, everyone: bool) -> Work<Recovered> {
        let member = &self.member;
        let info = &member.group.info;
        let driver = &member.rank.driver;
        // Already failed, revoked or destroyed here: what matters is that the others hear. A
        // rank that was stopped (killed, or its world shut down) is no survivor.
        if let Err(Error::Shutdown) = driver.revoke(info.id) {
            return member.ready(Err(Error::Shutdown));
        }
        let (evidence, completed) = driver.survivors_view(info.id);
        let Some(completed) = completed else {
            return member.ready(Err(Error::invalid(format!(
                "group {} was destroyed on this rank; its survivors can no longer agree with it",
                info.id
            ))));
        };
        let agreement = Agreement::new(
            info.id,
            member.rank.rank,
            info.members.to_vec(),
            completed,
            driver.now() + wait,
        )
        .with_evidence(&evidence)
        .settling_for(member.rank.settle);
        // A regrow takes the job's hot standbys: each lost member is replaced in this very
        // agreement. The standbys join it when they see it open.
        let rank = &member.rank;
        let standbys: Vec<usize> = (rank.world - rank.standbys..rank.world).collect();
        let agreement = if everyone {
            // The world's ranks outside the group may come back (left out before).
            let returning: Vec<usize> = (0..rank.world - rank.standbys)
                .filter(|r| !info.members.contains(r))
                .collect();
            agreement
                .waiting_for_everyone()
                .with_standbys(&standbys)
                .with_returning(&returning)
                .with_evidence(&evidence)
        } else {
            agreement
        };
        let old = Old {
            id: info.id,
            members: info.members.to_vec(),
            options: info.options.clone(),
        };
        let open = everyone && !standbys.is_empty();
        run_agreement(member.rank.clone(), self.device_backend, move |rank| {
            if open {
                rank.store.set(&open_key(old.id), Vec::new())?;
            }
            Ok((old, agreement))
        })
    }
}

impl crate::Process {
    /// Which process of its rank this is: 0 for the first, one more for each restart
    /// (`COLLECTIX_INCARNATION`, which `collectix launch --max-restarts` sets).
    pub fn incarnation(&self) -> u32 {
        self.config().incarnation
    }

    /// A restarted process joins the running job: [`Communicator::rejoin`] on its world
    /// communicator.
    pub fn rejoin(&self, wait: Duration) -> Work<Recovered> {
        self.communicator().rejoin(wait)
    }

    /// Whether this process is one of the job's hot standbys (`collectix launch --standby
    /// N`; [`JobConfig::standbys`](crate::JobConfig::standbys)).
    pub fn is_standby(&self) -> bool {
        let c = self.config();
        c.rank >= c.world_size - c.standbys
    }

    /// A hot standby waits to replace a lost rank: [`Communicator::stand_by`] on its
    /// communicator. It ends with [`Error::Shutdown`] once every member of the job's
    /// current group has left (the job is over without needing it).
    pub fn stand_by(&self, wait: Duration) -> Work<Recovered> {
        self.communicator().stand_by(wait)
    }
}

impl Communicator {
    /// A restarted rank (a new [`incarnation`](Self::incarnation) of a lost rank: a process
    /// that `collectix launch --max-restarts` started again, or a rank that [`World::run`]
    /// restarted) joins the running job: it finds in the store the group the job's world
    /// became, and takes part in its survivors' agreement (they call
    /// [`regrow`](Self::regrow)) as a member that brings no state; it waits at most `wait`.
    /// The new group's members that are restarted ranks are in [`Recovered::joined`]: the
    /// others send them the state. [`Error::LeftOut`] if the survivors decided without this
    /// rank (they shrank, or it came too late). A restarted rank's own world communicator
    /// (this one) belongs to the job's first world group, which the others have left: use
    /// the returned one.
    ///
    /// A rank (or a restarted one) that is not a member of the group the job's world became
    /// (a shrink left it out, for a cut link since healed, say) comes back the same way: it
    /// joins the next regrow of that group, which takes it after the members that go on,
    /// among the joined; a shrink does not take it, and it waits for the next group's
    /// regrow, at most `wait`.
    ///
    /// [`World::run`]: crate::World::run
    pub fn rejoin(&self, wait: Duration) -> Work<Recovered> {
        self.measure("rejoin", 0, || self.rejoin_unmeasured(wait))
    }

    fn rejoin_unmeasured(&self, wait: Duration) -> Work<Recovered> {
        let rank = self.member.rank.clone();
        let options = self.member.group.info.options.clone();
        let world = self.world_size();
        let backend = self.device_backend;
        let (id, members) = match current_group(rank.store.as_ref(), world) {
            Ok(g) => g,
            Err(e) => return self.member.ready(Err(e)),
        };
        if !members.contains(&rank.rank) {
            // Left out of the group the job's world became (a shrink went on without it, its
            // link since healed): it comes back when the others regrow.
            return on_a_thread(rank, backend, "collectix-return", move |rank| {
                outside(rank, options, wait, Outside::Returning)
            });
        }
        run_agreement(rank, backend, move |rank| {
            let deadline = rank.driver.now() + wait;
            let ag = Agreement::newcomer(id, rank.rank, members.clone(), deadline)
                .settling_for(rank.settle);
            let old = Old {
                id,
                members,
                options,
            };
            Ok((old, ag))
        })
    }
}

impl Communicator {
    /// A hot standby (a rank of [`World::standbys`](crate::World::standbys)) waits, at most
    /// `wait`, to replace a lost rank: it follows the groups the job's world becomes, and
    /// when the survivors of one [`regrow`](Self::regrow), it joins their agreement; the
    /// first decision that gives it a lost rank's place ends the wait, with a handle on the
    /// new group, in which it has that rank's group rank and none of the state (it is in
    /// [`Recovered::joined`]: the others send it the state). A regrow that needs no standby,
    /// or takes another, leaves it waiting. [`Error::Shutdown`] if its world stops first; a
    /// store error if `wait` runs out. On a rank that is not a standby, an error.
    pub fn stand_by(&self, wait: Duration) -> Work<Recovered> {
        let rank = &self.member.rank;
        if rank.rank < rank.world - rank.standbys {
            return self.member.ready(Err(Error::invalid(format!(
                "rank {} is no standby (the world's standbys are ranks {} to {})",
                rank.rank,
                rank.world - rank.standbys,
                rank.world.saturating_sub(1)
            ))));
        }
        let options = self.member.group.info.options.clone();
        on_a_thread(
            rank.clone(),
            self.device_backend,
            "collectix-standby",
            move |rank| outside(rank, options, wait, Outside::Standby),
        )
    }
}

/// What a rank outside the job's current group waits for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Outside {
    /// A hot standby: a regrow that needs it to replace a lost rank.
    Standby,
    /// A rank left out earlier: any regrow, which takes it back.
    Returning,
}

/// A rank outside the job's current group waits (blocking): it follows the job's chain of
/// groups and joins each regrow's agreement (a standby when one opens; a returning rank at
/// once), until one takes it.
fn outside(
    rank: &Arc<RankShared>,
    options: GroupOptions,
    wait: Duration,
    who: Outside,
) -> Result<Recovered> {
    let store = rank.store.as_ref();
    let active = rank.world - rank.standbys;
    let deadline = rank.driver.now() + wait;
    loop {
        if rank.driver.is_closed() {
            return Err(Error::Shutdown);
        }
        if rank.driver.now() >= deadline {
            return Err(Error::Store(format!(
                "rank {} waited {wait:?} outside the job's group, and no regrow took it",
                rank.rank
            )));
        }
        let (id, members) = current_group(store, active)?;
        // The job is over: every member of its current group left (processes say so in the
        // store as they leave).
        let left: Vec<String> = members.iter().map(|m| format!("left/{m}")).collect();
        let left: Vec<&str> = left.iter().map(String::as_str).collect();
        if store.check(&left)? {
            return Err(Error::Shutdown);
        }
        if who == Outside::Standby && !store.check(&[open_key(id).as_str()])? {
            std::thread::sleep(LOOK_EVERY);
            continue;
        }
        let (evidence, _) = rank.driver.survivors_view(id);
        let ag = Agreement::standby(id, rank.rank, members.clone(), deadline)
            .with_evidence(&evidence)
            .settling_for(rank.settle);
        let old = Old {
            id,
            members,
            options: options.clone(),
        };
        match agree(rank, &old, ag) {
            // Not taken this time: wait for the group this one became.
            Err(Error::LeftOut { .. }) => continue,
            other => return other,
        }
    }
}

/// The failed group, as the new one is made from it.
struct Old {
    id: GroupId,
    members: Vec<usize>,
    options: GroupOptions,
}

/// Runs this rank's part of an agreement on a thread of its own (the store's calls block):
/// `setup` gives the failed group and the agreement (it may read the store), then the new
/// group is made on `rank`, its handle taking calls on device tensors through `backend`.
fn run_agreement(
    rank: Arc<RankShared>,
    backend: DeviceBackend,
    setup: impl FnOnce(&RankShared) -> Result<(Old, Agreement)> + Send + 'static,
) -> Work<Recovered> {
    on_a_thread(rank, backend, "collectix-agree", move |rank| {
        setup(rank).and_then(|(old, ag)| agree(rank, &old, ag))
    })
}

/// Runs `body` (blocking: the store's calls block) on a thread of its own named `name`; its
/// new group's handle takes calls on device tensors through `backend`.
fn on_a_thread(
    rank: Arc<RankShared>,
    backend: DeviceBackend,
    name: &str,
    body: impl FnOnce(&Arc<RankShared>) -> Result<Recovered> + Send + 'static,
) -> Work<Recovered> {
    let (c, work) = Work::raw(rank.rank_threads.clone());
    let spawned = std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            c.complete(body(&rank).map(|r| Recovered {
                communicator: r.communicator.with_device_backend(backend),
                ..r
            }))
        });
    match spawned {
        Ok(_) => work,
        Err(e) => Work::ready(Err(Error::Resource(format!(
            "cannot start a thread for the survivors' agreement: {e}"
        )))),
    }
}

/// Runs this rank's part of the agreement against the store (blocking), then makes the new
/// group.
fn agree(rank: &Arc<RankShared>, old: &Old, mut ag: Agreement) -> Result<Recovered> {
    let store: &Arc<dyn Store> = &rank.store;
    loop {
        match ag.poll() {
            Ask::Publish { key, value } => {
                tracing::debug!(rank = rank.rank, group = %old.id, evidence = ?rank.driver.survivors_view(old.id).0, "publishing a proposal");
                if let Err(e) = store.set(&key, value) {
                    ag.fail(e);
                }
            }
            // A rank stopped while it agrees (killed, its world shut down) is no survivor:
            // it hears no more losses, and would wait out the deadline.
            Ask::Look { .. } if rank.driver.is_closed() => ag.fail(Error::Shutdown),
            Ask::Look { keys } => match look(store.as_ref(), &keys) {
                Ok(values) => {
                    let (evidence, _) = rank.driver.survivors_view(old.id);
                    ag.looked(values, rank.driver.now(), &evidence);
                    if ag.is_looking() {
                        std::thread::sleep(LOOK_EVERY);
                    }
                }
                Err(e) => ag.fail(e),
            },
            Ask::Probe { peers, within } => {
                tracing::debug!(rank = rank.rank, group = %old.id, ?peers, "probing members another suspects");
                rank.driver.probe(&peers, within);
            }
            Ask::Decide { key, value } => {
                tracing::debug!(rank = rank.rank, group = %old.id, "proposing a decision");
                match store.compare_set(&key, b"", value) {
                    Ok(current) => ag.decided(&current),
                    Err(e) => ag.fail(e),
                }
            }
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
    tracing::info!(rank = rank.rank, group = %old.id, new_group = %info.id, size = info.size(), completed = decision.completed, joined = ?decision.joined, "the survivors agreed on a new group");
    Ok(Recovered {
        communicator: Communicator::new(rank.clone(), info),
        completed: decision.completed,
        left_out,
        joined: decision.joined,
    })
}

/// The group a job's world became through the agreements recorded in `store`: from the
/// world group of `world` ranks, each decision's new group in turn. Its identity and
/// members.
pub(crate) fn current_group(store: &dyn Store, world: usize) -> Result<(GroupId, Vec<usize>)> {
    let (mut id, mut members) = (GroupId::WORLD, (0..world).collect::<Vec<usize>>());
    // Each step is a decision in the store; a chain longer than this is not one a job made.
    for _ in 0..1_000_000 {
        let key = decision_key(id);
        if !store.check(&[key.as_str()])? {
            return Ok((id, members));
        }
        let d = Decision::decode(&store.get(&key, Duration::from_secs(1))?, &members)?;
        id = d.group_id(id);
        members = d.members;
    }
    Err(Error::Store(
        "the job's chain of survivors' decisions does not end".into(),
    ))
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
