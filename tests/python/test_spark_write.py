"""PySpark writes with the connector jar, read back with the Python `safetensors` package.

Every value is compared with numpy's (and ml_dtypes') own conversion of the same input.
"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import ml_dtypes
import numpy as np
import pytest
import safetensors
import safetensors.numpy
from py4j.protocol import Py4JJavaError
from pyspark.ml.linalg import Vectors
from pyspark.sql import functions as F
from pyspark.sql import types as T

ROOT = Path(__file__).resolve().parents[2]
MANIFEST_SCHEMA = json.loads((ROOT / "schemas" / "dataset_manifest.schema.json").read_text())
RNG = np.random.default_rng(7)


def shards(path):
    return sorted(p for p in Path(path).iterdir() if p.suffix == ".safetensors" and not p.name.startswith((".", "_")))


def manifest(path):
    m = json.loads((Path(path) / "dataset_manifest.json").read_text())
    jsonschema.validate(m, MANIFEST_SCHEMA)
    assert m["total_samples"] == sum(s["samples_count"] for s in m["shards"])
    assert m["total_bytes"] == sum(s["bytes"] for s in m["shards"])
    assert [s["shard_path"] for s in m["shards"]] == [p.name for p in shards(path)]
    for s in m["shards"]:
        assert (Path(path) / s["shard_path"]).stat().st_size == s["bytes"]
    return m


def load_all(path):
    """Concatenates every shard's tensors in shard order: {name: array}."""
    out = {}
    for p in shards(path):
        for k, v in safetensors.numpy.load_file(str(p)).items():
            out.setdefault(k, []).append(v)
    return {k: np.concatenate(v) if v[0].ndim else np.stack(v) for k, v in out.items()}


def float_rows(n, width):
    """Doubles that are exactly float32 values, so every rounding to F16/BF16 is a single rounding
    whichever reference does it (ml_dtypes rounds float64 -> bfloat16 through float32)."""
    vals = RNG.standard_normal((n, width)).astype(np.float32)
    vals[0, :4] = [np.float32(1e-7), np.float32(65520.0), np.float32(-0.0), np.float32(3.0e38)]
    return vals


@pytest.mark.parametrize("dtype,numpy_dtype", [("F32", np.float32), ("F16", np.float16), ("BF16", ml_dtypes.bfloat16), ("F64", np.float64)])
def test_batch_mode_values_equal_numpy_conversion(spark, tmp_path, dtype, numpy_dtype):
    vals = float_rows(10, 5)
    df = spark.createDataFrame([(i, [float(x) for x in row]) for i, row in enumerate(vals)], "id long, x array<double>").coalesce(1)
    out = tmp_path / "ds"
    df.write.format("safetensors").option("batch_size", 4).option("dtype", dtype).option("columns", "x").save(str(out))
    files = shards(out)
    assert [p.name.split("-")[1:3] for p in files] == [["00000", "0000"], ["00000", "0001"], ["00000", "0002"]]
    got = load_all(out)["x"]
    with np.errstate(over="ignore"):  # 3e38 and 65520 overflow to inf in F16, as they must
        want = vals.astype(np.float64).astype(numpy_dtype)
    assert got.dtype == want.dtype and got.shape == (10, 5)
    assert np.array_equal(got.view(np.uint8), want.view(np.uint8))
    m = manifest(out)
    assert (m["layout"], m["batch_size"], m["total_samples"], m["schema"]) == ("batch", 4, 10, {"x": {"dtype": dtype, "shape": [4, 5]}})


def test_default_save_mode_and_natural_dtypes_of_every_numeric_type(spark, tmp_path):
    schema = "b array<boolean>, i8 array<byte>, i16 array<short>, i32 array<int>, i64 array<long>, f array<float>, d array<double>, s long"
    rows = [([True, False], [1, -2], [300, -4], [70000, 5], [2**40, -1], [1.5, 2.5], [0.1, 0.2], 9) for _ in range(3)]
    out = tmp_path / "ds"
    spark.createDataFrame(rows, schema).coalesce(1).write.format("safetensors").option("batch_size", 8).save(str(out))
    got = load_all(out)
    assert {k: (str(v.dtype), v.shape) for k, v in got.items()} == {
        "b": ("bool", (3, 2)), "i8": ("int8", (3, 2)), "i16": ("int16", (3, 2)), "i32": ("int32", (3, 2)),
        "i64": ("int64", (3, 2)), "f": ("float32", (3, 2)), "d": ("float64", (3, 2)), "s": ("int64", (3,)),
    }
    assert got["i64"][0].tolist() == [2**40, -1] and got["d"][2].tolist() == [0.1, 0.2]
    with pytest.raises(Exception, match="(?i)exist"):
        spark.createDataFrame(rows, schema).write.format("safetensors").option("batch_size", 8).save(str(out))


@pytest.mark.parametrize("tail,expected_rows,padded,dropped", [("write", [4, 4, 2], 0, 0), ("drop", [4, 4], 0, 2), ("pad", [4, 4, 4], 2, 0)])
def test_tail_strategies(spark, tmp_path, tail, expected_rows, padded, dropped):
    df = spark.createDataFrame([([float(i), float(-i)],) for i in range(10)], "x array<float>").coalesce(1)
    out = tmp_path / tail
    df.write.format("safetensors").option("batch_size", 4).option("tail_strategy", tail).save(str(out))
    rows = [safetensors.numpy.load_file(str(p))["x"].shape[0] for p in shards(out)]
    assert rows == expected_rows
    m = manifest(out)
    assert (m["total_samples"], m["padded_samples"], m["dropped_samples"]) == (10 - dropped, padded, dropped)
    if tail == "pad":
        with safetensors.safe_open(str(shards(out)[-1]), framework="np") as f:
            assert f.metadata()["safetensors_spark.samples"] == "2"
            assert f.metadata()["safetensors_spark.padded_samples"] == "2"
            assert not f.get_tensor("x")[2:].any()


def test_nested_arrays_become_multi_dimensional_and_ragged_is_an_error(spark, tmp_path):
    img = RNG.integers(0, 255, size=(3, 2, 3, 4)).astype(np.uint8)
    df = spark.createDataFrame([(x.tolist(),) for x in img], "img array<array<array<int>>>").coalesce(1)
    out = tmp_path / "nested"
    df.write.format("safetensors").option("batch_size", 3).option("dtype", "U8").save(str(out))
    got = load_all(out)["img"]
    assert got.dtype == np.uint8 and np.array_equal(got, img)
    ragged = spark.createDataFrame([([[1, 2], [3]],)], "m array<array<int>>")
    with pytest.raises(Py4JJavaError, match="ragged"):
        ragged.write.format("safetensors").option("batch_size", 1).save(str(tmp_path / "ragged"))
    assert not any((tmp_path / "ragged").glob("*.safetensors"))


def test_out_of_range_integer_names_value_column_and_row(spark, tmp_path):
    df = spark.createDataFrame([([1, 2],), ([3, 300],)], "x array<int>").coalesce(1)
    with pytest.raises(Py4JJavaError) as e:
        df.write.format("safetensors").option("batch_size", 2).option("dtype", "u8").save(str(tmp_path / "bad"))
    msg = str(e.value)
    assert "300" in msg and "'x'" in msg and "row 1" in msg and "U8" in msg


def test_kv_mode_tensor_per_row_and_column(spark, tmp_path):
    rows = [(f"user{i}", [float(i)] * (i + 1), i) for i in range(6)]
    df = spark.createDataFrame(rows, "name string, emb array<double>, n int").repartition(2)
    out = tmp_path / "kv"
    df.write.format("safetensors").option("name_col", "name").option("dtype", "F32").save(str(out))
    got = {}
    for p in shards(out):
        got.update(safetensors.numpy.load_file(str(p)))
    assert sorted(got) == sorted([f"user{i}__emb" for i in range(6)] + [f"user{i}__n" for i in range(6)])
    for i in range(6):
        assert got[f"user{i}__emb"].dtype == np.float32 and got[f"user{i}__emb"].tolist() == [float(i)] * (i + 1)
        assert got[f"user{i}__n"].shape == () and got[f"user{i}__n"] == i
    m = manifest(out)
    assert (m["layout"], m["kv_separator"], m["total_samples"]) == ("kv", "__", 6)
    assert m["schema"]["emb"] == {"dtype": "F32", "shape": None}


def kv_frame_in_partitions(spark, partitions):
    """A KV frame whose rows sit in the given partitions, in order: [[(key, value), ...], ...]
    (parallelize slices a list evenly, so equal-length partitions come back as given)."""
    assert len({len(p) for p in partitions}) == 1
    rows = [(k, [float(v)]) for p in partitions for k, v in p]
    df = spark.createDataFrame(spark.sparkContext.parallelize(rows, len(partitions)), "k string, v array<double>")
    placed = df.rdd.glom().map(lambda part: [(r.k, r.v[0]) for r in part]).collect()
    assert placed == [[(k, float(v)) for k, v in p] for p in partitions], placed
    return df


def test_kv_duplicate_key_in_two_tasks_fails_the_whole_write_naming_both_shards(spark, tmp_path):
    # "a" is written by task 0 and by task 1: each task alone sees no duplicate; only the
    # driver's check across the task reports can find it.
    df = kv_frame_in_partitions(spark, [[("a", 1), ("b", 2)], [("c", 3), ("a", 4)]])
    out = tmp_path / "dup"
    with pytest.raises(Py4JJavaError) as e:
        df.write.format("safetensors").option("name_col", "k").save(str(out))
    msg = str(e.value)
    assert "key 'a' occurs more than once in this write" in msg, msg[-2000:]
    shard_names = re.search(r"in shards (\S+) and (\S+)\)", msg)
    assert shard_names, msg[-2000:]
    assert [n.split("-")[1] for n in shard_names.groups()] == ["00000", "00001"]  # two tasks' shards
    assert not out.exists() or not any(out.iterdir())


def test_kv_duplicate_key_in_one_task_fails_the_write(spark, tmp_path):
    df = kv_frame_in_partitions(spark, [[("a", 1), ("b", 2), ("a", 3)]])
    out = tmp_path / "dup"
    # The task finds it itself, at the row: the write fails before any commit.
    with pytest.raises(Py4JJavaError, match=r"row 2: duplicate key 'a' \(first seen at row 0\)"):
        df.write.format("safetensors").option("name_col", "k").save(str(out))
    assert not out.exists() or not any(out.iterdir())


def test_kv_duplicate_key_in_two_tasks_with_last_win_keeps_the_later_task_row(spark, tmp_path):
    df = kv_frame_in_partitions(spark, [[("a", 1), ("b", 2)], [("c", 3), ("a", 4)]])
    out = tmp_path / "lastwin"
    df.write.format("safetensors").option("name_col", "k").option("duplicatesStrategy", "lastWin").save(str(out))
    got = {}
    for p in shards(out):
        for k, v in safetensors.numpy.load_file(str(p)).items():
            assert k not in got, k
            got[k] = v.tolist()
    assert got == {"a__v": [4.0], "b__v": [2.0], "c__v": [3.0]}


def test_kv_separator_multi_character_non_ascii_round_trips(spark, tmp_path):
    sep = "→·"  # two characters, five UTF-8 bytes
    keys = ["user0", "ключ", "a→", "x·y"]  # non-ASCII keys, and keys holding part of the separator
    rows = [(k, [float(i), -float(i)], i) for i, k in enumerate(keys)]
    df = spark.createDataFrame(spark.sparkContext.parallelize(rows, 2), "k string, emb array<float>, n long")
    out = tmp_path / "sep"
    (df.write.format("safetensors").option("name_col", "k").option("kv_separator", sep)
        .option("generate_index", "true").save(str(out)))
    want = {}
    for i, k in enumerate(keys):
        want[f"{k}{sep}emb"] = ("F32", [2], [float(i), -float(i)])
        want[f"{k}{sep}n"] = ("I64", [], [i])
    # The safetensors package: the names, values and the separator in every shard's metadata.
    got = {}
    for p in shards(out):
        with safetensors.safe_open(str(p), framework="np") as f:
            assert f.metadata()["safetensors_spark.kv_separator"] == sep
            for name in f.keys():
                got[name] = f.get_tensor(name)
    assert sorted(got) == sorted(want)
    for name, (_, shape, values) in want.items():
        assert list(got[name].shape) == shape and got[name].reshape(-1).tolist() == values, name
    # The index splits each name into the row's key and its column at the separator we chose.
    import pyarrow.parquet as pq
    index = pq.read_table(str(out / "_tensor_index.parquet")).to_pylist()
    assert sorted((r["tensor_key"], r["sample_key"], r["column"]) for r in index) == sorted(
        (f"{k}{sep}{c}", k, c) for k in keys for c in ("emb", "n"))
    # Our reader: every tensor per row, and key lookups (through the index) by the full name.
    back = spark.read.format("safetensors").load(str(out))
    assert sorted((r.key, r.dtype, r.shape, bytes(r.data)) for r in back.collect()) == sorted(
        (name, dtype, shape, got[name].tobytes()) for name, (dtype, shape, _) in want.items())
    hit = back.where(F.col("key") == f"ключ{sep}emb").select("key", "data").collect()
    assert [(r.key, np.frombuffer(r.data, "<f4").tolist()) for r in hit] == [(f"ключ{sep}emb", [1.0, -1.0])]
    assert back.where(F.col("key").startswith(f"a→{sep}")).count() == 2


def reference_bytes(tensors, metadata):
    """What the reference writer (safetensors.numpy.save) produces for `tensors` and `metadata`,
    with one documented difference applied (spec/format.md, writer rule 3): the reference writes
    `__metadata__` keys in hash-map order, which changes from run to run; ours are sorted. Only
    that object is rewritten, its keys sorted, in the same compact JSON; lengths are unchanged."""
    ref = safetensors.numpy.save(tensors, metadata=metadata)
    n = int.from_bytes(ref[:8], "little")
    header = json.loads(ref[8:8 + n])
    assert next(iter(header)) == "__metadata__" and header["__metadata__"] == metadata
    header["__metadata__"] = dict(sorted(header["__metadata__"].items()))
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    assert len(text) <= n and ref[8 + len(text):8 + n] == b" " * (n - len(text))  # the reference pads with spaces
    return ref[:8] + text + b" " * (n - len(text)) + ref[8 + n:]


def test_reference_bytes_only_reorders_metadata():
    # With a single metadata key there is nothing to reorder: the helper returns the reference's bytes.
    t = {"b": np.arange(3, dtype=np.int64), "a": np.ones((2, 2), np.float16), "s": np.array(1.5, np.float32)}
    assert reference_bytes(t, {"k": "ü"}) == safetensors.numpy.save(t, metadata={"k": "ü"})


def assert_shard_equals_reference(path):
    """Loads every tensor and the metadata of a shard with the safetensors package and writes
    them with the reference writer: the shard must be the same bytes."""
    with safetensors.safe_open(str(path), framework="np") as f:
        metadata = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    assert len(tensors) >= 2 and len({t.dtype for t in tensors.values()}) >= 2  # an order to get right
    assert path.read_bytes() == reference_bytes(tensors, metadata), path.name


def test_spark_written_batch_shards_are_the_reference_writers_bytes(spark, tmp_path):
    vals = float_rows(6, 4)
    rows = [(i, [float(x) for x in r], [float(x) for x in r], bool(i % 2), [i, i + 200]) for i, r in enumerate(vals)]
    df = spark.createDataFrame(rows, "id long, h array<double>, b array<double>, flag boolean, u array<int>").coalesce(1)
    out = tmp_path / "batch"
    (df.write.format("safetensors").option("batch_size", 4).option("tail_strategy", "pad")
        .option("dtypes", json.dumps({"h": "F16", "b": "BF16", "u": "U8"}))
        .option("metadata", json.dumps({"source": "spärk", "z_last": "1", "a_first": "2"}))
        .save(str(out)))
    files = shards(out)
    assert len(files) == 2  # a full shard and a padded one
    for p in files:
        assert_shard_equals_reference(p)


def test_spark_written_kv_shards_are_the_reference_writers_bytes(spark, tmp_path):
    rows = [(f"user{i}", [float(i)] * (i % 3 + 1), i * 7, [[i, i + 1], [i + 2, i + 3]]) for i in range(10)]
    df = spark.createDataFrame(spark.sparkContext.parallelize(rows, 2), "name string, emb array<double>, n long, m array<array<int>>")
    out = tmp_path / "kv"
    (df.write.format("safetensors").option("name_col", "name")
        .option("dtypes", json.dumps({"emb": "BF16", "m": "I16"}))
        .option("metadata", json.dumps({"owner": "ßpark"})).save(str(out)))
    files = shards(out)
    assert len(files) == 2
    for p in files:
        assert_shard_equals_reference(p)


def test_tensor_struct_binary_and_ml_vector_inputs(spark, tmp_path):
    a = RNG.standard_normal((2, 3)).astype(np.float32)
    struct_rows = [
        ({"data": bytearray(a.tobytes()), "shape": [2, 3], "dtype": "F32"}, bytearray(np.arange(4, dtype="<i2").tobytes()), Vectors.dense([1.0, 2.0, 3.0])),
        ({"data": bytearray((a * 2).tobytes()), "shape": [2, 3], "dtype": "F32"}, bytearray(np.arange(4, 8, dtype="<i2").tobytes()), Vectors.sparse(3, [1], [5.0])),
    ]
    schema = T.StructType([
        T.StructField("t", T.StructType([T.StructField("data", T.BinaryType()), T.StructField("shape", T.ArrayType(T.IntegerType())), T.StructField("dtype", T.StringType())])),
        T.StructField("raw", T.BinaryType()),
        T.StructField("vec", __import__("pyspark.ml.linalg", fromlist=["VectorUDT"]).VectorUDT()),
    ])
    df = spark.createDataFrame(struct_rows, schema).coalesce(1)
    out = tmp_path / "inputs"
    (df.write.format("safetensors").option("batch_size", 2)
        .option("dtypes", json.dumps({"raw": "I16", "t": "BF16"}))
        .option("shapes", json.dumps({"raw": [2, 2]})).save(str(out)))
    got = load_all(out)
    assert np.array_equal(got["t"].view(np.uint8), np.stack([a, a * 2]).astype(ml_dtypes.bfloat16).view(np.uint8))
    assert got["raw"].dtype == np.int16 and got["raw"].tolist() == [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]
    assert got["vec"].dtype == np.float64 and got["vec"].tolist() == [[1.0, 2.0, 3.0], [0.0, 5.0, 0.0]]


def test_invalid_options_fail_before_anything_on_disk_changes(spark, tmp_path):
    df = spark.createDataFrame([([1.0],)], "x array<double>")
    out = tmp_path / "never"
    with pytest.raises(Exception, match="dtpye") as e:
        df.write.format("safetensors").option("batch_size", 1).option("dtpye", "F16").save(str(out))
    assert "batch_size" in str(e.value)  # the valid options are listed
    with pytest.raises(Exception, match="F17"):
        df.write.format("safetensors").option("batch_size", 1).option("dtype", "F17").save(str(out))
    with pytest.raises(Exception, match="name_col"):
        df.write.format("safetensors").save(str(out))
    assert not out.exists()


def test_overwrite_append_ignore_and_index(spark, tmp_path):
    out = tmp_path / "modes"
    df = lambda n, v: spark.createDataFrame([([float(v)] * 2,) for _ in range(n)], "x array<double>").coalesce(1)
    df(4, 1).write.format("safetensors").option("batch_size", 2).save(str(out))
    first = {p.name for p in shards(out)}
    df(4, 2).write.format("safetensors").mode("ignore").option("batch_size", 2).save(str(out))
    assert {p.name for p in shards(out)} == first
    df(3, 3).write.format("safetensors").mode("append").option("batch_size", 2).option("generate_index", "true").save(str(out))
    m = manifest(out)
    assert m["total_samples"] == 7 and len(m["shards"]) == 4
    index = __import__("pyarrow.parquet", fromlist=["read_table"]).read_table(str(out / "_tensor_index.parquet")).to_pylist()
    assert len(index) == 4 and {r["file_name"] for r in index} == {s["shard_path"] for s in m["shards"]}
    # Spark reads it by its name too (it is a directory of parts, like Spark's own output)
    assert spark.read.parquet(str(out / "_tensor_index.parquet")).count() == 4
    for r in index:
        with open(out / r["file_name"], "rb") as f:
            f.seek(r["data_start"])
            raw = f.read(r["data_end"] - r["data_start"])
        assert np.frombuffer(raw, "<f8").size == int(np.prod(r["shape"]))
    # retention 0: the overwritten shards and their index parts go at the commit
    df(2, 4).write.format("safetensors").mode("overwrite").option("batch_size", 2).option("retention", "0").save(str(out))
    m = manifest(out)
    assert m["total_samples"] == 2 and not (out / "_tensor_index.parquet").exists()
    assert load_all(out)["x"].tolist() == [[4.0, 4.0], [4.0, 4.0]]
    assert not [p for p in out.iterdir() if p.name.startswith(("_staging", "."))]


CLUSTER_SCRIPT = r"""
import os, sys
from pyspark.sql import SparkSession
jar, out = sys.argv[1], sys.argv[2]
spark = (SparkSession.builder.master("local-cluster[2,1,1024]").config("spark.jars", jar)
         .config("spark.ui.enabled", "false").config("spark.executor.memory", "512m").getOrCreate())
df = spark.range(0, 1000, numPartitions=4).selectExpr("concat('k', id) AS key", "array(cast(id AS double), cast(id * 2 AS double)) AS v")
df.write.format("safetensors").option("name_col", "key").option("dtype", "BF16").save(out)
spark.stop()
"""


def test_local_cluster_executors_load_the_native_library_from_the_jar(connector_jar, tmp_path):
    out = tmp_path / "cluster"
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1")
    result = subprocess.run([sys.executable, "-c", CLUSTER_SCRIPT, str(connector_jar), str(out)], env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    m = manifest(out)
    assert m["total_samples"] == 1000 and {s["partition"] for s in m["shards"]} == {0, 1, 2, 3}
    got = {}
    for p in shards(out):
        got.update(safetensors.numpy.load_file(str(p)))
    assert got["k999__v"].dtype == ml_dtypes.bfloat16 and got["k999__v"].astype(np.float32).tolist() == [1000.0, 2000.0]
