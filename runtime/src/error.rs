//! The one error type of collectix, [`Error`]: each variant says who is at fault.

use crate::ids::{Fingerprint, GroupId};
use crate::op::OpKind;
use serde::{Deserialize, Serialize};
use std::fmt;

/// What a call of one rank looked like, as its peers saw it: the rank (global) and the
/// fingerprint of its call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallDesc {
    /// The rank in the world (not group-local).
    pub rank: usize,
    /// The call's fingerprint.
    pub call: Fingerprint,
}

impl fmt::Display for CallDesc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rank {} called {}", self.rank, self.call)
    }
}

/// One wait of a wait cycle ([`Error::WaitCycle`]): rank `rank` waits in call `seq` (`op`)
/// of `group` for rank `peer`, which has made that call (`reached`: it is in it, and waits
/// itself) or has not (it waits in calls of its own elsewhere). Ranks are global.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Wait {
    /// The waiting rank.
    pub rank: usize,
    /// The group of the call it waits in.
    pub group: GroupId,
    /// The call's sequence number in the group.
    pub seq: u64,
    /// What the call is.
    pub op: OpKind,
    /// The rank it waits for.
    pub peer: usize,
    /// Whether `peer` has made the call.
    pub reached: bool,
}

impl fmt::Display for Wait {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "rank {} waits in {} (call #{} on group {}) for rank {}",
            self.rank, self.op, self.seq, self.group, self.peer
        )?;
        if !self.reached {
            write!(f, ", which has not made it")?;
        }
        Ok(())
    }
}

/// A wait cycle's text: its waits in order, joined by "; ".
fn cycle_text(cycle: &[Wait]) -> String {
    cycle
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// One line of a desync report: what a rank said about a call that timed out on another
/// rank (ranks are global).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RankCall {
    /// The rank has made this call (it is in it, or past it), with this fingerprint.
    Made {
        /// The rank.
        rank: usize,
        /// Its call.
        call: Fingerprint,
    },
    /// The rank has not reached this call; `latest` is its latest call on the group, if any
    /// (sequence number and fingerprint).
    NotReached {
        /// The rank.
        rank: usize,
        /// Its latest call on the group.
        latest: Option<(u64, Fingerprint)>,
    },
    /// The rank has made this call, but it made it at least `after` later than the rank
    /// whose call timed out (it had been in the call for less than half that rank's
    /// timeout when it answered): it came late, and the call's timeout names it.
    Late {
        /// The rank.
        rank: usize,
        /// Its call.
        call: Fingerprint,
        /// How much later than the asking rank it made the call, at least.
        after: std::time::Duration,
    },
    /// The rank did not answer within the group's `desync_grace`.
    NoAnswer {
        /// The rank.
        rank: usize,
    },
}

impl fmt::Display for RankCall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RankCall::Made { rank, call } => write!(f, "rank {rank} is in {call}"),
            RankCall::Late { rank, call, after } => write!(
                f,
                "rank {rank} is in {call}, which it made at least {} ms later",
                after.as_millis()
            ),
            RankCall::NotReached {
                rank,
                latest: Some((seq, call)),
            } => write!(
                f,
                "rank {rank} has not reached it (its latest call is #{seq}, {call})"
            ),
            RankCall::NotReached { rank, latest: None } => {
                write!(
                    f,
                    "rank {rank} has not reached it (no call on the group yet)"
                )
            }
            RankCall::NoAnswer { rank } => write!(f, "rank {rank} did not answer"),
        }
    }
}

/// The report's lines, for `Display`: "; " and each line, or nothing.
fn report_text(report: &[RankCall]) -> String {
    report.iter().map(|r| format!("; {r}")).collect()
}

/// Something a peer sent that does not follow the protocol.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[non_exhaustive]
pub enum ProtocolError {
    /// A message for a step the call's schedule has no receive for.
    #[error("unexpected message (tag {tag}) for call #{seq}")]
    UnexpectedTag {
        /// The sequence number of the call.
        seq: u64,
        /// The message's tag.
        tag: u32,
    },
    /// A second message with the same source and tag for one call.
    #[error("duplicate message (tag {tag}) for call #{seq}")]
    Duplicate {
        /// The sequence number of the call.
        seq: u64,
        /// The message's tag.
        tag: u32,
    },
    /// A payload whose size is not the one the receiver expects.
    #[error("payload of {got} bytes in part {part} where {expected} were expected")]
    Length {
        /// Index of the payload part.
        part: usize,
        /// Bytes expected.
        expected: u64,
        /// Bytes received.
        got: u64,
    },
    /// A payload with the wrong number of parts.
    #[error("{got} payload parts where {expected} were expected")]
    Parts {
        /// Parts expected.
        expected: usize,
        /// Parts received.
        got: usize,
    },
    /// Bytes that are not valid elements of the dtype (a bool other than 0 or 1).
    #[error("invalid {dtype} bit pattern in payload")]
    InvalidElements {
        /// The dtype of the payload.
        dtype: crate::DType,
    },
    /// A message for a call that completed too long ago to be checked.
    #[error("message for call #{seq}, which is no longer tracked")]
    Stale {
        /// The sequence number of the call.
        seq: u64,
    },
    /// A message for a call beyond the flow-control window the receiver granted.
    #[error("message for call #{seq}, beyond the granted window")]
    Window {
        /// The sequence number of the call.
        seq: u64,
    },
    /// A message that could not be decoded.
    #[error("malformed frame: {0}")]
    Malformed(String),
    /// Payload bytes sent ahead of this rank's calls beyond the byte budget
    /// (`GroupOptions::peer_budget_bytes`; a conforming peer waits for the call instead).
    #[error("{bytes} bytes sent ahead of this rank's calls (up to call #{seq}), beyond the budget of {budget}")]
    Budget {
        /// The call the message that went over the budget belongs to (for point-to-point,
        /// its lane sequence number).
        seq: u64,
        /// The bytes buffered with it.
        bytes: u64,
        /// The budget.
        budget: u64,
    },
}

/// A failure of the device layer (CUDA memory, NCCL): what was missing or which call failed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[non_exhaustive]
pub enum DeviceError {
    /// collectix was built without its `cuda` feature.
    #[error("device tensors need collectix built with its `cuda` feature")]
    FeatureDisabled,
    /// A shared library could not be loaded.
    #[error("the {library} library could not be loaded (tried: {}); {hint}", tried.join(", "))]
    LibraryMissing {
        /// `cuda` (the driver, libcuda) or `nccl`.
        library: String,
        /// The file names and paths tried, in order.
        tried: Vec<String>,
        /// What to do about it.
        hint: String,
    },
    /// The library is there, but lacks a function collectix needs (too old).
    #[error("the {library} library has no symbol {symbol} (version too old?)")]
    MissingSymbol {
        /// The library.
        library: String,
        /// The function.
        symbol: String,
    },
    /// There is no CUDA device with this ordinal.
    #[error("no CUDA device {ordinal} (this machine has {count})")]
    NoDevice {
        /// The ordinal asked for.
        ordinal: u32,
        /// Devices present.
        count: u32,
    },
    /// A CUDA driver call failed.
    #[error("CUDA call {call} failed: {detail}")]
    Cuda {
        /// The operation.
        call: String,
        /// The driver's error.
        detail: String,
    },
    /// An NCCL call failed (or its communicator reported an asynchronous error).
    #[error("NCCL {call} failed with code {code}: {detail}")]
    Nccl {
        /// The operation.
        call: String,
        /// The `ncclResult_t`.
        code: u32,
        /// NCCL's description.
        detail: String,
    },
    /// The NCCL path cannot run this call (a dtype or op NCCL lacks); the host-staged path
    /// can.
    #[error("NCCL cannot run this call: {0}; use the host-staged device backend for it")]
    Unsupported(String),
    /// An NCCL operation did not finish in time; the communicator was aborted, and every
    /// later device call on the group fails with this.
    #[error("an NCCL operation ({op}) on group {group} did not finish within {timeout_ms} ms; its communicator was aborted")]
    NcclTimeout {
        /// The group.
        group: GroupId,
        /// What was running.
        op: OpKind,
        /// The limit, in milliseconds.
        timeout_ms: u64,
    },
}

/// What a rank was doing when its connection to a peer failed ([`LinkFailure::Io`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum LinkStep {
    /// Opening the connection (the peer's address did not answer in time, or refused it).
    Connect,
    /// Sending the hello that names the job and both ranks.
    Hello,
    /// Waiting for the accepting rank's answer to the hello.
    Answer,
    /// Reading a connecting rank's hello.
    ReadHello,
}

impl fmt::Display for LinkStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LinkStep::Connect => "connecting",
            LinkStep::Hello => "sending the hello",
            LinkStep::Answer => "waiting for the answer to the hello",
            LinkStep::ReadHello => "reading the hello",
        })
    }
}

/// Why a link between two ranks could not be made ([`Error::Link`]): the connection failed,
/// or one side's hello did not fit the other (another job, another version, another world).
/// Every rank of a job must run the same collectix with the same job identity and world
/// size.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[non_exhaustive]
pub enum LinkFailure {
    /// The connection failed at `step`; `detail` is the operating system's word for it.
    #[error("{step} failed: {detail}")]
    Io {
        /// What the rank was doing.
        step: LinkStep,
        /// The operating system's error text.
        detail: String,
    },
    /// The other side does not speak collectix's link protocol (wrong magic).
    #[error("not a collectix link (wrong magic)")]
    NotALink,
    /// The other side speaks another version of the link protocol.
    #[error("link protocol version {theirs}; this rank speaks {ours}")]
    Version {
        /// The version the hello gave.
        theirs: u32,
        /// This rank's version.
        ours: u32,
    },
    /// The connection comes from another job.
    #[error("a connection from job {theirs:#x}; this is job {ours:#x}")]
    OtherJob {
        /// The job the hello names.
        theirs: u64,
        /// This rank's job.
        ours: u64,
    },
    /// The two ranks disagree on the world's size.
    #[error("the peer's world has {theirs} ranks; this one has {ours}")]
    WorldSize {
        /// The world size the hello gives.
        theirs: u32,
        /// This rank's world size.
        ours: u32,
    },
    /// The hello asks for another rank than the one that accepted it.
    #[error("the peer wants rank {wanted}; this is rank {ours}")]
    WrongRank {
        /// The rank the hello asks for.
        wanted: u32,
        /// The accepting rank.
        ours: u32,
    },
    /// The hello's sender is not a peer: out of the world's range, or the accepting rank
    /// itself.
    #[error("rank {rank} is not a peer in a world of {world}")]
    NotAPeer {
        /// The rank the hello says it comes from.
        rank: u32,
        /// The world's size.
        world: u32,
    },
    /// The accepting rank refused the hello, with its reason in its own words (one of the
    /// failures above, as that rank saw it).
    #[error("refused: {reason}")]
    Refused {
        /// The accepting rank's reason.
        reason: String,
    },
    /// The peer said it was connecting to this rank itself (the lower rank's connection is
    /// the one both keep), and its connection did not come in time.
    #[error("the peer said it was connecting to this rank, and never did")]
    NeverCame,
}

/// The error type of collectix.
///
/// Every failure is `Clone + Send + Sync`, so that one failure can reach many waiters. Each
/// variant says who is at fault and what to do (see its doc):
/// - misuse of the API, the caller's: [`InvalidArgument`](Error::InvalidArgument),
///   [`NotAMember`](Error::NotAMember), [`WouldDeadlock`](Error::WouldDeadlock),
///   [`ConcurrentCalls`](Error::ConcurrentCalls);
/// - the ranks disagree: [`Mismatch`](Error::Mismatch), [`SizeMismatch`](Error::SizeMismatch),
///   [`WaitCycle`](Error::WaitCycle) (about the order of calls across groups);
/// - time ran out, naming who is missing: [`Timeout`](Error::Timeout),
///   [`StoreTimeout`](Error::StoreTimeout);
/// - a peer: [`PeerLost`](Error::PeerLost), [`Link`](Error::Link),
///   [`PeerShutdown`](Error::PeerShutdown), [`CallFailed`](Error::CallFailed),
///   [`Protocol`](Error::Protocol), [`Remote`](Error::Remote);
/// - the group failed, for any of these reasons: [`GroupAborted`](Error::GroupAborted);
/// - stopping: [`Shutdown`](Error::Shutdown);
/// - the system: [`Resource`](Error::Resource), [`Device`](Error::Device),
///   [`Store`](Error::Store);
/// - your code that collectix ran: [`Panic`](Error::Panic),
///   [`Serialization`](Error::Serialization);
/// - a bug in collectix: [`Internal`](Error::Internal).
///
/// The `Display` text says in its first words what went wrong, then the detail.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Misuse of the API, the caller's fault: arguments that cannot work (shapes, dtypes,
    /// roots, sizes, ops), or a call on a destroyed group. Raised on the calling rank before
    /// anything is sent; the text says what to change.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// Two ranks disagreed about a call: different collectives, dtypes, counts, roots,
    /// reduce ops or algorithms for the same sequence number of a group (or, for
    /// point-to-point, a send and a receive of different shapes). Names both ranks' calls;
    /// every rank must make the same calls on a group in the same order. With a desync
    /// report, the report says what every rank was doing.
    #[error("mismatched calls on group {group} ({}): {ours}, but {theirs}{}", call_label(*.seq), report_text(.report))]
    Mismatch {
        /// The group.
        group: GroupId,
        /// The group's sequence number of the call (`None` for point-to-point calls, which
        /// are matched by tag outside the group's sequence).
        seq: Option<u64>,
        /// This rank's call.
        ours: CallDesc,
        /// The peer's call.
        theirs: CallDesc,
        /// The desync report, when the mismatch was found by one (a call timed out and the
        /// ranks were asked which call they are in); empty otherwise.
        report: Vec<RankCall>,
    },
    /// Ranks wait for each other in calls of two or more groups in an order that can never
    /// complete: each wait of `cycle` is for the next one's rank, and the last for the
    /// first's (rank 0 waits in group A for rank 1, which waits in group B for rank 0, which
    /// has not made that call). Found when a call on the cycle timed out, by following who
    /// waits for whom (`crate::engine` probes); every rank of the cycle fails its call on it
    /// with this, and the groups on it are aborted. Make the calls of every group in an
    /// order all their members share (or issue them from separate lanes).
    #[error("wait cycle across groups: {}", cycle_text(.cycle))]
    WaitCycle {
        /// The waits, in order around the cycle.
        cycle: Vec<Wait>,
    },
    /// Two ranks disagreed about how much one sends the other, in a call where each rank
    /// states its own sizes (all_to_all's split sizes and output shapes, which its
    /// fingerprint cannot carry): `receiver` expected `expected` bytes from `sender`, which
    /// sent `got`. Check the sizes both ranks passed; neither broke the protocol.
    #[error("mismatched sizes on group {group} (call #{seq}, {call}): rank {receiver} expects {expected} bytes from rank {sender}, which sent {got}")]
    SizeMismatch {
        /// The group.
        group: GroupId,
        /// The group's sequence number of the call.
        seq: u64,
        /// The call (the same on both ranks, but for the sizes).
        call: Fingerprint,
        /// The sending rank (global).
        sender: usize,
        /// The receiving rank (global), which noticed.
        receiver: usize,
        /// Bytes the receiver expected.
        expected: u64,
        /// Bytes the sender sent.
        got: u64,
    },
    /// A call did not complete within its timeout. Names the ranks it waited for and, with
    /// the desync report, what every other rank was doing: look at what the named ranks are
    /// doing (still in an earlier call, stuck in your code, or gone). Raise the timeout only
    /// if they were merely slow.
    #[error("{op} ({} on group {group}) timed out on rank {rank}, still waiting for ranks {waiting_for:?}{}", call_label(*.seq), report_text(.report))]
    Timeout {
        /// The group.
        group: GroupId,
        /// The sequence number of the call (`None` for point-to-point receives).
        seq: Option<u64>,
        /// What the call was.
        op: OpKind,
        /// The rank (global) that timed out.
        rank: usize,
        /// Ranks (global) the call waits for: with a desync report, exactly the ranks that
        /// said they have not made the call, and those that did not answer whose messages
        /// the call waits for; when every rank is in the call, those that made it late
        /// ([`RankCall::Late`]); without a report (or when every rank made the call in
        /// time), those whose messages had not arrived.
        waiting_for: Vec<usize>,
        /// The desync report: what every other member said it was doing (empty for
        /// point-to-point calls, or with a zero `desync_grace`).
        report: Vec<RankCall>,
    },
    /// A peer this rank talks to is gone: its link closed (the process died or the
    /// connection broke) or it was isolated. The group cannot go on; start again from the
    /// ranks that are left (a new world).
    #[error("peer rank {rank} was lost")]
    PeerLost {
        /// The lost rank (global).
        rank: usize,
    },
    /// This rank could not make its link to peer rank `rank` at `addr` (see
    /// [`LinkFailure`] for why): the peer's process is not running or not reachable at that
    /// address, or it belongs to another job or version. Check that every rank runs, that
    /// `addr` is the one it should listen on (`COLLECTIX_ADDR`, `COLLECTIX_SOCKET_IFNAME`),
    /// and that every process runs the same collectix.
    #[error("link to rank {rank} at {addr} failed: {failure}")]
    Link {
        /// The peer (global rank).
        rank: usize,
        /// The address the peer was reached at.
        addr: String,
        /// Why the link could not be made.
        failure: LinkFailure,
    },
    /// The group was aborted because of `cause`, seen on this or another rank; every
    /// pending and later call on the group fails with this, and it is the pending error
    /// that `destroy`, `monitored_barrier` and `World::shutdown` return for a rank whose
    /// calls had completed. [`root_cause`](Error::root_cause) gives `cause`; what to do is
    /// that variant's.
    #[error("group {group} aborted: {cause}")]
    GroupAborted {
        /// The aborted group.
        group: GroupId,
        /// The failure that aborted it.
        cause: Box<Error>,
    },
    /// A member revoked the group ([`Communicator::revoke`], MPI ULFM's `MPI_Comm_revoke`):
    /// every pending and later call on it fails (as the cause of an
    /// [`Error::GroupAborted`]). The group cannot be used again; its survivors can agree on a
    /// smaller one (`shrink`) and go on.
    ///
    /// [`Communicator::revoke`]: https://docs.rs/collectix/latest/collectix/struct.Communicator.html#method.revoke
    #[error("group {group} was revoked by rank {by}")]
    Revoked {
        /// The revoked group.
        group: GroupId,
        /// The rank that revoked it (global).
        by: usize,
    },
    /// Rank `by` declared this rank lost (its links to this rank were silent or broken: a
    /// frozen process, one stopped with SIGSTOP, a network partition) and aborted the
    /// group: this rank was not there for its peers, who went on without it. A rank that
    /// hears this should stop, or rejoin as a new incarnation.
    #[error("rank {by} declared this rank lost (it was frozen, stopped or cut off) and went on without it")]
    DeclaredLost {
        /// The rank whose abort said so (global).
        by: usize,
    },
    /// The survivors of group `group` agreed on a smaller group without this rank: rank
    /// `decided_by` decided who survived. Either its link to live member `link_to` broke (a
    /// cut link costs one of its ends: of two members that cannot reach each other, the one
    /// with more broken links goes, the higher rank on a tie), or it was known dead, or it
    /// did not join the agreement within the group's timeout. This rank should stop, or
    /// rejoin the job as a new incarnation.
    #[error("the survivors of group {group} went on without this rank ({})", left_out_why(*decided_by, *link_to))]
    LeftOut {
        /// The group that failed.
        group: GroupId,
        /// The rank whose decision stands (global).
        decided_by: usize,
        /// A live member this rank's link to broke, where that is why it was left out
        /// (global).
        link_to: Option<usize>,
    },
    /// This rank could not count a strict majority of group `group`'s members as alive
    /// (joined the survivors' agreement) or certainly dead within the group's timeout, so it
    /// decided nothing: it may be cut off from the others, who may go on without it. A
    /// minority never decides for a live majority; where the others are truly dead, only
    /// certain evidence of it (a closed or reset connection, a process gone) lets a
    /// minority go on.
    #[error("the survivors of group {group} could not agree: this rank counts {counted} of the group's {members} members as alive or certainly dead, not a strict majority (it may be cut off from the others)")]
    NoMajority {
        /// The group that failed.
        group: GroupId,
        /// The members this rank counted as alive or certainly dead (itself included).
        counted: usize,
        /// The group's size.
        members: usize,
    },
    /// A peer sent something that breaks the protocol: a malformed frame, a message for
    /// a step that has none, a duplicate, a message beyond its flow-control window. Names
    /// the peer. Collectix's own ranks never do this: suspect different collectix versions,
    /// a corrupted link, or something else speaking to the port.
    #[error("protocol violation by rank {rank}: {detail}")]
    Protocol {
        /// The sending rank (global).
        rank: usize,
        /// What was wrong.
        detail: ProtocolError,
    },
    /// This rank is not a member of the group it called into: use a communicator of a group
    /// this rank belongs to (`new_group` returns `None` to non-members).
    #[error("rank {rank} is not a member of group {group}")]
    NotAMember {
        /// The group.
        group: GroupId,
        /// The calling rank (global).
        rank: usize,
    },
    /// A blocking wait was called on the rank's own thread (in a callback collectix ran
    /// there), where it could never complete: `.await` the `Work` instead, or wait from
    /// another thread.
    #[error("blocking wait on the rank's own actor thread would deadlock; await the Work instead")]
    WouldDeadlock,
    /// Two threads (or async tasks) of this rank issued calls on one group at once: call
    /// `seq` was made while call `first_seq`, made by another, had not finished here. Their
    /// order on this rank is the scheduler's, which the other members need not share
    /// (`crate::issuers`), so the group is aborted. Issue a group's calls from one thread at
    /// a time, or give each stream a lane of its own (`Communicator::lane` in the actors
    /// crate).
    #[error("calls on group {group} from two threads at once: call #{seq} {second} while call #{first_seq} {first} had not finished; use one thread per group, or a lane per thread (Communicator::lane)")]
    ConcurrentCalls {
        /// The group.
        group: GroupId,
        /// The call refused.
        seq: u64,
        /// Where it was made.
        second: crate::issuers::CallSite,
        /// The call in flight, of another thread.
        first_seq: u64,
        /// Where that one was made.
        first: crate::issuers::CallSite,
    },
    /// The world or the rank was shut down, or the group destroyed on this rank, before
    /// the call completed; or the call was made after. Expected while a program stops; if
    /// not, look for who shut the world down early.
    #[error("the rank was shut down (or the group destroyed on it)")]
    Shutdown,
    /// A peer shut down while a call of the group was in flight on it, or while its flow
    /// control still held messages that this rank's calls need (it had run ahead by more
    /// than the window, e.g. a broadcast root that exits right after its calls completed)
    /// and they could not be sent within its linger time; or it left the group (shut down,
    /// or destroyed the group) with nothing in flight (`undelivered` 0), and this call needs
    /// it. Make the peer wait for its peers (a barrier) before it shuts down.
    #[error("{}", peer_shutdown_text(*rank, *undelivered))]
    PeerShutdown {
        /// The rank that shut down (global).
        rank: usize,
        /// Messages it held for this rank.
        undelivered: usize,
    },
    /// Rank `rank`'s part of collective call `seq` of group `group` failed before it started
    /// (its arguments failed their checks there; `reason` is its error), so the call can
    /// complete on no rank that needs that part: this rank abandoned its part too. The
    /// group goes on, and the next call is unaffected. Fix the call on rank `rank`; every
    /// rank must pass arguments that agree (the same root, op and sizes).
    #[error("call #{seq} of group {group} failed on rank {rank} before it started ({reason}), so it was abandoned here too; the group goes on")]
    CallFailed {
        /// The group.
        group: GroupId,
        /// The call's sequence number.
        seq: u64,
        /// The rank whose part failed (global).
        rank: usize,
        /// Its error, as that rank's `Display` says it.
        reason: String,
    },
    /// The device layer failed: a library is missing, a CUDA or NCCL call failed, or NCCL
    /// cannot run the call. The [`DeviceError`] says which and what to do.
    #[error("device: {0}")]
    Device(#[from] DeviceError),
    /// A value of an object collective could not be serialized, or the bytes that came
    /// are not a value of the type asked for: every rank must use the same type.
    #[error("serialization failed: {0}")]
    Serialization(String),
    /// Code of yours that collectix ran for this call panicked: a `Deserialize` impl in an
    /// object collective, or the waker of the call's `Work` (your executor's). The call
    /// fails with the panic's message, and the rank carries on. Fix the code the text names.
    #[error("{0} (inside this call; the rank carries on)")]
    Panic(String),
    /// The system refused something collectix needed: a thread (for the actor system, a
    /// rank or a device worker), memory, a file descriptor. Nobody's fault in the program;
    /// raise the limit the text names (`ulimit -u`, `ulimit -n`) or run fewer ranks per
    /// process.
    #[error("resource limit: {0}")]
    Resource(String),
    /// A store (the rendezvous key-value store) did not get what was waited for in time:
    /// the keys, and how long. A rank that never started, or a wrong store address, are the
    /// usual causes; check that every rank runs and points at the same store.
    #[error("store: timed out after {waited_ms} ms waiting for {what}")]
    StoreTimeout {
        /// The keys waited for.
        what: String,
        /// How long, in milliseconds.
        waited_ms: u64,
    },
    /// The store failed in a way that is not a timeout: it cannot be listened on, it is not
    /// a collectix store (or speaks another version), it answered something malformed, or
    /// the connection broke during a request whose effect is then unknown (`add`). The text
    /// says which; check the store's address and that every process runs the same collectix.
    #[error("store: {0}")]
    Store(String),
    /// A connection failed the job's secret handshake (`docs/deployment.md`, "Security
    /// model"): `peer` (a rank and its address, or the store's address) does not hold the
    /// secret this process holds, or one of the two has none. Give every process of the job
    /// the same `COLLECTIX_SECRET` (or `COLLECTIX_SECRET_FILE`).
    #[error("authentication failed with {peer}: {reason}")]
    Unauthenticated {
        /// Who: "rank 3 at 10.0.0.4:41234", or the store's address.
        peer: String,
        /// Which side lacked the secret or proved it wrongly.
        reason: String,
    },
    /// Another rank aborted the group because one of its calls failed with an error that
    /// concerns that rank only (a device failure, a panic in its code): `text` is that
    /// error as the rank reported it. Look at that rank's own error for the detail.
    #[error("rank {rank} failed: {text}")]
    Remote {
        /// The rank that failed (global).
        rank: usize,
        /// Its error, in words.
        text: String,
    },
    /// A bug in collectix: one of its own invariants did not hold (the text says what was
    /// expected). Not the caller's fault and not a peer's: please report it, with the text
    /// and, if you can, how to reproduce it.
    #[error("internal error in collectix (a bug, please report it): {0}")]
    Internal(String),
}

impl Error {
    /// Shorthand for [`Error::InvalidArgument`].
    pub fn invalid(msg: impl Into<String>) -> Self {
        Error::InvalidArgument(msg.into())
    }

    /// Shorthand for [`Error::Internal`]: `what` says which invariant did not hold.
    pub fn internal(what: impl Into<String>) -> Self {
        Error::Internal(what.into())
    }

    /// [`Error::Panic`] for a panic caught in user code: `what` names the code (a
    /// `Deserialize` impl, a waker), `payload` is what the panic carried (its message when it
    /// is text).
    pub fn from_panic(what: &str, payload: &(dyn std::any::Any + Send)) -> Self {
        let msg = payload
            .downcast_ref::<&str>()
            .map(|s| (*s).to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic with a non-text payload".to_string());
        Error::Panic(format!("{what} panicked: {msg}"))
    }

    /// The variant's name in snake case (`invalid_argument`, `timeout`, `peer_lost`, …): a
    /// short, fixed label for counting errors by kind (metrics, logs).
    pub fn kind_name(&self) -> &'static str {
        match self {
            Error::InvalidArgument(_) => "invalid_argument",
            Error::Mismatch { .. } => "mismatch",
            Error::SizeMismatch { .. } => "size_mismatch",
            Error::WaitCycle { .. } => "wait_cycle",
            Error::Timeout { .. } => "timeout",
            Error::PeerLost { .. } => "peer_lost",
            Error::Link { .. } => "link",
            Error::GroupAborted { .. } => "group_aborted",
            Error::Revoked { .. } => "revoked",
            Error::DeclaredLost { .. } => "declared_lost",
            Error::LeftOut { .. } => "left_out",
            Error::NoMajority { .. } => "no_majority",
            Error::Protocol { .. } => "protocol",
            Error::NotAMember { .. } => "not_a_member",
            Error::WouldDeadlock => "would_deadlock",
            Error::ConcurrentCalls { .. } => "concurrent_calls",
            Error::Shutdown => "shutdown",
            Error::PeerShutdown { .. } => "peer_shutdown",
            Error::CallFailed { .. } => "call_failed",
            Error::Device(_) => "device",
            Error::Serialization(_) => "serialization",
            Error::Panic(_) => "panic",
            Error::Resource(_) => "resource",
            Error::StoreTimeout { .. } => "store_timeout",
            Error::Store(_) => "store",
            Error::Unauthenticated { .. } => "unauthenticated",
            Error::Remote { .. } => "remote",
            Error::Internal(_) => "internal",
        }
    }

    /// The failure at the root of a chain of [`GroupAborted`](Error::GroupAborted).
    pub fn root_cause(&self) -> &Error {
        match self {
            Error::GroupAborted { cause, .. } => cause.root_cause(),
            e => e,
        }
    }
}

/// [`Error::PeerShutdown`]'s text.
fn peer_shutdown_text(rank: usize, undelivered: usize) -> String {
    if undelivered == 0 {
        format!("rank {rank} left the group (it shut down or destroyed it) before this call could complete")
    } else {
        format!("rank {rank} shut down with {undelivered} messages for this rank unsent")
    }
}

/// Why [`Error::LeftOut`] left this rank out.
fn left_out_why(decided_by: usize, link_to: Option<usize>) -> String {
    match link_to {
        Some(peer) => format!(
            "its link to rank {peer} broke; of two members that cannot reach each other, the one with more broken links goes, the higher rank on a tie"
        ),
        None => format!(
            "rank {decided_by} decided who survived before this rank joined the agreement, or knew it dead"
        ),
    }
}

/// "call #N", or "point-to-point" for a call outside the group's sequence.
fn call_label(seq: Option<u64>) -> String {
    seq.map_or_else(|| "point-to-point".to_string(), |s| format!("call #{s}"))
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::DataPath;
    use crate::tensor::dtype::DType;
    use crate::wire::message::AbortReason;

    fn fp(kind: OpKind) -> Fingerprint {
        Fingerprint {
            kind,
            dtype: DType::F32,
            count: Some(4),
            root: None,
            op: None,
            scalar: 0,
            algorithm: None,
            path: DataPath::Engine,
        }
    }

    /// Who is at fault, for each variant. The match has no wildcard: a new variant does not
    /// compile until it is placed here and constructed in `every_variant`.
    fn class(e: &Error) -> &'static str {
        match e {
            Error::InvalidArgument(_)
            | Error::NotAMember { .. }
            | Error::WouldDeadlock
            | Error::ConcurrentCalls { .. }
            | Error::Unauthenticated { .. } => "misuse",
            Error::Mismatch { .. } | Error::SizeMismatch { .. } | Error::WaitCycle { .. } => {
                "mismatch"
            }
            Error::Timeout { .. } | Error::StoreTimeout { .. } => "timeout",
            Error::PeerLost { .. }
            | Error::Link { .. }
            | Error::PeerShutdown { .. }
            | Error::CallFailed { .. }
            | Error::Protocol { .. }
            | Error::Remote { .. } => "peer",
            Error::GroupAborted { .. }
            | Error::Revoked { .. }
            | Error::LeftOut { .. }
            | Error::NoMajority { .. }
            | Error::DeclaredLost { .. } => "group",
            Error::Shutdown => "shutdown",
            Error::Resource(_) | Error::Device(_) | Error::Store(_) => "system",
            Error::Panic(_) | Error::Serialization(_) => "user code",
            Error::Internal(_) => "internal",
        }
    }

    fn every_variant() -> Vec<Error> {
        let g = GroupId::WORLD;
        let mismatch = Error::Mismatch {
            group: g,
            seq: Some(3),
            ours: CallDesc {
                rank: 0,
                call: fp(OpKind::AllReduce),
            },
            theirs: CallDesc {
                rank: 1,
                call: fp(OpKind::Broadcast),
            },
            report: vec![RankCall::Made {
                rank: 1,
                call: fp(OpKind::Broadcast),
            }],
        };
        vec![
            Error::invalid("count must be positive"),
            mismatch.clone(),
            Error::SizeMismatch {
                group: g,
                seq: 2,
                call: fp(OpKind::AllToAll),
                sender: 1,
                receiver: 0,
                expected: 16,
                got: 20,
            },
            Error::Timeout {
                group: g,
                seq: Some(1),
                op: OpKind::Barrier,
                rank: 0,
                waiting_for: vec![2],
                report: vec![
                    RankCall::NotReached {
                        rank: 2,
                        latest: None,
                    },
                    RankCall::NoAnswer { rank: 3 },
                ],
            },
            Error::WaitCycle {
                cycle: vec![
                    Wait {
                        rank: 0,
                        group: g,
                        seq: 5,
                        op: OpKind::AllReduce,
                        peer: 1,
                        reached: false,
                    },
                    Wait {
                        rank: 1,
                        group: GroupId(7),
                        seq: 2,
                        op: OpKind::Broadcast,
                        peer: 0,
                        reached: false,
                    },
                ],
            },
            Error::PeerLost { rank: 2 },
            Error::Revoked { group: g, by: 1 },
            Error::DeclaredLost { by: 2 },
            Error::LeftOut {
                group: g,
                decided_by: 0,
                link_to: Some(2),
            },
            Error::NoMajority {
                group: g,
                counted: 2,
                members: 5,
            },
            Error::GroupAborted {
                group: g,
                cause: Box::new(mismatch),
            },
            Error::Protocol {
                rank: 1,
                detail: ProtocolError::Malformed("bad kind".into()),
            },
            Error::NotAMember { group: g, rank: 4 },
            Error::WouldDeadlock,
            Error::ConcurrentCalls {
                group: g,
                seq: 8,
                second: crate::issuers::CallSite {
                    at: "src/checkpoint.rs:40:14".into(),
                    by: "thread 'checkpoint'".into(),
                },
                first_seq: 7,
                first: crate::issuers::CallSite {
                    at: "src/train.rs:12:9".into(),
                    by: "thread 'trainer'".into(),
                },
            },
            Error::Shutdown,
            Error::Link {
                rank: 2,
                addr: "10.0.0.3:41234".into(),
                failure: LinkFailure::Io {
                    step: LinkStep::Connect,
                    detail: "Connection refused (os error 111)".into(),
                },
            },
            Error::PeerShutdown {
                rank: 1,
                undelivered: 3,
            },
            Error::CallFailed {
                group: g,
                seq: 4,
                rank: 1,
                reason: "invalid argument: root 5 is not a rank of a group of 4".into(),
            },
            Error::Device(DeviceError::FeatureDisabled),
            Error::Serialization("unexpected end".into()),
            Error::from_panic("your code", &"boom"),
            Error::Resource("cannot start a thread: EAGAIN".into()),
            Error::StoreTimeout {
                what: "rank/3".into(),
                waited_ms: 30_000,
            },
            Error::Store(
                "127.0.0.1:29500 answered the hello with Done: not a collectix store".into(),
            ),
            Error::Remote {
                rank: 2,
                text: "device: no CUDA device 3 (this machine has 1)".into(),
            },
            Error::Unauthenticated {
                peer: "rank 1 at 10.0.0.2:41234".into(),
                reason: "it does not know this job's secret".into(),
            },
            Error::internal("a reduce step without an op"),
        ]
    }

    #[test]
    fn every_variant_says_in_one_line_who_is_at_fault() {
        let all = every_variant();
        // Every variant once (28 of them: `class` lists them all, without a wildcard).
        let kinds: std::collections::BTreeSet<String> = all
            .iter()
            .map(|e| format!("{:?}", std::mem::discriminant(e)))
            .collect();
        assert_eq!((kinds.len(), all.len()), (28, 28));
        for e in &all {
            let text = e.to_string();
            assert!(!text.is_empty() && !text.contains('\n'), "{e:?}: {text:?}");
            // Only a bug in collectix calls itself internal; only it asks for a report.
            let internal = class(e) == "internal";
            assert_eq!(text.contains("internal"), internal, "{text}");
            assert_eq!(text.contains("please report"), internal, "{text}");
        }
    }

    /// What aborts a group travels to the other members as itself; what concerns one rank
    /// only arrives as `Remote`, naming the rank it came from.
    #[test]
    fn every_variant_survives_an_abort() {
        for e in every_variant() {
            let back = AbortReason::from(&e).into_error(GroupId::WORLD, 7);
            let cause = e.root_cause();
            match cause {
                Error::Mismatch { .. }
                | Error::SizeMismatch { .. }
                | Error::WaitCycle { .. }
                | Error::Timeout { .. }
                | Error::PeerLost { .. }
                | Error::PeerShutdown { .. }
                | Error::Protocol { .. }
                | Error::Revoked { .. }
                | Error::Internal(_) => assert_eq!(&back, cause),
                other => assert_eq!(
                    back,
                    Error::Remote {
                        rank: 7,
                        text: other.to_string()
                    }
                ),
            }
        }
    }
}
