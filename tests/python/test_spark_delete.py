"""DELETE through Spark (spec/dataset.md §5.11) with row provenance (spec/reading.md §2.1): a bad
sample found while training (the Python package's ``provenance=True``) is deleted by a predicate
on the provenance columns, both readers then miss it, and after a vacuum with retention 0 no file
of the dataset holds its bytes."""

import os

import numpy as np
from pyspark.sql import Row

import safetensors_spark
import safetensors_spark.spark as sspark
from safetensors_spark import open_dataset


def files_containing(root, needle):
    hits = []
    for d, _, files in os.walk(root):
        for f in files:
            with open(os.path.join(d, f), "rb") as fh:
                if needle in fh.read():
                    hits.append(os.path.join(d, f))
    return hits


def write(spark, path, ids, mode="errorifexists"):
    df = spark.createDataFrame([Row(id=i, x=[float(i) + 0.125, float(-i) - 0.5]) for i in ids])
    (df.write.format("safetensors").option("batch_size", 4).option("retention", "0")
     .option("dtypes", '{"x": "F32"}').mode(mode).save(path))


def spark_ids(spark, path):
    return sorted(r.id for r in spark.read.format("safetensors").load(path).select("id").collect())


def test_a_sample_traced_by_provenance_is_deleted_by_sql_and_vacuumed_away(spark, tmp_path):
    path = str(tmp_path / "ds")
    write(spark, path, range(10))
    write(spark, path, range(10, 14), mode="append")
    ds = open_dataset(path, provenance=True)
    bad = next(s for s in ds if int(s["id"]) == 7)
    assert bad["_added_version"] == 1
    needle = np.asarray(bad["x"], np.float32).tobytes()
    assert files_containing(path, needle)
    # Spark names the same row by the same provenance
    seen = spark.read.format("safetensors").load(path) \
        .where(f"_file LIKE '%/{bad['_file']}' AND _row_index = {bad['_row_index']}").select("id").collect()
    assert [r.id for r in seen] == [7]
    spark.sql(f"DELETE FROM safetensors.`{path}` WHERE _file LIKE '%/{bad['_file']}' "
              f"AND _row_index = {bad['_row_index']}")
    assert spark_ids(spark, path) == [i for i in range(14) if i != 7]
    assert sorted(int(s["id"]) for s in open_dataset(path)) == [i for i in range(14) if i != 7]
    last = safetensors_spark.history(path)[-1]
    assert last["operation"] == "delete" and last["total_rows"] == 13
    safetensors_spark.vacuum(path, retention="0")
    assert files_containing(path, needle) == []


def test_pyspark_delete_by_condition_and_its_errors(spark, tmp_path):
    path = str(tmp_path / "ds")
    write(spark, path, range(8))
    out = sspark.delete(spark, path, "id % 4 = 1", commit_message="cleanup").collect()
    assert [(r.rows_removed, r.shards_replaced) for r in out] == [(2, 2)]
    assert spark_ids(spark, path) == [0, 2, 3, 4, 6, 7]
    assert safetensors_spark.history(path)[-1]["commit_message"] == "cleanup"
    for bad in ("", "   ", None):
        try:
            sspark.delete(spark, path, bad)
        except ValueError as e:
            assert "condition" in str(e)
        else:
            raise AssertionError(f"condition {bad!r} was accepted")
    assert spark_ids(spark, path) == [0, 2, 3, 4, 6, 7]
