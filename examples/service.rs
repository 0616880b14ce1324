//! An async service that embeds a communicator: each process of a job serves a small HTTP
//! API on tokio (hyper), and a request all-reduces a counter across the ranks.
//!
//! - `POST /add?n=N` (any rank) adds `N` to this rank's counter and answers it.
//! - `GET /sum` (rank 0) answers the sum of every rank's counter: rank 0 broadcasts the
//!   command to the other ranks, which each run a task awaiting rank 0's commands, and all
//!   ranks then all-reduce their counters. Requests that come at once take turns (the calls
//!   of one group are made in one order on every rank).
//! - `GET /` says which rank this is.
//! - `GET /metrics` answers this rank's metrics in Prometheus's text format: collectix's calls,
//!   bytes, latencies, errors by kind, peers lost, connections refused
//!   (`collectix::actors::metrics`), through the `metrics` facade and its Prometheus recorder,
//!   installed before `collectix::init`.
//!
//! Rank `r` listens on `127.0.0.1:(SERVICE_PORT + r)` (`SERVICE_PORT` defaults to 8000) and
//! prints `rank R: serving on ADDR` when it is ready. SIGTERM (or Ctrl-C) stops it gracefully:
//! it stops accepting, finishes the requests in flight, rank 0 tells the others to stop, each
//! leaves the job in order, prints `rank R: stopped cleanly` and exits 0.
//!
//! ```text
//! collectix launch --nproc-per-node 3 -- target/debug/examples/service
//! curl -X POST 'http://127.0.0.1:8001/add?n=5'; curl http://127.0.0.1:8000/sum
//! ```
//!
//! `collectix::init` blocks (the rendezvous) and runs its own actor system on a thread of its
//! own, so it is called before the tokio runtime starts; the communicator's `Work` handles
//! are futures any task can `.await`.

mod common;
use bytes::Bytes;
use collectix::{Communicator, ReduceOp, Tensor};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Rank 0's commands to the other ranks (a one-element broadcast).
const SUM: i64 = 1;
const STOP: i64 = 2;

struct App {
    comm: Communicator,
    /// Renders what the Prometheus recorder holds.
    metrics: PrometheusHandle,
    counter: AtomicI64,
    /// Rank 0: one command (broadcast + all_reduce) at a time.
    turn: tokio::sync::Mutex<()>,
}

impl App {
    /// The collective part of `GET /sum`, as every rank makes it.
    async fn sum(&self) -> collectix::Result<i64> {
        let mine = Tensor::from_vec(vec![self.counter.load(Ordering::SeqCst)]);
        let total = self.comm.all_reduce(mine, ReduceOp::Sum).await?;
        Ok(total.to_vec::<i64>()?[0])
    }

    /// Rank 0: sends `cmd` to the other ranks, and runs it itself.
    async fn command(&self, cmd: i64) -> collectix::Result<Option<i64>> {
        let _turn = self.turn.lock().await;
        self.comm.broadcast(Tensor::from_vec(vec![cmd]), 0).await?;
        match cmd {
            SUM => self.sum().await.map(Some),
            _ => Ok(None),
        }
    }

    /// Ranks other than 0: follows rank 0's commands until it says stop.
    async fn follow(&self) -> collectix::Result<()> {
        loop {
            let cmd = self.comm.broadcast(Tensor::from_vec(vec![0i64]), 0).await?;
            match cmd.to_vec::<i64>()?[0] {
                SUM => {
                    self.sum().await?;
                }
                _ => return Ok(()),
            }
        }
    }

    async fn handle(&self, req: Request<Incoming>) -> Response<Full<Bytes>> {
        let reply = |status: StatusCode, text: String| {
            let mut r = Response::new(Full::new(Bytes::from(text + "\n")));
            *r.status_mut() = status;
            r
        };
        let rank = self.comm.rank();
        match (req.method(), req.uri().path()) {
            (&Method::GET, "/") => reply(
                StatusCode::OK,
                format!("rank {rank} of {}", self.comm.size()),
            ),
            (&Method::POST, "/add") => {
                let n = req
                    .uri()
                    .query()
                    .and_then(|q| q.strip_prefix("n="))
                    .and_then(|n| n.parse::<i64>().ok());
                match n {
                    Some(n) => {
                        let now = self.counter.fetch_add(n, Ordering::SeqCst) + n;
                        reply(StatusCode::OK, now.to_string())
                    }
                    None => reply(StatusCode::BAD_REQUEST, "give n=INTEGER".into()),
                }
            }
            (&Method::GET, "/sum") if rank == 0 => match self.command(SUM).await {
                Ok(Some(total)) => reply(StatusCode::OK, total.to_string()),
                Ok(None) => reply(StatusCode::INTERNAL_SERVER_ERROR, "no sum".into()),
                Err(e) => reply(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
            },
            (&Method::GET, "/sum") => reply(StatusCode::MISDIRECTED_REQUEST, "ask rank 0".into()),
            (&Method::GET, "/metrics") => reply(StatusCode::OK, self.metrics.render()),
            _ => reply(
                StatusCode::NOT_FOUND,
                "GET /, POST /add?n=N, GET /sum, GET /metrics".into(),
            ),
        }
    }
}

/// Resolves on SIGTERM or Ctrl-C.
async fn stop_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

fn main() -> common::Main {
    common::Main(body())
}

/// What `main` does.
fn body() -> collectix::Result<()> {
    common::init_tracing();
    // The application's choice of recorder, installed before collectix is: every call from
    // here on is counted.
    let metrics = PrometheusBuilder::new()
        .install_recorder()
        .map_err(|e| collectix::Error::Resource(format!("no metrics recorder: {e}")))?;
    let process = collectix::init(
        &collectix::InitArgs::default(),
        collectix::GroupOptions::default(),
        Duration::from_secs(120),
    )?;
    let rank = process.communicator().rank();
    let app = Arc::new(App {
        comm: process.communicator().clone(),
        metrics,
        counter: AtomicI64::new(0),
        turn: tokio::sync::Mutex::new(()),
    });
    let base: u16 = std::env::var("SERVICE_PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(8000);
    let port = base
        .checked_add(rank as u16)
        .ok_or_else(|| collectix::Error::invalid("SERVICE_PORT + rank is above 65535"))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| collectix::Error::Resource(format!("no tokio runtime: {e}")))?;
    let served = runtime.block_on(serve(app.clone(), port));
    drop(runtime);
    served?;
    process.shutdown()?;
    println!("rank {rank}: stopped cleanly");
    Ok(())
}

/// Serves HTTP until SIGTERM, then stops in order (see the module doc).
async fn serve(app: Arc<App>, port: u16) -> collectix::Result<()> {
    let rank = app.comm.rank();
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .map_err(|e| collectix::Error::Resource(format!("cannot listen on port {port}: {e}")))?;
    let follower = (rank != 0).then(|| {
        let app = app.clone();
        tokio::spawn(async move { app.follow().await })
    });
    println!("rank {rank}: serving on 127.0.0.1:{port}");
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let stop = stop_signal();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let app = app.clone();
                let service = hyper::service::service_fn(move |req| {
                    let app = app.clone();
                    async move { Ok::<_, std::convert::Infallible>(app.handle(req).await) }
                });
                let conn = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service);
                let conn = graceful.watch(conn);
                tokio::spawn(async move {
                    let _ = conn.await;
                });
            }
            _ = &mut stop => break,
        }
    }
    drop(listener);
    // The requests in flight finish (for at most 10 s).
    let _ = tokio::time::timeout(Duration::from_secs(10), graceful.shutdown()).await;
    match follower {
        None => {
            app.command(STOP).await?;
        }
        Some(task) => {
            task.await
                .map_err(|e| collectix::Error::internal(format!("the follower task: {e}")))??;
        }
    }
    Ok(())
}
