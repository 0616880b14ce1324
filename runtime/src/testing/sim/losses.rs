//! Losing a rank (killed, isolated, partitioned) and stopping one (a shutdown, a group
//! destroyed or revoked).

use super::trace::TraceEvent;
use super::{Detection, Sim};
use crate::error::{Error, Result};
use crate::group::GroupId;
use std::time::Duration;

impl Sim {
    /// Cuts `rank` off and lets a failure detector notice: see the [module docs](super).
    pub fn isolate(&mut self, rank: usize) {
        self.cut_off(rank, true);
    }

    /// Cuts `rank` off silently (no detector; only timeouts notice): see the
    /// [module docs](super).
    pub fn partition(&mut self, rank: usize) {
        self.cut_off(rank, false);
    }

    fn cut_off(&mut self, rank: usize, detected: bool) {
        if rank >= self.size() || self.is_lost(rank) {
            return;
        }
        self.cut.insert(rank);
        self.log(TraceEvent::Cut { rank, detected });
        self.drop_in_flight(rank);
        if detected {
            for r in 0..self.size() {
                if r == rank || self.dead.contains(&r) {
                    continue;
                }
                for (observer, lost) in [(r, rank), (rank, r)] {
                    let at =
                        self.now + self.opts.detect_after + self.rng.up_to(self.opts.detect_jitter);
                    let tiebreak = self.rng.next_u64();
                    self.detections.push(Detection {
                        at,
                        tiebreak,
                        observer,
                        lost,
                    });
                }
            }
        }
    }

    /// Shuts `rank` down (see [`Engine::shutdown`]): its pending calls fail with `Shutdown`,
    /// and it keeps sending what flow control holds for at most `linger` (the simulator keeps
    /// delivering to it, as a driver does until the engine is drained).
    ///
    /// [`Engine::shutdown`]: crate::Engine::shutdown
    pub fn shutdown(&mut self, rank: usize, linger: Duration) {
        if rank >= self.size() {
            return;
        }
        let now = self.now;
        self.engines[rank].shutdown(now, linger);
        self.drain(rank);
    }

    /// Destroys group `group` on `rank` (see [`Engine::destroy_group`]) and returns its
    /// pending error; the rank keeps running.
    ///
    /// [`Engine::destroy_group`]: crate::Engine::destroy_group
    pub fn destroy_group(&mut self, rank: usize, group: GroupId) -> Result<()> {
        let Some(e) = self.engines.get_mut(rank) else {
            return Err(Error::invalid(format!("no rank {rank}")));
        };
        let r = e.destroy_group(group);
        self.groups.remove(&(rank, group));
        self.drain(rank);
        r
    }

    /// Revokes group `group` on `rank` (see [`Engine::revoke_group`]); the rank keeps
    /// running.
    ///
    /// [`Engine::revoke_group`]: crate::Engine::revoke_group
    pub fn revoke(&mut self, rank: usize, group: GroupId) -> Result<()> {
        let Some(e) = self.engines.get_mut(rank) else {
            return Err(Error::invalid(format!("no rank {rank}")));
        };
        let r = e.revoke_group(group);
        self.drain(rank);
        r
    }

    /// Kills `rank`: its engine stops, its messages are dropped, and every other rank that is
    /// not cut off is told at once, as a reset connection would.
    pub fn kill(&mut self, rank: usize) {
        if rank >= self.size() || self.dead.contains(&rank) {
            return;
        }
        self.dead.insert(rank);
        self.log(TraceEvent::Killed { rank });
        self.drop_in_flight(rank);
        self.detections.retain(|d| d.observer != rank);
        let now = self.now;
        for r in 0..self.size() {
            if !self.is_lost(r) {
                self.log(TraceEvent::Detected {
                    observer: r,
                    lost: rank,
                });
                self.engines[r].handle_peer_lost(rank, now);
                self.drain(r);
            }
        }
    }
}
