"""One "rank" of test_remote_cache.py: a real process that opens a remote dataset through a node
cache shared with others, says it is ready, waits for the go, reads its share of one epoch and
writes what it read.

    python remote_rank.py SPEC_JSON   (url, opts, cache_dir, rank, world, ready, go, out)
"""
import json
import os
import sys
import time

import s3fs

from safetensors_spark import open_dataset
from safetensors_spark.torch import SafetensorsIterableDataset

spec = json.loads(sys.argv[1])
s3fs.S3FileSystem.retries = 1  # the client's own retries off: the package's policy is what runs
ds = open_dataset(spec["url"], storage_options=spec["opts"], cache_dir=spec["cache_dir"])
open(spec["ready"], "w").close()
while not os.path.exists(spec["go"]):
    time.sleep(0.02)
it = SafetensorsIterableDataset(ds, batch_size=4, shuffle=True, seed=3, rank=spec["rank"], world_size=spec["world"])
ids = [int(v) for b in it for v in b["y"]]
with open(spec["out"], "w") as f:
    json.dump({"ids": ids, "bytes_fetched": ds.bytes_fetched}, f)
