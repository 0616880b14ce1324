//! Ranks of one host told different transports (`COLLECTIX_TRANSPORT`,
//! `InitArgs::transport`): what they can do together is decided from what every rank
//! published (`collectix::runtime::join`), alike on every rank.

use crate::common;

use collectix::{GroupOptions, ReduceOp, Tensor};
use std::time::Duration;

fn f32s(t: &Tensor) -> Vec<f32> {
    t.to_vec::<f32>().unwrap_or_else(|e| panic!("{e}"))
}

/// Ranks `0..settings.len()` of one host joining a job, rank `r` told to use `settings[r]`:
/// what each `init` gave (the world's locality and the sum of an all_reduce, or the error).
fn mixed_settings(
    settings: &[collectix::Transport],
) -> Vec<Result<(collectix::runtime::Locality, Vec<f32>), String>> {
    let port = common::free_port();
    let w = settings.len();
    std::thread::scope(|s| {
        let hs: Vec<_> = settings
            .iter()
            .enumerate()
            .map(|(r, &t)| {
                s.spawn(move || {
                    let args = collectix::InitArgs {
                        transport: Some(t),
                        ..common::tcp_args(port, r, w, "the mixed settings' secret", false)
                    };
                    let opts = GroupOptions::default().with_timeout(Duration::from_secs(20));
                    let p = collectix::init(&args, opts, Duration::from_secs(20))
                        .map_err(|e| e.to_string())?;
                    let c = p.communicator();
                    let sum = c
                        .all_reduce(Tensor::from_vec(vec![r as f32 + 1.0]), ReduceOp::Sum)
                        .wait()
                        .map_err(|e| e.to_string())?;
                    let out = (c.locality(), f32s(&sum));
                    p.shutdown().map_err(|e| e.to_string())?;
                    Ok(out)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("panicked".into())))
            .collect()
    })
}

#[test]
fn one_rank_told_tcp_among_ranks_on_auto_picks_the_locality_they_pick() {
    // Each rank decides the world's locality from what every rank published, not from its
    // own setting: on the code before, rank 1 took HostTcp's table and the others Host's.
    use collectix::Transport::{Auto, Tcp};
    let got = mixed_settings(&[Auto, Tcp, Auto]);
    let want = if cfg!(target_os = "linux") {
        collectix::runtime::Locality::Host
    } else {
        collectix::runtime::Locality::HostTcp
    };
    for (r, g) in got.into_iter().enumerate() {
        assert_eq!(g, Ok((want, vec![6.0])), "rank {r}");
    }
}

#[test]
fn shared_memory_only_and_tcp_only_on_one_host_fail_init_on_every_rank_naming_both() {
    use collectix::Transport::{Auto, Shm, Tcp};
    for (r, g) in mixed_settings(&[Shm, Tcp, Auto]).into_iter().enumerate() {
        let e = g.err().unwrap_or_default();
        assert!(
            e.contains("rank 0")
                && e.contains("rank 1")
                && e.contains("COLLECTIX_TRANSPORT=shm")
                && e.contains("COLLECTIX_TRANSPORT=tcp"),
            "rank {r}: {e:?}"
        );
    }
}
