//! One rank's measurement of one cell: the check, the calibrated warm-up, and the timed
//! samples, combined over the ranks with collectives outside the timed parts.

use super::args::Args;
use super::cell::{count_wrong, flatten, Cell, Collective};
use collectix::runtime::collective::{Output, Request};
use collectix::{
    Buffer, BufferWork, CallOptions, Communicator, Failed, ReduceOp, Result, SharedBuffer, Work,
};
use std::time::Instant;

/// How a rank waits for its calls: blocking its thread (a rank body on a thread of its own),
/// or awaiting them (an async rank body on the ranks' shared threads).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Waits {
    Block,
    Await,
}

impl Waits {
    async fn on<T>(self, w: Work<T>) -> Result<T> {
        match self {
            Waits::Block => w.wait(),
            Waits::Await => w.await,
        }
    }

    async fn on_buffers<T>(self, w: BufferWork<T>) -> std::result::Result<T, Failed> {
        match self {
            Waits::Block => w.wait(),
            Waits::Await => w.await,
        }
    }
}

/// One cell as one rank measured it, made the same on every rank by collectives: the wrong
/// elements over all ranks, the calls per sample, and each sample's slowest rank's time.
pub(super) struct Measured {
    pub(super) wrong: Option<usize>,
    pub(super) calls: usize,
    pub(super) slowest: Vec<f64>,
    /// The rank actor's wake-ups per call during the samples (the most on any rank): how
    /// often progress was left to the background driver instead of a waiting caller.
    pub(super) wakeups: f64,
    /// Rank 0's process's peak RSS during the warm-up and samples (MiB), and whether it
    /// covers only them (the peak was reset after the inputs were made and checked) or the
    /// whole run so far.
    pub(super) peak: Option<(f64, bool)>,
}

/// One call's requests, and with `--buffers` the buffers each writes its outputs into (taken
/// by each call and handed back).
struct Calls {
    reqs: Vec<Request>,
    outputs: Option<Vec<Vec<Buffer>>>,
    /// With `--in-place`, an all_gather's output buffer holding this rank's block, gathered
    /// into by every call.
    in_place: Option<SharedBuffer>,
}

impl Calls {
    fn new(a: &Args, c: &Communicator, reqs: Vec<Request>, opts: &CallOptions) -> Result<Calls> {
        let reqs = if a.shared {
            reqs.into_iter()
                .map(|q| q.try_map(|t| c.to_shared(&t), |s| s))
                .collect::<Result<_>>()?
        } else {
            reqs
        };
        let outputs = if a.buffers {
            if reqs.iter().any(Request::is_p2p) {
                return Err(collectix::Error::invalid(
                    "--buffers runs the collectives (send_recv has no buffer form here)",
                ));
            }
            let b = c.buffers().with_options(opts);
            Some(
                reqs.iter()
                    .map(|q| b.outputs_for(q))
                    .collect::<Result<_>>()?,
            )
        } else {
            None
        };
        let in_place = match &reqs[..] {
            [Request::AllGatherIntoTensor { input, output }] if a.in_place => {
                let mut b = c.alloc_shared(&output.shape, output.dtype)?;
                let own = input.nbytes();
                let at = c.rank() * own;
                b.bytes_mut()[at..at + own].copy_from_slice(input.bytes());
                Some(b)
            }
            _ => None,
        };
        Ok(Calls {
            reqs,
            outputs,
            in_place,
        })
    }

    /// One call of one request, its output dropped, waited for by blocking: done here, with
    /// nothing of the bench's own on its path (no future of the bench's); `false` for any
    /// other call, which [`submit_all`](Self::submit_all) makes.
    fn blocking_one(&mut self, m: Waits, c: &Communicator, opts: &CallOptions) -> Result<bool> {
        if let (Some(b), Waits::Block) = (&mut self.in_place, m) {
            return c
                .all_gather_into_tensor_in_place_with(b, opts)
                .wait()
                .map(|_| true);
        }
        match (&self.reqs[..], &self.outputs, m) {
            ([q], None, Waits::Block) => c.submit(q.clone(), opts).wait().map(|_| true),
            _ => Ok(false),
        }
    }

    /// One timed call, its outputs dropped.
    async fn timed(&mut self, m: Waits, c: &Communicator, opts: &CallOptions) -> Result<()> {
        if !self.blocking_one(m, c, opts)? {
            self.submit_all(m, c, opts, false).await?;
        }
        Ok(())
    }

    /// Submits every request of one call, then waits for each; their outputs in order (with
    /// `--buffers`, copies of the buffers only when `keep`: the check).
    async fn submit_all(
        &mut self,
        m: Waits,
        c: &Communicator,
        opts: &CallOptions,
        keep: bool,
    ) -> Result<Vec<Output>> {
        if let Some(b) = &mut self.in_place {
            let t = m
                .on(c.all_gather_into_tensor_in_place_with(b, opts))
                .await?;
            return Ok(if keep {
                vec![Output::Tensor(t)]
            } else {
                Vec::new()
            });
        }
        let Some(outputs) = &mut self.outputs else {
            if let [q] = &self.reqs[..] {
                if !keep {
                    // One call, its output dropped: nothing of the bench's own on its path.
                    m.on(c.submit(q.clone(), opts)).await?;
                    return Ok(Vec::new());
                }
            }
            let works: Vec<_> = self
                .reqs
                .iter()
                .map(|q| c.submit(q.clone(), opts))
                .collect();
            let mut got = Vec::with_capacity(works.len());
            for w in works {
                got.push(m.on(w).await?);
            }
            return Ok(got);
        };
        let b = c.buffers().with_options(opts);
        let works: Vec<_> = self
            .reqs
            .iter()
            .zip(outputs.iter_mut())
            .map(|(q, o)| b.submit(q.clone(), std::mem::take(o)))
            .collect();
        let mut got = Vec::new();
        for (w, o) in works.into_iter().zip(outputs.iter_mut()) {
            *o = m.on_buffers(w).await?;
            if keep {
                let tensors = o.iter().map(Buffer::to_tensor).collect::<Result<_>>()?;
                got.push(Output::Tensors(tensors));
            }
        }
        Ok(got)
    }
}

/// Resets this process's peak RSS to its current RSS (Linux: `clear_refs` with 5), so that
/// the next [`peak_rss_mib`] covers only what ran since; whether it could.
fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// This process's peak RSS (MiB), where the system tells it.
pub(super) fn peak_rss_mib() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

/// `v` reduced elementwise over every rank with `op`.
async fn over_ranks(m: Waits, c: &Communicator, v: Vec<f64>, op: ReduceOp) -> Result<Vec<f64>> {
    m.on(c.all_reduce(collectix::Tensor::from_vec(v), op))
        .await?
        .to_vec::<f64>()
}

/// Rank `r`'s part of one cell: the check (one call, every output element compared), the
/// warm-up (which calibrates `K`, the calls per sample, from the slowest rank), and the
/// samples (barrier, `K` calls); what each rank saw is combined with all_reduces outside the
/// timed parts.
pub(super) async fn measure(
    m: Waits,
    a: &Args,
    c: &Communicator,
    r: usize,
    cell: &Cell,
    opts: &CallOptions,
) -> Result<Measured> {
    let mut reqs = Calls::new(a, c, cell.requests(r)?, opts)?;
    let wrong = if a.check != 0 && a.collective != Collective::Barrier {
        Some(check(m, c, r, cell, &mut reqs, opts).await?)
    } else {
        None
    };
    m.on(c.barrier()).await?;
    // Every rank has made its inputs and finished its check: the peak from here on is the
    // calls' own (inputs, outputs and what the calls hold), not the check's reference copies.
    let reset = r == 0 && reset_peak_rss();
    let calls = calibrate(m, a, c, &mut reqs, opts).await?;
    let mut v = Vec::with_capacity(a.iters);
    let mut woken = 0;
    for _ in 0..a.iters.max(1) {
        m.on(c.barrier()).await?;
        let before = c.background_wakeups();
        let t0 = Instant::now();
        for _ in 0..calls {
            if !reqs.blocking_one(m, c, opts)? {
                reqs.submit_all(m, c, opts, false).await?;
            }
        }
        v.push(t0.elapsed().as_secs_f64() / calls as f64);
        woken += c.background_wakeups() - before;
    }
    let per_call = woken as f64 / (calls * a.iters.max(1) * reqs.reqs.len().max(1)) as f64;
    let peak = if r == 0 {
        peak_rss_mib().map(|m| (m, reset))
    } else {
        None
    };
    Ok(Measured {
        wrong,
        calls,
        slowest: over_ranks(m, c, v, ReduceOp::Max).await?,
        wakeups: over_ranks(m, c, vec![per_call], ReduceOp::Max).await?[0],
        peak,
    })
}

/// One call with every output element compared with what it must be; the wrong elements
/// over all ranks.
async fn check(
    m: Waits,
    c: &Communicator,
    r: usize,
    cell: &Cell,
    reqs: &mut Calls,
    opts: &CallOptions,
) -> Result<usize> {
    let out = reqs.submit_all(m, c, opts, true).await?;
    let want = cell.expected(r).unwrap_or_default();
    let mine = count_wrong(&flatten(&out)?, &want, cell.op, cell.dtype) as f64;
    Ok(over_ranks(m, c, vec![mine], ReduceOp::Sum).await?[0] as usize)
}

/// The warm-up calls (`-w`, at least one); the calls per sample that make a sample last about
/// `--sample-ms` on the slowest rank.
async fn calibrate(
    m: Waits,
    a: &Args,
    c: &Communicator,
    reqs: &mut Calls,
    opts: &CallOptions,
) -> Result<usize> {
    let t0 = Instant::now();
    for _ in 0..a.warmup.max(1) {
        reqs.timed(m, c, opts).await?;
    }
    let mine = t0.elapsed().as_secs_f64() / a.warmup.max(1) as f64;
    let per_call = over_ranks(m, c, vec![mine], ReduceOp::Max).await?[0].max(1e-9);
    Ok(((a.sample_ms / 1e3 / per_call).ceil() as usize).clamp(1, 100_000))
}
