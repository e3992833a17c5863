"""Spark DataFrame → one shuffled PyTorch epoch: ours against what users pick instead.

Run it through jvm-connector/bench/epoch.sh, which prepares the venvs. One file, three roles:

* ``run`` (default; the project's venv): the orchestrator. Starts one conversion process per
  group of paths, the page-cache read floor, then the epochs (one fresh process per epoch, paths
  in rotating order, ``--reps`` rounds), samples the memory of every epoch's process tree, prints
  the tables and the targets, writes the JSON file.
* ``convert --group G``: in the group's venv, starts a local Spark, generates the DataFrame
  (deterministic, the same in every venv), caches it, and times the group's conversions
  (untimed warm-up on a small DataFrame first; then ``--reps`` rounds in rotating order, each
  after a ``sync()``); keeps the last round's outputs and prints JSON.
* ``epoch --path P``: in the path's venv, builds the path's PyTorch loader over the kept output
  and runs one full shuffled epoch (batch 256, 2 workers) with a step that reads every byte of
  every batch (a 64-bit word sum, which doubles as an order-independent checksum: every path must
  deliver the same bytes); prints JSON.

What every number means, and the recorded results: spec/performance.md §10.
"""
import argparse
import datetime as dt
import json
import math
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

EMB = 256  # float32 embedding width
IMG = (3, 32, 32)  # uint8 image
IMG_BYTES = 3 * 32 * 32
SAMPLE_BYTES = EMB * 4 + IMG_BYTES + 8  # + int64 label = 4,104 bytes
BATCH = 256
WORKERS = 2
SHARD_ROWS = 4096  # our batch_size option: rows per shard

# paths: name -> (group that converts it, venv name, what it is)
PATHS = {
    "ours": ("main", "main", "df.write.format('safetensors') + SafetensorsIterableDataset(shuffle=True) + loader()"),
    "ours_map": ("main", "main", "the same shards + SafetensorsDataset (map-style) + loader(batch_size, shuffle=True): RandomSampler"),
    "ours_map_dl": ("main", "main", "the same shards + SafetensorsDataset (map-style) + a plain DataLoader(shuffle=True)"),
    "parquet": ("main", "main", "df.write.parquet (snappy) + pyarrow ParquetFile.iter_batches in an IterableDataset"),
    "petastorm": ("petastorm", "petastorm", "make_spark_converter + converter.make_torch_dataloader"),
    "streaming": ("streaming", "streaming", "dataframe_to_mds + StreamingDataset + DataLoader"),
    "hf": ("hf", "hf", "Dataset.from_spark + with_format('torch') + DataLoader(shuffle=True)"),
}
GROUPS = {"main": ["ours", "parquet", "ours_kv", "parquet_kv", "noop"], "petastorm": ["petastorm"],
          "streaming": ["streaming"], "hf": ["hf"]}
OTHERS = ("parquet", "petastorm", "streaming", "hf")

# Targets (issue 17)
EPOCH_VS_BEST_OTHER = 5.0
EPOCH_VS_MEMCPY = 0.5
WRITE_VS_DURABLE_FLOOR = 1.2
MAP_RANDOM_PER_CORE = 100_000
KV_VS_PARQUET = 0.5


def log(msg):
    print(f"[epoch-bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def median(xs):
    return statistics.median(xs) if xs else None


def first_line(text, limit=400):
    """The line of a traceback that says what went wrong (the last ``...Error: ...`` line)."""
    lines = [ln.strip() for ln in str(text).strip().splitlines() if ln.strip()]
    errs = [ln for ln in lines if ("Error" in ln or "Exception" in ln) and ":" in ln and not ln.startswith("File ")]
    return ((errs or lines or [""])[-1])[:limit]


# ============================================================================================
# The DataFrame: deterministic, generated with integer hashes in numpy (so every venv's numpy
# gives the same bits), through mapInArrow.


def _mix(h):
    import numpy as np

    h = h ^ (h >> np.uint64(31))
    h = h * np.uint64(0x94D049BB133111EB)
    return h ^ (h >> np.uint64(29))


def gen_batch(ids):
    """Columns of the rows with these ids (int64 numpy array) as a pyarrow RecordBatch."""
    import numpy as np
    import pyarrow as pa

    n = len(ids)
    u = ids.astype(np.uint64)[:, None] * np.uint64(0x9E3779B97F4A7C15)
    with np.errstate(over="ignore"):
        e = _mix(u + np.arange(EMB, dtype=np.uint64) * np.uint64(0xBF58476D1CE4E5B9))
        emb = (e >> np.uint64(40)).astype(np.float32) * np.float32(1.0 / (1 << 24)) - np.float32(0.5)
        w = _mix(u + (np.arange(IMG_BYTES // 8, dtype=np.uint64) + np.uint64(EMB)) * np.uint64(0xBF58476D1CE4E5B9))
    img = np.ascontiguousarray(w).view(np.uint8)  # n x 3072, little-endian words
    offsets = np.arange(n + 1, dtype=np.int32)
    emb_arr = pa.ListArray.from_arrays(pa.array(offsets * EMB), pa.array(emb.reshape(-1)))
    img_arr = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets * IMG_BYTES), pa.py_buffer(img.reshape(-1))])
    label = pa.array(ids % 1000, type=pa.int64())
    key = pa.array([f"k{i}" for i in ids.tolist()], type=pa.string())
    return pa.RecordBatch.from_arrays([emb_arr, img_arr, label, key], names=["embedding", "image", "label", "key"])


def make_df(spark, rows, partitions):
    def gen(batches):
        for b in batches:
            yield gen_batch(b.column(0).to_numpy())

    schema = "embedding array<float>, image binary, label bigint, key string"
    df = spark.range(0, rows, 1, partitions).mapInArrow(gen, schema)
    df.cache()
    n = df.count()
    assert n == rows, (n, rows)
    return df


def expected_checksum(rows):
    """The epoch checksum every path must give: the 64-bit word sum of all samples' bytes."""
    import numpy as np

    total = np.uint64(0)
    for lo in range(0, rows, 20000):
        b = gen_batch(np.arange(lo, min(rows, lo + 20000), dtype=np.int64))
        emb = b.column(0).values.to_numpy()
        img = np.frombuffer(b.column(1).buffers()[2], dtype=np.uint8)[: len(b) * IMG_BYTES]
        lab = b.column(2).to_numpy()
        with np.errstate(over="ignore"):
            for a in (emb, img, lab):
                total += np.ascontiguousarray(a).view(np.uint64).sum(dtype=np.uint64)
    return int(total)


def build_spark(args, app):
    from pyspark.sql import SparkSession

    b = SparkSession.builder
    if args.jar:
        b = b.config("spark.jars", str(args.jar))
    return (
        b.master(f"local[{args.cores}]")
        .appName(app)
        .config("spark.driver.memory", args.driver_memory)
        .config("spark.driver.extraJavaOptions", "-XX:+UseG1GC")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(args.partitions))
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", "4096")
        .getOrCreate()
    )


def dir_bytes(path):
    """Bytes of every file under ``path`` (the whole output, manifests and indexes included)."""
    p = Path(path)
    if p.is_file():
        return p.stat().st_size
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())


def data_files(path):
    p = Path(path)
    return [p] if p.is_file() else sorted(f for f in p.rglob("*") if f.is_file())


# ============================================================================================
# Conversions (role `convert`)


def plain_write_fsync(path, nbytes, buf):
    """The durable floor: os.write of a preallocated buffer into one new file, fsync, close."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(buf)
        left = nbytes
        while left > 0:
            left -= os.write(fd, view[: min(left, len(view))])
        os.fsync(fd)
    finally:
        os.close(fd)


def conversions(group, df, work, spark):
    """name -> function(out path) -> {"location": ...} for the group's timed conversions."""
    cols = df.select("embedding", "image", "label")
    if group == "main":
        from safetensors_spark.torch import SafetensorsIterableDataset

        def st_writer(d):
            return (d.write.format("safetensors").option("dtypes", '{"image": "U8"}')
                    .option("shapes", json.dumps({"image": list(IMG)})))

        def ours(p):
            st_writer(cols).option("batch_size", SHARD_ROWS).save(p)
            ds = SafetensorsIterableDataset(p, batch_size=BATCH, shuffle=True, seed=0)  # opens, checks headers
            return {"location": p, "samples": len(ds.dataset)}

        def ours_kv(p):
            st_writer(df.select("key", "embedding", "image", "label")).option("name_col", "key").save(p)
            return {"location": p}

        def parquet(p):
            cols.write.option("compression", "snappy").parquet(p)
            return {"location": p}

        def parquet_kv(p):
            df.select("key", "embedding", "image", "label").write.option("compression", "snappy").parquet(p)
            return {"location": p}

        def noop(p):
            cols.write.format("noop").mode("overwrite").save()
            return {}

        return {"ours": ours, "parquet": parquet, "ours_kv": ours_kv, "parquet_kv": parquet_kv, "noop": noop}
    if group == "petastorm":
        import atexit

        from petastorm.spark import SparkDatasetConverter, make_spark_converter
        from petastorm.spark import spark_dataset_converter as sdc

        def petastorm(p):
            os.makedirs(p, exist_ok=True)
            spark.conf.set(SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF, "file://" + p)
            conv = make_spark_converter(cols)
            # keep the cache after this process ends (petastorm deletes it at exit)
            atexit.unregister(sdc._delete_cache_data_atexit)
            return {"location": p, "cache_dir_url": conv.cache_dir_url, "file_urls": list(conv.file_urls),
                    "samples": len(conv)}

        return {"petastorm": petastorm}
    if group == "streaming":
        from streaming.base.converters import dataframe_to_mds

        def streaming(p):
            dataframe_to_mds(cols, merge_index=True, mds_kwargs={
                "out": p, "columns": {"embedding": "ndarray:float32", "image": "bytes", "label": "int64"}})
            return {"location": p}

        return {"streaming": streaming}
    if group == "hf":
        from datasets import Dataset

        def hf(p):
            ds = Dataset.from_spark(cols, cache_dir=p)
            return {"location": p, "files": [f["filename"] for f in ds.cache_files], "samples": len(ds)}

        return {"hf": hf}
    raise ValueError(f"unknown group {group}")


def role_convert(args):
    import numpy as np  # noqa: F401 - imported before any timing

    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    spark = build_spark(args, f"epoch-bench-convert-{args.group}")
    spark.sparkContext.setLogLevel("ERROR")
    out = {"group": args.group, "times": {}, "bytes": {}, "kept": {}, "warmup_s": {}}
    try:
        t0 = time.perf_counter()
        small = make_df(spark, max(1000, args.rows // 20), args.partitions)
        for name, fn in conversions(args.group, small, work, spark).items():
            w0 = time.perf_counter()
            loc = work / f"warmup-{name}"
            fn(str(loc))
            out["warmup_s"][name] = time.perf_counter() - w0
            if name == "petastorm":
                from petastorm.spark import spark_dataset_converter as sdc

                sdc._cache_df_meta_list.clear()
            shutil.rmtree(loc, ignore_errors=True)
        small.unpersist()
        df = make_df(spark, args.rows, args.partitions)
        out["generate_s"] = time.perf_counter() - t0
        log(f"{args.group}: DataFrame of {args.rows} rows generated and cached ({out['generate_s']:.1f} s with warm-up)")
        fns = conversions(args.group, df, work, spark)
        names = list(fns) + (["plain_write_fsync"] if args.group == "main" else [])
        buf = os.urandom(16 << 20)
        for rep in range(args.reps):
            order = names[rep % len(names):] + names[: rep % len(names)]
            for name in order:
                loc = work / f"{name}-r{rep}"
                os.sync()
                if name == "plain_write_fsync":
                    nbytes = out["bytes"].get("ours") or args.rows * SAMPLE_BYTES
                    t1 = time.perf_counter()
                    plain_write_fsync(loc, nbytes, buf)
                    out["times"].setdefault(name, []).append(time.perf_counter() - t1)
                    out["bytes"][name] = nbytes
                    loc.unlink()
                else:
                    t1 = time.perf_counter()
                    info = fns[name](str(loc))
                    out["times"].setdefault(name, []).append(time.perf_counter() - t1)
                    if loc.exists():
                        out["bytes"][name] = dir_bytes(loc)
                    if name == "petastorm":
                        from petastorm.spark import spark_dataset_converter as sdc

                        sdc._cache_df_meta_list.clear()  # no reuse of the cache by the next round
                    if rep == args.reps - 1:
                        out["kept"][name] = info
                    else:
                        shutil.rmtree(loc, ignore_errors=True)
                log(f"{args.group} rep {rep + 1}/{args.reps} {name}: {out['times'][name][-1]:.3f} s")
    finally:
        spark.stop()
    print(json.dumps(out))


# ============================================================================================
# Epochs (role `epoch`)


def touch(t):
    """Reads every byte of a tensor: the sum of its bytes as 64-bit words (wrapping)."""
    import torch

    u = t.contiguous().reshape(-1).view(torch.uint8)
    n = u.numel()
    if n % 8 == 0 and u.storage_offset() % 8 == 0:
        return int(u.view(torch.int64).sum())
    return int(u.to(torch.int64).sum())  # not word-aligned: never for this data


def ours_loader(kept):
    from safetensors_spark.torch import SafetensorsIterableDataset, loader

    ds = SafetensorsIterableDataset(kept["location"], batch_size=BATCH, shuffle=True, seed=0)
    return loader(ds, num_workers=WORKERS)


def ours_map_loader(kept):
    import torch
    from safetensors_spark.torch import SafetensorsDataset, loader

    ds = SafetensorsDataset(kept["location"])
    return loader(ds, batch_size=BATCH, shuffle=True, num_workers=WORKERS, generator=torch.Generator().manual_seed(0))


def ours_map_dl_loader(kept):
    import torch
    from safetensors_spark.torch import SafetensorsDataset

    ds = SafetensorsDataset(kept["location"])
    return torch.utils.data.DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=WORKERS,
                                       generator=torch.Generator().manual_seed(0))


class ParquetBatches:
    """An IterableDataset over Spark's Parquet part files with pyarrow, as users write it: each
    epoch the row groups are permuted (seeded) and dealt to the workers; each row group is read
    (`ParquetFile.read_row_group`), its rows permuted, and cut into batches whose columns become
    tensors without per-row Python (list<float> values → [B, 256]; binary → [B, 3, 32, 32])."""

    def __init__(self, path, seed=0):
        import pyarrow.parquet as pq

        self.files = [str(f) for f in sorted(Path(path).glob("*.parquet"))]
        self.groups = [(f, g) for f in self.files for g in range(pq.ParquetFile(f).num_row_groups)]
        self.seed = seed

    def __iter__(self):
        import numpy as np
        import pyarrow.parquet as pq
        import torch

        info = torch.utils.data.get_worker_info()
        wid, nw = (info.id, info.num_workers) if info else (0, 1)
        rng = np.random.default_rng(self.seed)
        order = rng.permutation(len(self.groups))
        for k in order[wid::nw].tolist():
            f, g = self.groups[k]
            table = pq.ParquetFile(f).read_row_group(g, columns=["embedding", "image", "label"])
            perm = np.random.default_rng([self.seed, k]).permutation(table.num_rows)
            for lo in range(0, table.num_rows, BATCH):
                b = table.take(perm[lo: lo + BATCH]).combine_chunks()
                emb = b.column("embedding").chunk(0)
                img = b.column("image").chunk(0)
                n = len(b)
                yield {
                    "embedding": torch.from_numpy(emb.flatten().to_numpy().reshape(n, EMB)),
                    "image": torch.from_numpy(np.frombuffer(img.buffers()[2], dtype=np.uint8, count=n * IMG_BYTES,
                                                            offset=int(np.frombuffer(img.buffers()[1], dtype=np.int32, count=1,
                                                                                   offset=img.offset * 4)[0])).reshape(n, *IMG)),
                    "label": torch.from_numpy(b.column("label").chunk(0).to_numpy()),
                }


def parquet_loader(kept):
    import torch

    class DS(ParquetBatches, torch.utils.data.IterableDataset):
        pass

    return torch.utils.data.DataLoader(DS(kept["location"]), batch_size=None, num_workers=WORKERS)


def petastorm_loader(kept):
    import numpy as np
    from petastorm import TransformSpec
    from petastorm.spark import SparkDatasetConverter

    def decode(pdf):
        pdf["image"] = pdf["image"].map(lambda b: np.frombuffer(b, dtype=np.uint8).reshape(IMG))
        return pdf

    spec = TransformSpec(decode, edit_fields=[("image", np.uint8, IMG, False)])
    conv = SparkDatasetConverter(kept["cache_dir_url"], kept["file_urls"], kept["samples"])
    # workers_count: the reader pool's workers (threads, petastorm's default pool type);
    # shuffling_queue_capacity: the shuffle buffer, 16 batches of rows; row groups are shuffled too
    return conv.make_torch_dataloader(batch_size=BATCH, num_epochs=1, workers_count=WORKERS,
                                      shuffling_queue_capacity=16 * BATCH, transform_spec=spec,
                                      shuffle_row_groups=True, seed=0)


def streaming_loader(kept):
    import numpy as np
    import torch
    from streaming import StreamingDataset

    class DS(StreamingDataset):
        def __getitem__(self, i):
            s = super().__getitem__(i)
            s["image"] = np.frombuffer(s["image"], dtype=np.uint8).reshape(IMG)
            return s

    try:
        from streaming.base.util import clean_stale_shared_memory

        clean_stale_shared_memory()
    except Exception:  # noqa: BLE001 - best effort
        pass
    ds = DS(local=kept["location"], shuffle=True, shuffle_seed=0, batch_size=BATCH)
    return torch.utils.data.DataLoader(ds, batch_size=BATCH, num_workers=WORKERS)


def hf_loader(kept):
    import numpy as np
    import torch
    from datasets import Dataset, concatenate_datasets

    parts = [Dataset.from_file(f) for f in kept["files"]]
    # torch format for the numeric columns only: with_format("torch") on a binary column passes
    # the values through numpy bytes arrays, which drop trailing zero bytes (measured: 18 of 5,000
    # images came back 3,071 bytes long); the image bytes are taken as Python bytes instead.
    ds = (parts[0] if len(parts) == 1 else concatenate_datasets(parts)).with_format(
        "torch", columns=["embedding", "label"], output_all_columns=True)

    def collate(samples):
        return {
            "embedding": torch.stack([s["embedding"] for s in samples]),
            "image": torch.from_numpy(np.frombuffer(b"".join(s["image"] for s in samples), dtype=np.uint8)
                                      .reshape(len(samples), *IMG)),
            "label": torch.stack([s["label"] for s in samples]),
        }

    return torch.utils.data.DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=WORKERS, collate_fn=collate,
                                       generator=torch.Generator().manual_seed(0))


LOADERS = {"ours": ours_loader, "ours_map": ours_map_loader, "ours_map_dl": ours_map_dl_loader, "parquet": parquet_loader,
           "petastorm": petastorm_loader, "streaming": streaming_loader, "hf": hf_loader}


def role_epoch(args):
    import torch

    import warnings

    warnings.simplefilter("ignore")  # pyarrow/numpy read-only buffers, loaders' deprecations
    kept = json.loads(args.kept)
    torch.set_num_threads(1)  # the step runs in the training process; workers read
    t0 = time.perf_counter()
    made = LOADERS[args.path](kept)
    ctx = made if hasattr(made, "__enter__") else None
    dl = ctx.__enter__() if ctx is not None else made
    checksum = 0
    samples = batches = 0
    first_batch_s = None
    try:
        for b in dl:
            for name in ("embedding", "image", "label"):
                checksum += touch(b[name])
            samples += int(b["label"].shape[0])
            batches += 1
            if first_batch_s is None:
                first_batch_s = time.perf_counter() - t0
    finally:
        if ctx is not None:
            ctx.__exit__(None, None, None)
    elapsed = time.perf_counter() - t0
    print(json.dumps({"path": args.path, "epoch_s": elapsed, "samples": samples, "batches": batches,
                      "first_batch_s": first_batch_s, "checksum": checksum % (1 << 64)}))


# ============================================================================================
# The orchestrator (role `run`)


def proc_tree(root):
    """pids of ``root`` and all its descendants."""
    children = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(d))
            except (OSError, IndexError, ValueError):
                pass
    out, stack = [], [root]
    while stack:
        p = stack.pop()
        out.append(p)
        stack.extend(children.get(p, []))
    return out


def mem_of(pid):
    """(Pss, Rss, RssAnon) bytes of one process."""
    pss = rss = anon = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    pss = int(line.split()[1]) * 1024
                elif line.startswith("Rss:"):
                    rss = int(line.split()[1]) * 1024
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    anon = int(line.split()[1]) * 1024
    except OSError:
        pass
    return pss, rss, anon


class TreeSampler(threading.Thread):
    """Peak of the summed PSS / RSS / anonymous RSS of a process tree (the training process and
    its DataLoader or reader workers), sampled every ``interval`` s."""

    def __init__(self, pid, interval=0.05):
        super().__init__(daemon=True)
        self.pid, self.interval = pid, interval
        self.stop = threading.Event()
        self.peak = {"pss": 0, "rss": 0, "anon": 0, "procs": 0}

    def run(self):
        while not self.stop.is_set():
            tree = proc_tree(self.pid)
            tot = [0, 0, 0]
            for p in tree:
                for i, v in enumerate(mem_of(p)):
                    tot[i] += v
            for k, v in zip(("pss", "rss", "anon"), tot):
                self.peak[k] = max(self.peak[k], v)
            self.peak["procs"] = max(self.peak["procs"], len(tree))
            self.stop.wait(self.interval)


def venv_python(name):
    if name == "main":
        return sys.executable
    return str(HERE / ".venv" / name / "bin" / "python")


def warm_page_cache(paths):
    """Reads every file once (untimed) so the timed run reads from the page cache."""
    buf = bytearray(8 << 20)
    total = 0
    for f in paths:
        with open(f, "rb", buffering=0) as fh:
            while True:
                n = fh.readinto(buf)
                if not n:
                    break
                total += n
    return total


def read_floor(files, reps):
    """The physical limit of the epoch: the same bytes read sequentially from the page cache into
    one buffer (readinto of each file into a preallocated buffer of the total size)."""
    total = sum(f.stat().st_size for f in files)
    buf = bytearray(total)
    view = memoryview(buf)
    warm_page_cache(files)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        pos = 0
        for f in files:
            with open(f, "rb", buffering=0) as fh:
                while True:
                    n = fh.readinto(view[pos:])
                    if not n:
                        break
                    pos += n
        times.append(time.perf_counter() - t0)
    return total, times


def run_sub(cmd, timeout, sampler_pid_cb=None):
    # Spark's Python workers (mapInArrow, and the converters' own mapInPandas) run in the same venv
    env = dict(os.environ, PYSPARK_PYTHON=cmd[0], PYSPARK_DRIVER_PYTHON=cmd[0])
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    sampler = None
    if sampler_pid_cb:
        sampler = TreeSampler(proc.pid)
        sampler.start()
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        for p in reversed(proc_tree(proc.pid)):
            try:
                os.kill(p, 9)
            except OSError:
                pass
        out, err = proc.communicate()
        return None, f"timed out after {timeout} s", sampler
    finally:
        if sampler:
            sampler.stop.set()
            sampler.join()
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    sys.stderr.write(err if len(err) < 4000 else err[-4000:])
    if proc.returncode != 0:
        return None, f"exit {proc.returncode}: {first_line(err)}", sampler
    try:
        res = json.loads(out.strip().splitlines()[-1])
        # CPU of the process and every descendant it waited for (DataLoader workers are joined)
        res["cpu_s"] = (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime)
        return res, None, sampler
    except (ValueError, IndexError):
        return None, f"no result: {first_line(err or out)}", sampler


def machine_info():
    def text(cmd):
        try:
            return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
        except Exception:  # noqa: BLE001
            return None

    info = {"uname": " ".join(platform.uname()), "cpu_count": os.cpu_count(), "python": sys.version.split()[0],
            "git_commit": text(["git", "rev-parse", "HEAD"]), "git_dirty": bool(text(["git", "status", "--porcelain"])),
            "date_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "loadavg_start": os.getloadavg()}
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                info["cpu_model"] = line.split(":", 1)[1].strip()
                break
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal"):
                info["mem_total_bytes"] = int(line.split()[1]) * 1024
    except OSError:
        pass
    for name in ("main", "petastorm", "streaming", "hf"):
        py = venv_python(name)
        mods = {"main": "torch pyarrow numpy pyspark", "petastorm": "petastorm pyarrow numpy",
                "streaming": "streaming numpy", "hf": "datasets pyarrow"}[name]
        code = ("import importlib,json;out={}\nfor m in %r.split():\n try: out[m]=importlib.import_module(m).__version__\n"
                " except Exception as e: out[m]='not importable: '+type(e).__name__\nprint(json.dumps(out))") % mods
        info[f"versions_{name}"] = json.loads(text([py, "-c", code]) or "{}") if Path(py).exists() else "no venv"
    return info


def fmt(x, spec=".3f"):
    return "—" if x is None else format(x, spec)


def print_table(title, header, rows):
    widths = [max([len(str(h))] + [len(str(r[i])) for r in rows]) for i, h in enumerate(header)]
    print(f"\n{title}")
    print("  ".join(str(h).ljust(w) for h, w in zip(header, widths)))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)))


def mark(ok):
    return "pass" if ok else "short"


def role_run(args):
    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="safetensors-epoch-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    log(f"outputs in {work}; {args.rows} rows; reps {args.reps}; paths {','.join(args.paths)}")
    machine = machine_info()
    result = {"machine": machine, "params": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
              "paths": {p: {"what": PATHS[p][2]} for p in args.paths}, "targets": []}
    unavailable = {}
    for name in ("petastorm", "streaming", "hf"):
        reason_file = HERE / ".venv" / f"{name}.unavailable"
        if name in args.paths and (reason_file.exists() or not Path(venv_python(name)).exists()):
            unavailable[name] = reason_file.read_text().strip() if reason_file.exists() else "its venv was not created"
    try:
        # ---------------------------------------------------------------- conversions
        conv = {}
        groups = [g for g in GROUPS if g == "main" or g in args.paths]
        for g in groups:
            if g in unavailable:
                continue
            cmd = [venv_python(g), __file__, "convert", "--group", g, "--rows", str(args.rows), "--reps", str(args.reps),
                   "--workdir", str(work / g), "--jar", str(args.jar), "--cores", str(args.cores),
                   "--partitions", str(args.partitions), "--driver-memory", args.driver_memory]
            log(f"conversion group {g}: {' '.join(cmd[1:4])} …")
            res, err, _ = run_sub(cmd, args.convert_timeout)
            if err:
                for p in GROUPS[g]:
                    unavailable.setdefault(p, f"conversion failed: {err}")
                if g == "main":
                    for p in ("ours_map", "ours_map_dl"):
                        unavailable.setdefault(p, f"conversion failed: {err}")
                log(f"group {g}: {err}")
            else:
                conv[g] = res
        result["conversions"] = conv
        Path(args.out).write_text(json.dumps(dict(result, unavailable=unavailable), indent=1))  # partial
        main = conv.get("main", {})
        kept = {}
        for g, res in conv.items():
            kept.update(res["kept"])
        if "ours" in kept:
            kept["ours_map"] = kept["ours_map_dl"] = kept["ours"]

        # ---------------------------------------------------------------- the read floor
        floor = None
        if "ours" in kept:
            files = data_files(kept["ours"]["location"])
            files = [f for f in files if f.suffix == ".safetensors"]
            nbytes, times = read_floor(files, max(3, args.reps))
            floor = {"bytes": nbytes, "times": times, "median_s": median(times),
                     "samples_per_s": args.rows / median(times), "gb_per_s": nbytes / median(times) / 1e9}
            log(f"page-cache read floor: {nbytes / 2**20:.0f} MiB in {median(times):.3f} s ({floor['gb_per_s']:.2f} GB/s)")
        result["read_floor"] = floor

        # ---------------------------------------------------------------- epochs
        runnable = [p for p in args.paths if p in kept and p not in unavailable]
        for p in args.paths:
            if p not in runnable and p not in unavailable:
                unavailable[p] = "no converted output"
        epochs = {p: [] for p in runnable}
        for rep in range(args.reps):
            order = runnable[rep % len(runnable):] + runnable[: rep % len(runnable)] if runnable else []
            for p in order:
                if p in unavailable:
                    continue
                warm_page_cache(data_files(kept[p]["location"]))
                cmd = [venv_python(PATHS[p][1]), __file__, "epoch", "--path", p, "--kept", json.dumps(kept[p])]
                res, err, sampler = run_sub(cmd, args.epoch_timeout, sampler_pid_cb=True)
                if err:
                    unavailable[p] = f"epoch failed: {err}"
                    log(f"epoch {p}: {err}")
                    continue
                res["peak"] = dict(sampler.peak)
                epochs[p].append(res)
                Path(args.out).write_text(json.dumps(dict(result, epochs=epochs, unavailable=unavailable), indent=1))
                log(f"epoch rep {rep + 1}/{args.reps} {p}: {res['epoch_s']:.3f} s, {res['samples']} samples, "
                    f"peak PSS {res['peak']['pss'] / 2**20:.0f} MiB over {res['peak']['procs']} processes")
        result["epochs"] = epochs
        result["unavailable"] = unavailable
        machine["loadavg_end"] = os.getloadavg()
    finally:
        if not args.keep and not args.workdir:
            shutil.rmtree(work, ignore_errors=True)

    report(args, result)
    Path(args.out).write_text(json.dumps(result, indent=1))
    log(f"results written to {args.out}")


def report(args, result):
    conv, epochs, unavailable = result.get("conversions", {}), result.get("epochs", {}), result["unavailable"]
    floor = result.get("read_floor")
    want = expected_checksum(args.rows)
    ctimes, cbytes = {}, {}
    for g, res in conv.items():
        for name, ts in res["times"].items():
            ctimes[name] = median(ts)
        cbytes.update(res["bytes"])
    summary = {}
    for p in args.paths:
        runs = epochs.get(p) or []
        conv_name = "ours" if p.startswith("ours_map") else p
        s = {"convert_s": ctimes.get(conv_name), "bytes": cbytes.get(conv_name)}
        if runs:
            e = median([r["epoch_s"] for r in runs])
            s.update({"epoch_s": e, "samples": runs[0]["samples"], "samples_per_s": runs[0]["samples"] / e,
                      "peak_pss": max(r["peak"]["pss"] for r in runs), "peak_rss": max(r["peak"]["rss"] for r in runs),
                      "peak_anon": max(r["peak"]["anon"] for r in runs), "procs": max(r["peak"]["procs"] for r in runs),
                      "checksum_ok": all(r["checksum"] == want and r["samples"] == args.rows for r in runs),
                      "epoch_times": [r["epoch_s"] for r in runs], "first_batch_s": median([r["first_batch_s"] or 0 for r in runs]),
                      "cpu_s": median([r["cpu_s"] for r in runs])})
            s["samples_per_cpu_s"] = s["samples"] / s["cpu_s"] if s["cpu_s"] else None
        summary[p] = s
    result["summary"] = summary
    ours = summary.get("ours", {})
    rows = []
    for p in args.paths:
        s = summary[p]
        if p in unavailable and "epoch_s" not in s:
            rows.append([p, fmt(s.get("convert_s")), "—", "—", "—", "—", "—", "—", "—", "—", "—", "cannot run here: " + unavailable[p]])
            continue
        conv_ratio = s["convert_s"] / ours["convert_s"] if s.get("convert_s") and ours.get("convert_s") else None
        sps_ratio = ours["samples_per_s"] / s["samples_per_s"] if ours.get("samples_per_s") and s.get("samples_per_s") else None
        rows.append([p, fmt(s.get("convert_s")), fmt(conv_ratio, ".2f"), fmt(s.get("epoch_s")), fmt(s.get("first_batch_s")),
                     fmt(s.get("samples_per_s"), ",.0f"), fmt(sps_ratio, ".2f"), fmt(s.get("cpu_s"), ".2f"),
                     fmt(s.get("samples_per_cpu_s"), ",.0f"), fmt(s.get("peak_pss", 0) / 2**20, ".0f") + f" ({s.get('procs', 0)} procs)",
                     fmt((s.get("bytes") or 0) / 2**20, ".1f"), ("data ok" if s.get("checksum_ok") else "DATA MISMATCH") +
                     (f"; {unavailable[p]}" if p in unavailable else "")])
    print_table(f"DataFrame ({args.rows:,} rows × {SAMPLE_BYTES} B) → one shuffled epoch (batch {BATCH}, {WORKERS} workers), medians of {args.reps}",
                ["path", "convert s", "÷ ours", "epoch s", "1st batch s", "samples/s", "ours ×", "CPU s", "samples/CPU-s", "peak PSS MiB", "on disk MiB", "note"], rows)
    if floor:
        print(f"\npage-cache read floor: {floor['bytes'] / 2**20:.1f} MiB in {floor['median_s']:.3f} s = "
              f"{floor['gb_per_s']:.2f} GB/s = {floor['samples_per_s']:,.0f} samples/s")
    mt = {k: median(v) for k, v in (conv.get("main") or {}).get("times", {}).items()}
    if mt:
        print(f"main group medians (s): " + ", ".join(f"{k} {v:.3f}" for k, v in mt.items()))

    # ------------------------------------------------------------------ targets
    targets = result["targets"]
    others = {p: summary[p] for p in OTHERS if p in summary and summary[p].get("samples_per_s")}
    if ours.get("samples_per_s") and others:
        best = max(others, key=lambda p: others[p]["samples_per_s"])
        r = ours["samples_per_s"] / others[best]["samples_per_s"]
        targets.append({"target": f"ours epoch samples/s ≥ {EPOCH_VS_BEST_OTHER}× the best other path ({best})",
                        "observed": r, "result": mark(r >= EPOCH_VS_BEST_OTHER)})
    if ours.get("samples_per_s") and floor:
        r = ours["samples_per_s"] / floor["samples_per_s"]
        targets.append({"target": f"ours epoch samples/s ≥ {EPOCH_VS_MEMCPY:.0%} of the page-cache read rate of the same bytes",
                        "observed": r, "result": mark(r >= EPOCH_VS_MEMCPY)})
    conv_others = {p: ctimes[p] for p in OTHERS if ctimes.get(p) and p in summary}
    if ctimes.get("ours") and conv_others:
        fastest = min(conv_others, key=conv_others.get)
        r = ctimes["ours"] / conv_others[fastest]
        targets.append({"target": f"ours DataFrame→dataset ≤ the fastest other conversion ({fastest})",
                        "observed": r, "result": mark(r <= 1.0)})
    if mt.get("ours") and mt.get("plain_write_fsync") and mt.get("noop"):
        fl = mt["noop"] + mt["plain_write_fsync"]
        r = mt["ours"] / fl
        targets.append({"target": f"ours batch write ≤ {WRITE_VS_DURABLE_FLOOR}× the durable floor (noop + plain write of the same bytes with fsync)",
                        "observed": r, "floor_s": fl, "result": mark(r <= WRITE_VS_DURABLE_FLOOR)})
    if summary.get("ours_map", {}).get("samples_per_s"):
        per_core = summary["ours_map"]["samples_per_s"] / min(WORKERS, os.cpu_count() or 1)
        targets.append({"target": f"map-style random reads ≥ {MAP_RANDOM_PER_CORE:,} samples/s per core from the page cache",
                        "observed": per_core, "result": mark(per_core >= MAP_RANDOM_PER_CORE)})
    if mt.get("ours_kv") and mt.get("parquet_kv"):
        r = mt["ours_kv"] / mt["parquet_kv"]
        targets.append({"target": f"KV write ≤ {KV_VS_PARQUET}× Spark Parquet (snappy) of the same columns (key, embedding, image, label)",
                        "observed": r, "result": mark(r <= KV_VS_PARQUET)})
    print_table("Targets", ["target", "observed", "result"], [[t["target"], fmt(t["observed"], ".3g"), t["result"]] for t in targets])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("role", nargs="?", default="run", choices=["run", "convert", "epoch"])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--paths", default=",".join(PATHS), help=f"comma-separated subset of {','.join(PATHS)}")
    ap.add_argument("--out", default="epoch-results.json")
    ap.add_argument("--workdir", default=None, help="where outputs go (default: a temp dir, removed at the end)")
    ap.add_argument("--keep", action="store_true", help="keep the outputs")
    ap.add_argument("--jar", default=None)
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--partitions", type=int, default=None)
    ap.add_argument("--driver-memory", default=None)
    ap.add_argument("--convert-timeout", type=int, default=3600)
    ap.add_argument("--epoch-timeout", type=int, default=1800)
    ap.add_argument("--group", help=argparse.SUPPRESS)
    ap.add_argument("--path", help=argparse.SUPPRESS)
    ap.add_argument("--kept", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role == "epoch":
        return role_epoch(args)
    args.partitions = args.partitions or args.cores
    if args.driver_memory is None:
        cached = args.rows * (SAMPLE_BYTES + 16)
        args.driver_memory = f"{min(14, max(3, math.ceil(cached * 1.5 / 2**30) + 2))}g"
    args.jar = connector_jar(args.jar)
    if args.role == "convert":
        return role_convert(args)
    require_jar(args.jar)
    run_paths(args, PATHS, role_run, always="ours")


# -- the end of each benchmark's main() (this one's, tokens.py's, remote.py's) ----------------

def connector_jar(given):
    """``--jar``, else the connector jar Maven built in jvm-connector/target (None if there is none)."""
    return Path(given) if given else next(iter(sorted((ROOT / "jvm-connector" / "target").glob(
        "safetensors-spark-*.jar"))), None)


def require_jar(jar):
    if jar is None or not jar.exists():
        sys.exit("no connector jar; build it with: mvn -B -q -f jvm-connector/pom.xml package -DskipTests")


def run_paths(args, known, run, always=None):
    """The orchestrator: ``--paths`` (comma-separated) checked against ``known`` (plus ``always``,
    first), then ``run(args)``; a failure exits 1 with its traceback."""
    args.paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    bad = [p for p in args.paths if p not in known]
    if bad:
        sys.exit(f"unknown path(s) {bad}; choose from {list(known)}")
    if always is not None and always not in args.paths:
        args.paths.insert(0, always)
    try:
        run(args)
    except Exception:
        traceback.print_exc()
        sys.exit(1)


if __name__ == "__main__":
    main()
