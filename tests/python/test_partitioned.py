"""partitionBy (spec/dataset.md §9, spec/reading.md §7): one complete dataset per Hive-style
directory, each opened alone by every reader (the safetensors package, our Python package), and a
root read that restores the partition columns and lists only the directories a filter can match."""
import json
import os
from pathlib import Path

import numpy as np
import pytest
from py4j.protocol import Py4JJavaError
from safetensors.numpy import load_file

SPLITS = {0: "train", 1: "val", 2: None, 3: "a/b=c ü"}  # None and an escaped name


def error_text(action):
    try:
        action()
    except Py4JJavaError as e:
        return str(e.java_exception)
    except Exception as e:  # pyspark's own AnalysisException / IllegalArgumentException
        return str(e)
    raise AssertionError("expected the write or query to fail")


def frame(spark, n=60):
    rows = [(i, [float(i), float(-i)], SPLITS[i % 4], (i // 4) % 2) for i in range(n)]
    return spark.createDataFrame(rows, "i int, x array<float>, split string, part int").repartition(2)


def leaves(root):
    return sorted(p.parent for p in Path(root).rglob("dataset_manifest.json"))


def manifest(d):
    return json.loads((Path(d) / "dataset_manifest.json").read_text())


def shard_rows(d):
    """(i, x) of every sample of a directory's shards, read with the safetensors package."""
    out = []
    for s in manifest(d)["shards"]:
        t = load_file(str(Path(d) / s["shard_path"]))
        assert sorted(t) == ["i", "x"], t.keys()  # partition columns are not tensors
        out += [(int(i), tuple(x)) for i, x in zip(t["i"][: s["samples_count"]], t["x"][: s["samples_count"]])]
    return sorted(out)


def test_each_partition_directory_is_a_complete_dataset(spark, tmp_path):
    out = tmp_path / "ds"
    frame(spark).write.format("safetensors").option("batch_size", 4).partitionBy("split", "part").save(str(out))
    dirs = leaves(out)
    names = sorted(str(d.relative_to(out)) for d in dirs)
    assert names == sorted(
        f"split={s}/part={p}" for s in ("train", "val", "__HIVE_DEFAULT_PARTITION__", "a%2Fb%3Dc ü") for p in (0, 1)
    ), names
    import safetensors_spark

    for d in dirs:
        split = d.parent.name.split("=", 1)[1]
        want_split = {"train": "train", "val": "val", "__HIVE_DEFAULT_PARTITION__": None, "a%2Fb%3Dc ü": "a/b=c ü"}[split]
        part = int(d.name.split("=")[1])
        want = sorted((i, (float(i), float(-i))) for i in range(60) if SPLITS[i % 4] == want_split and (i // 4) % 2 == part)
        assert shard_rows(d) == want, d
        m = manifest(d)
        assert m["total_samples"] == len(want)
        # our Python package opens a partition directory alone
        ds = safetensors_spark.open_dataset(str(d))
        assert len(ds) == len(want)
        # and so does the Spark reader, without partition columns
        assert spark.read.format("safetensors").load(str(d)).columns == ["i", "x"]


def test_reading_the_root_restores_the_partition_columns(spark, tmp_path):
    out = tmp_path / "ds"
    df = frame(spark)
    df.write.format("safetensors").option("batch_size", 4).partitionBy("split", "part").save(str(out))
    back = spark.read.format("safetensors").load(str(out))
    assert [(f.name, f.dataType.simpleString()) for f in back.schema.fields] == [
        ("i", "int"), ("x", "array<float>"), ("split", "string"), ("part", "int")]
    got = sorted(tuple(r) for r in back.select("i", "x", "split", "part").collect())
    want = sorted((r["i"], r["x"], r["split"], r["part"]) for r in df.collect())
    assert got == want
    # only the partition columns, and none at all (count)
    assert sorted([tuple(r) for r in back.select("part", "split").distinct().collect()], key=str) == sorted(
        {((i // 4) % 2, SPLITS[i % 4]) for i in range(60)}, key=str)
    assert back.count() == 60
    assert back.where("split is null").count() == 15
    assert back.where("split = 'a/b=c ü' and part = 1").select("i").collect()[0]["i"] % 4 == 3


def test_filters_on_partition_columns_skip_the_other_directories(spark, tmp_path):
    out = tmp_path / "ds"
    frame(spark).write.format("safetensors").option("batch_size", 4).partitionBy("split", "part").save(str(out))
    # damage every shard outside split=train but in the first directory (its headers give the
    # table's schema): a query that lists or reads them fails
    for d in leaves(out)[1:]:
        if d.parent.name != "split=train":
            for s in manifest(d)["shards"]:
                (d / s["shard_path"]).write_bytes(b"\x01")
    root = spark.read.format("safetensors").load(str(out))
    assert root.where("split = 'train'").count() == 15
    assert root.where("split in ('train') and part >= 1").count() == sum(1 for i in range(0, 60, 4) if (i // 4) % 2)
    assert root.where("split like 'tr%' or (split = 'train' and part = 5)").count() == 15
    assert root.where("split = 'train' and i > 50").count() == sum(1 for i in range(51, 60) if i % 4 == 0)
    # the other directories are there and damaged: without the filter the query fails
    assert "safetensors" in error_text(lambda: root.count())
    assert "safetensors" in error_text(lambda: root.where("part = 0").count())


def test_kv_mode_partitions_with_their_own_index(spark, tmp_path):
    out = tmp_path / "kv"
    df = spark.createDataFrame([(f"k{i}", [float(i)] * 3, "even" if i % 2 == 0 else "odd") for i in range(40)],
                               "k string, v array<float>, parity string")
    df.write.format("safetensors").option("name_col", "k").option("generate_index", "true") \
        .partitionBy("parity").save(str(out))
    for d in leaves(out):
        assert (d / "_tensor_index.parquet").is_dir()
        keys = {k for s in manifest(d)["shards"] for k in load_file(str(d / s["shard_path"]))}
        want = {f"k{i}__v" for i in range(40) if (i % 2 == 0) == (d.name == "parity=even")}
        assert keys == want
    root = spark.read.format("safetensors").load(str(out))
    hit = root.where("parity = 'odd' and key = 'k7__v'").collect()
    assert len(hit) == 1 and hit[0]["parity"] == "odd"
    assert root.where("parity = 'even' and key = 'k7__v'").count() == 0


def test_append_adds_to_each_directory_and_creates_new_ones(spark, tmp_path):
    out = tmp_path / "ds"
    w = lambda df, mode: df.write.format("safetensors").mode(mode).option("batch_size", 4).partitionBy("split").save(str(out))
    w(frame(spark, 8).where("split in ('train', 'val')"), "errorifexists")
    w(frame(spark, 16).where("split = 'train' or split is null"), "append")
    back = spark.read.format("safetensors").load(str(out))
    counts = {r["split"]: r["count"] for r in back.groupBy("split").count().collect()}
    assert counts == {"train": 2 + 4, "val": 2, None: 4}
    # errorifexists and ignore see the root
    assert "already exists" in error_text(lambda: w(frame(spark, 8), "errorifexists"))
    w(frame(spark, 8), "ignore")
    assert spark.read.format("safetensors").load(str(out)).count() == 12
    # an append without options takes each directory's settings (its manifest); a new directory
    # has none to take, and fails the append before any directory is written
    append = lambda df: df.write.format("safetensors").mode("append").partitionBy("split").save(str(out))
    before = {d: manifest(d)["manifest_version"] for d in leaves(out)}
    assert "batch_size" in error_text(lambda: append(frame(spark, 8)))
    assert {d: manifest(d)["manifest_version"] for d in leaves(out)} == before
    append(frame(spark, 8).where("split = 'val'"))
    val = manifest(out / "split=val")
    assert (val["batch_size"], val["total_samples"], val["manifest_version"]) == (4, 4, 2)


def test_static_overwrite_empties_unwritten_directories_and_dynamic_keeps_them(spark, tmp_path):
    out = tmp_path / "ds"
    w = lambda df, mode, **o: df.write.format("safetensors").mode(mode).option("batch_size", 2).options(**o).partitionBy("split").save(str(out))
    w(frame(spark, 20).where("split in ('train', 'val')"), "overwrite")
    foreign = out / "split=val" / "notes.txt"
    foreign.write_text("mine")
    train_v1 = {s["shard_path"] for s in manifest(out / "split=train")["shards"]}
    # dynamic: only the directories written are replaced; train's replaced shards stay for its
    # version 1 (default retention)
    w(frame(spark, 8).where("split = 'train'"), "overwrite", partitionOverwriteMode="dynamic")
    counts = {r["split"]: r["count"] for r in spark.read.format("safetensors").load(str(out)).groupBy("split").count().collect()}
    assert counts == {"train": 2, "val": 5}
    assert all((out / "split=train" / f).exists() for f in train_v1)
    old = spark.read.format("safetensors").option("versionAsOf", 1).load(str(out / "split=train")).collect()
    assert sorted(r["i"] for r in old) == [0, 4, 8, 12, 16]
    # static (Spark's default): the root is replaced; val stays a dataset with no samples (retention
    # 0, also for the directories emptied: their shards are deleted at once)
    w(frame(spark, 8).where("split = 'train'"), "overwrite", retention="0")
    counts = {r["split"]: r["count"] for r in spark.read.format("safetensors").load(str(out)).groupBy("split").count().collect()}
    assert counts == {"train": 2}
    assert manifest(out / "split=val")["total_samples"] == 0
    assert not list((out / "split=val").glob("*.safetensors"))
    assert foreign.read_text() == "mine"  # nothing foreign deleted


@pytest.mark.parametrize(
    "columns,frame_sql,message",
    [
        (["nope"], None, "partitionBy column 'nope' is not a column"),
        (["x"], None, "partitionBy column 'x' is array<float>"),
        (["split", "split"], None, "names a column twice"),
        (["i", "split"], "select i, split from t", "leaves no column to write"),
        (["_p"], "select x, 1 as _p from t", "would be hidden from readers"),
        (["d"], "select x, cast(i as double) as d from t", "partitionBy column 'd' is double"),
    ],
)
def test_bad_partition_columns_fail_before_writing(spark, tmp_path, columns, frame_sql, message):
    out = tmp_path / "bad"
    df = frame(spark, 8)
    if frame_sql:
        df.createOrReplaceTempView("t")
        df = spark.sql(frame_sql)
    msg = error_text(lambda: df.write.format("safetensors").option("batch_size", 2).partitionBy(*columns).save(str(out)))
    assert message in msg, msg
    assert not out.exists()


def test_values_that_cannot_be_directory_names_and_bad_options_fail_before_writing(spark, tmp_path):
    out = tmp_path / "bad"
    long_value = "v" * 300
    df = spark.createDataFrame([([1.0], "ok"), ([2.0], long_value)], "x array<float>, split string")
    msg = error_text(lambda: df.write.format("safetensors").option("batch_size", 2).partitionBy("split").save(str(out)))
    assert "column 'split'" in msg and long_value in msg and "at most 255" in msg, msg
    assert not out.exists()  # not even the valid value's directory
    msg = error_text(lambda: df.write.format("safetensors").option("batch_size", 2).option("partitionOverwriteMode", "sometimes")
                     .partitionBy("split").save(str(out)))
    assert "'partitionOverwriteMode' must be static or dynamic" in msg, msg
    # a write option error is found before any directory is written
    msg = error_text(lambda: df.write.format("safetensors").option("batch_size", "-1").partitionBy("split").save(str(out)))
    assert "batch_size" in msg, msg
    assert not out.exists()
    kv = spark.createDataFrame([("k", [1.0])], "k string, v array<float>")
    msg = error_text(lambda: kv.write.format("safetensors").option("name_col", "k").partitionBy("k").save(str(out)))
    assert "KV name column 'k' cannot also be a partitionBy column" in msg, msg


def test_a_root_mixing_partition_and_other_directories_is_refused_naming_it(spark, tmp_path):
    out = tmp_path / "ds"
    frame(spark, 8).drop("split").write.format("safetensors").option("batch_size", 2).partitionBy("part").save(str(out))
    (out / "stray").mkdir()
    msg = error_text(lambda: spark.read.format("safetensors").load(str(out)).count())
    assert "stray" in msg and "partition directories" in msg, msg
    os.rmdir(out / "stray")
    import shutil
    shutil.copytree(out / "part=0", out / "other=0")
    msg = error_text(lambda: spark.read.format("safetensors").load(str(out)).count())
    assert "conflicting partition directories" in msg, msg


def test_partition_values_keep_their_integer_type_or_become_strings(spark, tmp_path):
    out = tmp_path / "ds"
    df = spark.createDataFrame([([1.0], 2**40, "007"), ([2.0], 3, "8")], "x array<float>, big bigint, code string")
    df.write.format("safetensors").option("batch_size", 1).partitionBy("big", "code").save(str(out))
    back = spark.read.format("safetensors").load(str(out))
    types = {f.name: f.dataType.simpleString() for f in back.schema.fields}
    # like Spark's file sources, "007" and "8" read back as integers; turn inference off for strings
    assert types["big"] == "bigint" and types["code"] == "int", types
    assert sorted(r["big"] for r in back.collect()) == [3, 2**40]
    spark.conf.set("spark.sql.sources.partitionColumnTypeInference.enabled", "false")
    try:
        back = spark.read.format("safetensors").load(str(out))
        assert sorted(r["code"] for r in back.collect()) == ["007", "8"]
    finally:
        spark.conf.unset("spark.sql.sources.partitionColumnTypeInference.enabled")
    assert np.array_equal(np.array(sorted(r["x"][0] for r in back.collect())), np.array([1.0, 2.0]))
