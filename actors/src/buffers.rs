//! Caller-owned buffers: [`BufferCalls`] (its doc has the table beside torch's names and
//! the rules), [`BufferWork`] and [`Failed`].

use crate::comm::Communicator;
use crate::work::Work;
use collectix_runtime::collective::coalesce::{coalesce, Coalesced, Coalescing};
use collectix_runtime::{
    Buffer, CallOptions, DType, Destination, Device, Error, Output, ReduceOp, Request, Result,
    Tensor, TensorSpec,
};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// A call that writes into caller buffers, in flight: like [`Work`], with the buffers handed
/// back whatever happens ([`Failed`] on an error).
#[must_use = "a dropped BufferWork detaches the call and drops its buffers"]
pub struct BufferWork<T> {
    work: Work<T>,
    dest: Destination,
}

impl<T> BufferWork<T> {
    /// `error` with the buffers, once the call has ended; a call still running (a wait
    /// refused with [`Error::WouldDeadlock`]) keeps them, detached, and none come back.
    fn failed(dest: &Destination, work: &Work<T>, error: Error) -> Failed {
        let buffers = if work.is_completed() {
            dest.take().unwrap_or_default()
        } else {
            Vec::new()
        };
        Failed { error, buffers }
    }

    /// Blocks until the call finishes (as [`Work::wait`]).
    pub fn wait(self) -> std::result::Result<T, Failed> {
        let BufferWork { work, dest } = self;
        let done = work.is_completed();
        match work.wait() {
            Ok(t) => Ok(t),
            Err(error) => Err(Failed {
                buffers: if done || !matches!(error, Error::WouldDeadlock) {
                    dest.take().unwrap_or_default()
                } else {
                    Vec::new()
                },
                error,
            }),
        }
    }

    /// Whether the call has finished.
    pub fn is_completed(&self) -> bool {
        self.work.is_completed()
    }
}

impl<T> Future for BufferWork<T> {
    type Output = std::result::Result<T, Failed>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        match Pin::new(&mut this.work).poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok(t)) => Poll::Ready(Ok(t)),
            Poll::Ready(Err(e)) => Poll::Ready(Err(BufferWork::failed(&this.dest, &this.work, e))),
        }
    }
}

impl<T> std::fmt::Debug for BufferWork<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BufferWork")
            .field("completed", &self.is_completed())
            .finish()
    }
}

/// A call on caller buffers that failed: the error, and the buffers back (their contents
/// unspecified, see [`BufferCalls`]). Converts into [`Error`], so `?` works.
#[derive(Debug)]
pub struct Failed {
    /// Why.
    pub error: Error,
    /// The call's buffers, in the order they were given.
    pub buffers: Vec<Buffer>,
}

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.error.fmt(f)
    }
}

impl std::error::Error for Failed {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl From<Failed> for Error {
    fn from(f: Failed) -> Error {
        f.error
    }
}

/// Caller-owned buffers: every collective torch writes into a caller's tensor, writing into
/// a caller's [`Buffer`] ([`Communicator::buffers`]), with torch's names and argument order.
///
/// | torch.distributed | collectix |
/// |---|---|
/// | `all_reduce(tensor, op)` | `buffers().all_reduce(tensor, op)` |
/// | `broadcast(tensor, src)` | `buffers().broadcast(tensor, src)` |
/// | `reduce(tensor, dst, op)` | `buffers().reduce(tensor, dst, op)` |
/// | `all_gather(tensor_list, tensor)` | `buffers().all_gather(tensor_list, tensor)` |
/// | `all_gather_into_tensor(output, input)` | `buffers().all_gather_into_tensor(output, input)` |
/// | `all_gather_into_tensor(output, output.chunk(w)[rank])` | `buffers().all_gather_into_tensor_in_place(output)` |
/// | `gather(tensor, gather_list, dst)` | `buffers().gather(tensor, gather_list, dst)` |
/// | `scatter(tensor, scatter_list, src)` | `buffers().scatter(tensor, scatter_list, src)` |
/// | `reduce_scatter(output, input_list, op)` | `buffers().reduce_scatter(output, input_list, op)` |
/// | `reduce_scatter_tensor(output, input, op)` | `buffers().reduce_scatter_tensor(output, input, op)` |
/// | `all_to_all(output_list, input_list)` | `buffers().all_to_all(output_list, input_list)` |
/// | `all_to_all_single(output, input, …)` | `buffers().all_to_all_single(output, input, …)` |
/// | `recv(tensor, src)` | `buffers().recv(tensor, src, tag)` |
///
/// The rules, each enforced rather than documented:
/// - **The caller cannot touch a buffer while its call runs**: the call takes it by value and
///   its [`BufferWork`] hands it back, with the result or with the error ([`Failed`]).
/// - **A buffer of the wrong dtype, size or count is refused before anything is sent**, with
///   [`Error::InvalidArgument`]; the group's other members are told, so their parts of the
///   call fail at once with [`Error::CallFailed`], and the buffers come back unchanged.
/// - **Nothing aliases**: inputs are [`Tensor`]s (shared and immutable) and outputs are
///   buffers (owned and mutable), so an output can never be an input. The in-place forms read
///   their input out of the buffer when the call is issued; the engine never sends memory of
///   a caller's buffer, so no peer reads what this rank writes.
/// - **A call that fails** hands its buffers back in [`Failed::buffers`], with their dtype,
///   size and shape; their contents are unspecified: each element holds its old value, its
///   result, or a partial result (the engine writes each part of the output as soon as it is
///   final, so that a call holds no second copy of its output).
///
/// What it costs: no allocation proportional to the data on this path, in steady state (the
/// engine's working chunks are recycled through a pool; `tests/buffers_alloc.rs` counts);
/// a call's memory is its inputs, its outputs and the chunks in flight. An in-place call
/// copies its input once (into a recycled buffer) when it is issued.
///
/// ```
/// use collectix_actors::World;
/// use collectix_runtime::{Buffer, DType, ReduceOp, Tensor};
///
/// let world = World::local(2)?;
/// let works: Vec<_> = world.communicators().iter().map(|c| {
///     // FSDP2's gather: each rank's shard is its slice of one flat buffer.
///     let mut flat = Buffer::zeros(&[4], DType::F32).expect("4 floats");
///     let r = c.rank();
///     flat.as_mut_slice::<f32>()?[2 * r..2 * r + 2].copy_from_slice(&[r as f32; 2]);
///     Ok(c.buffers().all_gather_into_tensor_in_place(flat))
/// }).collect::<collectix_runtime::Result<_>>()?;
/// for w in works {
///     assert_eq!(w.wait()?.to_vec::<f32>()?, vec![0.0, 0.0, 1.0, 1.0]);
/// }
/// # Ok::<(), collectix_runtime::Error>(())
/// ```
///
/// A buffer moves into its call, so touching it before the call hands it back does not
/// compile:
///
/// ```compile_fail
/// # use collectix_actors::World;
/// # use collectix_runtime::{Buffer, DType, ReduceOp};
/// # let world = World::local(1).unwrap();
/// # let c = &world.communicators()[0];
/// let mut b = Buffer::zeros(&[4], DType::F32).unwrap();
/// let work = c.buffers().all_reduce(b, ReduceOp::Sum);
/// b.as_mut_slice::<f32>(); // error[E0382]: borrow of moved value: `b`
/// # drop(work.wait());
/// ```
#[derive(Clone)]
pub struct BufferCalls<'a> {
    comm: &'a Communicator,
    opts: CallOptions,
}

fn exactly_one(mut v: Vec<Buffer>) -> Result<Buffer> {
    match (v.pop(), v.is_empty()) {
        (Some(b), true) => Ok(b),
        _ => Err(Error::internal("expected one output buffer")),
    }
}

impl Communicator {
    /// This communicator's calls that write into caller-owned [`Buffer`]s: torch's
    /// pre-allocated outputs and in-place forms (see [`BufferCalls`]).
    pub fn buffers(&self) -> BufferCalls<'_> {
        BufferCalls {
            comm: self,
            opts: CallOptions::default(),
        }
    }
}

impl<'a> BufferCalls<'a> {
    /// The same calls with per-call options (algorithm, timeout).
    pub fn with_options(mut self, opts: &CallOptions) -> BufferCalls<'a> {
        self.opts = opts.clone();
        self
    }

    /// Plans `req` writing into `bufs` and issues it; `unpack` makes the caller's result of
    /// the buffers. A refused call (its arguments, or its buffers) still takes its sequence
    /// number and tells the other members, and hands the buffers back.
    #[track_caller]
    fn issue<T: Send + 'static>(
        &self,
        req: Result<Request>,
        bufs: Vec<Buffer>,
        unpack: impl FnOnce(Vec<Buffer>) -> Result<T> + Send + 'static,
    ) -> BufferWork<T> {
        self.issue_to(req, Destination::new(bufs), unpack)
    }

    /// [`issue`](Self::issue) into a destination made already (runs of its own).
    #[track_caller]
    fn issue_to<T: Send + 'static>(
        &self,
        req: Result<Request>,
        dest: Destination,
        unpack: impl FnOnce(Vec<Buffer>) -> Result<T> + Send + 'static,
    ) -> BufferWork<T> {
        let _site = crate::site::enter();
        let member = &self.comm.member;
        let work = match req {
            Err(e) => member.refuse(false, e),
            Ok(req) => member.call_host_into(req, &self.opts, &dest, move |o| match o {
                Output::Buffers(v) => unpack(v),
                other => Err(Error::internal(format!(
                    "expected the caller's buffers back, got {other:?}"
                ))),
            }),
        };
        BufferWork { work, dest }
    }

    /// The coalesced call `kind` of `inputs` (bytes of host tensors of `dtype`; `Err` where
    /// the list is not one of those) writing into `outputs`: one call, one message per peer
    /// per step (`collective::coalesce`).
    #[track_caller]
    fn coalesced<T: Send + 'static>(
        &self,
        kind: Coalescing,
        dtype: Result<DType>,
        inputs: &[&[u8]],
        outputs: Vec<Buffer>,
        unpack: impl FnOnce(Vec<Buffer>) -> Result<T> + Send + 'static,
    ) -> BufferWork<T> {
        let made = self.flatten(kind, dtype, inputs);
        self.issue_coalesced(made, outputs, unpack)
    }

    /// The one call of a coalesced list (its flat input copied into staging memory).
    fn flatten(
        &self,
        kind: Coalescing,
        dtype: Result<DType>,
        inputs: &[&[u8]],
    ) -> Result<Coalesced> {
        let staging = &self.comm.member.group.staging;
        dtype.and_then(|d| coalesce(kind, d, inputs, self.comm.size(), staging))
    }

    /// Issues a coalesced call made by [`flatten`](Self::flatten), writing into `outputs`.
    #[track_caller]
    fn issue_coalesced<T: Send + 'static>(
        &self,
        made: Result<Coalesced>,
        outputs: Vec<Buffer>,
        unpack: impl FnOnce(Vec<Buffer>) -> Result<T> + Send + 'static,
    ) -> BufferWork<T> {
        match made {
            Ok(c) => self.issue_to(
                Ok(c.request),
                Destination::with_runs(outputs, c.runs),
                unpack,
            ),
            Err(e) => self.issue(Err(e), outputs, unpack),
        }
    }

    /// torch's `all_reduce_coalesced(tensors, op)`, in place: every buffer comes back
    /// holding its reduction, all of them moved as one call (one message per peer per step).
    /// The buffers share one dtype.
    #[track_caller]
    pub fn all_reduce_coalesced(
        &self,
        tensors: Vec<Buffer>,
        op: ReduceOp,
    ) -> BufferWork<Vec<Buffer>> {
        let dtype = one_dtype(tensors.iter().map(|b| (b.dtype(), Device::Host)));
        let inputs: Vec<&[u8]> = tensors.iter().map(Buffer::bytes).collect();
        // The buffers are the outputs too: the flat input is copied out of them first.
        let made = self.flatten(Coalescing::AllReduce(op), dtype, &inputs);
        drop(inputs);
        self.issue_coalesced(made, tensors, Ok)
    }

    /// `all_gather_into_tensor` of many tensors as one call (torch's
    /// `all_gather_into_tensor_coalesced`): `outputs[i]` (W × `inputs[i]`'s elements) gets
    /// every rank's `inputs[i]`, in rank order.
    #[track_caller]
    pub fn all_gather_into_tensor_coalesced(
        &self,
        outputs: Vec<Buffer>,
        inputs: Vec<Tensor>,
    ) -> BufferWork<Vec<Buffer>> {
        let dtype = one_dtype(inputs.iter().map(|t| (t.dtype(), t.device())));
        let bytes: Vec<&[u8]> = inputs.iter().map(|t| &t.bytes()[..]).collect();
        self.coalesced(Coalescing::AllGatherIntoTensor, dtype, &bytes, outputs, Ok)
    }

    /// `reduce_scatter_tensor` of many tensors as one call (torch's
    /// `reduce_scatter_tensor_coalesced`): `outputs[i]` gets the reduction of every rank's
    /// block `rank` of `inputs[i]` (W × `outputs[i]`'s elements).
    #[track_caller]
    pub fn reduce_scatter_tensor_coalesced(
        &self,
        outputs: Vec<Buffer>,
        inputs: Vec<Tensor>,
        op: ReduceOp,
    ) -> BufferWork<Vec<Buffer>> {
        let dtype = one_dtype(inputs.iter().map(|t| (t.dtype(), t.device())));
        let bytes: Vec<&[u8]> = inputs.iter().map(|t| &t.bytes()[..]).collect();
        self.coalesced(
            Coalescing::ReduceScatterTensor(op),
            dtype,
            &bytes,
            outputs,
            Ok,
        )
    }

    /// A copy of `elems` elements of `buf` (in elements) as a tensor, from the member's
    /// recycled staging memory: the input of an in-place call.
    fn staged(&self, buf: &Buffer, elems: std::ops::Range<usize>) -> Result<Tensor> {
        let src = buf.elems(elems.clone())?;
        let mut b = self.comm.member.group.staging.take(src.len());
        b.bytes_mut().copy_from_slice(src);
        let shape = if elems.len() == buf.numel() {
            buf.shape().to_vec()
        } else {
            vec![elems.len()]
        };
        Tensor::from_bytes(b.freeze(), buf.dtype(), &shape)
    }

    /// Any collective [`Request`] (as [`Communicator::submit`]), writing its outputs into
    /// `outputs`: one buffer per output tensor the call returns on this rank, in order (see
    /// [`outputs_for`](Self::outputs_for)). A call whose output is its input (a reduce's
    /// non-root, a broadcast's root) leaves its buffer as it is.
    #[track_caller]
    pub fn submit(&self, req: Request, outputs: Vec<Buffer>) -> BufferWork<Vec<Buffer>> {
        self.issue(Ok(req), outputs, Ok)
    }

    /// Buffers for `req`'s outputs on this rank, for [`submit`](Self::submit): zeros of
    /// each output's shape and dtype, or a copy of the input where the output is the input.
    /// Nothing is issued.
    pub fn outputs_for(&self, req: &Request) -> Result<Vec<Buffer>> {
        let info = &self.comm.member.group.info;
        collectix_runtime::Plan::new(req.clone(), info, &self.opts)?.output_buffers()
    }

    /// `all_reduce(tensor, op)`, in place: `tensor` comes back holding the reduction.
    #[track_caller]
    pub fn all_reduce(&self, tensor: Buffer, op: ReduceOp) -> BufferWork<Buffer> {
        let req = self
            .staged(&tensor, 0..tensor.numel())
            .map(|t| Request::AllReduce { tensor: t, op });
        self.issue(req, vec![tensor], exactly_one)
    }

    /// `broadcast(tensor, src)`, in place: the root's `tensor` is sent (and comes back as it
    /// was), every other rank's is overwritten with it.
    #[track_caller]
    pub fn broadcast(&self, tensor: Buffer, src: usize) -> BufferWork<Buffer> {
        let req = self
            .staged(&tensor, 0..tensor.numel())
            .map(|t| Request::Broadcast {
                tensor: t,
                root: src,
            });
        self.issue(req, vec![tensor], exactly_one)
    }

    /// `reduce(tensor, dst, op)`, in place: `dst`'s `tensor` comes back holding the
    /// reduction; the others' come back unchanged.
    #[track_caller]
    pub fn reduce(&self, tensor: Buffer, dst: usize, op: ReduceOp) -> BufferWork<Buffer> {
        let req = self
            .staged(&tensor, 0..tensor.numel())
            .map(|t| Request::Reduce {
                tensor: t,
                root: dst,
                op,
            });
        self.issue(req, vec![tensor], exactly_one)
    }

    /// `all_gather(tensor_list, tensor)`: `tensor_list[r]` gets rank r's `tensor`.
    #[track_caller]
    pub fn all_gather(&self, tensor_list: Vec<Buffer>, tensor: Tensor) -> BufferWork<Vec<Buffer>> {
        let outputs = tensor_list.iter().map(Buffer::spec).collect();
        let req = Request::AllGather {
            input: tensor,
            outputs,
        };
        self.issue(Ok(req), tensor_list, Ok)
    }

    /// `all_gather_into_tensor(output, input)`: `output` (W times `input`'s elements) gets
    /// every rank's `input`, in rank order.
    #[track_caller]
    pub fn all_gather_into_tensor(&self, output: Buffer, input: Tensor) -> BufferWork<Buffer> {
        let req = Request::AllGatherIntoTensor {
            input,
            output: output.spec(),
        };
        self.issue(Ok(req), vec![output], exactly_one)
    }

    /// `all_gather_into_tensor(output, output.chunk(W)[rank])`, FSDP2's gather: this rank's
    /// input is its own slice of `output` (elements `rank·n..(rank+1)·n`, with n the
    /// buffer's elements / W), and the whole buffer comes back gathered.
    #[track_caller]
    pub fn all_gather_into_tensor_in_place(&self, output: Buffer) -> BufferWork<Buffer> {
        let (w, r) = (self.comm.size(), self.comm.rank());
        let n = output.numel() / w.max(1);
        let req = if n * w != output.numel() {
            Err(Error::invalid(format!(
                "an in-place all_gather_into_tensor needs a buffer of a multiple of {w} elements (the group's size); it holds {}",
                output.numel()
            )))
        } else {
            self.staged(&output, r * n..(r + 1) * n)
                .map(|input| Request::AllGatherIntoTensor {
                    input,
                    output: output.spec(),
                })
        };
        self.issue(req, vec![output], exactly_one)
    }

    /// `gather(tensor, gather_list, dst)`: `dst` passes one buffer per rank and gets them
    /// back filled; the others pass `None` and get `None`.
    #[track_caller]
    pub fn gather(
        &self,
        tensor: Tensor,
        gather_list: Option<Vec<Buffer>>,
        dst: usize,
    ) -> BufferWork<Option<Vec<Buffer>>> {
        let root = self.comm.rank() == dst;
        let req = Request::Gather {
            input: tensor,
            root: dst,
        };
        self.issue(Ok(req), gather_list.unwrap_or_default(), move |v| {
            Ok(root.then_some(v))
        })
    }

    /// `scatter(tensor, scatter_list, src)`: `tensor` gets the root's `scatter_list[rank]`.
    #[track_caller]
    pub fn scatter(
        &self,
        tensor: Buffer,
        scatter_list: Option<Vec<Tensor>>,
        src: usize,
    ) -> BufferWork<Buffer> {
        let req = Request::Scatter {
            output: tensor.spec(),
            inputs: scatter_list,
            root: src,
        };
        self.issue(Ok(req), vec![tensor], exactly_one)
    }

    /// `reduce_scatter(output, input_list, op)`: `output` gets the reduction of every rank's
    /// `input_list[rank]`.
    #[track_caller]
    pub fn reduce_scatter(
        &self,
        output: Buffer,
        input_list: Vec<Tensor>,
        op: ReduceOp,
    ) -> BufferWork<Buffer> {
        let req = Request::ReduceScatter {
            inputs: input_list,
            op,
        };
        self.issue(Ok(req), vec![output], exactly_one)
    }

    /// `reduce_scatter_tensor(output, input, op)`: `output` gets the reduction of every
    /// rank's block `rank` of `input` (W times `output`'s elements).
    #[track_caller]
    pub fn reduce_scatter_tensor(
        &self,
        output: Buffer,
        input: Tensor,
        op: ReduceOp,
    ) -> BufferWork<Buffer> {
        let req = Request::ReduceScatterTensor {
            input,
            output: output.spec(),
            op,
        };
        self.issue(Ok(req), vec![output], exactly_one)
    }

    /// `all_to_all(output_list, input_list)`: `output_list[r]` gets rank r's
    /// `input_list[rank]`.
    #[track_caller]
    pub fn all_to_all(
        &self,
        output_list: Vec<Buffer>,
        input_list: Vec<Tensor>,
    ) -> BufferWork<Vec<Buffer>> {
        let outputs = output_list.iter().map(Buffer::spec).collect();
        let req = Request::AllToAll {
            inputs: input_list,
            outputs,
        };
        self.issue(Ok(req), output_list, Ok)
    }

    /// `all_to_all_single(output, input, output_split_sizes, input_split_sizes)`.
    #[track_caller]
    pub fn all_to_all_single(
        &self,
        output: Buffer,
        input: Tensor,
        output_split_sizes: Option<Vec<usize>>,
        input_split_sizes: Option<Vec<usize>>,
    ) -> BufferWork<Buffer> {
        let req = Request::AllToAllSingle {
            input,
            output: output.spec(),
            output_splits: output_split_sizes,
            input_splits: input_split_sizes,
        };
        self.issue(Ok(req), vec![output], exactly_one)
    }

    /// `recv(tensor, src, tag)`: `tensor` gets the message (of exactly its dtype and
    /// elements) and comes back with its sender; `src: None` receives from any rank. Unlike the
    /// collectives, the message is received whole and then copied in (one more copy).
    #[track_caller]
    pub fn recv(
        &self,
        tensor: Buffer,
        src: Option<usize>,
        tag: u32,
    ) -> BufferWork<(Buffer, usize)> {
        let spec: TensorSpec = tensor.spec();
        let dest = Destination::new(vec![tensor]);
        let back = dest.clone();
        let received = self.comm.recv(spec, src, tag);
        let work = self.comm.member.map_work(received, move |(t, from)| {
            // The engine checked the message against the buffer's spec.
            back.with(|bufs| match bufs {
                [b] if b.nbytes() == t.nbytes() => {
                    b.bytes_mut().copy_from_slice(t.bytes());
                    Ok(())
                }
                _ => Err(Error::internal(
                    "a received message of another size than its buffer",
                )),
            })
            .unwrap_or_else(|| {
                Err(Error::internal(
                    "the receive's buffer was taken while it ran",
                ))
            })?;
            let b = back
                .take()
                .map(exactly_one)
                .ok_or_else(|| Error::internal("the receive's buffer was taken while it ran"))??;
            Ok((b, from))
        });
        BufferWork { work, dest }
    }
}

/// The one dtype of a coalesced call's tensors, all on the host.
fn one_dtype(mut tensors: impl Iterator<Item = (DType, Device)>) -> Result<DType> {
    let (first, dev) = tensors
        .next()
        .ok_or_else(|| Error::invalid("a coalesced call of no tensors"))?;
    for (i, (d, v)) in std::iter::once((first, dev)).chain(tensors).enumerate() {
        if !v.is_host() {
            return Err(Error::invalid(format!(
                "tensor {i} of a coalesced call is on {v}; coalesced calls move host tensors"
            )));
        }
        if d != first {
            return Err(Error::invalid(format!(
                "tensor {i} of a coalesced call is {d}, tensor 0 {first}: one call moves one dtype"
            )));
        }
    }
    Ok(first)
}

/// Zeros shaped like `t` with its first dimension multiplied by `mul` and divided by `div`
/// (1-D where it does not divide).
fn scaled(t: &Tensor, mul: usize, div: usize) -> Result<Buffer> {
    let too_big = || {
        Error::invalid(format!(
            "a tensor of shape {:?} gathered {mul} times overflows",
            t.shape()
        ))
    };
    let div = div.max(1);
    let shape = match t.shape().split_first() {
        Some((&d0, rest)) => {
            let d = d0.checked_mul(mul).ok_or_else(too_big)?;
            if d.is_multiple_of(div) {
                let mut s = vec![d / div];
                s.extend_from_slice(rest);
                s
            } else {
                vec![t.numel().checked_mul(mul).ok_or_else(too_big)? / div]
            }
        }
        None => vec![t.numel().checked_mul(mul).ok_or_else(too_big)? / div],
    };
    Buffer::zeros(&shape, t.dtype())
}

impl Communicator {
    /// torch's `all_reduce_coalesced(tensors, op)`: every tensor's reduction, all of them
    /// moved as one call (one message per peer per step). The tensors share one dtype.
    #[track_caller]
    pub fn all_reduce_coalesced(&self, tensors: Vec<Tensor>, op: ReduceOp) -> Work<Vec<Tensor>> {
        self.coalesced_tensors(Coalescing::AllReduce(op), tensors, 1, 1)
    }

    /// `all_gather_into_tensor` of many tensors as one call: output i (first dimension W
    /// times input i's) holds every rank's input i, in rank order.
    #[track_caller]
    pub fn all_gather_into_tensor_coalesced(&self, inputs: Vec<Tensor>) -> Work<Vec<Tensor>> {
        let w = self.size();
        self.coalesced_tensors(Coalescing::AllGatherIntoTensor, inputs, w, 1)
    }

    /// `reduce_scatter_tensor` of many tensors as one call: output i (first dimension input
    /// i's / W) holds the reduction of every rank's block `rank` of input i.
    #[track_caller]
    pub fn reduce_scatter_tensor_coalesced(
        &self,
        inputs: Vec<Tensor>,
        op: ReduceOp,
    ) -> Work<Vec<Tensor>> {
        let w = self.size();
        self.coalesced_tensors(Coalescing::ReduceScatterTensor(op), inputs, 1, w)
    }

    /// A coalesced call on tensors, its outputs made here (output i: input i's shape, its
    /// first dimension × `mul` / `div`).
    #[track_caller]
    fn coalesced_tensors(
        &self,
        kind: Coalescing,
        inputs: Vec<Tensor>,
        mul: usize,
        div: usize,
    ) -> Work<Vec<Tensor>> {
        let b = self.buffers();
        let outputs = inputs
            .iter()
            .map(|t| scaled(t, mul, div))
            .collect::<Result<Vec<_>>>();
        let dtype = one_dtype(inputs.iter().map(|t| (t.dtype(), t.device())));
        let bytes: Vec<&[u8]> = inputs.iter().map(|t| &t.bytes()[..]).collect();
        let to_tensors = |v: Vec<Buffer>| v.into_iter().map(Buffer::into_tensor).collect();
        match outputs {
            Ok(outputs) => b.coalesced(kind, dtype, &bytes, outputs, to_tensors).work,
            Err(e) => b.issue(Err(e), Vec::new(), to_tensors).work,
        }
    }
}
