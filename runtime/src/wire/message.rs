//! What ranks send each other. Every collective message carries its group, the call's
//! sequence number in that group, a tag naming the step, and the fingerprint of the call;
//! the payload travels as raw byte parts (one per chunk), never through serde.

use crate::collective::Fingerprint;
use crate::error::Error;
use crate::group::GroupId;
use crate::tensor::dtype::DType;
use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// The header of a message (serde-encodable, for transports that frame it).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
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
    /// Point-to-point flow control: the sender has consumed `eager` of the receiver's eager
    /// messages in the group (cumulative).
    P2pConsumed {
        /// The group.
        group: GroupId,
        /// Eager messages consumed.
        eager: u64,
    },
    /// The sender aborted the group because of `cause`.
    Abort {
        /// The group.
        group: GroupId,
        /// Why.
        cause: Error,
    },
}

impl Header {
    /// The group the message belongs to.
    pub fn group(&self) -> GroupId {
        match self {
            Header::Data { group, .. }
            | Header::P2p { group, .. }
            | Header::Abort { group, .. }
            | Header::Credit { group, .. }
            | Header::WantCredit { group, .. }
            | Header::P2pGrant { group, .. }
            | Header::P2pConsumed { group, .. } => *group,
        }
    }
}

/// A message from global rank `src`.
#[derive(Clone, Debug)]
pub struct Message {
    /// Sender (global rank).
    pub src: usize,
    /// Header.
    pub header: Header,
    /// Payload parts.
    pub payload: Vec<Bytes>,
}

/// A message the engine wants delivered to global rank `dst`.
#[derive(Clone, Debug)]
pub struct Transmit {
    /// Destination (global rank).
    pub dst: usize,
    /// The message.
    pub msg: Message,
}
