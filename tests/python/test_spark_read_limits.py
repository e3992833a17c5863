"""Read-path limits through Spark: offsets beyond 2 GiB, and headers at the 100,000,000-byte cap.

The big file is sparse (its 2.2 GB tensor is a hole), so the test costs little disk or time;
only the tensors a query selects are read.
"""
import json
import struct

import numpy as np
import pytest
from pyspark.sql import functions as F

BIG = 2_200_000_000  # bytes of the U8 tensor `big`: `small` starts beyond 2^31


def write_sparse(path, small):
    header = json.dumps({
        "__metadata__": {"kind": "sparse"},
        "big": {"dtype": "U8", "shape": [BIG], "data_offsets": [0, BIG]},
        "small": {"dtype": "F32", "shape": [4], "data_offsets": [BIG, BIG + 16]},
    }).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)
        f.seek(8 + len(header) + BIG)
        f.write(small.tobytes())
    return 8 + len(header)


def errors(e):
    return str(e)


def test_tensor_beyond_2_gib_is_read_by_offset_and_an_oversized_value_is_a_named_error(spark, tmp_path):
    small = np.array([1.5, -2.0, 3.25, 1e-3], dtype=np.float32)
    path = tmp_path / "sparse.safetensors"
    write_sparse(path, small)
    df = spark.read.format("safetensors").load(str(path))  # not our shard: auto = per tensor
    assert [f.name for f in df.schema.fields][:6] == ["file", "key", "dtype", "shape", "byte_size", "data"]

    rows = {r.key: r for r in df.select("key", "dtype", "shape", "byte_size").collect()}
    assert rows["big"].byte_size == BIG and rows["big"].shape == [BIG] and rows["small"].shape == [4]

    got = df.where(F.col("key") == "small").select("data", "decoded", "metadata").collect()
    assert len(got) == 1
    assert bytes(got[0].data) == small.tobytes()
    assert np.array_equal(np.array(got[0].decoded, dtype=np.float32), small)
    assert got[0].metadata == {"kind": "sparse"}

    per_file = spark.read.format("safetensors").option("layout", "file").load(str(path))
    assert per_file.select("small.data").collect()[0][0] == bytearray(small.tobytes())
    assert per_file.select("big.shape").collect()[0][0] == [BIG]

    with pytest.raises(Exception) as e:
        df.where(F.col("key") == "big").select("data").collect()
    assert "big" in errors(e.value) and "2147483647" in errors(e.value), errors(e.value)
    # The JVM is still fine afterwards.
    assert df.count() == 2


def framed_with_padding(total_header_len):
    body = json.dumps({"t": {"dtype": "I16", "shape": [3], "data_offsets": [0, 6]}}).encode()
    header = body + b" " * (total_header_len - len(body))
    return struct.pack("<Q", len(header)) + header + np.array([7, -8, 9], dtype="<i2").tobytes()


def test_header_at_the_100_mb_cap_is_read_and_one_byte_more_is_refused(spark, tmp_path):
    ok = tmp_path / "ok" / "cap.safetensors"
    ok.parent.mkdir()
    ok.write_bytes(framed_with_padding(100_000_000))
    rows = spark.read.format("safetensors").load(str(ok)).select("key", "decoded").collect()
    assert [(r.key, r.decoded) for r in rows] == [("t", [7, -8, 9])]

    bad = tmp_path / "bad" / "over.safetensors"
    bad.parent.mkdir()
    bad.write_bytes(framed_with_padding(100_000_001))
    with pytest.raises(Exception) as e:
        spark.read.format("safetensors").load(str(bad)).collect()
    assert "over.safetensors" in errors(e.value) and "header too large" in errors(e.value), errors(e.value)


def write_many_empty(path, n):
    """A valid file of `n` zero-size F32 tensors `t0`…: a header of about 58 bytes a tensor."""
    header = json.dumps({f"t{i}": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]} for i in range(n)},
                        separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)


def test_per_file_layout_of_200k_tensors_is_a_named_error_not_a_dead_driver(spark, tmp_path):
    # 200,000 zero-size tensors (an 11 MB header, valid): a column each per file took the
    # driver's heap (OutOfMemoryError, dead SparkContext); now the file is refused by name
    hostile = tmp_path / "hostile.safetensors"
    write_many_empty(hostile, 200_000)
    with pytest.raises(Exception) as e:
        spark.read.format("safetensors").option("layout", "file").load(str(hostile)).count()
    msg = errors(e.value)
    for part in ["hostile.safetensors", "200000 tensors", "at most 10000", "file_layout_max_tensors",
                 "layout `tensor`"]:
        assert part in msg, msg[:2000]
    # skipped with ignoreCorruptFiles, beside a good file that is read
    good = tmp_path / "good.safetensors"
    write_many_empty(good, 3)
    both = (spark.read.format("safetensors").option("layout", "file").option("ignoreCorruptFiles", "true")
            .load([str(hostile), str(good)]))
    assert [r.file for r in both.select("file").collect()] == [good.as_uri().replace("file:///", "file:/")]
    assert [f.name for f in both.schema.fields][:4] == ["file", "t0", "t1", "t2"]
    # the session lives on
    assert spark.range(3).count() == 3
    # the limit is an option: a smaller one refuses a smaller file
    with pytest.raises(Exception) as e:
        spark.read.format("safetensors").option("layout", "file").option("file_layout_max_tensors", "2") \
            .load(str(good)).count()
    assert "3 tensors" in errors(e.value) and "at most 2" in errors(e.value), errors(e.value)[:2000]
