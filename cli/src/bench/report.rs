//! What the bench prints and writes: the banner and the table's header, one row per size,
//! the summary under the table, and the `--json` and `--plot` files. Only the printing
//! process (rank 0's, over TCP) prints.

use super::args::{Args, Dev};
use super::cell::{Cell, Collective};
use super::measure::{peak_rss_mib, Measured};
use crate::plot;
use collectix::DeviceBackend;
use std::io::{IsTerminal, Write};

/// One row of the table (and of `--json`).
#[derive(serde::Serialize)]
pub(super) struct Row {
    pub(super) collective: Collective,
    pub(super) ranks: usize,
    /// Where the ranks ran: `local` (one process), `tcp` or `shm` (processes).
    pub(super) transport: String,
    pub(super) device: String,
    pub(super) size: usize,
    pub(super) count: usize,
    pub(super) dtype: String,
    pub(super) redop: String,
    pub(super) root: Option<usize>,
    pub(super) samples: usize,
    pub(super) calls_per_sample: usize,
    pub(super) time_us: f64,
    pub(super) time_min_us: f64,
    pub(super) time_max_us: f64,
    pub(super) algbw_gbs: f64,
    pub(super) busbw_gbs: f64,
    pub(super) wrong: Option<usize>,
    /// Every sample's time per call (its slowest rank's), fastest first: the distribution
    /// the median is taken from.
    pub(super) samples_us: Vec<f64>,
}

/// The median of `v`, which it sorts (0 for none).
fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

impl Row {
    /// The row of `cell` (rank 0's, of a world of `w`), `bytes` in size, from what was
    /// measured: the median sample's time, the fastest and the slowest, and the bandwidths of
    /// the median.
    pub(super) fn new(a: &Args, w: usize, bytes: usize, cell: &Cell, m: Measured) -> Row {
        let Measured {
            wrong,
            calls,
            mut slowest,
            ..
        } = m;
        let t = median(&mut slowest);
        let (tmin, tmax) = (
            slowest.first().copied().unwrap_or(0.0),
            slowest.last().copied().unwrap_or(0.0),
        );
        let algbw = if t > 0.0 { bytes as f64 / t / 1e9 } else { 0.0 };
        Row {
            collective: a.collective,
            ranks: w,
            transport: format!("{:?}", a.transport).to_lowercase(),
            device: format!("{:?}", a.device).to_lowercase(),
            size: bytes,
            count: cell.count,
            dtype: a.dtype.dtype().to_string(),
            redop: if a.collective.reduces() {
                a.op.reduce_op().to_string()
            } else {
                "none".into()
            },
            root: matches!(
                a.collective,
                Collective::Broadcast
                    | Collective::Reduce
                    | Collective::Gather
                    | Collective::Scatter
            )
            .then_some(cell.root),
            samples: a.iters.max(1),
            calls_per_sample: calls,
            time_us: t * 1e6,
            time_min_us: tmin * 1e6,
            time_max_us: tmax * 1e6,
            algbw_gbs: algbw,
            busbw_gbs: algbw * a.collective.busbw_factor(w),
            wrong,
            samples_us: slowest.iter().map(|s| s * 1e6).collect(),
        }
    }

    /// The row as a line of the table.
    fn line(&self) -> String {
        format!(
            " {:>11} {:>11} {:>8} {:>6} {:>5} {:>10.2} {:>10.2} {:>10.2} {:>8.3} {:>8.3} {:>7}",
            self.size,
            self.count,
            self.dtype,
            self.redop,
            self.root.map_or("-".into(), |r| r.to_string()),
            self.time_us,
            self.time_min_us,
            self.time_max_us,
            self.algbw_gbs,
            self.busbw_gbs,
            self.wrong.map_or("N/A".into(), |w| w.to_string()),
        )
    }
}

/// The table on stdout (and the progress on stderr), printed by the printing process only.
pub(super) struct Table {
    /// Whether this process prints.
    pub(super) prints: bool,
}

impl Table {
    /// One line on stdout.
    pub(super) fn say(&self, line: String) {
        if self.prints {
            println!("{line}");
        }
    }

    /// The banner (what is measured, where, how) and the table's header.
    pub(super) fn head(&self, a: &Args, w: usize, bind: bool, backend: DeviceBackend) {
        let transport = format!("{:?}", a.transport).to_lowercase();
        self.say(format!(
            "# collectix bench: {}, {w} ranks, transport {transport}{}, device {}{}, {}, op {}, {} samples{}",
            a.collective.name(),
            if bind { " (ranks bound to cores)" } else { "" },
            format!("{:?}", a.device).to_lowercase(),
            if a.device == Dev::Cpu { String::new() } else { format!(" ({backend:?})") },
            a.dtype.dtype(),
            a.op.reduce_op(),
            a.iters,
            if a.buffers { ", outputs in caller buffers" } else { "" }
        ));
        self.say(format!(
            "#{:>11} {:>11} {:>8} {:>6} {:>5} {:>10} {:>10} {:>10} {:>8} {:>8} {:>7}",
            "size(B)",
            "count",
            "type",
            "redop",
            "root",
            "time(us)",
            "min(us)",
            "max(us)",
            "algbw",
            "busbw",
            "#wrong"
        ));
    }

    /// One row of the table.
    pub(super) fn row(&self, row: &Row) {
        self.say(row.line());
    }

    /// The progress line on stderr: the `k`-th size (from 0) of `n`.
    pub(super) fn progress(&self, k: usize, n: usize, bytes: usize) {
        if self.prints && std::io::stderr().is_terminal() {
            eprint!("\rbench: size {} of {n} ({bytes} B)   ", k + 1);
            let _ = std::io::stderr().flush();
        }
    }

    /// Clears the progress line.
    pub(super) fn progress_done(&self) {
        if self.prints && std::io::stderr().is_terminal() {
            eprint!("\r{:60}\r", "");
        }
    }

    /// The lines under the table: the wrong elements in total, the rank actor's wake-ups per
    /// call for each size (`woken`), and the peak RSS, the largest of `peaks` (those of the
    /// timed calls) where each covers the timed calls only, else the whole run's; `tcp`:
    /// the ranks are processes of their own (the peak is rank 0's process's).
    pub(super) fn summary(
        &self,
        rows: &[Row],
        woken: &[(usize, f64)],
        peaks: &[(f64, bool)],
        tcp: bool,
    ) {
        let wrong: usize = rows.iter().filter_map(|r| r.wrong).sum();
        self.say(format!("# #wrong in total: {wrong}"));
        let woken: Vec<String> = woken
            .iter()
            .map(|(b, w)| format!("{b} B: {w:.2}"))
            .collect();
        self.say(format!(
            "# rank actor wake-ups per call (most on one rank): {}",
            woken.join(", ")
        ));
        let whose = if tcp { " (rank 0's process)" } else { "" };
        if let Some(&(mib, true)) = peaks.iter().max_by(|x, y| x.0.total_cmp(&y.0)) {
            // Each size's peak covers its warm-up and samples only: what the calls themselves
            // hold (inputs made before them included), not the check's reference copies.
            self.say(format!(
                "# peak RSS{whose}: {mib:.1} MiB (during the timed calls, the largest over sizes)"
            ));
        } else if let Some(mib) = peak_rss_mib() {
            self.say(format!(
                "# peak RSS{whose}: {mib:.1} MiB (the whole run, checks included)"
            ));
        }
    }
}

/// Writes `rows` as JSON to `--json`'s file, if given; the error to print if it could not.
pub(super) fn write_json(args: &Args, rows: &[Row]) -> std::result::Result<(), String> {
    let Some(path) = &args.json else {
        return Ok(());
    };
    let text = serde_json::to_string_pretty(rows).unwrap_or_default();
    std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// This run's rows as points of a plot.
fn points(rows: &[Row]) -> Vec<plot::Point> {
    rows.iter()
        .map(|r| plot::Point {
            source: "this run".into(),
            collective: r.collective.name().into(),
            ranks: r.ranks as u64,
            size: r.size as f64,
            busbw: r.busbw_gbs,
            transport: Some(r.transport.clone()),
        })
        .collect()
}

/// Draws this run and the earlier files it is to be compared with (`--plot`, if given).
pub(super) fn plot_run(args: &Args, rows: &[Row]) -> std::result::Result<(), String> {
    let Some(out) = &args.plot else {
        return Ok(());
    };
    let mut pts = points(rows);
    for f in &args.plot_with {
        pts.extend(plot::load(f)?);
    }
    let title = format!(
        "collectix bench: {}, {} ranks, {}",
        args.collective.name(),
        args.ranks,
        args.dtype.dtype()
    );
    plot::draw(out, &title, &pts)
}
