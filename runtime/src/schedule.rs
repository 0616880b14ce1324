//! Schedules: what one rank sends and receives, step by step, for one call.
//!
//! A call's data is cut into *chunks* (a [`Layout`]); the collective groups chunks into
//! *blocks* (one per rank for all_gather, the segments of a tensor for broadcast, …). An
//! algorithm turns a layout into [`Step`]s of primitive sends and receives, like NCCL's
//! `send`/`recvReduceSend`/`recvCopySend`. The engine runs the steps in order: it posts a
//! step's sends (reading chunks as the previous step left them), waits until every receive
//! of the step has arrived, applies them in the listed order, and moves on. Messages that
//! arrive early wait, so the result never depends on arrival order.

use crate::fast_hash::FastMap;
use crate::op::{Algorithm, OpKind};
use std::ops::Range;
// Plain std locks: the cache is a planning aid outside the protocol the loom models check.
use crate::sync::unmodelled::{Mutex, MutexGuard};
use std::sync::Arc;

/// How a call's elements are cut into chunks, and how chunks group into blocks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Layout {
    /// Elements in each chunk.
    pub chunk_elems: Vec<usize>,
    /// The chunks of each block, in order.
    pub blocks: Vec<Range<usize>>,
}

/// The most segments a pipelined layout cuts one block into.
pub const MAX_SEGMENTS: usize = 1 << 14;

impl Layout {
    /// Each block of `block_elems` elements cut into the same number of segments, that
    /// number chosen so that the largest block's segments hold at most `seg_elems` elements.
    /// At most [`MAX_SEGMENTS`] segments per block, whatever the sizes (segments grow beyond
    /// `seg_elems` instead), so that no size can make the layout itself huge.
    pub fn segmented(block_elems: &[usize], seg_elems: usize) -> Layout {
        let largest = block_elems.iter().copied().max().unwrap_or(0);
        let segs = largest.div_ceil(seg_elems.max(1)).clamp(1, MAX_SEGMENTS);
        let mut layout = Layout::default();
        for &n in block_elems {
            let start = layout.chunk_elems.len();
            layout.chunk_elems.extend(partition(n, segs));
            layout.blocks.push(start..start + segs);
        }
        layout
    }

    /// One chunk per block.
    pub fn blocks(block_elems: &[usize]) -> Layout {
        Layout::segmented(block_elems, usize::MAX)
    }

    /// Segments per block (all blocks have the same number).
    pub fn segments(&self) -> usize {
        self.blocks.first().map_or(0, |b| b.len())
    }

    /// The chunks of blocks `range`, which are contiguous.
    pub fn chunks_of(&self, blocks: Range<usize>) -> Range<usize> {
        if blocks.is_empty() {
            return 0..0;
        }
        self.blocks[blocks.start].start..self.blocks[blocks.end - 1].end
    }

    /// Chunk `seg` of block `block`.
    pub fn chunk(&self, block: usize, seg: usize) -> Range<usize> {
        let c = self.blocks[block].start + seg;
        c..c + 1
    }

    /// Total elements.
    pub fn total(&self) -> usize {
        self.chunk_elems.iter().sum()
    }
}

/// `n` split into `parts` near-equal parts (the first `n % parts` one larger).
pub fn partition(n: usize, parts: usize) -> Vec<usize> {
    if parts == 0 {
        return Vec::new();
    }
    (0..parts)
        .map(|i| n / parts + usize::from(i < n % parts))
        .collect()
}

/// What a receive does with the arriving chunks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Replace the local chunks.
    Copy,
    /// Combine with the local chunks; `remote_first` puts the received operand on the left,
    /// which lets algorithms fix one reduction order on every rank.
    Reduce {
        /// Whether the received value is the left operand.
        remote_first: bool,
    },
}

/// Send chunks to a peer (group-local rank) under a tag.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SendOp {
    /// Destination, group-local.
    pub peer: usize,
    /// The tag the receiver matches on.
    pub tag: u32,
    /// The chunks sent, one payload part each.
    pub chunks: Range<usize>,
}

/// Receive chunks from a peer under a tag.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecvOp {
    /// Source, group-local.
    pub peer: usize,
    /// The tag to match.
    pub tag: u32,
    /// The chunks received, one payload part each.
    pub chunks: Range<usize>,
    /// Copy or reduce.
    pub action: Action,
}

/// One step: sends posted together, then receives applied together (in order).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Step {
    /// Sends, posted at the start of the step.
    pub sends: Vec<SendOp>,
    /// Receives; the step ends when all have arrived.
    pub recvs: Vec<RecvOp>,
}

/// A layout and the steps one rank runs over it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Schedule {
    /// The chunking.
    pub layout: Layout,
    /// The steps, in order.
    pub steps: Vec<Step>,
}

impl Schedule {
    /// A schedule with no steps over `layout`.
    pub fn new(layout: Layout) -> Schedule {
        Schedule {
            layout,
            steps: Vec::new(),
        }
    }

    /// Appends a step (steps with nothing in them are dropped).
    pub fn step(&mut self, sends: Vec<SendOp>, recvs: Vec<RecvOp>) {
        if !sends.is_empty() || !recvs.is_empty() {
            self.steps.push(Step { sends, recvs });
        }
    }

    /// Every `(peer, tag)` this schedule receives from.
    pub fn expected(&self) -> impl Iterator<Item = (usize, u32)> + '_ {
        self.steps
            .iter()
            .flat_map(|s| s.recvs.iter().map(|r| (r.peer, r.tag)))
    }
}

/// Send helper.
pub(crate) fn send(peer: usize, tag: u32, chunks: Range<usize>) -> SendOp {
    SendOp { peer, tag, chunks }
}

/// Receive-and-copy helper.
pub(crate) fn recv_copy(peer: usize, tag: u32, chunks: Range<usize>) -> RecvOp {
    RecvOp {
        peer,
        tag,
        chunks,
        action: Action::Copy,
    }
}

/// Receive-and-reduce helper.
pub(crate) fn recv_reduce(
    peer: usize,
    tag: u32,
    chunks: Range<usize>,
    remote_first: bool,
) -> RecvOp {
    RecvOp {
        peer,
        tag,
        chunks,
        action: Action::Reduce { remote_first },
    }
}

/// What a cached schedule depends on besides the group member that planned it: the
/// collective, its algorithm, the element count, the segment size of a pipelined
/// algorithm (0 if none) and the root (0 if none).
pub type ScheduleKey = (OpKind, Algorithm, usize, usize, usize);

/// The schedules one member of one group planned for its recent calls, shared by the calls
/// that need the same one (a schedule is immutable once built). A communicator keeps one per
/// group, so the rank and the group size are fixed; the key says the rest. At most
/// [`ScheduleCache::KEPT`] are kept: a call of a new shape beyond that empties the cache.
#[derive(Debug, Default)]
pub struct ScheduleCache {
    kept: Mutex<FastMap<ScheduleKey, Arc<Schedule>>>,
}

impl ScheduleCache {
    /// Schedules kept at most.
    pub const KEPT: usize = 64;

    /// The schedule kept under `key`, or the one `make` builds (then kept).
    pub fn get_or_make(&self, key: ScheduleKey, make: impl FnOnce() -> Schedule) -> Arc<Schedule> {
        if let Some(s) = self.lock().get(&key) {
            return s.clone();
        }
        // Built outside the lock: a large schedule takes a while, and a concurrent call of
        // the same shape builds an equal one.
        let s = Arc::new(make());
        let mut kept = self.lock();
        if kept.len() >= Self::KEPT {
            kept.clear();
        }
        kept.insert(key, s.clone());
        s
    }

    fn lock(&self) -> MutexGuard<'_, FastMap<ScheduleKey, Arc<Schedule>>> {
        self.kept.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cache_builds_each_shape_once_and_keeps_at_most_kept() {
        let cache = ScheduleCache::default();
        let mut built = 0;
        let key = |n| (OpKind::AllReduce, Algorithm::Ring, n, 0, 0);
        let a = cache.get_or_make(key(1), || {
            built += 1;
            Schedule::new(Layout::default())
        });
        let b = cache.get_or_make(key(1), || {
            built += 1;
            Schedule::new(Layout::default())
        });
        assert!(
            Arc::ptr_eq(&a, &b),
            "the second call shares the first's schedule"
        );
        assert_eq!(built, 1);
        for n in 2..=ScheduleCache::KEPT + 1 {
            cache.get_or_make(key(n), || Schedule::new(Layout::default()));
        }
        assert!(cache.lock().len() <= ScheduleCache::KEPT);
        let c = cache.get_or_make(key(1), || {
            built += 1;
            Schedule::new(Layout::default())
        });
        assert_eq!(built, 2, "emptied when full: built again");
        assert!(!Arc::ptr_eq(&a, &c));
    }

    #[test]
    fn partitions_and_segments() {
        assert_eq!(partition(10, 4), vec![3, 3, 2, 2]);
        assert_eq!(partition(2, 4), vec![1, 1, 0, 0]);
        let l = Layout::segmented(&[10, 3], 4);
        assert_eq!(l.segments(), 3);
        assert_eq!(l.chunk_elems, vec![4, 3, 3, 1, 1, 1]);
        assert_eq!(l.chunks_of(0..2), 0..6);
        assert_eq!(l.chunk(1, 2), 5..6);
        assert_eq!(Layout::segmented(&[0, 0], 8).segments(), 1);
    }
}
