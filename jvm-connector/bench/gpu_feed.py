"""Batches to a GPU: host→device GB/s and batches/s of ``loader(..., pin_memory=True, device="cuda")``
against ``cudaMemcpy`` of pinned memory and against torch's own ``pin_memory=True`` (issue 28 item 5;
spec/performance.md §10.9). Needs torch with CUDA and a GPU; refuses to run without one.

Writes a dataset of epoch.py's rows (gather_cpu.write_dataset: 4,104 bytes a sample, 4,096 rows a
shard) into a temp dir (removed at the end), or takes ``--dataset``, and measures, each a median of
``--reps`` in this process, page cache warm:

* ``memcpy_pinned``: one pinned host tensor of a message's bytes copied to the device
  (``copy_(non_blocking=True)`` = ``cudaMemcpyAsync`` from page-locked memory) ``--copies`` times,
  then synchronized: the host→device rate the bus gives;
* ``ours_device``: ``loader(ds, num_workers=W, device="cuda")``: pooled pinned blocks, one batch
  copied ahead on a side stream;
* ``ours_pinned``: ``loader(ds, num_workers=W, pin_memory=True)`` + ``.to("cuda", non_blocking=True)``
  in the loop;
* ``torch_pinned``: ``torch.utils.data.DataLoader(ds, batch_size=None, num_workers=W, pin_memory=True)``
  (torch's pinning thread copies every batch) + ``.to("cuda", non_blocking=True)``;
* ``ours_pageable``: ``loader(ds, num_workers=W)`` + ``.to("cuda")`` from pageable memory.

Each epoch's step is ``--step-ms`` of GPU work (a matmul loop sized to it, 0 = none) plus a sum of
every delivered tensor on the GPU, so copies that overlap the step show as batches/s close to the
step-bound rate. Prints a table and writes ``--out`` JSON.

``--rehearse`` runs the whole script on a machine without a GPU (every mode on the CPU: no pinning,
no device copy, plain host copies for ``memcpy_pinned``): its figures mean nothing, it shows that
the script works before scarce GPU time is spent on it (tests/python/package/test_bench_scripts.py
runs it). The device kit and the one command for a lent GPU machine: spec/performance.md §10.9.

    source tests/setup-env.sh
    $PYTHON jvm-connector/bench/gpu_feed.py [--shards 32] [--reps 3] [--workers 2] [--step-ms 2] [--out FILE] [--rehearse]
"""

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gather_cpu import BATCH, write_dataset  # noqa: E402

from safetensors_spark.torch import SafetensorsIterableDataset, loader  # noqa: E402


#: "cuda", or "cpu" under ``--rehearse``
DEVICE = "cuda"


def sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def memcpy_pinned(nbytes, copies):
    host = torch.empty(nbytes, dtype=torch.uint8)
    if DEVICE == "cuda":
        host = host.pin_memory()
    host.fill_(1)
    dev = torch.empty(nbytes, dtype=torch.uint8, device=DEVICE)
    dev.copy_(host, non_blocking=True)
    sync()
    t0 = time.perf_counter()
    for _ in range(copies):
        dev.copy_(host, non_blocking=True)
    sync()
    return nbytes * copies / (time.perf_counter() - t0) / 1e9


def make_step(step_ms):
    """A GPU step of about ``step_ms`` ms (a loop of 1024² matmuls, calibrated) + a sum of the batch."""
    a = torch.randn(1024, 1024, device=DEVICE)
    n = 0
    if step_ms > 0:
        sync()
        t0 = time.perf_counter()
        for _ in range(20):
            a @ a
        sync()
        n = max(1, round(step_ms / ((time.perf_counter() - t0) * 1000 / 20)))

    def step(batch):
        for _ in range(n):
            a @ a
        return sum(v.float().sum() for v in batch.values() if isinstance(v, torch.Tensor))

    return step


def epoch(path, mode, workers, step):
    ds = SafetensorsIterableDataset(path, batch_size=BATCH, shuffle=True, seed=0)
    gpu = DEVICE == "cuda"
    if mode == "ours_device":
        it, move = loader(ds, num_workers=workers, device="cuda" if gpu else None), None
    elif mode == "ours_pinned":
        it, move = loader(ds, num_workers=workers, pin_memory=gpu), True
    elif mode == "torch_pinned":
        it, move = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers, pin_memory=gpu), True
    else:
        it, move = loader(ds, num_workers=workers), False
    sync()
    t0 = time.perf_counter()
    batches = nbytes = 0
    for b in it:
        if move is not None:
            b = {k: v.to(DEVICE, non_blocking=move) for k, v in b.items()}
        step(b)
        batches += 1
        nbytes += sum(v.numel() * v.element_size() for v in b.values())
    sync()
    s = time.perf_counter() - t0
    return batches / s, nbytes / s / 1e9, batches


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset")
    ap.add_argument("--shards", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--step-ms", type=float, default=2.0)
    ap.add_argument("--copies", type=int, default=200)
    ap.add_argument("--out")
    ap.add_argument("--rehearse", action="store_true", help="run on the CPU to check the script (figures mean nothing)")
    args = ap.parse_args()
    global DEVICE
    if args.rehearse:
        DEVICE = "cpu"
    elif not torch.cuda.is_available():
        sys.exit("gpu_feed.py needs torch with CUDA and a GPU (torch.cuda.is_available() is False); "
                 "--rehearse checks the script without one")
    tmp = None
    path = args.dataset
    if path is None:
        tmp = tempfile.mkdtemp(prefix="gpu-feed-")
        path = os.path.join(tmp, "ds")
        write_dataset(path, args.shards)
    try:
        for f in Path(path).glob("*.safetensors"):  # page cache warm
            f.read_bytes()
        step = make_step(args.step_ms)
        name = torch.cuda.get_device_name() if DEVICE == "cuda" else "REHEARSAL on the CPU (figures mean nothing)"
        res = {"device": name, "torch": torch.__version__, "workers": args.workers,
               "step_ms": args.step_ms, "memcpy_pinned_gb_s": [], "modes": {}}
        modes = ["ours_device", "ours_pinned", "torch_pinned", "ours_pageable"]
        for rep in range(args.reps):
            res["memcpy_pinned_gb_s"].append(memcpy_pinned(8 << 20, args.copies))
            for mode in modes[rep % len(modes):] + modes[: rep % len(modes)]:
                res["modes"].setdefault(mode, []).append(epoch(path, mode, args.workers, step))
            print(f"rep {rep + 1}/{args.reps} done", file=sys.stderr, flush=True)
        med = statistics.median(res["memcpy_pinned_gb_s"])
        print(f"\n{res['device']}, torch {torch.__version__}, {args.workers} workers, step {args.step_ms} ms, "
              f"medians of {args.reps}")
        print(f"  cudaMemcpy of pinned memory (8 MiB copies)   {med:7.2f} GB/s")
        for mode in modes:
            bps = statistics.median(r[0] for r in res["modes"][mode])
            gbs = statistics.median(r[1] for r in res["modes"][mode])
            print(f"  {mode:<44} {gbs:7.2f} GB/s  {bps:9.1f} batches/s  {gbs / med:6.1%} of memcpy")
        if args.out:
            Path(args.out).write_text(json.dumps(res, indent=1))
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
