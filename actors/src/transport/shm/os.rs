//! The shared-memory transport's calls into the OS: a sealed memfd mapped shared
//! ([`create`], [`map`]), and a futex on a word of it ([`wait`], [`wake`]). This module and
//! the runtime's `wire::shm::region` hold all of the transport's `unsafe` code; every block
//! says why it is sound. (Miri cannot run these calls; the region and the rings above them run
//! under Miri in the runtime's tests.)
//!
//! A segment is a memfd: it has no name in `/dev/shm` or anywhere else, so nothing is left
//! behind whichever process dies; its memory goes when the last process that maps it ends.
//! Its size is sealed (`F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL`) before it is passed on, and
//! a process maps a peer's memfd only once it has checked those seals: a peer cannot shrink a
//! segment under a mapping (which would make reads past the new end fault with `SIGBUS`).

#![allow(unsafe_code)]

use collectix_runtime::tensor::shared_heap::SharedHeap;
use collectix_runtime::wire::shm::region::{Backing, Region, REGION_ALIGN};
use nix::fcntl::{fcntl, FcntlArg, SealFlag};
use nix::sys::memfd::{memfd_create, MFdFlags};
use nix::sys::mman::{mmap, munmap, MapFlags, ProtFlags};
use std::ffi::c_void;
use std::num::NonZeroUsize;
use std::os::fd::{AsFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::AtomicU32;
use std::sync::Arc;
use std::time::Duration;

/// The seals a segment must carry before a process maps it.
fn seals() -> SealFlag {
    SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SEAL
}

/// A shared mapping, unmapped when dropped.
struct Mapping {
    ptr: NonNull<c_void>,
    len: usize,
}

// SAFETY: a mapping is an address range; unmapping it from any thread is allowed.
unsafe impl Send for Mapping {}
// SAFETY: `Mapping` has no methods but its drop.
unsafe impl Sync for Mapping {}
impl Backing for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly what `mmap` returned; the region that pointed into
        // the mapping owns this backing and is being dropped, so nothing uses it any more.
        if let Err(e) = unsafe { munmap(self.ptr, self.len) } {
            tracing::warn!(error = %e, "munmap of a shared-memory segment failed");
        }
    }
}

fn io(e: nix::errno::Errno) -> std::io::Error {
    std::io::Error::from(e)
}

/// Maps `len` bytes of `fd` shared, with `prot`, as a mapping unmapped when dropped; it is
/// page-aligned (checked).
fn mapping(fd: &OwnedFd, len: usize, prot: ProtFlags) -> std::io::Result<Mapping> {
    let size = NonZeroUsize::new(len).ok_or_else(|| std::io::Error::other("an empty mapping"))?;
    // SAFETY: a fresh shared mapping chosen by the kernel (no fixed address, so no existing
    // memory is replaced); the callers map at most the memfd's size, which its seals fix.
    let ptr = unsafe { mmap(None, size, prot, MapFlags::MAP_SHARED, fd.as_fd(), 0) }.map_err(io)?;
    let m = Mapping { ptr, len };
    if !(ptr.as_ptr() as usize).is_multiple_of(REGION_ALIGN) {
        return Err(std::io::Error::other("a mapping that is not page-aligned"));
    }
    Ok(m)
}

/// Maps `len` bytes of `fd` shared, read and write.
fn map_fd(fd: &OwnedFd, len: usize) -> std::io::Result<Region> {
    let backing = mapping(fd, len, ProtFlags::PROT_READ | ProtFlags::PROT_WRITE)?;
    let ptr = backing.ptr;
    // SAFETY: the mapping is `len` bytes, readable and writable, page-aligned (so 64-aligned,
    // checked above), and lives as long as `backing`, which the region owns; nothing in this
    // process forms references to its bytes (the region's accessors only copy and use
    // atomics).
    Ok(unsafe { Region::from_raw(ptr.cast::<u8>(), len, Box::new(backing)) })
}

/// A new segment of `len` bytes (zeroed), sealed, mapped: its memfd (to pass to the peers)
/// and this process's mapping.
pub(crate) fn create(len: usize) -> std::io::Result<(OwnedFd, Region)> {
    let fd = memfd_create(
        c"collectix-shm",
        MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING,
    )
    .map_err(io)?;
    let size = i64::try_from(len).map_err(|_| std::io::Error::other("a segment too large"))?;
    nix::unistd::ftruncate(&fd, size).map_err(io)?;
    fcntl(&fd, FcntlArg::F_ADD_SEALS(seals())).map_err(io)?;
    let region = map_fd(&fd, len)?;
    Ok((fd, region))
}

/// Maps a peer's segment: refused unless its size is sealed; `len` is the memfd's size.
pub(crate) fn map(fd: &OwnedFd) -> std::io::Result<Region> {
    let got = fcntl(fd, FcntlArg::F_GET_SEALS).map_err(io)?;
    let got = SealFlag::from_bits_truncate(got);
    if !got.contains(seals()) {
        return Err(std::io::Error::other(
            "a peer's segment whose size is not sealed",
        ));
    }
    let st = nix::sys::stat::fstat(fd).map_err(io)?;
    let len = usize::try_from(st.st_size)
        .map_err(|_| std::io::Error::other("a segment with a negative size"))?;
    map_fd(fd, len)
}

/// The seals a shared heap must carry before a peer maps it: its size fixed, and no new
/// writable mapping (its owner's, made before, is the only one that writes it).
fn heap_seals() -> SealFlag {
    SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_FUTURE_WRITE
}

/// A new shared heap of `len` bytes (zeroed, sparse: a page costs memory once written),
/// mapped writable here and then sealed so that no other mapping of it can write: its memfd
/// (to pass to the peers) and the heap.
pub(crate) fn create_heap(len: usize) -> std::io::Result<(OwnedFd, Arc<SharedHeap>)> {
    let fd = memfd_create(
        c"collectix-heap",
        MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING,
    )
    .map_err(io)?;
    let size = i64::try_from(len).map_err(|_| std::io::Error::other("a heap too large"))?;
    nix::unistd::ftruncate(&fd, size).map_err(io)?;
    let backing = mapping(&fd, len, ProtFlags::PROT_READ | ProtFlags::PROT_WRITE)?;
    let ptr = backing.ptr;
    fcntl(&fd, FcntlArg::F_ADD_SEALS(heap_seals())).map_err(io)?;
    // SAFETY: the mapping is `len` bytes, readable and writable, page-aligned (so 8-aligned),
    // lives as long as `backing`, which the heap owns, and nothing else in this process
    // writes it; no other process can write it (sealed against new writable mappings).
    let heap = unsafe { SharedHeap::from_raw(ptr.cast::<u8>(), len, Box::new(backing)) };
    Ok((fd, heap))
}

/// Maps a peer's shared heap read-only: refused unless it is sealed as [`create_heap`]
/// seals it (its size fixed, so a read within it never faults).
pub(crate) fn map_heap(fd: &OwnedFd) -> std::io::Result<Region> {
    let got = SealFlag::from_bits_truncate(fcntl(fd, FcntlArg::F_GET_SEALS).map_err(io)?);
    if !got.contains(heap_seals()) {
        return Err(std::io::Error::other("a peer's heap that is not sealed"));
    }
    let st = nix::sys::stat::fstat(fd).map_err(io)?;
    let len = usize::try_from(st.st_size)
        .map_err(|_| std::io::Error::other("a heap with a negative size"))?;
    let backing = mapping(fd, len, ProtFlags::PROT_READ)?;
    let ptr = backing.ptr;
    // SAFETY: the mapping is `len` bytes, readable, page-aligned, and lives as long as
    // `backing`, which the region owns. It is not writable: the region is only ever read
    // (`PeerHeap` exposes nothing else), and its owner's writes are only to blocks no
    // message lends (see `collectix_runtime::tensor::shared_heap`).
    Ok(unsafe { Region::from_raw(ptr.cast::<u8>(), len, Box::new(backing)) })
}

/// Parks the calling thread while `word` holds `expect`, for at most `timeout` (a futex wait
/// on shared memory: any process that maps it may wake the thread). Returns at once if the
/// word differs; may return early (spuriously), as any futex wait.
pub(crate) fn wait(word: &AtomicU32, expect: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: libc::c_long::from(timeout.subsec_nanos() as i32),
    };
    // SAFETY: `word` is a valid, aligned `u32` for the call's duration (a reference); the
    // kernel only reads it; `ts` outlives the call. FUTEX_WAIT (not private: the word is in a
    // shared mapping) has no other memory effects.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expect,
            &ts as *const libc::timespec,
        );
    }
}

/// Wakes every thread parked on `word` (in any process).
pub(crate) fn wake(word: &AtomicU32) {
    // SAFETY: `word` is a valid, aligned `u32`; FUTEX_WAKE only wakes waiters on its address.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX);
    }
}

/// Takes ownership of a descriptor just received with `SCM_RIGHTS`.
pub(crate) fn owned(raw: std::os::fd::RawFd) -> OwnedFd {
    use std::os::fd::FromRawFd;
    // SAFETY: the kernel installed `raw` in this process for this message alone (a received
    // SCM_RIGHTS descriptor); nothing else owns or closes it.
    unsafe { OwnedFd::from_raw_fd(raw) }
}

/// A peer process whose memory this process reads (remote records: the receiver's single
/// copy, `process_vm_readv`).
pub(crate) struct Remote {
    /// The peer's pid, as the kernel gave it at setup (`SO_PEERCRED`).
    pub(crate) pid: i32,
}

impl collectix_runtime::wire::shm::RemoteRead for Remote {
    fn read(&self, addr: u64, dst: &mut [u8]) -> Result<(), String> {
        let mut at = 0usize;
        while at < dst.len() {
            let from = addr
                .checked_add(at as u64)
                .ok_or("an address past the end of memory")?;
            // In steps of at most 4 MiB: one call over tens of MiB pins all its pages at
            // once and ran at half the speed here (3.3 against 6.8 GB/s, 64 MiB).
            let end = dst.len().min(at + (4 << 20));
            let rest = &mut dst[at..end];
            let local = libc::iovec {
                iov_base: rest.as_mut_ptr().cast(),
                iov_len: rest.len(),
            };
            let remote = libc::iovec {
                iov_base: from as usize as *mut libc::c_void,
                iov_len: rest.len(),
            };
            // SAFETY: `local` describes `rest`, memory of this process that this function
            // borrows mutably for the call (the kernel writes at most `iov_len` bytes into
            // it); `remote` names memory of the other process, which the kernel checks (a bad
            // address is an error, never an access here). No other memory is touched.
            let n = unsafe { libc::process_vm_readv(self.pid, &local, 1, &remote, 1, 0) };
            if n < 0 {
                return Err(format!(
                    "reading rank memory of pid {}: {}",
                    self.pid,
                    std::io::Error::last_os_error()
                ));
            }
            if n == 0 {
                return Err(format!("pid {} gave no bytes at {from:#x}", self.pid));
            }
            at += n as usize;
        }
        Ok(())
    }
}

/// The value at [`probe_addr`]: a peer that reads it from this process can read its memory.
pub(crate) const PROBE: u64 = u64::from_le_bytes(*b"cx-probe");
static PROBE_WORD: u64 = PROBE;

/// Where this process keeps [`PROBE`] (sent to the peers in the setup's hello).
pub(crate) fn probe_addr() -> u64 {
    &PROBE_WORD as *const u64 as usize as u64
}
