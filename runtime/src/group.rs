//! Process groups: identity, membership, and per-group options.

use crate::error::{Error, Result};
use crate::fast_hash::FastMap;
pub use crate::ids::{fnv1a, GroupId};
use crate::op::{Algorithm, OpKind};
use std::sync::Arc;
use std::time::Duration;

/// Where a group's ranks live, which decides the algorithms chosen by default (see
/// `collective::select`): the best schedule for ranks that share memory is not the best
/// for ranks that talk over sockets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Locality {
    /// Ranks in separate processes (TCP), on more than one host or on hosts not known to be
    /// one: every byte sent is a byte carried, and a step costs a link's latency.
    #[default]
    Network,
    /// Ranks in separate processes of one host (every rank published the same host
    /// identity; set by a multi-process job) whose messages go through shared memory, on
    /// cores the ranks share (over TCP only: [`Locality::HostTcp`]). Calls with no row of
    /// their own use the `Network` rows (`collective::select`).
    Host,
    /// Ranks in separate processes of one host whose messages go over TCP loopback
    /// (`COLLECTIX_TRANSPORT=tcp`; set by a multi-process job on one host, and kept by its
    /// sub-groups): a message costs system calls on both sides, not a copy through shared
    /// memory, so the exchanges of the `Network` rows win (measured: `docs/performance.md`).
    /// Calls with no row of their own use the `Network` rows.
    HostTcp,
    /// Every rank in this process (an in-process world, set by `World`): a message's payload
    /// is shared, not copied, so the direct algorithms (whole blocks, few steps) win.
    Process,
    /// Ranks on several hosts, several on one host at least (known from
    /// [`GroupOptions::hosts`]): the hierarchical algorithms send across hosts only between
    /// one leader per host. Calls with no row of their own use the `Network` rows.
    Hosts,
}

/// Tunables of a group; every member must use the same values (they feed algorithm
/// selection, and the algorithm is part of each call's fingerprint).
#[derive(Clone, Debug, PartialEq)]
pub struct GroupOptions {
    /// How long a call may take before it fails with [`Error::Timeout`] (torch's
    /// `timeout`, default 30 minutes there; 5 minutes here).
    pub timeout: Duration,
    /// Largest segment a pipelined algorithm sends in one message.
    pub segment_bytes: usize,
    /// Algorithms forced for some kinds of call (for tests and benchmarks).
    pub algorithms: Vec<(OpKind, Algorithm)>,
    /// How many calls a rank may run ahead of a peer before its messages to that peer wait
    /// (flow control; bounds what a peer buffers for calls it has not made yet, with
    /// [`peer_budget_bytes`](GroupOptions::peer_budget_bytes) bounding their bytes). 256 by
    /// default: a rank that only sends (a broadcast's root, a reduce's non-roots) then asks
    /// its peers for credit once per 128 calls. Point-to-point messages use at most 16 of it
    /// (`P2P_WINDOW`: the eager messages one peer may have in flight to this rank, each of at
    /// most `peer_budget_bytes / 16` bytes).
    pub window: u64,
    /// The most payload bytes a peer may make this rank buffer, per group, for calls this
    /// rank has not made yet (64 MiB by default); the same bound holds for point-to-point
    /// messages sent before their receive is posted. Beyond it a sender waits for the
    /// receiver's call before sending (a rendezvous): see `engine::flow`. With the window, it
    /// bounds the memory one peer can take on this rank.
    pub peer_budget_bytes: u64,
    /// The most bytes one call may declare, its inputs and outputs together (64 GiB by
    /// default): a call above it is [`Error::InvalidArgument`] on the caller, before anything is
    /// allocated or sent. It guards against absurd sizes (a shape typed wrong, an overflow
    /// upstream); raise it for calls that really are that large.
    pub max_call_bytes: u64,
    /// How long a rank whose call timed out waits for its peers to say which call they are
    /// in (the desync report; 1 s by default). Zero skips the report.
    pub desync_grace: Duration,
    /// Where the ranks live (set by the world or process that makes the group; a sub-group
    /// inherits it, unless [`hosts`](GroupOptions::hosts) says more: see [`GroupInfo::new`]).
    pub locality: Locality,
    /// Each global rank's host, as an index (ranks with the same index share a host), where
    /// the job knows it (a multi-process job, from the identities its ranks published). A
    /// group's locality then follows from its own members: `Host` if they are all on one host,
    /// `Hosts` if on several with several on one, `Network` if each on its own. `None`: the
    /// locality is as set.
    pub hosts: Option<std::sync::Arc<[u32]>>,
}

impl Default for GroupOptions {
    fn default() -> Self {
        GroupOptions {
            timeout: Duration::from_secs(300),
            segment_bytes: 1 << 20,
            algorithms: Vec::new(),
            window: 256,
            peer_budget_bytes: 64 << 20,
            max_call_bytes: 64 << 30,
            desync_grace: Duration::from_secs(1),
            locality: Locality::Network,
            hosts: None,
        }
    }
}

impl GroupOptions {
    /// With `alg` forced for `kind`.
    pub fn with_algorithm(mut self, kind: OpKind, alg: Algorithm) -> Self {
        self.algorithms.retain(|(k, _)| *k != kind);
        self.algorithms.push((kind, alg));
        self
    }

    /// With another timeout.
    pub fn with_timeout(mut self, t: Duration) -> Self {
        self.timeout = t;
        self
    }
}

/// Per-call overrides (torch has only `timeout` on some calls; `algorithm` is ours).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CallOptions {
    /// Force an algorithm for this call (every rank must force the same one).
    pub algorithm: Option<Algorithm>,
    /// Another timeout for this call.
    pub timeout: Option<Duration>,
}

/// The locality of a group of `members` (global ranks) whose hosts `hosts` gives (see
/// [`GroupOptions::hosts`]); a member the map does not cover counts as a host of its own.
/// Members on one host are `HostTcp` if the group they come from (`base`) is.
fn locality_of(members: &[usize], hosts: &[u32], base: Locality) -> Locality {
    let host = |m: usize| hosts.get(m).copied().map_or(u64::MAX - m as u64, u64::from);
    let mut seen: Vec<u64> = members.iter().map(|&m| host(m)).collect();
    let n = seen.len();
    seen.sort_unstable();
    seen.dedup();
    match seen.len() {
        1 if base == Locality::HostTcp => Locality::HostTcp,
        1 => Locality::Host,
        k if k == n => Locality::Network,
        _ => Locality::Hosts,
    }
}

/// A group as one member sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct GroupInfo {
    /// The identity.
    pub id: GroupId,
    /// Global ranks of the members, in group-rank order (one list the members of one
    /// process may share: a world of W ranks holds it once, not W times).
    pub members: Arc<[usize]>,
    /// This member's group-local rank.
    pub rank: usize,
    /// Options shared by the members.
    pub options: GroupOptions,
    /// How a global rank's group rank is found ([`local`](Self::local)).
    lookup: Lookup,
}

/// How [`GroupInfo::local`] finds a global rank among the members: in O(1) for a group of
/// ranks `0..n` in order (a world) or through an index (a large group), else by a scan of a
/// few members.
#[derive(Clone, Debug)]
enum Lookup {
    Identity,
    Scan,
    Index(Arc<FastMap<usize, usize>>),
}

/// Equal groups look up alike: the lookup is derived from the members.
impl PartialEq for Lookup {
    fn eq(&self, _: &Lookup) -> bool {
        true
    }
}

/// The most members a group's lookup scans; a larger group is indexed.
const SCANNED_MEMBERS: usize = 16;

impl Lookup {
    fn of(members: &[usize]) -> Lookup {
        if members.iter().enumerate().all(|(i, &m)| i == m) {
            Lookup::Identity
        } else if members.len() <= SCANNED_MEMBERS {
            Lookup::Scan
        } else {
            Lookup::Index(Arc::new(
                members.iter().enumerate().map(|(i, &m)| (m, i)).collect(),
            ))
        }
    }
}

impl GroupInfo {
    /// A group of `members` (global ranks) as seen by global rank `me`.
    pub fn new(
        id: GroupId,
        members: Vec<usize>,
        me: usize,
        options: GroupOptions,
    ) -> Result<GroupInfo> {
        GroupInfo::shared(id, members.into(), None, me, options)
    }

    /// This member's view of lane `name` of this group: the same members, ranks and
    /// options, an id of its own ([`GroupId::lane`]), so an order of calls of its own.
    pub fn lane(&self, name: &str) -> GroupInfo {
        GroupInfo {
            id: GroupId::lane(self.id, name),
            ..self.clone()
        }
    }

    /// The views of one group of `members` for each of `mine` (global ranks of this process
    /// that are members): one list of members and one lookup for all of them.
    pub fn for_each(
        id: GroupId,
        members: impl Into<Arc<[usize]>>,
        mine: impl IntoIterator<Item = usize>,
        options: &GroupOptions,
    ) -> Result<Vec<GroupInfo>> {
        let members: Arc<[usize]> = members.into();
        let lookup = Lookup::of(&members);
        mine.into_iter()
            .map(|me| {
                GroupInfo::shared(
                    id,
                    members.clone(),
                    Some(lookup.clone()),
                    me,
                    options.clone(),
                )
            })
            .collect()
    }

    fn shared(
        id: GroupId,
        members: Arc<[usize]>,
        lookup: Option<Lookup>,
        me: usize,
        options: GroupOptions,
    ) -> Result<GroupInfo> {
        let lookup = lookup.unwrap_or_else(|| Lookup::of(&members));
        let mut info = GroupInfo {
            id,
            members,
            rank: 0,
            options,
            lookup,
        };
        info.rank = info.local(me).ok_or(Error::NotAMember {
            group: id,
            rank: me,
        })?;
        if let (Some(hosts), false) = (
            &info.options.hosts,
            info.options.locality == Locality::Process,
        ) {
            info.options.locality = locality_of(&info.members, hosts, info.options.locality);
        }
        Ok(info)
    }

    /// Each member's host (in group-rank order), from [`GroupOptions::hosts`]; with no host
    /// map, each member its own host.
    pub fn member_hosts(&self) -> Vec<u32> {
        self.members
            .iter()
            .map(|&m| {
                self.options
                    .hosts
                    .as_ref()
                    .and_then(|h| h.get(m).copied())
                    .unwrap_or(u32::MAX - m as u32)
            })
            .collect()
    }

    /// The world group of `n` ranks as seen by `me`.
    pub fn world(n: usize, me: usize, options: GroupOptions) -> Result<GroupInfo> {
        GroupInfo::new(GroupId::WORLD, (0..n).collect(), me, options)
    }

    /// Members.
    pub fn size(&self) -> usize {
        self.members.len()
    }

    /// Global rank of group rank `r`.
    pub fn global(&self, r: usize) -> usize {
        self.members[r]
    }

    /// Group rank of global rank `g`, if a member (O(1) but for a small group, scanned).
    pub fn local(&self, g: usize) -> Option<usize> {
        match &self.lookup {
            Lookup::Identity => (g < self.members.len()).then_some(g),
            Lookup::Scan => self.members.iter().position(|&m| m == g),
            Lookup::Index(index) => index.get(&g).copied(),
        }
    }

    /// Checks that `r` is a group rank; `what` names the argument.
    pub fn check_rank(&self, r: usize, what: &str) -> Result<()> {
        if r < self.size() {
            Ok(())
        } else {
            Err(Error::invalid(format!(
                "{what} {r} is not a rank of a group of {}",
                self.size()
            )))
        }
    }
}

/// Checks a list of member ranks for `new_group`: in range, no duplicates, not empty.
pub fn check_members(ranks: &[usize], world: usize) -> Result<()> {
    if ranks.is_empty() {
        return Err(Error::invalid("a group needs at least one rank"));
    }
    let mut seen = vec![false; world];
    for &r in ranks {
        match seen.get_mut(r) {
            None => {
                return Err(Error::invalid(format!(
                    "rank {r} is outside the parent group of {world}"
                )))
            }
            Some(true) => return Err(Error::invalid(format!("rank {r} is listed twice"))),
            Some(s) => *s = true,
        }
    }
    Ok(())
}
