//! Point-to-point, process groups and object collectives on in-process ranks.

use crate::common;
use collectix::{Communicator, DType, Error, P2POp, ReduceOp, Tensor, TensorSpec, World};
use common::wait_all;
use serde::{Deserialize, Serialize};
use std::time::Duration;

fn world(n: usize) -> World {
    World::local(n).unwrap_or_else(|e| panic!("{e}"))
}

fn v(t: &Tensor) -> Vec<i64> {
    t.to_vec::<i64>().unwrap_or_default()
}

#[test]
fn send_recv_matches_per_peer_and_tag_in_fifo_order() {
    let w = world(3);
    let c = w.communicators();
    // Posted before the sends: receives wait; tag 2 is received before tag 1 although sent later.
    let r_tag2 = c[1].recv(TensorSpec::new(&[1], DType::I64), Some(0), 2);
    let r_a = c[1].recv(TensorSpec::new(&[1], DType::I64), Some(0), 1);
    for k in 0..3 {
        drop(c[0].send(Tensor::from_vec(vec![k as i64]), 1, 1));
    }
    drop(c[0].send(Tensor::from_vec(vec![99i64]), 1, 2));
    let r_b = c[1].recv(TensorSpec::new(&[1], DType::I64), Some(0), 1);
    let r_c = c[1].recv(TensorSpec::new(&[1], DType::I64), Some(0), 1);
    let got: Vec<_> = wait_all(vec![r_tag2, r_a, r_b, r_c], 30)
        .into_iter()
        .map(|r| r.map(|(t, s)| (v(&t), s)))
        .collect();
    assert_eq!(
        got,
        vec![
            Ok((vec![99], 0)),
            Ok((vec![0], 0)),
            Ok((vec![1], 0)),
            Ok((vec![2], 0))
        ]
    );
}

#[test]
fn sends_on_many_tags_beyond_the_window_are_received_in_any_order() {
    // Window 2, 64 tags: rank 0 sends on every tag before rank 1 posts a receive, then rank
    // 1 receives them in reverse tag order, one call at a time. The eager budget spans all
    // tags, so most sends wait in rank 0 until a receive solicits them.
    let w = World::local_with(
        2,
        collectix::GroupOptions {
            window: 2,
            ..collectix::GroupOptions::default()
        },
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let c = w.communicators();
    for t in 0..64u32 {
        drop(c[0].send(Tensor::from_vec(vec![i64::from(t)]), 1, t));
    }
    std::thread::sleep(Duration::from_millis(20));
    for t in (0..64u32).rev() {
        let r = c[1].recv(TensorSpec::new(&[1], DType::I64), Some(0), t);
        let got = wait_all(vec![r], 30)
            .pop()
            .map(|r| r.map(|(t, s)| (v(&t), s)));
        assert_eq!(got, Some(Ok((vec![i64::from(t)], 0))), "tag {t}");
    }
}

#[test]
fn recv_from_any_source_returns_the_sender() {
    let w = world(4);
    let c = w.communicators();
    let recvs: Vec<_> = (0..3)
        .map(|_| c[0].recv(TensorSpec::new(&[2], DType::I64), None, 5))
        .collect();
    for (r, sender) in c.iter().enumerate().skip(1) {
        drop(sender.send(Tensor::from_vec(vec![r as i64, 10 * r as i64]), 0, 5));
    }
    let mut senders: Vec<usize> = wait_all(recvs, 30)
        .into_iter()
        .map(|r| {
            let (t, s) = r.unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(v(&t), vec![s as i64, 10 * s as i64]);
            s
        })
        .collect();
    senders.sort();
    assert_eq!(senders, vec![1, 2, 3]);
}

#[test]
fn batch_isend_irecv_ring_exchange() {
    let n = 4;
    let w = world(n);
    let mut all = Vec::new();
    for c in w.communicators() {
        let r = c.rank();
        let ops = vec![
            P2POp::Send {
                tensor: Tensor::from_vec(vec![r as i64]),
                peer: (r + 1) % n,
                tag: 0,
            },
            P2POp::Recv {
                spec: TensorSpec::new(&[1], DType::I64),
                peer: (r + n - 1) % n,
                tag: 0,
            },
        ];
        all.push(c.batch_isend_irecv(ops));
    }
    for (r, works) in all.into_iter().enumerate() {
        let res = wait_all(works, 30);
        assert!(matches!(res[0], Ok(None)));
        let got = res[1].as_ref().ok().and_then(|t| t.as_ref().map(v));
        assert_eq!(got, Some(vec![((r + n - 1) % n) as i64]));
    }
}

fn group_sum(c: &Communicator, value: i64) -> i64 {
    c.all_reduce(Tensor::from_vec(vec![value]), ReduceOp::Sum)
        .wait()
        .map(|t| v(&t)[0])
        .unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn new_group_members_and_outsiders() {
    let w = world(4);
    let groups = wait_all(
        w.communicators()
            .iter()
            .map(|c| c.new_group(&[3, 1]))
            .collect(),
        30,
    );
    let mut handles = Vec::new();
    for (r, g) in groups.into_iter().enumerate() {
        let g = g.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(g.is_some(), r == 1 || r == 3, "rank {r}");
        if let Some(g) = g {
            assert_eq!(g.size(), 2);
            assert_eq!(
                g.rank(),
                if r == 3 { 0 } else { 1 },
                "group ranks follow the list's order"
            );
            assert_eq!(g.members(), &[3, 1]);
            handles.push(std::thread::spawn(move || group_sum(&g, r as i64)));
        }
    }
    for h in handles {
        assert_eq!(h.join().ok(), Some(4));
    }
}

#[test]
fn group_ids_agree_and_differ_between_groups() {
    let w = world(2);
    let a = wait_all(
        w.communicators()
            .iter()
            .map(|c| c.new_group(&[0, 1]))
            .collect(),
        30,
    );
    let b = wait_all(
        w.communicators()
            .iter()
            .map(|c| c.new_group(&[0, 1]))
            .collect(),
        30,
    );
    let id = |r: &collectix::Result<Option<Communicator>>| {
        r.as_ref()
            .ok()
            .and_then(|g| g.as_ref().map(Communicator::group_id))
    };
    assert_eq!(id(&a[0]), id(&a[1]));
    assert_eq!(id(&b[0]), id(&b[1]));
    assert_ne!(
        id(&a[0]),
        id(&b[0]),
        "a second group with the same members is a new group"
    );
}

#[test]
fn split_by_color_orders_by_key() {
    let w = world(6);
    let works: Vec<_> = w
        .communicators()
        .iter()
        .map(|c| {
            let r = c.rank();
            let color = if r == 5 { None } else { Some((r % 2) as u32) };
            c.split(color, -(r as i64))
        })
        .collect();
    let res = wait_all(works, 30);
    let mut handles = Vec::new();
    for (r, g) in res.into_iter().enumerate() {
        let g = g.unwrap_or_else(|e| panic!("{e}"));
        if r == 5 {
            assert!(g.is_none());
            continue;
        }
        let g = g.unwrap_or_else(|| panic!("rank {r} has no group"));
        let want: Vec<usize> = if r % 2 == 0 {
            vec![4, 2, 0]
        } else {
            vec![3, 1]
        };
        assert_eq!(g.members(), &want[..], "rank {r}");
        handles.push(std::thread::spawn(move || (r, group_sum(&g, r as i64))));
    }
    for h in handles {
        let (r, s) = h.join().unwrap_or((usize::MAX, 0));
        assert_eq!(s, if r % 2 == 0 { 6 } else { 4 });
    }
}

#[test]
fn subgroups_and_overlapping_groups_run_concurrently() {
    let w = world(4);
    let subs = wait_all(
        w.communicators()
            .iter()
            .map(|c| c.new_subgroups(2))
            .collect(),
        30,
    );
    let left = wait_all(
        w.communicators()
            .iter()
            .map(|c| c.new_group(&[0, 1, 2]))
            .collect(),
        30,
    );
    let right = wait_all(
        w.communicators()
            .iter()
            .map(|c| c.new_group(&[1, 2, 3]))
            .collect(),
        30,
    );
    let mut pending = Vec::new();
    for r in 0..4 {
        let sub = subs[r].as_ref().unwrap_or_else(|e| panic!("{e}")).clone();
        assert_eq!(sub.members(), if r < 2 { &[0, 1] } else { &[2, 3] });
        let l = left[r].as_ref().ok().and_then(Clone::clone);
        let rt = right[r].as_ref().ok().and_then(Clone::clone);
        let world_c = w.communicators()[r].clone();
        // The same issue order on every rank: left, right, sub, world; all in flight at once.
        let x = Tensor::from_vec(vec![1i64 << r]);
        let lw = l.map(|g| g.all_reduce(x.clone(), ReduceOp::Sum));
        let rw = rt.map(|g| g.all_reduce(x.clone(), ReduceOp::Sum));
        let sw = sub.all_reduce(x.clone(), ReduceOp::Sum);
        let ww = world_c.all_reduce(x, ReduceOp::Sum);
        pending.push((r, lw, rw, sw, ww));
    }
    for (r, lw, rw, sw, ww) in pending {
        let get = |w: collectix::Work<Tensor>| {
            w.wait()
                .map(|t| v(&t)[0])
                .unwrap_or_else(|e| panic!("rank {r}: {e}"))
        };
        if let Some(lw) = lw {
            assert_eq!(get(lw), 0b0111);
        }
        if let Some(rw) = rw {
            assert_eq!(get(rw), 0b1110);
        }
        assert_eq!(get(sw), if r < 2 { 0b0011 } else { 0b1100 });
        assert_eq!(get(ww), 0b1111);
    }
}

#[derive(Serialize, Deserialize, Debug, PartialEq, Clone)]
struct Config {
    lr: f64,
    name: String,
    layers: Vec<u32>,
}

#[test]
fn object_collectives() {
    let n = 3;
    let w = world(n);
    let cfg = Config {
        lr: 0.01,
        name: "resnet".into(),
        layers: vec![3, 4, 6, 3],
    };
    let b: Vec<_> = w
        .communicators()
        .iter()
        .map(|c| c.broadcast_object((c.rank() == 1).then(|| cfg.clone()), 1))
        .collect();
    for r in wait_all(b, 30) {
        assert_eq!(r.ok(), Some(cfg.clone()));
    }
    let ag: Vec<_> = w
        .communicators()
        .iter()
        .map(|c| c.all_gather_object(&format!("rank-{}", "x".repeat(c.rank()))))
        .collect();
    for r in wait_all(ag, 30) {
        assert_eq!(
            r.ok(),
            Some(vec!["rank-".to_string(), "rank-x".into(), "rank-xx".into()])
        );
    }
    let g: Vec<_> = w
        .communicators()
        .iter()
        .map(|c| c.gather_object(&vec![c.rank(); c.rank() + 1], 2))
        .collect();
    for (r, res) in wait_all(g, 30).into_iter().enumerate() {
        let want = (r == 2).then(|| vec![vec![0], vec![1, 1], vec![2, 2, 2]]);
        assert_eq!(res.ok(), Some(want));
    }
    let s: Vec<_> = w
        .communicators()
        .iter()
        .map(|c| c.scatter_object((c.rank() == 0).then(|| vec![Some(1u8), None, Some(3)]), 0))
        .collect();
    assert_eq!(
        wait_all(s, 30)
            .into_iter()
            .map(Result::ok)
            .collect::<Vec<_>>(),
        vec![Some(Some(1)), Some(None), Some(Some(3))]
    );
    // A root that passes the wrong number of objects fails everywhere; nobody hangs.
    let bad: Vec<_> = w
        .communicators()
        .iter()
        .map(|c| c.scatter_object((c.rank() == 0).then(|| vec![1u8]), 0))
        .collect();
    for r in wait_all(bad, 30) {
        assert!(r.is_err());
    }
    // The group is still in step afterwards.
    let after: Vec<_> = w
        .communicators()
        .iter()
        .map(|c| c.all_gather_object(&c.rank()))
        .collect();
    for r in wait_all(after, 30) {
        assert_eq!(r.ok(), Some(vec![0, 1, 2]));
    }
}

#[test]
fn dropped_work_detaches_and_the_group_stays_in_step() {
    let w = world(3);
    for c in w.communicators() {
        drop(c.all_reduce(Tensor::from_vec(vec![1i64; 100]), ReduceOp::Sum));
    }
    let works: Vec<_> = w
        .communicators()
        .iter()
        .map(|c| c.all_reduce(Tensor::from_vec(vec![c.rank() as i64]), ReduceOp::Max))
        .collect();
    for r in wait_all(works, 30) {
        assert_eq!(r.ok().map(|t| v(&t)), Some(vec![2]));
    }
}

#[test]
fn work_is_completed_and_wait_timeout() {
    let w = world(2);
    let c = w.communicators();
    let a = c[0].barrier();
    assert!(
        a.wait_timeout(Duration::from_millis(20)).is_none(),
        "rank 1 has not called yet"
    );
    assert!(!a.is_completed());
    let b = c[1].barrier();
    assert!(matches!(
        b.wait_timeout(Duration::from_secs(30)),
        Some(Ok(()))
    ));
    assert!(matches!(
        a.wait_timeout(Duration::from_secs(30)),
        Some(Ok(()))
    ));
}

#[test]
fn calls_after_shutdown_fail_with_shutdown() {
    let w = world(2);
    let c = w.communicators()[0].clone();
    let pending = c.barrier();
    // A call cut off by the shutdown is no failure of the group: nothing pending.
    assert_eq!(w.shutdown(), Ok(()));
    assert!(matches!(
        pending.wait_timeout(Duration::from_secs(10)),
        Some(Err(Error::Shutdown))
    ));
    assert!(matches!(
        c.barrier().wait_timeout(Duration::from_secs(10)),
        Some(Err(Error::Shutdown))
    ));
}

/// Serializes as a number; deserializing 13 panics (a user's `Deserialize` with a bug).
#[derive(Clone, Debug, PartialEq)]
struct Fragile(u32);

impl Serialize for Fragile {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u32(self.0)
    }
}

impl<'de> Deserialize<'de> for Fragile {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = u32::deserialize(d)?;
        assert!(v != 13, "Fragile cannot hold 13");
        Ok(Fragile(v))
    }
}

#[test]
fn a_panic_in_a_users_deserialize_fails_that_call_and_the_rank_carries_on() {
    // It used to come out as `Shutdown` while the rank kept running.
    let w = world(2);
    let c = w.communicators();
    let b: Vec<_> = c
        .iter()
        .map(|c| c.broadcast_object((c.rank() == 0).then_some(Fragile(13)), 0))
        .collect();
    for r in wait_all(b, 30) {
        match r {
            Err(Error::Panic(what)) => assert!(what.contains("cannot hold 13"), "{what}"),
            // The root decodes nothing: it returns its own object.
            Ok(v) => assert_eq!(v, Fragile(13)),
            Err(e) => panic!("{e}"),
        }
    }
    // The ranks are fine: the next call works.
    let b: Vec<_> = c
        .iter()
        .map(|c| c.broadcast_object((c.rank() == 0).then_some(Fragile(7)), 0))
        .collect();
    for r in wait_all(b, 30) {
        assert_eq!(r.ok(), Some(Fragile(7)));
    }
}
