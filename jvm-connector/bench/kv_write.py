"""KV write against Spark Parquet (snappy) on the same DataFrame, in CPU time as well as wall time.

    source tests/setup-env.sh
    $PYTHON jvm-connector/bench/kv_write.py [--data bench|epoch] [--rows N] [--width W] [--reps R]

One local Spark (`local[2]`, 2 partitions). The DataFrame is generated and cached first:
`--data bench` is run.sh's (`key` = 'k<id>', `xf` = W floats; default 200,000 rows × 64), `--data
epoch` is epoch.py's (`key`, `embedding` 256 floats, `image` 3,072 bytes written as U8 [3,32,32],
`label`; default 40,000 rows). Variants, all over the same cached columns:

* `st_kv`: `format("safetensors")`, `name_col=key`, `target_shard_size_mb=1000`;
* `parquet_kv`: `write.parquet` (snappy, Spark's default) of the same columns, the key included;
* `st_batch`: the same tensor columns in batch mode (the bytes without the keys);
* `noop_kv`: Spark's `noop` sink: the cost of producing the rows.

After `--warmup` untimed rounds, `--reps` rounds in rotating order, each action after a `sync()`.
For each action: wall time, and the CPU time (user + system) of the JVM process — the machine is
shared, CPU time is what the write costs whoever else runs — split by thread group from
`/proc/<pid>/task/*/stat` (task threads, JIT compilers, GC, the writer's sealer threads, other).
Prints medians and the ratios KV ÷ Parquet in wall and in CPU; `--out` writes them as JSON.
Results: spec/performance.md §10.6.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

TICK = os.sysconf("SC_CLK_TCK")


def thread_group(name):
    if name.startswith("Executor task"):
        return "tasks"
    if name.startswith(("C1 Compiler", "C2 Compiler")):
        return "jit"
    if name.startswith(("GC Thread", "G1 ")):
        return "gc"
    if name.startswith("st-seal"):
        return "sealer"
    return "other"


def thread_cpu(pid):
    """thread id -> (group, CPU seconds) of every live thread of `pid`."""
    out = {}
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = Path(f"/proc/{pid}/task/{t}/stat").read_text()
            name = Path(f"/proc/{pid}/task/{t}/comm").read_text().strip()
        except OSError:
            continue
        f = stat[stat.rfind(")") + 2:].split()
        out[t] = (thread_group(name), (int(f[11]) + int(f[12])) / TICK)
    return out


def process_cpu(pid):
    f = Path(f"/proc/{pid}/stat").read_text()
    f = f[f.rfind(")") + 2:].split()
    return (int(f[11]) + int(f[12])) / TICK


def measure(pid, action):
    """Runs action(); returns wall s, process CPU s and CPU s per thread group (threads that
    ended during the action count in the process total only, as "ended")."""
    os.sync()
    before, p0 = thread_cpu(pid), process_cpu(pid)
    t0 = time.perf_counter()
    action()
    wall = time.perf_counter() - t0
    after, p1 = thread_cpu(pid), process_cpu(pid)
    groups = {}
    for t, (g, c) in after.items():
        groups[g] = groups.get(g, 0.0) + c - before.get(t, (g, 0.0))[1]
    groups["ended"] = (p1 - p0) - sum(groups.values())
    return {"wall": wall, "cpu": p1 - p0, "groups": groups}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", choices=["bench", "epoch"], default="bench")
    ap.add_argument("--rows", type=int, default=None, help="default 200000 (bench) / 40000 (epoch)")
    ap.add_argument("--width", type=int, default=64, help="floats per row of --data bench")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--variants", default="st_kv,parquet_kv,st_batch,noop_kv")
    ap.add_argument("--driver-memory", default="4g")
    ap.add_argument("--jar", default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--perf", default=None, metavar="FILE",
                    help="then record `perf record -g` of the JVM during --reps more st_kv writes into FILE "
                         "(the JVM runs with -XX:+PreserveFramePointer; its JIT symbols go to /tmp/perf-<pid>.map)")
    args = ap.parse_args()
    rows = args.rows or (200_000 if args.data == "bench" else 40_000)
    jar = args.jar or str(sorted((ROOT / "jvm-connector" / "target").glob("safetensors-spark-*.jar"))[0])

    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]").appName("kv-write-bench")
        .config("spark.jars", jar)
        .config("spark.driver.memory", args.driver_memory)
        .config("spark.driver.extraJavaOptions", "-XX:+UseG1GC" + (" -XX:+PreserveFramePointer" if args.perf else ""))
        .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    pid = int(spark._jvm.java.lang.ProcessHandle.current().pid())
    if args.data == "bench":
        import bench

        df = bench.make_df(spark, rows, args.width, 2).select("key", "xf")
        cols, tensors = ["key", "xf"], ["xf"]
        st_opts = {}
    else:
        import epoch
        from pyspark import cloudpickle

        cloudpickle.register_pickle_by_value(epoch)  # the Python workers cannot import it
        df = epoch.make_df(spark, rows, 2).select("key", "embedding", "image", "label")
        cols, tensors = ["key", "embedding", "image", "label"], ["embedding", "image", "label"]
        st_opts = {"dtypes": '{"image": "U8"}', "shapes": json.dumps({"image": [3, 32, 32]})}

    def st(d):
        w = d.write.format("safetensors")
        for k, v in st_opts.items():
            w = w.option(k, v)
        return w

    variants = {
        "st_kv": lambda p: st(df).option("name_col", "key").option("target_shard_size_mb", 1000).save(p),
        "parquet_kv": lambda p: df.write.option("compression", "snappy").parquet(p),
        "st_batch": lambda p: st(df.select(*tensors)).option("batch_size", 4096).save(p),
        "noop_kv": lambda p: df.write.format("noop").mode("overwrite").save(),
    }
    variants = {k: variants[k] for k in args.variants.split(",")}
    work = Path(tempfile.mkdtemp(prefix="kv-write-"))
    res = {n: [] for n in variants}
    try:
        for w in range(args.warmup):
            for n, fn in variants.items():
                fn(str(work / f"w-{n}"))
                shutil.rmtree(work / f"w-{n}", ignore_errors=True)
        names = list(variants)
        for rep in range(args.reps):
            for n in names[rep % len(names):] + names[: rep % len(names)]:
                out = work / f"{n}-{rep}"
                res[n].append(measure(pid, lambda: variants[n](str(out))))
                shutil.rmtree(out, ignore_errors=True)
        load = os.getloadavg()
        if args.perf:
            import signal

            rec = subprocess.Popen(["perf", "record", "-F", "999", "-g", "-p", str(pid), "-o", args.perf],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1)
            for rep in range(args.reps):
                out = work / f"perf-{rep}"
                variants["st_kv"](str(out))
                shutil.rmtree(out, ignore_errors=True)
            rec.send_signal(signal.SIGINT)
            rec.wait()
            subprocess.run(["jcmd", str(pid), "Compiler.perfmap"], capture_output=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        spark.stop()

    med = lambda xs: statistics.median(xs)  # noqa: E731
    summary = {}
    groups = ["tasks", "jit", "gc", "sealer", "other", "ended"]
    print(f"data={args.data} rows={rows} cols={','.join(cols)} reps={args.reps} load(end)={load[0]:.2f}")
    print(f"{'variant':12} {'wall s':>8} {'cpu s':>8}  " + " ".join(f"{g:>7}" for g in groups))
    for n, rs in res.items():
        s = {"wall": med([r["wall"] for r in rs]), "cpu": med([r["cpu"] for r in rs]),
             "groups": {g: med([r["groups"].get(g, 0.0) for r in rs]) for g in groups},
             "raw_wall": [r["wall"] for r in rs], "raw_cpu": [r["cpu"] for r in rs]}
        summary[n] = s
        print(f"{n:12} {s['wall']:8.3f} {s['cpu']:8.3f}  " + " ".join(f"{s['groups'][g]:7.3f}" for g in groups))
    if "st_kv" in summary and "parquet_kv" in summary:
        kv, pq = summary["st_kv"], summary["parquet_kv"]
        ratio = {"wall": kv["wall"] / pq["wall"], "cpu": kv["cpu"] / pq["cpu"]}
        print(f"st_kv ÷ parquet_kv: wall {ratio['wall']:.2f}, cpu {ratio['cpu']:.2f} (target ≤ 0.5)")
        summary["ratio_kv_parquet"] = ratio
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    summary["meta"] = {"data": args.data, "rows": rows, "reps": args.reps, "commit": commit,
                       "date": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()), "load_end": load}
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
