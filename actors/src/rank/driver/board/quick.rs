//! A call's quick path on the board ([`Driver::board_quick`]): the caller publishes its slot
//! and reads the others' itself, with no queue and no engine lock, when nothing stands in
//! the way.

use super::super::Driver;
use super::{GroupBoard, Ran};
use crate::sync::lock;
use collectix_runtime::board::{BoardCall, Slot};
use collectix_runtime::Output;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// How a call's quick path ended ([`Driver::board_quick`]).
pub(crate) enum Quick {
    /// The call finished: its output.
    Done(Output),
    /// It did not start (nothing published): it is queued as any call.
    NotTaken,
    /// Its slot is published but it did not finish (a member is late, or its slot is wrong):
    /// it is queued as a published call, and ends as any call.
    Published,
}

/// The longest a caller's quick path waits for the other members' slots before its call is
/// queued (and the caller drives the rank as for any call): members that keep in step
/// arrive within a few microseconds of each other.
const QUICK_SPIN: Duration = Duration::from_micros(20);

/// Quick calls of a board above which the next one gives their records to the engine first
/// (a rank whose calls all run on its boards runs no engine otherwise).
const RECORDS_BATCH: usize = 1024;

/// Groups up to this size find their slots on the stack in the quick path.
const STACK_MEMBERS: usize = 8;

impl Driver {
    /// The quick path of call `seq` of `gb`'s group (under the group's issue lock): when no
    /// call of the group is queued on this rank, nothing waits in the rank's inbox, the call's
    /// slot is free and the engine has nothing against the group
    /// ([`Engine::board_clear`](collectix_runtime::Engine::board_clear)), the caller
    /// publishes the slot and reads the other members' slots itself, for a short spin
    /// ([`QUICK_SPIN`], at most the rank's spin budget; none on a thread that runs rank
    /// actors). A call that finishes so takes no
    /// engine lock after that check, no queue, no completion slot; its record goes to the
    /// engine with a later run. Any other outcome (a late member, a slot that names another
    /// call or does not decode) is left to the queued path, which ends it as it ends any call.
    pub(crate) fn board_quick(
        &self,
        gb: &Arc<GroupBoard>,
        ran: &mut Ran,
        seq: u64,
        call: &BoardCall,
    ) -> Quick {
        if ran.calls() >= RECORDS_BATCH {
            self.board_run(|core, _| core.take_ran(gb.info.id, ran));
        }
        let board = &gb.board;
        if !self.inbox.looks_empty()
            || gb.queued.load(Ordering::Acquire) != 0
            || !board.can_publish(seq)
        {
            return Quick::NotTaken;
        }
        // The engine's word on the group, asked under its lock only when something changed
        // since it last said yes (or the calls it said yes to are used up).
        let epoch = self.board_epoch.load(Ordering::Acquire);
        if gb.clear_epoch.load(Ordering::Relaxed) != epoch
            || seq >= gb.clear_until.load(Ordering::Relaxed)
        {
            let core = match self.core.try_lock() {
                Ok(c) => c,
                Err(_) => return Quick::NotTaken,
            };
            let until = if core.quiesced {
                None
            } else {
                core.engine.board_clear(gb.info.id, seq)
            };
            let Some(until) = until else {
                return Quick::NotTaken;
            };
            gb.clear_until.store(until, Ordering::Relaxed);
            gb.clear_epoch.store(epoch, Ordering::Relaxed);
        }
        let at = self.now();
        if board
            .publish(seq, call.fingerprint_bytes(), call.payload())
            .is_err()
        {
            return Quick::NotTaken;
        }
        // No fence after the publish: its store may still be on its way to the other cores
        // (a fence would wait for it, the length of a cache line's trip, on every call). A
        // member that waits for this slot with nobody driving it is seen here if its state
        // is visible already, on the spin's looks, or at the latest by the fenced look that
        // ends this path either way (finished, or queued): with the waiting member's own
        // fence between its state and its last look at this slot, one of the two sees the
        // other (`board_leave`).
        gb.look_at_others(&self.boards.owed);
        let n = board.size();
        let mut stack = [None; STACK_MEMBERS];
        let mut heap = Vec::new();
        let slots: &mut [Option<Slot>] = if n <= STACK_MEMBERS {
            &mut stack[..n]
        } else {
            heap.resize(n, None);
            &mut heap
        };
        // On a thread that runs rank actors, one look and no spin (a `Work` polled there
        // does not spin either: the thread is a rank's background driver).
        let budget = if crate::rank::on_rank_thread() {
            Duration::ZERO
        } else {
            self.spin.min(QUICK_SPIN)
        };
        let mut since: Option<std::time::Instant> = None;
        let mut turns: u32 = 0;
        let out = loop {
            if let Some(r) = board.look(call, &gb.info, seq, true, slots) {
                break r;
            }
            turns = turns.wrapping_add(1);
            if budget.is_zero() {
                return self.quick_queued(gb);
            }
            if turns.is_multiple_of(64) {
                gb.look_at_others(&self.boards.owed);
                let t0 = *since.get_or_insert_with(std::time::Instant::now);
                if t0.elapsed() >= budget {
                    return self.quick_queued(gb);
                }
            }
            self.pause_quick(turns);
        };
        // Another call in a slot, or a slot that is not one: ended by the queued path, as
        // any call that fails.
        let Ok(out) = out else {
            return self.quick_queued(gb);
        };
        board.finish(seq);
        gb.wake_others(&self.boards.owed);
        self.boards.owed.flush();
        ran.push(seq, call.fingerprint(), at);
        // The issue lock is held: nobody else writes `listed`.
        if !gb.listed.load(Ordering::Relaxed) {
            gb.listed.store(true, Ordering::Relaxed);
            let mut list = lock(&self.boards.ran);
            list.push(gb.clone());
            self.boards.ran_any.store(true, Ordering::Release);
        }
        Quick::Done(out)
    }

    /// A quick path that published its slot ends without the call: the fenced look at the
    /// other members that its publish owes them (see [`board_quick`](Self::board_quick)).
    fn quick_queued(&self, gb: &GroupBoard) -> Quick {
        gb.wake_others(&self.boards.owed);
        Quick::Published
    }
}
