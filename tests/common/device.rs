//! The device matrix: every collective's test cases with their tensors moved to a device,
//! run through a communicator's device backend and compared, back on the host, with the
//! host reference (`testing::Case::expected`).

use collectix::runtime::collective::{Output, Request};
use collectix::runtime::testing::{rooted, Case, COLLECTIVES};
use collectix::{
    CallOptions, DType, Device, DeviceBackend, ReduceOp, Result, Tensor, TensorDeviceExt, World,
};
use std::time::Duration;

/// `wait()` (which parks its caller on the rank once it has spun) on a thread of its own, at
/// most 60 s: a completion that does not wake a parked caller fails the test, not hangs it.
pub fn wait_parked<T: Send + 'static>(w: collectix::Work<T>) -> collectix::Result<T> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(w.wait());
    });
    rx.recv_timeout(Duration::from_secs(60))
        .unwrap_or_else(|_| panic!("a parked wait() was not woken"))
}

/// `req` with every tensor passed through `to` and every output spec on `device`.
pub fn on_device(req: Request, device: Device, to: &dyn Fn(Tensor) -> Tensor) -> Request {
    req.try_map(|t| Ok(to(t)), |s| s.on(device))
        .unwrap_or_else(|e| panic!("{e}"))
}

/// An output with every tensor copied to the host, and the device each was on.
pub fn to_host(o: Output) -> Result<(Output, Vec<Device>)> {
    let mut devs = Vec::new();
    let mut h = |t: Tensor| {
        devs.push(t.device());
        t.to_host()
    };
    let o = match o {
        Output::Tensor(t) => Output::Tensor(h(t)?),
        Output::Tensors(ts) => Output::Tensors(ts.into_iter().map(&mut h).collect::<Result<_>>()?),
        Output::Received { tensor, src } => Output::Received {
            tensor: h(tensor)?,
            src,
        },
        other => other,
    };
    Ok((o, devs))
}

/// The matrix for a world of `w`: every collective (barrier aside) × counts × a spread of
/// dtypes and ops.
pub fn cases(w: usize) -> Vec<Case> {
    let mut out = Vec::new();
    for kind in COLLECTIVES {
        if kind == collectix::OpKind::Barrier {
            continue;
        }
        for (count, dtype, op) in [
            (0, DType::F32, ReduceOp::Sum),
            (1, DType::F32, ReduceOp::Sum),
            (5, DType::F64, ReduceOp::Max),
            (17, DType::I32, ReduceOp::Min),
            (33, DType::BF16, ReduceOp::Sum),
            (9, DType::F16, ReduceOp::Avg),
            (8, DType::I64, ReduceOp::Product),
            (7, DType::I8, ReduceOp::Sum),
            (6, DType::U8, ReduceOp::Max),
            (1000, DType::F32, ReduceOp::PremulSum(0.5)),
        ] {
            let root = if rooted(kind) { (count + 1) % w } else { 0 };
            out.push(Case {
                kind,
                size: w,
                count,
                dtype,
                op,
                root,
                algorithm: None,
            });
        }
    }
    out
}

/// Runs `cases` on `world` through `backend`, every rank's tensors made by `to` on
/// `device`; returns a description of each wrong or failed result (empty when all match).
pub fn run(
    world: &World,
    backend: DeviceBackend,
    device: Device,
    cases: &[Case],
    to: &dyn Fn(Tensor) -> Tensor,
) -> Vec<String> {
    let comms: Vec<_> = world
        .communicators()
        .iter()
        .map(|c| c.with_device_backend(backend))
        .collect();
    let mut works = Vec::new();
    for case in cases {
        for (r, c) in comms.iter().enumerate() {
            let req = on_device(case.request(r), device, to);
            works.push((case, r, c.submit(req, &CallOptions::default())));
        }
    }
    let mut wrong = Vec::new();
    for (case, r, work) in works {
        let got = match work.wait_timeout(Duration::from_secs(60)) {
            None => {
                wrong.push(format!("{case:?} rank {r}: no result within 60 s"));
                continue;
            }
            Some(Err(e)) => {
                wrong.push(format!("{case:?} rank {r}: {e}"));
                continue;
            }
            Some(Ok(o)) => o,
        };
        match to_host(got) {
            Err(e) => wrong.push(format!("{case:?} rank {r}: to_host: {e}")),
            Ok((host, devs)) => {
                if let Some(d) = devs.iter().find(|d| **d != device) {
                    wrong.push(format!("{case:?} rank {r}: an output on {d}, not {device}"));
                }
                if host != case.expected(r) {
                    wrong.push(format!(
                        "{case:?} rank {r}: got {host:?}, want {:?}",
                        case.expected(r)
                    ));
                }
            }
        }
    }
    wrong
}
