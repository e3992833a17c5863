//! The progress bar of the long commands (`report`, `validate`, `vacuum`, `compact`): an
//! indicatif bar on stderr, drawn only when stderr is a terminal and `--quiet` is not given, so
//! a pipe, a file or a CI log never holds progress bytes, and stdout (JSON, the table, the
//! verdict lines) never does. The work itself tells how far it is through the format crate's
//! [`Progress`] observer; this is the CLI's sink for it.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use safetensors_spark_format::progress::Progress;
use std::io::IsTerminal;
use std::sync::{Mutex, OnceLock};

/// Takes `--quiet` out of the arguments of a command whose options take no values (`validate`):
/// `(quiet, the rest)`.
pub fn take_quiet(args: &[String]) -> (bool, Vec<String>) {
    let quiet = args.iter().any(|a| a == "--quiet");
    (
        quiet,
        args.iter().filter(|a| *a != "--quiet").cloned().collect(),
    )
}

/// One command's bar: created at [`Progress::start`] (none for no work, none when stderr is not
/// a terminal or with `--quiet`: indicatif's stderr target would draw nothing off a terminal
/// either, the check here keeps the bar from being made at all), advanced by items (files or
/// shards) and bytes, left on its last frame at [`Progress::finish`]. The bar's position counts
/// bytes (for the rate and the time left) when the work has a byte total, else items; the
/// message says `done/total unit`.
pub struct Bar {
    prefix: String,
    unit: &'static str,
    enabled: bool,
    bar: OnceLock<ProgressBar>,
    /// Items done, items in all, whether the position counts bytes: updated together with the
    /// bar, so threads advancing at once never draw a count going back.
    counts: Mutex<(u64, u64, bool)>,
}

impl Bar {
    /// A bar named `prefix` counting `unit` (e.g. "files"); drawn only when stderr is a
    /// terminal and not `quiet`.
    pub fn new(prefix: &str, unit: &'static str, quiet: bool) -> Bar {
        Bar {
            prefix: prefix.to_string(),
            unit,
            enabled: !quiet && std::io::stderr().is_terminal(),
            bar: OnceLock::new(),
            counts: Mutex::new((0, 0, false)),
        }
    }

    /// Runs `f` (which prints on stdout) with the bar hidden, so a line printed while the work
    /// goes on is not drawn over.
    pub fn suspend<R>(&self, f: impl FnOnce() -> R) -> R {
        match self.bar.get() {
            Some(b) => b.suspend(f),
            None => f(),
        }
    }
}

impl Progress for Bar {
    fn start(&self, items: u64, bytes: u64) {
        if !self.enabled || items == 0 {
            return;
        }
        let by_bytes = bytes > 0;
        let template = if by_bytes {
            "{prefix}: {msg} [{bar:20}] {binary_bytes}/{binary_total_bytes} \
             {binary_bytes_per_sec}, {eta} left"
        } else {
            "{prefix}: {msg} [{bar:20}] {per_sec}, {eta} left"
        };
        let style = ProgressStyle::with_template(template)
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
        let Ok(mut counts) = self.counts.lock() else {
            return;
        };
        *counts = (0, items, by_bytes);
        let bar = ProgressBar::with_draw_target(
            Some(if by_bytes { bytes } else { items }),
            ProgressDrawTarget::stderr(),
        )
        .with_style(style)
        .with_prefix(self.prefix.clone())
        .with_message(format!("0/{items} {}", self.unit));
        // a second start (none of the commands makes one) keeps the first bar
        if self.bar.set(bar).is_ok() {
            if let Some(b) = self.bar.get() {
                b.tick();
            }
        }
    }

    fn advance(&self, items: u64, bytes: u64) {
        let Some(b) = self.bar.get() else { return };
        let Ok(mut counts) = self.counts.lock() else {
            return;
        };
        counts.0 += items;
        b.set_message(format!("{}/{} {}", counts.0, counts.1, self.unit));
        b.inc(if counts.2 { bytes } else { items });
    }

    fn finish(&self) {
        if let Some(b) = self.bar.get() {
            b.finish();
        }
    }
}
