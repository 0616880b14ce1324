//! The collectives as specs: each [`Request`] is validated against the group (torch's
//! argument checks), given an algorithm, and turned into a [`Plan`]: the fingerprint every
//! message will carry, the schedule, the initial chunks and how to build the result.
//! Nothing here sends anything, so a wrong argument fails on the calling rank, at once.

use crate::algorithm::{
    direct, dissemination, halving_doubling, pairwise, recursive_doubling, ring, tree,
};
use crate::error::{Error, Result};
use crate::group::{CallOptions, GroupInfo};
use crate::ids::{DataPath, Fingerprint};
use crate::op::{Algorithm, OpKind};
use crate::schedule::{Layout, Schedule};
use crate::tensor::dtype::DType;
use crate::tensor::reduce::{self, ReduceOp};
use crate::tensor::{numel_of, Device, Tensor};
use bytes::Bytes;
use std::ops::Range;
use std::time::Duration;

/// Shape and dtype of a tensor to be produced (torch passes pre-allocated outputs; collectix
/// hands back new tensors and takes only their specs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorSpec {
    /// Shape.
    pub shape: Vec<usize>,
    /// Element type.
    pub dtype: DType,
    /// Where the tensor is to be produced.
    pub device: Device,
}

impl TensorSpec {
    /// A spec of a host tensor.
    pub fn new(shape: &[usize], dtype: DType) -> TensorSpec {
        TensorSpec {
            shape: shape.to_vec(),
            dtype,
            device: Device::Host,
        }
    }

    /// The same spec on `device`.
    pub fn on(mut self, device: Device) -> TensorSpec {
        self.device = device;
        self
    }

    /// Elements (overflow-checked).
    pub fn numel(&self) -> Result<usize> {
        numel_of(&self.shape)
    }
}

impl From<&Tensor> for TensorSpec {
    fn from(t: &Tensor) -> Self {
        TensorSpec::new(t.shape(), t.dtype()).on(t.device())
    }
}

/// A call, with torch.distributed's arguments (ranks are group-local).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum Request {
    /// `all_reduce(tensor, op)`.
    AllReduce {
        /// Input (moved in; the result comes back as a new tensor).
        tensor: Tensor,
        /// Reduction.
        op: ReduceOp,
    },
    /// `reduce(tensor, dst, op)`: the root gets the result, the others their input back.
    Reduce {
        /// Input.
        tensor: Tensor,
        /// Root.
        root: usize,
        /// Reduction.
        op: ReduceOp,
    },
    /// `broadcast(tensor, src)`: non-roots pass a tensor of the right shape and dtype.
    Broadcast {
        /// Data (root) or template (others).
        tensor: Tensor,
        /// Root.
        root: usize,
    },
    /// `all_gather(tensor_list, tensor)`: `outputs[r]` gives rank r's shape.
    AllGather {
        /// This rank's contribution.
        input: Tensor,
        /// One spec per rank.
        outputs: Vec<TensorSpec>,
    },
    /// `all_gather_into_tensor(output, input)`.
    AllGatherIntoTensor {
        /// This rank's contribution.
        input: Tensor,
        /// The gathered tensor's spec (`size × input.numel()` elements).
        output: TensorSpec,
    },
    /// `gather(tensor, gather_list, dst)`.
    Gather {
        /// This rank's contribution.
        input: Tensor,
        /// Root.
        root: usize,
    },
    /// `scatter(tensor, scatter_list, src)`.
    Scatter {
        /// What this rank receives.
        output: TensorSpec,
        /// The root's list (ignored elsewhere).
        inputs: Option<Vec<Tensor>>,
        /// Root.
        root: usize,
    },
    /// `reduce_scatter(output, input_list, op)`.
    ReduceScatter {
        /// One tensor per rank; rank r gets the reduction of everyone's `inputs[r]`.
        inputs: Vec<Tensor>,
        /// Reduction.
        op: ReduceOp,
    },
    /// `reduce_scatter_tensor(output, input, op)`.
    ReduceScatterTensor {
        /// Input of `size × output.numel()` elements.
        input: Tensor,
        /// Output spec.
        output: TensorSpec,
        /// Reduction.
        op: ReduceOp,
    },
    /// `all_to_all(output_list, input_list)`.
    AllToAll {
        /// `inputs[r]` goes to rank r.
        inputs: Vec<Tensor>,
        /// `outputs[r]` comes from rank r.
        outputs: Vec<TensorSpec>,
    },
    /// `all_to_all_single(output, input, output_split_sizes, input_split_sizes)`; splits are
    /// along dimension 0, equal when not given.
    AllToAllSingle {
        /// Input.
        input: Tensor,
        /// Output spec.
        output: TensorSpec,
        /// Rows of the output from each rank.
        output_splits: Option<Vec<usize>>,
        /// Rows of the input to each rank.
        input_splits: Option<Vec<usize>>,
    },
    /// `barrier()`.
    Barrier,
    /// `send(tensor, dst, tag)`.
    Send {
        /// Data.
        tensor: Tensor,
        /// Destination.
        dst: usize,
        /// Tag.
        tag: u32,
    },
    /// `recv(tensor, src, tag)`; `src: None` receives from any rank.
    Recv {
        /// Shape and dtype expected.
        spec: TensorSpec,
        /// Source, or any.
        src: Option<usize>,
        /// Tag.
        tag: u32,
    },
    /// The agreement step of `new_group` over the parent; `members` is a hash of the new
    /// group's member list (a disagreement is a mismatch).
    NewGroup {
        /// Hash of the member list.
        members: u64,
    },
}

impl Request {
    /// The same request with every tensor passed through `tensor` and every output spec
    /// through `spec` (moving a call to another device, for one).
    pub fn try_map(
        self,
        mut tensor: impl FnMut(Tensor) -> Result<Tensor>,
        mut spec: impl FnMut(TensorSpec) -> TensorSpec,
    ) -> Result<Request> {
        let t = &mut tensor;
        let all = |v: Vec<Tensor>, t: &mut dyn FnMut(Tensor) -> Result<Tensor>| {
            v.into_iter().map(t).collect::<Result<Vec<_>>>()
        };
        Ok(match self {
            Request::AllReduce { tensor: x, op } => Request::AllReduce { tensor: t(x)?, op },
            Request::Reduce {
                tensor: x,
                root,
                op,
            } => Request::Reduce {
                tensor: t(x)?,
                root,
                op,
            },
            Request::Broadcast { tensor: x, root } => Request::Broadcast {
                tensor: t(x)?,
                root,
            },
            Request::AllGather { input, outputs } => Request::AllGather {
                input: t(input)?,
                outputs: outputs.into_iter().map(&mut spec).collect(),
            },
            Request::AllGatherIntoTensor { input, output } => Request::AllGatherIntoTensor {
                input: t(input)?,
                output: spec(output),
            },
            Request::Gather { input, root } => Request::Gather {
                input: t(input)?,
                root,
            },
            Request::Scatter {
                output,
                inputs,
                root,
            } => Request::Scatter {
                output: spec(output),
                inputs: inputs.map(|v| all(v, t)).transpose()?,
                root,
            },
            Request::ReduceScatter { inputs, op } => Request::ReduceScatter {
                inputs: all(inputs, t)?,
                op,
            },
            Request::ReduceScatterTensor { input, output, op } => Request::ReduceScatterTensor {
                input: t(input)?,
                output: spec(output),
                op,
            },
            Request::AllToAll { inputs, outputs } => Request::AllToAll {
                inputs: all(inputs, t)?,
                outputs: outputs.into_iter().map(&mut spec).collect(),
            },
            Request::AllToAllSingle {
                input,
                output,
                output_splits,
                input_splits,
            } => Request::AllToAllSingle {
                input: t(input)?,
                output: spec(output),
                output_splits,
                input_splits,
            },
            Request::Send {
                tensor: x,
                dst,
                tag,
            } => Request::Send {
                tensor: t(x)?,
                dst,
                tag,
            },
            Request::Recv { spec: s, src, tag } => Request::Recv {
                spec: spec(s),
                src,
                tag,
            },
            other => other,
        })
    }

    /// Bytes the call declares: its input tensors and its output specs, added up
    /// (overflow-checked). Nothing is allocated before this is compared with the group's
    /// [`max_call_bytes`](crate::GroupOptions::max_call_bytes).
    pub fn declared_bytes(&self) -> Result<u64> {
        let too_big = || Error::invalid("the call's sizes overflow");
        let spec = |s: &TensorSpec| -> Result<u64> {
            let n = s.numel()?;
            let b = n.checked_mul(s.dtype.size()).ok_or_else(too_big)?;
            u64::try_from(b).map_err(|_| too_big())
        };
        let mut total: u64 = 0;
        let mut add = |b: u64| -> Result<()> {
            total = total.checked_add(b).ok_or_else(too_big)?;
            Ok(())
        };
        let t = |x: &Tensor| x.nbytes() as u64;
        match self {
            Request::AllReduce { tensor, .. }
            | Request::Reduce { tensor, .. }
            | Request::Broadcast { tensor, .. }
            | Request::Send { tensor, .. } => add(t(tensor))?,
            Request::AllGather { input, outputs } => {
                add(t(input))?;
                for o in outputs {
                    add(spec(o)?)?;
                }
            }
            Request::AllGatherIntoTensor { input, output }
            | Request::ReduceScatterTensor { input, output, .. }
            | Request::AllToAllSingle { input, output, .. } => {
                add(t(input))?;
                add(spec(output)?)?;
            }
            Request::Gather { input, .. } => add(t(input))?,
            Request::Scatter { output, inputs, .. } => {
                add(spec(output)?)?;
                for i in inputs.iter().flatten() {
                    add(t(i))?;
                }
            }
            Request::ReduceScatter { inputs, .. } => {
                for i in inputs {
                    add(t(i))?;
                }
            }
            Request::AllToAll { inputs, outputs } => {
                for i in inputs {
                    add(t(i))?;
                }
                for o in outputs {
                    add(spec(o)?)?;
                }
            }
            Request::Recv { spec: s, .. } => add(spec(s)?)?,
            Request::Barrier | Request::NewGroup { .. } => {}
        }
        Ok(total)
    }

    /// The one device every tensor and output spec of the call is on ([`Device::Host`] for
    /// a call with none, such as a barrier); mixing devices in one call is an
    /// [`Error::InvalidArgument`].
    pub fn device(&self) -> Result<Device> {
        let mut devices: Vec<Device> = Vec::new();
        {
            let mut t = |x: &Tensor| devices.push(x.device());
            match self {
                Request::AllReduce { tensor, .. }
                | Request::Reduce { tensor, .. }
                | Request::Broadcast { tensor, .. }
                | Request::Send { tensor, .. } => t(tensor),
                Request::AllGather { input, .. }
                | Request::AllGatherIntoTensor { input, .. }
                | Request::Gather { input, .. }
                | Request::ReduceScatterTensor { input, .. }
                | Request::AllToAllSingle { input, .. } => t(input),
                Request::Scatter { inputs, .. } => inputs.iter().flatten().for_each(t),
                Request::ReduceScatter { inputs, .. } | Request::AllToAll { inputs, .. } => {
                    inputs.iter().for_each(t)
                }
                Request::Barrier | Request::Recv { .. } | Request::NewGroup { .. } => {}
            }
        }
        match self {
            Request::AllGather { outputs, .. } | Request::AllToAll { outputs, .. } => {
                devices.extend(outputs.iter().map(|s| s.device))
            }
            Request::AllGatherIntoTensor { output, .. }
            | Request::Scatter { output, .. }
            | Request::ReduceScatterTensor { output, .. }
            | Request::AllToAllSingle { output, .. }
            | Request::Recv { spec: output, .. } => devices.push(output.device),
            _ => {}
        }
        let first = devices.first().copied().unwrap_or_default();
        match devices.iter().find(|d| **d != first) {
            Some(other) => Err(Error::invalid(format!(
                "one call mixes tensors on {first} and {other}; move them to one device first"
            ))),
            None => Ok(first),
        }
    }
}

/// The result of a call.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Output {
    /// Nothing (barrier, send, gather on a non-root).
    None,
    /// One tensor.
    Tensor(Tensor),
    /// One tensor per rank.
    Tensors(Vec<Tensor>),
    /// A received tensor and its sender (group-local).
    Received {
        /// The data.
        tensor: Tensor,
        /// The sender, group-local.
        src: usize,
    },
}

/// How the result is assembled from the chunks.
#[derive(Clone, Debug)]
pub(crate) enum Finish {
    /// Every chunk in order, as one tensor of `shape`.
    Whole(Vec<usize>),
    /// Blocks `blocks`, one tensor each.
    Blocks(Range<usize>, Vec<Vec<usize>>),
    /// Blocks `blocks` concatenated into one tensor of `shape`.
    Concat(Range<usize>, Vec<usize>),
    /// Just the input back.
    Return(Tensor),
    /// No output.
    Nothing,
}

/// The body of a plan.
#[derive(Clone, Debug)]
pub(crate) enum Body {
    Collective {
        schedule: Schedule,
        init: Vec<Option<Bytes>>,
        finish: Finish,
    },
    Send {
        dst: usize,
        tag: u32,
        data: Bytes,
        count: u64,
    },
    Recv {
        src: Option<usize>,
        tag: u32,
        spec: TensorSpec,
    },
}

/// A validated call, ready for the engine.
#[derive(Clone, Debug)]
pub struct Plan {
    pub(crate) fp: Fingerprint,
    pub(crate) reduce: Option<ReduceOp>,
    pub(crate) body: Body,
    pub(crate) timeout: Duration,
    pub(crate) group_size: usize,
}

impl Plan {
    /// The fingerprint of the call.
    pub fn fingerprint(&self) -> Fingerprint {
        self.fp
    }

    /// What kind of call.
    pub fn kind(&self) -> OpKind {
        self.fp.kind
    }

    /// The schedule, for collectives.
    pub fn schedule(&self) -> Option<&Schedule> {
        match &self.body {
            Body::Collective { schedule, .. } => Some(schedule),
            _ => None,
        }
    }

    /// Whether this is a point-to-point call (matched by tag, outside the group sequence).
    pub fn is_p2p(&self) -> bool {
        matches!(self.body, Body::Send { .. } | Body::Recv { .. })
    }

    /// A plan from a hand-made schedule (for model checking and tests of the engine itself,
    /// including deliberately broken schedules). The result is every chunk joined.
    #[doc(hidden)]
    pub fn from_schedule(
        fp: Fingerprint,
        schedule: Schedule,
        init: Vec<Option<Bytes>>,
        timeout: Duration,
        group_size: usize,
    ) -> Plan {
        let finish = Finish::Whole(vec![schedule.layout.total()]);
        Plan {
            fp,
            reduce: None,
            body: Body::Collective {
                schedule,
                init,
                finish,
            },
            timeout,
            group_size,
        }
    }

    /// Validates `req` for this member of `group` and plans it. The engine moves host
    /// memory only: a request on a device is an [`Error::InvalidArgument`] here (the device
    /// layer in `collectix-actors` routes those to NCCL or stages them through the host).
    pub fn new(req: Request, group: &GroupInfo, opts: &CallOptions) -> Result<Plan> {
        let device = req.device()?;
        if !device.is_host() {
            return Err(Error::invalid(format!(
                "the engine moves host memory only; this call is on {device} (device calls go through the communicator)"
            )));
        }
        let bytes = req.declared_bytes()?;
        let limit = group.options.max_call_bytes;
        if bytes > limit {
            return Err(Error::invalid(format!(
                "the call declares {bytes} bytes of inputs and outputs, above the group's max_call_bytes ({limit})"
            )));
        }
        Planner { g: group, opts }.plan(req)
    }

    /// The same plan, marked as the agreement step of a call on another data path (see
    /// [`Fingerprint::path`]).
    pub fn with_path(mut self, path: DataPath) -> Plan {
        self.fp.path = path;
        self
    }
}

/// The default algorithm for a call of `kind` moving `bytes` bytes per rank in a group of `w`.
pub fn select(kind: OpKind, bytes: usize, w: usize) -> Algorithm {
    match kind {
        OpKind::AllReduce if bytes <= 32 << 10 || w <= 2 && bytes <= 1 << 20 => {
            Algorithm::RecursiveDoubling
        }
        OpKind::AllReduce if bytes <= 1 << 20 => Algorithm::HalvingDoubling,
        OpKind::AllReduce => Algorithm::Ring,
        OpKind::AllGather
        | OpKind::AllGatherIntoTensor
        | OpKind::ReduceScatter
        | OpKind::ReduceScatterTensor
            if bytes <= 64 << 10 =>
        {
            Algorithm::Direct
        }
        OpKind::Reduce | OpKind::Broadcast if w <= 2 => Algorithm::Direct,
        k => k.algorithms()[0],
    }
}

struct Planner<'a> {
    g: &'a GroupInfo,
    opts: &'a CallOptions,
}

fn same_dtype(what: &str, want: DType, got: DType) -> Result<()> {
    if want == got {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "{what} has dtype {got}, expected {want}"
        )))
    }
}

fn list_len(what: &str, len: usize, w: usize) -> Result<()> {
    if len == w {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "{what} has {len} entries; the group has {w} ranks"
        )))
    }
}

/// Cuts `data` into the chunks of `blocks` of `layout` (no copy).
fn fill(
    init: &mut [Option<Bytes>],
    layout: &Layout,
    blocks: Range<usize>,
    data: &Bytes,
    esize: usize,
) -> Result<()> {
    let mut off = 0usize;
    for c in layout.chunks_of(blocks) {
        let len = layout.chunk_elems[c] * esize;
        let end = off
            .checked_add(len)
            .filter(|&e| e <= data.len())
            .ok_or_else(|| Error::invalid("input too short for its layout"))?;
        init[c] = Some(data.slice(off..end));
        off = end;
    }
    Ok(())
}

impl Planner<'_> {
    fn w(&self) -> usize {
        self.g.size()
    }

    fn algorithm(&self, kind: OpKind, bytes: usize) -> Result<Algorithm> {
        let forced = self.opts.algorithm.or_else(|| {
            self.g
                .options
                .algorithms
                .iter()
                .find(|(k, _)| *k == kind)
                .map(|(_, a)| *a)
        });
        match forced {
            Some(a) if kind.algorithms().contains(&a) => Ok(a),
            Some(a) => Err(Error::invalid(format!("algorithm {a} cannot run {kind}"))),
            None => Ok(select(kind, bytes, self.w())),
        }
    }

    fn all_gather_schedule(&self, alg: Algorithm, blocks: &[usize], dt: DType) -> Schedule {
        let (w, me) = (self.w(), self.g.rank);
        match alg {
            Algorithm::Direct => direct::all_gather(me, w, blocks),
            _ => ring::all_gather(me, w, blocks, self.seg_elems(dt)),
        }
    }

    fn reduce_scatter_schedule(&self, alg: Algorithm, blocks: &[usize], dt: DType) -> Schedule {
        let (w, me) = (self.w(), self.g.rank);
        match alg {
            Algorithm::Direct => direct::reduce_scatter(me, w, blocks),
            _ => ring::reduce_scatter(me, w, blocks, self.seg_elems(dt)),
        }
    }

    fn seg_elems(&self, dtype: DType) -> usize {
        (self.g.options.segment_bytes / dtype.size()).max(1)
    }

    #[allow(clippy::too_many_arguments)]
    fn collective(
        &self,
        kind: OpKind,
        dtype: DType,
        count: Option<u64>,
        root: Option<usize>,
        reduce: Option<ReduceOp>,
        algorithm: Algorithm,
        schedule: Schedule,
        init: Vec<Option<Bytes>>,
        finish: Finish,
    ) -> Plan {
        Plan {
            fp: Fingerprint {
                kind,
                dtype,
                count,
                root: root.map(|r| r as u32),
                op: reduce.map(ReduceOp::kind),
                scalar: reduce.map_or(0, ReduceOp::scalar_bits),
                algorithm: Some(algorithm),
                path: DataPath::Engine,
            },
            reduce,
            body: Body::Collective {
                schedule,
                init,
                finish,
            },
            timeout: self.opts.timeout.unwrap_or(self.g.options.timeout),
            group_size: self.w(),
        }
    }

    /// The input after the op's pre-transform (PremulSum), checked against the dtype rules.
    fn prepare(&self, t: &Tensor, op: ReduceOp) -> Result<Bytes> {
        op.check(t.dtype())?;
        Ok(reduce::pre(t.dtype(), op, t.bytes())?.unwrap_or_else(|| t.bytes().clone()))
    }

    fn plan(&self, req: Request) -> Result<Plan> {
        let (w, me) = (self.w(), self.g.rank);
        match req {
            Request::AllReduce { tensor, op } => {
                let data = self.prepare(&tensor, op)?;
                let (n, dt) = (tensor.numel(), tensor.dtype());
                let alg = self.algorithm(OpKind::AllReduce, tensor.nbytes())?;
                let s = match alg {
                    Algorithm::Ring => ring::all_reduce(me, w, n, self.seg_elems(dt)),
                    Algorithm::HalvingDoubling => halving_doubling::all_reduce(me, w, n),
                    _ => recursive_doubling::all_reduce(me, w, n),
                };
                let mut init = vec![None; s.layout.chunk_elems.len()];
                fill(
                    &mut init,
                    &s.layout,
                    0..s.layout.blocks.len(),
                    &data,
                    dt.size(),
                )?;
                let fin = Finish::Whole(tensor.shape().to_vec());
                Ok(self.collective(
                    OpKind::AllReduce,
                    dt,
                    Some(n as u64),
                    None,
                    Some(op),
                    alg,
                    s,
                    init,
                    fin,
                ))
            }
            Request::Reduce { tensor, root, op } => {
                self.g.check_rank(root, "root")?;
                let data = self.prepare(&tensor, op)?;
                let (n, dt) = (tensor.numel(), tensor.dtype());
                let alg = self.algorithm(OpKind::Reduce, tensor.nbytes())?;
                let s = match alg {
                    Algorithm::Direct => direct::reduce(me, w, root, n),
                    _ => tree::reduce(me, w, root, n, self.seg_elems(dt)),
                };
                let mut init = vec![None; s.layout.chunk_elems.len()];
                fill(&mut init, &s.layout, 0..1, &data, dt.size())?;
                let fin = if me == root {
                    Finish::Whole(tensor.shape().to_vec())
                } else {
                    Finish::Return(tensor)
                };
                Ok(self.collective(
                    OpKind::Reduce,
                    dt,
                    Some(n as u64),
                    Some(root),
                    Some(op),
                    alg,
                    s,
                    init,
                    fin,
                ))
            }
            Request::Broadcast { tensor, root } => {
                self.g.check_rank(root, "root")?;
                let (n, dt) = (tensor.numel(), tensor.dtype());
                let alg = self.algorithm(OpKind::Broadcast, tensor.nbytes())?;
                let s = match alg {
                    Algorithm::Direct => direct::broadcast(me, w, root, n),
                    _ => tree::broadcast(me, w, root, n, self.seg_elems(dt)),
                };
                let mut init = vec![None; s.layout.chunk_elems.len()];
                let fin = if me == root {
                    fill(&mut init, &s.layout, 0..1, tensor.bytes(), dt.size())?;
                    Finish::Return(tensor)
                } else {
                    Finish::Whole(tensor.shape().to_vec())
                };
                Ok(self.collective(
                    OpKind::Broadcast,
                    dt,
                    Some(n as u64),
                    Some(root),
                    None,
                    alg,
                    s,
                    init,
                    fin,
                ))
            }
            Request::AllGather { input, outputs } => {
                list_len("all_gather's output list", outputs.len(), w)?;
                let dt = input.dtype();
                let mut blocks = Vec::with_capacity(w);
                for (r, o) in outputs.iter().enumerate() {
                    same_dtype(&format!("output {r}"), dt, o.dtype)?;
                    blocks.push(o.numel()?);
                }
                if blocks[me] != input.numel() {
                    return Err(Error::invalid(format!(
                        "output {me} (this rank's) holds {} elements but the input has {}",
                        blocks[me],
                        input.numel()
                    )));
                }
                let total = blocks
                    .iter()
                    .try_fold(0usize, |a, &b| a.checked_add(b))
                    .ok_or_else(|| Error::invalid("output sizes overflow"))?;
                let alg = self.algorithm(OpKind::AllGather, input.nbytes())?;
                let s = self.all_gather_schedule(alg, &blocks, dt);
                let mut init = vec![None; s.layout.chunk_elems.len()];
                fill(&mut init, &s.layout, me..me + 1, input.bytes(), dt.size())?;
                let fin = Finish::Blocks(0..w, outputs.into_iter().map(|o| o.shape).collect());
                Ok(self.collective(
                    OpKind::AllGather,
                    dt,
                    Some(total as u64),
                    None,
                    None,
                    alg,
                    s,
                    init,
                    fin,
                ))
            }
            Request::AllGatherIntoTensor { input, output } => {
                let dt = input.dtype();
                same_dtype("output", dt, output.dtype)?;
                let n = input.numel();
                if Some(output.numel()?) != n.checked_mul(w) {
                    return Err(Error::invalid(format!(
                        "output holds {} elements; {w} ranks × {n} were expected",
                        output.numel()?
                    )));
                }
                let alg = self.algorithm(OpKind::AllGatherIntoTensor, input.nbytes())?;
                let blocks = vec![n; w];
                let s = self.all_gather_schedule(alg, &blocks, dt);
                let mut init = vec![None; s.layout.chunk_elems.len()];
                fill(&mut init, &s.layout, me..me + 1, input.bytes(), dt.size())?;
                let fin = Finish::Whole(output.shape);
                Ok(self.collective(
                    OpKind::AllGatherIntoTensor,
                    dt,
                    Some((n * w) as u64),
                    None,
                    None,
                    alg,
                    s,
                    init,
                    fin,
                ))
            }
            Request::Gather { input, root } => {
                self.g.check_rank(root, "root")?;
                let (n, dt) = (input.numel(), input.dtype());
                let alg = self.algorithm(OpKind::Gather, input.nbytes())?;
                let s = direct::gather(me, w, root, &vec![n; w]);
                let mut init = vec![None; s.layout.chunk_elems.len()];
                fill(&mut init, &s.layout, me..me + 1, input.bytes(), dt.size())?;
                let fin = if me == root {
                    Finish::Blocks(0..w, vec![input.shape().to_vec(); w])
                } else {
                    Finish::Nothing
                };
                Ok(self.collective(
                    OpKind::Gather,
                    dt,
                    Some(n as u64),
                    Some(root),
                    None,
                    alg,
                    s,
                    init,
                    fin,
                ))
            }
            Request::Scatter {
                output,
                inputs,
                root,
            } => {
                self.g.check_rank(root, "root")?;
                let (n, dt) = (output.numel()?, output.dtype);
                let alg = self.algorithm(OpKind::Scatter, n * dt.size())?;
                let s = direct::scatter(me, w, root, &vec![n; w]);
                let mut init = vec![None; s.layout.chunk_elems.len()];
                if me == root {
                    let inputs = inputs.ok_or_else(|| {
                        Error::invalid("the scatter root must pass a scatter list")
                    })?;
                    list_len("scatter list", inputs.len(), w)?;
                    for (r, t) in inputs.iter().enumerate() {
                        same_dtype(&format!("scatter list entry {r}"), dt, t.dtype())?;
                        if t.numel() != n {
                            return Err(Error::invalid(format!(
                                "scatter list entry {r} has {} elements, the output {n}",
                                t.numel()
                            )));
                        }
                        fill(&mut init, &s.layout, r..r + 1, t.bytes(), dt.size())?;
                    }
                }
                let fin = Finish::Concat(me..me + 1, output.shape);
                Ok(self.collective(
                    OpKind::Scatter,
                    dt,
                    Some(n as u64),
                    Some(root),
                    None,
                    alg,
                    s,
                    init,
                    fin,
                ))
            }
            Request::ReduceScatter { inputs, op } => {
                list_len("reduce_scatter's input list", inputs.len(), w)?;
                let dt = inputs[0].dtype();
                let mut blocks = Vec::with_capacity(w);
                let mut datas = Vec::with_capacity(w);
                for (r, t) in inputs.iter().enumerate() {
                    same_dtype(&format!("input {r}"), dt, t.dtype())?;
                    blocks.push(t.numel());
                    datas.push(self.prepare(t, op)?);
                }
                let total: usize = blocks
                    .iter()
                    .try_fold(0usize, |a, &b| a.checked_add(b))
                    .ok_or_else(|| Error::invalid("input sizes overflow"))?;
                let alg = self.algorithm(OpKind::ReduceScatter, total * dt.size())?;
                let s = self.reduce_scatter_schedule(alg, &blocks, dt);
                let mut init = vec![None; s.layout.chunk_elems.len()];
                for (r, d) in datas.iter().enumerate() {
                    fill(&mut init, &s.layout, r..r + 1, d, dt.size())?;
                }
                let fin = Finish::Concat(me..me + 1, inputs[me].shape().to_vec());
                Ok(self.collective(
                    OpKind::ReduceScatter,
                    dt,
                    Some(total as u64),
                    None,
                    Some(op),
                    alg,
                    s,
                    init,
                    fin,
                ))
            }
            Request::ReduceScatterTensor { input, output, op } => {
                let dt = input.dtype();
                same_dtype("output", dt, output.dtype)?;
                let n = output.numel()?;
                if Some(input.numel()) != n.checked_mul(w) {
                    return Err(Error::invalid(format!(
                        "input holds {} elements; {w} ranks × {n} were expected",
                        input.numel()
                    )));
                }
                let data = self.prepare(&input, op)?;
                let alg = self.algorithm(OpKind::ReduceScatterTensor, input.nbytes())?;
                let blocks = vec![n; w];
                let s = self.reduce_scatter_schedule(alg, &blocks, dt);
                let mut init = vec![None; s.layout.chunk_elems.len()];
                fill(&mut init, &s.layout, 0..w, &data, dt.size())?;
                let fin = Finish::Concat(me..me + 1, output.shape);
                Ok(self.collective(
                    OpKind::ReduceScatterTensor,
                    dt,
                    Some(input.numel() as u64),
                    None,
                    Some(op),
                    alg,
                    s,
                    init,
                    fin,
                ))
            }
            Request::AllToAll { inputs, outputs } => {
                list_len("all_to_all's input list", inputs.len(), w)?;
                list_len("all_to_all's output list", outputs.len(), w)?;
                let dt = inputs[0].dtype();
                let mut send = Vec::with_capacity(w);
                let mut recv = Vec::with_capacity(w);
                for r in 0..w {
                    same_dtype(&format!("input {r}"), dt, inputs[r].dtype())?;
                    same_dtype(&format!("output {r}"), dt, outputs[r].dtype)?;
                    send.push(inputs[r].numel());
                    recv.push(outputs[r].numel()?);
                }
                if send[me] != recv[me] {
                    return Err(Error::invalid(format!(
                        "input {me} has {} elements but output {me} {} (this rank sends to itself)",
                        send[me], recv[me]
                    )));
                }
                let alg = self.algorithm(OpKind::AllToAll, 0)?;
                let s = pairwise::all_to_all(me, w, &send, &recv);
                let mut init = vec![None; s.layout.chunk_elems.len()];
                for (r, t) in inputs.iter().enumerate() {
                    fill(&mut init, &s.layout, r..r + 1, t.bytes(), dt.size())?;
                }
                fill(
                    &mut init,
                    &s.layout,
                    w + me..w + me + 1,
                    inputs[me].bytes(),
                    dt.size(),
                )?;
                let fin = Finish::Blocks(w..2 * w, outputs.into_iter().map(|o| o.shape).collect());
                Ok(self.collective(OpKind::AllToAll, dt, None, None, None, alg, s, init, fin))
            }
            Request::AllToAllSingle {
                input,
                output,
                output_splits,
                input_splits,
            } => {
                let dt = input.dtype();
                same_dtype("output", dt, output.dtype)?;
                let send = splits("input", input.shape(), input_splits, w)?;
                let recv = splits("output", &output.shape, output_splits, w)?;
                if send[me] != recv[me] {
                    return Err(Error::invalid(format!(
                        "this rank sends itself {} elements but expects {} from itself",
                        send[me], recv[me]
                    )));
                }
                let alg = self.algorithm(OpKind::AllToAllSingle, 0)?;
                let s = pairwise::all_to_all(me, w, &send, &recv);
                let mut init = vec![None; s.layout.chunk_elems.len()];
                fill(&mut init, &s.layout, 0..w, input.bytes(), dt.size())?;
                init[w + me] = init[me].clone();
                let fin = Finish::Concat(w..2 * w, output.shape);
                Ok(self.collective(
                    OpKind::AllToAllSingle,
                    dt,
                    None,
                    None,
                    None,
                    alg,
                    s,
                    init,
                    fin,
                ))
            }
            Request::Barrier | Request::NewGroup { .. } => {
                let (kind, count) = match req {
                    Request::NewGroup { members } => (OpKind::NewGroup, members),
                    _ => (OpKind::Barrier, 0),
                };
                let alg = self.algorithm(kind, 0)?;
                let s = dissemination::barrier(me, w);
                Ok(self.collective(
                    kind,
                    DType::U8,
                    Some(count),
                    None,
                    None,
                    alg,
                    s,
                    Vec::new(),
                    Finish::Nothing,
                ))
            }
            Request::Send { tensor, dst, tag } => {
                self.g.check_rank(dst, "destination")?;
                if dst == me {
                    return Err(Error::invalid("a rank cannot send to itself"));
                }
                let fp = p2p_fp(OpKind::Send, tensor.dtype(), tensor.numel() as u64);
                let body = Body::Send {
                    dst,
                    tag,
                    count: tensor.numel() as u64,
                    data: tensor.into_bytes(),
                };
                Ok(Plan {
                    fp,
                    reduce: None,
                    body,
                    timeout: self.timeout(),
                    group_size: w,
                })
            }
            Request::Recv { spec, src, tag } => {
                if let Some(s) = src {
                    self.g.check_rank(s, "source")?;
                    if s == me {
                        return Err(Error::invalid("a rank cannot receive from itself"));
                    }
                }
                let fp = p2p_fp(OpKind::Recv, spec.dtype, spec.numel()? as u64);
                Ok(Plan {
                    fp,
                    reduce: None,
                    body: Body::Recv { src, tag, spec },
                    timeout: self.timeout(),
                    group_size: w,
                })
            }
        }
    }

    fn timeout(&self) -> Duration {
        self.opts.timeout.unwrap_or(self.g.options.timeout)
    }
}

/// The fingerprint of a point-to-point call.
pub(crate) fn p2p_fp(kind: OpKind, dtype: DType, count: u64) -> Fingerprint {
    Fingerprint {
        count: Some(count),
        algorithm: Some(Algorithm::Direct),
        ..Fingerprint::new(kind, dtype)
    }
}

/// Element counts per rank of an all_to_all_single split along dimension 0.
fn splits(what: &str, shape: &[usize], given: Option<Vec<usize>>, w: usize) -> Result<Vec<usize>> {
    let (&rows, rest) = shape.split_first().ok_or_else(|| {
        Error::invalid(format!(
            "all_to_all_single's {what} needs at least one dimension"
        ))
    })?;
    let row = numel_of(rest)?;
    let rows_per = match given {
        None => {
            if !rows.is_multiple_of(w) {
                return Err(Error::invalid(format!(
                    "{what} dimension 0 ({rows}) is not divisible by the group size {w}"
                )));
            }
            vec![rows / w; w]
        }
        Some(v) => {
            list_len(&format!("{what} split sizes"), v.len(), w)?;
            let sum = v.iter().try_fold(0usize, |a, &b| a.checked_add(b));
            if sum != Some(rows) {
                return Err(Error::invalid(format!(
                    "{what} split sizes {v:?} do not add up to dimension 0 ({rows})"
                )));
            }
            v
        }
    };
    rows_per
        .into_iter()
        .map(|r| {
            r.checked_mul(row)
                .ok_or_else(|| Error::invalid("split size overflows"))
        })
        .collect()
}
