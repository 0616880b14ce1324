//! `collectix doctor`: a preflight check of a job. Every pair of ranks exchanges data both
//! ways on the transport the pair uses (shared memory or TCP), in rounds of disjoint pairs
//! (`collectix_runtime::doctor::rounds`), each round in a time slot of its own, so that a link
//! that carries nothing costs its slot and nothing more; each rank publishes its settings and
//! its row of results in the job's store (a broken link cannot hide them), and rank 0 reads
//! them back and judges them (`collectix_runtime::doctor`): a latency and bandwidth matrix, the
//! links that failed named by pair, the ranks that did not report, and the settings that differ
//! named by rank and field.
//!
//! A pair's exchange runs on a lane of the world of its own (`Communicator::lane`), so that a
//! failed pair (its calls time out, which aborts the lane) leaves the others' untouched.

use crate::comm::Communicator;
use crate::process::Process;
use collectix_runtime::collective::{Output, Request};
use collectix_runtime::doctor::{self, Link, Settings};
use collectix_runtime::{CallOptions, DType, Error, Result, Tensor, TensorSpec};
use std::fmt;
use std::time::{Duration, Instant};

/// How the check runs.
#[derive(Clone, Debug)]
pub struct DoctorOptions {
    /// Bytes of the large message each rank of a pair sends the other (bandwidth).
    pub bytes: usize,
    /// Small messages each pair bounces (round trips).
    pub pings: usize,
    /// Each round's time slot; `None`: 1.2 s shared among the rounds, 40-200 ms each (a round
    /// of a job of 16 gets 80 ms; `collectix_runtime::doctor::Plan`).
    pub slot: Option<Duration>,
    /// How long the ranks wait for each other to start (a rank that is not there by then
    /// is checked as absent).
    pub start_wait: Duration,
    /// Which check of the job this is (0, 1, ...): its keys in the store are its own, so that
    /// a job can check again.
    pub pass: u64,
}

impl Default for DoctorOptions {
    fn default() -> Self {
        DoctorOptions {
            bytes: 1 << 20,
            pings: 8,
            slot: None,
            start_wait: Duration::from_millis(250),
            pass: 0,
        }
    }
}

/// What rank 0 found: every rank's settings and row of links (`None`: it did not report),
/// the findings (empty: every link carried data both ways and every setting agrees), and how
/// long the check took on rank 0, from its start to its judgement.
#[derive(Clone, Debug)]
pub struct DoctorReport {
    /// Each rank's settings.
    pub settings: Vec<Option<Settings>>,
    /// Each rank's links.
    pub links: Vec<Option<Vec<Link>>>,
    /// What is wrong, a line each.
    pub findings: Vec<String>,
    /// How long the check took.
    pub took: Duration,
}

impl fmt::Display for DoctorReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let paths = |p: &str| {
            self.links
                .iter()
                .flatten()
                .flatten()
                .filter(|l| l.path == p)
                .count()
                / 2
        };
        let mut hosts: std::collections::BTreeMap<&str, usize> = Default::default();
        for s in self.settings.iter().flatten() {
            *hosts
                .entry(s.0.get("host").map_or("?", String::as_str))
                .or_default() += 1;
        }
        let hosts: Vec<String> = hosts.iter().map(|(h, n)| format!("{h} ({n})")).collect();
        writeln!(
            f,
            "{} ranks on {}; {} pairs over shared memory, {} over TCP; checked in {:.2} s",
            self.links.len(),
            hosts.join(", "),
            paths("shm"),
            paths("tcp"),
            self.took.as_secs_f64()
        )?;
        f.write_str(&doctor::matrices(&self.links))?;
        if self.findings.is_empty() {
            write!(
                f,
                "no findings: every link carried data both ways, and every setting agrees"
            )
        } else {
            write!(f, "findings:")?;
            for l in &self.findings {
                write!(f, "\n  {l}")?;
            }
            Ok(())
        }
    }
}

/// This rank's settings: what every rank of a job must agree on
/// (`collectix_runtime::doctor::AGREED`), and where it runs.
pub fn settings(p: &Process) -> Settings {
    let env = |k: &str, default: &str| {
        std::env::var(k)
            .ok()
            .filter(|v| !v.trim().is_empty())
            .unwrap_or_else(|| default.to_string())
    };
    let c = p.config();
    let o = &p.communicator().member.group.info.options;
    let secret = ["COLLECTIX_SECRET", "COLLECTIX_SECRET_FILE"]
        .iter()
        .any(|k| std::env::var_os(k).is_some_and(|v| !v.is_empty()));
    let host = std::fs::read_to_string("/etc/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| env("HOSTNAME", "unknown"));
    let pairs: Vec<(&str, String)> = vec![
        ("version", env!("CARGO_PKG_VERSION").to_string()),
        (
            "frame_version",
            collectix_runtime::wire::codec::VERSION.to_string(),
        ),
        ("transport", env("COLLECTIX_TRANSPORT", "auto")),
        ("connect", env("COLLECTIX_CONNECT", "eager")),
        ("timeout_ms", o.timeout.as_millis().to_string()),
        ("desync_grace_ms", o.desync_grace.as_millis().to_string()),
        ("link_timeout", env("COLLECTIX_LINK_TIMEOUT", "default")),
        ("secret", if secret { "set" } else { "none" }.to_string()),
        ("launcher", format!("{:?}", c.launcher)),
        ("world_size", c.world_size.to_string()),
        ("store", format!("{:?}", c.rendezvous)),
        ("store_protocol", format!("{:?}", c.store_protocol)),
        ("spin_us", env("COLLECTIX_SPIN_US", "default")),
        ("board", env("COLLECTIX_BOARD", "default")),
        ("host", host),
        ("local_rank", c.local_rank.to_string()),
        ("pid", std::process::id().to_string()),
    ];
    Settings(pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
}

/// The store's key of `what` of rank `r` in check `pass`.
fn key(pass: u64, what: &str, r: usize) -> String {
    format!("collectix/doctor/{pass}/{what}/{r}")
}

/// Checks the job (module doc): every rank calls it; rank 0 gets the report, the others
/// `None`. Errors only where the store cannot be written or read.
pub fn doctor(p: &Process, o: &DoctorOptions) -> Result<Option<DoctorReport>> {
    let start = Instant::now();
    let c = p.communicator();
    let (me, w) = (c.rank(), c.size());
    let store = p.store();
    store.set(
        &key(o.pass, "settings", me),
        settings(p).to_text().into_bytes(),
    )?;
    // Ready: every rank that is there by the wait starts the slots together.
    store.set(&key(o.pass, "ready", me), b"1".to_vec())?;
    let ready_by = Instant::now() + o.start_wait;
    let present: Vec<bool> = (0..w)
        .map(|q| {
            let left = ready_by.saturating_duration_since(Instant::now());
            q == me
                || store
                    .get(&key(o.pass, "ready", q), left.max(Duration::from_millis(1)))
                    .is_ok()
        })
        .collect();
    let t0 = Instant::now();
    let plan = doctor::Plan::new(w, o.slot);
    let mut row = Vec::new();
    for (k, (a, b), peer) in plan.pairs_of(me) {
        let (begin, end) = plan.window(k);
        std::thread::sleep((t0 + begin).saturating_duration_since(Instant::now()));
        let path = p.transport_to(peer).unwrap_or("-").to_string();
        let mut link = if present[peer] {
            exchange(c, (a, b), peer, o, (t0 + end, plan.exchange()))
        } else {
            Link {
                error: Some(format!(
                    "rank {peer} did not start the check within {} ms",
                    o.start_wait.as_millis()
                )),
                ..Link::default()
            }
        };
        link.peer = peer;
        link.path = path;
        row.push(link);
    }
    std::thread::sleep((t0 + plan.over()).saturating_duration_since(Instant::now()));
    store.set(
        &key(o.pass, "row", me),
        doctor::row_to_text(&row).into_bytes(),
    )?;
    if me != 0 {
        return Ok(None);
    }
    // Rank 0: every rank's row, by the plan's due time.
    let due = t0 + plan.rows_due();
    let mut links = Vec::with_capacity(w);
    let mut all = Vec::with_capacity(w);
    for q in 0..w {
        let left = due
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1));
        let text = |b: Vec<u8>| String::from_utf8_lossy(&b).into_owned();
        links.push(
            store
                .get(&key(o.pass, "row", q), left)
                .ok()
                .map(|b| doctor::row_from_text(&text(b))),
        );
        let s = store.get(&key(o.pass, "settings", q), Duration::from_millis(1));
        all.push(s.ok().map(|b| Settings::from_text(&text(b))));
    }
    let mut findings = doctor::link_findings(&links);
    findings.extend(doctor::compare(&all));
    Ok(Some(DoctorReport {
        settings: all,
        links,
        findings,
        took: start.elapsed(),
    }))
}

/// The time left until `end` as a call's timeout (at least a millisecond).
fn until(end: Instant) -> CallOptions {
    CallOptions {
        timeout: Some(
            end.saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1)),
        ),
        ..CallOptions::default()
    }
}

/// The pair `(a, b)`'s exchange, seen from this rank (one of them), by `end`: the lower rank
/// bounces `o.pings` small messages off the higher, then each sends the other `o.bytes` and
/// waits for a small answer. What this rank measured, or the first failure.
fn exchange(
    c: &Communicator,
    (a, b): (usize, usize),
    peer: usize,
    o: &DoctorOptions,
    (end, slot): (Instant, Duration),
) -> Link {
    let lane = c.lane(&format!("collectix.doctor.{}.{a}-{b}", o.pass));
    let small = || Tensor::from_vec(vec![0u8; 8]);
    let big = || Tensor::from_vec(vec![0u8; o.bytes.max(1)]);
    let send = |t: Tensor, tag: u32| -> Result<()> {
        lane.submit(
            Request::Send {
                tensor: t,
                dst: peer,
                tag,
            },
            &until(end),
        )
        .wait()
        .map(|_| ())
    };
    let recv = |n: usize, tag: u32| -> Result<()> {
        let spec = TensorSpec::new(&[n], DType::U8);
        match lane
            .submit(
                Request::Recv {
                    spec,
                    src: Some(peer),
                    tag,
                },
                &until(end),
            )
            .wait()?
        {
            Output::Received { .. } => Ok(()),
            other => Err(Error::internal(format!("a receive gave {other:?}"))),
        }
    };
    let lower = c.rank() == a;
    // Pings done: none means nothing came from the peer at all.
    let done = std::cell::Cell::new(0usize);
    let run = || -> Result<(Vec<Duration>, f64)> {
        let mut rtts = Vec::with_capacity(o.pings);
        let mut last = Instant::now();
        for _ in 0..o.pings {
            if lower {
                let t = Instant::now();
                send(small(), 1)?;
                recv(8, 2)?;
                rtts.push(t.elapsed());
            } else {
                recv(8, 1)?;
                let now = Instant::now();
                if !rtts.is_empty() || o.pings == 1 {
                    rtts.push(now - last);
                } else {
                    rtts.push(Duration::ZERO);
                }
                last = now;
                send(small(), 2)?;
            }
            done.set(done.get() + 1);
        }
        if !lower {
            // The first interval is no round trip: keep the others.
            rtts.retain(|d| !d.is_zero());
        }
        let mine = |tag: u32| -> Result<f64> {
            let t = Instant::now();
            send(big(), tag)?;
            recv(8, tag + 1)?;
            Ok(o.bytes as f64 / t.elapsed().as_secs_f64().max(1e-9) / 1e9)
        };
        let theirs = |tag: u32| -> Result<()> {
            recv(o.bytes.max(1), tag)?;
            send(small(), tag + 1)
        };
        // Twice each way, the faster kept (the first pays for the lane's first large
        // message).
        let mut gbs: f64 = 0.0;
        for _ in 0..2 {
            gbs = gbs.max(if lower {
                let g = mine(3)?;
                theirs(5)?;
                g
            } else {
                theirs(3)?;
                mine(5)?
            });
        }
        Ok((rtts, gbs))
    };
    match run() {
        Ok((mut rtts, gbs)) => {
            rtts.sort_unstable();
            Link {
                rtt_us: rtts.get(rtts.len() / 2).map(|d| d.as_secs_f64() * 1e6),
                out_gbs: Some(gbs),
                ..Link::default()
            }
        }
        Err(e) => Link {
            error: Some(match (e.root_cause(), done.get()) {
                (Error::Timeout { .. }, 0) => format!(
                    "no answer from rank {peer} within the round's {} ms",
                    slot.as_millis()
                ),
                (Error::Timeout { .. }, n) => format!(
                    "too slow: {n} of {} pings, then the rest not within the round's {} ms",
                    o.pings,
                    slot.as_millis()
                ),
                (other, _) => other.to_string(),
            }),
            ..Link::default()
        },
    }
}
