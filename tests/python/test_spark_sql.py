"""SQL and catalog tables (spec/sql.md) from PySpark; what INSERT writes is read back with the
`safetensors` package and compared with numpy's own conversions."""
import json
import re
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
            f"OPTIONS (batch_size '2', dtypes '{{\"x\": \"F16\"}}') TBLPROPERTIES ('retention' = '0') "
            f"LOCATION '{path}'"
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
        # the table's retention 0: INSERT OVERWRITE deletes the shards it replaces at once
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


def manifest(path):
    return json.loads((Path(path) / "dataset_manifest.json").read_text())


def new_shards(path, before):
    """{shard name: {tensor name: array}} of the shards the manifest lists that `before` did not."""
    listed = [s["shard_path"] for s in manifest(path)["shards"] if s["shard_path"] not in before]
    return {s: safetensors.numpy.load_file(str(Path(path) / s)) for s in listed}


def test_appends_to_a_table_take_the_datasets_settings(spark, tmp_path):
    # saveAsTable's options are not stored with the table (Spark keeps them for that write only):
    # every later append takes the settings the dataset's manifest records
    spark.sql("DROP TABLE IF EXISTS py_keep")
    try:
        path = tmp_path / "keep"
        (spark.createDataFrame(rows(range(3)), SCHEMA).write.format("safetensors").option("path", str(path))
         .option("batch_size", "8").option("dtypes", '{"x": "F16"}').saveAsTable("py_keep"))
        before = {s["shard_path"] for s in manifest(path)["shards"]}
        spark.createDataFrame(rows(range(10, 20)), SCHEMA).coalesce(1).createOrReplaceTempView("py_keep_src")
        spark.sql("INSERT INTO py_keep SELECT * FROM py_keep_src")
        spark.createDataFrame(rows([30]), SCHEMA).write.format("safetensors").mode("append").saveAsTable("py_keep")
        spark.createDataFrame(rows([31]), SCHEMA).write.insertInto("py_keep")
        added = new_shards(path, before)
        # 10 rows in one task: a shard of 8 and one of 2; then one row each; all in F16
        assert sorted(t["id"].shape[0] for t in added.values()) == [1, 1, 2, 8]
        assert {t["x"].dtype for t in added.values()} == {np.dtype(np.float16)}
        m = manifest(path)
        assert (m["batch_size"], m["schema"]["x"]["dtype"], m["total_samples"]) == (8, "F16", 15)
        assert [i for i, _ in stored(path)] == [0, 1, 2, *range(10, 20), 30, 31]
    finally:
        spark.sql("DROP TABLE IF EXISTS py_keep")


def test_appends_to_a_kv_table_find_its_key_column_and_separator(spark, tmp_path):
    spark.sql("DROP TABLE IF EXISTS py_kv_keep")
    path = tmp_path / "kv"
    kv = T.StructType([T.StructField("name", T.StringType()), T.StructField("x", T.ArrayType(T.FloatType()))])
    try:
        (spark.createDataFrame([("a", [1.0, 2.0])], kv).write.format("safetensors").option("name_col", "name")
         .option("kv_separator", "/").option("path", str(path)).saveAsTable("py_kv_keep"))
        spark.sql("INSERT INTO py_kv_keep VALUES ('b', array(3.0, 4.0)), ('c', array(5.0))")
        names = set()
        for s in manifest(path)["shards"]:
            names |= set(safetensors.numpy.load_file(str(path / s["shard_path"])))
        assert names == {"a/x", "b/x", "c/x"}
        assert manifest(path)["total_samples"] == 3
        # the key column is inferred: the one string column not among the dataset's columns;
        # a frame with none cannot say which it is
        with pytest.raises(Exception, match=r"does not record the key column.*\('x'\).*has none: give option name_col"):
            spark.createDataFrame([([1.0],)], "x array<float>").write.format("safetensors").mode("append").save(str(path))
    finally:
        spark.sql("DROP TABLE IF EXISTS py_kv_keep")


def test_path_appends_inherit_and_refuse_only_real_conflicts(spark, tmp_path):
    path = str(tmp_path / "ds")
    df = lambda ids: spark.createDataFrame(rows(ids), SCHEMA).coalesce(1)
    df(range(4)).write.format("safetensors").option("batch_size", 3).option("tail_strategy", "pad").option("dtype", "F16").save(path)
    df(range(10, 14)).write.format("safetensors").mode("append").save(path)
    m = manifest(path)
    assert (m["batch_size"], m["tail_strategy"], m["padded_samples"], m["total_samples"]) == (3, "pad", 4, 8)
    assert {x["dtype"] for x in m["schema"].values()} == {"F16"}
    # the same values given again are no conflict
    df([20]).write.format("safetensors").mode("append").option("batch_size", "3").option("dtypes", '{"x": "F16"}').save(path)
    before = manifest(path)
    files = sorted(p.name for p in Path(path).iterdir())
    for option, value, message in [
        ("batch_size", "5", "option batch_size is 5, the dataset has 3"),
        ("tail_strategy", "drop", "option tail_strategy is drop, the dataset has pad"),
        ("dtypes", '{"x": "F32"}', "option dtypes is F32 for column 'x', the dataset has F16"),
        ("dtype", "BF16", "option dtype is BF16 for column 'id', the dataset has F16"),
        ("kv_separator", "/", "option kv_separator does not apply to batch mode"),
    ]:
        with pytest.raises(Exception, match=re.escape(message)):
            df([99]).write.format("safetensors").mode("append").option(option, value).save(path)
    assert manifest(path) == before
    assert sorted(p.name for p in Path(path).iterdir()) == files
