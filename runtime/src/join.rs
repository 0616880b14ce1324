//! What a job's ranks decide together when they join, from what each published in the
//! store (its host, whether it listens for shared memory, the transport it was told to use),
//! so that every rank decides alike: the locality of the world group (which algorithm table
//! its calls use), whether the ranks' settings can work together at all, and which
//! transport carries each pair (the rows of a table of transports, tried in order).
//!
//! The actors crate publishes and reads (`actors/src/process.rs`); nothing here does IO.

use crate::error::{Error, Result};
use crate::group::Locality;
use std::collections::{BTreeMap, BTreeSet};

/// The transport a rank was told to use (`COLLECTIX_TRANSPORT`, `InitArgs::transport`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Setting {
    /// Shared memory with the ranks of its host where it can be set up, else TCP.
    Auto,
    /// Shared memory with every rank of its host, or `init` fails.
    Shm,
    /// TCP with every rank.
    Tcp,
}

impl Setting {
    /// As published (and as `COLLECTIX_TRANSPORT` spells it).
    pub fn word(self) -> &'static str {
        match self {
            Setting::Auto => "auto",
            Setting::Shm => "shm",
            Setting::Tcp => "tcp",
        }
    }

    /// From its published word; `None` if it is none.
    pub fn from_word(w: &str) -> Option<Setting> {
        match w {
            "auto" => Some(Setting::Auto),
            "shm" => Some(Setting::Shm),
            "tcp" => Some(Setting::Tcp),
            _ => None,
        }
    }
}

/// What one rank published.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Offer {
    /// Its host's identity.
    pub host: String,
    /// It listens for shared memory (its setting is not `tcp`, and it could bind).
    pub shm: bool,
    /// Its setting.
    pub setting: Setting,
}

/// The world group's locality, the same on every rank (it depends on the offers alone):
/// `Network` across hosts; on one host `Host` if any rank offers shared memory, else
/// `HostTcp`. A rank that asks for shared memory only and a rank of its host that asks for
/// TCP only cannot work together: an error naming both ranks and both settings, which every
/// rank returns (each reads the same offers).
pub fn world_locality(offers: &[Offer]) -> Result<Locality> {
    for (a, x) in offers.iter().enumerate() {
        if x.setting != Setting::Shm {
            continue;
        }
        if let Some(b) = offers
            .iter()
            .position(|y| y.host == x.host && y.setting == Setting::Tcp)
        {
            return Err(Error::invalid(format!(
                "rank {a} asks for shared memory with every rank of its host \
                 (COLLECTIX_TRANSPORT=shm), but rank {b} of that host for TCP with every rank \
                 (COLLECTIX_TRANSPORT=tcp): give the ranks of a host the same setting"
            )));
        }
    }
    let one_host = offers
        .first()
        .is_some_and(|f| offers.iter().all(|o| o.host == f.host));
    Ok(if !one_host {
        Locality::Network
    } else if offers.iter().any(|o| o.shm) {
        Locality::Host
    } else {
        Locality::HostTcp
    })
}

/// A transport's test of a pair (NCCL's `canConnect`): whether it can carry the messages
/// between two ranks, judged from what both published. A table of transports tries its rows
/// in order ([`assign`]).
pub type CanConnect = fn(&Offer, &Offer) -> bool;

/// Shared memory can carry a pair of one host whose ranks both listen for it.
pub fn shm_can_connect(a: &Offer, b: &Offer) -> bool {
    a.host == b.host && a.shm && b.shm
}

/// TCP can carry every pair.
pub fn tcp_can_connect(_: &Offer, _: &Offer) -> bool {
    true
}

/// The row of a table of transports (`rows`, tried in order) that carries each pair of rank
/// `me`, by peer: the first row that can connect the pair both ways, `None` for `me` itself
/// (and for a peer no row can carry). It depends on the two offers alone: rank `a` decides
/// for the pair `(a, b)` what rank `b` decides for `(b, a)`.
pub fn assign(me: usize, offers: &[Offer], rows: &[CanConnect]) -> Vec<Option<usize>> {
    (0..offers.len())
        .map(|peer| {
            if peer == me {
                return None;
            }
            next_row(me, peer, offers, rows, 0)
        })
        .collect()
}

/// The row that carries the pair `(me, peer)` once the rows before `from` could not start
/// it (a row may fail to reach a peer it can connect, as shared memory whose segment could
/// not be mapped): the first row from `from` on that can connect the pair both ways.
pub fn next_row(
    me: usize,
    peer: usize,
    offers: &[Offer],
    rows: &[CanConnect],
    from: usize,
) -> Option<usize> {
    let (a, b) = (offers.get(me)?, offers.get(peer)?);
    (from..rows.len()).find(|&i| rows[i](a, b) && rows[i](b, a))
}

/// The peers of rank `me` of a host with which it uses shared memory: those whose segment
/// it mapped (`mine`) and that mapped its own (each rank published the peers whose segments
/// it mapped: `lists`). A pair uses shared memory only if both sides say so.
pub fn shared_pairs(
    me: usize,
    mine: &BTreeSet<usize>,
    lists: &BTreeMap<usize, BTreeSet<usize>>,
) -> BTreeSet<usize> {
    mine.iter()
        .copied()
        .filter(|p| lists.get(p).is_some_and(|l| l.contains(&me)))
        .collect()
}

/// Whether the world group of a job of `world` ranks gets a board: every rank is on this
/// host (`lists` has one per rank of the host) and every pair of them uses shared memory.
/// Every rank reads every list, so every rank decides alike.
pub fn world_board(world: usize, lists: &BTreeMap<usize, BTreeSet<usize>>) -> bool {
    lists.len() == world
        && lists.iter().all(|(a, l)| {
            lists
                .keys()
                .all(|b| a == b || (l.contains(b) && lists.get(b).is_some_and(|m| m.contains(a))))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offer(host: &str, setting: Setting) -> Offer {
        Offer {
            host: host.into(),
            shm: setting != Setting::Tcp,
            setting,
        }
    }

    #[test]
    fn a_job_is_on_one_host_when_every_rank_published_the_same_identity() {
        let on = |hosts: &[&str]| {
            let offers: Vec<Offer> = hosts.iter().map(|h| offer(h, Setting::Auto)).collect();
            world_locality(&offers)
        };
        let same = ["a/boot/net:[1]", "a/boot/net:[1]", "a/boot/net:[1]"];
        assert_eq!(on(&same), Ok(Locality::Host));
        assert_eq!(on(&["x"]), Ok(Locality::Host));
        assert_eq!(
            on(&["a/boot/net:[1]", "a/boot/net:[2]"]),
            Ok(Locality::Network)
        );
        assert_eq!(on(&[]), Ok(Locality::Network));
    }

    #[test]
    fn one_rank_on_tcp_among_ranks_on_auto_decides_as_they_do() {
        let offers = vec![
            offer("h", Setting::Auto),
            offer("h", Setting::Tcp),
            offer("h", Setting::Auto),
        ];
        assert_eq!(world_locality(&offers), Ok(Locality::Host));
        let tcp = vec![offer("h", Setting::Tcp), offer("h", Setting::Tcp)];
        assert_eq!(world_locality(&tcp), Ok(Locality::HostTcp));
        let apart = vec![offer("h", Setting::Auto), offer("g", Setting::Tcp)];
        assert_eq!(world_locality(&apart), Ok(Locality::Network));
    }

    #[test]
    fn shared_memory_only_against_tcp_only_on_one_host_names_both_ranks() {
        let offers = vec![
            offer("h", Setting::Auto),
            offer("h", Setting::Shm),
            offer("h", Setting::Tcp),
        ];
        let e = world_locality(&offers).map_err(|e| e.to_string());
        assert!(
            matches!(&e, Err(t) if t.contains("rank 1") && t.contains("rank 2") && t.contains("COLLECTIX_TRANSPORT=shm") && t.contains("COLLECTIX_TRANSPORT=tcp")),
            "{e:?}"
        );
        // On different hosts they do not meet.
        let apart = vec![offer("h", Setting::Shm), offer("g", Setting::Tcp)];
        assert_eq!(world_locality(&apart), Ok(Locality::Network));
    }

    #[test]
    fn shared_memory_is_used_by_the_pairs_that_both_mapped_each_other() {
        let set = |v: &[usize]| v.iter().copied().collect::<BTreeSet<usize>>();
        // Rank 2 could not map rank 0's segment.
        let lists: BTreeMap<usize, BTreeSet<usize>> =
            [(0, set(&[1, 2])), (1, set(&[0, 2])), (2, set(&[1]))]
                .into_iter()
                .collect();
        assert_eq!(shared_pairs(0, &lists[&0], &lists), set(&[1]));
        assert_eq!(shared_pairs(2, &lists[&2], &lists), set(&[1]));
        assert!(!world_board(3, &lists), "a pair without shared memory");
        let all: BTreeMap<usize, BTreeSet<usize>> =
            [(0, set(&[1, 2])), (1, set(&[0, 2])), (2, set(&[0, 1]))]
                .into_iter()
                .collect();
        assert!(world_board(3, &all));
        assert!(!world_board(4, &all), "a rank on another host");
    }

    #[test]
    fn each_pair_takes_the_first_transport_that_can_connect_it_alike_on_both_ranks() {
        let rows: [CanConnect; 2] = [shm_can_connect, tcp_can_connect];
        let offers = vec![
            offer("h", Setting::Auto),
            offer("h", Setting::Tcp),
            offer("h", Setting::Shm),
            offer("g", Setting::Auto),
        ];
        // Rank 0: shared memory with rank 2 only (rank 1 does not listen for it, rank 3 is
        // on another host); TCP to the others.
        assert_eq!(
            assign(0, &offers, &rows),
            vec![None, Some(1), Some(0), Some(1)]
        );
        for a in 0..offers.len() {
            for b in 0..offers.len() {
                assert_eq!(
                    assign(a, &offers, &rows)[b],
                    assign(b, &offers, &rows)[a],
                    "ranks {a} and {b} decide their pair alike"
                );
            }
        }
        // A pair shared memory did not reach falls to TCP; after TCP, nothing.
        assert_eq!(next_row(0, 2, &offers, &rows, 1), Some(1));
        assert_eq!(next_row(0, 2, &offers, &rows, 2), None);
        assert_eq!(next_row(0, 9, &offers, &rows, 0), None, "no such rank");
        // A one-way test does not connect a pair.
        let one_way: [CanConnect; 1] = [|a, _| a.setting == Setting::Shm];
        assert_eq!(assign(2, &offers, &one_way), vec![None; 4]);
    }
}
