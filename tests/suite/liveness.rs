//! Liveness through real rank actors: every collective and send/recv, driven the way users
//! drive them — each rank on its own thread in an issue → wait loop, one rank starting late
//! (so the others run ahead by themselves: roots, non-roots of reduce and gather, senders
//! complete at once) — with windows 1, 2 and the default. Every call must complete with the
//! right value well before the group's timeout (a stall ends in `Timeout`, which fails here).

use collectix::runtime::testing::{sequence_call, COLLECTIVES};
use collectix::{CallOptions, GroupOptions, World};
use std::time::Duration;

const CALLS: usize = 40;

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
                    let Some((req, want)) = sequence_call(kind, w, r, k as u64) else {
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
