"""What bounds a shuffled epoch of our loader, against the page-cache read floor (issue 17,
spec/performance.md §10.7). Decomposes one epoch over a dataset that epoch.py wrote (its
`ours-r*` output) into measured parts, each a median of REPS in this process:

* floor: the shard files read sequentially from the page cache into one buffer (epoch.py's);
* step: the benchmark's step alone (every tensor summed as 64-bit words) over the whole epoch's
  batches, read unshuffled: zero-copy views of the map, so this is the step and nothing else;
* in-process shuffled epoch without and with the step (num_workers=0): the random gather;
* loader(num_workers=2) shuffled, without and with the step, with handoff_batches=1 (one batch
  per message: torch's hand-off per batch) and the default (several per message, pooled blocks);
* shared memory: filling a fresh shared-memory block against copying into memory already mapped.

    source tests/setup-env.sh
    $PYTHON jvm-connector/bench/epoch_bounds.py DATASET [--reps 3] [--out FILE]
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import epoch  # noqa: E402 - the benchmark's step, batch size, workers and read floor

from safetensors_spark.torch import SafetensorsIterableDataset, loader  # noqa: E402


def run_epoch(path, *, shuffle, workers, step, handoff=None):
    ds = SafetensorsIterableDataset(path, batch_size=epoch.BATCH, shuffle=shuffle, seed=0)
    t0 = time.perf_counter()
    n = 0
    for b in loader(ds, num_workers=workers, handoff_batches=handoff):
        if step:
            for name in ("embedding", "image", "label"):
                epoch.touch(b[name])
        n += int(b["label"].shape[0])
    return time.perf_counter() - t0, n


def shm_fill(nbytes, reps):
    src = np.frombuffer(os.urandom(nbytes), dtype=np.uint8)
    fresh, warm = [], []
    dst = np.empty(nbytes, dtype=np.uint8)
    dst[:] = src
    for _ in range(reps):
        block = torch.empty(0, dtype=torch.uint8)
        t0 = time.perf_counter()
        block = block.new(block._typed_storage()._new_shared(nbytes))
        block.numpy()[:] = src
        fresh.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        dst[:] = src
        warm.append(time.perf_counter() - t0)
    return epoch.median(fresh), epoch.median(warm)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dataset", help="a dataset epoch.py wrote (its ours-r* output)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)  # as epoch.py's training process
    files = [f for f in epoch.data_files(args.dataset) if f.suffix == ".safetensors"]
    nbytes, floor_times = epoch.read_floor(files, args.reps)
    floor = epoch.median(floor_times)
    samples = SafetensorsIterableDataset(args.dataset).dataset.manifest["total_samples"]
    rows = [("page-cache read floor (sequential readinto)", floor, samples)]
    cases = [
        ("step alone (unshuffled in-process views of the map)", dict(shuffle=False, workers=0, step=True)),
        ("in-process shuffled, no step", dict(shuffle=True, workers=0, step=False)),
        ("in-process shuffled + step", dict(shuffle=True, workers=0, step=True)),
        ("2 workers, 1 batch per message, no step", dict(shuffle=True, workers=2, step=False, handoff=1)),
        ("2 workers, 1 batch per message + step", dict(shuffle=True, workers=2, step=True, handoff=1)),
        ("2 workers, pooled messages, no step", dict(shuffle=True, workers=2, step=False)),
        ("2 workers, pooled messages + step (the benchmark's `ours`)", dict(shuffle=True, workers=2, step=True)),
    ]
    for name, kw in cases:
        times = []
        for _ in range(args.reps):
            t, n = run_epoch(args.dataset, **kw)
            assert n == samples, (name, n, samples)
            times.append(t)
        rows.append((name, epoch.median(times), samples))
    fresh, warm = shm_fill(8 << 20, max(5, args.reps))
    print(f"{samples:,} samples, {nbytes / 2**20:.1f} MiB of shards; medians of {args.reps}; "
          f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}")
    print(f"{'part':62s} {'s':>8s} {'samples/s':>12s} {'GB/s':>7s} {'of floor':>8s}")
    out = []
    for name, t, n in rows:
        rate = n / t
        out.append({"part": name, "s": t, "samples_per_s": rate, "gb_per_s": nbytes / t / 1e9, "of_floor": floor / t})
        print(f"{name:62s} {t:8.3f} {rate:12,.0f} {nbytes / t / 1e9:7.2f} {floor / t:8.1%}")
    print(f"8 MiB shared-memory block: filled fresh {fresh * 1e3:.2f} ms, copied into mapped memory "
          f"{warm * 1e3:.2f} ms ({fresh / warm:.0f} x)")
    if args.out:
        Path(args.out).write_text(json.dumps({"rows": out, "shm_fresh_s": fresh, "shm_warm_s": warm,
                                              "bytes": nbytes, "samples": samples}, indent=1))


if __name__ == "__main__":
    main()
