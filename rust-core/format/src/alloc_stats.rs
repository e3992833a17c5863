//! The library's heap, counted: every allocation of the engine (in the JVM's executors through
//! JNI, in Python through the extension, in the CLI) goes through [`CountingAllocator`], the
//! global allocator of any program that links this crate. It forwards to the system allocator and
//! keeps the bytes currently allocated ([`live_bytes`]) and the number of allocations made
//! ([`allocations`]), two relaxed atomic additions per call; the high-water mark
//! ([`peak_bytes`]) is tracked only between [`track_peak`]`(true)` and `(false)` (tests and
//! benchmarks), so the release build pays one more relaxed load. Exposed to the JVM as
//! `NativeLib.nativeLiveBytes()` and to Python as `safetensors_spark._native.live_bytes()`: a soak
//! that writes and reads for hours shows whether native memory stays flat (spec/jni.md §7).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

/// The system allocator, counted.
pub struct CountingAllocator;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
static COUNT: AtomicU64 = AtomicU64::new(0);
static TRACK_PEAK: AtomicBool = AtomicBool::new(false);

fn grew(by: usize) {
    let now = LIVE.fetch_add(by, Ordering::Relaxed) + by;
    if TRACK_PEAK.load(Ordering::Relaxed) {
        PEAK.fetch_max(now, Ordering::Relaxed);
    }
}

fn shrank(by: usize) {
    LIVE.fetch_sub(by, Ordering::Relaxed);
}

// SAFETY: forwards every call to the system allocator unchanged; only counts bytes.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as the caller's.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            COUNT.fetch_add(1, Ordering::Relaxed);
            grew(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as the caller's.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            COUNT.fetch_add(1, Ordering::Relaxed);
            grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) };
        shrank(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: same contract as the caller's.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            if new_size >= layout.size() {
                grew(new_size - layout.size());
            } else {
                shrank(layout.size() - new_size);
            }
        }
        p
    }
}

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

/// Bytes the engine has allocated and not freed.
pub fn live_bytes() -> usize {
    LIVE.load(Ordering::Relaxed)
}

/// Allocations made since the program started.
pub fn allocations() -> u64 {
    COUNT.load(Ordering::Relaxed)
}

/// The most bytes live at once since peak tracking was last turned on (0 when it never was).
pub fn peak_bytes() -> usize {
    PEAK.load(Ordering::Relaxed)
}

/// Turns high-water-mark tracking on (resetting the mark to the bytes live now) or off.
pub fn track_peak(on: bool) {
    if on {
        PEAK.store(live_bytes(), Ordering::Relaxed);
    }
    TRACK_PEAK.store(on, Ordering::Relaxed);
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn counts_what_is_allocated_and_freed() {
        track_peak(true);
        let before = allocations();
        let v: Vec<u8> = Vec::with_capacity(8 << 20);
        // other tests run concurrently: only this allocation is known to be live here
        assert!(live_bytes() >= 8 << 20);
        assert!(peak_bytes() >= 8 << 20);
        assert!(allocations() > before);
        drop(v);
        track_peak(false);
    }
}
