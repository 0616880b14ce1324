//! Dissemination barrier: in round k every rank signals rank + 2^k and waits for rank − 2^k;
//! after ⌈log2 W⌉ rounds every rank has heard, directly or not, from every other.
//! Source: Hensgen, Finkel & Manber, "Two algorithms for barrier synchronization" (1988).
//!
//! ```text
//!   W = 5   round 0: r → r+1   round 1: r → r+2   round 2: r → r+4
//! ```

use super::back;
use crate::schedule::{recv_copy, send, Layout, Schedule};

/// Dissemination barrier (messages carry no payload).
pub fn barrier(rank: usize, w: usize) -> Schedule {
    let mut s = Schedule::new(Layout::default());
    let (mut dist, mut tag) = (1, 0);
    while dist < w {
        s.step(
            vec![send((rank + dist) % w, tag, 0..0)],
            vec![recv_copy(back(rank, dist, w), tag, 0..0)],
        );
        dist *= 2;
        tag += 1;
    }
    s
}
