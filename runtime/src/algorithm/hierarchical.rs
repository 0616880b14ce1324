//! Hierarchical all-reduce, for a group whose members are on several hosts, several on some:
//! reduce inside each host to its leader (its first member), all-reduce among the leaders (a
//! ring), broadcast inside each host. Only the leaders' messages cross hosts, and each
//! crosses once per ring step; inside a host the messages go through shared memory.
//!
//! ```text
//!   hosts:   A: r0 r1      B: r2 r3          (leaders r0, r2)
//!   reduce:  r1 → r0                r3 → r2   (inside each host, block by block)
//!   ring:         r0 ⇄ r2                     (reduce-scatter + all-gather over the blocks)
//!   bcast:   r0 → r1                r2 → r3
//! ```
//! The tensor is cut into one block per host (segmented like the ring's), so the leaders'
//! ring moves `2(L − 1)/L` of it. A leader combines its members' values in group-rank order
//! (its own first), and every member ends with its leader's copy of the ring's result, which
//! every leader has bit for bit: the result is the same bits on every rank. Sources: MPICH's
//! `MPIR_Allreduce_intra_smp`, Open MPI's `coll/han`, NCCL's tree between nodes.

use super::ring;
use crate::schedule::{partition, recv_copy, recv_reduce, send, Layout, Schedule};

/// Each member's host, as indices `0..L` in order of first appearance, and each host's
/// members in group-rank order.
fn hosts_of(hosts: &[u32]) -> (Vec<usize>, Vec<Vec<usize>>) {
    let mut seen: Vec<u32> = Vec::new();
    let mut of = Vec::with_capacity(hosts.len());
    let mut members: Vec<Vec<usize>> = Vec::new();
    for (m, h) in hosts.iter().enumerate() {
        let i = match seen.iter().position(|s| s == h) {
            Some(i) => i,
            None => {
                seen.push(*h);
                members.push(Vec::new());
                seen.len() - 1
            }
        };
        of.push(i);
        members[i].push(m);
    }
    (of, members)
}

/// Hierarchical all-reduce of `count` elements for member `rank` of a group whose member `m`
/// is on host `hosts[m]`, in segments of at most `seg` elements. With one member per host it
/// is the ring; with one host, a reduce to member 0 and a broadcast from it.
pub fn all_reduce(rank: usize, hosts: &[u32], count: usize, seg: usize) -> Schedule {
    let (of, members) = hosts_of(hosts);
    let l = members.len().max(1);
    let mut s = Schedule::new(Layout::segmented(&partition(count, l), seg));
    let Some(&host) = of.get(rank) else {
        return s;
    };
    let mine = &members[host];
    let leader = mine[0];
    let leaders: Vec<usize> = members.iter().map(|m| m[0]).collect();
    let blocks = s.layout.blocks.len();
    // Tags: the reduce inside a host 0..blocks, the ring from `ring0`, the broadcast from
    // `bcast0` (the ring uses fewer than 2 · L · segments tags).
    let ring0 = blocks as u32;
    let ring_tags = 2 * l * s.layout.segments().max(1);
    let bcast0 = ring0 + ring_tags as u32;
    // 1. Inside the host, block by block: members send, the leader folds them in, in order.
    for b in 0..blocks {
        let chunks = s.layout.chunks_of(b..b + 1);
        if rank == leader {
            let recvs = mine[1..]
                .iter()
                .map(|&m| recv_reduce(m, b as u32, chunks.clone(), false))
                .collect();
            s.step(vec![], recvs);
        } else {
            s.step(vec![send(leader, b as u32, chunks)], vec![]);
        }
    }
    // 2. The leaders' ring (its ranks are leader indices: mapped to group ranks).
    if rank == leader && l > 1 {
        let mut r = Schedule::new(s.layout.clone());
        ring::all_reduce_steps(&mut r, host, l, ring0);
        for mut step in r.steps {
            for op in &mut step.sends {
                op.peer = leaders[op.peer];
            }
            for op in &mut step.recvs {
                op.peer = leaders[op.peer];
            }
            s.step(step.sends, step.recvs);
        }
    }
    // 3. Inside the host: the leader sends the result, block by block.
    for b in 0..blocks {
        let chunks = s.layout.chunks_of(b..b + 1);
        let tag = bcast0 + b as u32;
        if rank == leader {
            let sends = mine[1..]
                .iter()
                .map(|&m| send(m, tag, chunks.clone()))
                .collect();
            s.step(sends, vec![]);
        } else {
            s.step(vec![], vec![recv_copy(leader, tag, chunks)]);
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_leaders_talk_across_hosts() {
        let hosts = [7, 7, 9, 9, 9];
        for rank in 0..hosts.len() {
            let s = all_reduce(rank, &hosts, 1000, 64);
            for step in &s.steps {
                let peers = step
                    .sends
                    .iter()
                    .map(|o| o.peer)
                    .chain(step.recvs.iter().map(|o| o.peer));
                for p in peers {
                    let across = hosts[p] != hosts[rank];
                    assert!(
                        !across || (matches!(rank, 0 | 2) && matches!(p, 0 | 2)),
                        "rank {rank} talks to {p}"
                    );
                }
            }
        }
    }

    #[test]
    fn hosts_are_numbered_in_order_of_first_member() {
        let (of, members) = hosts_of(&[5, 3, 5, 1]);
        assert_eq!(of, vec![0, 1, 0, 2]);
        assert_eq!(members, vec![vec![0, 2], vec![1], vec![3]]);
    }
}
