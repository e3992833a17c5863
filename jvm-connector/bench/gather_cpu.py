"""CPU per sample of a shuffled batch's gather and of the hand-off, against one memcpy of the same
bytes (issue 28 item 6; spec/performance.md §10.8).

Writes a dataset of epoch.py's rows (embedding F32[256], image U8[3,32,32], label I64: 4,104 bytes a
sample; 4,096 rows a shard) with safetensors' own writer into a temp dir (removed at the end), or
takes one epoch.py wrote (its ``ours-r*`` output), and measures, in **CPU time** (``time.process_time``
of this process; the workers' through ``resource.getrusage(RUSAGE_CHILDREN)`` once they are joined),
so that other load on the machine moves the figures less than it moves wall times:

* memcpy: the epoch's bytes copied message by message from a shard map into a block already mapped
  (one ``numpy.copyto`` per message): what moving the bytes costs and nothing else;
* gather: what a ``loader()`` worker does per message: the shuffled rows of ``k`` batches read into a
  pooled shared-memory block (``_handoff.messages``), in this process;
* receive: what the training process does per message: the message's batches cut out as views
  (``Handoff.batches``), the block released;
* loader: a whole shuffled ``loader(num_workers=2)`` epoch without a step: this process + its workers
  (gather, pickling, queues, the receive).

    source tests/setup-env.sh
    $PYTHON jvm-connector/bench/gather_cpu.py [--shards 16] [--reps 3] [--dataset DIR] [--out FILE]
"""

import argparse
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np
import torch

from safetensors_spark.torch import SafetensorsIterableDataset, loader
from safetensors_spark.torch._handoff import POOL_SLOTS, messages
from safetensors_spark.torch._reader import BatchReader

EMB, IMG, ROWS, BATCH = 256, (3, 32, 32), 4096, 256


DTYPES = {"float32": ("F32", np.float32), "float16": ("F16", np.float16), "uint8": ("U8", np.uint8),
          "bfloat16": ("BF16", None)}


def write_dataset(path, shards, dtype="float32"):
    """``shards`` shards of ROWS rows of epoch.py's shape (the embedding in ``dtype``), with a
    manifest (spec/dataset.md §5)."""
    from safetensors.numpy import save_file

    st_dtype, np_dtype = DTYPES[dtype]
    if np_dtype is None:
        import ml_dtypes
        np_dtype = ml_dtypes.bfloat16

    os.makedirs(path, exist_ok=True)
    rng = np.random.default_rng(0)
    entries = []
    for k in range(shards):
        name = f"part-{k:05d}-0000-0f8fad5b-d9cb-469f-a165-70867728950e.safetensors"
        ids = np.arange(k * ROWS, (k + 1) * ROWS, dtype=np.int64)
        save_file({"embedding": rng.standard_normal((ROWS, EMB), dtype=np.float32).astype(np_dtype),
                   "image": rng.integers(0, 256, (ROWS, *IMG), dtype=np.uint8), "label": ids},
                  os.path.join(path, name), metadata={"safetensors_spark.layout": "batch"})
        entries.append({"shard_path": name, "samples_count": ROWS, "bytes": os.path.getsize(os.path.join(path, name)),
                        "partition": k, "padded_samples": 0, "num_tensors": 3})
    schema = {"embedding": {"dtype": st_dtype, "shape": [ROWS, EMB]}, "image": {"dtype": "U8", "shape": [ROWS, *IMG]},
              "label": {"dtype": "I64", "shape": [ROWS]}}
    manifest = {"format_version": "1.0", "safetensors_version": "1.0", "total_samples": shards * ROWS,
                "total_bytes": sum(e["bytes"] for e in entries), "shards": entries, "schema": schema,
                "format": "safetensors-spark-dataset", "created_by": "gather_cpu.py", "manifest_version": 1,
                "layout": "batch", "batch_size": ROWS, "tail_strategy": "write", "kv_separator": None,
                "padded_samples": 0, "dropped_samples": 0}
    with open(os.path.join(path, "dataset_manifest.json"), "w") as f:
        json.dump(manifest, f)


def children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def message_rows(ds, k):
    """The (shards, rows, lengths) of every message of ``k`` batches of the epoch, in order, and
    the ``rows_of`` a worker uses (a 1-worker loader's plan)."""
    from safetensors_spark._sampling import EpochOrder

    plan = ds._plan(ds._start_position())
    order = EpochOrder([s.samples for s in ds.dataset.shards], ds.shuffle, ds.seed, ds._epoch, ds.shuffle_block_size)
    total = len(ds.dataset)

    def rows_of(j0, j1):
        spans = [plan.batch(j) for j in range(j0, j1)]
        positions = np.concatenate([np.arange(f, f + n, dtype=np.int64) for f, n in spans]) % total
        return (*order.locate(positions), [n for _, n in spans])

    return rows_of, plan.num_batches


def part_memcpy(ds, k, sample_bytes):
    """One copy per message of the message's bytes, from the first shard's map (a sequential source
    of the same size) into a block already mapped."""
    _, num_batches = message_rows(ds, k)
    shard = ds.dataset.shards[0]
    src = ds.dataset.tensor_array(shard, ds.dataset._header(shard)["image"]).reshape(-1)
    nbytes = k * BATCH * sample_bytes
    src = np.resize(src, nbytes) if src.nbytes < nbytes else src[:nbytes]
    dst = np.empty(nbytes, np.uint8)
    dst[:] = src
    messages_count = -(-num_batches // k)
    t0 = time.process_time()
    for _ in range(messages_count):
        np.copyto(dst, src)
    return time.process_time() - t0, messages_count * k * BATCH


def part_gather(ds, k):
    """A worker's messages (gather into pooled shared blocks), then the training process's receive
    (the batches as views, the block released), both in this process."""
    rows_of, num_batches = message_rows(ds, k)
    reader = BatchReader(ds.dataset, ds.columns, ds.cache_shards)
    flags = torch.zeros((1, POOL_SLOTS), dtype=torch.uint8)
    blocks, gather, receive, samples = {}, 0.0, 0.0, 0
    gen = messages(reader, rows_of, num_batches, 0, 1, k, flags)
    while True:
        t0 = time.process_time()
        h = next(gen, None)
        t1 = time.process_time()
        if h is None:
            break
        for b in h.batches(blocks, flags.numpy()):
            samples += int(b["label"].shape[0])
        del b
        t2 = time.process_time()
        gather += t1 - t0
        receive += t2 - t1
    return gather, receive, samples


def part_loader(path, workers):
    ds = SafetensorsIterableDataset(path, batch_size=BATCH, shuffle=True, seed=0)
    c0, p0, w0 = children_cpu(), time.process_time(), time.perf_counter()
    it = iter(loader(ds, num_workers=workers))
    n = 0
    for b in it:
        n += int(b["label"].shape[0])
    del it, b
    wall = time.perf_counter() - w0
    main = time.process_time() - p0
    return main, children_cpu() - c0, wall, n


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", help="a dataset epoch.py wrote (default: write one of --shards shards)")
    ap.add_argument("--shards", type=int, default=16)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out")
    args = ap.parse_args()
    tmp = None
    path = args.dataset
    if path is None:
        tmp = tempfile.mkdtemp(prefix="gather-cpu-")
        path = os.path.join(tmp, "ds")
        write_dataset(path, args.shards)
    try:
        ds = SafetensorsIterableDataset(path, batch_size=BATCH, shuffle=True, seed=0)
        sample_bytes = sum(ds.dataset._dtypes[c].itemsize * int(np.prod(ds.dataset.schema[c]["shape"][1:]))
                           for c in ds.columns)
        from safetensors_spark.torch._handoff import batches_per_message

        k = batches_per_message(ds.dataset, ds.columns, BATCH, None)
        for shard in ds.dataset.shards:  # page cache warm, as the epoch benchmark's floor
            with open(os.path.join(path, shard.name), "rb") as f:
                while f.read(16 << 20):
                    pass
        rows = {"memcpy": [], "gather": [], "receive": [], "loader_total": [], "loader_main": [], "loader_wall": []}
        samples = None
        for rep in range(args.reps):
            t, n = part_memcpy(ds, k, sample_bytes)
            rows["memcpy"].append(t / n)
            g, r, n = part_gather(ds, k)
            rows["gather"].append(g / n)
            rows["receive"].append(r / n)
            samples = n
            m, c, w, n2 = part_loader(path, args.workers)
            assert n2 == n, (n2, n)
            rows["loader_total"].append((m + c) / n2)
            rows["loader_main"].append(m / n2)
            rows["loader_wall"].append(w / n2)
            print(f"rep {rep + 1}/{args.reps}: " + ", ".join(f"{key} {v[-1] * 1e6:.3f}" for key, v in rows.items())
                  + " µs/sample", file=sys.stderr, flush=True)
        med = {key: statistics.median(v) for key, v in rows.items()}
        print(f"\n{samples:,} samples of {sample_bytes:,} B, {k} batches of {BATCH} per message, medians of "
              f"{args.reps} (load average {os.getloadavg()[0]:.1f}):")
        for key, label in (("memcpy", "memcpy of the same bytes (CPU)"),
                           ("gather", "gather into a pooled block (worker CPU)"),
                           ("receive", "receive: batches as views (training process CPU)"),
                           ("loader_total", f"loader({args.workers} workers) epoch, all processes' CPU"),
                           ("loader_main", f"loader({args.workers} workers) epoch, training process CPU"),
                           ("loader_wall", f"loader({args.workers} workers) epoch, wall")):
            print(f"  {label:<52} {med[key] * 1e6:8.3f} µs/sample  {med[key] / med['memcpy']:6.2f} × memcpy")
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"samples": samples, "sample_bytes": sample_bytes, "batches_per_message": k,
                           "us_per_sample": {key: [x * 1e6 for x in v] for key, v in rows.items()},
                           "loadavg": os.getloadavg()}, f, indent=1)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
