//! What travels between ranks: message headers ([`message`]) and, for transports that carry
//! bytes, the frames they are encoded in ([`codec`]).

pub mod message;

pub use message::{Header, Message, Transmit};
