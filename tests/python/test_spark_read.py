"""PySpark reads with the connector jar: `spark.read.format("safetensors")`.

Files are written by our own Spark writer (batch and KV datasets) and by the reference
`safetensors` package (model files), and every value read is compared with numpy's (and
ml_dtypes') own view of the same bytes.
"""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import safetensors
import safetensors.numpy
from pyspark.sql import functions as F
from pyspark.sql import types as T
from safetensors import TensorSpec

# pytest's default (prepend) import mode puts this directory on sys.path, so the sibling test
# module's negative corpus is importable by name.
from test_validation_vectors import CASES

RNG = np.random.default_rng(11)

TENSOR_COLUMNS = ["file", "key", "dtype", "shape", "byte_size", "data"]


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------

def reader(spark, **options):
    r = spark.read.format("safetensors")
    for k, v in options.items():
        r = r.option(k, v)
    return r


def read(spark, *paths, **options):
    """`load(path)` for one path, `load([p1, p2, ...])` for several (PySpark's form of load(p1, p2))."""
    r = reader(spark, **options)
    return r.load(str(paths[0])) if len(paths) == 1 else r.load([str(p) for p in paths])


def error_text(action):
    """Runs `action`, which must raise; returns the error's text (Java message and trace included)."""
    with pytest.raises(Exception) as e:
        action()
    return str(e.value)


def basename(uri):
    return uri.rstrip("/").rsplit("/", 1)[-1]


def shards(path):
    return sorted(p for p in Path(path).iterdir() if p.suffix == ".safetensors" and not p.name.startswith((".", "_")))


def save_model(path, tensors, metadata=None):
    """A model file written by the reference package."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    safetensors.numpy.save_file(tensors, str(path), metadata=metadata)
    return path


def write_batch(df, out, batch_size, **options):
    w = df.write.format("safetensors").option("batch_size", batch_size)
    for k, v in options.items():
        w = w.option(k, v)
    w.save(str(out))
    return out


def float32_values(shape):
    """Doubles that are exactly float32 values (so F32 round trips exactly and every rounding to
    F16/BF16 is a single rounding), including a subnormal-ish tiny value, -0.0 and F16 overflow."""
    vals = RNG.standard_normal(shape).astype(np.float32)
    flat = vals.reshape(-1)
    flat[:4] = [np.float32(1e-7), np.float32(65520.0), np.float32(-0.0), np.float32(3.0e38)]
    return vals


def f32_bits(values):
    return np.asarray(values, dtype=np.float32).view(np.uint32)


def f64_bits(values):
    return np.asarray(values, dtype=np.float64).view(np.uint64)


def batch_dataset(spark, out, n=10, batch_size=4, partitions=1, **options):
    """Batch dataset of `n` rows: id long (scalar), x array<float> of 3 values id, -id, id/2."""
    rows = [(i, [float(i), float(-i), i / 2.0]) for i in range(n)]
    df = spark.createDataFrame(rows, "id long, x array<float>")
    df = df.coalesce(1) if partitions == 1 else df.repartition(partitions)
    return write_batch(df, out, batch_size, **options)


# ---------------------------------------------------------------------------------------------
# Sample layout: round trips of batch-mode datasets
# ---------------------------------------------------------------------------------------------

# dtype -> (Spark input element type, Spark element type read back, numpy dtype of the file)
SAMPLE_DTYPES = {
    "F32": ("double", T.FloatType(), np.float32),
    "F64": ("double", T.DoubleType(), np.float64),
    "F16": ("double", T.FloatType(), np.float16),
    "BF16": ("double", T.FloatType(), ml_dtypes.bfloat16),
    "I64": ("long", T.LongType(), np.int64),
    "I32": ("int", T.IntegerType(), np.int32),
    "I16": ("short", T.ShortType(), np.int16),
    "I8": ("byte", T.ByteType(), np.int8),
    "U8": ("int", T.ShortType(), np.uint8),
    "U16": ("int", T.IntegerType(), np.uint16),
    "U32": ("long", T.LongType(), np.uint32),
    "U64": ("long", T.LongType(), np.uint64),
    "BOOL": ("boolean", T.BooleanType(), np.bool_),
}


def sample_values(dtype, shape):
    """Input values for `dtype` (Python-typed for createDataFrame), including the extremes that fit
    both the file dtype and the Spark input type."""
    if dtype in ("F32", "F64", "F16", "BF16"):
        return float32_values(shape).astype(np.float64)
    if dtype == "BOOL":
        return RNG.integers(0, 2, size=shape).astype(bool)
    info = np.iinfo(SAMPLE_DTYPES[dtype][2])
    lo, hi = int(info.min), min(int(info.max), 2**63 - 1)
    vals = RNG.integers(lo, hi, size=shape, endpoint=True, dtype=np.int64 if hi < 2**63 else np.uint64)
    flat = vals.reshape(-1)
    flat[0], flat[1] = lo, hi
    return vals


def expected_elements(dtype, values):
    """What the read must return for input `values`: numpy's conversion to the file dtype."""
    file_dtype = SAMPLE_DTYPES[dtype][2]
    with np.errstate(over="ignore"):  # 3e38 and 65520 overflow to inf in F16, as they must
        return np.asarray(values).astype(file_dtype)


def assert_elements_equal(dtype, got, want):
    """`got` (Python values from Spark) equal `want` (numpy values of the file dtype), exactly."""
    if dtype == "F64":
        assert np.array_equal(f64_bits(got), want.astype(np.float64).view(np.uint64))
    elif dtype in ("F32", "F16", "BF16"):
        # F16/BF16 -> float32 widening is exact, so compare bits (signed zero, inf included).
        assert np.array_equal(f32_bits(got), want.astype(np.float32).view(np.uint32))
    elif dtype == "BOOL":
        assert np.asarray(got, dtype=bool).tolist() == want.tolist()
    else:
        assert [int(v) for v in np.asarray(got, dtype=object).reshape(-1)] == [int(v) for v in want.reshape(-1)]


@pytest.mark.parametrize("dtype", list(SAMPLE_DTYPES))
def test_sample_layout_round_trip_every_written_dtype(spark, tmp_path, dtype):
    src_type, want_type, _ = SAMPLE_DTYPES[dtype]
    n = 11
    vecs = sample_values(dtype, (n, 4))
    scalars = sample_values(dtype, (n,))
    py = (lambda v: [bool(x) for x in v]) if dtype == "BOOL" else (
        (lambda v: [float(x) for x in v]) if src_type == "double" else (lambda v: [int(x) for x in v]))
    rows = [(i, py(vecs[i]), py([scalars[i]])[0]) for i in range(n)]
    df = spark.createDataFrame(rows, f"id long, x array<{src_type}>, s {src_type}").repartition(2)
    out = write_batch(df, tmp_path / "ds", 4, dtypes=json.dumps({"x": dtype, "s": dtype}))

    got = read(spark, out)
    want = want_type.simpleString()
    # (Column order follows the manifest's `tensors`; only names and types are checked here.)
    assert {f.name: f.dataType.simpleString() for f in got.schema.fields} == {"id": "bigint", "x": f"array<{want}>", "s": want}
    assert len(got.columns) == 3
    assert all(f.nullable for f in got.schema.fields)
    result = sorted(got.collect(), key=lambda r: r["id"])
    assert [r["id"] for r in result] == list(range(n))
    assert_elements_equal(dtype, [r["x"] for r in result], expected_elements(dtype, vecs))
    assert_elements_equal(dtype, [r["s"] for r in result], expected_elements(dtype, scalars))
    assert got.count() == n


def test_sample_layout_columns_come_back_in_the_written_order(spark, tmp_path):
    # dataset.md §5: the manifest's `tensors` keep the written column order; reading.md §2.1: the
    # per-sample columns follow it, so load(dir) has the DataFrame's columns, in its order.
    df = spark.createDataFrame([(1, [1.0], 2.0), (2, [3.0], 4.0)], "zeta long, alpha array<float>, mid double").coalesce(1)
    out = write_batch(df, tmp_path / "ordered", 2)
    assert list(json.loads((out / "dataset_manifest.json").read_text())["schema"]) == ["zeta", "alpha", "mid"]
    back = read(spark, out)
    assert back.columns == ["zeta", "alpha", "mid"]
    assert sorted(back.collect()) == sorted(df.collect())


def test_sample_layout_nested_arrays_for_rank_2_and_3_samples(spark, tmp_path):
    img = RNG.integers(0, 256, size=(5, 2, 3, 4)).astype(np.uint8)
    mat = float32_values((5, 3, 2))
    rows = [(i, img[i].tolist(), mat[i].astype(np.float64).tolist()) for i in range(5)]
    df = spark.createDataFrame(rows, "id int, img array<array<array<int>>>, m array<array<double>>").coalesce(1)
    out = write_batch(df, tmp_path / "nested", 2, dtypes=json.dumps({"img": "U8", "m": "F32"}))

    got = read(spark, out)
    schema = {f.name: f.dataType for f in got.schema.fields}
    assert schema["id"] == T.IntegerType()
    assert T.ArrayType(T.ArrayType(T.ArrayType(T.ShortType()))).simpleString() == schema["img"].simpleString()
    assert schema["m"].simpleString() == "array<array<float>>"
    result = sorted(got.collect(), key=lambda r: r["id"])
    assert [r["id"] for r in result] == list(range(5))
    assert np.array_equal(np.array([r["img"] for r in result]), img.astype(np.int16))
    assert np.array_equal(f32_bits([r["m"] for r in result]), mat.view(np.uint32))


@pytest.mark.parametrize("tail,expected_ids", [
    ("write", list(range(10))),
    ("drop", list(range(8))),
    ("pad", list(range(10))),
])
def test_sample_layout_tail_strategies_pad_rows_are_not_samples(spark, tmp_path, tail, expected_ids):
    out = batch_dataset(spark, tmp_path / tail, n=10, batch_size=4, tail_strategy=tail)
    got = read(spark, out)
    ids = sorted(r["id"] for r in got.select("id").collect())
    assert ids == expected_ids
    assert got.count() == len(expected_ids)
    xs = {r["id"]: r["x"] for r in got.collect()}
    assert all(xs[i] == [float(i), float(-i), i / 2.0] for i in expected_ids)


def test_sample_layout_hidden_file_and_metadata_columns(spark, tmp_path):
    out = batch_dataset(spark, tmp_path / "ds", n=10, batch_size=4, metadata=json.dumps({"origin": "read-test"}))
    df = read(spark, out)
    assert df.columns == ["id", "x"]  # the metadata columns appear only when selected
    rows = df.select("id", "x", "_file", "_metadata").collect()
    assert len(rows) == 10
    assert isinstance(rows[0]["_file"], str) and isinstance(rows[0]["_metadata"], dict)
    by_file = {}
    for r in rows:
        by_file.setdefault(basename(r["_file"]), []).append(r)
    files = shards(out)
    assert sorted(by_file) == [p.name for p in files]
    for p in files:
        ids = safetensors.numpy.load_file(str(p))["id"].tolist()
        with safetensors.safe_open(str(p), framework="np") as f:
            meta = f.metadata()
        assert sorted(r["id"] for r in by_file[p.name]) == sorted(ids)
        for r in by_file[p.name]:
            assert r["_metadata"] == meta
            assert r["_metadata"]["safetensors_spark.layout"] == "batch"
            assert r["_metadata"]["origin"] == "read-test"
    # The metadata columns alone, and filtered on.
    first = files[0].name
    only = df.where(F.col("_file").endswith(first)).select("id").collect()
    assert sorted(r["id"] for r in only) == sorted(safetensors.numpy.load_file(str(files[0]))["id"].tolist())


# ---------------------------------------------------------------------------------------------
# Layout selection
# ---------------------------------------------------------------------------------------------

def test_auto_layout_is_sample_only_when_every_file_is_a_batch_shard(spark, tmp_path):
    ds = batch_dataset(spark, tmp_path / "batch", n=6, batch_size=4)
    kv = tmp_path / "kv"
    spark.createDataFrame([("a", [1.0]), ("b", [2.0])], "k string, v array<double>").coalesce(1) \
        .write.format("safetensors").option("name_col", "k").save(str(kv))
    model = save_model(tmp_path / "model" / "m.safetensors", {"w": np.ones((2, 2), np.float32)})

    assert read(spark, ds).columns == ["id", "x"]
    assert read(spark, ds, layout="sample").columns == ["id", "x"]
    for path in (kv, model, model.parent):
        assert read(spark, path).columns[:6] == TENSOR_COLUMNS, path
    mixed = read(spark, ds, model)
    assert mixed.columns[:6] == TENSOR_COLUMNS
    # 2 shards x 2 columns + the model's tensor.
    assert sorted((basename(r["file"]), r["key"]) for r in mixed.select("file", "key").collect()) == sorted(
        [(p.name, k) for p in shards(ds) for k in ("id", "x")] + [("m.safetensors", "w")])
    # Explicit layouts override auto; enumerated values are case-insensitive.
    assert read(spark, ds, layout="Tensor").count() == 4
    assert read(spark, ds, layout="FILE").count() == 2


def test_invalid_layout_names_the_option_and_the_allowed_values(spark, tmp_path):
    ds = batch_dataset(spark, tmp_path / "ds", n=2, batch_size=2)
    msg = error_text(lambda: read(spark, ds, layout="rows").collect())
    assert "layout" in msg and "rows" in msg
    for allowed in ("auto", "sample", "tensor", "file"):
        assert allowed in msg, allowed


# ---------------------------------------------------------------------------------------------
# Tensor layout
# ---------------------------------------------------------------------------------------------

@np.errstate(over="ignore")
def model_arrays():
    """One tensor of every dtype numpy/ml_dtypes give the reference package, plus a scalar and a
    zero-size tensor."""
    return {
        "bool": np.array([[True, False, True], [False, False, True]]),
        "u8": np.array([0, 255, 7], np.uint8),
        "i8": np.array([-128, 127, 0], np.int8),
        "u16": np.array([0, 65535, 3], np.uint16),
        "i16": np.array([-32768, 32767, -1], np.int16),
        "u32": np.array([0, 2**32 - 1], np.uint32),
        "i32": np.array([[-(2**31), 2**31 - 1]], np.int32),
        "u64": np.array([0, 2**63 - 1], np.uint64),
        "i64": np.array([-(2**63), 2**63 - 1, 5], np.int64),
        "f16": float32_values((2, 3)).astype(np.float16),
        "bf16": float32_values((3, 2)).astype(ml_dtypes.bfloat16),
        "f32": float32_values((2, 2, 2)),
        "f64": RNG.standard_normal(4),
        "scalar": np.array(2.5, np.float64),
        "empty": np.zeros((2, 0), np.float32),
    }


DTYPE_NAMES = {
    "bool": "BOOL", "uint8": "U8", "int8": "I8", "uint16": "U16", "int16": "I16", "uint32": "U32",
    "int32": "I32", "uint64": "U64", "int64": "I64", "float16": "F16", "bfloat16": "BF16",
    "float32": "F32", "float64": "F64",
}


def test_tensor_layout_rows_of_a_model_file_with_every_dtype(spark, tmp_path):
    arrays = model_arrays()
    path = save_model(tmp_path / "model.safetensors", arrays, metadata={"format": "pt", "note": "read test"})
    df = read(spark, path, layout="tensor")
    # BOOL, I64/U64 and floats have no common element type: no decoded column.
    assert df.columns == TENSOR_COLUMNS + ["metadata", "flags", "model_info", "sha256"]
    # (flags, model_info and sha256: test_spark_forensics.py)
    types = {f.name: f.dataType.simpleString() for f in df.schema.fields if f.name not in ("flags", "model_info", "sha256")}
    assert types == {"file": "string", "key": "string", "dtype": "string", "shape": "array<bigint>",
                     "byte_size": "bigint", "data": "binary", "metadata": "map<string,string>"}
    rows = {r["key"]: r for r in df.collect()}
    assert sorted(rows) == sorted(arrays)
    for k, a in arrays.items():
        r = rows[k]
        assert basename(r["file"]) == "model.safetensors"
        assert r["dtype"] == DTYPE_NAMES[a.dtype.name], k
        assert r["shape"] == list(a.shape), k
        assert r["byte_size"] == a.nbytes, k
        assert bytes(r["data"]) == a.tobytes(), k
        assert r["metadata"] == {"format": "pt", "note": "read test"}
    assert df.count() == len(arrays)


@pytest.mark.parametrize("np_dtype", [np.bool_, np.uint8, np.int8, np.uint16, np.int16, np.uint32, np.int32,
                                      np.uint64, np.int64, np.float16, ml_dtypes.bfloat16, np.float32, np.float64],
                         ids=lambda d: DTYPE_NAMES[np.dtype(d).name])
def test_tensor_layout_decoded_values_of_each_dtype(spark, tmp_path, np_dtype):
    dt = np.dtype(np_dtype)
    if dt.kind == "b":
        t = RNG.integers(0, 2, size=(2, 3)).astype(bool)
    elif dt.kind in "iu":
        info = np.iinfo(dt)
        t = RNG.integers(int(info.min), min(int(info.max), 2**63 - 1), size=(2, 3), endpoint=True,
                         dtype=np.uint64 if dt == np.uint64 else np.int64).astype(dt)
        t.reshape(-1)[:2] = [info.min, min(int(info.max), 2**63 - 1)]
    else:
        with np.errstate(over="ignore"):
            t = float32_values((2, 3)).astype(dt)
    tensors = {"t": t, "s": t.reshape(-1)[-1:].reshape(()), "z": np.zeros((0, 2), dt)}
    path = save_model(tmp_path / "one.safetensors", tensors)
    df = read(spark, path)  # a model file: auto = tensor
    want = {"bool": "boolean", "uint8": "smallint", "int8": "tinyint", "uint16": "int", "int16": "smallint",
            "uint32": "bigint", "int32": "int", "uint64": "bigint", "int64": "bigint", "float16": "float",
            "bfloat16": "float", "float32": "float", "float64": "double"}[dt.name]
    assert df.columns == TENSOR_COLUMNS + ["decoded", "metadata", "flags", "model_info", "sha256"]
    assert df.schema["decoded"].dataType.simpleString() == f"array<{want}>"
    rows = {r["key"]: r for r in df.collect()}
    assert sorted(rows) == ["s", "t", "z"]
    assert rows["s"]["shape"] == [] and rows["z"]["shape"] == [0, 2] and rows["t"]["shape"] == [2, 3]
    assert rows["z"]["decoded"] == [] and bytes(rows["z"]["data"]) == b"" and rows["z"]["byte_size"] == 0
    assert rows["s"]["metadata"] in (None, {})  # the reference writes no __metadata__ here
    for k in ("t", "s"):
        a = tensors[k].reshape(-1)
        got = rows[k]["decoded"]
        assert len(got) == a.size
        if dt.kind == "f" or dt == ml_dtypes.bfloat16:
            if dt == np.float64:
                assert np.array_equal(f64_bits(got), a.view(np.uint64))
            else:
                assert np.array_equal(f32_bits(got), a.astype(np.float32).view(np.uint32))
        else:
            assert got == a.tolist()
        assert bytes(rows[k]["data"]) == tensors[k].tobytes()


def test_tensor_layout_f8_bytes_kept_and_decoded_null(spark, tmp_path):
    e4m3 = RNG.integers(0, 256, size=6, dtype=np.uint8)
    e5m2 = RNG.integers(0, 256, size=4, dtype=np.uint8)
    f = np.array([1.5, -2.25], np.float32)
    specs = {
        "e4m3": TensorSpec(dtype="float8_e4m3fn", shape=[2, 3], data_ptr=e4m3.ctypes.data, data_len=e4m3.nbytes),
        "e5m2": TensorSpec(dtype="float8_e5m2", shape=[4], data_ptr=e5m2.ctypes.data, data_len=e5m2.nbytes),
        "f": TensorSpec(dtype="float32", shape=[2], data_ptr=f.ctypes.data, data_len=f.nbytes),
    }
    path = tmp_path / "f8.safetensors"
    safetensors.serialize_file(specs, str(path), {"quant": "fp8"})
    # Also in bytes, read through a second file: the two must read identically.
    (tmp_path / "f8-copy.safetensors").write_bytes(safetensors.serialize(specs, {"quant": "fp8"}))

    df = read(spark, tmp_path, layout="tensor")
    assert df.schema["decoded"].dataType.simpleString() == "array<float>"  # F8 ignored for the common type
    rows = {(basename(r["file"]), r["key"]): r for r in df.collect()}
    assert len(rows) == 6
    for name in ("f8.safetensors", "f8-copy.safetensors"):
        a, b, c = rows[(name, "e4m3")], rows[(name, "e5m2")], rows[(name, "f")]
        assert (a["dtype"], a["shape"], a["byte_size"], bytes(a["data"]), a["decoded"]) == ("F8_E4M3", [2, 3], 6, e4m3.tobytes(), None)
        assert (b["dtype"], b["shape"], b["byte_size"], bytes(b["data"]), b["decoded"]) == ("F8_E5M2", [4], 4, e5m2.tobytes(), None)
        assert (c["dtype"], c["decoded"], bytes(c["data"])) == ("F32", [1.5, -2.25], f.tobytes())
        assert a["metadata"] == {"quant": "fp8"}


def test_tensor_layout_decoded_common_type_over_files(spark, tmp_path):
    save_model(tmp_path / "ints" / "a.safetensors", {"w": np.array([-128, 5], np.int8)})
    save_model(tmp_path / "ints" / "b.safetensors", {"w": np.array([2**40, -(2**62)], np.int64)})
    df = read(spark, tmp_path / "ints")
    assert df.schema["decoded"].dataType.simpleString() == "array<bigint>"
    assert sorted(r["decoded"] for r in df.collect()) == sorted([[-128, 5], [2**40, -(2**62)]])

    h = np.array([0.5, -3.0, 65504.0], np.float16)
    b = np.array([1.0, 3.0e38], ml_dtypes.bfloat16)
    s = np.array([0.1], np.float32)
    save_model(tmp_path / "floats" / "h.safetensors", {"h": h})
    save_model(tmp_path / "floats" / "b.safetensors", {"b": b})
    save_model(tmp_path / "floats" / "s.safetensors", {"s": s})
    df = read(spark, tmp_path / "floats")
    assert df.schema["decoded"].dataType.simpleString() == "array<float>"
    got = {r["key"]: r["decoded"] for r in df.collect()}
    for k, a in (("h", h), ("b", b), ("s", s)):
        assert np.array_equal(f32_bits(got[k]), a.astype(np.float32).view(np.uint32)), k

    save_model(tmp_path / "mixed" / "a.safetensors", {"flag": np.array([True])})
    save_model(tmp_path / "mixed" / "b.safetensors", {"w": np.array([1.0], np.float32)})
    df = read(spark, tmp_path / "mixed")
    assert "decoded" not in df.columns  # BOOL and F32 have no common element type
    assert df.count() == 2


def test_tensor_layout_of_a_kv_dataset_with_key_filters(spark, tmp_path):
    rows = [(f"k{i}", [float(i), i + 0.5], [i] * (i % 3 + 1)) for i in range(20)]
    out = tmp_path / "kv"
    (spark.createDataFrame(rows, "name string, v array<double>, n array<int>").repartition(2)
        .write.format("safetensors").option("name_col", "name").option("dtype", "F32").save(str(out)))
    df = read(spark, out)  # auto: a KV dataset is read per tensor
    assert df.columns == TENSOR_COLUMNS + ["decoded", "metadata", "flags", "model_info", "sha256"]
    assert df.count() == 40

    k7 = df.where(F.col("key").startswith("k7__")).collect()
    assert sorted(r["key"] for r in k7) == ["k7__n", "k7__v"]
    k7v = df.where(F.col("key") == "k7__v").collect()
    assert len(k7v) == 1
    r = k7v[0]
    assert (r["dtype"], r["shape"], r["byte_size"], r["decoded"]) == ("F32", [2], 8, [7.0, 7.5])
    assert np.frombuffer(bytes(r["data"]), "<f4").tolist() == [7.0, 7.5]
    assert r["metadata"]["safetensors_spark.layout"] == "kv" and r["metadata"]["safetensors_spark.kv_separator"] == "__"
    picked = df.where(F.col("key").isin("k3__v", "k5__n", "nope")).select("key", "decoded").collect()
    assert sorted((r["key"], r["decoded"]) for r in picked) == [("k3__v", [3.0, 3.5]), ("k5__n", [5.0, 5.0, 5.0])]
    # k1__ must not match k10__ .. k19__; k1 matches k1 and k10..k19.
    assert df.where(F.col("key").startswith("k1__")).count() == 2
    assert df.where(F.col("key").startswith("k1")).count() == 22
    assert df.where(F.col("key").endswith("__n")).count() == 20
    assert df.where(F.col("dtype") == "F32").count() == 40


# ---------------------------------------------------------------------------------------------
# File layout
# ---------------------------------------------------------------------------------------------

def test_file_layout_one_row_per_file_one_struct_per_key(spark, tmp_path):
    w_a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b_a = np.array([1, -2, 3], np.int64)
    w_b = np.array([[0.5, 1.0, 2.0]], np.float16)
    save_model(tmp_path / "m" / "a.safetensors", {"w": w_a, "b": b_a}, metadata={"m": "a"})
    save_model(tmp_path / "m" / "b.safetensors", {"w": w_b})
    df = read(spark, tmp_path / "m", layout="file")
    assert df.columns[0] == "file" and df.columns[-4:] == ["metadata", "flags", "model_info", "sha256"]
    assert sorted(df.columns[1:-4]) == ["b", "w"]
    struct = "struct<data:binary,shape:array<bigint>,dtype:string>"
    assert df.schema["w"].dataType.simpleString() == struct and df.schema["b"].dataType.simpleString() == struct
    rows = {basename(r["file"]): r for r in df.collect()}
    assert sorted(rows) == ["a.safetensors", "b.safetensors"]
    a, b = rows["a.safetensors"], rows["b.safetensors"]
    assert (bytes(a["w"]["data"]), a["w"]["shape"], a["w"]["dtype"]) == (w_a.tobytes(), [2, 3], "F32")
    assert (bytes(a["b"]["data"]), a["b"]["shape"], a["b"]["dtype"]) == (b_a.tobytes(), [3], "I64")
    assert (bytes(b["w"]["data"]), b["w"]["shape"], b["w"]["dtype"]) == (w_b.tobytes(), [1, 3], "F16")
    assert b["b"] is None  # b.safetensors has no tensor `b`
    assert a["metadata"] == {"m": "a"}
    nested = sorted(df.select("w.shape", "w.dtype").collect(), key=lambda r: r["dtype"])
    assert [(r["shape"], r["dtype"]) for r in nested] == [([1, 3], "F16"), ([2, 3], "F32")]
    assert df.count() == 2
    assert df.where(F.col("b").isNull()).count() == 1
    assert df.where(F.col("file").endswith("/a.safetensors")).count() == 1


def test_columns_named_file_and_metadata_round_trip_and_the_file_layout_hides_its_own(spark, tmp_path):
    """reading.md §2.3: `file` and `metadata` are ordinary column names in batch mode; per file, a
    tensor of such a name takes the column's place and the layout's column becomes the hidden
    metadata column `_file` / `_metadata` (as a data column named `_metadata` hides Spark file
    sources' own)."""
    rows = [(i, [float(i), -float(i)], i * 10) for i in range(6)]
    df = spark.createDataFrame(rows, "id long, metadata array<float>, file long").coalesce(1)
    out = write_batch(df, tmp_path / "ds", 4, metadata=json.dumps({"origin": "clash"}))
    back = read(spark, out)
    assert back.columns == ["id", "metadata", "file"]
    assert sorted(tuple(r) for r in back.collect()) == [(i, [float(i), -float(i)], i * 10) for i in range(6)]

    per_file = read(spark, out, layout="file")
    assert per_file.columns[-3:] == ["flags", "model_info", "sha256"]
    assert sorted(per_file.columns[:-3]) == ["file", "id", "metadata"]  # the tensors
    struct = "struct<data:binary,shape:array<bigint>,dtype:string>"
    assert per_file.schema["file"].dataType.simpleString() == struct
    assert per_file.schema["metadata"].dataType.simpleString() == struct
    got = per_file.select("_file", "_metadata", "file", "metadata").collect()
    assert sorted(basename(r["_file"]) for r in got) == [p.name for p in shards(out)]
    for r in got:
        ids = safetensors.numpy.load_file(str(out / basename(r["_file"])))
        assert r["_metadata"]["origin"] == "clash"
        assert (bytes(r["file"]["data"]), r["file"]["dtype"]) == (ids["file"].tobytes(), "I64")
        assert bytes(r["metadata"]["data"]) == ids["metadata"].tobytes()
    first = shards(out)[0].name
    assert per_file.where(F.col("_file").endswith(first)).count() == 1
    # The per-tensor layout has no tensor columns: its `file` and `metadata` stay the file's.
    per_tensor = read(spark, out, layout="tensor").where(F.col("key") == "metadata")
    assert {basename(r["file"]) for r in per_tensor.collect()} == {p.name for p in shards(out)}


def test_infer_schema_option_of_the_other_connector_reads_one_row_per_file(spark, tmp_path):
    """reading.md §2: `inferSchema=true` (the other Spark connector's only way to read files) is
    layout `file`; it conflicts with any other layout and takes no other value."""
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    save_model(tmp_path / "m.safetensors", {"w": w})
    df = read(spark, tmp_path / "m.safetensors", inferSchema="TRUE")
    assert df.columns[:2] == ["file", "w"]
    (r,) = df.collect()
    assert (bytes(r["w"]["data"]), r["w"]["shape"], r["w"]["dtype"]) == (w.tobytes(), [2, 3], "F32")
    assert read(spark, tmp_path / "m.safetensors", inferSchema="true", layout="file").count() == 1
    msg = error_text(lambda: read(spark, tmp_path / "m.safetensors", inferSchema="true", layout="tensor").collect())
    assert "inferSchema" in msg and "'tensor'" in msg, msg[:3000]
    msg = error_text(lambda: read(spark, tmp_path / "m.safetensors", inferSchema="false").collect())
    assert "inferSchema" in msg and "'false'" in msg, msg[:3000]


# ---------------------------------------------------------------------------------------------
# Schema
# ---------------------------------------------------------------------------------------------

def test_schema_merges_f16_and_f32_datasets_into_float(spark, tmp_path):
    vals = float32_values((6, 3))
    half = spark.createDataFrame([(i, vals[i].astype(np.float64).tolist()) for i in range(3)], "id long, x array<double>").coalesce(1)
    full = spark.createDataFrame([(i, vals[i].astype(np.float64).tolist()) for i in range(3, 6)], "id long, x array<double>").coalesce(1)
    a = write_batch(half, tmp_path / "half", 8, dtypes=json.dumps({"x": "F16"}))
    b = write_batch(full, tmp_path / "full", 8, dtypes=json.dumps({"x": "F32"}))
    df = read(spark, a, b)
    assert df.schema["x"].dataType.simpleString() == "array<float>"
    got = sorted(df.collect(), key=lambda r: r["id"])
    assert [r["id"] for r in got] == list(range(6))
    with np.errstate(over="ignore"):
        want = np.concatenate([vals[:3].astype(np.float16).astype(np.float32), vals[3:]])
    assert np.array_equal(f32_bits([r["x"] for r in got]), want.view(np.uint32))


def test_schema_conflict_names_the_column_and_both_files(spark, tmp_path):
    a = write_batch(spark.createDataFrame([([1.0, 2.0],)], "emb_conflict array<float>").coalesce(1), tmp_path / "rank1", 4)
    b = write_batch(spark.createDataFrame([([[1.0], [2.0]],)], "emb_conflict array<array<float>>").coalesce(1), tmp_path / "rank2", 4)
    msg = error_text(lambda: read(spark, a, b).collect())
    assert "emb_conflict" in msg, msg[:3000]
    assert shards(a)[0].name in msg and shards(b)[0].name in msg


def test_explicit_schema_is_checked_against_the_files_at_the_first_action(spark, tmp_path):
    df = spark.createDataFrame([(i, [float(i), 0.5]) for i in range(5)], "id long, emb array<float>").coalesce(1)
    ds = write_batch(df, tmp_path / "ds", 4)
    ok = reader(spark).schema("emb array<float>").load(str(ds))
    assert ok.columns == ["emb"]
    assert sorted(r["emb"][0] for r in ok.collect()) == [0.0, 1.0, 2.0, 3.0, 4.0]

    missing = reader(spark).schema("emb array<float>, nope_col long").load(str(ds))
    msg = error_text(missing.collect)
    assert "nope_col" in msg, msg[:3000]
    wrong = reader(spark).schema("id long, emb array<double>").load(str(ds))
    msg = error_text(wrong.collect)
    assert "emb" in msg, msg[:3000]


def test_sample_layout_over_model_files_merges_types_and_fills_missing_tensors_with_null(spark, tmp_path):
    # reading.md §2.1/§3: files of other writers are read per sample along their leading dimension.
    save_model(tmp_path / "m" / "a.safetensors", {"x": np.arange(6, dtype=np.float32).reshape(3, 2), "n": np.array([1, 2, 3], np.int32)})
    save_model(tmp_path / "m" / "b.safetensors", {"x": np.array([[0.5, -1.0]], np.float16), "n": np.array([0.25], np.float32)})
    save_model(tmp_path / "m" / "c.safetensors", {"x": np.array([[7.0, 8.0]], np.float32)})
    df = read(spark, tmp_path / "m", layout="sample")
    assert {f.name: f.dataType.simpleString() for f in df.schema.fields} == {"x": "array<float>", "n": "double"}
    got = sorted((r["x"], r["n"], basename(r["_file"])) for r in df.select("x", "n", "_file").collect())
    assert got == sorted([([0.0, 1.0], 1.0, "a.safetensors"), ([2.0, 3.0], 2.0, "a.safetensors"), ([4.0, 5.0], 3.0, "a.safetensors"),
                          ([0.5, -1.0], 0.25, "b.safetensors"), ([7.0, 8.0], None, "c.safetensors")], key=str)
    assert df.count() == 5
    assert df.where(F.col("n").isNull()).count() == 1


def test_sample_layout_dtypes_without_a_common_type_are_an_error(spark, tmp_path):
    save_model(tmp_path / "m" / "a.safetensors", {"flag_col": np.array([True, False])})
    save_model(tmp_path / "m" / "b.safetensors", {"flag_col": np.array([1.0, 2.0], np.float32)})
    msg = error_text(lambda: read(spark, tmp_path / "m", layout="sample").collect())
    assert "flag_col" in msg and "a.safetensors" in msg and "b.safetensors" in msg, msg[:3000]


def test_kv_dataset_read_per_sample_is_an_error_naming_the_file(spark, tmp_path):
    kv = tmp_path / "kv"
    spark.createDataFrame([("a", [1.0])], "k string, v array<double>").coalesce(1) \
        .write.format("safetensors").option("name_col", "k").save(str(kv))
    msg = error_text(lambda: read(spark, kv, layout="sample").collect())
    assert shards(kv)[0].name in msg, msg[:3000]


def test_u64_values_above_long_range_are_an_error_naming_the_tensor(spark, tmp_path):
    big = np.array([1, 2**63, 3], np.uint64)
    path = save_model(tmp_path / "u64.safetensors", {"big_u64": big})
    df = read(spark, path)
    # Without `decoded`, nothing is decoded: the bytes read fine.
    assert bytes(df.select("data").first()["data"]) == big.tobytes()
    msg = error_text(lambda: df.select("key", "decoded").collect())
    assert "big_u64" in msg and "u64.safetensors" in msg and str(2**63) in msg, msg[:3000]


# ---------------------------------------------------------------------------------------------
# count()
# ---------------------------------------------------------------------------------------------

def test_count_in_every_layout_with_and_without_filters(spark, tmp_path):
    out = batch_dataset(spark, tmp_path / "ds", n=10, batch_size=4, partitions=1, tail_strategy="pad")
    sample = read(spark, out)
    assert sample.count() == 10
    assert sample.selectExpr("1 AS one").count() == 10
    assert sample.where(F.col("id") % 3 == 0).count() == 4
    assert sample.where(F.col("x")[0] >= 5).count() == 5
    assert sample.select("_file").distinct().count() == 3

    tensor = read(spark, out, layout="tensor")
    assert tensor.count() == 6  # 3 shards x 2 columns
    assert tensor.selectExpr("1 AS one").count() == 6
    assert tensor.where(F.col("key") == "x").count() == 3
    assert tensor.where(F.col("key").isin("x", "id")).count() == 6
    assert tensor.where(F.col("key") == "missing").count() == 0
    assert tensor.where(F.col("byte_size") == 4 * 3 * 4).count() == 3  # x: 4 rows (pad) x 3 floats

    file = read(spark, out, layout="file")
    assert file.count() == 3
    assert file.where(F.col("file").endswith(shards(out)[0].name)).count() == 1
    assert file.where(F.col("file").endswith("nothing.safetensors")).count() == 0


# ---------------------------------------------------------------------------------------------
# Paths
# ---------------------------------------------------------------------------------------------

@pytest.fixture
def tree(tmp_path):
    """A directory tree of model files, each holding one tensor named after the file's stem."""
    root = tmp_path / "tree"
    names = ["a.safetensors", "sub1/b.safetensors", "sub1/deeper/c.safetensors", "sub2/d.safetensors",
             "_hidden.safetensors", ".dot.safetensors", "_skip/e.safetensors", ".hid/f.safetensors",
             "sub2/_g.safetensors", "sub1/model.bin"]
    for i, name in enumerate(names):
        stem = Path(name).name.split(".")[0] or Path(name).name.split(".")[1]
        save_model(root / name, {stem: np.array([float(i)], np.float32)})
    (root / "notes.txt").write_text("not a safetensors file")
    (root / "sub2" / "README.md").write_text("hello")
    return root


def keys(df):
    return sorted(r["key"] for r in df.select("key").collect())


def test_paths_directories_recursive_and_hidden_names(spark, tree):
    assert keys(read(spark, tree)) == ["a", "b", "c", "d"]
    assert keys(read(spark, tree, recursiveFileLookup="true")) == ["a", "b", "c", "d"]
    assert keys(read(spark, tree, recursiveFileLookup="false")) == ["a"]
    assert keys(read(spark, tree / "sub1")) == ["b", "c"]


def test_paths_several_paths_globs_and_explicit_files(spark, tree):
    assert keys(read(spark, tree / "sub1" / "b.safetensors", tree / "sub2")) == ["b", "d"]
    assert keys(read(spark, tree / "a.safetensors")) == ["a"]
    assert keys(read(spark, f"{tree}/sub1/*.safetensors")) == ["b"]
    assert keys(read(spark, f"{tree}/sub*")) == ["b", "c", "d"]
    # A file named explicitly is read whatever its name.
    assert keys(read(spark, tree / "sub1" / "model.bin")) == ["model"]
    assert keys(read(spark, tree / "_hidden.safetensors")) == ["_hidden"]
    both = read(spark, tree / "sub2", tree / "sub1" / "model.bin")
    assert keys(both) == ["d", "model"]
    assert sorted(basename(r["file"]) for r in both.select("file").collect()) == ["d.safetensors", "model.bin"]


def test_missing_path_is_an_error(spark, tree):
    msg = error_text(lambda: read(spark, tree / "nowhere").collect())
    assert "path does not exist" in msg.lower()
    assert "nowhere" in msg
    msg = error_text(lambda: read(spark, tree / "a.safetensors", tree / "missing.safetensors").collect())
    assert "path does not exist" in msg.lower() and "missing.safetensors" in msg
    # reading.md §1: a glob that matches nothing is the same error.
    msg = error_text(lambda: read(spark, f"{tree}/zz*").collect())
    assert "path does not exist" in msg.lower()


def test_manifest_lists_the_shards_of_a_dataset_directory(spark, tmp_path):
    ds = batch_dataset(spark, tmp_path / "ds", n=6, batch_size=4, generate_index="true")
    other = batch_dataset(spark, tmp_path / "other", n=3, batch_size=4)
    listed = shards(ds)
    assert len(listed) == 2 and (ds / "_tensor_index.parquet").exists()
    stray = shards(other)[0]
    shutil.copy(stray, ds / stray.name)  # same schema, not in ds's manifest
    assert len(shards(ds)) == 3

    df = read(spark, ds)
    assert sorted(r["id"] for r in df.select("id").collect()) == list(range(6))
    assert df.count() == 6
    assert sorted({basename(r["_file"]) for r in df.select("_file").collect()}) == [p.name for p in listed]
    tensor = read(spark, ds, layout="tensor")
    assert sorted({basename(r["file"]) for r in tensor.select("file").collect()}) == [p.name for p in listed]
    assert tensor.count() == 4
    # Named explicitly, the stray file is read.
    assert read(spark, ds / stray.name).count() == 3


# ---------------------------------------------------------------------------------------------
# Bad files
# ---------------------------------------------------------------------------------------------

BAD = [c for c in CASES if not c[2]]
GOOD = [c for c in CASES if c[2]]


def corrupt_dir(tmp_path, data):
    d = tmp_path / "mixed"
    save_model(d / "good.safetensors", {"g": np.array([1.0, 2.0], np.float32)})
    (d / "bad.safetensors").write_bytes(data)
    return d


@pytest.mark.parametrize("case_id,data,ours,reference,words", BAD, ids=[c[0] for c in BAD])
def test_bad_file_is_an_error_naming_it_or_skipped_with_ignore_corrupt_files(spark, tmp_path, case_id, data, ours, reference, words):
    d = corrupt_dir(tmp_path, data)
    msg = error_text(lambda: read(spark, d).collect())
    assert "bad.safetensors" in msg, msg[:3000]
    assert words in msg, msg[:3000]

    df = read(spark, d, ignoreCorruptFiles="true")
    rows = df.select("file", "key", "data").collect()
    assert [(basename(r["file"]), r["key"], bytes(r["data"])) for r in rows] == [
        ("good.safetensors", "g", np.array([1.0, 2.0], np.float32).tobytes())]
    assert df.count() == 1


def test_ignore_corrupt_files_from_the_spark_conf_and_the_session_survives(spark, tmp_path):
    d = corrupt_dir(tmp_path, b"\x00" * 7)
    spark.conf.set("spark.sql.files.ignoreCorruptFiles", "true")
    try:
        df = read(spark, d)
        assert [(basename(r["file"]), r["key"]) for r in df.select("file", "key").collect()] == [("good.safetensors", "g")]
    finally:
        spark.conf.unset("spark.sql.files.ignoreCorruptFiles")
    # The reader's option wins over the conf.
    spark.conf.set("spark.sql.files.ignoreCorruptFiles", "true")
    try:
        assert "bad.safetensors" in error_text(lambda: read(spark, d, ignoreCorruptFiles="false").collect())
    finally:
        spark.conf.unset("spark.sql.files.ignoreCorruptFiles")
    assert "header too small" in error_text(lambda: read(spark, d).collect())
    # The JVM and the session are alive after all those errors.
    assert spark.range(5).count() == 5
    assert read(spark, d / "good.safetensors").count() == 1


def test_file_changed_after_planning_fails_the_task_or_is_skipped(spark, tmp_path):
    # reading.md §6: the task re-checks the file it opens against what the driver planned.
    d = tmp_path / "changing"
    save_model(d / "a.safetensors", {"w": np.array([1.0, 2.0, 3.0, 4.0], np.float32)})
    save_model(d / "b.safetensors", {"v": np.array([5.0, 6.0], np.float32)})
    strict = read(spark, d)
    lenient = read(spark, d, ignoreCorruptFiles="true")
    assert strict.schema["decoded"].dataType.simpleString() == "array<float>"
    (d / "b.safetensors").write_bytes(b"\x00" * 7)
    msg = error_text(lambda: strict.select("key", "decoded").collect())
    assert "b.safetensors" in msg, msg[:3000]
    rows = lenient.select("key", "decoded").collect()
    assert [(r["key"], r["decoded"]) for r in rows] == [("w", [1.0, 2.0, 3.0, 4.0])]
    assert spark.range(3).count() == 3


@pytest.mark.parametrize("case_id,data,ours,reference,words", GOOD, ids=[c[0] for c in GOOD])
def test_accepted_vectors_read_as_their_header_says(spark, tmp_path, case_id, data, ours, reference, words):
    path = tmp_path / "case.safetensors"
    path.write_bytes(data)
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n].decode("utf-8"))
    want = sorted((k, v["dtype"], v["shape"], data[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
                  for k, v in header.items() if k != "__metadata__")
    df = read(spark, path, layout="tensor")
    got = sorted((r["key"], r["dtype"], r["shape"], bytes(r["data"])) for r in df.select("key", "dtype", "shape", "data").collect())
    assert got == want
    assert df.count() == len(want)


# ---------------------------------------------------------------------------------------------
# Options
# ---------------------------------------------------------------------------------------------

def test_unknown_read_option_lists_the_valid_ones(spark, tmp_path):
    ds = batch_dataset(spark, tmp_path / "ds", n=2, batch_size=2)
    msg = error_text(lambda: read(spark, ds, layuot="tensor").collect())
    assert "layuot" in msg and "read_batch_rows" in msg and "recursiveFileLookup" in msg, msg[:3000]
    msg = error_text(lambda: read(spark, ds, recursiveFileLookup="maybe").collect())
    assert "recursivefilelookup" in msg.lower() and "maybe" in msg, msg[:3000]  # keys are case-insensitive


@pytest.mark.parametrize("value", ["0", "x"])
def test_read_batch_rows_must_be_a_positive_integer(spark, tmp_path, value):
    ds = batch_dataset(spark, tmp_path / "ds", n=2, batch_size=2)
    msg = error_text(lambda: read(spark, ds, read_batch_rows=value).collect())
    assert "read_batch_rows" in msg


def test_small_read_batch_rows_still_reads_every_row(spark, tmp_path):
    ds = batch_dataset(spark, tmp_path / "ds", n=20, batch_size=8)
    rows = read(spark, ds, read_batch_rows=3).collect()
    assert sorted((r["id"], tuple(r["x"])) for r in rows) == [(i, (float(i), float(-i), i / 2.0)) for i in range(20)]
    assert read(spark, ds, read_batch_rows=3).count() == 20
    assert read(spark, ds, read_batch_rows=" 1 ").where(F.col("id") >= 10).count() == 10
    assert read(spark, ds, read_batch_rows=3, layout="tensor").count() == 6


# ---------------------------------------------------------------------------------------------
# A real cluster: executors in their own JVMs
# ---------------------------------------------------------------------------------------------

CLUSTER_SCRIPT = r"""
import json, sys
from pyspark.sql import SparkSession, functions as F
jar, out = sys.argv[1], sys.argv[2]
spark = (SparkSession.builder.master("local-cluster[2,1,1024]").config("spark.jars", jar)
         .config("spark.ui.enabled", "false").config("spark.executor.memory", "512m").getOrCreate())
df = spark.range(0, 1000, numPartitions=4).selectExpr("id", "array(cast(id AS float), cast(id * 2 AS float)) AS x")
df.write.format("safetensors").option("batch_size", 100).save(out)
back = spark.read.format("safetensors").load(out)
agg = back.agg(F.count("*").alias("n"), F.sum("id").alias("ids"), F.sum(F.col("x")[1]).alias("x1")).first()
result = {"count": back.count(), "n": agg["n"], "ids": agg["ids"], "x1": agg["x1"],
          "files": back.select("_file").distinct().count(),
          "tensor_rows": spark.read.format("safetensors").option("layout", "tensor").load(out).count()}
print("RESULT " + json.dumps(result))
spark.stop()
"""


def test_local_cluster_read_on_executors(connector_jar, tmp_path):
    out = tmp_path / "cluster"
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1")
    result = subprocess.run([sys.executable, "-c", CLUSTER_SCRIPT, str(connector_jar), str(out)], env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    [line] = [l for l in result.stdout.splitlines() if l.startswith("RESULT ")]
    got = json.loads(line[len("RESULT "):])
    # 4 partitions of 250 rows, batch_size 100: shards of 100, 100, 50 per partition.
    assert len(shards(out)) == 12
    assert (got["count"], got["n"], got["ids"], got["x1"]) == (1000, 1000, 499500, 999000.0)
    assert got["files"] == 12
    assert got["tensor_rows"] == 24


# ---------------------------------------------------------------------------------------------
# Partitioning: a large shard is split by rows, small files are packed together
# ---------------------------------------------------------------------------------------------

def test_large_shard_splits_into_row_ranges_and_small_files_are_packed(spark, tmp_path):
    # One shard of 2,000 samples × 64 floats (512,000 data bytes).
    rows = [(i, [float(i + j) for j in range(64)]) for i in range(2000)]
    df = spark.createDataFrame(rows, "id long, x array<float>").coalesce(1)
    big = write_batch(df, tmp_path / "big", 2000)
    assert len(shards(big)) == 1
    spark.conf.set("spark.sql.files.maxPartitionBytes", str(64 * 1024))
    spark.conf.set("spark.sql.files.openCostInBytes", "0")
    try:
        split = read(spark, big)
        assert split.rdd.getNumPartitions() >= 8  # ≥ 512,000 / 65,536
        got = split.select("id", "x").collect()
        assert sorted(r.id for r in got) == list(range(2000))
        assert all(r.x == [float(r.id + j) for j in range(64)] for r in got)
    finally:
        spark.conf.unset("spark.sql.files.maxPartitionBytes")
        spark.conf.unset("spark.sql.files.openCostInBytes")

    # Twenty tiny model files, packed as Spark's file sources pack them: the split size is
    # max(openCostInBytes, (data + 20 x openCostInBytes) / 2 cores), ten files a partition on
    # local[2]; all in one with spark.sql.files.minPartitionNum = 1.
    for i in range(20):
        save_model(tmp_path / "small" / f"m{i:02d}.safetensors", {"w": np.full((2,), i, dtype=np.float32)})
    packed = read(spark, tmp_path / "small")
    assert packed.rdd.getNumPartitions() == 2
    assert sorted(r.decoded[0] for r in packed.select("decoded").collect()) == [float(i) for i in range(20)]
    spark.conf.set("spark.sql.files.minPartitionNum", "1")
    try:
        assert read(spark, tmp_path / "small").rdd.getNumPartitions() == 1
    finally:
        spark.conf.unset("spark.sql.files.minPartitionNum")


def test_small_scan_spreads_over_the_cores(spark, tmp_path):
    # Ten shards of 100 samples x 16 floats: far below maxPartitionBytes, yet both cores of
    # local[2] get half of the rows (Spark's FilePartition.maxSplitBytes: total / parallelism).
    rows = [(i, [float(i + j) for j in range(16)]) for i in range(1000)]
    out = write_batch(spark.createDataFrame(rows, "id long, x array<float>").coalesce(1), tmp_path / "ds", 100)
    assert len(shards(out)) == 10
    spark.conf.set("spark.sql.files.openCostInBytes", "0")
    try:
        per_partition = read(spark, out).select("id").rdd.glom().collect()
        assert [len(p) for p in per_partition] == [500, 500]
        assert sorted(r.id for p in per_partition for r in p) == list(range(1000))
    finally:
        spark.conf.unset("spark.sql.files.openCostInBytes")
