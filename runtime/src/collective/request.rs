//! [`Request`]: a call with torch.distributed's arguments, before it is checked and planned;
//! with what can be known of it before planning (its device, the bytes it declares) and a
//! map over its tensors (the device layer uses it to stage device tensors through the host).

use super::TensorSpec;
use crate::error::{Error, Result};
use crate::tensor::reduce::ReduceOp;
use crate::tensor::{Device, Tensor};

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
    /// `monitored_barrier(timeout)`: every rank reports to group rank 0, which waits for all
    /// of them until the call's timeout and then names each rank that did not come (torch's
    /// `wait_all_ranks=True`); every rank returns that verdict.
    MonitoredBarrier,
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
    /// What kind of call this is (its [`OpKind::name`](crate::OpKind::name) is torch's name).
    pub fn kind(&self) -> crate::OpKind {
        use crate::OpKind as K;
        match self {
            Request::AllReduce { .. } => K::AllReduce,
            Request::Reduce { .. } => K::Reduce,
            Request::Broadcast { .. } => K::Broadcast,
            Request::AllGather { .. } => K::AllGather,
            Request::AllGatherIntoTensor { .. } => K::AllGatherIntoTensor,
            Request::Gather { .. } => K::Gather,
            Request::Scatter { .. } => K::Scatter,
            Request::ReduceScatter { .. } => K::ReduceScatter,
            Request::ReduceScatterTensor { .. } => K::ReduceScatterTensor,
            Request::AllToAll { .. } => K::AllToAll,
            Request::AllToAllSingle { .. } => K::AllToAllSingle,
            Request::Barrier => K::Barrier,
            Request::MonitoredBarrier => K::MonitoredBarrier,
            Request::Send { .. } => K::Send,
            Request::Recv { .. } => K::Recv,
            Request::NewGroup { .. } => K::NewGroup,
        }
    }

    /// Whether this is a point-to-point call (matched by tag, outside the group's sequence
    /// of calls).
    pub fn is_p2p(&self) -> bool {
        matches!(self, Request::Send { .. } | Request::Recv { .. })
    }

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
            Request::Barrier | Request::MonitoredBarrier | Request::NewGroup { .. } => {}
        }
        Ok(total)
    }

    /// The one device every tensor and output spec of the call is on ([`Device::Host`] for
    /// a call with none, such as a barrier); mixing devices in one call is an
    /// [`Error::InvalidArgument`].
    pub fn device(&self) -> Result<Device> {
        // No allocation: this runs on every call, twice.
        let mut first: Option<Device> = None;
        let mut other: Option<Device> = None;
        let mut see = |d: Device| match first {
            None => first = Some(d),
            Some(f) if f != d && other.is_none() => other = Some(d),
            Some(_) => {}
        };
        match self {
            Request::AllReduce { tensor, .. }
            | Request::Reduce { tensor, .. }
            | Request::Broadcast { tensor, .. }
            | Request::Send { tensor, .. } => see(tensor.device()),
            Request::AllGather { input, .. }
            | Request::AllGatherIntoTensor { input, .. }
            | Request::Gather { input, .. }
            | Request::ReduceScatterTensor { input, .. }
            | Request::AllToAllSingle { input, .. } => see(input.device()),
            Request::Scatter { inputs, .. } => {
                inputs.iter().flatten().for_each(|x| see(x.device()))
            }
            Request::ReduceScatter { inputs, .. } | Request::AllToAll { inputs, .. } => {
                inputs.iter().for_each(|x| see(x.device()))
            }
            Request::Barrier
            | Request::MonitoredBarrier
            | Request::Recv { .. }
            | Request::NewGroup { .. } => {}
        }
        match self {
            Request::AllGather { outputs, .. } | Request::AllToAll { outputs, .. } => {
                outputs.iter().for_each(|s| see(s.device))
            }
            Request::AllGatherIntoTensor { output, .. }
            | Request::Scatter { output, .. }
            | Request::ReduceScatterTensor { output, .. }
            | Request::AllToAllSingle { output, .. }
            | Request::Recv { spec: output, .. } => see(output.device),
            _ => {}
        }
        let first = first.unwrap_or_default();
        match other {
            Some(other) => Err(Error::invalid(format!(
                "one call mixes tensors on {first} and {other}; move them to one device first"
            ))),
            None => Ok(first),
        }
    }
}
