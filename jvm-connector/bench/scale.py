"""How a dataset's costs grow with its versions and its shards (issue 38 items 5-6;
spec/performance.md §14). Run it through scale.sh, which builds what it needs.

Datasets are synthetic and built fast: a real one-row dataset written by Spark is the template,
and `rust-core/dataset/examples/log_scale.rs` makes versions and shards from it (every shard a
hard link of the template's shard under its own name; every version a real commit through
`dataset::local`'s `latest_head` / `commit_changes` / `publish_changes`, so the log holds
whatever the commit code writes).

Parts (--parts, default all):
  commit  versions V (one shard added per version): per commit (a) find the newest version and
          read its head (probes from the version committed before, its entry) + create the log
          entry, (b) publish dataset_manifest.json (the base's, changed); `_manifest_log/` bytes,
          manifest bytes; then real Spark appends on top of the largest datasets
  open    open_dataset(path) and the loader's first batch, local, at the shard counts and
          version counts (a fresh Python process each)
  remote  the same on the shaped S3 server of remote.sh (25 ms per request, its tc shaping, in
          `unshare -n`): seconds and the server's request count
  spark   Spark's plan (load + the scan's partitions), one-row appends (--spark-appends, the
          median), a count, a versionAsOf=1 read, a vacuum and a compaction (on hard-link
          copies), each with the driver's heap
  delta   Delta Lake (delta-spark from Maven Central): per-commit time and `_delta_log/` bytes for
          the same appends (one one-row file per commit, df.write.format("delta")), and its plan
          time and heap at the shard counts (tables made by CONVERT TO DELTA over hard links of
          one one-row Parquet file). Its appends take 0.2-0.3 s each here: 10,000 of them take
          about an hour, so --delta-resume continues the table a run left in --workdir (build
          it in the background, `scale.py delta-role --delta-commits 9995 --shards '' --delta-resume`,
          then time the last appends with `--parts delta --delta-commits 10000 --delta-resume
          --shards '' --keep` on an idle machine)

Driver heap (method): before each action System.gc() and every heap pool's peak is reset; after
it, `old_peak_mib` = the old generation's peak (G1 puts objects that survive a young collection
and every humongous object, such as a large manifest string, there) minus the old generation's
use before; `retained_mib` = heap used after another System.gc() minus before, with the result
(DataFrame, plan) still referenced. Eden's churn is not counted: garbage that dies young costs
time, not the bound on the driver's memory.
"""
import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
EXAMPLE = Path(os.environ.get("SCALE_LOG_SCALE_BIN", ROOT / "target" / "release" / "examples" / "log_scale"))
PARTS = ["commit", "open", "remote", "spark", "delta"]
DELTA_PACKAGE = "io.delta:delta-spark_2.13:4.0.1"  # Delta 4.0.x: built for Spark 4.0.x


def log(msg):
    print(f"[scale {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def dir_bytes(d):
    d = Path(d)
    if not d.is_dir():
        return 0, 0
    files = [p for p in d.iterdir() if p.is_file()]
    return sum(p.stat().st_size for p in files), len(files)


def ints(s):
    return [int(x) for x in s.split(",") if x]


def jar_path():
    jars = glob.glob(str(ROOT / "jvm-connector" / "target" / "safetensors-spark-*.jar"))
    jars = [j for j in jars if not j.endswith(("-sources.jar", "-javadoc.jar"))]
    assert len(jars) == 1, jars
    return jars[0]


def spark_session(driver_memory, delta=False):
    from pyspark.sql import SparkSession

    b = (SparkSession.builder.master("local[2]").appName("scale-bench")
         .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
         .config("spark.driver.memory", driver_memory)
         .config("spark.sql.shuffle.partitions", "2"))
    if delta:
        b = (b.config("spark.jars.packages", DELTA_PACKAGE)
             .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
             .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
             .config("spark.databricks.delta.snapshotPartitions", "2"))
    else:
        b = b.config("spark.jars", jar_path())
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


class Heap:
    """The driver JVM's heap around one action (the method: the module docstring)."""

    def __init__(self, spark):
        jvm = spark.sparkContext._jvm
        self.jvm = jvm
        mf = jvm.java.lang.management.ManagementFactory
        self.mem = mf.getMemoryMXBean()
        self.pools = [p for p in mf.getMemoryPoolMXBeans() if p.getType().toString() == "Heap memory"]
        self.old = [p for p in self.pools if "Old" in p.getName() or "Tenured" in p.getName()]
        self.max_mib = jvm.java.lang.Runtime.getRuntime().maxMemory() / 2**20

    def measure(self, fn):
        self.jvm.java.lang.System.gc()
        for p in self.pools:
            p.resetPeakUsage()
        used0 = self.mem.getHeapMemoryUsage().getUsed()
        old0 = sum(p.getUsage().getUsed() for p in self.old)
        t0 = time.perf_counter()
        err = None
        try:
            result = fn()
        except Exception as e:  # noqa: BLE001 - an OOM or a failure is a result here
            java = getattr(e, "java_exception", None)
            text = java.toString() if java is not None else str(e)
            result, err = None, f"{type(e).__name__}: {text.splitlines()[0][:400] if text else ''}"
        secs = time.perf_counter() - t0
        old_peak = sum(p.getPeakUsage().getUsed() for p in self.old)
        self.jvm.java.lang.System.gc()
        used1 = self.mem.getHeapMemoryUsage().getUsed()
        out = {"s": round(secs, 3), "old_peak_mib": round((old_peak - old0) / 2**20, 1),
               "retained_mib": round((used1 - used0) / 2**20, 1)}
        if err:
            out["error"] = err
        del result
        return out


# ============================================================================================
# Building the datasets


def make_template(spark, path, batch_size):
    """A one-row batch dataset (batch_size rows a full shard; the one row makes a partial one, so
    a compaction has shards to merge)."""
    from pyspark.sql import functions as F

    shutil.rmtree(path, ignore_errors=True)
    (spark.range(1, numPartitions=1).select(F.array(*[F.col("id").cast("float")] * 4).alias("x"))
     .write.format("safetensors").option("batch_size", batch_size).save(str(path)))


def log_scale(template, d, versions, first_shards=1, measure_at=(), samples=5, snapshot=False):
    cmd = [str(EXAMPLE), "--template", str(template), "--dir", str(d), "--versions", str(versions),
           "--first-shards", str(first_shards), "--samples", str(samples)]
    if measure_at:
        cmd += ["--measure-at", ",".join(map(str, measure_at))]
    if snapshot:
        cmd.append("--snapshot")
    run = subprocess.run(["nice", "-n", "5", *cmd], check=True, capture_output=True, text=True)
    return [json.loads(line) for line in run.stdout.splitlines() if line.strip()]


def build_shard_sets(args, template):
    out = {}
    for n in args.shards:
        d = Path(args.workdir) / f"shards-{n}"
        if not (d / "dataset_manifest.json").exists():
            shutil.rmtree(d, ignore_errors=True)
            shutil.rmtree(f"{d}.links", ignore_errors=True)
            t0 = time.perf_counter()
            log(f"building {n} shards (1 version)")
            log_scale(template, d, 1, first_shards=n)
            log(f"  built in {time.perf_counter() - t0:.1f} s")
        out[n] = d
    return out


def version_sets(args):
    base = Path(args.workdir) / "versions"
    return {v: Path(f"{base}.v{v}") for v in args.versions}


# ============================================================================================
# Parts


def part_commit(args, spark, template, results):
    base = Path(args.workdir) / "versions"
    for p in glob.glob(f"{base}*"):
        shutil.rmtree(p)
    top = max(args.versions)
    log(f"commits: building {top} versions, timing {args.samples} commits before each of {args.versions}")
    points = log_scale(template, base, top, measure_at=args.versions, samples=args.samples, snapshot=True)
    for p in points:
        log(f"  v={p['versions']}: read base {p.get('read_base_s', 0)*1e3:.1f} ms, commit "
            f"{p.get('commit_s', 0)*1e3:.1f} ms, publish {p.get('publish_s', 0)*1e3:.1f} ms, log "
            f"{p['log_bytes']/2**20:.1f} MiB, manifest {p['manifest_bytes']/2**10:.1f} KiB")
    results["commit"] = points
    # the log-size target: after 200 appends of one shard, log <= 10x the final manifest
    if 201 <= top:
        d = Path(args.workdir) / "log200"
        shutil.rmtree(d, ignore_errors=True)
        shutil.rmtree(f"{d}.links", ignore_errors=True)
        p = log_scale(template, d, 201, samples=1)[-1]
        results["log_after_200_appends"] = {**p, "ratio": round(p["log_bytes"] / p["manifest_bytes"], 1)}
        shutil.rmtree(d)
        shutil.rmtree(f"{d}.links")
        log(f"  after 200 appends: log {p['log_bytes']} B, manifest {p['manifest_bytes']} B, "
            f"ratio {results['log_after_200_appends']['ratio']}")
    # real Spark appends on top of the two largest version counts (and the smallest, to compare)
    df = one_row(spark)
    appends = {}
    for v in sorted({min(args.versions), *sorted(args.versions)[-2:]}):
        d = version_sets(args)[v]
        work = Path(f"{d}.appends")
        shutil.rmtree(work, ignore_errors=True)
        subprocess.run(["cp", "-al", str(d), str(work)], check=True)
        times = []
        for _ in range(args.spark_appends):
            t0 = time.perf_counter()
            df.write.format("safetensors").option("batch_size", args.batch_size).mode("append").save(str(work))
            times.append(round(time.perf_counter() - t0, 3))
        shutil.rmtree(work)
        appends[v] = {"append_s": times, "median_s": statistics.median(times)}
        log(f"  spark appends on {v} versions: {times}")
    results["spark_appends"] = appends


OPEN_SNIPPET = r"""
import json, os, sys, time
t0 = time.perf_counter()
from safetensors_spark import open_dataset
from safetensors_spark.torch import SafetensorsIterableDataset, loader
imp = time.perf_counter() - t0
opts = json.loads(sys.argv[2])
t0 = time.perf_counter()
ds = open_dataset(sys.argv[1], **opts)
open_s = time.perf_counter() - t0
t1 = time.perf_counter()
it = iter(loader(SafetensorsIterableDataset(ds, batch_size=8, shuffle=True, seed=0), num_workers=0))
next(it)
print(json.dumps({"open_s": round(open_s, 3), "first_batch_s": round(time.perf_counter() - t1, 3),
                  "rows": len(ds)}))
"""


def open_once(path, opts=None, timeout=None, env=None):
    try:
        run = subprocess.run([sys.executable, "-c", OPEN_SNIPPET, str(path), json.dumps(opts or {})],
                             capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    if run.returncode != 0:
        return {"error": run.stderr.strip().splitlines()[-1][:300] if run.stderr.strip() else f"rc {run.returncode}"}
    return json.loads(run.stdout.strip().splitlines()[-1])


def part_open(args, shard_sets, results):
    out = {"shards": {}, "versions": {}}
    for n, d in shard_sets.items():
        out["shards"][n] = open_once(d)
        log(f"open local, {n} shards: {out['shards'][n]}")
    for v, d in version_sets(args).items():
        if d.exists():
            out["versions"][v] = open_once(d)
            log(f"open local, {v} versions: {out['versions'][v]}")
    results["open_local"] = out


def part_remote(args, shard_sets, results):
    server = HERE / "target" / "s3server"
    cmd = ["unshare", "-n", "--", "bash", "-c", 'ip link set lo up && exec "$@"', "bash",
           sys.executable, str(Path(__file__).resolve()), "remote-role", "--server", str(server),
           "--delay-ms", str(args.delay_ms), "--rate-mbit", str(args.rate_mbit),
           "--remote-timeout", str(args.remote_timeout),
           "--sets", json.dumps({str(n): str(d) for n, d in shard_sets.items()})]
    run = subprocess.run(cmd, capture_output=True, text=True)
    sys.stderr.write(run.stderr[-4000:])
    if run.returncode != 0:
        results["open_remote"] = {"error": f"remote role failed (rc {run.returncode})"}
        return
    results["open_remote"] = json.loads(run.stdout.strip().splitlines()[-1])


def role_remote(args):
    """Inside `unshare -n`: the S3 server of remote.sh, the loopback shaped as remote.sh does,
    each shard set uploaded unshaped and without delay, then opened with the delay on."""
    import threading

    sys.path.insert(0, str(HERE))
    import remote as R  # noqa: E402 - remote.sh's server, PUT and shaping

    if not R.in_private_netns():
        sys.exit("scale.py remote-role shapes the loopback: run it through scale.sh (unshare -n)")
    os.environ.update(R.CREDS)
    srv = R.Server(args.server, delay_ms=0)
    out = {"delay_ms": args.delay_ms, "rate_mbit": args.rate_mbit}
    try:
        for n, d in json.loads(args.sets).items():
            d = Path(d)
            files = [p for p in d.rglob("*") if p.is_file()]
            todo, lock = list(files), threading.Lock()

            def work():
                while True:
                    with lock:
                        if not todo:
                            return
                        p = todo.pop()
                    R.put(srv.addr, f"s{n}/{p.relative_to(d)}", p)

            t0 = time.perf_counter()
            ts = [threading.Thread(target=work) for _ in range(8)]
            [t.start() for t in ts]
            [t.join() for t in ts]
            log(f"remote: uploaded {len(files)} files of {n} shards in {time.perf_counter() - t0:.1f} s")
            R.shape(args.rate_mbit, "256kb")
            srv.set_delay(args.delay_ms)
            srv.reset()
            env = dict(os.environ)
            r = open_once(f"s3://{R.BUCKET}/s{n}", {"storage_options": R.s3_options(srv.endpoint)},
                          timeout=args.remote_timeout, env=env)
            st = srv.stats()
            r.update({"requests": st["requests"], "gets": st["gets"], "bytes_out": st["bytes_out"]})
            out[n] = r
            log(f"remote open, {n} shards: {r}")
            R.unshape()
            srv.set_delay(0)
    finally:
        srv.stop()
    print(json.dumps(out))


def copy_of(d, name):
    c = Path(f"{d}.{name}")
    shutil.rmtree(c, ignore_errors=True)
    subprocess.run(["cp", "-al", str(d), str(c)], check=True)
    return c


def spark_measure(args, spark, heap, d, label, with_compaction):
    """Plan, count, versionAsOf=1, vacuum and compaction on dataset `d`."""
    jvm = spark.sparkContext._jvm
    r = {}

    def plan():
        df = spark.read.format("safetensors").load(str(d))
        return df, df._jdf.queryExecution().toRdd().getNumPartitions()

    r["plan"] = heap.measure(plan)
    # one-row appends on a copy (the commit's cost at this size: spec/performance.md §14.1)
    a = copy_of(d, "append")
    runs = [heap.measure(lambda: one_row(spark).write.format("safetensors")
                         .option("batch_size", args.batch_size).mode("append").save(str(a)))
            for _ in range(args.spark_appends)]
    shutil.rmtree(a)
    r["append"] = {"s": statistics.median(x["s"] for x in runs), "append_s": [x["s"] for x in runs],
                   "old_peak_mib": max(x["old_peak_mib"] for x in runs)}
    errors = [x["error"] for x in runs if "error" in x]
    if errors:
        r["append"]["error"] = errors[0]
    df = spark.read.format("safetensors").load(str(d))
    r["partitions"] = df._jdf.queryExecution().toRdd().getNumPartitions()
    r["count"] = heap.measure(lambda: df.count())
    r["version_as_of_1"] = heap.measure(
        lambda: spark.read.format("safetensors").option("versionAsOf", 1).load(str(d))
        ._jdf.queryExecution().toRdd().getNumPartitions())
    v = copy_of(d, "vacuum")
    r["vacuum"] = heap.measure(lambda: jvm.io.safetensors.spark.Vacuum.vacuum(
        spark._jsparkSession, str(v)).collect())
    shutil.rmtree(v)
    if with_compaction:
        c = copy_of(d, "compact")
        r["compaction"] = heap.measure(lambda: jvm.io.safetensors.spark.Compaction.compact(
            spark._jsparkSession, str(c)).collect())
        shutil.rmtree(c)
    else:
        r["compaction"] = {"skipped": f"more than --compact-max-shards={args.compact_max_shards} shards"}
    log(f"spark, {label}: " + ", ".join(f"{k} {x.get('s', x) if isinstance(x, dict) else x}" for k, x in r.items()))
    return r


def one_row(spark):
    """A one-row DataFrame of the synthetic datasets' column (a float[4] `x`)."""
    from pyspark.sql import functions as F

    return spark.range(1, numPartitions=1).select(F.array(*[F.col("id").cast("float")] * 4).alias("x"))


def part_spark(args, spark, shard_sets, results):
    heap = Heap(spark)
    out = {"driver_max_heap_mib": round(heap.max_mib), "shards": {}, "versions": {}}
    # warm-up: the classes of every path loaded and compiled once before anything is timed
    spark_measure(args, spark, heap, shard_sets[min(shard_sets)], "warm-up", True)
    for n, d in shard_sets.items():
        out["shards"][n] = spark_measure(args, spark, heap, d, f"{n} shards", n <= args.compact_max_shards)
    for v, d in version_sets(args).items():
        if d.exists():
            out["versions"][v] = spark_measure(args, spark, heap, d, f"{v} versions", v <= args.compact_max_shards)
    results["spark"] = out


def part_delta(args, results):
    cmd = [sys.executable, str(Path(__file__).resolve()), "delta-role", "--workdir", args.workdir,
           "--delta-commits", ",".join(map(str, args.delta_commits)), "--samples", str(args.samples),
           "--shards", ",".join(map(str, args.shards)), "--driver-memory", args.driver_memory]
    cmd += ["--delta-resume"] if args.delta_resume else []
    run = subprocess.run(["nice", "-n", "5", *cmd], capture_output=True, text=True)
    sys.stderr.write(run.stderr[-6000:])
    lines = [ln for ln in run.stdout.strip().splitlines() if ln.startswith("{")]
    if run.returncode != 0:
        results["delta"] = {"error": f"delta role failed (rc {run.returncode}): "
                                     f"{run.stderr.strip().splitlines()[-1][:300] if run.stderr.strip() else ''}"}
        if lines:
            results["delta"].update(json.loads(lines[-1]))
        return
    results["delta"] = json.loads(lines[-1])


def role_delta(args):
    import pyarrow as pa
    import pyarrow.parquet as pq

    spark = spark_session(args.driver_memory, delta=True)
    from pyspark.sql import functions as F

    out = {"package": DELTA_PACKAGE, "commits": [], "plan": {}}
    d = Path(args.workdir) / "delta-commits"
    if not args.delta_resume:
        shutil.rmtree(d, ignore_errors=True)
    df = spark.range(1, numPartitions=1).select(F.array(*[F.col("id").cast("float")] * 4).alias("x"))
    # --delta-resume continues the table a run left (commits are 0.2-0.5 s each here: 10,000 of
    # them take an hour or more, so they are built in one run and timed at the end in another)
    n = len(list((d / "_delta_log").glob("[0-9]" * 20 + ".json"))) if d.exists() else 0
    out["resumed_at"], t_start = n, time.perf_counter()
    for point in sorted(p for p in args.delta_commits if p > n):
        times = []
        while n < point:
            t0 = time.perf_counter()
            df.write.format("delta").mode("append").save(str(d))
            n += 1
            if point - n < args.samples:
                times.append(time.perf_counter() - t0)
        b, f = dir_bytes(d / "_delta_log")
        ckpt = sum(p.stat().st_size for p in (d / "_delta_log").glob("*.checkpoint*.parquet"))
        last_json = (d / "_delta_log" / f"{n - 1:020}.json").stat().st_size
        p = {"commits": n, "append_s": round(statistics.median(times), 4), "append_s_all": [round(t, 4) for t in times],
             "log_bytes": b, "log_files": f, "checkpoint_bytes": ckpt, "last_commit_json_bytes": last_json,
             "build_s": round(time.perf_counter() - t_start, 1)}
        out["commits"].append(p)
        log(f"delta: {p}")
    if not args.delta_resume:
        shutil.rmtree(d)
    print(json.dumps(out), flush=True)  # the commits' figures, should a plan below fail
    # plan at the shard counts: CONVERT TO DELTA over hard links of one one-row Parquet file
    heap = Heap(spark)
    one = Path(args.workdir) / "one.parquet"
    pq.write_table(pa.table({"x": pa.array([[0.0, 0.0, 0.0, 0.0]], pa.list_(pa.float32()))}), one)
    first = True
    for n in sorted(args.shards):
        t = Path(args.workdir) / f"delta-{n}"
        if not (t / "_delta_log").exists():
            shutil.rmtree(t, ignore_errors=True)
            t.mkdir(parents=True)
            for i in range(n):
                # a file system bounds the links to one file (ext4: 65,000): a copy per 10,000
                src = Path(args.workdir) / f"one-{i // 10000}.parquet"
                if not src.exists():
                    shutil.copy(one, src)
                os.link(src, t / f"part-{i:06}.parquet")
            t0 = time.perf_counter()
            spark.sql(f"CONVERT TO DELTA parquet.`{t}` NO STATISTICS")
            log(f"delta: converted {n} files in {time.perf_counter() - t0:.1f} s")

        def plan():
            x = spark.read.format("delta").load(str(t))
            return x, x._jdf.queryExecution().toRdd().getNumPartitions()

        if first:  # warm-up
            heap.measure(plan)
            first = False
        r = {"plan": heap.measure(plan)}
        x = spark.read.format("delta").load(str(t))
        r["count"] = heap.measure(lambda: x.count())
        r["log_bytes"] = dir_bytes(t / "_delta_log")[0]
        out["plan"][n] = r
        log(f"delta plan, {n} files: {r}")
    spark.stop()
    print(json.dumps(out))


# ============================================================================================
# Report


def table(results):
    lines = []
    c = results.get("commit")
    if c:
        lines += ["", "commits (one shard per version; ms = median of the timed commits)",
                  f"{'versions':>8} {'read base':>10} {'commit':>10} {'publish':>10} {'log MiB':>9} "
                  f"{'manifest KiB':>12} {'log/manifest':>12}"]
        for p in c:
            lines.append(f"{p['versions']:>8} {p.get('read_base_s', 0)*1e3:>8.1f}ms {p.get('commit_s', 0)*1e3:>8.1f}ms "
                         f"{p.get('publish_s', 0)*1e3:>8.1f}ms {p['log_bytes']/2**20:>9.2f} "
                         f"{p['manifest_bytes']/2**10:>12.1f} {p['log_bytes']/max(p['manifest_bytes'], 1):>12.1f}")
    for key, title in (("spark_appends", "real Spark appends (s)"),):
        if key in results:
            lines += ["", title] + [f"  on {v} versions: {x['append_s']}" for v, x in results[key].items()]
    d = results.get("delta", {})
    if d.get("commits"):
        lines += ["", "Delta: appends (df.write.format('delta').mode('append'), one row)",
                  f"{'commits':>8} {'append':>10} {'log MiB':>9} {'checkpoint KiB':>14}"]
        for p in d["commits"]:
            lines.append(f"{p['commits']:>8} {p['append_s']*1e3:>8.1f}ms {p['log_bytes']/2**20:>9.2f} "
                         f"{p['checkpoint_bytes']/2**10:>14.1f}")
    ol, orr = results.get("open_local", {}), results.get("open_remote", {})
    if ol or orr:
        lines += ["", "open (s) and first batch (s); remote: requests",
                  f"{'shards':>8} {'local open':>10} {'first':>8} {'remote open':>11} {'first':>8} {'requests':>9}"]
        for n in sorted({*map(int, ol.get("shards", {})), *[int(k) for k in orr if k.isdigit()]}):
            lo, ro = ol.get("shards", {}).get(n) or ol.get("shards", {}).get(str(n)) or {}, orr.get(str(n)) or orr.get(n) or {}
            lines.append(f"{n:>8} {lo.get('open_s', '-'):>10} {lo.get('first_batch_s', '-'):>8} "
                         f"{ro.get('open_s', ro.get('error', '-'))!s:>11} {ro.get('first_batch_s', '-'):>8} "
                         f"{ro.get('requests', '-'):>9}")
        for v, lo in ol.get("versions", {}).items():
            lines.append(f"{str(v) + ' ver':>8} {lo.get('open_s', '-'):>10} {lo.get('first_batch_s', '-'):>8}")
    s = results.get("spark")
    if s:
        lines += ["", f"Spark (driver -Xmx {s['driver_max_heap_mib']} MiB): seconds / old-gen peak MiB",
                  f"{'dataset':>12} {'plan':>14} {'append':>14} {'count':>14} {'versionAsOf':>14} "
                  f"{'vacuum':>14} {'compaction':>14}"]

        def cell(x):
            if not isinstance(x, dict) or "s" not in x:
                return "-"
            return ("ERR " if "error" in x else "") + f"{x['s']:.2f}/{x['old_peak_mib']:.0f}"
        for kind in ("shards", "versions"):
            for n, r in s[kind].items():
                lines.append(f"{str(n) + ' ' + kind[0]:>12} {cell(r['plan']):>14} "
                             f"{cell(r.get('append')):>14} {cell(r['count']):>14} "
                             f"{cell(r['version_as_of_1']):>14} {cell(r['vacuum']):>14} {cell(r['compaction']):>14}")
    if d.get("plan"):
        lines += ["", "Delta plan at N files: seconds / old-gen peak MiB (ours: the 'shards' rows above)"]
        for n, r in d["plan"].items():
            lines.append(f"{n:>12} plan {r['plan']['s']:.2f}/{r['plan']['old_peak_mib']:.0f}  "
                         f"count {r['count']['s']:.2f}  log {r['log_bytes']/2**20:.2f} MiB")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("role", nargs="?", default="run", choices=["run", "remote-role", "delta-role"])
    ap.add_argument("--quick", action="store_true", help="small sizes: a smoke test of every part in a few minutes")
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {','.join(PARTS)}")
    ap.add_argument("--versions", type=ints, default=[100, 1000, 10000])
    ap.add_argument("--shards", type=ints, default=[1000, 10000, 100000])
    ap.add_argument("--delta-commits", type=ints, default=[100, 1000, 10000])
    ap.add_argument("--delta-resume", action="store_true",
                    help="continue the Delta table of appends left in --workdir (and keep it)")
    ap.add_argument("--samples", type=int, default=5, help="timed commits before each point")
    ap.add_argument("--spark-appends", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--compact-max-shards", type=int, default=10000)
    ap.add_argument("--remote-timeout", type=int, default=300, help="seconds one remote open may take")
    ap.add_argument("--delay-ms", type=float, default=25.0)
    ap.add_argument("--rate-mbit", type=int, default=800)
    ap.add_argument("--driver-memory", default="2g")
    ap.add_argument("--workdir", default="/tmp/scale-bench")
    ap.add_argument("--keep", action="store_true", help="keep the workdir's datasets")
    ap.add_argument("--out", default=str(HERE / "scale-results.json"))
    ap.add_argument("--label", default="", help="recorded in the JSON (e.g. 'before the delta log')")
    ap.add_argument("--server", help=argparse.SUPPRESS)
    ap.add_argument("--sets", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role == "remote-role":
        return role_remote(args)
    if args.role == "delta-role":
        return role_delta(args)
    if args.quick:
        args.versions, args.shards, args.delta_commits = [20, 100], [100, 1000], [20, 50]
        args.samples, args.spark_appends, args.remote_timeout = 3, 2, 120
    parts = [p for p in args.parts.split(",") if p]
    bad = set(parts) - set(PARTS)
    if bad:
        sys.exit(f"--parts: unknown {sorted(bad)}; allowed: {','.join(PARTS)}")
    os.makedirs(args.workdir, exist_ok=True)
    git = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    results = {"label": args.label, "git": git.stdout.strip(), "date": time.strftime("%Y-%m-%d %H:%M"),
               "cores": os.cpu_count(), "args": {k: v for k, v in vars(args).items() if k not in ("server", "sets")}}
    t_all = time.perf_counter()
    spark = None
    if {"commit", "spark", "open", "remote"} & set(parts):
        spark = spark_session(args.driver_memory)
        template = Path(args.workdir) / "template"
        make_template(spark, template, args.batch_size)
    try:
        if "commit" in parts:
            part_commit(args, spark, template, results)
        shard_sets = build_shard_sets(args, template) if {"open", "remote", "spark"} & set(parts) else {}
        if "open" in parts:
            part_open(args, shard_sets, results)
        if "remote" in parts:
            part_remote(args, shard_sets, results)
        if "spark" in parts:
            part_spark(args, spark, shard_sets, results)
    finally:
        if spark is not None:
            spark.stop()
    if "delta" in parts:
        part_delta(args, results)
    results["total_s"] = round(time.perf_counter() - t_all, 1)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    print(table(results))
    log(f"wrote {args.out}")
    if not args.keep:
        shutil.rmtree(args.workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
