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

/// The error type of collectix.
///
/// Every failure is `Clone + Send + Sync`, so that one failure can reach many waiters. Each
/// variant says who is at fault: the caller ([`InvalidArgument`](Error::InvalidArgument)),
/// the ranks together ([`Mismatch`](Error::Mismatch)), a peer ([`PeerLost`](Error::PeerLost),
/// [`Protocol`](Error::Protocol)), time ([`Timeout`](Error::Timeout)) or the runtime
/// ([`Shutdown`](Error::Shutdown)).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The caller passed arguments that cannot work (shapes, dtypes, roots, sizes, ops).
    /// Raised on the calling rank before anything is sent.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// Two ranks disagreed about a call: different collectives, dtypes, counts, roots,
    /// reduce ops or algorithms for the same sequence number of a group.
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
    /// A call did not complete in time.
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
        /// the call waits for; without a report (or when every rank is in the call), those
        /// whose messages had not arrived.
        waiting_for: Vec<usize>,
        /// The desync report: what every other member said it was doing (empty for
        /// point-to-point calls, or with a zero `desync_grace`).
        report: Vec<RankCall>,
    },
    /// A peer this rank talks to is gone (its link closed or it was isolated).
    #[error("peer rank {rank} was lost")]
    PeerLost {
        /// The lost rank (global).
        rank: usize,
    },
    /// The group was aborted because of `cause`, seen on this or another rank; every
    /// pending and later call on the group fails with this until the group is re-created.
    #[error("group {group} aborted: {cause}")]
    GroupAborted {
        /// The aborted group.
        group: GroupId,
        /// The failure that aborted it.
        cause: Box<Error>,
    },
    /// A peer sent something that breaks the protocol.
    #[error("protocol violation by rank {rank}: {detail}")]
    Protocol {
        /// The sending rank (global).
        rank: usize,
        /// What was wrong.
        detail: ProtocolError,
    },
    /// This rank is not a member of the group it called into.
    #[error("rank {rank} is not a member of group {group}")]
    NotAMember {
        /// The group.
        group: GroupId,
        /// The calling rank (global).
        rank: usize,
    },
    /// A blocking wait was called on the rank's own thread, where it could never complete.
    #[error("blocking wait on the rank's own actor thread would deadlock; await the Work instead")]
    WouldDeadlock,
    /// The world (or the rank) was shut down before the call completed.
    #[error("the rank was shut down")]
    Shutdown,
    /// A peer shut down while a call of the group was in flight on it, or while its flow
    /// control still held messages that this rank's calls need (it had run ahead by more
    /// than the window, e.g. a broadcast root that exits right after its calls completed)
    /// and they could not be sent within its linger time. Make the peer wait for its peers
    /// (a barrier) before it shuts down.
    #[error("rank {rank} shut down with {undelivered} messages for this rank unsent")]
    PeerShutdown {
        /// The rank that shut down (global).
        rank: usize,
        /// Messages it held for this rank.
        undelivered: usize,
    },
    /// The device layer failed: a library is missing, a CUDA or NCCL call failed, or NCCL
    /// cannot run the call.
    #[error("device: {0}")]
    Device(#[from] DeviceError),
    /// A value could not be (de)serialized (object collectives).
    #[error("serialization failed: {0}")]
    Serialization(String),
    /// Code of yours that collectix ran for this call panicked (a `Deserialize` impl in an
    /// object collective); the call fails with the panic's message, and the rank carries on.
    #[error("your code panicked inside this call: {0}")]
    Panic(String),
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

    /// The failure at the root of a chain of [`GroupAborted`](Error::GroupAborted).
    pub fn root_cause(&self) -> &Error {
        match self {
            Error::GroupAborted { cause, .. } => cause.root_cause(),
            e => e,
        }
    }
}

/// "call #N", or "point-to-point" for a call outside the group's sequence.
fn call_label(seq: Option<u64>) -> String {
    seq.map_or_else(|| "point-to-point".to_string(), |s| format!("call #{s}"))
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
