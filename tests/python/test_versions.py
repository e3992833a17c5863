"""Versions of a dataset (spec/dataset.md §5.8): every commit records when, what and who;
shards carry a CRC-32C; any version in the log reads back by number or time from Spark (options
and SQL), Python and torch; the MLflow input names the version it logged; the CLI lists the
history and validates every version, naming a corrupt shard."""

import json
import os
import re
import time

import mlflow
import pytest
import torch

import safetensors_spark
from safetensors_spark import ManifestError, ShardError, open_dataset
from safetensors_spark._native import file_crc32c
from safetensors_spark.mlflow import log_input
from safetensors_spark.torch import SafetensorsDataset


def _write(spark, path, start, n, mode, **opts):
    w = (spark.createDataFrame([(float(i), [float(i), float(i) * 2]) for i in range(start, start + n)],
                               "id double, x array<double>")
         .coalesce(1).write.format("safetensors").option("batch_size", 2).mode(mode))
    for k, v in opts.items():
        w = w.option(k, v)
    w.save(str(path))


def _log(path, v):
    """The whole manifest of version ``v``, rebuilt from the log (spec/dataset.md §5.10)."""
    from safetensors_spark._dataset import _rebuild_version
    from safetensors_spark._storage import open_store
    return json.loads(_rebuild_version(open_store(str(path), None, None), str(path), v))


def _ids(spark, path, **opts):
    r = spark.read.format("safetensors")
    for k, v in opts.items():
        r = r.option(k, v)
    return sorted(row.id for row in r.load(str(path)).select("id").collect())


def _utc(ms):
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}"


def test_commits_record_time_operation_writer_and_checksums_and_every_version_reads_back(spark, tmp_path, cli):
    path = tmp_path / "ds"
    _write(spark, path, 0, 4, "errorifexists")
    _write(spark, path, 4, 2, "append", commit_message="add 4-5")
    v1, v2 = _log(path, 1), _log(path, 2)
    assert (v1["operation"], v2["operation"]) == ("create", "append")
    assert v2["commit_message"] == "add 4-5" and "commit_message" not in v1
    assert v1["app_id"] == v2["app_id"] == spark.sparkContext.applicationId
    assert v1["committed_at_ms"] <= v2["committed_at_ms"] <= time.time() * 1000
    for s in v2["shards"]:  # the writer's CRC-32C is the file's
        assert s["crc32c"] == file_crc32c(str(path / s["shard_path"]))

    assert _ids(spark, path) == [0, 1, 2, 3, 4, 5]
    assert _ids(spark, path, versionAsOf=1) == [0, 1, 2, 3]
    assert _ids(spark, path, versionAsOf="2") == [0, 1, 2, 3, 4, 5]
    assert _ids(spark, path, timestampAsOf=_utc(v1["committed_at_ms"])) == [0, 1, 2, 3]
    iso = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(v2["committed_at_ms"] / 1000 + 1)) + "Z"
    assert _ids(spark, path, timestampAsOf=iso) == [0, 1, 2, 3, 4, 5]
    sql = spark.sql(f"SELECT id FROM safetensors.`{path}` VERSION AS OF 1").collect()
    assert sorted(r.id for r in sql) == [0, 1, 2, 3]
    sql = spark.sql(f"SELECT id FROM safetensors.`{path}` TIMESTAMP AS OF '{_utc(v1['committed_at_ms'])}'").collect()
    assert sorted(r.id for r in sql) == [0, 1, 2, 3]

    # Python and torch read the same versions
    assert sorted(float(open_dataset(path, version=1)[i]["id"]) for i in range(4)) == [0, 1, 2, 3]
    assert len(open_dataset(path, timestamp=_utc(v1["committed_at_ms"]))) == 4
    assert open_dataset(path, version=2, verify_checksums=True).version == 2
    assert len(SafetensorsDataset(str(path), version=1)) == 4

    # bad input: clear errors, nothing changed
    before = sorted(os.listdir(path))
    for opts, msg in [({"versionAsOf": 9}, "version 9 was never committed; the latest version is 2"),
                      ({"versionAsOf": -1}, "expected an integer ≥ 1"),
                      ({"timestampAsOf": "2000-01-01 00:00:00"}, "is before the first kept commit (version 1"),
                      ({"timestampAsOf": "soon"}, "'soon' is not a time"),
                      ({"versionAsOf": 1, "timestampAsOf": "2026-01-01"}, "not both")]:
        with pytest.raises(Exception, match=re.escape(msg)):
            _ids(spark, path, **opts)
    with pytest.raises(ManifestError, match=re.escape("version 9 was never committed")):
        open_dataset(path, version=9)
    with pytest.raises(ManifestError, match=re.escape("before the first kept commit")):
        open_dataset(path, timestamp="2000-01-01")
    assert sorted(os.listdir(path)) == before

    # an overwrite with the default retention (7 days) keeps version 1's shards: versions 1 and 2
    # read back exactly, in Spark, Python and torch
    _write(spark, path, 10, 2, "overwrite")
    assert _log(path, 3)["operation"] == "overwrite"
    assert _ids(spark, path, versionAsOf=3) == [10, 11] == _ids(spark, path)
    assert all((path / s["shard_path"]).exists() for s in v1["shards"] + v2["shards"])
    assert _ids(spark, path, versionAsOf=1) == [0, 1, 2, 3]
    old = open_dataset(path, version=2)
    assert {float(old[i]["id"]): old[i]["x"].tolist() for i in range(len(old))} == {
        float(i): [float(i), float(i) * 2] for i in range(6)}
    assert len(SafetensorsDataset(str(path), version=1)) == 4

    # history: Python, CLI (text and JSON), Spark DataFrame
    h = safetensors_spark.history(path)
    assert [(r["version"], r["operation"], r["rows_added"], r["rows_removed"]) for r in h] == [
        (1, "create", 4, 0), (2, "append", 2, 0), (3, "overwrite", 2, 6)]
    assert h[1]["commit_message"] == "add 4-5" and h[1]["app_id"] == spark.sparkContext.applicationId
    assert h[2]["bytes_removed"] == v2["total_bytes"]
    out = cli("history", "--json", path)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == h
    text = cli("history", path)
    assert text.returncode == 0 and "append" in text.stdout and 'message="add 4-5"' in text.stdout
    from safetensors_spark.spark import history as spark_history
    rows = spark_history(spark, path).orderBy("version").collect()
    assert [(r.version, r.operation, r.rows_added, r.commit_message) for r in rows] == [
        (1, "create", 4, None), (2, "append", 2, "add 4-5"), (3, "overwrite", 2, None)]

    # a vacuum outside the retention deletes them and the versions that listed them
    out = safetensors_spark.vacuum(path, retention="0", allow_shorter_retention=True)
    assert out["version"] == 4 and out["plan"]["prune_versions"] == [1, 2]
    assert not any((path / s["shard_path"]).exists() for s in v2["shards"])
    for v in (1, 2):
        with pytest.raises(ManifestError, match=re.escape(f"version {v} is no longer in the manifest log")):
            open_dataset(path, version=v)
        with pytest.raises(Exception, match=re.escape(f"version {v} is no longer in the manifest log")):
            _ids(spark, path, versionAsOf=v)
    # with retention 0 an overwrite deletes the shards it supersedes at once (the log entry stays):
    # reading that version fails naming version and shard, never a partial read
    _write(spark, path, 20, 2, "overwrite", retention="0")
    gone = _log(path, 4)["shards"][0]["shard_path"]
    assert not (path / gone).exists() and _ids(spark, path) == [20, 21]
    with pytest.raises(Exception, match=re.escape(f"version 4 lists shard {gone}, which is missing")):
        _ids(spark, path, versionAsOf=4)
    with pytest.raises(ShardError, match=re.escape(f"version 4 lists shard {gone}, which is missing")):
        open_dataset(path, version=4)


def test_kv_last_win_rewrites_carry_their_checksum_and_stay_appends(spark, tmp_path):
    path = tmp_path / "kv"
    df = lambda keys, v: spark.createDataFrame([(k, [v]) for k in keys], "k string, x array<float>")
    df(["a", "b", "c"], 1.0).coalesce(1).write.format("safetensors").option("name_col", "k").save(str(path))
    (df(["b"], 2.0).coalesce(1).write.format("safetensors").option("name_col", "k")
     .option("duplicatesStrategy", "lastWin").mode("append").save(str(path)))
    m = _log(path, 2)
    assert m["operation"] == "append" and len(m["shards"]) == 2
    for s in m["shards"]:
        assert s["crc32c"] == file_crc32c(str(path / s["shard_path"]))


def test_validate_checks_every_version_names_a_corrupt_shard_and_reads_old_datasets(spark, tmp_path, cli):
    path = tmp_path / "ds"
    _write(spark, path, 0, 4, "errorifexists")
    _write(spark, path, 4, 2, "append")
    ok = cli("validate", path)
    assert ok.returncode == 0, ok.stdout
    assert "version 1: ok (2 shards, 2 with CRC-32C verified)" in ok.stdout
    assert "version 2: ok (3 shards, 3 with CRC-32C verified)" in ok.stdout
    # one byte of a shard's data flipped, the size unchanged
    victim = _log(path, 1)["shards"][0]["shard_path"]
    data = bytearray((path / victim).read_bytes())
    data[-1] ^= 0xFF
    (path / victim).write_bytes(bytes(data))
    bad = cli("validate", path)
    assert bad.returncode == 1
    assert f"version 1: shard {victim} has CRC-32C" in bad.stdout
    assert f"version 2: shard {victim} has CRC-32C" in bad.stdout
    with pytest.raises(ShardError, match=re.escape(f"{victim}: CRC-32C is")):
        open_dataset(path, verify_checksums=True)
    data[-1] ^= 0xFF
    (path / victim).write_bytes(bytes(data))

    # a dataset written before this change: no crc32c, no commit fields, a log of whole manifests
    # (no checkpoints, spec/dataset.md §5.10) → reads and validates
    new_fields = ("committed_at_ms", "operation", "commit_message", "app_id")
    log = path / "_manifest_log"
    wholes = {log / f"{v:020d}.json": _log(path, v) for v in (1, 2)}
    for f in log.glob("*.checkpoint.json"):
        f.unlink()
    wholes[path / "dataset_manifest.json"] = json.loads((path / "dataset_manifest.json").read_text())
    for f, m in wholes.items():
        for k in new_fields:
            m.pop(k, None)
        for s in m["shards"]:
            s.pop("crc32c", None)
        f.write_text(json.dumps(m, indent=2))
    old = cli("validate", path)
    assert old.returncode == 0 and "version 2: ok (3 shards, 0 with CRC-32C verified)" in old.stdout
    assert _ids(spark, path, versionAsOf=1) == [0, 1, 2, 3]
    assert [r["operation"] for r in safetensors_spark.history(path)] == [None, None]
    assert len(open_dataset(path, version=1)) == 4


def test_a_partitioned_root_refuses_time_travel(spark, tmp_path):
    root = tmp_path / "root"
    (spark.createDataFrame([(i, [float(i)], "a" if i % 2 else "b") for i in range(4)], "id long, x array<double>, p string")
     .write.format("safetensors").option("batch_size", 1).partitionBy("p").save(str(root)))
    with pytest.raises(Exception, match="is a partitioned root; each partition directory has versions of its own"):
        _ids(spark, root, versionAsOf=1)
    assert _ids(spark, root / "p=a", versionAsOf=1) == [1, 3]


def test_mlflow_input_records_the_version_that_reads_back_the_logged_samples(spark, tmp_path):
    path = tmp_path / "ds"
    _write(spark, path, 0, 4, "errorifexists")
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    try:
        with mlflow.start_run():
            logged = log_input(str(path), context="training")
    finally:
        mlflow.set_tracking_uri("")
    _write(spark, path, 4, 2, "append")
    assert logged.version == 1 and logged.profile["manifest_version"] == 1
    back = open_dataset(path, version=logged.version)
    from safetensors_spark.mlflow import manifest_digest
    assert manifest_digest(back.manifest) == logged.digest
    assert sorted(float(back[i]["id"]) for i in range(len(back))) == [0, 1, 2, 3]
    assert len(open_dataset(path)) == 6


def test_the_log_holds_delta_entries_and_checkpoints_of_the_published_schemas(spark, tmp_path, cli):
    """spec/dataset.md §5.10: every entry a commit writes (create, append, overwrite, compaction,
    vacuum) is a delta valid against schemas/manifest_log_entry.schema.json, every checkpoint a
    manifest valid against dataset_manifest.schema.json; the Python package, the CLI and Spark
    read every version rebuilt from them, checkpoint_interval is the dataset's."""
    from pathlib import Path

    from jsonschema import Draft202012Validator
    from referencing import Registry, Resource

    root = Path(__file__).resolve().parents[2] / "schemas"
    manifest_schema = json.loads((root / "dataset_manifest.schema.json").read_text())
    entry_schema = json.loads((root / "manifest_log_entry.schema.json").read_text())
    registry = Registry().with_resource("dataset_manifest.schema.json", Resource.from_contents(manifest_schema))
    entries = Draft202012Validator(entry_schema, registry=registry)
    manifests = Draft202012Validator(manifest_schema)

    path = tmp_path / "ds"
    _write(spark, path, 0, 2, "errorifexists", checkpoint_interval="2")
    for i in range(1, 4):
        _write(spark, path, 2 * i, 2, "append")
    _write(spark, path, 100, 2, "overwrite")
    _write(spark, path, 102, 1, "append")
    _write(spark, path, 103, 1, "append")
    assert safetensors_spark.compact(path)[0]["version"] is not None
    safetensors_spark.vacuum(path, retention="0", allow_shorter_retention=True)
    log = path / "_manifest_log"
    names = sorted(p.name for p in log.iterdir())
    checkpoints = [n for n in names if n.endswith(".checkpoint.json")]
    assert checkpoints, names
    ops = []
    for n in names:
        doc = json.loads((log / n).read_text())
        if n.endswith(".checkpoint.json"):
            manifests.validate(doc)
        else:
            entries.validate(doc)
            ops.append(doc["manifest"]["operation"])
    assert ops[-2:] == ["compaction", "vacuum"], ops
    latest = json.loads((path / "dataset_manifest.json").read_text())
    assert latest["checkpoint_interval"] == 2
    kept = [int(n[:20]) for n in names if not n.endswith(".checkpoint.json")]
    for v in kept:
        # Python and Spark read each kept version the same (the vacuum removed what only
        # versions before the overwrite listed)
        m = _log(path, v)
        assert m["manifest_version"] == v
        assert sorted(open_dataset(path, version=v).manifest["shards"], key=lambda s: s["shard_path"]) == \
            sorted(m["shards"], key=lambda s: s["shard_path"])
        assert _ids(spark, path, versionAsOf=v) == sorted(
            open_dataset(path, version=v)[i]["id"].item() for i in range(len(open_dataset(path, version=v))))
    assert _ids(spark, path) == [100.0, 101.0, 102.0, 103.0]
    ok = cli("validate", path)
    assert ok.returncode == 0, ok.stdout
    h = cli("history", "--json", path)
    assert h.returncode == 0, h.stderr
    assert [r["version"] for r in json.loads(h.stdout)] == kept
