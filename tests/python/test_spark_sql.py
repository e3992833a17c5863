"""SQL and catalog tables (spec/sql.md) from PySpark; what INSERT writes is read back with the
`safetensors` package and compared with numpy's own conversions."""
import json
from pathlib import Path

import numpy as np
import pytest
import safetensors.numpy
from pyspark.sql import types as T

SCHEMA = T.StructType([T.StructField("id", T.LongType()), T.StructField("x", T.ArrayType(T.FloatType()))])


def rows(ids):
    return [(int(i), [float(i) + 0.1, float(i) / 3.0]) for i in ids]


def stored(path):
    """(id, x) of every sample in the dataset's shards, as the safetensors package reads them."""
    out = []
    names = json.loads((Path(path) / "dataset_manifest.json").read_text())["shards"]
    for s in names:
        t = safetensors.numpy.load_file(str(Path(path) / s["shard_path"]))
        out += list(zip(t["id"].tolist(), t["x"]))
    return sorted(out, key=lambda r: r[0])


def test_sql_on_files_reads_what_save_wrote(spark, tmp_path):
    path = str(tmp_path / "ds")
    spark.createDataFrame(rows(range(5)), SCHEMA).write.format("safetensors").option("batch_size", 2).save(path)
    got = spark.sql(f"SELECT id, x FROM safetensors.`{path}` ORDER BY id").collect()
    assert [r.id for r in got] == list(range(5))
    for r, (i, x) in zip(got, rows(range(5))):
        np.testing.assert_array_equal(np.array(r.x, np.float32), np.array(x, np.float32))
    assert spark.sql(f"SELECT count(*) AS n FROM safetensors.`{path}` WHERE id > 2").head().n == 2


def test_insert_into_a_table_writes_its_options_f16(spark, tmp_path):
    path = str(tmp_path / "t")
    spark.sql("DROP TABLE IF EXISTS py_f16")
    try:
        spark.sql(
            "CREATE TABLE py_f16 (id BIGINT, x ARRAY<FLOAT>) USING safetensors "
            f"OPTIONS (batch_size '2', dtypes '{{\"x\": \"F16\"}}') LOCATION '{path}'"
        )
        spark.createDataFrame(rows(range(3)), SCHEMA).createOrReplaceTempView("py_src")
        spark.sql("INSERT INTO py_f16 SELECT * FROM py_src")
        spark.sql("INSERT INTO py_f16 SELECT id + 10, x FROM py_src WHERE id = 0")
        got = stored(path)
        want = rows([0, 1, 2]) + [(10, rows([0])[0][1])]
        assert [i for i, _ in got] == [i for i, _ in want]
        for (_, x), (_, w) in zip(got, want):
            assert x.dtype == np.float16
            np.testing.assert_array_equal(x, np.array(w, np.float32).astype(np.float16))
        # the table reads back the F16 values as floats
        back = {r.id: r.x for r in spark.table("py_f16").collect()}
        np.testing.assert_array_equal(np.array(back[1], np.float32), got[1][1].astype(np.float32))
        spark.sql("INSERT OVERWRITE py_f16 SELECT * FROM py_src WHERE id = 2")
        assert [i for i, _ in stored(path)] == [2]
        assert sorted(p.name for p in Path(path).glob("*.safetensors")) == [
            s["shard_path"] for s in json.loads((Path(path) / "dataset_manifest.json").read_text())["shards"]
        ]
    finally:
        spark.sql("DROP TABLE IF EXISTS py_f16")
    assert Path(path).exists()  # external: the data stays


def test_save_as_table_and_an_unknown_table_option(spark, tmp_path):
    spark.sql("DROP TABLE IF EXISTS py_sat")
    try:
        df = spark.createDataFrame(rows(range(4)), SCHEMA)
        df.write.format("safetensors").option("batch_size", 3).option("path", str(tmp_path / "sat")).saveAsTable("py_sat")
        assert [i for i, _ in stored(tmp_path / "sat")] == [0, 1, 2, 3]
        assert spark.sql("SELECT count(*) AS n FROM py_sat").head().n == 4
    finally:
        spark.sql("DROP TABLE IF EXISTS py_sat")
    with pytest.raises(Exception, match=r"unknown table option\(s\) 'batchsize'"):
        spark.sql(f"CREATE TABLE py_bad USING safetensors OPTIONS (batchsize '2') LOCATION '{tmp_path / 'sat'}'")
