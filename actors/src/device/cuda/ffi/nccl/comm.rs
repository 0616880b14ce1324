//! An NCCL communicator ([`Comm`]): how it settles, reports errors, groups calls and makes a
//! call's reduction.

use super::{Nccl, RawComm, IN_PROGRESS, SCALAR_HOST_IMMEDIATE, SETTLE_POLL, SUCCESS};
use collectix_runtime::{DType, DeviceError, Result};
use std::ffi::c_int;
use std::sync::Arc;

/// An NCCL communicator, owned by the one worker thread that made it (it is `!Send`: the raw
/// pointer keeps it so). Dropping it aborts it, which never blocks and never panics.
pub(crate) struct Comm {
    pub(super) raw: RawComm,
    pub(super) nccl: Arc<Nccl>,
    pub(super) size: usize,
    /// This rank in the communicator.
    pub(super) rank: usize,
    /// How long an operation may stay "in progress" on the host side.
    pub(super) limit: std::time::Duration,
}

/// A reduction NCCL knows: a built-in (`ncclRedOp_t` 0–4) or a pre-multiplied sum made for
/// one call.
pub(crate) enum RedOp {
    BuiltIn(c_int),
    PreMulSum(f64),
}

impl Comm {
    /// Ranks in the communicator.
    pub(crate) fn size(&self) -> usize {
        self.size
    }

    /// Waits (polling, at most `limit`) until the communicator is no longer in progress, and
    /// reports its state.
    pub(super) fn settle(&self, call: &str) -> Result<()> {
        let deadline = crate::sync::deadline_after(self.limit);
        loop {
            let mut e: c_int = SUCCESS;
            // SAFETY: `raw` is a live communicator; `e` a valid out-pointer.
            let r = unsafe { (self.nccl.comm_get_async_error)(self.raw, &mut e) };
            self.nccl.check(r, "ncclCommGetAsyncError")?;
            if e != IN_PROGRESS {
                return self.nccl.check(e, call);
            }
            if std::time::Instant::now() >= deadline {
                return Err(DeviceError::Nccl {
                    call: call.into(),
                    code: IN_PROGRESS as u32,
                    detail: format!("still in progress after {} ms", self.limit.as_millis()),
                }
                .into());
            }
            std::thread::sleep(SETTLE_POLL);
        }
    }

    /// The result of an enqueueing call: `ncclInProgress` (a nonblocking communicator still
    /// enqueueing) is waited out.
    pub(super) fn done(&self, code: c_int, call: &str) -> Result<()> {
        if code == IN_PROGRESS {
            self.settle(call)
        } else {
            self.nccl.check(code, call)
        }
    }

    /// The communicator's asynchronous error, if any (`ncclCommGetAsyncError`).
    pub(crate) fn async_error(&self) -> Result<()> {
        let mut e: c_int = SUCCESS;
        // SAFETY: `raw` is a live communicator; `e` a valid out-pointer.
        let r = unsafe { (self.nccl.comm_get_async_error)(self.raw, &mut e) };
        self.nccl.check(r, "ncclCommGetAsyncError")?;
        if e == IN_PROGRESS {
            return Ok(());
        }
        self.nccl.check(e, "an NCCL operation (asynchronous error)")
    }

    /// Runs `f` between `ncclGroupStart` and `ncclGroupEnd` (the end always runs).
    pub(crate) fn grouped(&self, f: impl FnOnce() -> Result<()>) -> Result<()> {
        // SAFETY: group calls take no arguments and only mark NCCL's thread-local state.
        self.nccl
            .check(unsafe { (self.nccl.group_start)() }, "ncclGroupStart")?;
        let inner = f();
        // SAFETY: as above; pairs the start above.
        let end = self.done(unsafe { (self.nccl.group_end)() }, "ncclGroupEnd");
        inner.and(end)
    }

    /// Makes the op for one call (a pre-multiplied sum is created on the communicator).
    pub(super) fn op(&self, op: &RedOp, dtype: DType) -> Result<(c_int, bool)> {
        match op {
            RedOp::BuiltIn(o) => Ok((*o, false)),
            RedOp::PreMulSum(_) => {
                let mut scalar = scalar_bytes(op, dtype);
                let dtype = nccl_dtype(dtype)?;
                let mut out: c_int = 0;
                // SAFETY: `scalar` holds the multiplier encoded in the call's element type
                // (just above), read at once (host-immediate); `out` is valid.
                let r = unsafe {
                    (self.nccl.premul_sum)(
                        &mut out,
                        scalar.as_mut_ptr().cast(),
                        dtype,
                        SCALAR_HOST_IMMEDIATE,
                        self.raw,
                    )
                };
                self.nccl.check(r, "ncclRedOpCreatePreMulSum")?;
                Ok((out, true))
            }
        }
    }

    pub(super) fn drop_op(&self, op: c_int, made: bool) {
        if made {
            // SAFETY: `op` was created on this communicator by `op` above; destroying it
            // right after the call that uses it was enqueued is allowed (nccl.h).
            let _ = unsafe { (self.nccl.red_op_destroy)(op, self.raw) };
        }
    }
}

/// `ncclDataType_t` for a dtype; bool travels as `ncclUint8` where nothing is reduced.
pub(crate) fn nccl_dtype(d: DType) -> Result<c_int> {
    Ok(match d {
        DType::I8 => 0,
        DType::U8 | DType::Bool => 1,
        DType::I32 => 2,
        DType::U32 => 3,
        DType::I64 => 4,
        DType::U64 => 5,
        DType::F16 => 6,
        DType::F32 => 7,
        DType::F64 => 8,
        DType::BF16 => 9,
        other => return Err(DeviceError::Unsupported(format!("NCCL has no {other}")).into()),
    })
}

/// A pre-multiplied sum's scalar in the element type, as NCCL reads it.
fn scalar_bytes(op: &RedOp, dtype: DType) -> [u8; 8] {
    let mut out = [0u8; 8];
    if let RedOp::PreMulSum(s) = op {
        let b: Vec<u8> = match dtype {
            DType::F16 => collectix_runtime::tensor::dtype::f16::from_f64(*s)
                .to_le_bytes()
                .to_vec(),
            DType::BF16 => collectix_runtime::tensor::dtype::bf16::from_f64(*s)
                .to_le_bytes()
                .to_vec(),
            DType::F32 => (*s as f32).to_le_bytes().to_vec(),
            _ => s.to_le_bytes().to_vec(),
        };
        out[..b.len()].copy_from_slice(&b);
    }
    out
}

impl Drop for Comm {
    fn drop(&mut self) {
        // SAFETY: `raw` is a live communicator, aborted once; the result is ignored (a
        // teardown never fails the program).
        let _ = unsafe { (self.nccl.comm_abort)(self.raw) };
    }
}
