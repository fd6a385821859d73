//! This machine's identity, as events and producers name it.

use std::sync::Arc;

/// This host's name, from the kernel (`${HOSTNAME}` is a shell variable
/// that systemd does not export).
pub fn hostname() -> Arc<str> {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; the kernel NUL-terminates
    // names shorter than it.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "localhost".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).as_ref().into()
}

#[cfg(target_env = "gnu")]
/// Largest allocation glibc serves from its heap rather than with `mmap`:
/// above it (10 MB lines, large sink buffers), memory goes straight back to
/// the kernel when freed.
const MMAP_THRESHOLD: usize = 4 << 20;

/// Tells glibc's allocator to keep up to `retain` bytes of freed memory
/// instead of returning it to the kernel at once.
///
/// Read blocks (256 KiB) and event vectors are freed on the workers and
/// allocated again on the input thread a few microseconds later. With the
/// default, dynamic thresholds glibc trims the heap after nearly every
/// batch, and the next block faults its pages in again: 137 k page faults
/// per GiB, a third of the CPU of the raw rows. Side by side on single128 →
/// text file (BENCHMARKS.md, "Allocator"), keeping freed memory cut the CPU
/// per GB by a quarter to a third, the same as jemalloc or mimalloc did,
/// without their extra resident memory, so the system allocator stays.
/// The budget (`--memory-limit`) already bounds what is in flight; retaining
/// as much again at most keeps the resident size within twice the limit.
///
/// One arena: blocks allocated on the input thread and freed on a worker
/// otherwise leave free memory in several arenas, each kept up to the
/// threshold, and the resident size at full speed was 1.7x higher (85-90 MB
/// against 49 MB with two workers). Small allocations are served from each
/// thread's cache without the arena lock, and the CPU per GB did not change
/// measurably.
#[cfg(target_env = "gnu")]
pub fn tune_allocator(retain: usize) {
    // SAFETY: mallopt only sets allocator parameters; called once at start,
    // before the pipelines' threads exist.
    unsafe {
        libc::mallopt(
            libc::M_MMAP_THRESHOLD,
            i32::try_from(MMAP_THRESHOLD).unwrap_or(i32::MAX),
        );
        libc::mallopt(libc::M_ARENA_MAX, 1);
        libc::mallopt(
            libc::M_TRIM_THRESHOLD,
            i32::try_from(retain.max(MMAP_THRESHOLD)).unwrap_or(i32::MAX),
        );
    }
}

/// Other C libraries have their own policies (and no `mallopt`).
#[cfg(not(target_env = "gnu"))]
pub fn tune_allocator(_retain: usize) {}
