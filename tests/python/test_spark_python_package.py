"""The Python package safetensors_spark on datasets the Spark connector wrote: every writable
dtype read back (numpy and torch), KV lookups with and without the index, MLflow digests of
successive commits; and the PySpark helper (the connector jar). The package's tests that need no
Spark are in package/ (they run alone: python -m pytest tests/python/package)."""

import json
import os

import ml_dtypes
import mlflow
import numpy as np
import pytest
import torch
from mlflow.tracking import MlflowClient

import safetensors_spark
from safetensors_spark import KeyNotFoundError, SafetensorsSparkError, open_dataset
from safetensors_spark.mlflow import dataset, log_input
from safetensors_spark.torch import SafetensorsDataset, SafetensorsIterableDataset, loader

WRITABLE = {"BOOL": np.bool_, "U8": np.uint8, "I8": np.int8, "U16": np.uint16, "I16": np.int16,
            "U32": np.uint32, "I32": np.int32, "U64": np.uint64, "I64": np.int64,
            "F16": np.float16, "BF16": ml_dtypes.bfloat16, "F32": np.float32, "F64": np.float64}


# -- written by the Spark connector ------------------------------------------------------------

def test_every_writable_dtype_written_by_spark_reads_back_equal(spark, tmp_path):
    rng = np.random.default_rng(3)
    rows = 11
    vals = {d: (rng.integers(0, 100, (rows, 3)).astype(np.float64) / (4 if d[0] in "FB" else 1))
            for d in WRITABLE}
    vals["BOOL"] = (vals["BOOL"] > 50).astype(np.float64)
    cols = {d: f"c_{d.lower()}" for d in WRITABLE}
    data = [tuple(i for i in [n] + [[float(v) for v in vals[d][n]] for d in WRITABLE]) for n in range(rows)]
    schema = "id long, " + ", ".join(f"{cols[d]} array<double>" for d in WRITABLE)
    out = tmp_path / "all"
    (spark.createDataFrame(data, schema).coalesce(1).write.format("safetensors")
     .option("batch_size", 4).option("tail_strategy", "pad")
     .option("dtypes", json.dumps({cols[d]: d for d in WRITABLE})).save(str(out)))
    ds = open_dataset(str(out))
    assert len(ds) == rows and ds.layout == "batch" and ds.columns == ["id", *cols.values()]
    assert ds.manifest["shards"][-1]["padded_samples"] == 1
    ids = [int(ds[i]["id"]) for i in range(rows)]
    order = np.argsort(ids)
    assert sorted(ids) == list(range(rows))
    for d, c in cols.items():
        got = np.stack([ds[i][c] for i in range(rows)])[order]
        want = vals[d].astype(WRITABLE[d])
        assert got.dtype == np.dtype(WRITABLE[d]), (d, got.dtype)
        assert np.array_equal(got.view(np.uint8), want.view(np.uint8)), d
    # the same values through torch, map-style and iterable; BF16 as torch.bfloat16
    m = SafetensorsDataset(str(out))
    t = m[0]
    assert t["c_bf16"].dtype == torch.bfloat16 and t["c_f16"].dtype == torch.float16
    assert t["c_bf16"].float().tolist() == ds[0]["c_bf16"].astype(np.float32).tolist()
    batches = list(loader(SafetensorsIterableDataset(str(out), batch_size=4)))
    assert [b["id"].shape[0] for b in batches] == [4, 4, 3]
    assert torch.cat([b["c_i64"] for b in batches]).numpy().tolist() == \
        np.stack([ds[i]["c_i64"] for i in range(rows)]).tolist()


def test_kv_dataset_written_by_spark_get_with_and_without_index(spark, tmp_path):
    data = [(f"user{i}", [float(i), float(-i)], i * 7) for i in range(40)]
    df = spark.createDataFrame(data, "user string, emb array<float>, n long").repartition(3)
    for index in (True, False):
        out = tmp_path / f"kv{index}"
        (df.write.format("safetensors").option("name_col", "user").option("generate_index", str(index).lower())
         .option("target_shard_size_mb", 1).save(str(out)))
        assert os.path.exists(out / "_tensor_index.parquet") == index
        ds = open_dataset(str(out), check_headers=not index)
        assert ds.layout == "kv" and len(ds) == 40 and ds.columns == ["emb", "n"]
        for i in (0, 17, 39):
            got = ds.get(f"user{i}")
            assert got["emb"].tolist() == [float(i), float(-i)] and int(got["n"]) == i * 7
        with pytest.raises(KeyNotFoundError, match="key 'nobody' not found"):
            ds.get("nobody")
        assert sorted(ds.keys()) == sorted(f"user{i}" for i in range(40))


# -- MLflow: a digest per committed state (spec/python.md §7) ----------------------------------

def test_a_mask_column_written_by_spark_filters_the_torch_order(spark, tmp_path):
    """A boolean column Spark wrote is a mask (spec/python.md §3.4): the filtered epoch is the kept
    samples only, with equal counts on 2 ranks; a predicate on an int column likewise."""
    from pyspark.sql import functions as F

    from safetensors_spark import Filter

    out = str(tmp_path / "masked")
    (spark.range(0, 48, 1, 2).withColumn("keep", F.col("id") % 3 != 1)
     .withColumn("lang", (F.col("id") % 4).cast("int"))
     .write.format("safetensors").option("batch_size", 8).save(out))
    assert open_dataset(out).schema["keep"]["dtype"] == "BOOL"
    for flt, keep in ((Filter.mask("keep"), lambda i: i % 3 != 1), (Filter.where("lang", "in", [0, 3]),
                                                                    lambda i: i % 4 in (0, 3))):
        per_rank = [[int(v) for b in loader(SafetensorsIterableDataset(out, batch_size=4, shuffle=True, seed=2,
                                                                       rank=r, world_size=2,
                                                                       filter=flt)) for v in b["id"].tolist()]
                    for r in range(2)]
        kept = [i for i in range(48) if keep(i)]
        assert len(per_rank[0]) == len(per_rank[1]) == len(kept) // 2
        assert sorted(per_rank[0] + per_rank[1]) == kept


@pytest.fixture
def tracking(tmp_path):
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    yield MlflowClient()
    mlflow.set_tracking_uri("")


def write(spark, path, mode="errorifexists", n=10):
    spark.createDataFrame([([float(i)] * 4, i) for i in range(n)], "x array<float>, y int").coalesce(1) \
        .write.format("safetensors").mode(mode).option("batch_size", 4).option("dtypes", '{"x": "BF16"}').save(str(path))


def test_the_digest_names_one_committed_state(spark, tmp_path, tracking):
    out = tmp_path / "ds"
    write(spark, out)
    first = dataset(str(out)).digest
    assert dataset(str(out), name="again").digest == first  # same state, same digest
    write(spark, out, mode="append", n=3)
    second = dataset(str(out)).digest
    assert second != first
    write(spark, out, mode="overwrite", n=10)  # the same rows again: a new commit, a new state
    assert dataset(str(out)).digest not in (first, second)
    with mlflow.start_run() as run:
        log_input(str(out), context="training", name="named")
        log_input(str(out), context="eval", name="named")
    names = {(i.dataset.name, i.dataset.digest) for i in tracking.get_run(run.info.run_id).inputs.dataset_inputs}
    assert names == {("named", dataset(str(out)).digest)}


# -- the PySpark helper -----------------------------------------------------------------------

def test_spark_configure_adds_the_connector_jar(connector_jar, monkeypatch):
    from pyspark.sql import SparkSession

    from safetensors_spark import spark as sspark

    assert os.path.samefile(sspark.find_jar(), connector_jar)
    builder = sspark.configure(SparkSession.builder.config("spark.jars", "/opt/other.jar"))
    assert builder._options["spark.jars"] == f"/opt/other.jar,{sspark.find_jar()}"
    # the SQL functions' extensions class is added to what is configured, once
    builder = sspark.configure(SparkSession.builder.config("spark.sql.extensions", "com.example.Ext"))
    assert builder._options["spark.sql.extensions"] == "com.example.Ext,io.safetensors.spark.SafetensorsExtensions"
    builder = sspark.configure(builder)
    assert builder._options["spark.sql.extensions"] == "com.example.Ext,io.safetensors.spark.SafetensorsExtensions"
    builder._options.pop("spark.sql.extensions", None)  # Builder options are shared by every builder
    monkeypatch.setattr(sspark, "_JAR_PATTERN", "no-such-*.jar")
    with pytest.raises(SafetensorsSparkError, match="no safetensors-spark connector jar found"):
        sspark.configure(SparkSession.builder)
    with pytest.raises(SafetensorsSparkError, match="does not exist"):
        sspark.configure(SparkSession.builder, jar="/nonexistent.jar")
    assert safetensors_spark.spark is sspark
