//! `broadcast`: every rank gets the root's tensor (binomial tree or direct).

use super::{fill, Assembly, Checked, Plan, Planner};
use crate::algorithm::{direct, tree};
use crate::error::Result;
use crate::op::{Algorithm, OpKind};
use crate::tensor::Tensor;
use bytes::Bytes;

// The spec: checks, sizes, fingerprint fields, output shape, busbw factor (the expected
// results for tests and benchmarks are in `case`, at the end).

impl Planner<'_> {
    /// Checks `broadcast`; also gives the element count and, on the root, the data to send.
    pub(super) fn check_broadcast(
        &self,
        tensor: Tensor,
        root: usize,
    ) -> Result<(Checked, usize, Option<Bytes>)> {
        self.g.check_rank(root, "root")?;
        let (n, dt) = (tensor.numel(), tensor.dtype());
        let bytes = tensor.nbytes();
        let (data, assembly) = if self.g.rank == root {
            (Some(tensor.bytes().clone()), Assembly::Return(tensor))
        } else {
            (None, Assembly::Whole(tensor.shape().to_vec()))
        };
        let checked = Checked {
            kind: OpKind::Broadcast,
            dtype: dt,
            count: Some(n as u64),
            root: Some(root),
            op: None,
            bytes,
            assembly,
        };
        Ok((checked, n, data))
    }
}

/// nccl-tests' bus-bandwidth factor for a group of `n` ranks.
pub(super) fn busbw_factor(_n: f64) -> f64 {
    1.0
}

// Planning: the algorithm, its schedule and the initial chunks.

impl Planner<'_> {
    /// Plans `broadcast`.
    pub(super) fn broadcast(&self, tensor: Tensor, root: usize) -> Result<Plan> {
        let (w, me) = (self.w(), self.g.rank);
        let (checked, n, data) = self.check_broadcast(tensor, root)?;
        let dt = checked.dtype;
        let alg = self.algorithm(checked.kind, checked.bytes)?;
        let seg = self.seg_if(alg != Algorithm::Direct, dt);
        let s = self.memo((checked.kind, alg, n, seg, root), || match alg {
            Algorithm::Direct => direct::broadcast(me, w, root, n),
            _ => tree::broadcast(me, w, root, n, seg),
        });
        let mut init = vec![None; s.layout.chunk_elems.len()];
        if let Some(data) = &data {
            fill(&mut init, &s.layout, 0..1, data, dt.size())?;
        }
        Ok(self.collective(checked, alg, s, init))
    }
}

/// The test and benchmark case of this collective: the request each rank makes and the
/// result it must get (inputs from [`input`](crate::collective::case::input), exact in every reduction order).
#[cfg(any(test, feature = "testing"))]
mod case {
    use crate::collective::case::Case;
    use crate::collective::{Output, Request};
    use crate::tensor::Tensor;

    impl Case {
        /// The broadcast case: the root sends its input; the others pass zeros of its shape.
        pub(crate) fn broadcast_request(&self, r: usize) -> Request {
            let (n, dt) = (self.count, self.dtype);
            Request::Broadcast {
                tensor: if r == self.root {
                    self.inp(r, 0, n)
                } else {
                    Tensor::zeros(&[n], dt).unwrap_or_else(|_| Tensor::empty(dt))
                },
                root: self.root,
            }
        }

        /// What every rank of the broadcast case gets: the root's input.
        pub(crate) fn broadcast_expected(&self) -> Output {
            Output::Tensor(self.inp(self.root, 0, self.count))
        }
    }
}
