//! What ranks send each other. Every collective message carries its group, the call's
//! sequence number in that group, a tag naming the step, and the fingerprint of the call;
//! the payload travels as raw byte parts (one per chunk), never through serde.

use crate::error::{CallDesc, Error, ProtocolError, RankCall};
use crate::ids::{DataPath, Fingerprint, GroupId};
use crate::op::OpKind;
use crate::tensor::dtype::DType;
use bytes::Bytes;

/// The largest ticket a [`Header::P2p`] message on [`DataPath::Nccl`] may carry.
pub const TICKET_MAX: usize = 64;

/// The header of a message; [`crate::wire::codec`] frames it for transports that carry
/// bytes.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Header {
    /// A step of a collective.
    Data {
        /// The group.
        group: GroupId,
        /// The call's sequence number in the group.
        seq: u64,
        /// The step, as the algorithm numbers it.
        tag: u32,
        /// The sender's call.
        call: Fingerprint,
    },
    /// A point-to-point message.
    P2p {
        /// The group (ranks are translated through it).
        group: GroupId,
        /// The user's tag.
        tag: u32,
        /// Per (sender, receiver, group, tag) counter: messages match in FIFO order even if
        /// a transport reorders them.
        seq: u64,
        /// Element type.
        dtype: DType,
        /// Element count.
        count: u64,
        /// Sent on the sender's eager budget (`true`) or because the receiver asked for it
        /// with a [`Header::P2pGrant`] (see `p2p_flow`).
        eager: bool,
        /// The sender's data path: [`DataPath::Engine`] messages carry the tensor;
        /// [`DataPath::Nccl`] messages carry a ticket of at most [`TICKET_MAX`] bytes that
        /// stands for `count` elements of `dtype` travelling on NCCL (collectix-actors'
        /// device point-to-point). A receive on the other path is a mismatch.
        path: DataPath,
    },
    /// Flow control of collectives: the sender has made `calls` calls in the group (see
    /// `flow`).
    Credit {
        /// The group.
        group: GroupId,
        /// Calls made.
        calls: u64,
    },
    /// Flow control of collectives: the sender asks for credit up to call `seq`.
    WantCredit {
        /// The group.
        group: GroupId,
        /// The call it wants to send.
        seq: u64,
    },
    /// Point-to-point flow control: receives wait for the receiver's messages on `tag` with
    /// sequence numbers below `upto`; they may come.
    P2pGrant {
        /// The group.
        group: GroupId,
        /// The user's tag.
        tag: u32,
        /// Messages of the lane below this sequence number are solicited.
        upto: u64,
    },
    /// Point-to-point flow control: the sender holds its message `seq` on `tag` for the
    /// addressee (beyond its eager budget, or too large to go eager) and asks for a grant
    /// of it (see `p2p_flow`).
    P2pAsk {
        /// The group.
        group: GroupId,
        /// The user's tag.
        tag: u32,
        /// The held message's sequence number in its lane.
        seq: u64,
    },
    /// Point-to-point flow control: the sender of this message (a receiver of point-to-point
    /// messages) has consumed `eager` of the addressee's eager messages in the group
    /// (cumulative).
    P2pConsumed {
        /// The group.
        group: GroupId,
        /// Eager messages consumed.
        eager: u64,
    },
    /// A call timed out on the sender: which call is the receiver in? (The desync report.)
    Inquire {
        /// The group.
        group: GroupId,
        /// The call that timed out.
        seq: u64,
    },
    /// The answer to [`Header::Inquire`].
    Status {
        /// The group.
        group: GroupId,
        /// The call asked about.
        seq: u64,
        /// The sender's fingerprint of that call, if it has made it (boxed, as `latest` and
        /// an abort's reason are: a header is moved whole on every hop of every message, so
        /// it is kept to the size of the hot variants).
        made: Option<Box<Fingerprint>>,
        /// The sender's latest call on the group (sequence number and fingerprint), if any.
        latest: Option<Box<(u64, Fingerprint)>>,
        /// How long the sender had been in the call when it answered, in nanoseconds, if it
        /// is in it now (durations agree across hosts where clocks do not).
        in_call_for: Option<u64>,
        /// Whether the sender has other collective calls in flight (on any group): one that
        /// has not made the call asked about may be waiting in them (a wait cycle, which the
        /// asker's probe finds, `Header::Probe`).
        elsewhere: bool,
    },
    /// A wait-cycle probe (edge chasing): each wait of `path` is for the next one's rank,
    /// and the last is for the addressee. The addressee follows it along its own waits, or
    /// finds the cycle if it started it (`engine::cycle`). `group` is the last wait's group.
    Probe {
        /// The group.
        group: GroupId,
        /// The waits so far, from the rank whose call timed out (boxed, as an abort's reason).
        path: Box<Vec<crate::error::Wait>>,
    },
    /// The sender left the group cleanly (it was destroyed there, or the sender shut
    /// down) with no call of it in flight and nothing held for anyone: it made `calls`
    /// collective calls on the group, so calls up to those can still complete, and later
    /// ones (and point-to-point calls with the sender) fail.
    Left {
        /// The group.
        group: GroupId,
        /// Collective calls the sender made on the group.
        calls: u64,
    },
    /// The sender's part of collective call `seq` failed before it started (its arguments
    /// failed their checks there): the call cannot complete on any member, and each member
    /// abandons its part ([`crate::Error::CallFailed`]); the group goes on with the next call.
    /// Sent through flow control like a data message of that call, and a credit as one is.
    Failed {
        /// The group.
        group: GroupId,
        /// The call's sequence number.
        seq: u64,
        /// Why, as the sender's error says it (cut at 4 KiB on the wire).
        reason: String,
    },
    /// The sender aborted the group because of `reason`.
    Abort {
        /// The group.
        group: GroupId,
        /// Why.
        reason: Box<AbortReason>,
    },
}

impl Header {
    /// The group the message belongs to.
    pub fn group(&self) -> GroupId {
        match self {
            Header::Data { group, .. }
            | Header::P2p { group, .. }
            | Header::Abort { group, .. }
            | Header::Left { group, .. }
            | Header::Failed { group, .. }
            | Header::Credit { group, .. }
            | Header::WantCredit { group, .. }
            | Header::P2pGrant { group, .. }
            | Header::P2pAsk { group, .. }
            | Header::P2pConsumed { group, .. }
            | Header::Inquire { group, .. }
            | Header::Probe { group, .. }
            | Header::Status { group, .. } => *group,
        }
    }
}

/// Why a rank aborted a group, as it travels: a wire type of its own, so that the public
/// [`Error`] can change without changing the protocol. Ranks are global.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AbortReason {
    /// Two ranks' calls disagreed ([`Error::Mismatch`]).
    Mismatch {
        /// The call's sequence number (`None`: point-to-point).
        seq: Option<u64>,
        /// The aborting rank's call.
        ours: CallDesc,
        /// The peer's call.
        theirs: CallDesc,
        /// The desync report, if one found the mismatch.
        report: Vec<RankCall>,
    },
    /// Two ranks disagreed about a size ([`Error::SizeMismatch`]).
    SizeMismatch {
        /// The call's sequence number.
        seq: u64,
        /// The call.
        call: crate::ids::Fingerprint,
        /// The sending rank.
        sender: u64,
        /// The receiving rank.
        receiver: u64,
        /// Bytes expected.
        expected: u64,
        /// Bytes sent.
        got: u64,
    },
    /// A call timed out ([`Error::Timeout`]).
    Timeout {
        /// The call's sequence number (`None`: point-to-point).
        seq: Option<u64>,
        /// What the call was.
        op: OpKind,
        /// The rank that timed out.
        rank: u64,
        /// The ranks it was waiting for.
        waiting_for: Vec<u64>,
        /// The desync report.
        report: Vec<RankCall>,
    },
    /// A rank was lost ([`Error::PeerLost`]).
    PeerLost {
        /// The lost rank.
        rank: u64,
    },
    /// A rank shut down with messages held ([`Error::PeerShutdown`]).
    PeerShutdown {
        /// The rank.
        rank: u64,
        /// Messages it held.
        undelivered: u64,
    },
    /// A rank broke the protocol ([`Error::Protocol`]).
    Protocol {
        /// The offending rank.
        rank: u64,
        /// What was wrong.
        detail: ProtocolError,
    },
    /// A bug in the aborting rank's collectix ([`Error::Internal`]).
    Internal {
        /// What was expected.
        text: String,
    },
    /// A member revoked the group ([`Error::Revoked`]).
    Revoked {
        /// The rank that revoked it.
        by: u64,
    },
    /// Calls across groups wait for each other in a cycle ([`Error::WaitCycle`]).
    WaitCycle {
        /// The waits around the cycle.
        cycle: Vec<crate::error::Wait>,
    },
    /// Any other failure, in words.
    Other {
        /// The failure's text.
        text: String,
    },
}

impl From<&Error> for AbortReason {
    fn from(e: &Error) -> AbortReason {
        match e.root_cause() {
            Error::Mismatch {
                seq,
                ours,
                theirs,
                report,
                ..
            } => AbortReason::Mismatch {
                seq: *seq,
                ours: ours.clone(),
                theirs: theirs.clone(),
                report: report.clone(),
            },
            Error::Timeout {
                seq,
                op,
                rank,
                waiting_for,
                report,
                ..
            } => AbortReason::Timeout {
                seq: *seq,
                op: *op,
                rank: *rank as u64,
                waiting_for: waiting_for.iter().map(|&r| r as u64).collect(),
                report: report.clone(),
            },
            Error::SizeMismatch {
                seq,
                call,
                sender,
                receiver,
                expected,
                got,
                ..
            } => AbortReason::SizeMismatch {
                seq: *seq,
                call: *call,
                sender: *sender as u64,
                receiver: *receiver as u64,
                expected: *expected,
                got: *got,
            },
            Error::PeerLost { rank } => AbortReason::PeerLost { rank: *rank as u64 },
            Error::PeerShutdown { rank, undelivered } => AbortReason::PeerShutdown {
                rank: *rank as u64,
                undelivered: *undelivered as u64,
            },
            Error::Protocol { rank, detail } => AbortReason::Protocol {
                rank: *rank as u64,
                detail: detail.clone(),
            },
            Error::Internal(text) => AbortReason::Internal { text: text.clone() },
            Error::Revoked { by, .. } => AbortReason::Revoked { by: *by as u64 },
            Error::WaitCycle { cycle } => AbortReason::WaitCycle {
                cycle: cycle.clone(),
            },
            other => AbortReason::Other {
                text: other.to_string(),
            },
        }
    }
}

impl AbortReason {
    /// The error a rank reports for a group aborted for this reason (`group`: the group;
    /// `from`: the global rank whose abort it was).
    pub fn into_error(self, group: GroupId, from: usize) -> Error {
        let rank = |r: u64| usize::try_from(r).unwrap_or(usize::MAX);
        match self {
            AbortReason::Mismatch {
                seq,
                ours,
                theirs,
                report,
            } => Error::Mismatch {
                group,
                seq,
                ours,
                theirs,
                report,
            },
            AbortReason::Timeout {
                seq,
                op,
                rank: r,
                waiting_for,
                report,
            } => Error::Timeout {
                group,
                seq,
                op,
                rank: rank(r),
                waiting_for: waiting_for.into_iter().map(rank).collect(),
                report,
            },
            AbortReason::SizeMismatch {
                seq,
                call,
                sender,
                receiver,
                expected,
                got,
            } => Error::SizeMismatch {
                group,
                seq,
                call,
                sender: rank(sender),
                receiver: rank(receiver),
                expected,
                got,
            },
            AbortReason::PeerLost { rank: r } => Error::PeerLost { rank: rank(r) },
            AbortReason::PeerShutdown {
                rank: r,
                undelivered,
            } => Error::PeerShutdown {
                rank: rank(r),
                undelivered: rank(undelivered),
            },
            AbortReason::Protocol { rank: r, detail } => Error::Protocol {
                rank: rank(r),
                detail,
            },
            AbortReason::Internal { text } => Error::Internal(text),
            AbortReason::WaitCycle { cycle } => Error::WaitCycle { cycle },
            AbortReason::Revoked { by } => Error::Revoked {
                group,
                by: rank(by),
            },
            // What has no variant of its own travels in words, as the failure of the rank
            // that sent the abort.
            AbortReason::Other { text } => Error::Remote { rank: from, text },
        }
    }
}

/// A message from global rank `src`.
#[derive(Clone, Debug)]
pub struct Message {
    /// Sender (global rank). A transport sets it from the link the message came on, never
    /// from the message's bytes.
    pub src: usize,
    /// Header.
    pub header: Header,
    /// Payload parts.
    pub payload: Vec<Bytes>,
}

impl Message {
    /// Whether a rank reads its mailboxes ([`crate::board::mail`]) before it hands this
    /// message to its engine, whatever its mail flag says: the sender's departure
    /// ([`Header::Left`]) ends the receives from it, and a small message it mailed before it
    /// left (done on its side the moment it was written) must reach the engine first. The
    /// departure travels by the transport, the message by the mailbox: only the receiver
    /// can put them back in the order they were sent, and it can because everything mailed
    /// before the departure was sent is visible once the departure has arrived.
    pub fn wants_mail_first(&self) -> bool {
        matches!(self.header, Header::Left { .. })
    }
}

/// A message the engine wants delivered to global rank `dst`.
#[derive(Clone, Debug)]
pub struct Transmit {
    /// Destination (global rank).
    pub dst: usize,
    /// The message.
    pub msg: Message,
}
