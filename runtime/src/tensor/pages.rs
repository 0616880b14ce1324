//! Large host buffers on huge pages.
//!
//! A buffer of [`HUGE_MIN`] bytes or more that collectix allocates (the pool's buffers,
//! hence received payloads, reduction results and outputs; tensors made by
//! [`Tensor::zeros`](crate::tensor::Tensor::zeros), [`full`](crate::tensor::Tensor::full) and
//! [`from_slice`](crate::tensor::Tensor::from_slice)) is advised as transparent huge pages
//! (`madvise(MADV_HUGEPAGE)`) before it is first touched, as numpy does for its arrays from
//! the same size. Where the kernel's setting is `madvise` (the usual default), a 64 MiB
//! buffer is then 32 pages of 2 MiB instead of 16 384 of 4 KiB: fewer faults when it is
//! filled, fewer TLB misses while it is copied (on a virtual machine each miss walks two page
//! tables), and `process_vm_readv` pins a few large pages instead of thousands of small ones.
//! Measured on this project's VM (`docs/performance.md`, "Huge pages"): memcpy of 64 MiB
//! 15 % faster, `process_vm_readv` of 64 MiB twice as fast.
//!
//! The advice is a hint: where the kernel has no transparent huge pages, or they are
//! `never`, or the platform is not Linux (or Miri), the buffer is an ordinary vector. The one
//! `unsafe` call is here.
#![allow(unsafe_code)]

/// Buffers from this many bytes up are advised huge (numpy's threshold, 4 MiB).
pub const HUGE_MIN: usize = 4 << 20;

/// The huge page size advised for (x86-64 and most of aarch64's kernels).
const HUGE_PAGE: usize = 2 << 20;

/// An empty vector with room for `n` elements, its memory advised huge when it is large.
fn with_capacity<T>(n: usize) -> Vec<T> {
    let mut v: Vec<T> = Vec::with_capacity(n);
    let bytes = v.capacity().saturating_mul(std::mem::size_of::<T>());
    if bytes >= HUGE_MIN {
        advise_huge(v.as_mut_ptr() as usize, bytes);
    }
    v
}

/// A vector of `n` copies of `value`, on huge pages when it is large.
pub fn filled<T: Copy>(n: usize, value: T) -> Vec<T> {
    if n.saturating_mul(std::mem::size_of::<T>()) < HUGE_MIN {
        // Zeros come from `calloc`'s untouched pages here.
        return vec![value; n];
    }
    let mut v = with_capacity(n);
    v.resize(n, value);
    v
}

/// A copy of `s`, on huge pages when it is large.
pub fn copied<T: Copy>(s: &[T]) -> Vec<T> {
    let mut v = with_capacity(s.len());
    v.extend_from_slice(s);
    v
}

/// Advises the whole huge pages inside `[addr, addr + len)` as huge.
#[cfg(all(target_os = "linux", not(miri)))]
fn advise_huge(addr: usize, len: usize) {
    let start = addr.next_multiple_of(HUGE_PAGE);
    let end = addr.saturating_add(len) / HUGE_PAGE * HUGE_PAGE;
    if end <= start {
        return;
    }
    // SAFETY: `[start, end)` lies inside an allocation this function's caller owns (a vector's
    // capacity) and is page-aligned. MADV_HUGEPAGE only marks the mapping so that the kernel
    // may back it with huge pages; it neither reads nor changes any byte, nor unmaps anything.
    // A failure (a kernel without transparent huge pages) leaves the memory as it was.
    let _ = unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
}

#[cfg(not(all(target_os = "linux", not(miri))))]
fn advise_huge(_addr: usize, _len: usize) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_and_small_vectors_hold_what_they_were_given() {
        let big = filled(HUGE_MIN / 4 + 3, 7u32);
        assert_eq!(big.len(), HUGE_MIN / 4 + 3);
        assert!(big.iter().all(|&x| x == 7));
        let small = filled(5, true);
        assert_eq!(small, vec![true; 5]);
        let src: Vec<u16> = (0..(HUGE_MIN / 2) as u32).map(|i| i as u16).collect();
        assert_eq!(copied(&src), src);
        assert!(copied::<u8>(&[]).is_empty());
    }

    /// The big vector's memory is marked huge (Linux with transparent huge pages on
    /// `madvise` or `always`; the test says SKIPPED elsewhere, since the kernel decides).
    #[cfg(all(target_os = "linux", not(miri)))]
    #[test]
    fn a_large_vector_is_advised_huge() {
        let setting = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .unwrap_or_default();
        if !setting.contains("[madvise]") && !setting.contains("[always]") {
            eprintln!("SKIPPED: transparent huge pages are {setting:?} on this kernel");
            return;
        }
        let v = filled(4 * HUGE_MIN / 8, 1u64);
        let at = v.as_ptr() as usize;
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap_or_default();
        // The mapping that holds the vector, and its flags ("hg": advised huge).
        let mut inside = false;
        let mut flags = None;
        for line in smaps.lines() {
            if let Some((range, _)) = line.split_once(' ') {
                if let Some((a, b)) = range.split_once('-') {
                    if let (Ok(a), Ok(b)) =
                        (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
                    {
                        inside = (a..b).contains(&(at + HUGE_PAGE * 2));
                        continue;
                    }
                }
            }
            if inside && line.starts_with("VmFlags:") {
                flags = Some(line.to_string());
                break;
            }
        }
        let flags = flags.unwrap_or_default();
        assert!(flags.contains(" hg"), "not advised huge: {flags:?}");
    }
}
