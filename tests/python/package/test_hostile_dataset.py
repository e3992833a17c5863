"""The Python package on hostile datasets (spec/dataset.md §5.9, issue #39): links where a
dataset's own directories should be, log entries that lie, special files where a manifest or an
entry should be, and a vacuum with a retained older version. Real files and directories; a
command that could hang runs in a child process with a time limit."""

import json
import os
import re
import subprocess
import sys
import time

import pytest

import handmade
import safetensors_spark
from safetensors_spark import ManifestError, open_dataset

LOG = "_manifest_log"


def entry_name(v):
    return f"{v:020d}.json"


def commit(path, manifest, version, shards, at_ms, retention=0):
    """Commits version ``version`` of ``manifest`` listing only ``shards`` (names), into the log
    and ``dataset_manifest.json``."""
    m = json.loads(json.dumps(manifest))
    m["shards"] = [s for s in m["shards"] if s["shard_path"] in shards]
    m["total_samples"] = sum(s["samples_count"] for s in m["shards"])
    m["total_bytes"] = sum(s["bytes"] for s in m["shards"])
    m.update(manifest_version=version, committed_at_ms=at_ms, retention_seconds=retention)
    os.makedirs(os.path.join(path, LOG), exist_ok=True)
    for name in (os.path.join(LOG, entry_name(version)), "dataset_manifest.json"):
        with open(os.path.join(path, name), "w") as f:
            json.dump(m, f)


def two_versions(path, retention=0, gap_ms=10):
    """Version 1 lists shards 0 and 1 (ids 0..3), version 2 only shard 1 (ids 2, 3): shard 0 is
    superseded. Returns the shard names."""
    handmade.write_batch_dataset(path, [2, 2])
    m = handmade.read_manifest(path)
    names = [s["shard_path"] for s in m["shards"]]
    now = int(time.time() * 1000)
    commit(path, m, 1, names, now - 2 * gap_ms, retention)
    commit(path, m, 2, names[1:], now - gap_ms, retention)
    return names


def ids(ds):
    return sorted(int(r["y"]) for r in ds)


def test_vacuum_refuses_a_linked_index_directory_and_keeps_the_file_outside(tmp_path):
    """Item 1: ``_tensor_index.parquet`` links to a directory elsewhere holding a file named like
    the superseded shard's index part: the vacuum refuses the link, deletes nothing."""
    ds, outside = tmp_path / "ds", tmp_path / "outside"
    names = two_versions(ds)
    outside.mkdir()
    part = outside / names[0].replace(".safetensors", ".parquet")
    part.write_bytes(b"not the dataset's")
    os.symlink(outside, ds / "_tensor_index.parquet")
    with pytest.raises(ManifestError, match=r"_tensor_index.parquet: is a symbolic link"):
        safetensors_spark.vacuum(ds, retention="0")
    assert part.read_bytes() == b"not the dataset's"
    assert (ds / names[0]).exists(), "nothing was deleted"


def test_a_linked_manifest_log_is_refused_and_the_other_dataset_keeps_its_history(tmp_path):
    """Item 2: B's ``_manifest_log`` links to A's. vacuum(B), history(B) and a versioned read of B
    are refused naming the link; A keeps version 1 and gets no vacuum version."""
    a, b = tmp_path / "a", tmp_path / "b"
    two_versions(a)
    handmade.write_batch_dataset(b, [2])
    os.symlink(a / LOG, b / LOG)
    for call in (lambda: safetensors_spark.vacuum(b, retention="0"),
                 lambda: safetensors_spark.history(b),
                 lambda: open_dataset(b, version=1)):
        with pytest.raises(ManifestError, match=r"_manifest_log: is a symbolic link"):
            call()
    assert sorted(os.listdir(a / LOG)) == [entry_name(1), entry_name(2)]
    assert [h["version"] for h in safetensors_spark.history(a)] == [1, 2]


def test_compaction_of_a_partitioned_root_does_not_enter_a_linked_partition(tmp_path):
    """Item 3: ``root/split=b`` links to another dataset. Compacting the root compacts
    ``split=a`` only; the other dataset gets no compaction version and keeps its shards."""
    root, other = tmp_path / "root", tmp_path / "other"
    handmade.write_batch_dataset(root / "split=a", [1, 1], batch_size=2)
    handmade.write_batch_dataset(other, [1, 1], batch_size=2)
    before = sorted(os.listdir(other))
    os.symlink(other, root / "split=b")
    out = safetensors_spark.compact(root)
    assert [os.path.basename(o["dataset"]) for o in out] == ["split=a"]
    assert out[0]["version"] == 2
    assert sorted(os.listdir(other)) == before, "nothing written into the other dataset"
    assert handmade.read_manifest(other)["manifest_version"] == 1
    assert ids(open_dataset(root / "split=a")) == [0, 1]


def test_a_log_entry_that_disagrees_with_its_name_is_refused_naming_it(tmp_path):
    """Item 5: ``…3.json`` copied over ``…2.json``: version=2 never returns version 3's rows, the
    error names the entry; history too. A stray ``99999999999999999999.json`` is named."""
    ds = tmp_path / "ds"
    names = two_versions(ds)
    m = json.loads((ds / LOG / entry_name(1)).read_text())
    commit(ds, m, 3, names[:1], int(time.time() * 1000))
    (ds / LOG / entry_name(2)).write_bytes((ds / LOG / entry_name(3)).read_bytes())
    lie = r"_manifest_log/00000000000000000002.json: holds manifest_version 3, not 2"
    with pytest.raises(ManifestError, match=lie):
        open_dataset(ds, version=2)
    with pytest.raises(ManifestError, match=lie):
        safetensors_spark.history(ds)
    with pytest.raises(ManifestError, match=lie):
        safetensors_spark.vacuum(ds, retention="0")
    assert ids(open_dataset(ds, version=1)) == [0, 1, 2, 3]
    (ds / LOG / entry_name(2)).unlink()
    (ds / LOG / "99999999999999999999.json").write_text("{}")
    stray = r"_manifest_log/99999999999999999999.json: not a version number"
    for call in (lambda: open_dataset(ds, version=1), lambda: open_dataset(ds, timestamp="2100-01-01"),
                 lambda: safetensors_spark.history(ds)):
        with pytest.raises(ManifestError, match=stray):
            call()


def run_python(code, *args, timeout=60):
    """``code`` in a child Python with ``args``; a child that hangs fails the test."""
    try:
        return subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the child hung (over {timeout} s): {code}")


OPEN = """
import sys, safetensors_spark
try:
    kw = {"version": int(sys.argv[2])} if len(sys.argv) > 2 else {}
    safetensors_spark.open_dataset(sys.argv[1], **kw)
except Exception as e:
    print(type(e).__name__, e)
"""


def test_special_files_where_a_manifest_or_entry_should_be_are_refused_at_once(tmp_path):
    """Item 7: a FIFO ``dataset_manifest.json`` (open_dataset used to wait forever), a manifest
    and a log entry linked to /dev/zero (read without bound): refused at once, naming the file."""
    ds = tmp_path / "ds"
    two_versions(ds)
    entry = ds / LOG / entry_name(1)
    entry.unlink()
    os.symlink("/dev/zero", entry)
    out = run_python(OPEN, ds, 1).stdout
    assert "ManifestError" in out and "00000000000000000001.json" in out, out
    assert "not a regular file (character device)" in out, out
    with pytest.raises(ManifestError, match="not a regular file"):
        safetensors_spark.vacuum(ds, retention="0")
    manifest = ds / "dataset_manifest.json"
    manifest.unlink()
    os.symlink("/dev/zero", manifest)
    out = run_python(OPEN, ds).stdout
    assert "dataset_manifest.json: cannot be read" in out and "character device" in out, out
    manifest.unlink()
    os.mkfifo(manifest)
    out = run_python(OPEN, ds).stdout
    assert "dataset_manifest.json: cannot be read" in out and "not a regular file (FIFO)" in out, out


def test_vacuum_keeps_what_a_retained_older_version_lists_and_that_version_reads_back(tmp_path):
    """Item 12 (and 14): with a retention of one hour, version 1 (superseded a moment ago) is
    retained: the vacuum keeps shard 0, which only version 1 lists, and open_dataset(version=1)
    reads its rows. Once the retention is shorter than its age the shard goes, and version 1 is
    then refused naming the missing shard."""
    ds = tmp_path / "ds"
    names = two_versions(ds, retention=3600, gap_ms=2000)
    out = safetensors_spark.vacuum(ds)
    assert out["plan"]["shards"] == [] and (ds / names[0]).exists(), out
    assert ids(open_dataset(ds, version=1)) == [0, 1, 2, 3]
    assert ids(open_dataset(ds)) == [2, 3]
    out = safetensors_spark.vacuum(ds, retention="1 seconds", allow_shorter_retention=True)
    assert [s["name"] for s in out["plan"]["shards"]] == [names[0]], out
    assert not (ds / names[0]).exists()
    assert ids(open_dataset(ds)) == [2, 3]
    with pytest.raises(ManifestError, match="no longer in the manifest log"):
        open_dataset(ds, version=1)


@pytest.mark.parametrize("call, named", [
    (lambda p: safetensors_spark.compact(p, dry_run=1), "compact: dry_run=1: expected True or False"),
    (lambda p: safetensors_spark.compact(p, dry_run="yes"), "compact: dry_run='yes': expected True or False"),
    (lambda p: safetensors_spark.compact(p, batch_size=-1), "compact: batch_size=-1: expected a whole number"),
    (lambda p: safetensors_spark.compact(p, batch_size="2"), "compact: batch_size='2': expected a whole number"),
    (lambda p: safetensors_spark.compact(p, target_shard_size_mb=1.5), "target_shard_size_mb=1.5: expected a whole"),
    (lambda p: safetensors_spark.vacuum(p, retention=0), "vacuum: retention=0: expected a string"),
    (lambda p: safetensors_spark.vacuum(p, dry_run=1), "vacuum: dry_run=1: expected True or False"),
    (lambda p: safetensors_spark.vacuum(p, allow_shorter_retention="yes"), "allow_shorter_retention='yes'"),
    # item 11: an object-store URL is "local paths only", not "not a dataset"
    (lambda p: safetensors_spark.vacuum("s3://bucket/ds"), "vacuum: s3://bucket/ds: local paths only"),
    (lambda p: safetensors_spark.compact("s3://bucket/ds"), "compact: s3://bucket/ds: local paths only"),
    (lambda p: safetensors_spark.delete_keys("s3://bucket/ds", ["a"]),
     "delete_keys: s3://bucket/ds: local paths only; for a dataset on an object store or HDFS use "
     "safetensors_spark.spark.delete_keys(spark, path, keys)"),
    (lambda p: safetensors_spark.delete_rows("s3://bucket/ds", [("s", 0)]),
     "delete_rows: s3://bucket/ds: local paths only; for a dataset on an object store or HDFS use "
     "safetensors_spark.spark.delete(spark, path, \"_file = '…' AND _row_index = …\")"),
])
def test_maintenance_arguments_that_are_not_what_they_must_be_are_refused_naming_them(tmp_path, call, named):
    """Items 4 and 9: ``dry_run=1`` is never a real compaction, a negative or textual count never
    an OverflowError or a TypeError naming nothing; nothing is changed."""
    ds = tmp_path / "ds"
    handmade.write_batch_dataset(ds, [1, 1], batch_size=2)
    before = sorted(os.listdir(ds))
    with pytest.raises(ValueError, match=re.escape(named)):
        call(ds)
    assert sorted(os.listdir(ds)) == before


GET = """
import sys, safetensors_spark
try:
    safetensors_spark.open_dataset(sys.argv[1]).get("a")
    print("NO ERROR")
except Exception as e:
    print(type(e).__name__, e)
"""


def test_the_index_is_read_by_the_same_rule(tmp_path):
    """§5.9 for the tensor index: a linked ``_tensor_index.parquet`` is not used (the headers
    answer; its parts elsewhere are never read), and a FIFO where a part should be is refused at
    once (pyarrow would wait on it forever)."""
    ds, outside = tmp_path / "kv", tmp_path / "outside"
    values = handmade.write_kv_dataset(ds, [["a", "b"], ["c"]])
    handmade.write_index(ds)
    index = ds / "_tensor_index.parquet"
    os.rename(index, outside)
    os.symlink(outside, index)
    opened = open_dataset(ds)
    assert opened.get("c")["emb"].tolist() == values["c"]["emb"].tolist()
    assert opened._index_parts() == {}, "the linked index is not read"
    index.unlink()
    os.rename(outside, index)
    part = index / handmade.shard_name(0).replace(".safetensors", ".parquet")
    part.unlink()
    os.mkfifo(part)
    out = run_python(GET, ds).stdout
    assert out.startswith("IndexFileError") and "not a regular file (FIFO)" in out and part.name in out, out
