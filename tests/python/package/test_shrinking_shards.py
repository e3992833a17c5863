"""A shard truncated while it is read (issue 29 item 2): the package checks a shard's length
before it touches its memory map and after it copied a batch out of it (spec/python.md §4), so the
read fails with ShardError naming the shard, and the process lives on. Without the check the
gather died of SIGBUS (pages past the new end), so the scenario runs in a subprocess."""

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

SCRIPT = r"""
import os, sys
import handmade
from safetensors_spark import ShardError, open_dataset
from safetensors_spark.torch import SafetensorsIterableDataset, loader

root = sys.argv[1]
for shuffle in (False, True):
    path = os.path.join(root, f"ds-{shuffle}")
    handmade.write_batch_dataset(path, [4096])  # x: 4096 rows of 8 bytes, y of 8: 64 KiB
    shard = os.path.join(path, handmade.shard_name(0))
    it = iter(loader(SafetensorsIterableDataset(path, batch_size=32, shuffle=shuffle, seed=1)))
    float(next(it)["x"].sum())  # header read, first batch read
    os.truncate(shard, 8192)  # between batches: every later page of x is gone
    try:
        for b in it:
            float(b["x"].sum())
        print("NO ERROR", shuffle)
    except ShardError as e:
        print("ERROR", shuffle, e)
path = os.path.join(root, "ds-get")
handmade.write_batch_dataset(path, [4096])
ds = open_dataset(path)
float(ds[0]["x"].sum())
os.truncate(os.path.join(path, handmade.shard_name(0)), 8192)
try:
    float(ds[4000]["x"].sum())
    print("NO ERROR getitem")
except ShardError as e:
    print("ERROR getitem", e)
print("ALIVE")
"""


def test_a_shard_truncated_mid_epoch_is_an_error_naming_it(tmp_path):
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], cwd=HERE, capture_output=True,
                       text=True, timeout=300, env={**__import__("os").environ, "PYTHONPATH": str(HERE)})
    assert r.returncode == 0, f"the process died (rc {r.returncode}): {r.stdout}\n{r.stderr[-2000:]}"
    lines = r.stdout.splitlines()
    assert lines[-1] == "ALIVE", r.stdout
    errors = [line for line in lines if line.startswith("ERROR")]
    assert len(errors) == 3, r.stdout  # sequential, shuffled, and open_dataset()[i]
    for line in errors:
        assert "part-00000-0000-" in line and ".safetensors" in line, line
        assert "changed while being read" in line and "now 8192 bytes" in line, line


PACKED = r"""
import os, sys
import numpy as np
import handmade
from safetensors_spark import ShardError
from safetensors_spark.torch import Packing, SafetensorsIterableDataset
from safetensors_spark._packing import PackedEpoch

root, shard = sys.argv[1], handmade.shard_name(0)


def epoch(path):
    rows = [np.arange(i % 7 + 1, dtype=np.int32) for i in range(4096)]  # ~64 KiB of tokens
    handmade.write_ragged_dataset(path, [4096], {"tokens": ("ragged", "I32", rows, "array")})
    ds = SafetensorsIterableDataset(path, batch_size=2, shuffle=False, pack=Packing("tokens", 16))
    e = PackedEpoch(ds.dataset, ds.pack, ds._order(), ds._lengths)
    e.blocks(0, 1)  # the shard's values are mapped and handed to the Rust builder
    return e, os.path.join(path, shard)


# 1. truncated between two batches: the check before the build (without it: SIGBUS)
e, f = epoch(os.path.join(root, "between"))
os.truncate(f, 8192)
try:
    e.blocks(e.num_blocks - 2, e.num_blocks)
    print("NO ERROR between")
except ShardError as x:
    print("ERROR between", x)

# 2. truncated while the builder runs (by its last 8 bytes: the cut page reads as zeros, no
# SIGBUS): the check after the build (without it: blocks of zeros, silently)
e, f = epoch(os.path.join(root, "during"))
real = e._packer


class CutDuringBuild:
    def __getattr__(self, name):
        return getattr(real, name)

    def build(self, *args):
        os.truncate(f, os.path.getsize(f) - 8)
        return real.build(*args)


e._packer = CutDuringBuild()
try:
    e.blocks(e.num_blocks - 2, e.num_blocks)
    print("NO ERROR during")
except ShardError as x:
    print("ERROR during", x)
print("ALIVE")
"""


def test_a_shard_truncated_during_a_packed_epoch_is_an_error_naming_it(tmp_path):
    """Issue #39 item 13: the packing path checks a shard's length before the Rust builder reads
    its mapped values and after (PackedEpoch.fill, spec/python.md §4): a shard truncated between
    two batches, and one truncated while a batch is built, fail with ShardError naming it. Each
    check alone is exercised: without the first the process dies of SIGBUS, without the second
    the batch is returned with zeros; in a subprocess."""
    r = subprocess.run([sys.executable, "-c", PACKED, str(tmp_path)], cwd=HERE, capture_output=True,
                       text=True, timeout=300, env={**__import__("os").environ, "PYTHONPATH": str(HERE)})
    assert r.returncode == 0, f"the process died (rc {r.returncode}): {r.stdout}\n{r.stderr[-2000:]}"
    lines = r.stdout.splitlines()
    assert lines[-1] == "ALIVE", r.stdout
    errors = [line for line in lines if line.startswith("ERROR")]
    assert [line.split()[1] for line in errors] == ["between", "during"], r.stdout
    for line in errors:
        assert "part-00000-0000-" in line and "changed while being read" in line, line
