//! Flow control: a rank that runs far ahead cannot grow a peer's queues without limit; what it
//! sends waits in its own engine until the peer makes the calls, and then everything completes.

use collectix_runtime::group::{CallOptions, GroupId, GroupOptions};
use collectix_runtime::sim::Sim;
use collectix_runtime::{Output, Request, Tensor};

#[test]
fn a_root_far_ahead_is_held_to_the_window() {
    for seed in 0..5 {
        let window = 4;
        let mut sim = Sim::with_options(
            3,
            seed,
            GroupOptions {
                window,
                ..GroupOptions::default()
            },
        );
        let calls = 50u64;
        let data = |k: u64| Tensor::from_vec(vec![k as i64; 3]);
        let mut roots = Vec::new();
        for k in 0..calls {
            let req = Request::Broadcast {
                tensor: data(k),
                root: 0,
            };
            roots.push(
                sim.submit(0, GroupId::WORLD, req, &CallOptions::default())
                    .unwrap_or_else(|e| panic!("{e}")),
            );
        }
        sim.run_no_timeouts(1_000_000)
            .unwrap_or_else(|e| panic!("{e:?}"));
        let peer = |sim: &Sim, r| sim.engine(r).map_or(usize::MAX, |e| e.buffered());
        // Ranks 1 and 2 made no call: each buffers at most `window` calls' messages.
        assert!(
            peer(&sim, 1) <= window as usize && peer(&sim, 2) <= window as usize,
            "seed {seed}"
        );
        assert!(sim.engine(0).map_or(0, |e| e.held()) >= 2 * (calls - window) as usize);
        // The root's calls completed (a root's broadcast completes once its part is done).
        for id in &roots {
            assert!(matches!(sim.take(0, *id), Some(Ok(_))));
        }
        // Now the others make the calls: everything arrives, in order, and nothing is left.
        let mut others = Vec::new();
        for k in 0..calls {
            for r in 1..3 {
                let req = Request::Broadcast {
                    tensor: Tensor::zeros(&[3], collectix_runtime::DType::I64)
                        .unwrap_or_else(|e| panic!("{e}")),
                    root: 0,
                };
                others.push((
                    r,
                    k,
                    sim.submit(r, GroupId::WORLD, req, &CallOptions::default())
                        .unwrap_or_else(|e| panic!("{e}")),
                ));
            }
        }
        sim.run_no_timeouts(1_000_000)
            .unwrap_or_else(|e| panic!("{e:?}\n{}", sim.trace_text()));
        for (r, k, id) in others {
            assert_eq!(
                sim.take(r, id),
                Some(Ok(Output::Tensor(data(k)))),
                "seed {seed} rank {r} call {k}"
            );
        }
        for r in 0..3 {
            assert_eq!(
                sim.engine(r).map(|e| (e.held(), e.buffered())),
                Some((0, 0)),
                "rank {r}"
            );
        }
    }
}
