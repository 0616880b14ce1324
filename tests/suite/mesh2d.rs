//! The replicate × shard mesh (`Communicator::mesh_2d`, torch's 2-D `init_device_mesh` for
//! HSDP): each rank's row and column groups, the HSDP gradient reduction over them (a
//! reduce_scatter in the row, then an all_reduce of the shard across the column) against the
//! sum over every rank, and a shape that does not cover the group.

use crate::common;
use collectix::{Error, Mesh2d, ReduceOp, Tensor, TensorSpec, World};
use common::wait_all;

fn meshes(w: &World, replicas: usize, shard: usize) -> Vec<Mesh2d> {
    let works = w
        .communicators()
        .iter()
        .map(|c| c.mesh_2d(replicas, shard))
        .collect();
    wait_all(works, 30)
        .into_iter()
        .map(|m| m.unwrap_or_else(|e| panic!("{e}")))
        .collect()
}

#[test]
fn each_rank_gets_its_row_and_its_column() {
    for (world, replicas, shard) in [(4, 2, 2), (6, 2, 3), (6, 3, 2), (4, 1, 4), (4, 4, 1)] {
        let w = World::local(world).unwrap_or_else(|e| panic!("{e}"));
        for (r, m) in meshes(&w, replicas, shard).iter().enumerate() {
            let (row, col) = (r / shard, r % shard);
            assert_eq!(m.coords, (row, col), "rank {r}");
            let row_members: Vec<usize> = (row * shard..(row + 1) * shard).collect();
            let col_members: Vec<usize> = (0..replicas).map(|i| i * shard + col).collect();
            assert_eq!(m.shard.members(), row_members.as_slice(), "rank {r}");
            assert_eq!(m.replicate.members(), col_members.as_slice(), "rank {r}");
            assert_eq!((m.shard.rank(), m.replicate.rank()), (col, row), "rank {r}");
        }
        assert_eq!(w.shutdown(), Ok(()));
    }
}

/// HSDP's gradient step on 6 ranks, 2 replicas × 3 shards: each rank's gradient is 6
/// integers; a reduce_scatter in its row, then an all_reduce of its shard across its column,
/// leaves on each rank the sum over all six ranks of its column's third, exactly.
#[test]
fn a_reduce_scatter_in_the_row_then_an_all_reduce_in_the_column_sums_over_everyone() {
    let (replicas, shard, n) = (2, 3, 6);
    let world = replicas * shard;
    let w = World::local(world).unwrap_or_else(|e| panic!("{e}"));
    let grad = |r: usize| -> Vec<i64> { (0..n).map(|i| (r * 10 + i) as i64).collect() };
    let ms = meshes(&w, replicas, shard);
    // Every rank's reduce_scatter in its row, all issued before any is waited for.
    let part = || TensorSpec::new(&[n / shard], collectix::DType::I64);
    let rows: Vec<_> = ms
        .iter()
        .enumerate()
        .map(|(r, m)| {
            m.shard
                .reduce_scatter_tensor(part(), Tensor::from_vec(grad(r)), ReduceOp::Sum)
        })
        .collect();
    let shards = wait_all(rows, 30);
    let works: Vec<_> = ms
        .iter()
        .zip(shards)
        .enumerate()
        .map(|(r, (m, s))| {
            let s = s.unwrap_or_else(|e| panic!("rank {r}: {e}"));
            m.replicate.all_reduce(s, ReduceOp::Sum)
        })
        .collect();
    for (r, got) in wait_all(works, 30).into_iter().enumerate() {
        let col = r % shard;
        let per = n / shard;
        let want: Vec<i64> = (col * per..(col + 1) * per)
            .map(|i| (0..world).map(|q| grad(q)[i]).sum())
            .collect();
        let got = got
            .and_then(|t| t.to_vec::<i64>())
            .unwrap_or_else(|e| panic!("rank {r}: {e}"));
        assert_eq!(got, want, "rank {r}");
    }
    assert_eq!(w.shutdown(), Ok(()));
}

/// A shape that does not cover the group fails on every rank that passed it, at once, and the
/// group goes on; on a rank that passed a good shape while another did not, its calls fail at
/// once too (`CallFailed`), and the group still goes on.
#[test]
fn a_shape_that_does_not_cover_the_group_fails_at_once_and_the_group_goes_on() {
    let w = World::local(4).unwrap_or_else(|e| panic!("{e}"));
    let c = w.communicators();
    for got in wait_all(c.iter().map(|c| c.mesh_2d(3, 2)).collect(), 5) {
        assert!(
            matches!(got, Err(Error::InvalidArgument(_))),
            "{:?}",
            got.map(|m| m.coords)
        );
    }
    // Rank 0 alone passes a bad shape.
    let works: Vec<_> = c
        .iter()
        .map(|c| {
            if c.rank() == 0 {
                c.mesh_2d(0, 4)
            } else {
                c.mesh_2d(2, 2)
            }
        })
        .collect();
    for (r, got) in wait_all(works, 5).into_iter().enumerate() {
        let ok = matches!(
            (&got, r),
            (Err(Error::InvalidArgument(_)), 0) | (Err(Error::CallFailed { rank: 0, .. }), _)
        );
        assert!(ok, "rank {r}: {:?}", got.map(|m| m.coords));
    }
    // The group is healthy, and the next mesh is made everywhere.
    let again = meshes(&w, 2, 2);
    assert_eq!(again[3].shard.members(), &[2, 3]);
    let works: Vec<_> = c.iter().map(|c| c.barrier()).collect();
    for r in wait_all(works, 30) {
        assert_eq!(r, Ok(()));
    }
    assert_eq!(w.shutdown(), Ok(()));
}
