//! The sweep: the world is started, then for each size every rank makes its cell and
//! measures it, and the printing process prints its row; the summary closes the table.

use super::args::{Args, Dev};
use super::cell::Cell;
use super::ranks::{binds, device_backend, Ranks};
use super::report::{Row, Table};
use collectix::{Algorithm, CallOptions, Device, Result};
use std::sync::Arc;

/// The sweep on the ranks this process drives; `None` where it is a rank other than 0 of a
/// TCP job (which prints nothing).
pub(super) fn run(a: &Args) -> Result<Option<Vec<Row>>> {
    let opts = call_options(a)?;
    let device_of = devices(a.device)?;
    let backend = device_backend(a.backend);
    let ranks = Ranks::start(a, backend)?;
    let w = ranks.size();
    let bind = binds(a, w);
    // Only the printing process prints: every line below goes through `table`.
    let table = Table {
        prints: ranks.prints(),
    };
    let sizes = a.sizes();
    table.head(a, w, bind, backend);
    let mut rows = Vec::new();
    let mut woken = Vec::new();
    let mut peaks: Vec<(f64, bool)> = Vec::new();
    for (k, &bytes) in sizes.iter().enumerate() {
        table.progress(k, sizes.len(), bytes);
        let cells = match cells(a, w, bytes, &device_of) {
            Ok(c) => c,
            Err(why) => {
                table.say(format!("# {bytes} B skipped: {why}"));
                continue;
            }
        };
        let cells = Arc::new(cells);
        let m = ranks.measure(a, bind, &cells, &opts)?;
        woken.push((bytes, m.wakeups));
        peaks.extend(m.peak);
        let row = Row::new(a, w, bytes, &cells[0], m);
        table.row(&row);
        rows.push(row);
    }
    table.progress_done();
    table.summary(&rows, &woken, &peaks, ranks.is_processes());
    ranks.shutdown()?;
    if rows.is_empty() {
        // Every rank skips alike: each fails, so the job's exit says so.
        return Err(collectix::Error::invalid(format!(
            "every size was skipped ({} of them): nothing was measured",
            sizes.len()
        )));
    }
    Ok(table.prints.then_some(rows))
}

/// The calls' options: `--algorithm` (auto, or a name collectix knows).
fn call_options(a: &Args) -> Result<CallOptions> {
    let algorithm = match a.algorithm.as_str() {
        "auto" => None,
        name => Some(
            Algorithm::from_name(name)
                .ok_or_else(|| collectix::Error::invalid(format!("unknown algorithm {name}")))?,
        ),
    };
    Ok(CallOptions {
        algorithm,
        timeout: None,
    })
}

/// Where rank `r`'s tensors live: the host, GPU `r` mod the GPUs there are, or (stand-ins)
/// cuda:0.
fn devices(dev: Dev) -> Result<impl Fn(usize) -> Device> {
    let gpus = match dev {
        Dev::Cpu | Dev::Standin => 1,
        Dev::Cuda => collectix::device::cuda_devices()?.max(1),
    };
    Ok(move |r: usize| match dev {
        Dev::Cpu => Device::Host,
        Dev::Cuda | Dev::Standin => Device::Cuda((r as u32) % gpus),
    })
}

/// Every rank's cell for `bytes` in a world of `w`, or why that size is skipped. Each rank's
/// device can differ; the row's cell is rank 0's, and each rank's requests are made on its
/// own.
fn cells(
    a: &Args,
    w: usize,
    bytes: usize,
    device_of: &impl Fn(usize) -> Device,
) -> std::result::Result<Vec<Cell>, String> {
    let (dtype, op) = (a.dtype.dtype(), a.op.reduce_op());
    (0..w)
        .map(|r| {
            Cell::new(a.collective, w, bytes, dtype, op, a.root, device_of(r))
                .map(|c| c.with_stand_in(a.device == Dev::Standin))
        })
        .collect()
}
