//! Progress of long work (a report over a lake, a dataset's validation, a vacuum, a compaction):
//! the work says how much there is and how much is done; a front-end decides whether and how to
//! show it (the CLI draws a bar on a terminal, the Python package logs). The work never
//! formats, draws or throttles anything itself, and behaves the same with any observer.
//!
//! An observer is told [`Progress::start`] once with the totals, [`Progress::advance`] as items
//! are done (the advances of a run that completes add up exactly to the totals), and
//! [`Progress::finish`] once at the end, also after an error. Calls may come from several
//! threads (a report runs `--jobs` threads), so the methods take `&self`.

use std::sync::atomic::{AtomicU64, Ordering};

/// An observer of long work. Every method does nothing by default.
pub trait Progress: Sync {
    /// The work is about to begin: `items` (files or shards) holding `bytes` bytes in all.
    fn start(&self, items: u64, bytes: u64) {
        let _ = (items, bytes);
    }

    /// `items` more are done, holding `bytes` bytes.
    fn advance(&self, items: u64, bytes: u64) {
        let _ = (items, bytes);
    }

    /// The work has ended (done, or stopped by an error).
    fn finish(&self) {}
}

/// The observer that ignores everything: what library calls without a front-end pass.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoProgress;

impl Progress for NoProgress {}

/// An observer that adds everything up (tests, and a front-end that polls): the totals of the
/// last `start`, the sums of the advances since, and how many times each method was called.
#[derive(Debug, Default)]
pub struct Counts {
    pub total_items: AtomicU64,
    pub total_bytes: AtomicU64,
    pub done_items: AtomicU64,
    pub done_bytes: AtomicU64,
    pub starts: AtomicU64,
    pub advances: AtomicU64,
    pub finishes: AtomicU64,
}

impl Counts {
    /// `(total_items, total_bytes, done_items, done_bytes)`.
    pub fn totals_and_done(&self) -> (u64, u64, u64, u64) {
        (
            self.total_items.load(Ordering::SeqCst),
            self.total_bytes.load(Ordering::SeqCst),
            self.done_items.load(Ordering::SeqCst),
            self.done_bytes.load(Ordering::SeqCst),
        )
    }

    /// `(starts, advances, finishes)`: how many times each method was called.
    pub fn calls(&self) -> (u64, u64, u64) {
        (
            self.starts.load(Ordering::SeqCst),
            self.advances.load(Ordering::SeqCst),
            self.finishes.load(Ordering::SeqCst),
        )
    }
}

impl Progress for Counts {
    fn start(&self, items: u64, bytes: u64) {
        self.total_items.store(items, Ordering::SeqCst);
        self.total_bytes.store(bytes, Ordering::SeqCst);
        self.done_items.store(0, Ordering::SeqCst);
        self.done_bytes.store(0, Ordering::SeqCst);
        self.starts.fetch_add(1, Ordering::SeqCst);
    }

    fn advance(&self, items: u64, bytes: u64) {
        self.done_items.fetch_add(items, Ordering::SeqCst);
        self.done_bytes.fetch_add(bytes, Ordering::SeqCst);
        self.advances.fetch_add(1, Ordering::SeqCst);
    }

    fn finish(&self) {
        self.finishes.fetch_add(1, Ordering::SeqCst);
    }
}

/// Calls [`Progress::finish`] when dropped: a run that returns early on an error still ends its
/// observer.
pub struct FinishOnDrop<'a>(pub &'a dyn Progress);

impl Drop for FinishOnDrop<'_> {
    fn drop(&mut self) {
        self.0.finish();
    }
}
