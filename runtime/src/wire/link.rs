//! The transport seam: a [`Link`] carries messages one way to one peer and may say "would
//! block" (a socket's send buffer is full, a shared-memory ring has no free slot); the
//! driver keeps what a link refused in an [`Outbox`], in order, and retries when the link
//! can take more. A link that is gone says so; the driver then tells the engine the peer is
//! lost (`Engine::handle_peer_lost`). The receiving side stamps each message's source from
//! the link it came on, never from the message's bytes.
//!
//! The in-process transport, the simulator (whose links say "would block" at random) and
//! the socket transports all sit behind this seam.

use std::collections::VecDeque;

/// Why a link did not take an item.
#[derive(Debug, PartialEq, Eq)]
pub enum LinkError<T> {
    /// Not now; the item is handed back. Retry once the link can take more.
    WouldBlock(T),
    /// The link is gone (the peer's process, thread or connection ended).
    Closed,
}

/// A one-way link to one peer.
pub trait Link<T> {
    /// Sends `item`, or hands it back if the link cannot take it now.
    fn try_send(&mut self, item: T) -> Result<(), LinkError<T>>;

    /// Makes sure the peer can be reached, within `within`: a link made on demand (a lazy
    /// connection) that has nothing yet starts making it now, and one that cannot be made
    /// in time says its peer is lost, as a broken link does. Returns at once. By default
    /// nothing: the link exists and is watched already.
    fn probe(&mut self, within: std::time::Duration) {
        let _ = within;
    }

    /// Whether the link is still being made (a probe, or a first message, started it): its
    /// peer is neither reached nor lost yet.
    fn is_connecting(&self) -> bool {
        false
    }
}

/// The link to the peer is gone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Closed;

/// What waits in front of one link: items the link refused, sent in order once it takes
/// more (an item never overtakes one queued before it).
#[derive(Debug)]
pub struct Outbox<T> {
    queue: VecDeque<T>,
}

impl<T> Default for Outbox<T> {
    fn default() -> Self {
        Outbox {
            queue: VecDeque::new(),
        }
    }
}

impl<T> Outbox<T> {
    /// Sends `item` through `link`, or queues it behind what is already waiting.
    pub fn send<L: Link<T> + ?Sized>(&mut self, link: &mut L, item: T) -> Result<(), Closed> {
        if !self.queue.is_empty() {
            self.queue.push_back(item);
            return Ok(());
        }
        match link.try_send(item) {
            Ok(()) => Ok(()),
            Err(LinkError::WouldBlock(item)) => {
                self.queue.push_back(item);
                Ok(())
            }
            Err(LinkError::Closed) => Err(Closed),
        }
    }

    /// Sends what waits, in order, until the link would block; returns how many went.
    pub fn flush<L: Link<T> + ?Sized>(&mut self, link: &mut L) -> Result<usize, Closed> {
        let mut sent = 0;
        while let Some(item) = self.queue.pop_front() {
            match link.try_send(item) {
                Ok(()) => sent += 1,
                Err(LinkError::WouldBlock(item)) => {
                    self.queue.push_front(item);
                    break;
                }
                Err(LinkError::Closed) => {
                    // Nothing queued can reach the peer any more; a later send tries the link
                    // again (and finds it closed) instead of queueing behind dead items.
                    self.queue.clear();
                    return Err(Closed);
                }
            }
        }
        Ok(sent)
    }

    /// Items waiting.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Drops what waits (the peer is gone).
    pub fn clear(&mut self) {
        self.queue.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Takes `room` items, then would block; `closed` refuses everything.
    struct Fake {
        room: usize,
        got: Vec<u32>,
        closed: bool,
    }

    impl Link<u32> for Fake {
        fn try_send(&mut self, item: u32) -> Result<(), LinkError<u32>> {
            if self.closed {
                return Err(LinkError::Closed);
            }
            if self.room == 0 {
                return Err(LinkError::WouldBlock(item));
            }
            self.room -= 1;
            self.got.push(item);
            Ok(())
        }
    }

    #[test]
    fn refused_items_wait_in_order_and_nothing_overtakes_them() {
        let mut link = Fake {
            room: 1,
            got: Vec::new(),
            closed: false,
        };
        let mut o = Outbox::default();
        for i in 0..4 {
            assert_eq!(o.send(&mut link, i), Ok(()));
        }
        assert_eq!((link.got.clone(), o.len()), (vec![0], 3));
        link.room = 2;
        assert_eq!(o.flush(&mut link), Ok(2));
        // The link has room again, but 3 still waits: 4 queues behind it.
        assert_eq!(o.send(&mut link, 4), Ok(()));
        link.room = 10;
        assert_eq!(o.flush(&mut link), Ok(2));
        assert_eq!(link.got, vec![0, 1, 2, 3, 4]);
        assert!(o.is_empty());
        link.closed = true;
        assert_eq!(o.send(&mut link, 5), Err(Closed));
        // A link that closes while items wait: they are dropped, and the next send tries the
        // link (and learns it is closed) instead of queueing silently.
        let mut link = Fake {
            room: 0,
            got: Vec::new(),
            closed: false,
        };
        let mut o = Outbox::default();
        assert_eq!(o.send(&mut link, 1), Ok(()));
        assert_eq!(o.send(&mut link, 2), Ok(()));
        link.closed = true;
        assert_eq!(o.flush(&mut link), Err(Closed));
        assert!(o.is_empty());
        assert_eq!(o.send(&mut link, 3), Err(Closed));
    }
}
