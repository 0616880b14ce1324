//! Shared memory between the processes of one host, sans-IO: the layout of a segment and its
//! rings ([`ring`]), the codec's frames over a ring ([`frames`]), and the one module that
//! touches the memory ([`region`]). The actors crate maps the segments, passes them between
//! processes and wakes the parked ones (`collectix_actors`' `transport::shm`); everything
//! that reads what a peer wrote is here, checked, and tested under Miri.
//!
//! Each process that receives owns one segment with a ring per local sender; a sender writes
//! frames into its ring in the receiver's segment and the receiver copies them out into its
//! own buffers. A segment is untrusted input: every counter and length read from it is
//! checked before use, and a bad one is a [`ShmError`], which the transport turns into a lost
//! peer.

pub mod frames;
pub mod memory;
pub mod region;
pub mod ring;
pub mod shared_read;
pub mod wake;

pub use frames::{
    FrameReader, FrameWriter, RemoteRead, Sent, Share, SingleCopy, Sources, HOLD, REMOTE_MIN,
};
pub use memory::{Memory, Word};
pub use region::Region;
pub use ring::{Layout, RingReader, RingWriter, Segment, SegmentLane, SegmentMail, SegmentWords};
pub use shared_read::{SharedRead, SharedRemote};
pub use wake::{Callers, Leave, Rest};

use super::codec::DecodeError;

/// Why a segment or a ring cannot be used: the peer is lost.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ShmError {
    /// A segment's shape that cannot be (too many rings, a ring of a bad size).
    #[error("shared memory: {0} is not a valid layout")]
    Layout(String),
    /// Counters or a header in the segment that no honest peer writes.
    #[error("shared memory is corrupt: {0}")]
    Corrupt(String),
    /// A ring whose bytes are not frames.
    #[error("shared memory ring: {0}")]
    Decode(#[from] DecodeError),
}
