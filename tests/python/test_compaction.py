"""Compaction of datasets Spark wrote, from Python and the CLI (spec/dataset.md §5.8.2): the same
rows and values after as before, one `compaction` version, the index rebuilt, partitions chosen,
bad input refused with nothing changed."""

import json
import os

import pytest

import safetensors_spark


def _tree(d):
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def _manifest(d):
    return json.loads((d / "dataset_manifest.json").read_text())


def _rows(spark, path, **opts):
    r = spark.read.format("safetensors")
    for k, v in opts.items():
        r = r.option(k, v)
    df = r.load(str(path))
    if "key" in df.columns:  # KV: one row per tensor; the file it lives in changes
        df = df.select("key", "dtype", "shape", "data")
    return sorted(tuple(row) for row in df.collect())


def _batch_appends(spark, path):
    """Three appends of 2 partitions each with tail_strategy=pad: six small pad tails, a ragged
    string column (empty rows too) and a fixed float column."""
    for a in range(3):
        rows = [(a * 100 + i, [float(i) + 0.5, -float(a)], "w" * ((i + a) % 4)) for i in range(5)]
        df = spark.createDataFrame(rows, "id long, x array<float>, s string").repartition(2)
        df.write.format("safetensors").option("batch_size", 4).option("tail_strategy", "pad") \
            .mode("append").save(str(path))


def test_python_compaction_of_ragged_pad_tails_keeps_every_value(spark, tmp_path):
    ds = tmp_path / "ds"
    _batch_appends(spark, ds)
    before_rows = _rows(spark, ds)
    m0 = _manifest(ds)
    small = [s["shard_path"] for s in m0["shards"] if s["samples_count"] < 4]
    assert len(small) >= 3
    # dry run: the plan, nothing changed
    tree = _tree(ds)
    [dry] = safetensors_spark.compact(ds, dry_run=True)
    assert dry["dry_run"] and dry["version"] is None and dry["plan"]["replaced"] == small
    assert _tree(ds) == tree
    [out] = safetensors_spark.compact(ds, commit_message="nightly compaction")
    m = _manifest(ds)
    assert out["version"] == m["manifest_version"] == m0["manifest_version"] + 1
    assert m["operation"] == "compaction" and m["commit_message"] == "nightly compaction"
    assert m["total_samples"] == m0["total_samples"] == 15
    assert sum(1 for s in m["shards"] if s["samples_count"] < 4) <= 1
    assert _rows(spark, ds) == before_rows  # Spark reads the same rows, ragged strings included
    assert len(safetensors_spark.open_dataset(str(ds), verify_checksums=True)) == 15
    # retention (default 7 days): the replaced shards stay for vacuum; the old version reads back
    assert not out["replaced_deleted"] and all((ds / s).exists() for s in small)
    assert _rows(spark, ds, versionAsOf=m0["manifest_version"]) == before_rows
    h = safetensors_spark.history(ds)[-1]
    assert (h["operation"], h["rows_added"], h["rows_removed"]) == ("compaction", 15 - 4 * (len(m0["shards"]) - len(small)), h["rows_added"])
    assert h["rows_added"] == sum(s["samples_count"] for s in m0["shards"] if s["shard_path"] in small)
    # again: nothing left to merge, no new version
    [again] = safetensors_spark.compact(ds)
    assert again["version"] is None and again["plan"]["outputs"] == []


def test_cli_compacts_kv_and_rebuilds_its_index(spark, tmp_path, cli):
    ds = tmp_path / "kv"
    for a in range(3):
        df = spark.createDataFrame([(f"k{a}-{i}", [float(i)] * (i + 1)) for i in range(6)], "k string, v array<float>")
        df.repartition(3).write.format("safetensors").option("name_col", "k").option("generate_index", "true") \
            .mode("append").save(str(ds))
    before_rows = _rows(spark, ds)
    m0 = _manifest(ds)
    r = cli("compact", "--target-shard-size-mb", "1", ds)
    assert r.returncode == 0, r.stderr
    [out] = json.loads(r.stdout)
    m = _manifest(ds)
    assert m["operation"] == "compaction" and len(m["shards"]) == 1 < len(m0["shards"])
    assert not out["replaced_deleted"] and all((ds / s).exists() for s in out["plan"]["replaced"])
    assert _rows(spark, ds) == before_rows
    # the index: one part per listed shard, as many rows as its tensors; a key lookup uses it
    import pyarrow.parquet as pq
    for s in m["shards"]:
        part = ds / "_tensor_index.parquet" / s["shard_path"].replace(".safetensors", ".parquet")
        assert pq.read_table(part).num_rows == s["num_tensors"]
    got = spark.read.format("safetensors").load(str(ds)).where("key = 'k1-4__v'").collect()
    assert [list(x.decoded) for x in got] == [[4.0] * 5]
    assert safetensors_spark.open_dataset(str(ds)).get("k1-4")["v"].tolist() == [4.0] * 5
    # batch_size is not a KV option: usage is fine, the plan refuses it, nothing changes
    tree = _tree(ds)
    r = cli("compact", "--batch-size", "4", ds)
    assert r.returncode == 1 and "batch_size is for batch datasets" in r.stderr
    assert _tree(ds) == tree


def test_partitions_are_compacted_alone_and_bad_input_changes_nothing(spark, tmp_path, cli):
    root = tmp_path / "p"
    for a in range(2):
        df = spark.createDataFrame([(i, float(i), "train" if i % 2 else "test") for i in range(a * 10, a * 10 + 6)],
                                   "id long, x float, split string")
        df.write.format("safetensors").option("batch_size", 4).partitionBy("split").mode("append").save(str(root))
    tree = _tree(root)
    for kwargs, msg in [({"partitions": ["split=dev"]}, "no partition split=dev; the partitions are: split=test, split=train"),
                        ({"partitions": ["lang=en"]}, "'lang' is not a partition column"),
                        ({"batch_size": 0}, "batch_size is 0"),
                        ({"batch_size": 8}, "batch_size is 8, the dataset has batch_size 4")]:
        with pytest.raises(ValueError, match=msg):
            safetensors_spark.compact(root, **kwargs)
    with pytest.raises(ValueError, match="not a dataset"):
        safetensors_spark.compact(tmp_path / "nowhere")
    r = cli("compact", "--batch-size", "x", root)
    assert r.returncode == 2 and "expected a whole number" in r.stderr
    assert _tree(root) == tree
    before = _rows(spark, root)
    [out] = safetensors_spark.compact(root, partitions=["split=train"])
    assert out["dataset"].endswith("split=train") and out["version"] == 3
    assert _manifest(root / "split=test")["manifest_version"] == 2  # the other partition untouched
    assert _rows(spark, root) == before
    # a dataset another tool wrote (published fields only) is refused
    other = tmp_path / "other"
    other.mkdir()
    shard = next((root / "split=test").glob("*.safetensors"))
    (other / shard.name).write_bytes(shard.read_bytes())
    (other / "dataset_manifest.json").write_text(json.dumps({
        "format_version": "1.0", "safetensors_version": "1.0", "total_samples": 1,
        "total_bytes": shard.stat().st_size, "schema": {},
        "shards": [{"shard_path": shard.name, "samples_count": 1, "bytes": shard.stat().st_size}]}))
    with pytest.raises(ValueError, match="written by another tool"):
        safetensors_spark.compact(other)


def _held_compaction(rust_tools, ds, go):
    """Starts `safetensors-spark compact DS` as its own process, held after its new shards are in
    place and before its commit (the CLI's test hook), and waits until it is held there."""
    import subprocess
    import time

    env = dict(os.environ, SAFETENSORS_SPARK_TEST_COMPACT_PAUSE=str(go))
    proc = subprocess.Popen([str(rust_tools / "safetensors-spark"), "compact", str(ds)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ready = go.with_name(go.name + ".ready")
    while not ready.exists():
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    return proc


def test_forced_race_a_real_append_during_a_compaction_is_kept_an_overwrite_fails_it(spark, tmp_path, rust_tools):
    ds = tmp_path / "ds"
    _batch_appends(spark, ds)
    v = _manifest(ds)["manifest_version"]
    # 1: the compaction process is held; a Spark append commits version v+1; the compaction
    # then commits v+2 on top of it
    proc = _held_compaction(rust_tools, ds, tmp_path / "go1")
    extra = spark.createDataFrame([(900 + i, [9.0, 9.0], "late") for i in range(3)], "id long, x array<float>, s string")
    extra.coalesce(1).write.format("safetensors").option("batch_size", 4).option("tail_strategy", "pad") \
        .mode("append").save(str(ds))
    assert _manifest(ds)["manifest_version"] == v + 1
    want = _rows(spark, ds)
    (tmp_path / "go1").touch()
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    [out] = json.loads(stdout)
    assert (out["plan"]["base_version"], out["committed_on"], out["version"]) == (v, v + 1, v + 2)
    m = _manifest(ds)
    assert m["operation"] == "compaction" and m["total_samples"] == 18
    assert _rows(spark, ds) == want  # the appended rows are kept
    # 2: the held compaction loses to an overwrite: it fails naming the version, deletes its own
    # shards only, commits nothing
    extra.coalesce(1).write.format("safetensors").option("batch_size", 4).option("tail_strategy", "pad") \
        .mode("append").save(str(ds))
    proc = _held_compaction(rust_tools, ds, tmp_path / "go2")
    extra.write.format("safetensors").option("batch_size", 4).mode("overwrite").save(str(ds))
    ow = _manifest(ds)["manifest_version"]
    files_before = set(os.listdir(ds))
    (tmp_path / "go2").touch()
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 1 and f"version {ow} (overwrite) removed it" in stderr, stderr
    assert _manifest(ds)["manifest_version"] == ow
    # the held compaction's own new shards were deleted; every other file stays
    gone = files_before - set(os.listdir(ds))
    assert gone and all(f.endswith(".safetensors") and f not in str(_manifest(ds)) for f in gone)
    assert all(f in files_before for f in os.listdir(ds))
    assert sorted(r[0] for r in _rows(spark, ds)) == [900, 901, 902]


def test_spark_compaction_through_hadoop_keeps_every_value(spark, tmp_path):
    from safetensors_spark.spark import compact as spark_compact

    ds = tmp_path / "ds"
    _batch_appends(spark, ds)
    before = _rows(spark, ds)
    m0 = _manifest(ds)
    with pytest.raises(Exception, match="unknown option 'batchsize'"):
        spark_compact(spark, str(ds), batchsize=4)
    with pytest.raises(Exception, match="batch_size is 8, the dataset has batch_size 4"):
        spark_compact(spark, str(ds), batch_size=8)
    # issue #39 item 4: dry_run=1 (or "yes") is refused naming the option, never a real compaction
    for bad in (1, "yes"):
        with pytest.raises(Exception, match=f"option 'dry_run' must be true or false, got '{bad}'"):
            spark_compact(spark, str(ds), dry_run=bad)
    with pytest.raises(Exception, match="option batch_size = '-3': expected a whole number"):
        spark_compact(spark, str(ds), batch_size="-3")
    assert _manifest(ds) == m0
    [dry] = spark_compact(spark, str(ds), dry_run=True).collect()
    assert dry.version is None and _manifest(ds) == m0
    [r] = spark_compact(spark, str(ds), commit_message="spark compaction").collect()
    m = _manifest(ds)
    assert r.version == m["manifest_version"] == m0["manifest_version"] + 1 and r.rows == dry.rows
    assert m["operation"] == "compaction" and m["commit_message"] == "spark compaction"
    assert m["app_id"] == spark.sparkContext.applicationId
    assert m["total_samples"] == m0["total_samples"]
    assert _rows(spark, ds) == before
    assert len(safetensors_spark.open_dataset(str(ds), verify_checksums=True)) == 15
