//! Pairwise-exchange all-to-all: in step k (1 ≤ k < W) rank r sends its block for rank r+k
//! and receives rank r−k's block for it. Blocks may differ in size (`all_to_all` with uneven
//! splits); the receiver checks every size against what it expects.
//! Source: Thakur, Rabenseifner & Gropp (IJHPCA 2005), §3.
//!
//! ```text
//!   layout: blocks 0..W are what this rank sends, W..2W what it receives
//!   step k: send block (r+k) to r+k, receive block W+(r−k) from r−k
//! ```

use super::back;
use crate::schedule::{recv_copy, send, Layout, Schedule};

/// Pairwise all-to-all; `send_elems[p]` go to rank p, `recv_elems[p]` come from it.
pub fn all_to_all(rank: usize, w: usize, send_elems: &[usize], recv_elems: &[usize]) -> Schedule {
    let blocks: Vec<usize> = send_elems.iter().chain(recv_elems).copied().collect();
    let mut s = Schedule::new(Layout::blocks(&blocks));
    for k in 1..w {
        let to = (rank + k) % w;
        let from = back(rank, k, w);
        s.step(
            vec![send(to, k as u32, to..to + 1)],
            vec![recv_copy(from, k as u32, w + from..w + from + 1)],
        );
    }
    s
}
