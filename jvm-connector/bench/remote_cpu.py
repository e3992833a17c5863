"""Remote reads on an unshaped loopback S3 server: CPU per byte and epoch rate of the native client
against fsspec/s3fs and a plain GET loop (issue 38 item 4; spec/performance.md §13.7).

    python jvm-connector/bench/remote_cpu.py --server jvm-connector/bench/target/s3server [--shards 12] [--rows 4096]

Writes a batch dataset of --shards shards of --rows rows (4,096 + 8 bytes a row, as §10.2's rows)
with the test helper (tests/python/package/handmade.py), uploads it to the Go S3 server
(jvm-connector/bench/s3server, no delay, no shaping), then measures, each in a fresh process:
`get_loop` (8 threads, boto3, each shard GET whole once), and one shuffled epoch of
`open_dataset(url, client=…)` + `SafetensorsIterableDataset(batch_size=256, shuffle=True)` +
`loader(num_workers=2)` with the default options, for `native` and `fsspec` (`--modes` also takes
`native_unshared` / `fsspec_unshared`: `share_shards=False`, each worker fetching for itself, as
before the spool, spec/python.md §2.1). Reports wall s,
MB/s (shard bytes ÷ wall), CPU s (the process and its workers: user + system), MB per CPU-s and
fetched_x (the bytes the epoch fetched ÷ the shards' bytes).
"""
import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def cpu():
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


def opts(endpoint):
    return {"key": "k", "secret": "s", "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"}}


def measure(mode, endpoint, names, nbytes, local):
    import boto3
    from concurrent.futures import ThreadPoolExecutor

    import torch  # noqa: F401  (imports outside the measured time)
    from safetensors_spark import open_dataset
    from safetensors_spark.torch import SafetensorsIterableDataset, loader

    t0, c0 = time.perf_counter(), cpu()
    if mode == "get_loop":
        s3 = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="k", aws_secret_access_key="s",
                          region_name="us-east-1")
        with ThreadPoolExecutor(8) as pool:
            got = sum(pool.map(lambda n: len(s3.get_object(Bucket="data", Key=f"ds/{n}")["Body"].read()), names))
        assert got == nbytes
    else:
        # <client>[_unshared]: loader(share_shards=False), each worker fetching for itself
        client, _, variant = mode.partition("_")
        ds = open_dataset(local) if mode == "local" else \
            open_dataset("s3://data/ds", storage_options=opts(endpoint), client=client)
        rows = 0
        it = loader(SafetensorsIterableDataset(ds, batch_size=256, shuffle=True, seed=0), num_workers=2,
                    **({"share_shards": False} if variant == "unshared" else {}))
        for b in it:
            rows += len(b["y"])
        assert rows == ds.total_samples
    wall, used = time.perf_counter() - t0, cpu() - c0
    # the bytes the epoch fetched (manifest, headers and the workers' ranges) ÷ the shards' bytes
    fetched = it.stats()["bytes_fetched"] / nbytes if mode not in ("get_loop", "local") else 1.0
    return {"mode": mode, "wall_s": wall, "mb_per_s": nbytes / wall / 1e6, "cpu_s": used,
            "mb_per_cpu_s": nbytes / used / 1e6, "fetched_x": fetched}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--shards", type=int, default=12)
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--modes", default="get_loop,native,fsspec,local", help="comma-separated: get_loop, native, "
                    "fsspec, local, native_unshared, fsspec_unshared")
    ap.add_argument("--measure", help=argparse.SUPPRESS)
    ap.add_argument("--endpoint", help=argparse.SUPPRESS)
    ap.add_argument("--names", help=argparse.SUPPRESS)
    ap.add_argument("--bytes", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--local", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.measure:
        print(json.dumps(measure(a.measure, a.endpoint, a.names.split(","), a.bytes, a.local)))
        return
    sys.path.insert(0, os.path.join(ROOT, "tests", "python", "package"))
    import boto3
    import numpy as np

    import handmade

    tmp = None
    srv = subprocess.Popen([a.server, "-bucket", "data"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        endpoint = "http://" + json.loads(srv.stdout.readline())["addr"]
        tmp = tempfile.mkdtemp(prefix="remote-cpu-")
        if True:
            local = os.path.join(tmp, "d")
            # the helper's dataset, its x made 1,024 F32 wide (4,104-byte rows)
            handmade.write_batch_dataset(local, [a.rows] * a.shards, batch_size=a.rows)
            from safetensors.numpy import save_file

            m = handmade.read_manifest(local)
            for k, sh in enumerate(m["shards"]):
                p = os.path.join(local, sh["shard_path"])
                ids = np.arange(k * a.rows, (k + 1) * a.rows)
                x = np.repeat(ids.astype(np.float32)[:, None], 1024, axis=1)
                save_file({"x": x, "y": ids.astype(np.int64)}, p,
                          metadata={"safetensors_spark.layout": "batch", "safetensors_spark.samples": str(a.rows),
                                    "safetensors_spark.padded_samples": "0"})
                sh["bytes"] = os.path.getsize(p)
            m["schema"]["x"]["shape"] = [a.rows, 1024]
            m["total_bytes"] = sum(sh["bytes"] for sh in m["shards"])
            handmade.write_manifest(local, m)
            s3 = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="k", aws_secret_access_key="s",
                              region_name="us-east-1")
            names, nbytes = [], 0
            for n in sorted(os.listdir(local)):
                p = os.path.join(local, n)
                if os.path.isfile(p):
                    s3.upload_file(p, "data", f"ds/{n}")
                    if n.endswith(".safetensors"):
                        names.append(n)
                        nbytes += os.path.getsize(p)
        del np
        out = []
        for _ in range(a.repeat):
            for mode in a.modes.split(","):
                r = subprocess.run([sys.executable, __file__, "--server", a.server, "--measure", mode, "--local", local,
                                    "--endpoint", endpoint, "--names", ",".join(names), "--bytes", str(nbytes)],
                                   check=True, capture_output=True, text=True)
                out.append(json.loads(r.stdout.strip().splitlines()[-1]))
                print(json.dumps(out[-1]), flush=True)
        print(json.dumps({"shards": len(names), "shard_bytes": nbytes, "runs": out}))
    finally:
        srv.terminate()
        srv.wait(10)
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)  # the dataset's copy (0.2–0.8 GB)


if __name__ == "__main__":
    main()
