//! Each collective as NCCL runs it: [`plan`] checks a call (torch's argument rules, plus
//! what NCCL cannot do) and gives its fingerprint and its [`NcclOp`], which `launch.rs`
//! enqueues on the communicator's stream.
//!
//! all_reduce, broadcast, reduce, all_gather (equal sizes), all_gather_into_tensor,
//! reduce_scatter and reduce_scatter_tensor map to their NCCL primitives; gather, scatter,
//! all_to_all, all_to_all_single and all_gather with unequal sizes are grouped
//! `ncclSend`/`ncclRecv`, as PyTorch builds them.

use super::nccl::RedOp;
use collectix_runtime::{
    DType, DeviceError, Error, OpKind, ReduceOp, Request, Result, Tensor, TensorSpec,
};
use collectix_runtime::{DataPath, Fingerprint};
use std::ops::Range;

/// The NCCL reduction for `op` on `dtype`, or why NCCL cannot do it.
fn red_op(op: ReduceOp, dtype: DType) -> Result<RedOp> {
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
    AllReduce { input: Tensor, op: RedOp },
    /// `ncclReduce` to `root`.
    Reduce {
        input: Tensor,
        root: usize,
        op: RedOp,
    },
    /// `ncclBroadcast` from `root`.
    Broadcast { input: Tensor, root: usize },
    /// `ncclAllGather` into one buffer, handed back whole or split per rank.
    AllGather { input: Tensor, layout: OutputLayout },
    /// `ncclReduceScatter`; a list of inputs is first copied into one buffer.
    ReduceScatter {
        inputs: Vec<Tensor>,
        shape: Vec<usize>,
        op: RedOp,
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

/// The fingerprint of a call on the NCCL path (`count`: `None` where ranks' sizes may
/// differ; NCCL picks its own algorithm).
fn fingerprint(
    kind: OpKind,
    dtype: DType,
    count: impl Into<Option<u64>>,
    root: Option<usize>,
    op: Option<ReduceOp>,
) -> Fingerprint {
    Fingerprint {
        count: count.into(),
        root: root.map(|r| r as u32),
        op: op.map(ReduceOp::kind),
        scalar: op.map_or(0, ReduceOp::scalar_bits),
        path: DataPath::Nccl,
        ..Fingerprint::new(kind, dtype)
    }
}

fn check_root(root: usize, size: usize) -> Result<()> {
    if root >= size {
        return Err(Error::invalid(format!(
            "root {root} is not a rank of a group of {size}"
        )));
    }
    Ok(())
}

fn same(t: &Tensor, spec: &TensorSpec, what: &str) -> Result<()> {
    if t.dtype() != spec.dtype {
        return Err(Error::invalid(format!(
            "{what}: dtype {} where {} was given",
            spec.dtype,
            t.dtype()
        )));
    }
    Ok(())
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

/// Checks `req` for NCCL on a group of `size` as rank `me`, and plans it.
pub(crate) fn plan(req: Request, me: usize, size: usize) -> Result<(NcclOp, Fingerprint)> {
    let group = Group { me, size };
    match req {
        Request::AllReduce { tensor, op } => all_reduce(tensor, op),
        Request::Reduce { tensor, root, op } => reduce(tensor, root, op, size),
        Request::Broadcast { tensor, root } => broadcast(tensor, root, size),
        Request::AllGatherIntoTensor { input, output } => {
            all_gather_into_tensor(input, output, size)
        }
        Request::AllGather { input, outputs } => all_gather(input, outputs, group),
        Request::Gather { input, root } => gather(input, root, group),
        Request::Scatter {
            output,
            inputs,
            root,
        } => scatter(output, inputs, root, group),
        Request::ReduceScatter { inputs, op } => reduce_scatter(inputs, op, size),
        Request::ReduceScatterTensor { input, output, op } => {
            reduce_scatter_tensor(input, output, op, size)
        }
        Request::AllToAll { inputs, outputs } => all_to_all(inputs, outputs, group),
        Request::AllToAllSingle {
            input,
            output,
            output_splits,
            input_splits,
        } => all_to_all_single(
            input,
            output,
            Splits {
                output: output_splits,
                input: input_splits,
            },
            group,
        ),
        Request::Barrier | Request::NewGroup { .. } => {
            Err(Error::internal("a call without tensors on the NCCL path"))
        }
        Request::Send { .. } | Request::Recv { .. } => Err(Error::internal(
            "point-to-point device calls go through backend/p2p.rs",
        )),
        _ => Err(DeviceError::Unsupported("this call".into()).into()),
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

/// all_reduce: `ncclAllReduce`.
fn all_reduce(tensor: Tensor, op: ReduceOp) -> Result<(NcclOp, Fingerprint)> {
    let fp = fingerprint(
        OpKind::AllReduce,
        tensor.dtype(),
        tensor.numel() as u64,
        None,
        Some(op),
    );
    let op = red_op(op, tensor.dtype())?;
    Ok((NcclOp::AllReduce { input: tensor, op }, fp))
}

/// reduce: `ncclReduce` to the root.
fn reduce(tensor: Tensor, root: usize, op: ReduceOp, size: usize) -> Result<(NcclOp, Fingerprint)> {
    check_root(root, size)?;
    let fp = fingerprint(
        OpKind::Reduce,
        tensor.dtype(),
        tensor.numel() as u64,
        Some(root),
        Some(op),
    );
    let op = red_op(op, tensor.dtype())?;
    Ok((
        NcclOp::Reduce {
            input: tensor,
            root,
            op,
        },
        fp,
    ))
}

/// broadcast: `ncclBroadcast` from the root.
fn broadcast(tensor: Tensor, root: usize, size: usize) -> Result<(NcclOp, Fingerprint)> {
    check_root(root, size)?;
    let fp = fingerprint(
        OpKind::Broadcast,
        tensor.dtype(),
        tensor.numel() as u64,
        Some(root),
        None,
    );
    Ok((
        NcclOp::Broadcast {
            input: tensor,
            root,
        },
        fp,
    ))
}

/// all_gather_into_tensor: `ncclAllGather` into the output, whole.
fn all_gather_into_tensor(
    input: Tensor,
    output: TensorSpec,
    size: usize,
) -> Result<(NcclOp, Fingerprint)> {
    same(&input, &output, "all_gather_into_tensor")?;
    if output.numel()? != input.numel().saturating_mul(size) {
        return Err(Error::invalid(format!(
            "all_gather_into_tensor: output of {} elements for {size} inputs of {}",
            output.numel()?,
            input.numel()
        )));
    }
    let fp = fingerprint(
        OpKind::AllGatherIntoTensor,
        input.dtype(),
        input.numel() as u64,
        None,
        None,
    );
    Ok((
        NcclOp::AllGather {
            input,
            layout: OutputLayout::Whole(output.shape),
        },
        fp,
    ))
}

/// all_gather: `ncclAllGather` when every rank's size is the same, grouped sends and receives otherwise.
fn all_gather(
    input: Tensor,
    outputs: Vec<TensorSpec>,
    group: Group,
) -> Result<(NcclOp, Fingerprint)> {
    let Group { me, size } = group;

    if outputs.len() != size {
        return Err(Error::invalid(format!(
            "all_gather: {} output specs for a group of {size}",
            outputs.len()
        )));
    }
    for o in &outputs {
        same(&input, o, "all_gather")?;
    }
    let own = outputs.get(me).map(TensorSpec::numel).transpose()?;
    if own != Some(input.numel()) {
        return Err(Error::invalid(
            "all_gather: this rank's output spec does not match its input",
        ));
    }
    let bytes: Vec<usize> = outputs.iter().map(spec_bytes).collect::<Result<_>>()?;
    let fp = fingerprint(OpKind::AllGather, input.dtype(), None, None, None);
    let equal = bytes.iter().all(|&b| b == input.nbytes());
    let rs = ranges(&bytes)?;
    let layout = OutputLayout::Split(
        rs.iter()
            .zip(&outputs)
            .map(|(r, o)| (r.start, o.shape.clone()))
            .collect(),
    );
    if equal {
        return Ok((NcclOp::AllGather { input, layout }, fp));
    }
    let whole = 0..input.nbytes();
    let pieces = vec![(input, whole); size];
    let out_bytes = rs.last().map_or(0, |r| r.end);
    Ok((
        exchange("all_gather", me, pieces, &rs, out_bytes, layout)?,
        fp,
    ))
}

/// gather: every rank sends to the root, which receives into one buffer and keeps its own part locally.
fn gather(input: Tensor, root: usize, group: Group) -> Result<(NcclOp, Fingerprint)> {
    let Group { me, size } = group;

    check_root(root, size)?;
    let fp = fingerprint(
        OpKind::Gather,
        input.dtype(),
        input.numel() as u64,
        Some(root),
        None,
    );
    let n = input.nbytes();
    let whole = 0..n;
    if me != root {
        let sends = vec![(root, input, whole)];
        return Ok((
            NcclOp::Exchange(Exchange {
                sends,
                recvs: vec![],
                local: vec![],
                out_bytes: 0,
                layout: OutputLayout::Nothing,
            }),
            fp,
        ));
    }
    let rs = ranges(&vec![n; size])?;
    let recvs = rs
        .iter()
        .enumerate()
        .filter(|(p, _)| *p != me)
        .map(|(p, r)| (p, r.clone()))
        .collect();
    let layout = OutputLayout::Split(
        rs.iter()
            .map(|r| (r.start, input.shape().to_vec()))
            .collect(),
    );
    let local = vec![(input, whole, rs.get(me).map_or(0, |r| r.start))];
    Ok((
        NcclOp::Exchange(Exchange {
            sends: vec![],
            recvs,
            local,
            out_bytes: n.saturating_mul(size),
            layout,
        }),
        fp,
    ))
}

/// scatter: the root sends each rank its part and keeps its own locally.
fn scatter(
    output: TensorSpec,
    inputs: Option<Vec<Tensor>>,
    root: usize,
    group: Group,
) -> Result<(NcclOp, Fingerprint)> {
    let Group { me, size } = group;

    check_root(root, size)?;
    let n = spec_bytes(&output)?;
    let fp = fingerprint(
        OpKind::Scatter,
        output.dtype,
        output.numel()? as u64,
        Some(root),
        None,
    );
    if me != root {
        let recvs = vec![(root, 0..n)];
        return Ok((
            NcclOp::Exchange(Exchange {
                sends: vec![],
                recvs,
                local: vec![],
                out_bytes: n,
                layout: OutputLayout::Whole(output.shape),
            }),
            fp,
        ));
    }
    let inputs =
        inputs.ok_or_else(|| Error::invalid("scatter: the root must pass a list of inputs"))?;
    if inputs.len() != size {
        return Err(Error::invalid(format!(
            "scatter: {} inputs for a group of {size}",
            inputs.len()
        )));
    }
    let mut sends = Vec::new();
    let mut local = Vec::new();
    for (peer, t) in inputs.into_iter().enumerate() {
        same(&t, &output, "scatter")?;
        if t.nbytes() != n {
            return Err(Error::invalid(
                "scatter: every input must have the output's size",
            ));
        }
        if peer == me {
            local.push((t, 0..n, 0));
        } else {
            sends.push((peer, t, 0..n));
        }
    }
    Ok((
        NcclOp::Exchange(Exchange {
            sends,
            recvs: vec![],
            local,
            out_bytes: n,
            layout: OutputLayout::Whole(output.shape),
        }),
        fp,
    ))
}

/// reduce_scatter: `ncclReduceScatter` over the inputs copied into one buffer.
fn reduce_scatter(inputs: Vec<Tensor>, op: ReduceOp, size: usize) -> Result<(NcclOp, Fingerprint)> {
    if inputs.len() != size {
        return Err(Error::invalid(format!(
            "reduce_scatter: {} inputs for a group of {size}",
            inputs.len()
        )));
    }
    let first = inputs
        .first()
        .ok_or_else(|| Error::invalid("reduce_scatter: no inputs"))?;
    let (dtype, numel, shape) = (first.dtype(), first.numel(), first.shape().to_vec());
    if inputs
        .iter()
        .any(|t| t.dtype() != dtype || t.numel() != numel)
    {
        return Err(DeviceError::Unsupported(
            "reduce_scatter with inputs of different sizes or dtypes".into(),
        )
        .into());
    }
    let fp = fingerprint(OpKind::ReduceScatter, dtype, numel as u64, None, Some(op));
    let op = red_op(op, dtype)?;
    Ok((NcclOp::ReduceScatter { inputs, shape, op }, fp))
}

/// reduce_scatter_tensor: `ncclReduceScatter`.
fn reduce_scatter_tensor(
    input: Tensor,
    output: TensorSpec,
    op: ReduceOp,
    size: usize,
) -> Result<(NcclOp, Fingerprint)> {
    same(&input, &output, "reduce_scatter_tensor")?;
    if input.numel() != output.numel()?.saturating_mul(size) {
        return Err(Error::invalid(format!(
            "reduce_scatter_tensor: input of {} elements for {size} outputs of {}",
            input.numel(),
            output.numel()?
        )));
    }
    let fp = fingerprint(
        OpKind::ReduceScatterTensor,
        input.dtype(),
        output.numel()? as u64,
        None,
        Some(op),
    );
    let op = red_op(op, input.dtype())?;
    Ok((
        NcclOp::ReduceScatter {
            inputs: vec![input],
            shape: output.shape,
            op,
        },
        fp,
    ))
}

/// all_to_all: grouped sends and receives, one piece per rank.
fn all_to_all(
    inputs: Vec<Tensor>,
    outputs: Vec<TensorSpec>,
    group: Group,
) -> Result<(NcclOp, Fingerprint)> {
    let Group { me, size } = group;

    if inputs.len() != size || outputs.len() != size {
        return Err(Error::invalid(format!(
            "all_to_all: {} inputs and {} outputs for a group of {size}",
            inputs.len(),
            outputs.len()
        )));
    }
    let dtype = inputs.first().map_or(DType::U8, Tensor::dtype);
    for (t, o) in inputs.iter().zip(&outputs) {
        same(t, o, "all_to_all")?;
        if t.dtype() != dtype {
            return Err(Error::invalid("all_to_all: inputs of different dtypes"));
        }
    }
    let fp = fingerprint(OpKind::AllToAll, dtype, None, None, None);
    let bytes: Vec<usize> = outputs.iter().map(spec_bytes).collect::<Result<_>>()?;
    let rs = ranges(&bytes)?;
    let layout = OutputLayout::Split(
        rs.iter()
            .zip(&outputs)
            .map(|(r, o)| (r.start, o.shape.clone()))
            .collect(),
    );
    let out_bytes = rs.last().map_or(0, |r| r.end);
    let pieces = inputs
        .into_iter()
        .map(|t| {
            let n = t.nbytes();
            (t, 0..n)
        })
        .collect();
    Ok((
        exchange("all_to_all", me, pieces, &rs, out_bytes, layout)?,
        fp,
    ))
}

/// all_to_all_single: grouped sends and receives of row ranges of one tensor.
fn all_to_all_single(
    input: Tensor,
    output: TensorSpec,
    splits: Splits,
    group: Group,
) -> Result<(NcclOp, Fingerprint)> {
    let Group { me, size } = group;

    same(&input, &output, "all_to_all_single")?;
    let row = |shape: &[usize]| -> Result<usize> {
        let inner: usize = shape
            .iter()
            .skip(1)
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .ok_or_else(|| Error::invalid("shape overflows"))?;
        inner
            .checked_mul(input.dtype().size())
            .ok_or_else(|| Error::invalid("shape overflows"))
    };
    let split = |shape: &[usize], given: Option<Vec<usize>>, what: &str| -> Result<Vec<usize>> {
        let rows = shape.first().copied().unwrap_or(1);
        let per = match given {
            Some(s) => {
                if s.len() != size
                    || s.iter().try_fold(0usize, |a, &x| a.checked_add(x)) != Some(rows)
                {
                    return Err(Error::invalid(format!("all_to_all_single: {what} splits {s:?} do not cover {rows} rows in {size} parts")));
                }
                s
            }
            None => {
                if rows % size != 0 {
                    return Err(Error::invalid(format!(
                        "all_to_all_single: {rows} {what} rows do not split evenly {size} ways"
                    )));
                }
                vec![rows / size; size]
            }
        };
        let rb = row(shape)?;
        per.iter()
            .map(|&r| {
                r.checked_mul(rb)
                    .ok_or_else(|| Error::invalid("size overflows"))
            })
            .collect()
    };
    let ins = ranges(&split(input.shape(), splits.input, "input")?)?;
    let outs = ranges(&split(&output.shape, splits.output, "output")?)?;
    let fp = fingerprint(OpKind::AllToAllSingle, input.dtype(), None, None, None);
    let pieces = ins.into_iter().map(|i| (input.clone(), i)).collect();
    let out_bytes = spec_bytes(&output)?;
    let layout = OutputLayout::Whole(output.shape);
    let op = exchange("all_to_all_single", me, pieces, &outs, out_bytes, layout)?;
    Ok((op, fp))
}
