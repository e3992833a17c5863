"""Reading ragged columns (spec/reading.md §2.1, spec/dataset.md §2.1) with a real SparkSession from
datasets built by hand per the convention (tests/python/ragged_data.py), values checked against
numpy; pruning proven with the connector's bytes-read metric."""

import json

import numpy as np
import pytest
import safetensors.numpy

from ragged_data import Column, build_dataset, write_shard

COLUMNS = {
    "id": Column("fixed", "I64"),
    "tokens": Column("array", "I32"),
    "boxes": Column("array", "F32", [4]),
    "half": Column("array", "F16"),
    "jpeg": Column("binary"),
    "text": Column("string"),
}


def shard_rows(start, n, rng):
    rows = {c: [] for c in COLUMNS}
    for i in range(start, start + n):
        k = int(rng.integers(0, 6)) if i % 4 else 0  # every 4th row empty
        rows["id"].append(np.int64(i))
        rows["tokens"].append(rng.integers(-2**31, 2**31 - 1, size=k, dtype=np.int64).astype(np.int32))
        rows["boxes"].append(rng.standard_normal((k, 4)).astype(np.float32))
        rows["half"].append(rng.standard_normal(k).astype(np.float16))
        rows["jpeg"].append(bytes(rng.integers(0, 256, size=k, dtype=np.uint8)))
        rows["text"].append("".join(["é", "a", "字", "😀"][j % 4] for j in range(k)))
    return rows


def dataset(tmp_path, padded=(0, 2, 3)):
    rng = np.random.default_rng(7)
    shards = [shard_rows(0, 9, rng), shard_rows(9, 5, rng), shard_rows(14, 6, rng)]
    return build_dataset(tmp_path / "ds", COLUMNS, shards, padded=list(padded)), shards


def bytes_read(df):
    rows = df.collect()
    leaves = df._jdf.queryExecution().executedPlan().collectLeaves()
    assert leaves.size() == 1
    return rows, leaves.apply(0).metrics().apply("safetensorsBytesRead").value()


def header_len(path):
    with open(path, "rb") as f:
        return 8 + int.from_bytes(f.read(8), "little")


def test_ragged_columns_read_back_exactly(spark, tmp_path):
    out, shards = dataset(tmp_path)
    df = spark.read.format("safetensors").load(str(out))
    types = {f.name: f.dataType.simpleString() for f in df.schema.fields}
    assert types == {"id": "bigint", "tokens": "array<int>", "boxes": "array<array<float>>",
                     "half": "array<float>", "jpeg": "binary", "text": "string"}
    got = {r["id"]: r for r in df.collect()}
    want = {c: [v for s in shards for v in s[c]] for c in COLUMNS}
    assert sorted(got) == list(range(20))  # padding rows excluded
    for i in range(20):
        r = got[i]
        assert r["tokens"] == want["tokens"][i].tolist()
        assert np.array_equal(np.array(r["boxes"], np.float32).reshape(-1, 4), want["boxes"][i])
        assert np.array_equal(np.array(r["half"], np.float32), want["half"][i].astype(np.float32))
        assert bytes(r["jpeg"]) == want["jpeg"][i]
        assert r["text"] == want["text"][i]
    assert got[0]["tokens"] == [] and got[0]["jpeg"] == bytearray() and got[0]["text"] == ""
    # filters and limits over ragged columns
    from pyspark.sql import functions as F
    assert sorted(r["id"] for r in df.where(F.size("tokens") == 0).select("id").collect()) == \
        [i for i in range(20) if len(want["tokens"][i]) == 0]
    assert df.where(F.col("id") == 11).select("text").first()["text"] == want["text"][11]
    assert len(df.select("tokens").limit(3).collect()) == 3
    # the SQL functions take a ragged row like any array
    r = df.where(F.col("id") == 5).select(F.expr("st_to_array(arr_to_st(tokens))").alias("a"),
                                          F.expr("arr_to_st(boxes).shape").alias("s")).first()
    assert r["a"] == want["tokens"][5].tolist() and r["s"] == [len(want["boxes"][5]), 4]
    # per tensor and per file: the values and offsets tensors as they are
    per_tensor = spark.read.format("safetensors").option("layout", "tensor").load(str(out))
    shapes = sorted(tuple(r["shape"]) for r in per_tensor.where(F.col("key") == "tokens.offsets").collect())
    assert shapes == [(5 + 2 + 1,), (6 + 3 + 1,), (9 + 0 + 1,)]  # samples + padding + 1
    per_file = spark.read.format("safetensors").option("layout", "file").load(str(out))
    assert {"tokens", "tokens.offsets", "text", "text.offsets"} <= set(per_file.columns)


def test_a_shard_alone_is_self_describing(spark, tmp_path):
    rng = np.random.default_rng(1)
    rows = shard_rows(0, 6, rng)
    path = tmp_path / "one.safetensors"
    write_shard(path, COLUMNS, rows, padded=1)
    df = spark.read.format("safetensors").load(str(path))
    types = {f.name: f.dataType.simpleString() for f in df.schema.fields}
    # without a manifest, U8 rows of bytes read as binary (a string column too)
    assert types == {"id": "bigint", "tokens": "array<int>", "boxes": "array<array<float>>",
                     "half": "array<float>", "jpeg": "binary", "text": "binary"}
    got = sorted(df.collect(), key=lambda r: r["id"])
    assert [r["tokens"] for r in got] == [t.tolist() for t in rows["tokens"]]
    assert [bytes(r["text"]).decode() for r in got] == rows["text"]
    # per tensor: the values and offsets are plain tensors
    keys = {r["key"]: r["shape"] for r in spark.read.format("safetensors").option("layout", "tensor").load(str(path)).collect()}
    assert keys["tokens.offsets"] == [8] and keys["tokens"] == [sum(len(t) for t in rows["tokens"])]


def test_pruning_reads_no_ragged_bytes_and_only_the_rows_offsets_and_values(spark, tmp_path):
    rng = np.random.default_rng(3)
    rows = shard_rows(0, 12, rng)
    out = build_dataset(tmp_path / "ds", COLUMNS, [rows])
    shard = next(out.glob("*.safetensors"))
    h = header_len(shard)
    reader = spark.read.format("safetensors")
    # only `id`: its 12 longs, nothing of the ragged columns
    _, n = bytes_read(reader.load(str(out)).select("id"))
    assert n == h + 12 * 8
    # batches of 2 rows, limit 2: offsets entries 0..2 and the last, and rows 0-1's values only
    got, n = bytes_read(reader.option("read_batch_rows", "2").load(str(out)).select("jpeg").limit(2))
    assert [bytes(r["jpeg"]) for r in got] == rows["jpeg"][:2]
    assert n == h + 3 * 8 + 8 + len(rows["jpeg"][0]) + len(rows["jpeg"][1])


def corrupt_offsets(kind):
    def hook(_, tensors):
        o = tensors["tokens.offsets"].copy()
        if kind == "first":
            o[0] = 1
        elif kind == "last":
            o[-1] -= 1
        elif kind == "decreasing":
            o[3] = o[2] - 1
        elif kind == "beyond":
            o[5] = o[-1] + 10
        elif kind == "count":
            o = o[:-1]
        elif kind == "dtype":
            o = o.astype(np.int32)
        tensors["tokens.offsets"] = o
        return tensors
    return hook


@pytest.mark.parametrize("kind,needle", [
    ("first", "starts at 1, not 0"),
    ("last", "ends at"),
    ("decreasing", "entry 3 is"),
    ("beyond", "entry 5 is"),
    ("count", "row boundaries of 8 rows are I64 [9]"),
    ("dtype", "row boundaries of 8 rows are I64 [9]"),
])
def test_corrupt_offsets_are_an_error_naming_file_and_column(spark, tmp_path, kind, needle):
    rng = np.random.default_rng(5)
    rows = shard_rows(1, 8, rng)
    rows["tokens"] = [np.arange(i + 1, dtype=np.int32) for i in range(8)]  # no empty rows
    out = build_dataset(tmp_path / "ds", COLUMNS, [rows], tensors_hook=corrupt_offsets(kind))
    shard = next(out.glob("*.safetensors"))
    with pytest.raises(Exception) as e:
        spark.read.format("safetensors").load(str(out)).select("tokens").collect()
    msg = str(e.value)
    assert shard.name in msg and "`tokens`" in msg and needle in msg, msg


def test_invalid_utf8_names_file_column_and_row(spark, tmp_path):
    rng = np.random.default_rng(9)
    rows = shard_rows(0, 6, rng)
    rows["text"] = ["ok", "fine", "", "x", "y", "z"]
    rows["text"][3] = b"\xff\xfe"
    out = build_dataset(tmp_path / "ds", COLUMNS, [rows])
    shard = next(out.glob("*.safetensors"))
    reader = spark.read.format("safetensors").option("read_batch_rows", "2")
    # rows 0-1 come back: the bad row is neither read nor checked
    assert [r["text"] for r in reader.load(str(out)).select("text").limit(2).collect()] == ["ok", "fine"]
    with pytest.raises(Exception) as e:
        reader.load(str(out)).select("text").collect()
    msg = str(e.value)
    assert shard.name in msg and "`text`" in msg and "row 3 is not valid UTF-8" in msg, msg


def test_ragged_rows_through_ranged_reads_on_s3(spark, s3_server, tmp_path):
    """A non-local file system: each batch asks for its offsets, then for the values they span."""
    import uuid
    out, shards = dataset(tmp_path)
    bucket = f"t-{uuid.uuid4().hex[:12]}"
    client = s3_server.client()
    client.create_bucket(Bucket=bucket)
    for f in out.iterdir():
        client.put_object(Bucket=bucket, Key=f"ds/{f.name}", Body=f.read_bytes())
    conf = s3_server.hadoop_conf()
    for k, v in conf.items():
        spark.conf.set(k, v)
    try:
        remote = spark.read.format("safetensors").option("read_batch_rows", "3").load(f"s3a://{bucket}/ds")
        got = sorted((r["id"], r["tokens"], bytes(r["jpeg"]), r["text"]) for r in remote.collect())
    finally:
        for k in conf:
            spark.conf.unset(k)
    want = {c: [v for s in shards for v in s[c]] for c in COLUMNS}
    assert got == [(i, want["tokens"][i].tolist(), want["jpeg"][i], want["text"][i]) for i in range(20)]


def test_a_column_ragged_in_one_file_and_fixed_in_another_is_an_error(spark, tmp_path):
    rows = {"id": [np.int64(0), np.int64(1)], "tokens": [np.arange(2, dtype=np.int32)] * 2}
    write_shard(tmp_path / "a.safetensors", {"id": Column("fixed", "I64"), "tokens": Column("array", "I32")}, rows)
    write_shard(tmp_path / "b.safetensors", {"id": Column("fixed", "I64"), "tokens": Column("fixed", "I32")}, rows)
    with pytest.raises(Exception) as e:
        spark.read.format("safetensors").load(str(tmp_path)).collect()
    msg = str(e.value)
    assert "a.safetensors" in msg and "b.safetensors" in msg and "`tokens`" in msg \
        and "a ragged column cannot share a column with a fixed-shape one" in msg, msg
