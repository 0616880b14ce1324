//! A rank's links and what waits in front of them ([`LinkTable`]), kept in proportion to the
//! peers it talks to: a rank of a world of thousands in one process holds the links it has
//! used, not one per rank of the world (a world of W ranks would hold W² of them), and an
//! outbox only for a link that refused a message.

use super::Links;
use collectix_runtime::fast_hash::FastMap;
use collectix_runtime::wire::{Closed, Link, LinkError, Message, Outbox};

/// One link, boxed.
pub(crate) type BoxedLink = Box<dyn Link<Message> + Send>;

/// Makes the link to a global rank on first use (`None`: no such rank).
pub(crate) type MakeLink = Box<dyn Fn(usize) -> Option<BoxedLink> + Send>;

/// A rank's links by global rank: those given at the start (a process's mesh), those made on
/// first use (the ranks of one process), and those replaced since (a cut, a restarted peer).
pub(crate) struct LinkTable {
    made: FastMap<usize, BoxedLink>,
    make: Option<MakeLink>,
    /// Messages waiting in front of links that refused them, by global rank; no entry for a
    /// link with nothing waiting.
    outboxes: FastMap<usize, Outbox<Message>>,
}

impl LinkTable {
    /// The links given, one per global rank.
    pub(crate) fn given(links: Links) -> LinkTable {
        LinkTable {
            made: links.into_iter().enumerate().collect(),
            make: None,
            outboxes: FastMap::default(),
        }
    }

    /// Links made by `make` when first used.
    pub(crate) fn lazy(make: MakeLink) -> LinkTable {
        LinkTable {
            made: FastMap::default(),
            make: Some(make),
            outboxes: FastMap::default(),
        }
    }

    /// The link to `peer`, made now if it was not yet.
    pub(crate) fn get_mut(&mut self, peer: usize) -> Option<&mut BoxedLink> {
        link(&mut self.made, self.make.as_ref(), peer)
    }

    /// The link to `peer` if it was made.
    pub(crate) fn get(&self, peer: usize) -> Option<&BoxedLink> {
        self.made.get(&peer)
    }

    /// Sends `msg` to `dst`, or queues it behind what waits for that link (a message never
    /// overtakes one queued before it). `Closed`: the link is gone (or there is no such
    /// rank).
    pub(crate) fn send(&mut self, dst: usize, msg: Message) -> Result<(), Closed> {
        let Some(l) = link(&mut self.made, self.make.as_ref(), dst) else {
            return Err(Closed);
        };
        if let Some(o) = self.outboxes.get_mut(&dst) {
            return o.send(l.as_mut(), msg);
        }
        match l.try_send(msg) {
            Ok(()) => Ok(()),
            Err(LinkError::Closed) => Err(Closed),
            Err(LinkError::WouldBlock(msg)) => {
                let o = self.outboxes.entry(dst).or_default();
                let sent = o.send(l.as_mut(), msg);
                if o.is_empty() {
                    self.outboxes.remove(&dst);
                }
                sent
            }
        }
    }

    /// Sends what waits for `peer`'s link until it would block.
    pub(crate) fn flush(&mut self, peer: usize) -> Result<(), Closed> {
        let Some(o) = self.outboxes.get_mut(&peer) else {
            return Ok(());
        };
        let Some(l) = link(&mut self.made, self.make.as_ref(), peer) else {
            return Ok(());
        };
        let sent = o.flush(l.as_mut());
        if o.is_empty() {
            self.outboxes.remove(&peer);
        }
        sent.map(|_| ())
    }

    /// Replaces `peer`'s link with `link`; what waited for the old one is dropped.
    pub(crate) fn replace(&mut self, peer: usize, link: BoxedLink) {
        self.made.insert(peer, link);
        self.outboxes.remove(&peer);
    }

    /// Drops what waits for `peer`'s link (the peer is gone).
    pub(crate) fn clear(&mut self, peer: usize) {
        self.outboxes.remove(&peer);
    }

    /// Messages waiting in front of links, over all peers.
    pub(crate) fn queued(&self) -> usize {
        self.outboxes.values().map(Outbox::len).sum()
    }

    /// Whether no message waits in front of any link.
    pub(crate) fn all_sent(&self) -> bool {
        self.outboxes.values().all(Outbox::is_empty)
    }
}

/// The link to `peer` in `made`, made with `make` if it is not there yet.
fn link<'a>(
    made: &'a mut FastMap<usize, BoxedLink>,
    make: Option<&MakeLink>,
    peer: usize,
) -> Option<&'a mut BoxedLink> {
    use std::collections::hash_map::Entry;
    match made.entry(peer) {
        Entry::Occupied(e) => Some(e.into_mut()),
        Entry::Vacant(e) => Some(e.insert(make?(peer)?)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use collectix_runtime::wire::Header;
    use collectix_runtime::GroupId;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    /// A message numbered `n` (in its credit count).
    fn msg(n: u64) -> Message {
        Message {
            src: 0,
            header: Header::Credit {
                group: GroupId::WORLD,
                calls: n,
            },
            payload: Vec::new(),
        }
    }

    fn number(m: &Message) -> u64 {
        match m.header {
            Header::Credit { calls, .. } => calls,
            _ => u64::MAX,
        }
    }

    /// Takes what `room` allows (then would block), records what it took; `closed`
    /// refuses everything.
    struct Fake {
        room: Arc<AtomicUsize>,
        took: Arc<Mutex<Vec<u64>>>,
        closed: bool,
    }

    impl Link<Message> for Fake {
        fn try_send(&mut self, m: Message) -> Result<(), LinkError<Message>> {
            if self.closed {
                return Err(LinkError::Closed);
            }
            if self.room.load(Ordering::SeqCst) == 0 {
                return Err(LinkError::WouldBlock(m));
            }
            self.room.fetch_sub(1, Ordering::SeqCst);
            self.took
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(number(&m));
            Ok(())
        }
    }

    #[test]
    fn a_lazy_table_makes_each_link_once_on_first_use_and_only_for_ranks_it_has() {
        let made = Arc::new(AtomicUsize::new(0));
        let room = Arc::new(AtomicUsize::new(usize::MAX));
        let took = Arc::new(Mutex::new(Vec::new()));
        let (m, r, t) = (made.clone(), room.clone(), took.clone());
        let mut table = LinkTable::lazy(Box::new(move |p| {
            (p < 4096).then(|| {
                m.fetch_add(1, Ordering::SeqCst);
                Box::new(Fake {
                    room: r.clone(),
                    took: t.clone(),
                    closed: false,
                }) as BoxedLink
            })
        }));
        assert_eq!(made.load(Ordering::SeqCst), 0);
        for n in 0..3 {
            assert_eq!(table.send(7, msg(n)), Ok(()));
        }
        assert_eq!(table.send(4095, msg(3)), Ok(()));
        assert_eq!(made.load(Ordering::SeqCst), 2, "one link per peer used");
        assert_eq!(table.send(4096, msg(4)), Err(Closed), "no such rank");
        assert!(table.get(8).is_none());
        assert_eq!(
            *took.lock().unwrap_or_else(|p| p.into_inner()),
            [0, 1, 2, 3]
        );
    }

    #[test]
    fn what_a_link_refuses_waits_in_order_and_a_replaced_link_drops_it() {
        let room = Arc::new(AtomicUsize::new(1));
        let took = Arc::new(Mutex::new(Vec::new()));
        let fake = |closed| {
            Box::new(Fake {
                room: room.clone(),
                took: took.clone(),
                closed,
            }) as BoxedLink
        };
        let mut table = LinkTable::given(vec![fake(false), fake(false)]);
        for n in 0..4 {
            assert_eq!(table.send(1, msg(n)), Ok(()));
        }
        assert_eq!(table.queued(), 3);
        assert!(!table.all_sent());
        room.store(2, Ordering::SeqCst);
        // A new message never overtakes those waiting.
        assert_eq!(table.send(1, msg(4)), Ok(()));
        assert_eq!(table.flush(1), Ok(()));
        assert_eq!(table.queued(), 2);
        room.store(usize::MAX, Ordering::SeqCst);
        assert_eq!(table.flush(1), Ok(()));
        assert!(table.all_sent());
        assert_eq!(
            *took.lock().unwrap_or_else(|p| p.into_inner()),
            [0, 1, 2, 3, 4]
        );
        // What waits for a link that is replaced is dropped; a closed link says so.
        room.store(0, Ordering::SeqCst);
        assert_eq!(table.send(0, msg(5)), Ok(()));
        assert_eq!(table.queued(), 1);
        table.replace(0, fake(true));
        assert_eq!(table.queued(), 0);
        assert_eq!(table.send(0, msg(6)), Err(Closed));
    }
}
