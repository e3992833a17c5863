"""Spark Connect (spec/python.md §8): a Connect server started here with the connector jar (the
command of safetensors_spark.spark.connect_server_command), on 127.0.0.1 and a free port; a
Python Connect client writes both modes, reads back (also with the safetensors package and our
package), streams, and gets the connector's errors; the helper's configure/check_session work
with Connect sessions."""
import json
import os
import socket
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

import safetensors_spark
from safetensors_spark import SafetensorsSparkError
from safetensors_spark import spark as sspark


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(tmp, jar, port, with_jar=True):
    log = open(tmp / f"connect-{port}.log", "w")
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1")
    env.pop("SPARK_REMOTE", None)
    cmd = sspark.connect_server_command(jar, port=port, master="local[2]", conf={
        "spark.ui.enabled": "false",
        "spark.driver.host": "127.0.0.1",
        "spark.sql.shuffle.partitions": "2",
    })
    if not with_jar:  # the same server without the connector
        i = cmd.index("--jars")
        cmd = cmd[:i] + cmd[i + 2:]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp)
    # ready when the gRPC port accepts connections (not a timing assertion: a bound on start-up)
    deadline = time.monotonic() + 300
    while True:
        if proc.poll() is not None:
            log.close()
            pytest.fail(f"the Connect server exited with {proc.returncode}:\n" + Path(log.name).read_text()[-4000:])
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                break
        except OSError:
            if time.monotonic() > deadline:
                proc.kill()
                pytest.fail("the Connect server did not listen within 300 s:\n" + Path(log.name).read_text()[-4000:])
            time.sleep(0.5)
    return proc, log


def stop_server(proc, log):
    proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    log.close()


@pytest.fixture(scope="module")
def connect_url(tmp_path_factory, connector_jar):
    tmp = tmp_path_factory.mktemp("connect")
    port = free_port()
    proc, log = start_server(tmp, connector_jar, port)
    yield f"sc://127.0.0.1:{port}"
    stop_server(proc, log)


@pytest.fixture(scope="module")
def cs(connect_url):
    """A Connect client session, built through the helper (configure leaves a remote builder as it
    is; check_session finds the connector on the server)."""
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    builder = sspark.configure(ConnectSession.builder.remote(connect_url))
    assert "spark.jars" not in builder._options
    session = sspark.check_session(builder.getOrCreate())
    assert type(session).__module__.startswith("pyspark.sql.connect")
    yield session
    session.stop()


def manifest(d):
    return json.loads((Path(d) / "dataset_manifest.json").read_text())


def test_connect_batch_mode_write_and_read(cs, tmp_path):
    out = tmp_path / "batch"
    rows = [(i, [float(i), 0.5 * i]) for i in range(10)]
    df = cs.createDataFrame(rows, "i long, x array<float>").repartition(2)
    df.write.format("safetensors").option("batch_size", 3).option("dtypes", '{"x": "F16"}').save(str(out))
    m = manifest(out)
    assert (m["layout"], m["batch_size"], m["total_samples"], m["schema"]["x"]["dtype"]) == ("batch", 3, 10, "F16")
    back = cs.read.format("safetensors").load(str(out)).orderBy("i").collect()
    assert [(r.i, list(r.x)) for r in back] == [(i, [float(i), 0.5 * i]) for i in range(10)]
    got = []
    for s in m["shards"]:
        t = load_file(str(out / s["shard_path"]))
        got += [int(i) for i in t["i"][: s["samples_count"]]]
    assert sorted(got) == list(range(10))
    # append through Connect, then our package reads the whole dataset
    cs.createDataFrame([(10, [1.0, 2.0])], "i long, x array<float>").write.format("safetensors") \
        .option("batch_size", 3).option("dtypes", '{"x": "F16"}').mode("append").save(str(out))
    assert len(safetensors_spark.open_dataset(str(out))) == 11


def test_connect_kv_mode_write_and_read(cs, tmp_path):
    out = tmp_path / "kv"
    rows = [(f"k{i}", [i, i + 1, i + 2]) for i in range(6)]
    cs.createDataFrame(rows, "name string, v array<int>").write.format("safetensors") \
        .option("name_col", "name").option("generate_index", "true").save(str(out))
    m = manifest(out)
    assert (m["layout"], m["total_samples"]) == ("kv", 6)
    ds = safetensors_spark.open_dataset(str(out))
    assert sorted(ds.keys()) == [f"k{i}" for i in range(6)]
    assert ds.get("k4")["v"].tolist() == [4, 5, 6]
    tensors = cs.read.format("safetensors").load(str(out)).select("key").collect()
    assert sorted(r.key for r in tensors) == [f"k{i}__v" for i in range(6)]
    # duplicates across writes: fail (the default) is the connector's error, through Connect
    with pytest.raises(Exception, match="k3"):
        cs.createDataFrame([("k3", [0, 0, 0])], "name string, v array<int>").write.format("safetensors") \
            .option("name_col", "name").mode("append").save(str(out))
    assert manifest(out)["manifest_version"] == m["manifest_version"]


def test_connect_stream_and_errors(cs, tmp_path):
    # a bad option: the connector's message, naming it, reaches the client
    with pytest.raises(Exception, match="unknown option 'batchsize'"):
        cs.createDataFrame([(1,)], "i int").write.format("safetensors").option("batchsize", 2).save(str(tmp_path / "x"))
    assert not (tmp_path / "x").exists()
    # a streaming query through Connect: rate source, one AvailableNow run
    out, ck = tmp_path / "stream", tmp_path / "ck"
    q = (cs.readStream.format("rate").option("rowsPerSecond", 50).load()
         .selectExpr("value as i", "array(cast(value as float)) as x")
         .writeStream.format("safetensors").option("batch_size", 4)
         .option("checkpointLocation", str(ck)).trigger(availableNow=True).start(str(out)))
    q.awaitTermination()
    m = manifest(out)
    assert list(m["stream_commits"]) == [q.id]
    assert cs.read.format("safetensors").load(str(out)).count() == m["total_samples"]


def test_connect_tensor_functions_of_the_python_api_and_sql(cs, tmp_path):
    """arr_to_st / st_to_array through Connect: the Python wrappers (call_function by name) and SQL
    reach the functions the server's extensions class registered."""
    from safetensors_spark.functions import arr_to_st, st_to_array

    values = [0.1, 2.5, -1.0]
    df = cs.createDataFrame([(values,)], "x array<double>")
    # Connect Columns pick Spark Connect's functions even with a classic session in this process
    t = df.select(arr_to_st(df.x, "F16").alias("t"))
    row = t.select("t", st_to_array(t.t, "F16").alias("v")).first()
    assert (row.t.dtype, list(row.t.shape)) == ("F16", [3])
    assert bytes(row.t.data) == np.array(values, dtype=np.float16).tobytes()  # rounded to nearest even
    assert row.v == [float(h) for h in np.array(values, dtype=np.float16)]
    # the peer's argument order, written through Connect and read by safetensors
    out = tmp_path / "fn"
    df.select(arr_to_st(df["x"], [1, 3], "F16").alias("t")).write.format("safetensors") \
        .option("batch_size", 1).save(str(out))
    (shard,) = manifest(out)["shards"]
    t = load_file(str(out / shard["shard_path"]))["t"]
    assert t.dtype == np.float16 and t.shape == (1, 1, 3)
    assert t.tobytes() == np.array(values, dtype=np.float16).tobytes()
    assert cs.sql("SELECT st_to_array(arr_to_st(array(array(1, 2), array(3, 4)))) AS v").first().v == [[1, 2], [3, 4]]


def test_check_session_without_the_connector(tmp_path, connector_jar):
    """A Connect server started without the jar: check_session says so and how to fix it."""
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    port = free_port()
    proc, log = start_server(tmp_path, connector_jar, port, with_jar=False)
    try:
        session = ConnectSession.builder.remote(f"sc://127.0.0.1:{port}").create()
        try:
            with pytest.raises(SafetensorsSparkError, match="Spark Connect server has no safetensors connector"):
                sspark.check_session(session)
        finally:
            session.stop()
    finally:
        stop_server(proc, log)


def test_check_session_on_a_classic_session(spark):
    assert sspark.check_session(spark) is spark
