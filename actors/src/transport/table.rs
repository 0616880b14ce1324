//! The table of transports between the processes of a job, after NCCL's `ncclTransports[]`:
//! each row says which pairs it can carry, judged from what both ranks published
//! ([`CanConnect`], in `collectix_runtime::join`), and starts on the pairs given to it. A pair
//! takes the first row that can connect it; a pair a row could not reach after all (shared
//! memory whose segment could not be mapped) falls to the next row that can
//! (`collectix_runtime::join::{assign, next_row}`), so both ranks of a pair decide alike.
//!
//! TCP is the last row, and lives here: its connections (`transport::mesh`) are every job's
//! base, made for every pair whatever row carries the pair's messages, since they tell when
//! a peer's process is gone and carry its messages again once the peer is restarted. A new
//! transport is a file of its own with a [`Row`] (`transport/row.rs`), put in [`TRANSPORTS`]
//! before the rows it should win over; what it needs to publish goes in the offer each rank
//! publishes at join (`process/join.rs`).

use super::mesh::Connect;
use super::row::{Row, Running, Started, Starting};
use crate::rank::driver::PollerKind;
use collectix_runtime::join::{assign, next_row, tcp_can_connect, CanConnect, Offer};
use collectix_runtime::{Error, Result};
use std::time::{Duration, Instant};

/// The transports, in the order they are tried for each pair.
pub(crate) const TRANSPORTS: &[Row] = &[
    #[cfg(target_os = "linux")]
    super::shm::ROW,
    TCP,
];

/// How long a restarted process tries to reach each peer (one that cannot be reached is
/// taken as lost).
const REJOIN_CONNECT: Duration = Duration::from_secs(5);

/// TCP, the last row of the table of transports: it carries every pair the rows before it
/// did not.
const TCP: Row = Row {
    name: "tcp",
    can_connect: tcp_can_connect,
    start: start_row,
};

/// TCP's start, once the rows before it took their pairs: waiting callers read the
/// connections that carry messages; a restarted process says hello to every peer (they are
/// running already, and learn from it that it replaces its rank's previous process); an
/// eager job connects every pair (those another row carries too) before the join returns.
fn start_row(st: &mut Starting<'_>, pairs: &[usize]) -> Result<Started> {
    let readers = st.mesh.readers();
    if readers.carries_any(st.rank) {
        st.driver.set_poller(PollerKind::Tcp, readers);
    }
    if st.incarnation > 0 {
        let left = st.deadline.saturating_duration_since(Instant::now());
        st.mesh.rejoin_all(REJOIN_CONNECT.min(left));
    } else if st.connect == Connect::Eager {
        st.mesh.connect_all(st.deadline, st.timeout)?;
    }
    Ok(Started {
        reached: pairs.to_vec(),
        running: None,
    })
}

/// What the rows started: what keeps them running, and which row carries each peer (its
/// name, by rank; `self` for this rank).
pub(crate) type Rows = (Vec<Box<dyn Running>>, Vec<&'static str>);

/// Starts every row on the pairs it carries (`offers`: what each rank published), in the
/// table's order, and returns what keeps them running and which row carries each peer.
pub(crate) fn start(st: &mut Starting<'_>, offers: &[Offer]) -> Result<Rows> {
    let rank = st.rank;
    start_rows(rank, offers, TRANSPORTS, |row, given| {
        (row.start)(st, given)
    })
}

/// [`start`] over the rows given, each started by `start`.
fn start_rows(
    rank: usize,
    offers: &[Offer],
    rows: &[Row],
    mut start: impl FnMut(&Row, &[usize]) -> Result<Started>,
) -> Result<Rows> {
    let tests: Vec<CanConnect> = rows.iter().map(|r| r.can_connect).collect();
    let mut pairs: Vec<Vec<usize>> = vec![Vec::new(); rows.len()];
    for (peer, row) in assign(rank, offers, &tests).into_iter().enumerate() {
        if let Some(row) = row {
            pairs[row].push(peer);
        }
    }
    let mut running = Vec::new();
    let mut paths = vec![""; offers.len()];
    if let Some(me) = paths.get_mut(rank) {
        *me = "self";
    }
    for (i, row) in rows.iter().enumerate() {
        let mut given = std::mem::take(&mut pairs[i]);
        given.sort_unstable();
        let started = start(row, &given)?;
        for &peer in given.iter().filter(|p| !started.reached.contains(p)) {
            match next_row(rank, peer, offers, &tests, i + 1) {
                Some(next) => pairs[next].push(peer),
                None => {
                    return Err(Error::Resource(format!(
                        "no transport reaches rank {peer} from rank {rank}: {} could not",
                        row.name
                    )))
                }
            }
        }
        tracing::debug!(rank, transport = row.name, peers = ?started.reached, "started");
        for &peer in &started.reached {
            if let Some(p) = paths.get_mut(peer) {
                *p = row.name;
            }
        }
        running.extend(started.running);
    }
    Ok((running, paths))
}

#[cfg(test)]
mod tests {
    use super::*;
    use collectix_runtime::join::{shm_can_connect, Setting};

    struct Up(&'static str, usize);

    impl Running for Up {
        fn name(&self) -> &'static str {
            self.0
        }
        fn peers(&self) -> usize {
            self.1
        }
    }

    fn offer(host: &str, setting: Setting) -> Offer {
        Offer {
            host: host.into(),
            shm: setting != Setting::Tcp,
            setting,
        }
    }

    fn never(_: &mut Starting<'_>, _: &[usize]) -> Result<Started> {
        Err(Error::internal("not called in these tests"))
    }

    const ROWS: &[Row] = &[
        Row {
            name: "shm",
            can_connect: shm_can_connect,
            start: never,
        },
        Row {
            name: "tcp",
            can_connect: tcp_can_connect,
            start: never,
        },
    ];

    #[test]
    fn each_row_starts_on_its_pairs_and_a_pair_it_could_not_reach_falls_to_the_next() {
        let offers = vec![
            offer("h", Setting::Auto),
            offer("h", Setting::Auto),
            offer("h", Setting::Tcp),
            offer("h", Setting::Auto),
            offer("g", Setting::Auto),
        ];
        let mut given = Vec::new();
        let running = start_rows(0, &offers, ROWS, |row, pairs| {
            given.push((row.name, pairs.to_vec()));
            // Shared memory reaches rank 1 but not rank 3.
            let reached: Vec<usize> = (pairs.iter().copied())
                .filter(|&p| p != 3 || row.name != "shm")
                .collect();
            Ok(Started {
                running: Some(Box::new(Up(row.name, reached.len()))),
                reached,
            })
        });
        let running = running.map_err(|e| e.to_string());
        let paths = running.as_ref().map(|(_, p)| p.clone()).unwrap_or_default();
        assert_eq!(paths, vec!["self", "shm", "tcp", "tcp", "tcp"]);
        let running = running.map(|(r, _)| r);
        assert_eq!(
            given,
            vec![("shm", vec![1, 3]), ("tcp", vec![2, 3, 4])],
            "rank 3 falls back to TCP, in rank order"
        );
        let up: Vec<(&str, usize)> = running
            .iter()
            .flatten()
            .map(|r| (r.name(), r.peers()))
            .collect();
        assert_eq!(up, vec![("shm", 1), ("tcp", 3)]);
    }

    #[test]
    fn a_pair_the_last_row_cannot_reach_fails_the_start_naming_it() {
        let offers = vec![offer("h", Setting::Auto), offer("h", Setting::Auto)];
        let e = start_rows(1, &offers, ROWS, |_, _| {
            Ok(Started {
                reached: Vec::new(),
                running: None,
            })
        })
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
        assert!(e.contains("rank 0 from rank 1") && e.contains("tcp"), "{e}");
    }
}
