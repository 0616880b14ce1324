//! Each collective as NCCL runs it: [`plan`] refuses what NCCL cannot do, checks the call
//! with the runtime's own checks ([`Plan::check`]: the same argument rules and fingerprint
//! fields as the engine's path), and builds the [`NcclOp`] that `launch.rs` enqueues on the
//! communicator's stream.
//!
//! all_reduce, broadcast, reduce, all_gather (equal sizes), all_gather_into_tensor,
//! reduce_scatter and reduce_scatter_tensor map to their NCCL primitives; gather, scatter,
//! all_to_all, all_to_all_single and all_gather with unequal sizes are grouped
//! `ncclSend`/`ncclRecv`, as PyTorch builds them.

use super::nccl::RedOp;
use collectix_runtime::{
    DType, DataPath, DeviceError, Error, Fingerprint, GroupInfo, Plan, ReduceOp, Request, Result,
    Tensor, TensorSpec,
};
use std::ops::Range;

/// The NCCL reduction for `op` on `dtype`, or why NCCL cannot do it.
pub(super) fn red_op(op: ReduceOp, dtype: DType) -> Result<RedOp> {
    let unsupported = |why: String| Err(DeviceError::Unsupported(why).into());
    if dtype == DType::Bool {
        return unsupported(format!("NCCL has no bool reductions ({op} on bool)"));
    }
    Ok(match op {
        ReduceOp::Sum => RedOp::BuiltIn(0),
        ReduceOp::Product => RedOp::BuiltIn(1),
        ReduceOp::Max => RedOp::BuiltIn(2),
        ReduceOp::Min => RedOp::BuiltIn(3),
        ReduceOp::Avg if dtype.is_float() => RedOp::BuiltIn(4),
        ReduceOp::PremulSum(s) if dtype.is_float() => RedOp::PreMulSum(s),
        ReduceOp::Avg | ReduceOp::PremulSum(_) => {
            return unsupported(format!("{op} on {dtype} (NCCL averages floats only)"))
        }
        ReduceOp::BAnd | ReduceOp::BOr | ReduceOp::BXor => {
            return unsupported(format!("NCCL has no bitwise reductions ({op})"))
        }
        other => return unsupported(format!("{other}")),
    })
}

/// Where the received bytes of an exchange go and what the output is.
pub(crate) enum OutputLayout {
    /// Nothing (gather on a non-root).
    Nothing,
    /// The whole buffer as one tensor of this shape.
    Whole(Vec<usize>),
    /// Views of the buffer: `(offset, shape)` each.
    Split(Vec<(usize, Vec<usize>)>),
}

/// A call as NCCL runs it.
pub(crate) enum NcclOp {
    /// `ncclAllReduce`.
    AllReduce { input: Tensor, op: ReduceOp },
    /// `ncclReduce` to `root`.
    Reduce {
        input: Tensor,
        root: usize,
        op: ReduceOp,
    },
    /// `ncclBroadcast` from `root`.
    Broadcast { input: Tensor, root: usize },
    /// `ncclAllGather` into one buffer, handed back whole or split per rank.
    AllGather { input: Tensor, layout: OutputLayout },
    /// `ncclReduceScatter`; a list of inputs is first copied into one buffer.
    ReduceScatter {
        inputs: Vec<Tensor>,
        shape: Vec<usize>,
        op: ReduceOp,
    },
    /// Grouped sends and receives into one output buffer.
    Exchange(Exchange),
}

/// Grouped sends and receives into one output buffer, and this rank's own part copied there.
pub(crate) struct Exchange {
    /// `(peer, tensor, byte range of it)`.
    pub(crate) sends: Vec<(usize, Tensor, Range<usize>)>,
    /// `(peer, byte range of the output)`.
    pub(crate) recvs: Vec<(usize, Range<usize>)>,
    /// `(tensor, byte range of it, offset in the output)`: this rank's own part.
    pub(crate) local: Vec<(Tensor, Range<usize>, usize)>,
    /// Bytes of the output buffer.
    pub(crate) out_bytes: usize,
    /// What the output is made of.
    pub(crate) layout: OutputLayout,
}

/// Who will run a planned call.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Runner {
    /// NCCL: what it lacks is refused first.
    Nccl,
    /// NCCL, or the device-local path (`local.rs`) when every rank turns out to be on one
    /// device: nothing is refused for NCCL's sake here (a call that ends up on NCCL and that
    /// NCCL lacks fails with `Unsupported` when it is launched, on every rank alike).
    NcclOrLocal,
}

/// Refuses what NCCL cannot do (for [`Runner::Nccl`]), then checks `req` for this member of
/// `group` as the engine would, and plans it as NCCL runs it: the operation, and the call's
/// fingerprint on the NCCL path.
pub(crate) fn plan(
    req: Request,
    group: &GroupInfo,
    runner: Runner,
) -> Result<(NcclOp, Fingerprint)> {
    match &req {
        Request::Barrier | Request::NewGroup { .. } | Request::MonitoredBarrier => {
            return Err(Error::internal("a call without tensors on the NCCL path"))
        }
        Request::Send { .. } | Request::Recv { .. } => {
            return Err(Error::internal(
                "point-to-point device calls go through backend/p2p.rs",
            ))
        }
        _ if runner == Runner::Nccl => unsupported(&req)?,
        _ => {}
    }
    let fp = Plan::check(req.clone(), group)?.fingerprint(DataPath::Nccl);
    let g = Group {
        me: group.rank,
        size: group.size(),
    };
    let op = match req {
        Request::AllReduce { tensor, op } => NcclOp::AllReduce { op, input: tensor },
        Request::Reduce { tensor, root, op } => NcclOp::Reduce {
            op,
            input: tensor,
            root,
        },
        Request::Broadcast { tensor, root } => NcclOp::Broadcast {
            input: tensor,
            root,
        },
        Request::AllGatherIntoTensor { input, output } => NcclOp::AllGather {
            input,
            layout: OutputLayout::Whole(output.shape),
        },
        Request::AllGather { input, outputs } => all_gather(input, &outputs, g)?,
        Request::Gather { input, root } => gather(input, root, g)?,
        Request::Scatter {
            output,
            inputs,
            root,
        } => scatter(output, inputs.unwrap_or_default(), root, g)?,
        Request::ReduceScatter { inputs, op } => {
            let first = inputs.first().map(|t| t.shape().to_vec());
            let shape = first.ok_or_else(|| Error::invalid("reduce_scatter: no inputs"))?;
            NcclOp::ReduceScatter { op, inputs, shape }
        }
        Request::ReduceScatterTensor { input, output, op } => NcclOp::ReduceScatter {
            op,
            inputs: vec![input],
            shape: output.shape,
        },
        Request::AllToAll { inputs, outputs } => all_to_all(inputs, &outputs, g)?,
        Request::AllToAllSingle {
            input,
            output,
            output_splits,
            input_splits,
        } => {
            let splits = Splits {
                output: output_splits,
                input: input_splits,
            };
            all_to_all_single(input, output, splits, g)?
        }
        _ => return Err(DeviceError::Unsupported("this call".into()).into()),
    };
    Ok((op, fp))
}

/// What NCCL cannot do, refused first as [`DeviceError::Unsupported`] (the host-staged
/// backend can): a reduction NCCL lacks for the dtype, and reduce_scatter over inputs of
/// different sizes or dtypes.
fn unsupported(req: &Request) -> Result<()> {
    match req {
        Request::AllReduce { tensor, op } | Request::Reduce { tensor, op, .. } => {
            red_op(*op, tensor.dtype()).map(drop)
        }
        Request::ReduceScatterTensor { input, op, .. } => red_op(*op, input.dtype()).map(drop),
        Request::ReduceScatter { inputs, op } => {
            let Some(first) = inputs.first() else {
                return Ok(());
            };
            let (dtype, numel) = (first.dtype(), first.numel());
            if inputs
                .iter()
                .any(|t| t.dtype() != dtype || t.numel() != numel)
            {
                return Err(DeviceError::Unsupported(
                    "reduce_scatter with inputs of different sizes or dtypes".into(),
                )
                .into());
            }
            red_op(*op, dtype).map(drop)
        }
        _ => Ok(()),
    }
}

/// This rank in its group.
#[derive(Clone, Copy)]
struct Group {
    me: usize,
    size: usize,
}

/// all_to_all_single's row splits, as the caller gave them (`None`: equal).
struct Splits {
    output: Option<Vec<usize>>,
    input: Option<Vec<usize>>,
}

/// One output buffer holding `outputs` one after another: their sizes in bytes, their byte
/// ranges, and the output as views of the buffer.
fn split_layout(outputs: &[TensorSpec]) -> Result<(Vec<usize>, Vec<Range<usize>>, OutputLayout)> {
    let bytes: Vec<usize> = outputs.iter().map(spec_bytes).collect::<Result<_>>()?;
    let rs = ranges(&bytes)?;
    let layout = OutputLayout::Split(
        rs.iter()
            .zip(outputs)
            .map(|(r, o)| (r.start, o.shape.clone()))
            .collect(),
    );
    Ok((bytes, rs, layout))
}

/// all_gather: `ncclAllGather` when every rank's block has the input's size, grouped sends
/// and receives otherwise.
fn all_gather(input: Tensor, outputs: &[TensorSpec], g: Group) -> Result<NcclOp> {
    let (bytes, rs, layout) = split_layout(outputs)?;
    if bytes.iter().all(|&b| b == input.nbytes()) {
        return Ok(NcclOp::AllGather { input, layout });
    }
    let whole = 0..input.nbytes();
    let pieces = vec![(input, whole); g.size];
    let out_bytes = rs.last().map_or(0, |r| r.end);
    exchange("all_gather", g.me, pieces, &rs, out_bytes, layout)
}

/// gather: every rank sends to the root, which receives into one buffer and keeps its own
/// part locally.
fn gather(input: Tensor, root: usize, g: Group) -> Result<NcclOp> {
    let n = input.nbytes();
    let whole = 0..n;
    if g.me != root {
        return Ok(NcclOp::Exchange(Exchange {
            sends: vec![(root, input, whole)],
            recvs: vec![],
            local: vec![],
            out_bytes: 0,
            layout: OutputLayout::Nothing,
        }));
    }
    let rs = ranges(&vec![n; g.size])?;
    let recvs = rs
        .iter()
        .enumerate()
        .filter(|(p, _)| *p != g.me)
        .map(|(p, r)| (p, r.clone()))
        .collect();
    let layout = OutputLayout::Split(
        rs.iter()
            .map(|r| (r.start, input.shape().to_vec()))
            .collect(),
    );
    let local = vec![(input, whole, rs.get(g.me).map_or(0, |r| r.start))];
    Ok(NcclOp::Exchange(Exchange {
        sends: vec![],
        recvs,
        local,
        out_bytes: n.saturating_mul(g.size),
        layout,
    }))
}

/// scatter: the root sends each rank its part and keeps its own locally (the runtime's check
/// made sure the root passed one input of the output's size per rank).
fn scatter(output: TensorSpec, inputs: Vec<Tensor>, root: usize, g: Group) -> Result<NcclOp> {
    let n = spec_bytes(&output)?;
    let layout = OutputLayout::Whole(output.shape);
    if g.me != root {
        return Ok(NcclOp::Exchange(Exchange {
            sends: vec![],
            recvs: vec![(root, 0..n)],
            local: vec![],
            out_bytes: n,
            layout,
        }));
    }
    let mut sends = Vec::new();
    let mut local = Vec::new();
    for (peer, t) in inputs.into_iter().enumerate() {
        if peer == g.me {
            local.push((t, 0..n, 0));
        } else {
            sends.push((peer, t, 0..n));
        }
    }
    Ok(NcclOp::Exchange(Exchange {
        sends,
        recvs: vec![],
        local,
        out_bytes: n,
        layout,
    }))
}

/// all_to_all: grouped sends and receives, one piece per rank.
fn all_to_all(inputs: Vec<Tensor>, outputs: &[TensorSpec], g: Group) -> Result<NcclOp> {
    let (_, rs, layout) = split_layout(outputs)?;
    let out_bytes = rs.last().map_or(0, |r| r.end);
    let pieces = inputs
        .into_iter()
        .map(|t| {
            let n = t.nbytes();
            (t, 0..n)
        })
        .collect();
    exchange("all_to_all", g.me, pieces, &rs, out_bytes, layout)
}

/// all_to_all_single: grouped sends and receives of row ranges of one tensor (the runtime's
/// check made sure the splits cover the rows).
fn all_to_all_single(
    input: Tensor,
    output: TensorSpec,
    splits: Splits,
    g: Group,
) -> Result<NcclOp> {
    let esize = input.dtype().size();
    let ins = ranges(&row_bytes(input.shape(), splits.input, g.size, esize)?)?;
    let outs = ranges(&row_bytes(&output.shape, splits.output, g.size, esize)?)?;
    let pieces = ins.into_iter().map(|i| (input.clone(), i)).collect();
    let out_bytes = spec_bytes(&output)?;
    let layout = OutputLayout::Whole(output.shape);
    exchange("all_to_all_single", g.me, pieces, &outs, out_bytes, layout)
}

/// The bytes of each of `size` parts of a tensor of `shape` cut along dimension 0 by
/// `splits` (rows per part; equal parts when `None`).
fn row_bytes(
    shape: &[usize],
    splits: Option<Vec<usize>>,
    size: usize,
    esize: usize,
) -> Result<Vec<usize>> {
    let overflow = || Error::invalid("all_to_all_single: sizes overflow");
    let row = shape
        .iter()
        .skip(1)
        .try_fold(esize, |a, &d| a.checked_mul(d))
        .ok_or_else(overflow)?;
    let rows = shape.first().copied().unwrap_or(1);
    let per = splits.unwrap_or_else(|| vec![rows / size.max(1); size]);
    per.iter()
        .map(|&r| r.checked_mul(row).ok_or_else(overflow))
        .collect()
}

fn spec_bytes(s: &TensorSpec) -> Result<usize> {
    s.numel()?
        .checked_mul(s.dtype.size())
        .ok_or_else(|| Error::invalid("output size overflows usize"))
}

/// Consecutive byte ranges of the given sizes, from 0.
fn ranges(sizes: &[usize]) -> Result<Vec<Range<usize>>> {
    let mut at = 0usize;
    sizes
        .iter()
        .map(|&n| {
            let r = at..at
                .checked_add(n)
                .ok_or_else(|| Error::invalid("sizes overflow"))?;
            at = r.end;
            Ok(r)
        })
        .collect()
}

/// An all-to-all shaped exchange: `pieces[p]` (a tensor and a byte range of it) goes to rank
/// `p`, and what rank `p` sends lands at `into[p]` of one output buffer of `out_bytes`; this
/// rank's own piece is copied locally (it must fit its slot).
fn exchange(
    what: &str,
    me: usize,
    pieces: Vec<(Tensor, Range<usize>)>,
    into: &[Range<usize>],
    out_bytes: usize,
    layout: OutputLayout,
) -> Result<NcclOp> {
    let mut sends = Vec::new();
    let mut recvs = Vec::new();
    let mut local = Vec::new();
    for (peer, (t, piece)) in pieces.into_iter().enumerate() {
        let slot = into.get(peer).cloned().unwrap_or(0..0);
        if peer == me {
            if piece.len() != slot.len() {
                return Err(Error::invalid(format!(
                    "{what}: this rank's own part and its output slot differ in size"
                )));
            }
            local.push((t, piece, slot.start));
        } else {
            sends.push((peer, t, piece));
            recvs.push((peer, slot));
        }
    }
    Ok(NcclOp::Exchange(Exchange {
        sends,
        recvs,
        local,
        out_bytes,
        layout,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use collectix_runtime::{Error, GroupOptions};

    fn member(w: usize, r: usize) -> GroupInfo {
        GroupInfo::world(w, r, GroupOptions::default()).unwrap_or_else(|e| panic!("{e}"))
    }

    fn f32s(n: usize) -> Tensor {
        Tensor::from_vec(vec![1.0f32; n])
    }

    /// An exchange's sends and receives, as (peer, byte range), and where its own parts go.
    type Parts = (
        Vec<(usize, Range<usize>)>,
        Vec<(usize, Range<usize>)>,
        Vec<usize>,
    );

    fn parts(x: &Exchange) -> Parts {
        (
            x.sends.iter().map(|(p, _, r)| (*p, r.clone())).collect(),
            x.recvs.iter().map(|(p, r)| (*p, r.clone())).collect(),
            x.local.iter().map(|l| l.2).collect(),
        )
    }

    /// What NCCL lacks is `Unsupported` even where the engine's rules would call the call
    /// wrong (an integer average), so users learn to take the host-staged backend.
    #[test]
    fn what_nccl_lacks_is_refused_first_as_unsupported() {
        let g = member(2, 0);
        let unsupported = |req: Request| {
            matches!(
                plan(req, &g, Runner::Nccl),
                Err(Error::Device(DeviceError::Unsupported(_)))
            )
        };
        assert!(unsupported(Request::AllReduce {
            tensor: Tensor::from_vec(vec![1i64, 2]),
            op: ReduceOp::Avg,
        }));
        assert!(unsupported(Request::AllReduce {
            tensor: Tensor::from_vec(vec![true, false]),
            op: ReduceOp::Max,
        }));
        assert!(unsupported(Request::ReduceScatter {
            inputs: vec![f32s(2), f32s(3)],
            op: ReduceOp::Sum,
        }));
        // A wrong call NCCL could run is the engine's error.
        let wrong = plan(
            Request::Broadcast {
                tensor: f32s(2),
                root: 2,
            },
            &g,
            Runner::Nccl,
        );
        assert!(matches!(wrong, Err(Error::InvalidArgument(_))));
    }

    /// The fingerprint is the runtime's check's, on the NCCL path.
    #[test]
    fn the_fingerprint_is_the_runtime_s_on_the_nccl_path() {
        let g = member(3, 1);
        let req = Request::AllGatherIntoTensor {
            input: f32s(4),
            output: TensorSpec::new(&[12], DType::F32),
        };
        let want = Plan::check(req.clone(), &g)
            .unwrap_or_else(|e| panic!("{e}"))
            .fingerprint(DataPath::Nccl);
        match plan(req, &g, Runner::Nccl) {
            Ok((NcclOp::AllGather { layout, .. }, fp)) => {
                assert_eq!(fp, want);
                assert!(matches!(layout, OutputLayout::Whole(s) if s == vec![12]));
            }
            _ => panic!("not an all_gather"),
        }
    }

    /// Blocks of one size are one `ncclAllGather`; blocks of different sizes are an
    /// exchange into one buffer, each rank's bytes at its offset.
    #[test]
    fn all_gather_with_unequal_blocks_is_an_exchange() {
        let g = member(3, 1);
        let specs = |n: [usize; 3]| n.map(|n| TensorSpec::new(&[n], DType::F32)).to_vec();
        let equal = Request::AllGather {
            input: f32s(2),
            outputs: specs([2, 2, 2]),
        };
        assert!(matches!(
            plan(equal, &g, Runner::Nccl),
            Ok((NcclOp::AllGather { .. }, _))
        ));
        let unequal = Request::AllGather {
            input: f32s(2),
            outputs: specs([1, 2, 3]),
        };
        match plan(unequal, &g, Runner::Nccl) {
            Ok((NcclOp::Exchange(x), _)) => {
                let sends = vec![(0, 0..8), (2, 0..8)];
                let recvs = vec![(0, 0..4), (2, 12..24)];
                assert_eq!(parts(&x), (sends, recvs, vec![4]));
                assert_eq!(x.out_bytes, 24);
            }
            _ => panic!("not an exchange"),
        }
    }

    /// gather: a non-root sends its whole input to the root; the root receives each peer's
    /// block at its offset and copies its own.
    #[test]
    fn gather_sends_to_the_root_which_receives_in_rank_order() {
        let gathered = |me: usize| {
            let req = Request::Gather {
                input: f32s(2),
                root: 0,
            };
            match plan(req, &member(3, me), Runner::Nccl) {
                Ok((NcclOp::Exchange(x), _)) => (parts(&x), x.out_bytes),
                _ => panic!("not an exchange"),
            }
        };
        assert_eq!(gathered(2), ((vec![(0, 0..8)], vec![], vec![]), 0));
        let recvs = vec![(1, 8..16), (2, 16..24)];
        assert_eq!(gathered(0), ((vec![], recvs, vec![0]), 24));
    }

    /// all_to_all_single cuts rows by the splits: rank 0 of 2 sends rows 1.. of a 4-row,
    /// 2-column input and keeps row 0.
    #[test]
    fn all_to_all_single_cuts_rows_by_the_splits() {
        let req = Request::AllToAllSingle {
            input: Tensor::from_vec(vec![1.0f32; 8])
                .reshape(&[4, 2])
                .unwrap_or_else(|e| panic!("{e}")),
            output: TensorSpec::new(&[2, 2], DType::F32),
            output_splits: Some(vec![1, 1]),
            input_splits: Some(vec![1, 3]),
        };
        match plan(req, &member(2, 0), Runner::Nccl) {
            Ok((NcclOp::Exchange(x), _)) => {
                assert_eq!(parts(&x), (vec![(1, 8..32)], vec![(1, 8..16)], vec![0]));
                assert_eq!(x.local[0].1, 0..8);
            }
            _ => panic!("not an exchange"),
        }
    }
}
