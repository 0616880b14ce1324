//! Liveness through real rank actors: every collective and send/recv, driven the way users
//! drive them — each rank on its own thread in an issue → wait loop, one rank starting late
//! (so the others run ahead by themselves: roots, non-roots of reduce and gather, senders
//! complete at once) — with windows 1, 2 and the default. Every call must complete with the
//! right value well before the group's timeout (a stall ends in `Timeout`, which fails here).

mod common;
use collectix::runtime::collective::{Output, Request};
use collectix::runtime::testing::{Case, COLLECTIVES};
use collectix::{CallOptions, DType, GroupOptions, ReduceOp, Tensor, TensorSpec, World};
use std::time::Duration;

const CALLS: usize = 40;

fn call(
    kind: Option<collectix::OpKind>,
    w: usize,
    r: usize,
    k: usize,
) -> Option<(Request, Output)> {
    let count = 1 + k % 3;
    match kind {
        Some(kind) => {
            let case = Case {
                kind,
                size: w,
                count,
                dtype: DType::I32,
                op: ReduceOp::Sum,
                root: 0,
                algorithm: None,
            };
            Some((case.request(r), case.expected(r)))
        }
        None => {
            let data = Tensor::from_vec(vec![k as i32; count]);
            match r {
                0 => Some((
                    Request::Send {
                        tensor: data,
                        dst: 1,
                        tag: 1,
                    },
                    Output::None,
                )),
                1 => Some((
                    Request::Recv {
                        spec: TensorSpec::new(&[count], DType::I32),
                        src: Some(0),
                        tag: 1,
                    },
                    Output::Received {
                        tensor: data,
                        src: 0,
                    },
                )),
                _ => None,
            }
        }
    }
}

fn run(kind: Option<collectix::OpKind>, w: usize, window: u64, late: usize) {
    let opts = GroupOptions {
        window,
        timeout: Duration::from_secs(20),
        ..GroupOptions::default()
    };
    let world = World::local_with(w, opts).unwrap_or_else(|e| panic!("{e}"));
    std::thread::scope(|s| {
        for (r, c) in world.communicators().iter().enumerate() {
            s.spawn(move || {
                if r == late {
                    std::thread::sleep(Duration::from_millis(30));
                }
                for k in 0..CALLS {
                    let Some((req, want)) = call(kind, w, r, k) else {
                        return;
                    };
                    let got = c.submit(req, &CallOptions::default()).wait();
                    assert_eq!(
                        got.ok(),
                        Some(want),
                        "{kind:?} w={w} window={window} rank {r} call {k}"
                    );
                }
            });
        }
    });
}

#[test]
fn issue_wait_loops_with_a_late_rank_complete_for_every_collective() {
    for w in [2, 3] {
        for kind in COLLECTIVES.into_iter().map(Some).chain([None]) {
            for window in [1, 2, 16] {
                // The root (rank 0) late, and a non-root late.
                run(kind, w, window, 0);
                run(kind, w, window, w - 1);
            }
        }
    }
}
