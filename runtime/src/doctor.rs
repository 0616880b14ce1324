//! `collectix doctor`'s judgement, sans-IO: the order in which the ranks check their links
//! (rounds of disjoint pairs), what each rank found on each link and how it is written, the
//! settings every rank must agree on, and the findings: a link that carried nothing, a rank
//! that did not report, a setting that differs, each named by pair or rank and field.
//!
//! The actors crate (`collectix_actors::doctor`) runs the checks: each rank publishes its
//! settings and its row of link results in the job's store (so that a broken link cannot hide
//! the report), and rank 0 reads them back and judges them here.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

/// The settings every rank of a job must agree on: a rank that differs is named with the
/// field, its value and the others'. (`host`, `local_rank` and `pid` are reported, not
/// compared.)
pub const AGREED: &[&str] = &[
    "version",
    "frame_version",
    "transport",
    "connect",
    "timeout_ms",
    "desync_grace_ms",
    "link_timeout",
    "secret",
    "launcher",
    "world_size",
    "store",
    "store_protocol",
    "spin_us",
    "board",
];

/// The longest setting value or row read back from the store (a longer one is cut there).
pub const MAX_TEXT: usize = 64 << 10;

/// One rank's settings, field → value.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Settings(pub BTreeMap<String, String>);

impl Settings {
    /// As text: a `field value` line per field (values on one line).
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        for (k, v) in &self.0 {
            let _ = writeln!(s, "{k} {}", v.replace('\n', " "));
        }
        s
    }

    /// Read back from [`to_text`](Self::to_text)'s text (at most [`MAX_TEXT`] bytes read).
    pub fn from_text(text: &str) -> Settings {
        let text = cut(text);
        Settings(
            text.lines()
                .filter_map(|l| l.split_once(' '))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }
}

/// `text` cut at [`MAX_TEXT`] (at a char boundary).
fn cut(text: &str) -> &str {
    let mut end = text.len().min(MAX_TEXT);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// The rounds of a check of every pair of `w` ranks: each a list of disjoint pairs `(a, b)`,
/// `a < b` (the circle method: `w - 1` rounds for an even `w`, `w` for an odd one, a rank
/// sitting each round out), every pair in exactly one round.
pub fn rounds(w: usize) -> Vec<Vec<(usize, usize)>> {
    if w < 2 {
        return Vec::new();
    }
    // With a ghost for an odd w: its partner sits the round out.
    let n = w + w % 2;
    let mut out = Vec::with_capacity(n - 1);
    for r in 0..n - 1 {
        let mut pairs = Vec::with_capacity(n / 2);
        for i in 0..n / 2 {
            let pos = |k: usize| if k == 0 { 0 } else { 1 + (k - 1 + r) % (n - 1) };
            let (a, b) = (pos(i), pos(n - 1 - i));
            if a < w && b < w {
                pairs.push((a.min(b), a.max(b)));
            }
        }
        pairs.sort_unstable();
        out.push(pairs);
    }
    out
}

/// The schedule of one check that every rank follows, times as offsets from the moment the
/// ranks start together: the rounds of pairs, each in a slot of its own (a pair's exchange
/// must end by 90 % of it, so that the next round starts clean), and when rank 0 stops
/// waiting for the rows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// The rounds ([`rounds`]).
    pub rounds: Vec<Vec<(usize, usize)>>,
    /// Each round's slot.
    pub slot: Duration,
}

impl Plan {
    /// The plan for `w` ranks, each round in `slot` if given, else 1.2 s shared among the
    /// rounds, each 40 ms to 200 ms (a round of a job of 16 gets 80 ms).
    pub fn new(w: usize, slot: Option<Duration>) -> Plan {
        let rounds = rounds(w);
        let n = u32::try_from(rounds.len().max(1)).unwrap_or(u32::MAX);
        let slot = slot.unwrap_or_else(|| {
            (Duration::from_millis(1200) / n)
                .clamp(Duration::from_millis(40), Duration::from_millis(200))
        });
        Plan { rounds, slot }
    }

    /// Rank `me`'s pairs in order: the round's index, the pair `(a, b)`, and the peer.
    pub fn pairs_of(&self, me: usize) -> impl Iterator<Item = (usize, (usize, usize), usize)> + '_ {
        self.rounds
            .iter()
            .enumerate()
            .filter_map(move |(k, round)| {
                let &(a, b) = round.iter().find(|(a, b)| *a == me || *b == me)?;
                Some((k, (a, b), if a == me { b } else { a }))
            })
    }

    /// Round `k`'s window: its start, and the end its exchange must keep to.
    pub fn window(&self, k: usize) -> (Duration, Duration) {
        let begin = self.slot * u32::try_from(k).unwrap_or(u32::MAX);
        (begin, begin + self.exchange())
    }

    /// The time a pair's exchange has: 90 % of a slot.
    pub fn exchange(&self) -> Duration {
        self.slot * 9 / 10
    }

    /// When every round is over (no rank goes on before: leaving the job costs its peers
    /// work).
    pub fn over(&self) -> Duration {
        self.slot * u32::try_from(self.rounds.len()).unwrap_or(u32::MAX)
    }

    /// When rank 0 stops waiting for the rows: every round over, and 300 ms.
    pub fn rows_due(&self) -> Duration {
        self.over() + Duration::from_millis(300)
    }
}

/// What one rank found on its link to one peer.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Link {
    /// The peer.
    pub peer: usize,
    /// The transport the pair uses (`shm`, `tcp`).
    pub path: String,
    /// The round trip of a small message, in microseconds (the median of the pings).
    pub rtt_us: Option<f64>,
    /// This rank's bandwidth to the peer, in GB/s (a large message and its small answer).
    pub out_gbs: Option<f64>,
    /// Why the check failed, if it did (the first failure).
    pub error: Option<String>,
}

impl Link {
    /// As a line: `peer path rtt_us out_gbs error...` (`-` for none).
    pub fn to_line(&self) -> String {
        let num = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.3}"));
        format!(
            "{} {} {} {} {}",
            self.peer,
            if self.path.is_empty() {
                "-"
            } else {
                &self.path
            },
            num(self.rtt_us),
            num(self.out_gbs),
            self.error.as_deref().unwrap_or("-").replace('\n', " ")
        )
    }

    /// Read back from [`to_line`](Self::to_line)'s line; `None` if it does not parse.
    pub fn from_line(line: &str) -> Option<Link> {
        let mut w = line.splitn(5, ' ');
        let peer = w.next()?.parse().ok()?;
        let path = w.next()?.to_string();
        let num = |s: Option<&str>| s.and_then(|s| s.parse::<f64>().ok());
        let rtt_us = num(w.next());
        let out_gbs = num(w.next());
        let error = w.next().filter(|e| *e != "-").map(str::to_string);
        Some(Link {
            peer,
            path,
            rtt_us,
            out_gbs,
            error,
        })
    }
}

/// A rank's row of links as text, a line each.
pub fn row_to_text(row: &[Link]) -> String {
    row.iter().map(|l| l.to_line() + "\n").collect()
}

/// A row read back from [`row_to_text`]'s text (at most [`MAX_TEXT`] bytes read; lines that
/// do not parse are left out).
pub fn row_from_text(text: &str) -> Vec<Link> {
    cut(text).lines().filter_map(Link::from_line).collect()
}

/// The settings that differ: for each field of [`AGREED`], the ranks whose value is not the
/// most common one (the lowest rank's on a tie), each named with its value and the others'.
/// `settings[r]` is rank `r`'s (`None`: it did not report).
pub fn compare(settings: &[Option<Settings>]) -> Vec<String> {
    let mut out = Vec::new();
    for &field in AGREED {
        let values: Vec<(usize, &str)> = settings
            .iter()
            .enumerate()
            .filter_map(|(r, s)| Some((r, s.as_ref()?.0.get(field).map_or("(unset)", |v| v))))
            .collect();
        let mut count: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
        for &(r, v) in &values {
            let e = count.entry(v).or_insert((0, r));
            e.0 += 1;
        }
        let Some((&common, _)) = count
            .iter()
            .max_by(|a, b| a.1 .0.cmp(&b.1 .0).then(b.1 .1.cmp(&a.1 .1)))
        else {
            continue;
        };
        for &(r, v) in values.iter().filter(|(_, v)| *v != common) {
            out.push(format!(
                "setting {field}: rank {r} has {v}, the others {common}"
            ));
        }
    }
    out
}

/// The links that failed, each pair once, and the ranks that did not report: `link 3 <-> 7
/// (tcp): rank 3: no answer from rank 7 within 90 ms; rank 7: ...`, `rank 5 did not report
/// (dead, frozen, or cut off from the store)`. `rows[r]` is rank `r`'s (`None`: it did not
/// report).
pub fn link_findings(rows: &[Option<Vec<Link>>]) -> Vec<String> {
    let mut out = Vec::new();
    let mut failed: BTreeMap<(usize, usize), (String, Vec<String>)> = BTreeMap::new();
    for (r, row) in rows.iter().enumerate() {
        let Some(row) = row else {
            out.push(format!(
                "rank {r} did not report (dead, frozen, or cut off from the store)"
            ));
            continue;
        };
        for l in row {
            if let Some(e) = &l.error {
                let e2 = failed
                    .entry((r.min(l.peer), r.max(l.peer)))
                    .or_insert_with(|| (l.path.clone(), Vec::new()));
                e2.1.push(format!("rank {r}: {e}"));
            }
        }
    }
    for ((a, b), (path, why)) in failed {
        out.push(format!("link {a} <-> {b} ({path}): {}", why.join("; ")));
    }
    out
}

/// The latency and bandwidth matrices, nccl-tests' way: a row per rank, a column per peer;
/// round trips in microseconds, bandwidth from the row's rank to the column's in GB/s; `x`
/// for a failed link, `.` for none (the diagonal, or a rank that did not report).
pub fn matrices(rows: &[Option<Vec<Link>>]) -> String {
    let w = rows.len();
    let mut s = String::new();
    for (title, pick) in [
        (
            "round trip, us",
            (|l: &Link| l.rtt_us) as fn(&Link) -> Option<f64>,
        ),
        ("bandwidth row -> column, GB/s", |l: &Link| l.out_gbs),
    ] {
        let _ = writeln!(s, "# {title}");
        let _ = write!(s, "{:>6}", "");
        for c in 0..w {
            let _ = write!(s, "{c:>8}");
        }
        s.push('\n');
        for (r, row) in rows.iter().enumerate() {
            let _ = write!(s, "{r:>6}");
            for c in 0..w {
                let cell = row
                    .as_ref()
                    .and_then(|row| row.iter().find(|l| l.peer == c))
                    .map_or(".".to_string(), |l| match (&l.error, pick(l)) {
                        (Some(_), _) => "x".to_string(),
                        (None, Some(v)) if v >= 100.0 => format!("{v:.0}"),
                        (None, Some(v)) => format!("{v:.2}"),
                        (None, None) => ".".to_string(),
                    });
                let _ = write!(s, "{cell:>8}");
            }
            s.push('\n');
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn the_rounds_meet_every_pair_once_and_no_rank_twice_in_a_round() {
        for w in 0..20 {
            let rounds = rounds(w);
            let mut seen = BTreeSet::new();
            for round in &rounds {
                let mut busy = BTreeSet::new();
                for &(a, b) in round {
                    assert!(a < b && b < w, "w {w}: {round:?}");
                    assert!(busy.insert(a) && busy.insert(b), "w {w}: {round:?}");
                    assert!(seen.insert((a, b)), "w {w}: ({a}, {b}) twice");
                }
            }
            assert_eq!(seen.len(), w * w.saturating_sub(1) / 2, "w {w}");
            if w >= 2 {
                assert_eq!(rounds.len(), w - 1 + w % 2, "w {w}");
            }
        }
    }

    #[test]
    fn a_plan_gives_each_rank_its_pairs_in_slots_of_40_to_200_ms() {
        let p = Plan::new(16, None);
        assert_eq!((p.rounds.len(), p.slot), (15, Duration::from_millis(80)));
        assert_eq!(Plan::new(2, None).slot, Duration::from_millis(200));
        assert_eq!(Plan::new(200, None).slot, Duration::from_millis(40));
        assert_eq!(
            Plan::new(4, Some(Duration::from_millis(7))).slot,
            Duration::from_millis(7)
        );
        let mine: Vec<_> = p.pairs_of(3).collect();
        assert_eq!(mine.len(), 15);
        for (k, (a, b), peer) in mine {
            assert!(p.rounds[k].contains(&(a, b)) && (a == 3 || b == 3) && peer != 3);
        }
        assert_eq!(
            p.window(2),
            (Duration::from_millis(160), Duration::from_millis(232))
        );
        assert_eq!(
            (p.over(), p.rows_due()),
            (Duration::from_millis(1200), Duration::from_millis(1500))
        );
    }

    #[test]
    fn a_setting_one_rank_differs_in_is_named_with_both_values() {
        let s = |timeout: &str| {
            Settings(BTreeMap::from([
                ("timeout_ms".to_string(), timeout.to_string()),
                ("host".to_string(), "a".to_string()),
            ]))
        };
        let mut all: Vec<Option<Settings>> = (0..4).map(|_| Some(s("30000"))).collect();
        all[2] = Some(s("100"));
        all[3] = None;
        assert_eq!(
            compare(&all),
            vec!["setting timeout_ms: rank 2 has 100, the others 30000".to_string()]
        );
        let text = s("100").to_text();
        assert_eq!(Settings::from_text(&text), s("100"));
    }

    #[test]
    fn a_failed_link_is_named_by_its_pair_once_and_a_silent_rank_by_itself() {
        let ok = |peer| Link {
            peer,
            path: "tcp".into(),
            rtt_us: Some(50.0),
            out_gbs: Some(1.5),
            error: None,
        };
        let bad = |peer, e: &str| Link {
            error: Some(e.into()),
            rtt_us: None,
            out_gbs: None,
            ..ok(peer)
        };
        let rows = vec![
            Some(vec![ok(1), bad(2, "no answer from rank 2 within 90 ms")]),
            Some(vec![ok(0), ok(2)]),
            Some(vec![bad(0, "no answer from rank 0 within 90 ms"), ok(1)]),
            None,
        ];
        for row in rows.iter().flatten() {
            assert_eq!(&row_from_text(&row_to_text(row)), row);
        }
        assert_eq!(
            link_findings(&rows),
            vec![
                "rank 3 did not report (dead, frozen, or cut off from the store)".to_string(),
                "link 0 <-> 2 (tcp): rank 0: no answer from rank 2 within 90 ms; rank 2: no answer from rank 0 within 90 ms".to_string(),
            ]
        );
        let m = matrices(&rows);
        assert!(m.contains("# round trip, us"), "{m}");
        let line0 = m.lines().nth(2).unwrap_or_default();
        assert_eq!(
            line0.split_whitespace().collect::<Vec<_>>(),
            ["0", ".", "50.00", "x", "."]
        );
    }
}
