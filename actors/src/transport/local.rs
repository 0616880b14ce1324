//! The in-process transport: one link per (rank, peer) that moves a message into the peer
//! actor's mailbox. An actix mailbox is unbounded, so a local link never says "would block";
//! it is gone when the peer actor has stopped.

use super::{Deliver, Link, LinkError, Links};
use actix::Recipient;
use collectix_runtime::wire::Message;

/// The link from global rank `src` to one peer actor.
pub struct LocalLink {
    src: usize,
    peer: Recipient<Deliver>,
}

impl Link<Message> for LocalLink {
    fn try_send(&mut self, msg: Message) -> Result<(), LinkError<Message>> {
        if !self.peer.connected() {
            return Err(LinkError::Closed);
        }
        self.peer.do_send(Deliver { src: self.src, msg });
        Ok(())
    }
}

/// The links of rank `src` to `peers` (indexed by global rank).
pub fn links(src: usize, peers: &[Recipient<Deliver>]) -> Links {
    peers
        .iter()
        .map(|p| {
            Box::new(LocalLink {
                src,
                peer: p.clone(),
            }) as Box<dyn Link<Message> + Send>
        })
        .collect()
}
