//! A 2-D mesh of a group's ranks, replicate × shard, as torch's
//! `init_device_mesh(device, (replicate, shard), mesh_dim_names=("replicate", "shard"))` makes
//! it for HSDP: the group's ranks laid out row by row, `replicas` rows of `shard` ranks each.
//! Each rank gets the communicator of its row (the ranks it shards parameters with) and of its
//! column (the ranks that hold the same shard: gradients are all-reduced across them after the
//! reduce_scatter in the row).
//!
//! ```
//! use collectix_actors::World;
//! use collectix_runtime::{ReduceOp, Tensor};
//!
//! let world = World::local(4).unwrap();
//! let meshes: Vec<_> = world
//!     .communicators()
//!     .iter()
//!     .map(|c| c.mesh_2d(2, 2))
//!     .collect::<Vec<_>>()
//!     .into_iter()
//!     .map(|w| w.wait().unwrap())
//!     .collect();
//! // Rank 3 is in row 1, column 1: it shards with rank 2 and replicates with rank 1.
//! assert_eq!(meshes[3].coords, (1, 1));
//! assert_eq!(meshes[3].shard.members(), &[2, 3]);
//! assert_eq!(meshes[3].replicate.members(), &[1, 3]);
//! world.shutdown().unwrap();
//! ```

use crate::comm::Communicator;
use crate::work::Work;
use collectix_runtime::{Error, Result};

/// One rank's place in a replicate × shard mesh ([`Communicator::mesh_2d`]).
#[derive(Clone, Debug)]
pub struct Mesh2d {
    /// The ranks of this rank's row, in order: those it shards with (torch's
    /// `mesh["shard"].get_group()`).
    pub shard: Communicator,
    /// The ranks of this rank's column, in order: those that hold the same shard (torch's
    /// `mesh["replicate"].get_group()`).
    pub replicate: Communicator,
    /// This rank's (row, column): (its replica's index, its index in the shard group).
    pub coords: (usize, usize),
}

impl Communicator {
    /// Lays the group's ranks out as `replicas` rows of `shard` ranks (group rank `r` at row
    /// `r / shard`, column `r % shard`) and makes each row and each column a group:
    /// collective over the group (two `split`s, each an all_gather on it). The shape must
    /// cover the group exactly; a shape that does not fails with
    /// [`Error::InvalidArgument`] on the rank that passed it, and the others' parts with
    /// [`Error::CallFailed`] (the group goes on).
    #[track_caller]
    pub fn mesh_2d(&self, replicas: usize, shard: usize) -> Work<Mesh2d> {
        let w = self.size();
        let shape = (replicas > 0 && shard > 0 && replicas.checked_mul(shard) == Some(w))
            .then_some(())
            .ok_or_else(|| {
                Error::invalid(format!(
                    "a mesh of {replicas} × {shard} ranks does not cover a group of {w}"
                ))
            })
            .and_then(|()| {
                let color = |v: usize| {
                    u32::try_from(v)
                        .map_err(|_| Error::invalid(format!("mesh index {v} is beyond u32")))
                };
                let (row, col) = (self.rank() / shard, self.rank() % shard);
                Ok(((row, col), color(row)?, color(col)?))
            });
        let ((row, col), row_color, col_color) = match shape {
            Ok(x) => x,
            Err(e) => {
                // Both splits' places in the group's order are taken, as on a rank whose
                // shape is fine: the others hear at once.
                drop(self.refuse_split::<()>(e.clone()));
                return self.refuse_split(e);
            }
        };
        let rows = self.split(Some(row_color), col as i64);
        let cols = self.split(Some(col_color), row as i64);
        let (c, work) = Work::raw(self.member.rank.rank_threads.clone());
        self.member.rank.spawner.spawn(async move {
            let made = async {
                let shard = rows.await?;
                let replicate = cols.await?;
                match (shard, replicate) {
                    (Some(shard), Some(replicate)) => Ok(Mesh2d {
                        shard,
                        replicate,
                        coords: (row, col),
                    }),
                    _ => Err(Error::internal(
                        "a rank of a mesh is not in its row or column",
                    )),
                }
            };
            let r: Result<Mesh2d> = made.await;
            c.complete(r);
        });
        work
    }
}
