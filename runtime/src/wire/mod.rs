//! What travels between ranks: message headers ([`message`]) and, for transports that carry
//! bytes, the frames they are encoded in ([`codec`]).

pub mod codec;
pub mod link;
pub mod message;
pub mod shm;

pub use codec::{
    decode, decode_head, encode, encode_head, DecodeError, Decoded, Frame, Head, Limits,
};
pub use link::{Closed, Link, LinkError, Outbox};
pub use message::{AbortReason, Header, Message, Transmit};
