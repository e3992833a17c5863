"""Reads the datasets of write_dataset.py with the safetensors_spark package and prints, one line
each, what it read: per column the dtype, shape and SHA-256 of every sample's bytes; every shard's
CRC-32C (computed by _native) and the dataset validation's verdict. tests/aarch64/run.sh runs it on
x86_64 (the venv's package) and on an aarch64 CPython under qemu-aarch64 (the aarch64 wheel) and
requires identical output. Needs only numpy and fsspec besides the package.

Usage: python read_dataset.py DATASET_DIR...
"""
import hashlib
import json
import sys

import numpy as np

import safetensors_spark
from safetensors_spark import _native, open_dataset

for path in sys.argv[1:]:
    name = path.rstrip("/").rsplit("/", 1)[-1]
    ds = open_dataset(path, verify_checksums=True)
    ds.verify_checksums()
    print(f"{name} samples {len(ds)} layout {ds.layout} columns {sorted(ds.columns)}")
    digests = {c: hashlib.sha256() for c in ds.columns}
    kinds = {}
    for i in range(len(ds)):
        sample = ds[i]
        for c in ds.columns:
            a = np.ascontiguousarray(sample[c])
            kinds[c] = (str(a.dtype), a.shape)
            digests[c].update(a.tobytes())
    for c in sorted(ds.columns):
        print(f"{name} column {c} {kinds.get(c)} {digests[c].hexdigest()}")
    for shard in sorted(s["shard_path"] for s in ds.manifest["shards"]):
        print(f"{name} shard-crc32c {shard} {_native.file_crc32c(f'{path}/{shard}')}")
    report = json.loads(_native.validate_dataset(path))
    print(f"{name} validate {json.dumps(report, sort_keys=True).replace(path, '<dir>')}")
print(f"read_dataset: package {safetensors_spark.__file__.rsplit('/', 2)[0]}", file=sys.stderr)
