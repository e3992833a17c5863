"""Progress of long work — ``vacuum``, ``compact``, ``open_dataset``'s header checks and checksum
verification — as ``logging`` records (spec/python.md §1.1): logger ``safetensors_spark.progress``,
level INFO. Off by default: a library call logs nothing unless the application enables INFO for
that logger (or an ancestor), e.g. ``logging.basicConfig(level=logging.INFO)``. No tqdm: a bar
drawn by a library into a training job's stderr is noise; an application that wants one can
turn these records into one.

A record at most every 0.5 s while the work goes on, and one at its start and end; each carries
``progress_task``, ``progress_event`` (``"start"``, ``"advance"``, ``"finish"``),
``progress_done``, ``progress_total``, ``progress_bytes``, ``progress_total_bytes`` as attributes.
The Rust side (vacuum, compact) calls back through :meth:`Reporter.__call__`, throttled there
too, so the GIL is not taken per file."""

import logging
import time

logger = logging.getLogger("safetensors_spark.progress")

#: The least time between two ``advance`` records.
INTERVAL = 0.5


def _bytes(n):
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.0f} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


class Reporter:
    """The progress of one task (``"vacuum /data/ds"``) counted in ``unit`` (``"files
    deleted"``): ``start(total, total_bytes)``, ``advance(items, bytes)``, ``finish()``, or
    called as the native extension's callback."""

    def __init__(self, task, unit):
        self.task, self.unit = task, unit
        self.total = self.total_bytes = self.done = self.done_bytes = 0
        self._began = self._last = time.monotonic()

    def start(self, total, total_bytes=0):
        self.total, self.total_bytes, self.done, self.done_bytes = total, total_bytes, 0, 0
        self._began = time.monotonic()
        self._log("start")

    def advance(self, items=1, nbytes=0):
        self.done += items
        self.done_bytes += nbytes
        if time.monotonic() - self._last >= INTERVAL:
            self._log("advance")

    def finish(self):
        self._log("finish")

    def __call__(self, event, done, total, done_bytes, total_bytes):
        """The native callback: the counts so far (the Rust side throttles its advances)."""
        if event == "start":
            self._began = time.monotonic()
        self.done, self.total, self.done_bytes, self.total_bytes = done, total, done_bytes, total_bytes
        self._log(event)

    def _log(self, event):
        now = time.monotonic()
        self._last = now
        text = f"{self.task}: {self.done}/{self.total} {self.unit}"
        if self.total_bytes:
            text += f", {_bytes(self.done_bytes)} of {_bytes(self.total_bytes)}"
        elapsed = now - self._began
        if event == "finish":
            text += f", done in {elapsed:.1f} s"
        elif self.done and elapsed > 0:
            rate = self.done / elapsed
            left = (self.total - self.done) / rate if rate else 0.0
            per = f"{_bytes(self.done_bytes / elapsed)}/s" if self.total_bytes else f"{rate:.1f} {self.unit}/s"
            text += f", {per}, {left:.0f} s left"
        logger.info(text, extra={"progress_task": self.task, "progress_event": event,
                                 "progress_done": self.done, "progress_total": self.total,
                                 "progress_bytes": self.done_bytes,
                                 "progress_total_bytes": self.total_bytes})


class _Silent:
    """What :func:`reporter` returns when progress is not logged: does nothing."""

    def start(self, total, total_bytes=0):
        pass

    def advance(self, items=1, nbytes=0):
        pass

    def finish(self):
        pass


def reporter(task, unit):
    """A :class:`Reporter` when INFO is enabled for the progress logger, else a silent one
    (checked once, when the work begins)."""
    return Reporter(task, unit) if logger.isEnabledFor(logging.INFO) else _Silent()


def native_callback(task, unit):
    """The callback for a native call (``_native.vacuum(..., progress=)``): None when progress is
    not logged, so the extension does not call into Python at all."""
    return Reporter(task, unit) if logger.isEnabledFor(logging.INFO) else None
