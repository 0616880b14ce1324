//! [`Member`]: one rank as a member of one group, and how its calls are issued.
//!
//! Every path a call takes ends here: the torch-style [`Communicator`](crate::Communicator)
//! plans host calls and issues them through its member; the device backends
//! (`backend/`) take a member, never a communicator, and issue the engine steps of their
//! protocols through it. A member holds what the rank shares across its groups
//! ([`RankShared`]) and what it holds of this group ([`GroupShared`]: the order of its calls,
//! its schedule cache, and the device resources the group owns on this rank).

use crate::device::lanes::Lanes;
use crate::metrics::Probe;
use crate::rank::actor::RankActor;
use crate::rank::driver::{BoardSubmit, Done, Driver, GroupBoard, Quick};
use crate::work::{guarded, RankThreads, Work};
use actix::{Addr, ArbiterHandle};
use collectix_runtime::board::mail::MAIL_MAX;
use collectix_runtime::board::BoardCall;
use collectix_runtime::issuers::Issuers;
use collectix_runtime::schedule::ScheduleCache;
use collectix_runtime::tensor::arena::Arena;
use collectix_runtime::{CallOptions, GroupInfo, Output, Plan, Request, Result};
use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The most bytes of in-place inputs (`Communicator::buffers()`) a member keeps free for
/// reuse in its staging pool.
pub(crate) const STAGING_BYTES: usize = 128 << 20;

/// Where a rank's tasks run: its arbiter, or the scheduler of a seeded run.
#[derive(Clone)]
pub(crate) enum Spawner {
    Arbiter(ArbiterHandle),
    Seeded(crate::seeded::Tasks),
}

impl Spawner {
    /// Runs `task` there; `false` if it cannot (the arbiter stopped).
    pub(crate) fn spawn(
        &self,
        task: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> bool {
        match self {
            Spawner::Arbiter(a) => a.spawn(task),
            Spawner::Seeded(t) => t.spawn(task),
        }
    }
}

/// What a rank handle shares across its groups.
pub(crate) struct RankShared {
    pub(crate) rank: usize,
    /// The world's size, its hot standbys included (the last `standbys` ranks).
    pub(crate) world: usize,
    pub(crate) standbys: usize,
    /// The rank's actor (`None` for a rank of a seeded run, which its scheduler drives).
    pub(crate) addr: Option<Addr<RankActor>>,
    /// The rank's engine and inbox: calls are issued on it directly (see `rank::driver`).
    pub(crate) driver: Arc<Driver>,
    /// Where the rank's own tasks run (a call made of calls: `split`, a mapped result).
    pub(crate) spawner: Spawner,
    /// The thread they run on (other ranks' may share it).
    pub(crate) thread: std::thread::ThreadId,
    pub(crate) rank_threads: Arc<RankThreads>,
    /// The job's store, where the survivors of a failed group agree (`recovery.rs`).
    pub(crate) store: Arc<dyn crate::store::Store>,
    /// What the ranks of this process share for device calls that stay on one GPU (the
    /// device-local path): `Some` for the ranks of a [`World`](crate::World), `None` for a
    /// process's one rank of a job.
    pub(crate) hub: Option<Arc<crate::device::cuda::LocalHub>>,
    /// Which incarnation of its rank this is: 0 for the first, one more for each restart
    /// (of its process, or of the rank in a `World`).
    pub(crate) incarnation: u32,
    /// Where the rank's groups get their boards, the shared memory their small calls run
    /// in (`None`: every call goes through the engine).
    pub(crate) boards: Option<Arc<dyn crate::board::BoardSource>>,
    /// How long the survivors' agreement waits, once it sees a link broken, for the rest of
    /// the evidence (`Agreement::settling_for`).
    pub(crate) settle: std::time::Duration,
}

/// One group as one rank holds it: its info and the counters that order its calls. On cache
/// lines of its own: each call of the rank writes its sequence counter and its schedule
/// cache's lock, and the members' copies are allocated one after another.
#[repr(align(128))]
pub(crate) struct GroupShared {
    pub(crate) info: GroupInfo,
    /// The next call's sequence number.
    next_seq: AtomicU64,
    /// Groups created from this one so far (part of their identity).
    pub(crate) children: AtomicU64,
    /// Calls on the NCCL path so far; taken together with the sequence number, under this
    /// lock, so that both orders agree.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) nccl_calls: Mutex<u64>,
    /// The schedules of this member's recent calls, reused by later calls of the same shape.
    schedules: ScheduleCache,
    /// Point-to-point lanes of device tensors on the NCCL backend (`backend/p2p.rs`).
    pub(crate) p2p: Lanes,
    /// The group's NCCL worker thread on this rank, started on its first NCCL call: one per
    /// group, so that a communicator still being created (waiting for the other members)
    /// never holds up another group's calls.
    pub(crate) nccl_worker: Mutex<Option<crate::device::cuda::worker::WorkerHandle>>,
    /// Recycled memory for the inputs of in-place calls on caller buffers (`buffers.rs`).
    pub(crate) staging: collectix_runtime::tensor::pool::Pool,
    /// The group's board on this rank, where its small calls run (`None`: the engine runs
    /// them all).
    board: Option<Arc<GroupBoard>>,
    /// Who issues the group's calls on this rank: one thread or task at a time
    /// (`collectix_runtime::issuers`).
    issuers: Issuers,
    /// The group's lanes on this rank, by name (`Communicator::lane`).
    pub(crate) lanes: Mutex<std::collections::HashMap<String, Member>>,
}

impl GroupShared {
    fn new(info: GroupInfo, board: Option<Arc<GroupBoard>>) -> Arc<Self> {
        Arc::new(GroupShared {
            board,
            info,
            next_seq: AtomicU64::new(0),
            children: AtomicU64::new(0),
            nccl_calls: Mutex::new(0),
            schedules: ScheduleCache::default(),
            p2p: Lanes::default(),
            nccl_worker: Mutex::new(None),
            staging: collectix_runtime::tensor::pool::Pool::new(STAGING_BYTES),
            issuers: Issuers::default(),
            lanes: Mutex::new(std::collections::HashMap::new()),
        })
    }
}

/// A call's place in its group's count of finished calls (`Issuers::finished`): counted
/// when dropped, which the call's completion does before its caller hears. A point-to-point
/// call, outside the group's order, has none.
pub(crate) struct Open(Option<Arc<GroupShared>>);

impl Open {
    /// No place (a point-to-point call; the second half of a call whose first half holds it).
    pub(crate) fn none() -> Open {
        Open(None)
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        if let Some(g) = self.0.take() {
            g.issuers.finished();
        }
    }
}

/// One rank in one group: where calls are planned against the group and issued on the
/// rank's engine. Cheap to clone (two `Arc`s).
#[derive(Clone)]
pub(crate) struct Member {
    pub(crate) rank: Arc<RankShared>,
    pub(crate) group: Arc<GroupShared>,
}

impl Member {
    /// The member of a new group `info` (this rank's view of it).
    pub(crate) fn new(rank: Arc<RankShared>, info: GroupInfo) -> Member {
        let board = rank.boards.as_ref().and_then(|b| b.board(&info));
        if let Some(gb) = &board {
            rank.driver.add_mail(gb);
        }
        Member {
            rank,
            group: GroupShared::new(info, board),
        }
    }

    /// This rank in the group.
    pub(crate) fn group_rank(&self) -> usize {
        self.group.info.rank
    }

    /// This rank in the world.
    pub(crate) fn global_rank(&self) -> usize {
        self.rank.rank
    }

    /// A handle that is complete already, with `v`.
    pub(crate) fn ready<T: Send + 'static>(&self, v: Result<T>) -> Work<T> {
        Work::ready(v)
    }

    /// A call that failed before it started, with `e`, on this rank: a collective (not
    /// `p2p`) still takes its sequence number, and the group's other members are told, so
    /// that their parts of it fail at once (`Error::CallFailed`) rather than at their
    /// timeout, and the group's next call is the next everywhere.
    pub(crate) fn refuse<T: Send + 'static>(
        &self,
        p2p: bool,
        e: collectix_runtime::Error,
    ) -> Work<T> {
        if !p2p {
            match self.reserve() {
                Ok(seq) => {
                    self.rank.driver.fail_call(self.group.info.id, seq, &e);
                    self.finished_now();
                }
                Err(e) => return self.ready(Err(e)),
            }
        }
        self.ready(Err(e))
    }

    /// Takes the group's next sequence number, now, for a call of the current thread or task
    /// (`crate::site`). The call is then counted finished once, by
    /// [`finished_now`](Self::finished_now) or by dropping its [`open`](Self::open) place.
    /// Refused when another thread's or task's call on the group is still in flight here
    /// (`collectix_runtime::issuers`): the number is taken (and counted finished) and the
    /// group aborted, its members told, and the caller gets
    /// [`Error::ConcurrentCalls`](collectix_runtime::Error).
    pub(crate) fn reserve(&self) -> Result<u64> {
        let seq = self.group.next_seq.fetch_add(1, Ordering::Relaxed);
        let gid = self.group.info.id;
        match self.group.issuers.issue(
            gid,
            seq,
            crate::site::issuer(),
            crate::site::here(),
            crate::site::who,
        ) {
            Ok(()) => Ok(seq),
            Err(e) => {
                self.finished_now();
                self.rank.driver.abort_disordered(gid, &e);
                Err(e)
            }
        }
    }

    /// A reserved call's place in the count of finished calls, counted when dropped.
    pub(crate) fn open(&self) -> Open {
        Open(Some(self.group.clone()))
    }

    /// A reserved call finished already (refused, or done on its caller's quick path).
    pub(crate) fn finished_now(&self) {
        self.group.issuers.finished();
    }

    /// Plans `req`, a request on host memory, and issues it on the group's board or its
    /// engine, mapping its output with `map`. Argument errors come back at once; a
    /// collective's still takes its sequence number and tells the other members
    /// ([`refuse`](Self::refuse)). Not measured: `Communicator::call` measures a
    /// communicator's call, and a call that is a part of another counts as that one
    /// (`Communicator::part`).
    pub(crate) fn call_host<T: Send + 'static>(
        &self,
        req: Request,
        opts: &CallOptions,
        map: impl FnOnce(Output) -> Result<T> + Send + 'static,
    ) -> Work<T> {
        self.call_host_landing(req, opts, None, map)
    }

    /// [`call_host`](Self::call_host), the received chunks landing in `into` where the
    /// engine can land them (`Plan::landing_in`; a call on the board ignores it).
    pub(crate) fn call_host_landing<T: Send + 'static>(
        &self,
        req: Request,
        opts: &CallOptions,
        into: Option<Arc<Arena>>,
        map: impl FnOnce(Output) -> Result<T> + Send + 'static,
    ) -> Work<T> {
        if let Some(gb) = &self.group.board {
            // A barrier's call on the board is always the same: made once per board.
            if let (Request::Barrier, None) = (&req, opts.algorithm) {
                return self.issue_board(gb, Cow::Borrowed(gb.barrier()), opts, map);
            }
            match BoardCall::of(&req, &self.group.info, opts) {
                Some(Ok(call)) => return self.issue_board(gb, Cow::Owned(call), opts, map),
                Some(Err(e)) => return self.refuse(false, e),
                None => {}
            }
            if let Some(out) = self.mail(gb, &req) {
                return self.ready(out.and_then(map));
            }
        }
        let p2p = req.is_p2p();
        let plan = match Plan::new_cached(req, &self.group.info, opts, &self.group.schedules) {
            Ok(p) => match into {
                Some(a) => p.landing_in(a),
                None => p,
            },
            Err(e) => return self.refuse(p2p, e),
        };
        let (seq, open) = if plan.is_p2p() {
            (0, Open::none())
        } else {
            match self.reserve() {
                Ok(seq) => (seq, self.open()),
                Err(e) => return self.ready(Err(e)),
            }
        };
        if let Some(e) = self.clash(&plan, seq) {
            drop(open);
            return self.ready(Err(e));
        }
        self.issue(seq, open, plan, map)
    }

    /// A small send or receive (from a named source) through the group's mailboxes
    /// (`rank::driver::mail`): its output, or `None` when it goes through the engine (too
    /// large, on a device, an argument the engine refuses, no room, or no message within
    /// the receive's short spin).
    fn mail(&self, gb: &GroupBoard, req: &Request) -> Option<Result<Output>> {
        let info = &self.group.info;
        let small = |bytes: usize| bytes <= MAIL_MAX && bytes as u64 <= info.options.max_call_bytes;
        let peer = |r: usize| r < info.size() && r != info.rank;
        match req {
            Request::Send { tensor, dst, tag }
                if tensor.device().is_host()
                    && tensor.device_storage().is_none()
                    && small(tensor.nbytes())
                    && peer(*dst) =>
            {
                self.rank
                    .driver
                    .mail_send(gb, *dst, *tag, tensor.dtype(), tensor.bytes())
                    .then_some(Ok(Output::None))
            }
            Request::Recv {
                spec,
                src: Some(src),
                tag,
            } if spec.device.is_host()
                && peer(*src)
                && spec
                    .numel()
                    .ok()
                    .and_then(|n| n.checked_mul(spec.dtype.size()))
                    .is_some_and(small) =>
            {
                self.rank.driver.mail_recv(gb, *src, *tag, spec)
            }
            _ => None,
        }
    }

    /// A collective call on the engine at `seq` of a group with a board, where another
    /// member is in a call on the board at `seq`: the mismatch, once the group is aborted
    /// (the member on the board would otherwise hear of it only at its timeout).
    fn clash(&self, plan: &Plan, seq: u64) -> Option<collectix_runtime::Error> {
        let gb = self.group.board.as_ref().filter(|_| !plan.is_p2p())?;
        let e = gb.clash(seq, plan.fingerprint())?;
        self.rank.driver.board_clash(self.group.info.id, seq, &e);
        Some(e)
    }

    /// [`call_host`](Self::call_host) for a call that writes its result into the caller's
    /// buffers in `dest` (checked against the call first: a mismatch is refused like any
    /// argument error).
    pub(crate) fn call_host_into<T: Send + 'static>(
        &self,
        req: Request,
        opts: &CallOptions,
        dest: &collectix_runtime::Destination,
        map: impl FnOnce(Output) -> Result<T> + Send + 'static,
    ) -> Work<T> {
        match Probe::start_on(&req, self.group.info.id, &self.rank.driver) {
            None => self.call_host_into_unmeasured(req, opts, dest, map),
            probe => self
                .call_host_into_unmeasured(req, opts, dest, map)
                .measured(probe),
        }
    }

    /// [`call_host_into`](Self::call_host_into), without the metrics.
    fn call_host_into_unmeasured<T: Send + 'static>(
        &self,
        req: Request,
        opts: &CallOptions,
        dest: &collectix_runtime::Destination,
        map: impl FnOnce(Output) -> Result<T> + Send + 'static,
    ) -> Work<T> {
        if let Some(gb) = &self.group.board {
            match BoardCall::of(&req, &self.group.info, opts) {
                Some(Ok(call)) => {
                    let fp = call.fingerprint();
                    let want: Vec<usize> = fp
                        .count
                        .map(|c| usize::try_from(c).unwrap_or(usize::MAX))
                        .into_iter()
                        .collect();
                    let runs = match dest.check_outputs(&want, fp.dtype) {
                        Ok(r) => r,
                        Err(e) => return self.refuse(false, e),
                    };
                    let dest = dest.clone();
                    return self.issue_board(gb, Cow::Owned(call), opts, move |o| match o {
                        Output::Tensor(t) => map(dest.write_one(&runs, &t)?),
                        // A barrier writes nothing: its (no) buffers come back.
                        _ => map(Output::Buffers(dest.take().unwrap_or_default())),
                    });
                }
                Some(Err(e)) => return self.refuse(false, e),
                None => {}
            }
        }
        let p2p = req.is_p2p();
        let plan = Plan::new_cached(req, &self.group.info, opts, &self.group.schedules)
            .and_then(|p| p.writing_into(dest));
        match plan {
            Ok(plan) => {
                let seq = match self.reserve() {
                    Ok(seq) => seq,
                    Err(e) => return self.ready(Err(e)),
                };
                if let Some(e) = self.clash(&plan, seq) {
                    self.finished_now();
                    return self.ready(Err(e));
                }
                self.issue(seq, self.open(), plan, map)
            }
            Err(e) => self.refuse(p2p, e),
        }
    }

    /// Issues `call` on the group's board `gb`, taking the group's next sequence number.
    fn issue_board<T: Send + 'static>(
        &self,
        gb: &Arc<GroupBoard>,
        call: Cow<'_, BoardCall>,
        opts: &CallOptions,
        map: impl FnOnce(Output) -> Result<T> + Send + 'static,
    ) -> Work<T> {
        let timeout = opts.timeout.unwrap_or(self.group.info.options.timeout);
        let (submitted, after, work) = {
            // The sequence number and the queue's place together (see `GroupBoard::issue`);
            // no user code runs under this lock.
            let mut issue = crate::sync::lock(&gb.issue);
            let seq = match self.reserve() {
                Ok(seq) => seq,
                Err(e) => {
                    drop(issue);
                    return self.ready(Err(e));
                }
            };
            let span = gb.span(seq, &call.fingerprint());
            let quick = self.rank.driver.board_quick(gb, &mut issue, seq, &call);
            let published = match quick {
                Quick::Done(out) => {
                    drop(issue);
                    self.finished_now();
                    let out = Ok(out);
                    span.finished(&out);
                    return self.ready(out.and_then(|o| guarded(|| map(o))));
                }
                Quick::NotTaken => false,
                Quick::Published => true,
            };
            let (done, work) = Work::pair_open(self.rank.rank_threads.clone(), self.open(), map);
            let (submitted, after) = self.rank.driver.submit_board(
                gb,
                &mut issue,
                BoardSubmit {
                    seq,
                    call: call.into_owned(),
                    timeout,
                    published,
                    span,
                },
                done,
            );
            (submitted, after, work)
        };
        self.rank.driver.hand_over(after);
        match submitted {
            Ok(deadline) => self.rank.driver.submitted_board(deadline),
            Err((done, e)) => done(Err(e)),
        }
        work.driven_by(self.rank.driver.clone())
    }

    /// Issues `plan` at `seq` (its place `open` counted when it finishes) and hands back its
    /// [`Work`], driven by its caller while it waits.
    pub(crate) fn issue<T: Send + 'static>(
        &self,
        seq: u64,
        open: Open,
        plan: Plan,
        map: impl FnOnce(Output) -> Result<T> + Send + 'static,
    ) -> Work<T> {
        let (done, work) = Work::pair_open(self.rank.rank_threads.clone(), open, map);
        self.issue_raw(seq, plan, done);
        work.driven_by(self.rank.driver.clone())
    }

    /// Issues `plan` at `seq`, now, on the caller's thread; `done` is called with its
    /// output by whoever drives the rank when it completes.
    pub(crate) fn issue_raw(&self, seq: u64, plan: Plan, done: Done<Output>) {
        self.rank.driver.submit(self.group.info.id, seq, plan, done);
    }

    /// Plans `req` and issues it with a sequence number reserved earlier.
    pub(crate) fn issue_at<T: Send + 'static>(
        &self,
        seq: u64,
        req: Request,
        map: fn(Output) -> Result<T>,
    ) -> Result<Work<T>> {
        let plan = Plan::new(req, &self.group.info, &CallOptions::default())?;
        Ok(self.issue(seq, Open::none(), plan, map))
    }

    /// Issues a call whose second half depends on the first's result: both take their
    /// sequence numbers now, so the group's order is the order of the calls. `then` plans the
    /// second half; `finish` turns its result into the caller's. When the second half is not
    /// issued here (the first failed, or `then` did), the other members are told, as for a
    /// call that fails its checks ([`refuse`](Self::refuse)): a member whose first half
    /// completed does not wait for this rank's second half.
    pub(crate) fn chain<A, B, T>(
        &self,
        first: Work<A>,
        then: impl FnOnce(A, &Member, u64) -> Result<Work<B>> + Send + 'static,
        finish: impl FnOnce(B) -> Result<T> + Send + 'static,
    ) -> Work<T>
    where
        A: Send + 'static,
        B: Send + 'static,
        T: Send + 'static,
    {
        let (seq, open) = match self.reserve() {
            Ok(seq) => (seq, self.open()),
            Err(e) => return self.ready(Err(e)),
        };
        let (c, work) = Work::raw(self.rank.rank_threads.clone());
        let me = self.clone();
        self.rank.spawner.spawn(async move {
            // `then` and `finish` run user code (a `Deserialize` impl): guarded, so a panic
            // fails this call with `Error::Panic` and the rank carries on.
            let r = match first.await.and_then(|a| guarded(|| then(a, &me, seq))) {
                Ok(w) => w.await.and_then(|b| guarded(|| finish(b))),
                Err(e) => {
                    me.rank.driver.fail_call(me.group.info.id, seq, &e);
                    Err(e)
                }
            };
            drop(open);
            c.complete(r);
        });
        work
    }

    /// A handle that completes with `f` applied to `w`'s result.
    pub(crate) fn map_work<A, B>(
        &self,
        w: Work<A>,
        f: impl FnOnce(A) -> Result<B> + Send + 'static,
    ) -> Work<B>
    where
        A: Send + 'static,
        B: Send + 'static,
    {
        let (c, out) = Work::raw(self.rank.rank_threads.clone());
        self.rank
            .spawner
            .spawn(async move { c.complete(w.await.and_then(f)) });
        out
    }
}
