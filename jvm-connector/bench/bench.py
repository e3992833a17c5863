"""Benchmark harness of the safetensors Spark data source (run it through bench/run.sh).

One generated, cached DataFrame (`rows` x `width`, an array<float> column `xf`, an array<double>
column `xd` with the same values, and a string key `key = concat('k', id)`) is written by every
variant in round-robin order, `reps` times (the starting variant rotates each repetition);
medians are reported. Then the outputs of the last repetition are read back (Spark reads, and
the consumer side: one shuffled epoch of our loader and of pyarrow over the Parquet output, into
torch). Optionally the Rust criterion benches run too.

What every number means is in spec/performance.md.
"""
import argparse
import datetime as dt
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# ArrowBatchBuilder's flush constants (spec/jni.md, "Arrow batches"): a task hands Rust one batch
# every MAX_ROWS rows, or earlier when its allocator holds MAX_BYTES.
ARROW_MAX_ROWS = 4096
ARROW_MAX_BYTES = 64 << 20

PLAIN_CHUNK = 16 << 20  # the plain sequential write: os.write of one preallocated 16 MiB buffer

# Targets (the issue): ratio of a write's median time to its floor.
WRITE_TARGETS = {"st_batch_f32": 1.5, "st_batch_f64_bf16": 2.0, "st_batch_f64_f16": 2.0}
RNE_TARGET_GBPS = 1.0
RNE_BENCHES = ("f32_to_F16", "f32_to_BF16", "f64_to_F16", "f64_to_BF16")


def log(msg):
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def median(xs):
    return statistics.median(xs) if xs else None


def run_text(cmd, cwd=None):
    try:
        return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()
    except Exception:  # noqa: BLE001 - machine facts are best effort
        return None


# --------------------------------------------------------------------------------------------
# Executor memory: /proc/<jvm pid>/status sampled from a thread


def proc_status(pid):
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                    out[key] = int(rest.split()[0]) * 1024
    except OSError:
        pass
    return out


class RssSampler:
    """Samples VmRSS/RssAnon of `pid` every `interval` s while active."""

    def __init__(self, pid, interval=0.005):
        self.pid, self.interval = pid, interval
        self._stop = threading.Event()
        self.samples = 0
        self.peak_rss = 0
        self.peak_anon = 0

    def __enter__(self):
        self.before = proc_status(self.pid)
        self.peak_rss = self.before.get("VmRSS", 0)
        self.peak_anon = self.before.get("RssAnon", 0)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self):
        while not self._stop.is_set():
            s = proc_status(self.pid)
            self.samples += 1
            self.peak_rss = max(self.peak_rss, s.get("VmRSS", 0))
            self.peak_anon = max(self.peak_anon, s.get("RssAnon", 0))
            self._stop.wait(self.interval)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.after = proc_status(self.pid)
        return False

    def result(self):
        b, a = self.before, self.after
        peak = self.peak_rss
        if a.get("VmHWM", 0) > b.get("VmHWM", 0):
            peak = max(peak, a["VmHWM"])  # the high-water mark rose during the action: exact peak
        return {
            "peak_growth": peak - b.get("VmRSS", 0),
            "rss_before": b.get("VmRSS"),
            "rss_peak": self.peak_rss,
            "rss_after": a.get("VmRSS"),
            "rss_peak_growth": self.peak_rss - b.get("VmRSS", 0),
            "anon_peak_growth": self.peak_anon - b.get("RssAnon", 0),
            "hwm_before": b.get("VmHWM"),
            "hwm_after": a.get("VmHWM"),
            "samples": self.samples,
        }


# --------------------------------------------------------------------------------------------
# The plain sequential write (the byte half of a write's floor)


def plain_write(path, nbytes, buf):
    """Writes `nbytes` to a new file with os.write of `buf` (a preallocated buffer), then fsync
    (the safetensors writer fsyncs every shard before renaming it, format.md §4.3)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(buf)
        left = nbytes
        while left > 0:
            n = os.write(fd, view[: min(left, len(view))])
            left -= n
        os.fsync(fd)
    finally:
        os.close(fd)


# --------------------------------------------------------------------------------------------


def dir_bytes(path, suffix=None):
    total = 0
    for p in Path(path).iterdir():
        if p.is_file() and not p.name.startswith((".", "_")) and (suffix is None or p.name.endswith(suffix)):
            total += p.stat().st_size
    return total


def shards_of(path):
    m = json.loads((Path(path) / "dataset_manifest.json").read_text())
    return [Path(path) / s["shard_path"] for s in m["shards"]], m


def build_spark(args, jar):
    from pyspark.sql import SparkSession

    java_opts = "-XX:+UseG1GC"
    if args.pretouch:
        # Heap fully resident from the start: RSS growth during a write is then non-heap memory
        # (Arrow direct buffers, the Rust writer, thread stacks, JIT code), see spec/performance.md.
        java_opts += f" -Xms{args.driver_memory} -XX:+AlwaysPreTouch"
    return (
        SparkSession.builder.master(f"local[{args.cores}]")
        .appName("safetensors-spark-bench")
        .config("spark.jars", str(jar))
        .config("spark.driver.memory", args.driver_memory)
        .config("spark.driver.extraJavaOptions", java_opts)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(args.partitions))
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )


def make_df(spark, rows, width, partitions):
    from pyspark.sql import functions as F

    idx = F.sequence(F.lit(0), F.lit(width - 1))
    df = (
        spark.range(0, rows, 1, partitions)
        .withColumn("key", F.concat(F.lit("k"), F.col("id").cast("string")))
        .withColumn("xd", F.transform(idx, lambda i: F.sin(F.col("id") * width + i) * 100.0))
        .withColumn("xf", F.col("xd").cast("array<float>"))
        .select("key", "xf", "xd")
    )
    df.cache()
    n = df.count()
    assert n == rows, (n, rows)
    return df


def write_variants(df, args):
    """name -> (projection label, function(out_path)). Floors: see floor_of()."""
    st = lambda d: d.write.format("safetensors").option("batch_size", args.batch_size)  # noqa: E731
    kv = lambda d: d.write.format("safetensors").option("name_col", "key").option("target_shard_size_mb", 1000)  # noqa: E731
    noop = lambda d: d.write.format("noop").mode("overwrite").save()  # noqa: E731
    f, d, k = df.select("xf"), df.select("xd"), df.select("key", "xf")
    return {
        "noop_f32": ("xf", lambda p: noop(f)),
        "noop_f64": ("xd", lambda p: noop(d)),
        "noop_kv": ("key,xf", lambda p: noop(k)),
        "parquet_snappy": ("xf", lambda p: f.write.option("compression", "snappy").parquet(p)),
        "parquet_uncompressed": ("xf", lambda p: f.write.option("compression", "none").parquet(p)),
        "st_batch_f32": ("xf", lambda p: st(f).option("dtype", "F32").save(p)),
        "st_batch_f64_bf16": ("xd", lambda p: st(d).option("dtype", "BF16").save(p)),
        "st_batch_f64_f16": ("xd", lambda p: st(d).option("dtype", "F16").save(p)),
        "st_kv_f32": ("key,xf", lambda p: kv(k).save(p)),
    }


NOOP_OF = {"xf": "noop_f32", "xd": "noop_f64", "key,xf": "noop_kv"}


def arrow_batch_bytes(rows, width, partitions, elem_bytes, key):
    """Bytes of one Arrow batch a task hands Rust (wire layout: list values + int32 offsets per
    array column, UTF-8 bytes + int32 offsets for the key), with ArrowBatchBuilder's flush rule."""
    per_row = width * elem_bytes + 4
    if key:
        # mean length of 'k' + decimal id over ids 0..rows-1, plus its int32 offset
        total, lo, d = 0, 0, 1
        while lo < rows:
            hi = min(rows, 10**d)
            total, lo, d = total + (hi - lo) * d, hi, d + 1
        per_row += 1 + total / max(rows, 1) + 4
    batch_rows = min(ARROW_MAX_ROWS, max(1, int(ARROW_MAX_BYTES // per_row)), math.ceil(rows / partitions))
    return int(batch_rows * per_row), batch_rows, per_row


def run_writes(spark, df, args, work, jvm_pid):
    variants = write_variants(df, args)
    names = list(variants) + ["plain_write_4B", "plain_write_2B"]
    elems = args.rows * args.width
    plain_sizes = {"plain_write_4B": elems * 4, "plain_write_2B": elems * 2}
    buf = os.urandom(PLAIN_CHUNK)
    times = {n: [] for n in names}
    rss = {n: [] for n in variants}
    # Untimed rounds first: on 2 cores the JIT compilers, still busy with Spark's and the JDK's
    # code after the first writes, otherwise take CPU from whichever variant runs next.
    for w in range(args.warmup):
        for name, (_, fn) in variants.items():
            out = work / f"warmup-{name}-{w}"
            fn(str(out))
            shutil.rmtree(out, ignore_errors=True)
        log(f"warm-up round {w + 1}/{args.warmup} done")
    out_bytes = {}
    kept = {}
    for rep in range(args.reps):
        order = names[rep % len(names):] + names[: rep % len(names)]
        for name in order:
            out = work / f"{name}-r{rep}"
            # Start each variant with no dirty pages of the previous one (Parquet does not fsync
            # its output: its writeback would otherwise slow whichever fsyncs next, the floor's
            # plain write included).
            os.sync()
            if name in plain_sizes:
                t0 = time.perf_counter()
                plain_write(out, plain_sizes[name], buf)
                times[name].append(time.perf_counter() - t0)
                out.unlink()
            else:
                _, fn = variants[name]
                with RssSampler(jvm_pid) as s:
                    t0 = time.perf_counter()
                    fn(str(out))
                    elapsed = time.perf_counter() - t0
                times[name].append(elapsed)
                rss[name].append(s.result())
                if out.exists():
                    out_bytes[name] = dir_bytes(out)
                    if rep == args.reps - 1:
                        kept[name] = out
                    else:
                        shutil.rmtree(out)
            log(f"rep {rep + 1}/{args.reps} {name}: {times[name][-1]:.3f} s")
    return times, rss, out_bytes, kept, plain_sizes


def floors(times, out_bytes, plain_sizes, variants_proj):
    """floor(variant) = median(noop of the same projection) + output bytes / plain-write rate,
    the rate measured by plain_write_4B (or plain_write_2B for 2-byte outputs)."""
    med = {k: median(v) for k, v in times.items()}
    rate4 = plain_sizes["plain_write_4B"] / med["plain_write_4B"]
    rate2 = plain_sizes["plain_write_2B"] / med["plain_write_2B"]
    out = {}
    for name, proj in variants_proj.items():
        if name.startswith("noop") or name not in out_bytes:
            continue
        rate = rate2 if name.endswith(("bf16", "f16")) else rate4
        write_s = out_bytes[name] / rate
        out[name] = {"noop": NOOP_OF[proj], "noop_s": med[NOOP_OF[proj]], "bytes": out_bytes[name], "plain_write_s": write_s, "floor_s": med[NOOP_OF[proj]] + write_s}
    return out


# --------------------------------------------------------------------------------------------
# Reads (Spark) and the consumer side (Python)


def sum_expr(F):
    return F.sum(F.aggregate("xf", F.lit(0.0).cast("double"), lambda acc, x: acc + x)).alias("s")


def read_variants(spark, kept):
    from pyspark.sql import functions as F

    out = {}
    if "parquet_uncompressed" in kept:
        out["read_sum_parquet_uncompressed"] = lambda: spark.read.parquet(str(kept["parquet_uncompressed"])).select(sum_expr(F)).collect()[0][0]
    if "parquet_snappy" in kept:
        out["read_sum_parquet_snappy"] = lambda: spark.read.parquet(str(kept["parquet_snappy"])).select(sum_expr(F)).collect()[0][0]
    if "st_batch_f32" in kept:
        out["read_sum_st_batch_f32"] = lambda: spark.read.format("safetensors").load(str(kept["st_batch_f32"])).select(sum_expr(F)).collect()[0][0]
    return out


BATCH = 256  # the consumer side: batches of a shuffled epoch, as a training loop takes them


def word_sum(t):
    """Reads every byte of a tensor: the wrapping sum of its bytes as 64-bit words (the rows of
    this DataFrame are 4·width bytes, a multiple of 8), order-independent across batches."""
    import torch

    return int(t.contiguous().reshape(-1).view(torch.uint8).view(torch.int64).sum())


def epoch_st(path):
    """One shuffled epoch of our loader (safetensors_spark.torch.SafetensorsIterableDataset,
    batch 256), iterated in this process; returns (samples, checksum)."""
    from safetensors_spark.torch import SafetensorsIterableDataset

    n = total = 0
    for b in SafetensorsIterableDataset(str(path), batch_size=BATCH, shuffle=True, seed=0):
        total += word_sum(b["xf"])
        n += b["xf"].shape[0]
    return n, total % (1 << 64)


def epoch_parquet(path, width):
    """One shuffled epoch of Spark's Parquet output as users read it with pyarrow: row groups in a
    seeded random order, rows permuted inside each, batches of 256 → torch (list<float> values →
    [B, width], no per-row Python); returns (samples, checksum)."""
    import numpy as np
    import pyarrow.parquet as pq
    import torch

    groups = [(f, g) for f in sorted(Path(path).glob("*.parquet")) for g in range(pq.ParquetFile(f).num_row_groups)]
    n = total = 0
    for k in np.random.default_rng(0).permutation(len(groups)).tolist():
        f, g = groups[k]
        table = pq.ParquetFile(f).read_row_group(g, columns=["xf"])
        perm = np.random.default_rng([0, k]).permutation(table.num_rows)
        for lo in range(0, table.num_rows, BATCH):
            col = table.take(perm[lo: lo + BATCH]).column("xf").combine_chunks()
            values = col.flatten().to_numpy()  # read-only Arrow memory; the step only reads it
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # torch: "not writable"
                t = torch.from_numpy(values.reshape(len(col), width))
            total += word_sum(t)
            n += len(col)
    return n, total % (1 << 64)


def consumer_variants(kept, width):
    """The consumer side: one shuffled epoch of batches into torch (the loaders of
    jvm-connector/bench/epoch.py, in this process, without DataLoader workers)."""
    out = {}
    try:
        import safetensors_spark.torch  # noqa: F401
    except ImportError:
        return out
    if "st_batch_f32" in kept:
        out["epoch_st_batch_f32"] = lambda: epoch_st(kept["st_batch_f32"])
    for pq_name in ("parquet_uncompressed", "parquet_snappy"):
        if pq_name in kept:
            out[f"epoch_{pq_name}"] = (lambda p: lambda: epoch_parquet(p, width))(kept[pq_name])
    return out


def run_timed_round_robin(variants, reps, label, results=None):
    times = {n: [] for n in variants}
    errors = {}
    names = list(variants)
    for rep in range(reps):
        order = names[rep % len(names):] + names[: rep % len(names)] if names else []
        for name in order:
            if name in errors:
                continue
            try:
                t0 = time.perf_counter()
                result = variants[name]()
                times[name].append(time.perf_counter() - t0)
                if results is not None:
                    results[name] = result
                del result
                log(f"{label} rep {rep + 1}/{reps} {name}: {times[name][-1]:.3f} s")
            except Exception as e:  # noqa: BLE001 - a failing variant is reported, not fatal
                first = (str(e).strip().splitlines() or [type(e).__name__])[0]
                errors[name] = first[:300]
                log(f"{label} {name}: failed: {errors[name]}")
    return times, errors


def check_consumer_equal(results):
    """Every loader must have delivered the same samples: equal counts and checksums."""
    if len(results) < 2:
        return None
    return len(set(results.values())) == 1


# --------------------------------------------------------------------------------------------
# Criterion


def run_criterion(args):
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    crit = target / "criterion"
    cmd = ["cargo", "bench", "--locked", "-p", "safetensors-spark-format", "--bench", "convert", "--bench", "header", "--", "--warm-up-time", "1", "--measurement-time", str(args.criterion_time)]
    log("running " + " ".join(cmd))
    started = time.time()
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=sys.stderr)
    results = {}
    for bj in crit.rglob("new/benchmark.json"):
        if bj.stat().st_mtime < started - 1:
            continue  # left over from an earlier run
        meta = json.loads(bj.read_text())
        est = json.loads((bj.parent / "estimates.json").read_text())
        ns = est["median"]["point_estimate"]
        lo, hi = est["median"]["confidence_interval"]["lower_bound"], est["median"]["confidence_interval"]["upper_bound"]
        entry = {"median_ns": ns, "ci_ns": [lo, hi], "mean_ns": est["mean"]["point_estimate"]}
        if est.get("slope"):
            entry["slope_ns"] = est["slope"]["point_estimate"]
        thr = meta.get("throughput") or {}
        if "Bytes" in thr:
            entry["bytes"] = thr["Bytes"]
            entry["gb_per_s"] = thr["Bytes"] / ns  # bytes per ns == GB/s
        elif "Elements" in thr:
            entry["elements"] = thr["Elements"]
        results[meta["full_id"]] = entry
    return {"command": " ".join(cmd), "results": dict(sorted(results.items()))}


# --------------------------------------------------------------------------------------------


def machine_info(spark):
    info = {
        "uname": " ".join(platform.uname()),
        "cpu_count": os.cpu_count(),
        "cpu_model": None,
        "mem_total_bytes": None,
        "python": sys.version.split()[0],
        "spark": spark.version,
        "java": spark._jvm.java.lang.System.getProperty("java.version"),
        "git_commit": run_text(["git", "rev-parse", "HEAD"], cwd=ROOT),
        "git_dirty": bool(run_text(["git", "status", "--porcelain"], cwd=ROOT)),
        "date_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "loadavg_start": os.getloadavg(),
    }
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
    for mod in ("numpy", "pyarrow", "safetensors"):
        try:
            info[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001
            pass
    return info


def executor_pid(app_id):
    """The pid of the executor JVM of application `app_id` (local-cluster: a child process)."""
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
        except OSError:
            continue
        if b"org.apache.spark.executor.CoarseGrainedExecutorBackend" in cmd and app_id.encode() in cmd:
            return int(d)
    return None


def memory_probe(args, jar, work):
    """Runs in its own process: a fresh `local-cluster[1, cores, …]` Spark, whose one executor is a
    JVM of its own (so the driver's job commit is not counted), runs noop_kv (control), then
    st_kv_f32, once each, with the RSS sampler on the executor JVM (and, for information, on the
    driver); prints the JSON result on stdout."""
    from pyspark.sql import SparkSession

    opts = "-XX:+UseG1GC" + (f" -Xms{args.executor_memory} -XX:+AlwaysPreTouch" if args.pretouch else "")
    spark = (
        SparkSession.builder.master(f"local-cluster[1,{args.cores},{mem_mb(args.executor_memory)}]")
        .appName("safetensors-spark-bench-memory-probe")
        .config("spark.jars", str(jar))
        .config("spark.driver.memory", args.driver_memory)
        .config("spark.executor.memory", args.executor_memory)
        .config("spark.executor.extraJavaOptions", opts)
        .config("spark.driver.extraJavaOptions", "-XX:+UseG1GC" + (f" -Xms{args.driver_memory} -XX:+AlwaysPreTouch" if args.pretouch else ""))
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        driver = int(spark._jvm.java.lang.ProcessHandle.current().pid())
        df = make_df(spark, args.rows, args.width, args.partitions)
        variants = write_variants(df, args)
        pid = executor_pid(spark.sparkContext.applicationId)
        if pid is None:
            raise RuntimeError("no executor JVM found for " + spark.sparkContext.applicationId)
        # Warm-up: a KV write of 1/20 of the rows loads and JIT-compiles the write path first, so
        # the measured write's growth is not one-time class loading and C2 compilation memory.
        warm = write_variants(make_df(spark, max(1, args.rows // 20), args.width, args.partitions), args)
        warm["st_kv_f32"][1](str(work / "probe-warmup"))
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            out = {"executor_pid": pid, "executor_cmdline": f.read().replace(b"\0", b" ").decode(errors="replace")}
        # Three full-size writes: the growth of one write depends on what the process's
        # allocators kept from the previous one (it varies by several MiB between runs); the
        # target is judged on the largest.
        for name in ("noop_kv", "st_kv_f32", "st_kv_f32#2", "st_kv_f32#3"):
            with RssSampler(pid) as s, RssSampler(driver) as d:
                t0 = time.perf_counter()
                variants[name.split("#")[0]][1](str(work / f"probe-{name.replace('#', '-')}"))
                elapsed = time.perf_counter() - t0
            out[name] = {"time_s": elapsed, **s.result(), "driver": d.result()}
        return out
    finally:
        spark.stop()


def mem_mb(size):
    """'1536m' / '2g' → megabytes."""
    unit = size[-1].lower()
    return int(size[:-1]) * (1024 if unit == "g" else 1) if unit in "gm" else int(size) // 2**20


def run_memory_probe(args, work):
    cmd = [sys.executable, __file__, "--memory-probe", "--rows", str(args.rows), "--width", str(args.width), "--cores", str(args.cores), "--partitions", str(args.partitions), "--driver-memory", args.driver_memory, "--executor-memory", args.executor_memory, "--workdir", str(work / "probe")]
    if args.jar:
        cmd += ["--jar", args.jar]
    if not args.pretouch:
        cmd.append("--no-pretouch")
    log("KV memory probe in a fresh JVM: " + " ".join(cmd[1:]))
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        log("memory probe failed: " + proc.stderr[-2000:])
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


def fmt(x, spec=".3f"):
    return "—" if x is None else format(x, spec)


def print_table(title, header, rows):
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) if rows else len(str(h)) for i, h in enumerate(header)]
    print(f"\n{title}")
    print("  ".join(str(h).ljust(w) for h, w in zip(header, widths)))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)))


def mark(ok):
    return "pass" if ok else "short"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=2, help="untimed rounds of every Spark write variant before the timed ones")
    ap.add_argument("--out", default="bench-results.json", help="JSON results file")
    ap.add_argument("--jar", default=None, help="connector jar (default: the one in jvm-connector/target)")
    ap.add_argument("--cores", type=int, default=2, help="local[N]")
    ap.add_argument("--partitions", type=int, default=None, help="partitions of the DataFrame (default: --cores)")
    ap.add_argument("--batch-size", type=int, default=4096, help="batch mode's batch_size")
    ap.add_argument("--driver-memory", default=None, help="default: scaled to the DataFrame, 3g..14g")
    ap.add_argument("--executor-memory", default=None, help="memory probe's executor JVM (default: as the driver)")
    ap.add_argument("--no-pretouch", dest="pretouch", action="store_false", help="do not pre-touch the heap (RSS growth then includes heap growth)")
    ap.add_argument("--workdir", default=None, help="where outputs go (default: a fresh temp dir, deleted at the end)")
    ap.add_argument("--keep", action="store_true", help="keep the outputs of the last repetition")
    ap.add_argument("--with-criterion", action="store_true", help="also run the Rust criterion benches")
    ap.add_argument("--criterion-time", type=float, default=3.0, help="criterion --measurement-time (s)")
    ap.add_argument("--memory-probe", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.partitions = args.partitions or args.cores
    if args.driver_memory is None:
        cached = args.rows * args.width * 12  # both columns, before any cache compression
        args.driver_memory = f"{min(14, max(3, math.ceil(cached * 1.5 / 2**30) + 2))}g"
    args.executor_memory = args.executor_memory or args.driver_memory
    jar = Path(args.jar) if args.jar else next(iter(sorted((ROOT / "jvm-connector" / "target").glob("safetensors-spark-*.jar"))), None)
    if jar is None or not jar.exists():
        sys.exit("no connector jar; build it with: mvn -B -q -f jvm-connector/pom.xml package -DskipTests")

    if args.memory_probe:
        work = Path(args.workdir)
        work.mkdir(parents=True, exist_ok=True)
        try:
            print(json.dumps(memory_probe(args, jar, work)))
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return

    criterion = None
    if args.with_criterion:
        criterion = run_criterion(args)  # before Spark starts: the JVM would compete for the cores

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="safetensors-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    log(f"outputs in {work}; driver memory {args.driver_memory}; pretouch {args.pretouch}")
    try:
        spark = build_spark(args, jar)
        spark.sparkContext.setLogLevel("ERROR")
        try:
            jvm_pid = int(spark._jvm.java.lang.ProcessHandle.current().pid())
            machine = machine_info(spark)
            t0 = time.perf_counter()
            df = make_df(spark, args.rows, args.width, args.partitions)
            gen_s = time.perf_counter() - t0
            log(f"DataFrame generated and cached in {gen_s:.1f} s")

            w_times, w_rss, out_bytes, kept, plain_sizes = run_writes(spark, df, args, work, jvm_pid)
            proj = {n: p for n, (p, _) in write_variants(df, args).items()}
            floor = floors(w_times, out_bytes, plain_sizes, proj)

            import pyarrow.parquet  # noqa: F401 - imported before timing, not inside the first load
            try:
                import safetensors_spark.torch  # noqa: F401 - imported before timing, like pyarrow
            except ImportError:
                pass

            r_times, r_errors = run_timed_round_robin(read_variants(spark, kept), args.reps, "read")
            c_variants = consumer_variants(kept, args.width)
            c_results = {}
            c_times, c_errors = run_timed_round_robin(c_variants, args.reps, "consumer", c_results)
            consumer_equal = check_consumer_equal(c_results)
            torch_available = bool(c_variants)
        finally:
            spark.stop()
        probe = run_memory_probe(args, work)  # after the main session is stopped
        machine["loadavg_end"] = os.getloadavg()
    finally:
        if not args.keep and not args.workdir:
            shutil.rmtree(work, ignore_errors=True)

    # ---------------------------------------------------------------- report
    med = {k: median(v) for k, v in w_times.items()}
    targets = []
    write_rows = []
    for name in w_times:
        fl = floor.get(name)
        ratio = med[name] / fl["floor_s"] if fl and med[name] else None
        tgt = WRITE_TARGETS.get(name)
        verdict = mark(ratio <= tgt) if (tgt and ratio is not None) else ""
        mb = out_bytes.get(name) or (plain_sizes.get(name))
        write_rows.append([name, fmt(med[name]), fmt(fl["floor_s"] if fl else None), fmt(ratio, ".2f"), f"≤ {tgt}× floor" if tgt else "", verdict, fmt(mb / 2**20 if mb else None, ".1f")])
        if tgt:
            targets.append({"target": f"{name} ≤ {tgt}× floor", "observed": ratio, "result": verdict})

    # KV memory target
    kv_batch, kv_batch_rows, kv_row_bytes = arrow_batch_bytes(args.rows, args.width, args.partitions, 4, key=True)
    concurrent = min(args.cores, args.partitions)
    kv_limit = 2 * kv_batch * concurrent
    mem_rows = []
    for name, rs in w_rss.items():
        a = [r["anon_peak_growth"] for r in rs]
        p = [r["peak_growth"] for r in rs]
        mem_rows.append([name, " ".join(f"{x / 2**20:.1f}" for x in p), fmt(max(a) / 2**20, ".1f"), fmt(rs[-1]["hwm_after"] / 2**20, ".0f")])
    kv_runs = [(probe or {}).get(n) for n in ("st_kv_f32", "st_kv_f32#2", "st_kv_f32#3")]
    kv_growth = max(r["peak_growth"] for r in kv_runs) if all(kv_runs) else None
    targets.append({
        "target": f"st_kv_f32 (target_shard_size_mb=1000) peak RSS growth of the executor JVM, largest of 3 writes, < 2 × Arrow batch × {concurrent} concurrent task(s) = {kv_limit / 2**20:.1f} MiB",
        "observed": kv_growth,
        "observed_text": f"{kv_growth / 2**20:.1f} MiB" if kv_growth is not None else "probe failed",
        "result": mark(kv_growth < kv_limit) if kv_growth is not None else "n/a (probe failed)",
        "arrow_batch_bytes": kv_batch,
        "arrow_batch_rows": kv_batch_rows,
        "control_noop_kv_peak_growth": (probe or {}).get("noop_kv", {}).get("peak_growth"),
        "repeat_peak_growth": [(probe or {}).get(n, {}).get("peak_growth") for n in ("st_kv_f32#2", "st_kv_f32#3")],
    })

    read_rows = []
    rmed = {k: median(v) for k, v in r_times.items()}
    for name in r_times:
        if name in r_errors:
            read_rows.append([name, "error: " + r_errors[name], "", ""])
        else:
            read_rows.append([name, fmt(rmed[name]), "", ""])
    st_read, pq_read = rmed.get("read_sum_st_batch_f32"), rmed.get("read_sum_parquet_uncompressed")
    if st_read is not None and pq_read is not None:
        targets.append({"target": "read_sum_st_batch_f32 ≤ read_sum_parquet_uncompressed", "observed": st_read / pq_read, "result": mark(st_read <= pq_read)})
    else:
        targets.append({"target": "read_sum_st_batch_f32 ≤ read_sum_parquet_uncompressed", "observed": None, "result": "n/a (a read failed)"})

    cmed = {k: median(v) for k, v in c_times.items()}
    cons_rows = [[n, fmt(cmed[n]) if n not in c_errors else "error: " + c_errors[n]] for n in c_times]
    if not torch_available:
        cons_rows.append(["epoch_*", "skipped (safetensors_spark.torch not importable)"])

    crit_rows = []
    if criterion:
        res = criterion["results"]
        for full_id, e in res.items():
            group, _, name = full_id.partition("/")
            if "gb_per_s" in e:
                if name == "memcpy":
                    continue  # shown next to its conversion
                memcpy = res.get(f"{group}/memcpy", {}).get("gb_per_s")
                is_rne = group in RNE_BENCHES
                verdict = mark(e["gb_per_s"] >= RNE_TARGET_GBPS) if is_rne else ""
                crit_rows.append([group, fmt(e["gb_per_s"], ".2f"), fmt(memcpy, ".2f"), f"≥ {RNE_TARGET_GBPS} GB/s" if is_rne else "", verdict])
                if is_rne:
                    targets.append({"target": f"{group} (RNE) ≥ {RNE_TARGET_GBPS} GB/s per core", "observed": e["gb_per_s"], "result": verdict})
            else:
                per = f" ({e['median_ns'] / e['elements']:.0f} ns/tensor)" if e.get("elements") else ""
                crit_rows.append([full_id, f"{e['median_ns'] / 1e3:.1f} µs{per}", "", "", ""])

    print(f"\nsafetensors-spark benchmark: {args.rows} rows × {args.width}, reps {args.reps}, local[{args.cores}], {args.partitions} partitions, batch_size {args.batch_size}")
    print(f"{machine['date_utc']}  commit {machine['git_commit']}{' (dirty)' if machine['git_dirty'] else ''}  {machine['cpu_count']} cpus  load {machine['loadavg_start'][0]:.2f}→{machine['loadavg_end'][0]:.2f}")
    print_table("Writes (median of reps; floor = noop of the same columns + plain write of the output bytes)", ["variant", "median s", "floor s", "÷ floor", "target", "result", "output MiB"], write_rows)
    print_table("Executor (driver JVM) RSS during writes, MiB", ["variant", "peak growth per rep", "max RssAnon growth", "VmHWM after"], mem_rows)
    print("  (heap pre-touched; native memory freed by one variant stays in RSS and is reused by later ones)")
    if probe:
        print_table("KV memory probe (a fresh local-cluster executor JVM after a small warm-up write: noop_kv, then st_kv_f32 three times; the target is judged on the largest), MiB", ["variant", "time s", "peak RSS growth", "RssAnon growth", "VmHWM before → after"], [[n, fmt(r["time_s"]), fmt(r["peak_growth"] / 2**20, ".1f"), fmt(r["anon_peak_growth"] / 2**20, ".1f"), f"{r['hwm_before'] / 2**20:.0f} → {r['hwm_after'] / 2**20:.0f}"] for n, r in probe.items() if n.startswith(("noop_kv", "st_kv_f32"))])
    print(f"  KV Arrow batch: {kv_batch_rows} rows × {kv_row_bytes:.0f} B = {kv_batch / 2**20:.2f} MiB per task; {concurrent} concurrent task(s)")
    print_table("Reads (Spark: sum over all elements of xf)", ["variant", "median s", "", ""], read_rows)
    print_table(f"Consumer side (one shuffled epoch, batches of {BATCH} into torch, in-process; outputs of the last rep, warm page cache; same samples: {consumer_equal}; with DataLoader workers and other loaders: epoch.sh)", ["variant", "median s"], cons_rows)
    if criterion:
        print_table("Rust microbenchmarks (criterion median, one thread; GB/s = 10^9 bytes of input per s)", ["bench", "convert GB/s", "memcpy GB/s (same bytes)", "target", "result"], crit_rows)
    print_table("Targets", ["target", "observed", "result"], [[t["target"], t.get("observed_text") or fmt(t["observed"], ".3g"), t["result"]] for t in targets])

    results = {
        "machine": machine,
        "command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:]),
        "parameters": {k: v for k, v in vars(args).items()},
        "dataframe_generate_and_cache_s": gen_s,
        "constants": {"arrow_max_rows": ARROW_MAX_ROWS, "arrow_max_bytes": ARROW_MAX_BYTES, "plain_write_chunk": PLAIN_CHUNK},
        "writes": {n: {"times_s": w_times[n], "median_s": med[n], "output_bytes": out_bytes.get(n) or plain_sizes.get(n), "floor": floor.get(n), "rss": w_rss.get(n)} for n in w_times},
        "reads": {n: {"times_s": r_times[n], "median_s": rmed.get(n), "error": r_errors.get(n)} for n in r_times},
        "consumer": {"torch_available": torch_available, "same_samples": consumer_equal, **{n: {"times_s": c_times[n], "median_s": cmed.get(n), "error": c_errors.get(n)} for n in c_times}},
        "criterion": criterion,
        "kv_memory_probe": probe,
        "targets": targets,
    }
    Path(args.out).write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(f"\nJSON: {args.out}")


if __name__ == "__main__":
    main()
