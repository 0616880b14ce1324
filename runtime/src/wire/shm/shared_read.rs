//! A large read of another process's memory shared among the threads of the receiving
//! process.
//!
//! One thread reads a ring at a time; a remote part it comes to (a payload in the sender's
//! shared heap, or read with `process_vm_readv`) of [`SPLIT_MIN`] bytes or more is cut into
//! pieces of [`PIECE`] bytes, each its own claim on the destination (an [`ArenaPart`]): the
//! reading thread posts the [`SharedRead`] where the process's other threads look (the shared
//! memory transport's progress thread and its waiting callers), and every thread that finds
//! it takes pieces until none is left. So a receiver whose peer copies nothing (the sender's
//! tensor is in its heap, or is read in place) copies with every core it has, where one
//! thread would copy alone. The reading thread acknowledges the record, and hands the part
//! on, only once every piece is written ([`SharedRead::finished`]): the sender's memory is
//! read before it is released, and the destination is read only once frozen whole.
//!
//! Like the pool and the arenas it writes, this stays outside the loom model
//! (`crate::sync::unmodelled`): its only ordering is a counter each piece decrements after its
//! bytes are written, read with `Acquire` before the whole is frozen.

use super::frames::RemoteRead;
use crate::sync::unmodelled::{AtomicUsize, Mutex, Ordering};
use crate::tensor::arena::ArenaPart;
use std::sync::Arc;

/// Remote parts from this size up are read by every thread that helps.
pub const SPLIT_MIN: usize = 8 << 20;

/// The size of one piece (a thread's turn); small under Miri, whose tests read a few pieces.
pub const PIECE: usize = if cfg!(miri) { 4 << 10 } else { 1 << 20 };

/// The sender's memory as every thread of the receiving process may read it.
pub type SharedRemote = Arc<dyn RemoteRead + Send + Sync>;

/// One remote part being read by several threads (module doc).
pub struct SharedRead {
    remote: SharedRemote,
    /// The pieces nobody took yet: where each is in the sender, and its place here.
    pieces: Mutex<Vec<(u64, ArenaPart)>>,
    /// Pieces not yet written (taken or not).
    left: AtomicUsize,
    /// Why a piece could not be read (the first reason).
    failed: Mutex<Option<String>>,
}

impl SharedRead {
    /// The read of the `len` bytes at the sender's `addr` into `into` (whose length is
    /// `len`), in pieces; `None` if an address runs past the end of memory.
    pub fn new(remote: SharedRemote, addr: u64, into: ArenaPart) -> Option<SharedRead> {
        let start = into.range().start;
        let mut pieces = Vec::new();
        for p in into.split(PIECE) {
            let from = addr.checked_add((p.range().start - start) as u64)?;
            pieces.push((from, p));
        }
        // Taken from the end: the first piece last, so the reading thread, which starts
        // first, and its helpers work from opposite ends of the part's cache lines.
        pieces.reverse();
        Some(SharedRead {
            remote,
            left: AtomicUsize::new(pieces.len()),
            pieces: Mutex::new(pieces),
            failed: Mutex::new(None),
        })
    }

    /// Reads one piece, if any is left untaken; whether it took one.
    pub fn help(&self) -> bool {
        let next = self.pieces.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let Some((addr, mut part)) = next else {
            return false;
        };
        match self.remote.read(addr, part.bytes_mut()) {
            // Frozen: its range is read later as part of the whole.
            Ok(()) => drop(part.freeze()),
            Err(why) => {
                // The part stays claimed, unfrozen: the whole is never read.
                let mut f = self.failed.lock().unwrap_or_else(|e| e.into_inner());
                f.get_or_insert(why);
            }
        }
        self.left.fetch_sub(1, Ordering::Release);
        true
    }

    /// Every piece is written (or failed).
    pub fn finished(&self) -> bool {
        self.left.load(Ordering::Acquire) == 0
    }

    /// Why a piece failed, once [`finished`](SharedRead::finished).
    pub fn failure(&self) -> Option<String> {
        self.failed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::arena::Arena;
    use crate::tensor::pool::Pool;

    /// A sender's memory: `mem` at address 0x1000, reads counted by thread.
    struct Mem {
        mem: Vec<u8>,
        threads: crate::sync::unmodelled::Mutex<std::collections::HashSet<std::thread::ThreadId>>,
    }

    impl RemoteRead for Mem {
        fn read(&self, addr: u64, dst: &mut [u8]) -> Result<(), String> {
            let at = (addr as usize)
                .checked_sub(0x1000)
                .ok_or("below the memory")?;
            let src = self.mem.get(at..at + dst.len()).ok_or("past the memory")?;
            dst.copy_from_slice(src);
            if let Ok(mut t) = self.threads.lock() {
                t.insert(std::thread::current().id());
            }
            Ok(())
        }
    }

    fn mem(len: usize) -> Arc<Mem> {
        Arc::new(Mem {
            mem: (0..len).map(|i| (i % 251) as u8).collect(),
            threads: Default::default(),
        })
    }

    #[test]
    fn pieces_read_by_several_threads_make_the_whole_part() {
        let len = 5 * PIECE + 123;
        let m = mem(len + 7);
        let pool = Pool::none();
        let arena = Arena::new(&pool, len + 16);
        let part = arena.claim(16..16 + len);
        let job = part
            .and_then(|p| SharedRead::new(m.clone(), 0x1000 + 7, p))
            .map(Arc::new);
        let Some(job) = job else {
            panic!("the read was refused");
        };
        std::thread::scope(|s| {
            for _ in 0..3 {
                let job = job.clone();
                s.spawn(move || while job.help() {});
            }
            while job.help() {}
        });
        assert!(job.finished());
        assert_eq!(job.failure(), None);
        let whole = arena.frozen(16..16 + len).map(|b| b.to_vec());
        assert_eq!(whole.as_deref(), m.mem.get(7..7 + len));
        assert!(!job.help(), "nothing is left");
    }

    #[test]
    fn a_piece_that_fails_fails_the_read_and_the_whole_is_never_read() {
        let len = 3 * PIECE;
        // The sender's memory ends a piece early: the last piece cannot be read.
        let m = mem(2 * PIECE);
        let pool = Pool::none();
        let arena = Arena::new(&pool, len);
        let job = arena
            .claim(0..len)
            .and_then(|p| SharedRead::new(m, 0x1000, p));
        let Some(job) = job else {
            panic!("the read was refused");
        };
        while job.help() {}
        assert!(job.finished());
        assert!(job.failure().is_some_and(|w| w.contains("past the memory")));
        assert!(
            arena.frozen(0..len).is_none(),
            "the failed piece is never read"
        );
    }

    #[test]
    fn an_address_that_overflows_is_refused() {
        let pool = Pool::none();
        let arena = Arena::new(&pool, 2 * PIECE);
        let job = arena
            .claim(0..2 * PIECE)
            .and_then(|p| SharedRead::new(mem(16), u64::MAX - 10, p));
        assert!(job.is_none());
    }
}
