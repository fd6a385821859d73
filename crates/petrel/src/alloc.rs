//! The agent's allocator: the system allocator, plus a per-thread count of
//! the bytes a piece of code allocates while it is measured.
//!
//! A VRL program's working values live outside the pipeline's memory
//! budget: a program that doubles an array a few times per event took an
//! agent with a 16 MiB limit to 680 MB. The `remap` processor measures
//! each run ([`measure`]) and interrupts it between two expressions once
//! it holds more than its limit (VRL's cooperative `ExecutionControl`).
//! Counting costs a thread-local flag test per allocation while nothing is
//! measured, and two more thread-local updates while something is.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// The system allocator with per-thread measuring.
pub struct Counting;

thread_local! {
    /// A measurement is running on this thread.
    static ACTIVE: Cell<bool> = const { Cell::new(false) };
    /// Bytes allocated less bytes freed since the measurement began.
    static LIVE: Cell<i64> = const { Cell::new(0) };
}

#[inline]
fn count(delta: i64) {
    // `try_with`: a thread being torn down has no locals left, and its
    // allocations are not measured.
    let _ = ACTIVE.try_with(|a| {
        if a.get() {
            let _ = LIVE.try_with(|l| l.set(l.get() + delta));
        }
    });
}

// SAFETY: every call is passed to `System` unchanged; counting touches
// only `Cell`s of the calling thread and never allocates.
unsafe impl GlobalAlloc for Counting {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size() as i64);
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.alloc(layout) }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout.size() as i64);
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.alloc_zeroed(layout) }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count(-(layout.size() as i64));
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.dealloc(ptr, layout) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size as i64 - layout.size() as i64);
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// A running measurement of this thread's allocations; ends when dropped.
pub struct Measure {
    was_active: bool,
    was_live: i64,
}

/// Starts measuring what this thread allocates (nested measurements are
/// not supported: an inner one restarts the count and the outer one goes
/// on from there when it ends).
pub fn measure() -> Measure {
    let was_active = ACTIVE.with(|a| a.replace(true));
    let was_live = LIVE.with(|l| l.replace(0));
    Measure {
        was_active,
        was_live,
    }
}

impl Measure {
    /// Bytes allocated and not freed since the measurement began (0 when
    /// the process does not run with [`Counting`] as its allocator).
    #[inline]
    pub fn live(&self) -> i64 {
        LIVE.with(Cell::get)
    }
}

impl Drop for Measure {
    fn drop(&mut self) {
        ACTIVE.with(|a| a.set(self.was_active));
        LIVE.with(|l| l.set(self.was_live + l.get()));
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_measurement_counts_what_stays_allocated() {
        let m = super::measure();
        // black_box: an allocation nothing reads may be elided by the
        // optimizer (it was, in one `ci` build), leaving nothing to count.
        let v: Vec<u8> = std::hint::black_box(Vec::with_capacity(1 << 20));
        assert!(m.live() >= 1 << 20, "{}", m.live());
        drop(v);
        assert!(m.live() < 1 << 10, "{}", m.live());
    }
}
