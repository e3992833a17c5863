"""PySpark writes with the connector jar, read back with the Python `safetensors` package.

Every value is compared with numpy's (and ml_dtypes') own conversion of the same input.
"""
import json
import os
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


def test_kv_duplicate_keys_across_partitions_fail_the_whole_write(spark, tmp_path):
    df = spark.createDataFrame([("a", [1.0]), ("b", [2.0]), ("a", [3.0])], "k string, v array<double>").repartition(2, "v")
    out = tmp_path / "dup"
    with pytest.raises(Py4JJavaError, match="duplicate"):
        df.write.format("safetensors").option("name_col", "k").save(str(out))
    assert not out.exists() or not any(out.iterdir())


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
    df(2, 4).write.format("safetensors").mode("overwrite").option("batch_size", 2).save(str(out))
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
