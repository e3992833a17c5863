//! The Python package's sink for the progress of a vacuum or a compaction: a Python callable,
//! called as `callback(event, done, total, done_bytes, total_bytes)` with `event` one of
//! `"start"`, `"advance"`, `"finish"`. The work runs with the GIL released; the callable is
//! called with the GIL taken again, at `start` and `finish` always and for advances at most every
//! [`INTERVAL`], so a run of many small files does not take the GIL per file. A callable that
//! raises does not stop the work (its error is reported as unraisable: a vacuum or compaction
//! stopped halfway by its logging would leave more to clean up than it saves).

use pyo3::prelude::*;
use safetensors_spark_format::progress::Progress;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The least time between two advances passed to Python.
pub const INTERVAL: Duration = Duration::from_millis(500);

#[derive(Default)]
struct State {
    total: u64,
    total_bytes: u64,
    done: u64,
    done_bytes: u64,
    /// When the callable was last called.
    last: Option<Instant>,
}

/// A callable (or none: then nothing is done) and the counts so far.
pub struct PyProgress {
    callback: Option<Py<PyAny>>,
    state: Mutex<State>,
}

impl PyProgress {
    pub fn new(callback: Option<Py<PyAny>>) -> PyProgress {
        PyProgress {
            callback,
            state: Mutex::new(State::default()),
        }
    }

    /// Updates the counts with `update`; calls the callable when `always` or when [`INTERVAL`]
    /// has passed since its last call.
    fn tell(&self, event: &str, always: bool, update: impl FnOnce(&mut State)) {
        let Some(cb) = &self.callback else { return };
        let args = {
            let Ok(mut s) = self.state.lock() else { return };
            update(&mut s);
            let now = Instant::now();
            if !always && s.last.is_some_and(|t| now.duration_since(t) < INTERVAL) {
                return;
            }
            s.last = Some(now);
            (
                event.to_string(),
                s.done,
                s.total,
                s.done_bytes,
                s.total_bytes,
            )
        };
        Python::attach(|py| {
            if let Err(e) = cb.call1(py, args) {
                e.write_unraisable(py, None);
            }
        });
    }
}

impl Progress for PyProgress {
    fn start(&self, items: u64, bytes: u64) {
        self.tell("start", true, |s| {
            *s = State {
                total: items,
                total_bytes: bytes,
                ..State::default()
            }
        });
    }

    fn advance(&self, items: u64, bytes: u64) {
        self.tell("advance", false, |s| {
            s.done += items;
            s.done_bytes += bytes;
        });
    }

    fn finish(&self) {
        self.tell("finish", true, |_| {});
    }
}
