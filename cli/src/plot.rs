//! `--plot FILE.svg` and `collectix plot`: bus bandwidth against message size, one line per
//! (source, collective, ranks), for this run's rows and for earlier `--json` files beside
//! them. Drawn with plotters' SVG backend (no system fonts needed). Sizes are on a log scale;
//! rows without a bandwidth (barrier) are left out.

use plotters::prelude::*;
use std::collections::BTreeMap;
use std::path::Path;

/// `collectix plot`'s arguments.
#[derive(clap::Args)]
pub(crate) struct PlotArgs {
    /// The SVG file to write.
    #[arg(long)]
    out: std::path::PathBuf,
    /// The title.
    #[arg(long, default_value = "busbw against size")]
    title: String,
    /// `--json` files; each line is labelled with its file's stem (or its rows' `source`).
    #[arg(required = true)]
    json: Vec<std::path::PathBuf>,
}

/// `collectix plot`: every file's rows, drawn into one SVG.
pub(crate) fn run(p: &PlotArgs) -> std::process::ExitCode {
    let pts: Result<Vec<_>, String> = p.json.iter().map(|f| load(f)).collect();
    match pts.and_then(|pts| draw(&p.out, &p.title, &pts.concat())) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("collectix: cannot plot: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// One row as the plot needs it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Point {
    /// Where the row came from: "this run", or a JSON file's stem.
    pub(crate) source: String,
    /// The collective's name.
    pub(crate) collective: String,
    /// Ranks.
    pub(crate) ranks: u64,
    /// Size in bytes (nccl-tests' convention).
    pub(crate) size: f64,
    /// Bus bandwidth, GB/s.
    pub(crate) busbw: f64,
    /// Where the ranks ran (`local`, `tcp`, `shm`), where the row says.
    pub(crate) transport: Option<String>,
}

/// The rows of a `--json` file (`collectix bench`'s own, or a peer's converted to that
/// format by `bench/peers/side_by_side.py`), labelled with the file's stem. Unreadable files
/// and rows without the fields are errors, named.
pub(crate) fn load(path: &Path) -> Result<Vec<Point>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let rows: Vec<serde_json::Value> =
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let source = path.file_stem().map_or_else(
        || path.display().to_string(),
        |s| s.to_string_lossy().into(),
    );
    rows.iter()
        .enumerate()
        .map(|(i, r)| {
            let field = |k: &str| {
                r.get(k)
                    .ok_or_else(|| format!("{}: row {i} has no {k}", path.display()))
            };
            let num = |k: &str| {
                field(k)?
                    .as_f64()
                    .ok_or_else(|| format!("{}: row {i}: {k} is not a number", path.display()))
            };
            Ok(Point {
                source: r
                    .get("source")
                    .and_then(|v| v.as_str())
                    .map_or_else(|| source.clone(), str::to_string),
                collective: field("collective")?
                    .as_str()
                    .ok_or_else(|| format!("{}: row {i}: collective is not text", path.display()))?
                    .to_string(),
                ranks: num("ranks")? as u64,
                size: num("size")?,
                busbw: num("busbw_gbs")?,
                transport: r
                    .get("transport")
                    .and_then(|v| v.as_str())
                    .map(str::to_string),
            })
        })
        .collect()
}

/// The lines to draw: points with a size and a bandwidth, grouped, each line sorted by size.
fn lines(points: &[Point]) -> BTreeMap<String, Vec<(f64, f64)>> {
    let mut out: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for p in points.iter().filter(|p| p.size > 0.0 && p.busbw > 0.0) {
        let mut label = format!("{}: {} W={}", p.source, p.collective, p.ranks);
        if let Some(t) = &p.transport {
            label.push_str(&format!(" ({t})"));
        }
        out.entry(label).or_default().push((p.size, p.busbw));
    }
    for v in out.values_mut() {
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    out
}

/// "4 B", "1 MiB", …: a size for the axis.
fn size_label(b: f64) -> String {
    let units = [(1u64 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
    for (u, name) in units {
        let u = u as f64;
        if b >= u {
            return format!("{} {name}", (b / u * 10.0).round() / 10.0);
        }
    }
    format!("{} B", b.round())
}

/// Axis marks at powers of two between `lo` and `hi`: every power of 4 (4 B, 64 B,
/// 1 KiB, …), or every power of 2 on a narrow range.
fn key_sizes(lo: f64, hi: f64) -> Vec<f64> {
    let pow2: Vec<f64> = (0..64)
        .map(|k| (1u64 << k) as f64)
        .filter(|&v| v >= lo && v <= hi)
        .collect();
    if pow2.len() <= 8 {
        return pow2;
    }
    let step = pow2.len().div_ceil(8);
    pow2.into_iter().step_by(step).collect()
}

/// Draws `points` into the SVG file `path`.
pub(crate) fn draw(path: &Path, title: &str, points: &[Point]) -> Result<(), String> {
    let lines = lines(points);
    if lines.is_empty() {
        return Err("nothing to plot: no row has a size and a bandwidth".into());
    }
    let all = lines.values().flatten();
    let (mut xmin, mut xmax, mut ymin, mut ymax) = (f64::MAX, 0f64, f64::MAX, 0f64);
    for &(x, y) in all {
        xmin = xmin.min(x);
        xmax = xmax.max(x);
        ymin = ymin.min(y);
        ymax = ymax.max(y);
    }
    if xmax <= xmin {
        xmax = xmin * 2.0;
    }
    let err = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .margin_right(36)
        .x_label_area_size(40)
        .y_label_area_size(56)
        .build_cartesian_2d(
            (xmin..xmax)
                .log_scale()
                .with_key_points(key_sizes(xmin, xmax)),
            // Bandwidths over sizes that span 10^7 span decades too: a log scale, so that
            // the small sizes' lines are not flat on the axis.
            (ymin * 0.8..ymax * 1.25).log_scale(),
        )
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc("size (nccl-tests' convention)")
        .y_desc("busbw (GB/s)")
        .x_label_formatter(&|x| size_label(*x))
        .draw()
        .map_err(|e| err(&e))?;
    for (i, (label, pts)) in lines.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))
            .map_err(|e| err(&e))?
            .label(label.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
            });
        chart
            .draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled())))
            .map_err(|e| err(&e))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(source: &str, size: f64, busbw: f64) -> Point {
        Point {
            source: source.into(),
            collective: "all_reduce".into(),
            ranks: 2,
            size,
            busbw,
            transport: None,
        }
    }

    #[test]
    fn a_plot_has_a_line_per_source_and_leaves_out_rows_without_bandwidth() {
        let dir = std::env::temp_dir().join(format!("collectix-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or(());
        let json = dir.join("earlier.json");
        std::fs::write(
            &json,
            r#"[{"collective":"all_reduce","ranks":2,"size":1048576,"busbw_gbs":3.5},
                {"collective":"barrier","ranks":2,"size":0,"busbw_gbs":0.0}]"#,
        )
        .unwrap_or(());
        let mut points = load(&json).unwrap_or_default();
        assert_eq!(points.len(), 2);
        assert_eq!(points[0].source, "earlier");
        points.push(point("this run", 4.0, 0.01));
        points.push(point("this run", 1048576.0, 6.0));
        points.push(Point {
            transport: Some("shm".into()),
            ..point("shm run", 4.0, 0.02)
        });
        let l = lines(&points);
        assert_eq!(
            l.keys().cloned().collect::<Vec<_>>(),
            [
                "earlier: all_reduce W=2",
                "shm run: all_reduce W=2 (shm)",
                "this run: all_reduce W=2"
            ]
        );
        let svg = dir.join("plot.svg");
        assert_eq!(draw(&svg, "test", &points), Ok(()));
        let text = std::fs::read_to_string(&svg).unwrap_or_default();
        assert!(text.starts_with("<svg"), "{}", &text[..text.len().min(80)]);
        assert!(text.contains("this run: all_reduce W=2") && text.contains("earlier"));
        // A file without the fields is refused, naming it.
        std::fs::write(&json, r#"[{"collective":"all_reduce"}]"#).unwrap_or(());
        assert!(load(&json).is_err_and(|e| e.contains("earlier.json")));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
