//! libnccl, loaded at run time with a search of our own, and the few functions collectix
//! calls. One of the audited `unsafe` modules: every call into the library is here.
//!
//! Why not cudarc's loader: it panics when the library is missing or a symbol is absent, and
//! its candidate names lack `libnccl.so.2`, the only name that runtime installs (Debian's
//! `libnccl2`, pip's `nvidia-nccl-cu13`) ship. Here a missing library or symbol is a
//! [`DeviceError`] that names what was tried. The search order is in `candidates`.

use collectix_runtime::{DeviceError, Error, Result};
use libloading::Library;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::path::{Path, PathBuf};
use std::sync::Arc;

mod comm;
mod enqueue;

pub(crate) use comm::{Comm, RedOp};
pub(crate) use enqueue::{DevMem, Enqueue};

/// `ncclComm_t`.
pub(crate) type RawComm = *mut c_void;
/// `cudaStream_t` / `CUstream`.
pub(crate) type RawStream = *mut c_void;

/// `ncclUniqueId`: 128 opaque bytes, passed by value to `ncclCommInitRank`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct UniqueId {
    pub(crate) internal: [c_char; 128],
}

/// `ncclSuccess`.
const SUCCESS: c_int = 0;
/// `ncclInProgress` (a nonblocking communicator's operation still under way).
pub(crate) const IN_PROGRESS: c_int = 7;
/// `ncclScalarHostImmediate`.
const SCALAR_HOST_IMMEDIATE: c_int = 1;

/// The head of `ncclConfig_t` as NCCL 2.14 defined it. NCCL copies `size` bytes of it over its
/// own defaults and reads only the fields the `version` had, so this stays valid for every
/// later NCCL (`parseCommConfig` in NCCL's init.cc).
#[repr(C)]
struct Config {
    size: usize,
    magic: u32,
    version: u32,
    blocking: c_int,
    cga_cluster_size: c_int,
}

/// `NCCL_CONFIG_INITIALIZER`'s magic.
const CONFIG_MAGIC: u32 = 0xcafe_beef;
/// `NCCL_VERSION(2, 14, 0)`: the first version with `blocking`.
const CONFIG_VERSION: u32 = 21_400;
/// `NCCL_CONFIG_UNDEF_INT`.
const UNDEF_INT: c_int = c_int::MIN;
/// How long the worker sleeps between polls of a communicator that is still initialising.
const SETTLE_POLL: std::time::Duration = std::time::Duration::from_micros(50);

type GetVersion = unsafe extern "C" fn(*mut c_int) -> c_int;
type GetUniqueId = unsafe extern "C" fn(*mut UniqueId) -> c_int;
type CommInitRankConfig =
    unsafe extern "C" fn(*mut RawComm, c_int, UniqueId, c_int, *mut Config) -> c_int;
type CommOnly = unsafe extern "C" fn(RawComm) -> c_int;
type CommGetAsyncError = unsafe extern "C" fn(RawComm, *mut c_int) -> c_int;
type GetErrorString = unsafe extern "C" fn(c_int) -> *const c_char;
type AllReduce = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    RawComm,
    RawStream,
) -> c_int;
/// `ncclBroadcast` has `ncclAllReduce`'s C signature (its `int` is the root, not the op).
type Broadcast = AllReduce;
type Reduce = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    c_int,
    RawComm,
    RawStream,
) -> c_int;
type AllGather =
    unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, RawComm, RawStream) -> c_int;
type SendFn = unsafe extern "C" fn(*const c_void, usize, c_int, c_int, RawComm, RawStream) -> c_int;
type RecvFn = unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, RawComm, RawStream) -> c_int;
type Group = unsafe extern "C" fn() -> c_int;
type PreMulSum = unsafe extern "C" fn(*mut c_int, *mut c_void, c_int, c_int, RawComm) -> c_int;
type RedOpDestroy = unsafe extern "C" fn(c_int, RawComm) -> c_int;

/// The loaded library and its functions.
pub struct Nccl {
    /// Where it was loaded from.
    path: String,
    get_version: GetVersion,
    get_unique_id: GetUniqueId,
    comm_init_rank: CommInitRankConfig,
    comm_abort: CommOnly,
    comm_get_async_error: CommGetAsyncError,
    get_error_string: GetErrorString,
    all_reduce: AllReduce,
    broadcast: Broadcast,
    reduce: Reduce,
    all_gather: AllGather,
    reduce_scatter: AllReduce,
    send: SendFn,
    recv: RecvFn,
    group_start: Group,
    group_end: Group,
    premul_sum: PreMulSum,
    red_op_destroy: RedOpDestroy,
    /// Keeps the functions above valid. Never unloaded: NCCL runs threads of its own (the
    /// bootstrap root that `ncclGetUniqueId` starts, a communicator's proxies) that can
    /// outlive the handle that started them, and unloading the code under them kills the
    /// process. Seen on a GPU machine: a segmentation fault when the last `Nccl` handle went
    /// while such a thread ran. torch never unloads it either.
    _lib: std::mem::ManuallyDrop<Library>,
}

impl std::fmt::Debug for Nccl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nccl").field("path", &self.path).finish()
    }
}

/// Python prefixes whose `site-packages` may hold pip's `nvidia/nccl/lib/libnccl.so.2`.
fn python_prefixes() -> Vec<PathBuf> {
    let mut prefixes = Vec::new();
    for var in ["VIRTUAL_ENV", "CONDA_PREFIX"] {
        if let Some(p) = std::env::var_os(var) {
            prefixes.push(PathBuf::from(p));
        }
    }
    // The environment that `python3` on PATH belongs to (bin/python3 -> its prefix).
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            if dir.join("python3").exists() {
                if let Some(prefix) = dir.parent() {
                    prefixes.push(prefix.to_path_buf());
                }
            }
        }
    }
    if let Some(home) = std::env::var_os("HOME") {
        prefixes.push(Path::new(&home).join(".local"));
    }
    prefixes.push(PathBuf::from("/usr/local"));
    prefixes.push(PathBuf::from("/usr"));
    prefixes.dedup();
    prefixes
}

/// Every file name or path tried, in order:
/// 1. `$COLLECTIX_NCCL_LIBRARY`, a path, when set;
/// 2. `libnccl.so.2` and `libnccl.so`, through the dynamic loader (`LD_LIBRARY_PATH`,
///    `ldconfig`'s cache, the system directories);
/// 3. pip's `nvidia-nccl-cu13`/`-cu12` wheels: `lib/python3.*/{site,dist}-packages/nvidia/nccl/lib/libnccl.so.2`
///    under `$VIRTUAL_ENV`, `$CONDA_PREFIX`, the prefix of each `python3` on `PATH`,
///    `~/.local`, `/usr/local` and `/usr`.
pub(crate) fn candidates() -> Vec<String> {
    let mut out = Vec::new();
    if let Some(p) = std::env::var_os("COLLECTIX_NCCL_LIBRARY") {
        out.push(p.to_string_lossy().into_owned());
    }
    out.push("libnccl.so.2".into());
    out.push("libnccl.so".into());
    for prefix in python_prefixes() {
        let Ok(entries) = std::fs::read_dir(prefix.join("lib")) else {
            continue;
        };
        let mut pythons: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("python3"))
            })
            .collect();
        pythons.sort();
        for py in pythons {
            for packages in ["site-packages", "dist-packages"] {
                let lib = py.join(packages).join("nvidia/nccl/lib/libnccl.so.2");
                if lib.exists() {
                    out.push(lib.to_string_lossy().into_owned());
                }
            }
        }
    }
    out.dedup();
    out
}

fn missing(tried: Vec<String>) -> Error {
    DeviceError::LibraryMissing {
        library: "nccl".into(),
        tried,
        hint: "install NCCL (Debian's libnccl2, or pip's nvidia-nccl-cu13), put its directory on LD_LIBRARY_PATH, or set COLLECTIX_NCCL_LIBRARY to the file".into(),
    }
    .into()
}

/// Looks a function up by name; a missing one is an error, never a panic.
fn symbol<T: Copy>(lib: &Library, name: &str) -> Result<T> {
    // SAFETY: `T` is the function-pointer type NCCL's header (nccl.h, 2.19 and later)
    // declares for `name`; the pointer stays valid while `lib` is loaded, and `Nccl` keeps
    // `lib` alive for as long as it keeps the pointer.
    let s = unsafe { lib.get::<T>(name.as_bytes()) };
    s.map(|s| *s).map_err(|_| {
        DeviceError::MissingSymbol {
            library: "nccl".into(),
            symbol: name.into(),
        }
        .into()
    })
}

impl Nccl {
    /// Loads libnccl from the first candidate that opens.
    pub fn load() -> Result<Arc<Nccl>> {
        let tried = candidates();
        for c in &tried {
            // SAFETY: loading libnccl runs its initialisers, which only set up NCCL's own
            // state; no other code of ours runs during the load.
            if let Ok(lib) = unsafe { Library::new(c) } {
                return Nccl::from_library(lib, c.clone()).map(Arc::new);
            }
        }
        Err(missing(tried))
    }

    fn from_library(lib: Library, path: String) -> Result<Nccl> {
        Ok(Nccl {
            path,
            get_version: symbol(&lib, "ncclGetVersion")?,
            get_unique_id: symbol(&lib, "ncclGetUniqueId")?,
            comm_init_rank: symbol(&lib, "ncclCommInitRankConfig")?,
            comm_abort: symbol(&lib, "ncclCommAbort")?,
            comm_get_async_error: symbol(&lib, "ncclCommGetAsyncError")?,
            get_error_string: symbol(&lib, "ncclGetErrorString")?,
            all_reduce: symbol(&lib, "ncclAllReduce")?,
            broadcast: symbol(&lib, "ncclBroadcast")?,
            reduce: symbol(&lib, "ncclReduce")?,
            all_gather: symbol(&lib, "ncclAllGather")?,
            reduce_scatter: symbol(&lib, "ncclReduceScatter")?,
            send: symbol(&lib, "ncclSend")?,
            recv: symbol(&lib, "ncclRecv")?,
            group_start: symbol(&lib, "ncclGroupStart")?,
            group_end: symbol(&lib, "ncclGroupEnd")?,
            premul_sum: symbol(&lib, "ncclRedOpCreatePreMulSum")?,
            red_op_destroy: symbol(&lib, "ncclRedOpDestroy")?,
            _lib: std::mem::ManuallyDrop::new(lib),
        })
    }

    /// Where the library was loaded from.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// NCCL's version code (major × 10000 + minor × 100 + patch).
    pub fn version(&self) -> Result<u32> {
        let mut v: c_int = 0;
        // SAFETY: writes one int through a valid pointer.
        let r = unsafe { (self.get_version)(&mut v) };
        self.check(r, "ncclGetVersion")?;
        Ok(v.max(0) as u32)
    }

    fn describe(&self, code: c_int) -> String {
        // SAFETY: ncclGetErrorString returns a static NUL-terminated string for any code.
        let p = unsafe { (self.get_error_string)(code) };
        if p.is_null() {
            return format!("code {code}");
        }
        // SAFETY: `p` is non-null and NUL-terminated (above), and static.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    /// `Ok` for `ncclSuccess`, the typed error otherwise.
    pub(crate) fn check(&self, code: c_int, call: &str) -> Result<()> {
        if code == SUCCESS {
            return Ok(());
        }
        Err(DeviceError::Nccl {
            call: call.into(),
            code: code.max(0) as u32,
            detail: self.describe(code),
        }
        .into())
    }

    /// A fresh unique id (rank 0 makes it; the others receive it).
    pub(crate) fn unique_id(&self) -> Result<[u8; 128]> {
        let mut id = UniqueId { internal: [0; 128] };
        // SAFETY: writes 128 bytes into `id`, which is that large.
        let r = unsafe { (self.get_unique_id)(&mut id) };
        self.check(r, "ncclGetUniqueId")?;
        Ok(id.internal.map(|c| c as u8))
    }

    /// A nonblocking communicator (`ncclCommInitRankConfig` with `blocking = 0`) on the
    /// current CUDA device: waits until all `size` ranks have joined, for at most `limit`;
    /// past it the communicator is aborted and the call fails (never a hang). Every later
    /// operation on it settles within `limit` too.
    pub(crate) fn init_rank(
        self: &Arc<Self>,
        size: usize,
        id: [u8; 128],
        rank: usize,
        limit: std::time::Duration,
    ) -> Result<Comm> {
        let mut raw: RawComm = std::ptr::null_mut();
        let id = UniqueId {
            internal: id.map(|b| b as c_char),
        };
        let (n, r) = (
            c_int::try_from(size).map_err(|_| Error::invalid("group too large for NCCL"))?,
            c_int::try_from(rank).map_err(|_| Error::invalid("rank too large for NCCL"))?,
        );
        let mut config = Config {
            size: std::mem::size_of::<Config>(),
            magic: CONFIG_MAGIC,
            version: CONFIG_VERSION,
            blocking: 0,
            cga_cluster_size: UNDEF_INT,
        };
        // SAFETY: `raw` and `config` are valid for the call (NCCL copies the config); `id` is
        // passed by value as nccl.h declares.
        let code = unsafe { (self.comm_init_rank)(&mut raw, n, id, r, &mut config) };
        let comm = (!raw.is_null()).then(|| Comm {
            raw,
            nccl: self.clone(),
            size,
            rank,
            limit,
        });
        if code != IN_PROGRESS {
            self.check(code, "ncclCommInitRankConfig")?;
        }
        // Dropping `comm` on any error below aborts it.
        let comm =
            comm.ok_or_else(|| Error::internal("ncclCommInitRankConfig gave no communicator"))?;
        comm.settle("ncclCommInitRankConfig")?;
        Ok(comm)
    }
}
