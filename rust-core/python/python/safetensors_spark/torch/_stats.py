"""``loader().stats()``: whether data is the bottleneck of a training loop (spec/python.md §3.1.2).

The training process times each ``next()`` of the loader's iterator (the time the loop waited
for a batch, and the CPU the loader spent in this process) and counts batches and bytes; each
worker adds the time it spent making its messages and its remote reads to its row of a small
shared array (workers × ``WORKER_FIELDS``, float64). A snapshot adds them up; the cost is two
clock reads and a few additions per batch, and an array row written per worker message."""

from __future__ import annotations

import logging
import time

import torch

from .._storage import IO_FIELDS

WORKER_FIELDS = ("busy_s", "items") + IO_FIELDS

LOG = logging.getLogger("safetensors_spark.loader")


def worker_counters(workers):
    """The shared array a loader's workers write their counters into."""
    return torch.zeros((workers, len(WORKER_FIELDS)), dtype=torch.float64).share_memory_()


def timed(items, counters, worker, datasets):
    """A worker's items (messages or batches), with the time spent making each and this process's
    remote reads of ``datasets`` written to row ``worker`` of ``counters`` after each."""
    row = counters[worker].numpy()
    it = iter(items)
    while True:
        t0 = time.perf_counter()
        try:
            item = next(it)
        except StopIteration:
            return
        row[0] += time.perf_counter() - t0
        row[1] += 1
        io = _io(datasets)  # this worker's, since it started
        for k, field in enumerate(IO_FIELDS, 2):
            row[k] = io[field]
        yield item


def batch_bytes(batch):
    n = 0
    for v in batch.values():
        if isinstance(v, torch.Tensor):
            for t in ((v.values(), v.offsets()) if v.is_nested else (v,)):
                n += t.numel() * t.element_size()
    return n


class LoaderStats:
    """One iterator's counters, in the training process."""

    def __init__(self, workers, counters, base, datasets, device, every=None, callback=None):
        self.workers, self.counters, self.datasets, self.device = workers, counters, datasets, device
        # live workers keep adding to one array across iterators: this iterator counts from
        # ``base``, taken before its workers were started or woken
        self.base = base
        self.io_base = _io(datasets)
        self.started = time.perf_counter()
        self.ended = None  # when the iterator ended: a later snapshot describes the iterator, not now
        self.final = None  # the snapshot taken then
        self.first = None  # when the first batch was handed out
        self.first_bytes = 0
        self.batches = self.bytes = 0
        self.wait_s = self.cpu_s = 0.0
        self.every, self.callback = every, callback or _log
        self.reported = self.started

    def took(self, batch, asked, cpu_asked):
        """The loop got ``batch``, having asked for it at ``perf_counter()`` ``asked`` (this thread's
        CPU clock then: ``cpu_asked``)."""
        now = time.perf_counter()
        self.wait_s += now - asked
        self.cpu_s += time.thread_time() - cpu_asked
        self.batches += 1
        n = batch_bytes(batch)
        self.bytes += n
        if self.first is None:
            self.first, self.first_bytes = now, n
        if self.every is not None and now - self.reported >= self.every:
            self.reported = now
            self.callback(self.snapshot())

    def end(self):
        if self.ended is None:
            self.ended = time.perf_counter()
            self.final = self.snapshot()  # the workers' counters too, before another iterator adds to them

    def snapshot(self):
        if self.ended is not None and self.final is not None:
            return dict(self.final)
        now = self.ended or time.perf_counter()
        elapsed = now - self.started
        steady = now - self.first if self.first is not None else 0.0
        out = {
            "batches": self.batches,
            "bytes": self.bytes,
            "elapsed_s": elapsed,
            "first_batch_s": (self.first - self.started) if self.first is not None else None,
            # from the first batch on: start-up (workers, open, first read) is first_batch_s
            "batches_per_s": (self.batches - 1) / steady if steady > 0 else None,
            "bytes_per_s": (self.bytes - self.first_bytes) / steady if steady > 0 else None,
            "wait_s": self.wait_s,
            "wait_fraction": self.wait_s / elapsed if elapsed > 0 else None,
            "loader_cpu_s": self.cpu_s,
            "loader_cpu_per_batch_us": self.cpu_s / self.batches * 1e6 if self.batches else None,
            "workers": self.workers,
            "worker_busy_s": None,
            "worker_busy_fraction": None,
            "device": str(self.device) if self.device is not None else None,
            "device_bytes_per_s": ((self.bytes - self.first_bytes) / steady
                                   if self.device is not None and steady > 0 else None),
        }
        io = {f: v - self.io_base[f] for f, v in _io(self.datasets).items()}
        if self.counters is not None:
            rows = (self.counters - self.base).numpy()
            out["worker_busy_s"] = float(rows[:, 0].sum())
            out["worker_busy_fraction"] = out["worker_busy_s"] / (elapsed * self.workers) if elapsed > 0 else None
            for k, field in enumerate(IO_FIELDS, 2):
                io[field] += float(rows[:, k].sum())
        for field in ("bytes_fetched", "requests", "cache_hits", "cache_misses"):
            io[field] = int(io[field])
        io["get_latency_ms"] = io["request_s"] / io["requests"] * 1000 if io["requests"] else None
        out.update(io)
        return out


def _io(datasets):
    out = dict.fromkeys(IO_FIELDS, 0)
    for d in datasets:
        for field, v in d.io_counters().items():
            out[field] += v
    return out


def _log(stats):
    LOG.info(format_line(stats))


def format_line(s):
    """One log line of a snapshot."""
    def rate(v, unit, scale):
        return "-" if v is None else f"{v / scale:.2f} {unit}"

    line = (f"loader: {s['batches']} batches, {rate(s['batches_per_s'], 'batches/s', 1)}, "
            f"{rate(s['bytes_per_s'], 'MB/s', 1e6)}; waited {s['wait_s']:.2f} s "
            f"({(s['wait_fraction'] or 0):.1%} of {s['elapsed_s']:.1f} s)")
    if s["worker_busy_fraction"] is not None:
        line += f"; {s['workers']} workers {s['worker_busy_fraction']:.0%} busy"
    if s["requests"]:
        line += (f"; remote {s['bytes_fetched'] / 1e6:.1f} MB in {s['requests']} GETs "
                 f"({s['get_latency_ms']:.1f} ms each), cache {s['cache_hits']} hits / {s['cache_misses']} misses")
    return line
