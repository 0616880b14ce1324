//! collectix-actors: rank actors, transports and the public async API.

pub mod comm;
pub mod object;
pub(crate) mod rank;
pub mod store;
pub mod transport;
pub mod work;
pub mod world;

pub use comm::{Communicator, P2POp};
pub use store::{MemoryStore, Store};
pub use work::Work;
pub use world::World;
