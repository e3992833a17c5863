"""Batches to a GPU (issue 37; spec/performance.md §10.9): host→device GB/s, batches/s, time to the
first batch and the training process's CPU per batch of ``loader(..., device="cuda")`` and
``pin_memory=True`` against ``cudaMemcpy`` of pinned memory and torch's own ``pin_memory=True``, and
the CPU-only delivery against a plain memcpy of the same bytes. Every mode is first run once,
untimed, with each delivered batch checked on the device against the CPU batches (the check that
found wrong batches with ``pin_memory=True``, ../shared/gpu-checks/gpu_correct2.py): a mode that
delivers a wrong batch is reported as WRONG and its figures are not printed.

The dataset: gather_cpu.write_dataset's rows (embedding ``--dtype`` [256], image U8 [3,32,32],
label I64; 4,104 bytes a sample in F32), ``--shards`` shards of 4,096 rows, hard-linked
``--passes`` times under other names (one epoch reads each shard ``--passes`` times, from the same
page-cache pages: a long epoch without a large dataset), page cache warm. Each mode's timed epochs
(``--reps``, medians, modes in rotating order) report the time to the first batch apart and the
rates from the first batch on (steady state):

* ``memcpy`` (CPU): the epoch's bytes copied batch by batch from the shard maps into one buffer,
  one thread: what moving the bytes costs and nothing else (the CPU ceiling);
* ``cpu_only``: ``loader(ds, num_workers=W)``, no device, the loop touches nothing;
* ``memcpy_pinned`` (GPU): a pinned host tensor of one batch's bytes copied ``--copies`` times
  (``cudaMemcpyAsync`` from page-locked memory): the bus's host→device rate;
* ``ours_device``: ``loader(ds, num_workers=W, device="cuda")``;
* ``ours_pinned``: ``loader(ds, num_workers=W, pin_memory=True)`` + ``.to("cuda", non_blocking=True)``;
* ``torch_pinned``: ``DataLoader(ds, batch_size=None, num_workers=W, pin_memory=True)`` + the same;
* ``ours_pageable``: ``loader(ds, num_workers=W)`` + ``.to("cuda")``.

Each step is ``--step-ms`` of GPU work, calibrated with CUDA events (a loop of 1024² matmuls), plus
a sum of every delivered tensor; the step-bound rate is a batch per step. The training process's
CPU per batch is the CPU time (``time.thread_time``) the loop's thread spends getting a batch
(``loader().stats()["loader_cpu_per_batch_us"]``; for torch's DataLoader measured the same way).

``--rehearse`` runs the whole script on a machine without a GPU (the device modes on the CPU: no
pinning, no device copy): the GPU figures mean nothing, the CPU-only ones (``memcpy``,
``cpu_only``) are real; CI runs it (tests/python/package/test_gather_and_pinning.py).

    source tests/setup-env.sh
    $PYTHON jvm-connector/bench/gpu_feed.py [--shards 32] [--passes 32] [--batch 256] [--workers 2] \\
        [--dtype float32] [--reps 3] [--step-ms 2] [--modes a,b] [--out FILE] [--rehearse]
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

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gather_cpu import write_dataset  # noqa: E402

from safetensors_spark import open_dataset  # noqa: E402
from safetensors_spark.torch import SafetensorsIterableDataset, loader  # noqa: E402

CPU_MODES = ["memcpy", "cpu_only"]
GPU_MODES = ["memcpy_pinned", "ours_device", "ours_pinned", "torch_pinned", "ours_pageable"]

#: "cuda", or "cpu" under ``--rehearse``
DEVICE = "cuda"


def sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def make_dataset(path, shards, passes, dtype):
    """``shards`` shards written, then the manifest's shard list repeated ``passes`` times over
    hard links of them."""
    write_dataset(path, shards, dtype=dtype)
    if passes > 1:
        m = json.loads(Path(path, "dataset_manifest.json").read_text())
        entries = list(m["shards"])
        for p in range(1, passes):
            for k, e in enumerate(entries):
                part = p * len(entries) + k
                name = f"part-{part:05d}" + e["shard_path"][len("part-00000"):]
                os.link(os.path.join(path, e["shard_path"]), os.path.join(path, name))
                m["shards"].append(dict(e, shard_path=name, partition=part))
        m["shards"].sort(key=lambda e: e["shard_path"])
        m["total_samples"] *= passes
        m["total_bytes"] *= passes
        Path(path, "dataset_manifest.json").write_text(json.dumps(m))


def make_step(step_ms):
    """A GPU step of about ``step_ms`` ms (1024² matmuls, their time measured with CUDA events)
    plus a sum of the batch; returns ``(step, ms per matmul)``."""
    a = torch.randn(1024, 1024, device=DEVICE)
    n, per = 0, None
    if step_ms > 0:
        for _ in range(3):
            a @ a
        if DEVICE == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(50):
                a @ a
            end.record()
            end.synchronize()
            per = start.elapsed_time(end) / 50
        else:
            t0 = time.perf_counter()
            for _ in range(5):
                a @ a
            per = (time.perf_counter() - t0) * 1000 / 5
        n = max(1, round(step_ms / per))

    def step(batch):
        for _ in range(n):
            a @ a
        return sum(v.float().sum() for v in batch.values() if isinstance(v, torch.Tensor))

    return step, per


def make_ds(path, batch):
    return SafetensorsIterableDataset(path, batch_size=batch, shuffle=True, seed=0)


def iterator(path, mode, batch, workers):
    """``(iterable, how the loop moves a batch: None / non_blocking True / False)``."""
    ds = make_ds(path, batch)
    gpu = DEVICE == "cuda"
    if mode == "ours_device":
        return loader(ds, num_workers=workers, device="cuda" if gpu else None), None
    if mode == "ours_pinned":
        return loader(ds, num_workers=workers, pin_memory=gpu), True
    if mode == "torch_pinned":
        return torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers, pin_memory=gpu), True
    if mode == "ours_pageable":
        return loader(ds, num_workers=workers), False
    return loader(ds, num_workers=workers), "none"  # cpu_only: the loop touches nothing


_WEIGHTS = {}


def checksum(t):
    """A position-weighted sum of a tensor's bytes, on its device: a wrong or moved byte changes it."""
    b = t.contiguous().view(-1).view(torch.uint8).to(torch.int64)
    w = _WEIGHTS.get(b.device)
    if w is None or w.numel() < b.numel():
        w = _WEIGHTS[b.device] = torch.arange(b.numel(), dtype=torch.int64, device=b.device) % 251 + 1
    return int((b * w[: b.numel()]).sum())


def reference_sums(path, batch):
    return [{k: checksum(v) for k, v in b.items()} for b in loader(make_ds(path, batch), num_workers=0)]


def check(path, mode, batch, workers, want, step):
    """Batches delivered in ``mode`` that differ from the CPU batches (checked on the device, on the
    current stream, right after the copy, with the host batch dropped and a step after it)."""
    it, move = iterator(path, mode, batch, workers)
    got = []
    for b in it:
        if move in (True, False):
            b = {k: v.to(DEVICE, non_blocking=move) for k, v in b.items()}
        got.append({k: checksum(v) for k, v in b.items()})
        del b
        step({})
    sync()
    if len(got) != len(want):
        return len(want)
    return sum(g != w for g, w in zip(got, want))


def epoch(path, mode, batch, workers, step):
    """``(first batch s, steady GB/s, steady batches/s, CPU µs per batch in the loop, batches)``."""
    it, move = iterator(path, mode, batch, workers)
    sync()
    t0 = time.perf_counter()
    first = None
    batches = nbytes = first_bytes = 0
    cpu = 0.0
    src = iter(it)
    while True:
        c0 = time.thread_time()
        try:
            b = next(src)
        except StopIteration:
            break
        cpu += time.thread_time() - c0
        n = sum(v.numel() * v.element_size() for v in b.values())
        if move in (True, False):
            b = {k: v.to(DEVICE, non_blocking=move) for k, v in b.items()}
        if move != "none":
            step(b)
        batches += 1
        nbytes += n
        if first is None:
            sync()
            first, first_bytes = time.perf_counter(), n
    sync()
    end = time.perf_counter()
    if hasattr(it, "stats"):
        cpu = it.stats()["loader_cpu_s"]
    steady = end - first
    return {"first_s": first - t0, "total_s": end - t0, "gb_s": (nbytes - first_bytes) / steady / 1e9,
            "batches_s": (batches - 1) / steady, "cpu_us_per_batch": cpu / batches * 1e6, "batches": batches}


def shard_columns(path):
    """Every shard's columns as byte arrays over a map of its file, ``[[(rows, bytes per row)]]``."""
    out = []
    for s in open_dataset(path).shards:
        m = np.memmap(os.path.join(path, s.name), np.uint8, "r")
        n = int(m[:8].view("<u8")[0])
        header = json.loads(bytes(m[8: 8 + n]))
        cols = []
        for name, t in sorted(header.items()):
            if name == "__metadata__":
                continue
            b, e = t["data_offsets"]
            rows = t["shape"][0]
            cols.append(m[8 + n + b: 8 + n + e].reshape(rows, (e - b) // rows))
        out.append(cols)
    return out


def memcpy(path, batch):
    """The epoch's bytes copied batch by batch from the shard maps into one buffer (one thread)."""
    arrays = shard_columns(path)
    sample = sum(a.shape[1] for a in arrays[0])
    buf = np.empty(batch * sample, np.uint8)
    t0 = time.perf_counter()
    total = 0
    for shard in arrays:
        rows = len(shard[0])
        for r in range(0, rows, batch):
            off = 0
            for a in shard:
                part = a[r: r + batch].reshape(-1)
                buf[off: off + part.nbytes] = part
                off += part.nbytes
            total += off
    s = time.perf_counter() - t0
    return {"first_s": 0.0, "total_s": s, "gb_s": total / s / 1e9, "batches_s": total / sample / batch / s,
            "cpu_us_per_batch": s / (total / sample / batch) * 1e6, "batches": round(total / sample / batch)}


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
    s = time.perf_counter() - t0
    return {"first_s": 0.0, "total_s": s, "gb_s": nbytes * copies / s / 1e9, "batches_s": copies / s,
            "cpu_us_per_batch": None, "batches": copies}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", help="a dataset written as make_dataset does (default: one in a temp dir)")
    ap.add_argument("--shards", type=int, default=32)
    ap.add_argument("--passes", type=int, default=32,
                    help="hard links of the shards: an epoch reads each this often (32 x 32 shards: 17 GB an epoch)")
    ap.add_argument("--batch", type=int, default=256, help="samples per batch (256: 1 MiB in float32)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16", "uint8"],
                    help="the embedding column's dtype")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--step-ms", type=float, default=2.0)
    ap.add_argument("--copies", type=int, default=200)
    ap.add_argument("--modes", help="a comma-separated subset of " + ",".join(CPU_MODES + GPU_MODES))
    ap.add_argument("--no-check", action="store_true", help="skip the correctness pass")
    ap.add_argument("--out")
    ap.add_argument("--rehearse", action="store_true", help="run on the CPU to check the script (GPU figures mean nothing)")
    args = ap.parse_args()
    global DEVICE
    if args.rehearse:
        DEVICE = "cpu"
    elif not torch.cuda.is_available():
        sys.exit("gpu_feed.py needs torch with CUDA and a GPU (torch.cuda.is_available() is False); "
                 "--rehearse checks the script without one")
    modes = CPU_MODES + GPU_MODES if args.modes is None else args.modes.split(",")
    unknown = [m for m in modes if m not in CPU_MODES + GPU_MODES]
    if unknown:
        sys.exit(f"gpu_feed.py: --modes {unknown} unknown; choose from {CPU_MODES + GPU_MODES}")
    tmp = None
    path = args.dataset
    if path is None:
        tmp = tempfile.mkdtemp(prefix="gpu-feed-")
        path = os.path.join(tmp, "ds")
        make_dataset(path, args.shards, args.passes, args.dtype)
    try:
        for f in Path(path).glob("*.safetensors"):  # page cache warm
            f.read_bytes()
        step, per_matmul = make_step(args.step_ms)
        name = torch.cuda.get_device_name() if DEVICE == "cuda" else "REHEARSAL on the CPU (GPU figures mean nothing)"
        sample = sum(v.numel() * v.element_size() for v in next(iter(make_ds(path, 1))).values())
        res = {"device": name, "torch": torch.__version__, "workers": args.workers, "batch": args.batch,
               "batch_bytes": sample * args.batch, "dtype": args.dtype, "step_ms": args.step_ms,
               "matmul_ms": per_matmul, "cpus": os.cpu_count(), "modes": {}, "wrong": {}}
        if not args.no_check:
            want = reference_sums(path, args.batch)
            for mode in modes:
                if mode not in ("memcpy", "memcpy_pinned"):
                    res["wrong"][mode] = check(path, mode, args.batch, args.workers, want, step)
                    print(f"check {mode}: {res['wrong'][mode]} of {len(want)} batches differ from the CPU batches",
                          file=sys.stderr, flush=True)
        for rep in range(args.reps):
            for mode in modes[rep % len(modes):] + modes[: rep % len(modes)]:
                if mode == "memcpy":
                    r = memcpy(path, args.batch)
                elif mode == "memcpy_pinned":
                    r = memcpy_pinned(sample * args.batch, args.copies)
                else:
                    r = epoch(path, mode, args.batch, args.workers, step)
                res["modes"].setdefault(mode, []).append(r)
            print(f"rep {rep + 1}/{args.reps} done", file=sys.stderr, flush=True)
        report(res, modes, args)
        if args.out:
            Path(args.out).write_text(json.dumps(res, indent=1))
        if any(res["wrong"].values()):
            sys.exit(f"gpu_feed.py: WRONG batches delivered: {res['wrong']}")
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def report(res, modes, args):
    med = {m: {k: statistics.median(r[k] for r in res["modes"][m]) if res["modes"][m][0][k] is not None else None
               for k in res["modes"][m][0]} for m in modes}
    print(f"\n{res['device']}, torch {res['torch']}, {args.workers} workers, batch {args.batch} "
          f"({res['batch_bytes'] / 2**20:.2f} MiB, {args.dtype}), step {args.step_ms} ms, medians of {args.reps}")
    ceiling = {"cpu": med.get("memcpy", {}).get("gb_s"), "gpu": med.get("memcpy_pinned", {}).get("gb_s")}
    step_bound = 1000 / args.step_ms if args.step_ms > 0 else None
    print(f"  {'mode':<15} {'first batch':>11} {'start-up':>9} {'GB/s':>8} {'batches/s':>10} {'CPU µs/batch':>13}"
          f" {'of ceiling':>11} {'of step-bound':>14}")
    for m in modes:
        wrong = res["wrong"].get(m)
        if wrong:
            print(f"  {m:<15} WRONG: {wrong} batches differ from the CPU batches")
            continue
        r = med[m]
        c = ceiling["cpu" if m in CPU_MODES else "gpu"]
        share = f"{r['gb_s'] / c:11.1%}" if c else f"{'-':>11}"
        bound = (f"{r['batches_s'] / step_bound:14.1%}" if step_bound and m not in ("memcpy", "memcpy_pinned", "cpu_only")
                 else f"{'-':>14}")
        cpu = f"{r['cpu_us_per_batch']:13.1f}" if r["cpu_us_per_batch"] is not None else f"{'-':>13}"
        startup = r["first_s"] / r["total_s"]
        flag = "!" if startup > 0.1 else " "  # start-up over 10 % of the epoch: raise --passes
        print(f"  {m:<15} {r['first_s']:10.3f}s {startup:8.1%}{flag} {r['gb_s']:8.2f} {r['batches_s']:10.1f} {cpu}"
              f" {share} {bound}")
    if any(med[m]["first_s"] / med[m]["total_s"] > 0.1 for m in modes if m in med):
        print("  ! start-up is over 10 % of the epoch: the rates are from the first batch on, but raise --passes")


if __name__ == "__main__":
    main()
