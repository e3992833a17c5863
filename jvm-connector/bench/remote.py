"""Training straight from object storage on a shaped link: one shuffled epoch read from an S3
server on loopback, ours against MosaicML Streaming and Parquet + pyarrow over s3fs.

Run it through jvm-connector/bench/remote.sh, which builds the server, prepares Streaming's venv
and runs this file inside a private network namespace (``unshare -n``), where it may shape the
namespace's loopback with ``tc``. One file, four roles:

* ``run`` (default; the project's venv): the orchestrator. Writes the dataset three ways (roles
  ``convert`` and ``mds``), starts the S3 server (jvm-connector/bench/s3server: gofakes3 in
  memory, a per-request delay, byte counters), uploads the three datasets unshaped, measures a
  plain concurrent GET loop of our shards unshaped, then shapes the link (``tc qdisc add dev lo
  root tbf``: the bandwidth, by the kernel; the server's delay before each request: the latency)
  and measures the GET loop again, then runs one epoch per path, each in a fresh process with an
  empty cache directory, counting the bytes the server sent and sampling the cache's disk use.
* ``convert`` (project venv): a local Spark writes the epoch benchmark's DataFrame (epoch.py,
  §10.2 of spec/performance.md) as our dataset and as Parquet.
* ``mds`` (Streaming's venv): the same rows through Streaming's ``MDSWriter``.
* ``epoch --path P``: one shuffled epoch (batch 256, 2 DataLoader workers) of path P from the
  server, with a step that reads every byte (the epoch benchmark's checksum); prints JSON.

What every number means, and the recorded result: spec/performance.md §13.
"""
import argparse
import http.client
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
import epoch as E  # noqa: E402 - the epoch benchmark's data, step and helpers

BUCKET = "data"
CREDS = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1",
         # botocore's default flexible checksums (CRC32 trailers on upload, checked on download)
         # do not round-trip through gofakes3 1.2.0 (Streaming's download failed its check);
         # the epoch's own checksum of every sample byte checks the data instead
         "AWS_REQUEST_CHECKSUM_CALCULATION": "when_required", "AWS_RESPONSE_CHECKSUM_VALIDATION": "when_required"}
PATHS = {
    "ours": "open_dataset(s3://…, cache_dir) + SafetensorsIterableDataset(shuffle=True) + loader(num_workers=2)",
    "ours_cache25": "the same with cache_limit = 25 % of the dataset's shard bytes",
    "ours_prefetch8": "the same as ours with prefetch=8 (8 shards past the current shuffle block, not 4; informative, no target)",
    "streaming": "StreamingDataset(remote=s3://…, local=cache, shuffle=True) + DataLoader(num_workers=2)",
    "parquet": "pyarrow ParquetFile(s3fs) read_row_group, row groups permuted per epoch, rows permuted in each",
}
# Targets (issue 26 item 5)
LINK_SHARE = 0.9
VS_STREAMING = 2.0
FETCH_RATIO = 1.05
MB_PER_CPU_S = 500  # issue 38 item 4


def log(msg):
    print(f"[remote-bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def s3_options(endpoint):
    return {"key": CREDS["AWS_ACCESS_KEY_ID"], "secret": CREDS["AWS_SECRET_ACCESS_KEY"],
            "client_kwargs": {"endpoint_url": endpoint, "region_name": CREDS["AWS_DEFAULT_REGION"]}}


# ============================================================================================
# Writing the dataset (roles `convert`, `mds`)


def role_convert(args):
    out = Path(args.workdir)
    args.cores, args.partitions = 2, 2
    args.driver_memory = args.driver_memory or "3g"
    spark = E.build_spark(args, "remote-bench-convert")
    spark.sparkContext.setLogLevel("ERROR")
    spark.sparkContext.addPyFile(str(HERE / "epoch.py"))  # make_df's generator, in Spark's Python workers
    res = {}
    try:
        t0 = time.perf_counter()
        df = E.make_df(spark, args.rows, 2)
        res["generate_s"] = time.perf_counter() - t0
        cols = df.select("embedding", "image", "label")
        t0 = time.perf_counter()
        (cols.write.format("safetensors").option("dtypes", '{"image": "U8"}')
         .option("shapes", json.dumps({"image": list(E.IMG)})).option("batch_size", E.SHARD_ROWS)
         .save(str(out / "ours")))
        res["ours_write_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        cols.write.option("compression", "snappy").parquet(str(out / "parquet"))
        res["parquet_write_s"] = time.perf_counter() - t0
    finally:
        spark.stop()
    print(json.dumps(res))


def role_mds(args):
    import numpy as np
    from streaming import MDSWriter

    out = Path(args.workdir) / "streaming"
    t0 = time.perf_counter()
    cols = {"embedding": "ndarray:float32", "image": "bytes", "label": "int64"}
    with MDSWriter(out=str(out), columns=cols) as w:  # Streaming's default shard size (64 MiB)
        for lo in range(0, args.rows, 10000):
            b = E.gen_batch(np.arange(lo, min(args.rows, lo + 10000), dtype=np.int64))
            emb = b.column(0).values.to_numpy().reshape(len(b), E.EMB)
            img = np.frombuffer(b.column(1).buffers()[2], dtype=np.uint8)[: len(b) * E.IMG_BYTES].reshape(len(b), -1)
            lab = b.column(2).to_numpy()
            for i in range(len(b)):
                w.write({"embedding": emb[i], "image": img[i].tobytes(), "label": int(lab[i])})
    print(json.dumps({"mds_write_s": time.perf_counter() - t0}))


# ============================================================================================
# One epoch (role `epoch`)


class ParquetS3Batches:
    """The epoch benchmark's Parquet path (epoch.py ParquetBatches) reading from S3 through s3fs:
    each epoch the row groups are permuted (seeded) and dealt to the workers; each row group is
    read whole (``read_row_group``), its rows permuted and cut into batches. The file system is
    made in the process that reads (an s3fs instance is not fork-safe)."""

    def __init__(self, url, options, seed=0):
        import fsspec
        import pyarrow.parquet as pq

        self.url, self.options, self.seed = url, options, seed
        fs = fsspec.filesystem("s3", skip_instance_cache=True, **options)
        self.files = sorted(f for f in fs.find(url) if f.endswith(".parquet"))
        self.groups = [(f, g) for f in self.files for g in range(pq.ParquetFile(f, filesystem=fs).num_row_groups)]

    def __iter__(self):
        import fsspec
        import numpy as np
        import pyarrow.parquet as pq
        import torch

        fs = fsspec.filesystem("s3", skip_instance_cache=True, **self.options)
        info = torch.utils.data.get_worker_info()
        wid, nw = (info.id, info.num_workers) if info else (0, 1)
        order = np.random.default_rng(self.seed).permutation(len(self.groups))
        for k in order[wid::nw].tolist():
            f, g = self.groups[k]
            table = pq.ParquetFile(f, filesystem=fs, pre_buffer=True).read_row_group(g, columns=["embedding", "image", "label"])
            perm = np.random.default_rng([self.seed, k]).permutation(table.num_rows)
            for lo in range(0, table.num_rows, E.BATCH):
                b = table.take(perm[lo: lo + E.BATCH]).combine_chunks()
                emb, img, n = b.column("embedding").chunk(0), b.column("image").chunk(0), len(b)
                start = int(np.frombuffer(img.buffers()[1], dtype=np.int32, count=1, offset=img.offset * 4)[0])
                yield {
                    "embedding": torch.from_numpy(emb.flatten().to_numpy().reshape(n, E.EMB)),
                    "image": torch.from_numpy(np.frombuffer(img.buffers()[2], dtype=np.uint8, count=n * E.IMG_BYTES,
                                                            offset=start).reshape(n, *E.IMG)),
                    "label": torch.from_numpy(b.column("label").chunk(0).to_numpy()),
                }


try:  # Streaming's venv only; at module level, so that its workers (forkserver) can unpickle it
    from streaming import StreamingDataset as _StreamingDataset
except ImportError:
    _StreamingDataset = None
if _StreamingDataset is not None:
    class StreamingImages(_StreamingDataset):
        def __getitem__(self, i):
            import numpy as np

            s = super().__getitem__(i)
            s["image"] = np.frombuffer(s["image"], dtype=np.uint8).reshape(E.IMG)
            return s


def make_loader(args):
    """(loader, dataset or None, seconds spent opening) for path ``args.path``."""
    import torch

    url = f"s3://{BUCKET}/{'ours' if args.path.startswith('ours') else args.path}"
    opts = s3_options(args.endpoint)
    t0 = time.perf_counter()
    if args.path.startswith("ours"):
        from safetensors_spark import open_dataset
        from safetensors_spark.torch import SafetensorsIterableDataset, loader

        ds = open_dataset(url, storage_options=opts, cache_dir=args.cache,
                          cache_limit=args.cache_limit or None, **({"prefetch": args.prefetch} if args.prefetch else {}))
        it = SafetensorsIterableDataset(ds, batch_size=E.BATCH, shuffle=True, seed=0)
        return loader(it, num_workers=args.workers), ds, time.perf_counter() - t0
    if args.path == "streaming":
        try:
            from streaming.base.util import clean_stale_shared_memory

            clean_stale_shared_memory()
        except Exception:  # noqa: BLE001 - best effort
            pass
        os.environ["S3_ENDPOINT_URL"] = args.endpoint
        ds = StreamingImages(remote=url, local=args.cache, shuffle=True, shuffle_seed=0, batch_size=E.BATCH)
        ctx = args.mp_context if args.workers else None
        return (torch.utils.data.DataLoader(ds, batch_size=E.BATCH, num_workers=args.workers, multiprocessing_context=ctx),
                None, time.perf_counter() - t0)
    if args.path == "parquet":
        class DS(ParquetS3Batches, torch.utils.data.IterableDataset):
            pass

        ds = DS(url, opts)
        return torch.utils.data.DataLoader(ds, batch_size=None, num_workers=args.workers), None, time.perf_counter() - t0
    raise ValueError(args.path)


def epoch_cpu():
    """CPU seconds of this process and of the children it has joined (the loader's workers)."""
    import resource

    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


def role_epoch(args):
    import warnings

    import torch

    warnings.simplefilter("ignore")
    torch.set_num_threads(1)  # the step runs in the training process; workers read
    # the path's libraries are imported before the clock starts: the epoch is the link's work
    mods = {"streaming": ["streaming"], "parquet": ["pyarrow.parquet", "s3fs"]}.get(
        args.path, ["safetensors_spark", "safetensors_spark.torch", "s3fs"])
    for m in mods:
        importlib.import_module(m)
    t0, t0_unix = time.perf_counter(), time.time()  # (the wall clock: against the server's log)
    cpu0 = epoch_cpu()
    dl, ds, open_s = make_loader(args)
    checksum = samples = batches = 0
    first_batch_s = None
    for b in dl:
        for name in ("embedding", "image", "label"):
            checksum += E.touch(b[name])
        samples += int(b["label"].shape[0])
        batches += 1
        if first_batch_s is None:
            first_batch_s = time.perf_counter() - t0
    elapsed = time.perf_counter() - t0
    del dl  # the workers joined, so that their CPU time is counted
    epoch_cpu_s = epoch_cpu() - cpu0
    out = {"path": args.path, "epoch_s": elapsed, "open_s": open_s, "samples": samples, "batches": batches,
           "epoch_cpu_s": epoch_cpu_s,
           "first_batch_s": first_batch_s, "checksum": checksum % (1 << 64), "t0_unix": t0_unix}
    if ds is not None and hasattr(ds, "cache_stats"):
        st = ds.cache_stats()
        out["cache_stats"] = {k: st[k] for k in ("fetches", "fetched_bytes", "refetches", "evictions", "evicted_bytes",
                                                 "cached_bytes")}
    print(json.dumps(out))


# ============================================================================================
# The orchestrator (role `run`)


class Server:
    def __init__(self, binary, delay_ms=0, log_requests=False):
        self.proc = subprocess.Popen([str(binary), "-bucket", BUCKET, "-delay-ms", str(delay_ms)]
                                     + (["-log"] if log_requests else []),
                                     stdout=subprocess.PIPE, text=True)
        self.addr = json.loads(self.proc.stdout.readline())["addr"]
        self.endpoint = f"http://{self.addr}"

    def admin(self, what, method="GET"):
        req = urllib.request.Request(f"{self.endpoint}/_bench/{what}", method=method)
        with urllib.request.urlopen(req) as r:
            return json.loads(r.read())

    def stats(self):
        return self.admin("stats")

    def reset(self):
        return self.admin("reset", "POST")

    def set_delay(self, ms):
        return self.admin(f"delay?ms={ms}", "POST")

    def stop(self):
        self.proc.terminate()
        self.proc.wait(10)


def put(addr, key, path):
    """One plain PUT of a whole file (no multipart, no checksum trailer: what the server stores
    is the file's bytes; the epochs' checksums check them)."""
    host, port = addr.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=300)
    with open(path, "rb") as body:
        conn.request("PUT", f"/{BUCKET}/{key}", body=body, headers={"Content-Length": str(os.path.getsize(path))})
        r = conn.getresponse()
        r.read()
    conn.close()
    if r.status != 200:
        raise RuntimeError(f"PUT {key}: HTTP {r.status}")


def get_loop(addr, keys, threads):
    """A plain concurrent GET loop: ``threads`` threads GET the objects ``keys`` whole (one
    keep-alive connection each, bodies read into a reused buffer). Returns (bytes, seconds)."""
    host, port = addr.rsplit(":", 1)
    todo = list(keys)
    lock = threading.Lock()
    total = [0]

    def work():
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        buf = bytearray(8 << 20)
        n = 0
        while True:
            with lock:
                if not todo:
                    break
                key = todo.pop()
            conn.request("GET", f"/{BUCKET}/{key}")
            r = conn.getresponse()
            if r.status != 200:
                raise RuntimeError(f"GET {key}: HTTP {r.status}")
            while True:
                k = r.readinto(buf)
                if not k:
                    break
                n += k
        conn.close()
        with lock:
            total[0] += n

    t0 = time.perf_counter()
    ts = [threading.Thread(target=work) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return total[0], time.perf_counter() - t0


class DiskSampler(threading.Thread):
    """Peak disk use (allocated blocks) of every file under a directory, sampled every 0.1 s."""

    def __init__(self, path):
        super().__init__(daemon=True)
        self.path, self.peak, self.stop = path, 0, threading.Event()

    def sample(self):
        total = 0
        for dirpath, _, files in os.walk(self.path):
            for f in files:
                try:
                    total += os.lstat(os.path.join(dirpath, f)).st_blocks * 512
                except OSError:
                    pass
        self.peak = max(self.peak, total)

    def run(self):
        while not self.stop.is_set():
            self.sample()
            self.stop.wait(0.1)
        self.sample()


def sh(cmd):
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def shape(rate_mbit, burst):
    sh(["tc", "qdisc", "replace", "dev", "lo", "root", "tbf", "rate", f"{rate_mbit}mbit", "burst", burst,
        "latency", "50ms"])
    return sh(["tc", "qdisc", "show", "dev", "lo"]).strip()


def unshape():
    subprocess.run(["tc", "qdisc", "del", "dev", "lo", "root"], capture_output=True)


def in_private_netns():
    """Whether this network namespace has no interface but the loopback (remote.sh's
    ``unshare -n``), so shaping ``lo`` touches nothing else."""
    try:
        links = [ln.split(":")[1].strip() for ln in sh(["ip", "-o", "link", "show"]).splitlines() if ":" in ln]
    except (OSError, subprocess.CalledProcessError):
        return False
    return links == ["lo"]


def role_run(args):
    if not in_private_netns() and not args.allow_host_netns:
        sys.exit("remote.py run shapes the loopback with tc: run it through remote.sh (unshare -n), "
                 "or pass --allow-host-netns to shape this namespace's lo")
    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="safetensors-remote-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    log(f"outputs in {work}; {args.rows} rows; link {args.rate_mbit} Mbit/s + {args.delay_ms} ms per request; "
        f"paths {','.join(args.paths)}")
    machine = E.machine_info()
    machine.pop("versions_petastorm", None)
    machine.pop("versions_hf", None)
    result = {"machine": machine, "params": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
              "paths": {p: {"what": PATHS[p]} for p in args.paths}, "epochs": {}, "unavailable": {}, "targets": []}
    os.environ.update(CREDS)  # for s3fs here and Streaming's boto3 in its epoch process
    server = None
    try:
        # ------------------------------------------------------------ the three datasets
        data = work / "data"
        if not (data / "ours" / "dataset_manifest.json").exists():
            log("writing the dataset with Spark (ours, Parquet) …")
            cmd = [sys.executable, __file__, "convert", "--rows", str(args.rows), "--workdir", str(data),
                   "--jar", str(args.jar)]
            res, err, _ = E.run_sub(cmd, 3600)
            if err:
                raise RuntimeError(f"conversion failed: {err}")
            result["convert"] = res
        streaming_py = E.venv_python("streaming")
        if "streaming" in args.paths:
            reason = HERE / ".venv" / "streaming.unavailable"
            if reason.exists() or not Path(streaming_py).exists():
                result["unavailable"]["streaming"] = reason.read_text().strip() if reason.exists() else "no venv"
            elif not (data / "streaming" / "index.json").exists():
                log("writing the same rows with Streaming's MDSWriter …")
                res, err, _ = E.run_sub([streaming_py, __file__, "mds", "--rows", str(args.rows), "--workdir", str(data)], 3600)
                if err:
                    result["unavailable"]["streaming"] = f"MDS conversion failed: {err}"
                else:
                    result.setdefault("convert", {}).update(res)
        sizes = {}
        for name in ("ours", "streaming", "parquet"):
            if (data / name).exists():
                files = E.data_files(data / name)
                sizes[name] = {"bytes": sum(f.stat().st_size for f in files), "files": len(files)}
        ours_shards = sorted(f for f in E.data_files(data / "ours") if f.suffix == ".safetensors")
        shard_bytes = sum(f.stat().st_size for f in ours_shards)
        sizes["ours"]["shard_bytes"] = shard_bytes
        result["datasets"] = sizes
        log("datasets: " + ", ".join(f"{k} {v['bytes'] / 1e6:.1f} MB in {v['files']} files" for k, v in sizes.items()))

        # ------------------------------------------------------------ the server, the upload
        unshape()
        server = Server(args.server, log_requests=args.server_log)
        t0 = time.perf_counter()
        for name in sizes:
            for f in E.data_files(data / name):
                put(server.addr, f"{name}/{f.relative_to(data / name)}", f)
        result["upload_s"] = time.perf_counter() - t0
        log(f"uploaded in {result['upload_s']:.1f} s; server RSS {rss_mib(server.proc.pid):.0f} MiB")
        if not args.keep:
            shutil.rmtree(data / "parquet", ignore_errors=True)
            shutil.rmtree(data / "streaming", ignore_errors=True)

        # ------------------------------------------------------------ the link, measured
        keys = [f"ours/{f.relative_to(data / 'ours')}" for f in ours_shards]
        link = {}
        server.reset()
        n, s = get_loop(server.addr, keys, args.get_threads)
        link["unshaped"] = {"bytes": n, "s": s, "mb_per_s": n / s / 1e6, "threads": args.get_threads}
        log(f"GET loop, unshaped: {n / 1e6:.0f} MB in {s:.2f} s = {n / s / 1e6:.0f} MB/s ({args.get_threads} threads)")
        link["tc"] = shape(args.rate_mbit, args.burst)
        server.set_delay(args.delay_ms)
        log(f"shaped: {link['tc']}; server delay {args.delay_ms} ms per request")
        n, s = get_loop(server.addr, keys, args.get_threads)
        link["shaped"] = {"bytes": n, "s": s, "mb_per_s": n / s / 1e6, "threads": args.get_threads}
        link["nominal_mb_per_s"] = args.rate_mbit / 8
        log(f"GET loop, shaped: {n / 1e6:.0f} MB in {s:.2f} s = {n / s / 1e6:.1f} MB/s (tbf {args.rate_mbit / 8:.0f} MB/s)")
        result["link"] = link

        # ------------------------------------------------------------ epochs
        for p in args.paths:
            if p in result["unavailable"]:
                continue
            cache = work / f"cache-{p}"
            shutil.rmtree(cache, ignore_errors=True)
            cache.mkdir()
            py = streaming_py if p == "streaming" else sys.executable
            cmd = [py, __file__, "epoch", "--path", p, "--endpoint", server.endpoint, "--cache", str(cache)]
            if p == "ours_cache25":
                cmd += ["--cache-limit", str(int(shard_bytes * 0.25))]
            if p == "ours_prefetch8":
                cmd += ["--prefetch", "8"]
            server.reset()
            disk = DiskSampler(cache)
            disk.start()
            res, err, sampler = E.run_sub(cmd, args.epoch_timeout, sampler_pid_cb=True)
            disk.stop.set()
            disk.join()
            st = server.stats()
            shutil.rmtree(cache, ignore_errors=True)
            if err:
                result["unavailable"][p] = f"epoch failed: {err}"
                log(f"epoch {p}: {err}")
                continue
            res.update({"server": st, "peak_cache_disk": disk.peak, "peak_pss": sampler.peak["pss"],
                        "procs": sampler.peak["procs"]})
            result["epochs"][p] = res
            log(f"epoch {p}: {res['epoch_s']:.2f} s, {res['samples']} samples, first batch {E.fmt(res['first_batch_s'], '.2f')} s, "
                f"{st['bytes_out'] / 1e6:.1f} MB in {st['gets']} GETs, peak cache {disk.peak / 1e6:.0f} MB")
            Path(args.out).write_text(json.dumps(result, indent=1))
        machine["loadavg_end"] = os.getloadavg()
    finally:
        unshape()
        if server is not None:
            server.stop()
        if not args.keep and not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    report(args, result)
    Path(args.out).write_text(json.dumps(result, indent=1))
    log(f"results written to {args.out}")


def rss_mib(pid):
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def report(args, result):
    want = E.expected_checksum(args.rows)
    link = result.get("link", {})
    shaped = (link.get("shaped") or {}).get("mb_per_s")
    ds_bytes = result["datasets"]["ours"]["bytes"]
    shard_bytes = result["datasets"]["ours"]["shard_bytes"]
    rows, summary = [], {}
    for p in args.paths:
        e = result["epochs"].get(p)
        if e is None:
            rows.append([p] + ["—"] * 11 + ["cannot run here: " + result["unavailable"].get(p, "?")])
            continue
        size = result["datasets"]["ours" if p.startswith("ours") else p]["bytes"]
        s = {"epoch_s": e["epoch_s"], "samples_per_s": e["samples"] / e["epoch_s"], "first_batch_s": e["first_batch_s"],
             "open_s": e["open_s"], "bytes_fetched": e["server"]["bytes_out"], "gets": e["server"]["gets"],
             "fetched_vs_dataset": e["server"]["bytes_out"] / size, "dataset_bytes": size,
             "mb_per_s": e["server"]["bytes_out"] / e["epoch_s"] / 1e6, "peak_cache_disk": e["peak_cache_disk"],
             "cpu_s": e.get("cpu_s"), "epoch_cpu_s": e.get("epoch_cpu_s"),
             "mb_per_epoch_cpu_s": e["server"]["bytes_out"] / 1e6 / e["epoch_cpu_s"] if e.get("epoch_cpu_s") else None,
             "data_ok": e["checksum"] == want and e["samples"] == args.rows}
        summary[p] = s
        rows.append([p, E.fmt(s["epoch_s"], ".2f"), f"{s['samples_per_s']:,.0f}", E.fmt(s["first_batch_s"], ".2f"),
                     E.fmt(s["open_s"], ".2f"), f"{s['bytes_fetched'] / 1e6:,.1f}", f"{s['fetched_vs_dataset']:.3f}",
                     f"{s['gets']:,}", f"{s['peak_cache_disk'] / 1e6:,.0f}", E.fmt(s["cpu_s"], ".1f"),
                     E.fmt(s["epoch_cpu_s"], ".2f"), E.fmt(s["mb_per_epoch_cpu_s"], ",.0f"),
                     "data ok" if s["data_ok"] else "DATA MISMATCH"])
    result["summary"] = summary
    E.print_table(f"{args.rows:,} rows × {E.SAMPLE_BYTES} B from S3 on loopback, {args.rate_mbit / 8:.0f} MB/s (tc tbf) + "
                  f"{args.delay_ms} ms per request; one shuffled epoch, batch {E.BATCH}, {E.WORKERS} workers",
                  ["path", "epoch s", "samples/s", "1st batch s", "open s", "fetched MB", "÷ dataset", "GETs",
                   "peak cache MB", "CPU s", "epoch CPU s", "MB/CPU-s", "note"], rows)
    if link:
        print(f"\nplain GET loop of our shards ({link['unshaped']['threads']} threads): unshaped "
              f"{link['unshaped']['mb_per_s']:,.0f} MB/s, shaped {shaped:.1f} MB/s (tbf {link['nominal_mb_per_s']:.0f} MB/s); "
              f"our dataset {ds_bytes / 1e6:,.1f} MB ({shard_bytes / 1e6:,.1f} MB of shards)")
    t = result["targets"]
    ours = summary.get("ours")
    if ours and shaped:
        r = ours["mb_per_s"] / shaped
        t.append({"target": f"ours epoch ≥ {LINK_SHARE:.0%} of the shaped link rate (bytes fetched / epoch s ÷ the GET loop's shaped MB/s)",
                  "observed": r, "result": E.mark(r >= LINK_SHARE)})
        r2 = (args.rows * E.SAMPLE_BYTES / ours["epoch_s"] / 1e6) / shaped
        t.append({"target": "(the same in sample bytes: rows × 4,104 B / epoch s ÷ the shaped MB/s; informative)",
                  "observed": r2, "result": "—"})
    if ours and ours.get("mb_per_epoch_cpu_s"):
        r = ours["mb_per_epoch_cpu_s"]
        t.append({"target": f"ours fetched MB per CPU-s of the epoch ≥ {MB_PER_CPU_S} (process and workers, "
                            "from the clock's start: imports and interpreter start-up excluded, the step included)",
                  "observed": r, "result": E.mark(r >= MB_PER_CPU_S)})
    if ours and summary.get("streaming"):
        r = ours["samples_per_s"] / summary["streaming"]["samples_per_s"]
        t.append({"target": f"ours samples/s ≥ {VS_STREAMING}× Streaming's", "observed": r, "result": E.mark(r >= VS_STREAMING)})
    if ours:
        r = ours["fetched_vs_dataset"]
        t.append({"target": f"ours bytes fetched ≤ {FETCH_RATIO}× the dataset, unlimited cache", "observed": r,
                  "result": E.mark(r <= FETCH_RATIO)})
    if summary.get("ours_cache25"):
        c = summary["ours_cache25"]
        t.append({"target": "ours bytes fetched with cache_limit = 25 % of the dataset (reported; peak cache ÷ dataset in the note)",
                  "observed": c["fetched_vs_dataset"], "result": f"reported; peak cache {c['peak_cache_disk'] / shard_bytes:.2f}× shards"})
    E.print_table("Targets", ["target", "observed", "result"], [[x["target"], E.fmt(x["observed"], ".3g"), x["result"]] for x in t])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("role", nargs="?", default="run", choices=["run", "convert", "mds", "epoch"])
    ap.add_argument("--rows", type=int, default=250_000)
    ap.add_argument("--rate-mbit", type=int, default=800, help="the link's bandwidth (tc tbf rate), Mbit/s")
    ap.add_argument("--burst", default="256kb", help="tc tbf burst")
    ap.add_argument("--delay-ms", type=float, default=25.0, help="the server's delay before each request")
    ap.add_argument("--get-threads", type=int, default=8)
    ap.add_argument("--paths", default=",".join(PATHS), help=f"comma-separated subset of {','.join(PATHS)}")
    ap.add_argument("--out", default="remote-results.json")
    ap.add_argument("--workdir", default=None, help="where outputs go (default: a temp dir, removed at the end); "
                    "datasets already written there are reused")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--jar", default=None)
    ap.add_argument("--server", default=str(HERE / "target" / "s3server"))
    ap.add_argument("--driver-memory", default=None)
    ap.add_argument("--epoch-timeout", type=int, default=1200)
    ap.add_argument("--server-log", action="store_true", help="the server logs every request to stderr")
    ap.add_argument("--allow-host-netns", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--path", help=argparse.SUPPRESS)
    ap.add_argument("--endpoint", help=argparse.SUPPRESS)
    ap.add_argument("--cache", help=argparse.SUPPRESS)
    ap.add_argument("--cache-limit", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--workers", type=int, default=E.WORKERS, help=argparse.SUPPRESS)
    ap.add_argument("--prefetch", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--mp-context", default="forkserver", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role == "epoch":
        return role_epoch(args)
    if args.role == "mds":
        return role_mds(args)
    args.jar = E.connector_jar(args.jar)
    E.require_jar(args.jar)
    if args.role == "convert":
        return role_convert(args)
    E.run_paths(args, PATHS, role_run)


if __name__ == "__main__":
    main()
