"""The connector and the Python package against a real S3 server on loopback (moto, started by
conftest.s3_server), through Hadoop's S3A (hadoop-aws 3.4.1, the Hadoop of pyspark 4.0.5) and
fsspec's s3fs. Every file written is cross-checked with the `safetensors` package."""
import json
import os
import re
import signal
import sys
import uuid

import numpy as np
import pytest
import safetensors.numpy
from pyspark.sql import functions as F

from conftest import s3a_jars


@pytest.fixture(scope="module")
def s3(spark, s3_server):
    if not s3a_jars():
        pytest.fail("no S3A jars in jvm-connector/target/s3a-jars; run `mvn -f jvm-connector/pom.xml package` first")
    for k, v in s3_server.hadoop_conf().items():
        spark.conf.set(k, v)
    yield s3_server
    for k in s3_server.hadoop_conf():
        spark.conf.unset(k)


@pytest.fixture
def bucket(s3):
    name = f"t-{uuid.uuid4().hex[:12]}"
    s3.client().create_bucket(Bucket=name)
    return name


def keys(s3, bucket, prefix=""):
    out = []
    for page in s3.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        out += [o["Key"] for o in page.get("Contents", [])]
    return sorted(out)


def get(s3, bucket, key):
    return s3.client().get_object(Bucket=bucket, Key=key)["Body"].read()


def manifest(s3, bucket, prefix):
    return json.loads(get(s3, bucket, f"{prefix}/dataset_manifest.json"))


def shard_tensors(s3, bucket, prefix):
    """{shard name: {tensor: array}} of the shards the manifest lists, loaded with `safetensors`."""
    m = manifest(s3, bucket, prefix)
    return {s["shard_path"]: safetensors.numpy.load(get(s3, bucket, f"{prefix}/{s['shard_path']}"))
            for s in m["shards"]}


def batch_frame(spark, n, start=0, parts=2):
    return spark.createDataFrame([(i, [float(i), -float(i)]) for i in range(start, start + n)],
                                 "id long, x array<float>").repartition(parts, "id")


def test_batch_write_then_every_read_layout(spark, s3, bucket):
    url = f"s3a://{bucket}/ds"
    batch_frame(spark, 10).write.format("safetensors").option("batch_size", 3).save(url)
    got = shard_tensors(s3, bucket, "ds")
    rows = sorted((int(i), x.tolist()) for t in got.values() for i, x in zip(t["id"], t["x"]))
    assert rows == [(i, [float(i), -float(i)]) for i in range(10)]
    assert manifest(s3, bucket, "ds")["total_samples"] == 10
    # nothing but the dataset: no staging, no temporaries
    assert all(not k.split("/")[1].startswith(("_staging", ".")) for k in keys(s3, bucket, "ds/"))

    sample = spark.read.format("safetensors").option("layout", "sample").load(url)
    assert sorted((r["id"], r["x"]) for r in sample.collect()) == rows
    tensor = spark.read.format("safetensors").option("layout", "tensor").load(url)
    t_rows = tensor.select("file", "key", "shape", "data").collect()
    assert len(t_rows) == 2 * len(got)
    for r in t_rows:
        name = r["file"].rsplit("/", 1)[1]
        want = got[name][r["key"]]
        assert list(r["shape"]) == list(want.shape) and bytes(r["data"]) == want.tobytes()
    files = spark.read.format("safetensors").option("layout", "file").load(url).collect()
    assert sorted(r["file"].rsplit("/", 1)[1] for r in files) == sorted(got)
    for r in files:
        want = got[r["file"].rsplit("/", 1)[1]]["x"]
        assert bytes(r["x"]["data"]) == want.tobytes() and list(r["x"]["shape"]) == list(want.shape)


def test_every_save_mode(spark, s3, bucket):
    url = f"s3a://{bucket}/modes"
    batch_frame(spark, 4).write.format("safetensors").option("batch_size", 2).save(url)
    first = set(manifest(s3, bucket, "modes")["shards"][i]["shard_path"] for i in range(2))
    with pytest.raises(Exception, match="already exists"):
        batch_frame(spark, 4).write.format("safetensors").option("batch_size", 2).save(url)
    batch_frame(spark, 4).write.format("safetensors").mode("ignore").option("batch_size", 2).save(url)
    assert manifest(s3, bucket, "modes")["total_samples"] == 4
    batch_frame(spark, 3, start=100).write.format("safetensors").mode("append").option("batch_size", 2).save(url)
    assert manifest(s3, bucket, "modes")["total_samples"] == 7
    ids = sorted(r["id"] for r in spark.read.format("safetensors").load(url).collect())
    assert ids == [0, 1, 2, 3, 100, 101, 102]
    batch_frame(spark, 2, start=50).write.format("safetensors").mode("overwrite").option("batch_size", 2).save(url)
    m = manifest(s3, bucket, "modes")
    assert m["total_samples"] == 2
    listed = {s["shard_path"] for s in m["shards"]}
    on_store = lambda: {k.split("/")[1] for k in keys(s3, bucket, "modes/") if k.endswith(".safetensors")}
    # the overwritten shards stay for the older versions (default retention 7 days) ...
    assert on_store() >= listed | first
    assert sorted(r["id"] for r in spark.read.format("safetensors").load(url).collect()) == [50, 51]
    old = spark.read.format("safetensors").option("versionAsOf", 2).load(url).collect()
    assert sorted(r["id"] for r in old) == [0, 1, 2, 3, 100, 101, 102]
    # ... until a vacuum (the connector's, from PySpark) deletes them on the store
    from safetensors_spark.spark import vacuum
    before = on_store()
    done = vacuum(spark, url, "0", allow_shorter_retention=True).collect()
    assert {r["file"] for r in done if r["kind"] == "shard"} == before - listed
    assert on_store() == listed and not (first & on_store())
    assert sorted(r["id"] for r in spark.read.format("safetensors").load(url).collect()) == [50, 51]


def kv_frame(spark, n, start=0):
    return spark.createDataFrame([(f"k{i:04d}", [float(i)] * 3) for i in range(start, start + n)],
                                 "name string, emb array<float>").repartition(2)


def test_kv_write_with_index_and_key_lookups(spark, s3, bucket):
    url = f"s3a://{bucket}/kv"
    kv_frame(spark, 20).write.format("safetensors").option("name_col", "name") \
        .option("generate_index", "true").save(url)
    kv_frame(spark, 5, start=20).write.format("safetensors").mode("append").option("name_col", "name") \
        .option("generate_index", "true").save(url)
    got = {}
    for t in shard_tensors(s3, bucket, "kv").values():
        got.update(t)
    assert sorted(got) == [f"k{i:04d}__emb" for i in range(25)]
    assert all(got[f"k{i:04d}__emb"].tolist() == [float(i)] * 3 for i in range(25))
    # one index part per listed shard (spec/dataset.md §6.1), nothing else in the index directory
    # (but S3A's empty directory marker, the key ending in "/")
    parts = {k.rsplit("/", 1)[1] for k in keys(s3, bucket, "kv/_tensor_index.parquet/")} - {""}
    assert parts == {s["shard_path"][: -len(".safetensors")] + ".parquet"
                     for s in manifest(s3, bucket, "kv")["shards"]}
    df = spark.read.format("safetensors").load(url)
    hit = df.filter(F.col("key") == "k0022__emb").select("decoded").collect()
    assert [list(r["decoded"]) for r in hit] == [[22.0] * 3]
    assert df.filter(F.col("key").isin("k0003__emb", "k0017__emb")).count() == 2
    assert df.count() == 25


def test_python_package_reads_s3_through_fsspec(spark, s3, bucket):
    batch_frame(spark, 9).write.format("safetensors").option("batch_size", 4).save(f"s3a://{bucket}/py")
    kv_frame(spark, 6).write.format("safetensors").option("name_col", "name") \
        .option("generate_index", "true").save(f"s3a://{bucket}/pykv")
    from safetensors_spark import open_dataset

    ds = open_dataset(f"s3://{bucket}/py", storage_options=s3.storage_options())
    assert len(ds) == 9
    want = {}
    for t in shard_tensors(s3, bucket, "py").values():
        for i, x in zip(t["id"], t["x"]):
            want[int(i)] = x
    seen = {int(ds[i]["id"]): ds[i]["x"] for i in range(len(ds))}
    assert seen.keys() == want.keys()
    assert all(np.array_equal(seen[i], want[i]) for i in want)
    kv = open_dataset(f"s3://{bucket}/pykv", storage_options=s3.storage_options())
    assert sorted(kv.keys()) == [f"k{i:04d}" for i in range(6)]
    assert kv.get("k0004")["emb"].tolist() == [4.0] * 3


def shard_puts(reqs):
    return [r["path"] for r in reqs if r["method"] == "PUT" and r["path"].endswith(".safetensors")]


def test_commit_copies_no_shard_byte(spark, s3, bucket):
    """spec/dataset.md §5.6: on S3 each shard is uploaded once, by its task, to its final name; the
    job commit copies nothing (no PUT with x-amz-copy-source) and re-uploads nothing."""
    url = f"s3a://{bucket}/nocopy"
    mark = s3.mark()
    written = set()  # every shard a manifest listed after each write
    batch_frame(spark, 12, parts=3).write.format("safetensors").option("batch_size", 2) \
        .option("generate_index", "true").save(url)
    written |= {s["shard_path"] for s in manifest(s3, bucket, "nocopy")["shards"]}
    batch_frame(spark, 4, start=50).write.format("safetensors").mode("append").option("batch_size", 2) \
        .option("generate_index", "true").save(url)
    written |= {s["shard_path"] for s in manifest(s3, bucket, "nocopy")["shards"]}
    kv_frame(spark, 8).write.format("safetensors").mode("overwrite").option("name_col", "name").save(url)
    written |= {s["shard_path"] for s in manifest(s3, bucket, "nocopy")["shards"]}
    reqs = s3.requests_since(mark)
    copies = [(r["path"], r["copy_source"]) for r in reqs if r["copy_source"]]
    assert copies == []
    puts = shard_puts(reqs)
    # every shard uploaded once, straight to its final name; nothing staged
    assert sorted(puts) == sorted(f"/{bucket}/nocopy/{f}" for f in written)
    assert sorted(r["decoded"][0] for r in spark.read.format("safetensors").load(url).collect()) == \
        [float(i) for i in range(8)]


def test_failed_write_leaves_the_dataset_unchanged_and_no_debris(spark, s3, bucket):
    """Every task uploads its shards to their final names, then the job fails at commit (a key in
    two partitions, duplicatesStrategy=fail): the old dataset is byte-identical, the uploads gone."""
    url = f"s3a://{bucket}/fail"
    kv_frame(spark, 4).write.format("safetensors").option("name_col", "name").save(url)
    before = {k: get(s3, bucket, k) for k in keys(s3, bucket, "fail/")}
    rows = [(f"n{i}", [float(i)] * 3) for i in range(7)] + [("n0", [9.0] * 3)]
    # two slices of four rows: n0 in both partitions
    bad = spark.createDataFrame(spark.sparkContext.parallelize(rows, 2), "name string, emb array<float>")
    assert [sorted(r[0] for r in p) for p in bad.rdd.glom().collect()] == \
        [["n0", "n1", "n2", "n3"], ["n0", "n4", "n5", "n6"]]
    mark = s3.mark()
    with pytest.raises(Exception, match="n0"):
        bad.write.format("safetensors").mode("append").option("name_col", "name").save(url)
    uploads = shard_puts(s3.requests_since(mark))
    assert len(uploads) >= 2 and all("/_staging" not in u for u in uploads)
    after = {k: get(s3, bucket, k) for k in keys(s3, bucket, "fail/")}
    assert after == before
    assert sorted(r["key"] for r in spark.read.format("safetensors").load(url).collect()) == \
        [f"k{i:04d}__emb" for i in range(4)]


def test_last_win_rewrites_are_puts_not_copies(spark, s3, bucket):
    """KV lastWin on S3, within a write (n0 in both partitions) and across an append (n1 again):
    the rewritten shards and their index parts are placed with PUTs (never a server-side copy),
    the later row wins for every reader, and the dataset holds only what the manifest lists."""
    url = f"s3a://{bucket}/lw"
    rows = [(f"n{i}", [float(i)] * 3) for i in range(7)] + [("n0", [9.0] * 3)]
    df = spark.createDataFrame(spark.sparkContext.parallelize(rows, 2), "name string, emb array<float>")
    assert [sorted(r[0] for r in p) for p in df.rdd.glom().collect()] == \
        [["n0", "n1", "n2", "n3"], ["n0", "n4", "n5", "n6"]]
    mark = s3.mark()
    w = df.write.format("safetensors").option("name_col", "name").option("duplicatesStrategy", "lastWin") \
        .option("generate_index", "true")
    w.save(url)
    # retention 0: the shard the append replaces is deleted at its commit
    spark.createDataFrame([("n1", [7.0] * 3)], "name string, emb array<float>").write.format("safetensors") \
        .option("name_col", "name").option("duplicatesStrategy", "lastWin").option("generate_index", "true") \
        .option("retention", "0").mode("append").save(url)
    reqs = s3.requests_since(mark)
    assert [(r["path"], r["copy_source"]) for r in reqs if r["copy_source"]] == []
    m = manifest(s3, bucket, "lw")
    assert m["total_samples"] == 7
    got = {}
    for t in shard_tensors(s3, bucket, "lw").values():
        for name, v in t.items():
            assert name.endswith("__emb") and name not in got
            got[name[: -len("__emb")]] = v.tolist()
    want = {f"n{i}": [float(i)] * 3 for i in range(7)}
    want["n0"], want["n1"] = [9.0] * 3, [7.0] * 3
    assert got == want
    listed = {s["shard_path"] for s in m["shards"]}
    top = {k.split("/", 1)[1] for k in keys(s3, bucket, "lw/") if k.count("/") == 1}
    assert {k for k in top if k.endswith(".safetensors")} == listed
    lookup = spark.read.format("safetensors").load(url).where("key in ('n0__emb', 'n1__emb')")
    assert sorted((r["key"], list(r["decoded"])) for r in lookup.collect()) == \
        [("n0__emb", [9.0] * 3), ("n1__emb", [7.0] * 3)]


def test_manifest_versions_are_created_with_a_conditional_put(spark, s3, bucket):
    """spec/dataset.md §5.3 step 3 on S3: `_manifest_log/<version>.json` is created by one PUT with
    `If-None-Match: *` (the pinned moto answers 412 when the key exists, like S3); no copies."""
    c = s3.client()
    c.put_object(Bucket=bucket, Key="probe", Body=b"1", IfNoneMatch="*")
    with pytest.raises(Exception, match="PreconditionFailed|412"):
        c.put_object(Bucket=bucket, Key="probe", Body=b"2", IfNoneMatch="*")
    assert get(s3, bucket, "probe") == b"1"
    url = f"s3a://{bucket}/cond"
    mark = s3.mark()
    batch_frame(spark, 4).write.format("safetensors").option("batch_size", 2).save(url)
    batch_frame(spark, 2, start=10).write.format("safetensors").mode("append").option("batch_size", 2).save(url)
    reqs = s3.requests_since(mark)
    assert [r for r in reqs if r["copy_source"]] == []
    log_puts = [r for r in reqs if r["method"] == "PUT" and "/_manifest_log/" in r["path"]]
    # the entries, and the first version's checkpoint (spec/dataset.md §5.10), each created once
    assert [(r["path"].rsplit("/", 1)[1], r["if_none_match"], r["status"]) for r in log_puts] == [
        ("00000000000000000001.json", "*", 200), ("00000000000000000001.checkpoint.json", "*", 200),
        ("00000000000000000002.json", "*", 200)]


def test_concurrent_appenders_are_all_listed(spark, s3, bucket):
    """Four appends at once to one s3a:// dataset: every save() that returns is in the final
    manifest (the losers of a version retry on top of the winner). The conflict is forced: the
    first appender's create of the next manifest version (a PUT `If-None-Match: *` of
    `_manifest_log/<v>.json`) is held by the server until another appender has created that
    version, so S3 refuses it (412) and that appender commits again on top. A plain PUT there
    would overwrite the other appender's version and lose its rows (tried: 11 rows of 14)."""
    import threading

    url = f"s3a://{bucket}/conc"
    batch_frame(spark, 2, parts=1).write.format("safetensors").option("batch_size", 2).save(url)
    errors, done = [], []

    def append(w):
        try:
            batch_frame(spark, 3, start=100 * (w + 1), parts=1).write.format("safetensors") \
                .mode("append").option("batch_size", 2).save(url)
            done.append(w)
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    mark = s3.mark()
    s3.fail_next("PUT", 1, path=f"/{bucket}/conc/_manifest_log/", hold=60)
    threads = [threading.Thread(target=append, args=(w,)) for w in range(4)]
    threads[0].start()
    try:
        wait_for(lambda: s3.held() == 1 or not threads[0].is_alive(), "the first commit to be held")
        for t in threads[1:]:
            t.start()
        # released once another appender has created version 2 (the held create's version)
        wait_for(lambda: "conc/_manifest_log/00000000000000000002.json" in keys(s3, bucket, "conc/_manifest_log/")
                 or not any(t.is_alive() for t in threads[1:]), "another appender to commit version 2")
    finally:
        s3.release()
        for t in threads:
            t.join()
    assert not errors, "\n\n".join(str(e)[:4000] for e in errors)
    assert sorted(done) == [0, 1, 2, 3]
    m = manifest(s3, bucket, "conc")
    assert m["total_samples"] == 2 + 4 * 3 and m["manifest_version"] == 5
    ids = sorted(r["id"] for r in spark.read.format("safetensors").load(url).collect())
    assert ids == sorted([0, 1] + [100 * (w + 1) + i for w in range(4) for i in range(3)])
    listed = {s["shard_path"] for s in m["shards"]}
    on_store = {k.split("/")[1] for k in keys(s3, bucket, "conc/") if k.endswith(".safetensors")}
    assert on_store == listed
    creates = [r for r in s3.requests_since(mark) if r["method"] == "PUT" and "/_manifest_log/" in r["path"]]
    assert all(r["if_none_match"] == "*" for r in creates)
    creates = [r for r in creates if not r["path"].endswith(".checkpoint.json")]  # entries only
    # a create of version 2 was refused (another appender had made it) and retried
    refused = [r["path"].rsplit("/", 1)[1] for r in creates if r["status"] == 412]
    assert "00000000000000000002.json" in refused, [(r["path"], r["status"]) for r in creates]
    assert sorted(r["path"].rsplit("/", 1)[1] for r in creates if r["status"] == 200) == \
        [f"{v:020d}.json" for v in range(2, 6)]


@pytest.mark.parametrize("reader", ["read", "append"])
def test_a_manifest_replaced_between_open_and_read_is_read_again(spark, s3, bucket, reader):
    """S3A opens `dataset_manifest.json` with a HEAD, then GETs it `If-Match` that ETag: a commit
    that replaces it in between makes S3 answer 412. A reader, and an appender reading its base,
    open it again and get the newer manifest whole (spec/dataset.md §5.3), instead of failing
    with S3A's RemoteFileChangedException (this failed one of four concurrent appenders)."""
    import threading

    url, key = f"s3a://{bucket}/swap", "swap/dataset_manifest.json"
    batch_frame(spark, 4).write.format("safetensors").option("batch_size", 2).save(url)
    older = get(s3, bucket, key)
    batch_frame(spark, 2, start=10).write.format("safetensors").mode("append").option("batch_size", 2).save(url)
    newer = get(s3, bucket, key)
    s3.client().put_object(Bucket=bucket, Key=key, Body=older)  # readers see version 1 again
    assert json.loads(older)["manifest_version"] == 1 and json.loads(newer)["manifest_version"] == 2

    s3.fail_next("GET", 1, path=f"/{bucket}/{key}", hold=60)
    mark, outcome = s3.mark(), {}

    def run():
        try:
            if reader == "read":
                outcome["ids"] = sorted(r["id"] for r in spark.read.format("safetensors").load(url).collect())
            else:
                batch_frame(spark, 2, start=20, parts=1).write.format("safetensors").mode("append") \
                    .option("batch_size", 2).save(url)
                outcome["ids"] = sorted(r["id"] for r in spark.read.format("safetensors").load(url).collect())
        except Exception as e:  # noqa: BLE001 (reported below)
            outcome["error"] = e

    t = threading.Thread(target=run)
    t.start()
    try:
        wait_for(lambda: s3.held() == 1, "the GET of the manifest to be held", timeout=60)
        s3.client().put_object(Bucket=bucket, Key=key, Body=newer)  # a commit publishes version 2
    finally:
        s3.release()
        t.join()
    assert "error" not in outcome, str(outcome.get("error"))[:4000]
    want = [0, 1, 2, 3, 10, 11] + ([20, 21] if reader == "append" else [])
    assert outcome["ids"] == want
    if reader == "append":
        assert manifest(s3, bucket, "swap")["manifest_version"] == 3
    # the path under test was taken: the held GET was refused, the next one read version 2
    gets = [r["status"] for r in s3.requests_since(mark) if r["method"] == "GET" and r["path"] == f"/{bucket}/{key}"]
    assert gets[0] == 412 and gets[1] in (200, 206), gets  # S3A's GET is ranged (206)


def test_throttling_is_retried_with_backoff(spark, s3, bucket):
    """503 SlowDown on shard uploads and on the manifest-version create: S3A (and, for the
    conditional create, the SDK client S3A configured) retry with backoff; the write succeeds and
    the data is whole."""
    url = f"s3a://{bucket}/slow"
    mark = s3.mark()
    s3.fail_next("PUT", 2, status=503, path="/slow/part-")
    s3.fail_next("PUT", 1, status=503, path="/slow/_manifest_log/")
    batch_frame(spark, 6).write.format("safetensors").option("batch_size", 2).save(url)
    injected = [r["path"] for r in s3.requests_since(mark) if r.get("injected")]
    assert len(injected) == 3
    # every throttled object was PUT again and is there
    assert all(r in {"/" + bucket + "/" + k for k in keys(s3, bucket, "slow/")} for r in injected)
    got = shard_tensors(s3, bucket, "slow")
    assert sorted(int(i) for t in got.values() for i in t["id"]) == list(range(6))


def test_store_failing_after_the_version_is_created_names_the_version(spark, s3, bucket):
    """spec/dataset.md §5.3: the store refuses the PUT of dataset_manifest.json (403) after the
    write's manifest version was created in _manifest_log/. The save fails with an error naming the
    path, the committed version and what readers see; readers of dataset_manifest.json (Spark,
    the Python package) still see the previous version; the next write publishes a newer version,
    which holds the committed write's rows once."""
    from safetensors_spark import open_dataset

    url = f"s3a://{bucket}/pub"
    batch_frame(spark, 4).write.format("safetensors").option("batch_size", 2).save(url)
    mark = s3.mark()
    s3.fail_next("PUT", 1, status=403, path=f"/{bucket}/pub/dataset_manifest.json")
    with pytest.raises(Exception) as e:
        batch_frame(spark, 4, start=10).write.format("safetensors").mode("append") \
            .option("batch_size", 2).save(url)
    msg = str(e.value)
    assert f"the write to {url} was" in msg, msg
    assert "committed as manifest version 2 (_manifest_log/00000000000000000002.json)" in msg, msg
    assert "replacing dataset_manifest.json failed" in msg and "do not run this write again" in msg, msg
    reqs = s3.requests_since(mark)
    assert [r["status"] for r in reqs if r.get("injected")] == [403]
    assert any(r["method"] == "PUT" and r["path"].endswith("/_manifest_log/00000000000000000002.json")
               and r["status"] == 200 for r in reqs)
    # readers of dataset_manifest.json: still version 1
    assert manifest(s3, bucket, "pub")["manifest_version"] == 1
    rows = lambda: sorted(r["id"] for r in spark.read.format("safetensors").load(url).select("id").collect())
    assert rows() == list(range(4))
    assert len(open_dataset(f"s3://{bucket}/pub", storage_options=s3.storage_options())) == 4
    # the next write builds on version 2 and publishes version 3: the committed rows appear, once
    batch_frame(spark, 4, start=20).write.format("safetensors").mode("append").option("batch_size", 2).save(url)
    assert manifest(s3, bucket, "pub")["manifest_version"] == 3
    want = list(range(4)) + list(range(10, 14)) + list(range(20, 24))
    assert rows() == want
    assert len(open_dataset(f"s3://{bucket}/pub", storage_options=s3.storage_options())) == 12
    assert sorted(int(i) for t in shard_tensors(s3, bucket, "pub").values() for i in t["id"]) == want


# ---------------------------------------------------------------------------------------------
# Reads fetch only the ranges they need (spec/reading.md §5), measured at the server: the
# Content-Length of every GET it answered for a shard object
# ---------------------------------------------------------------------------------------------

READAHEAD = 64 * 1024  # S3A's fs.s3a.readahead.range default: the least a ranged GET asks for


def shard_gets(reqs, bucket, prefix):
    """{shard name: [(Range header, bytes the server sent)]} of the GETs of shard objects."""
    out = {}
    for r in reqs:
        if r["method"] == "GET" and r["path"].startswith(f"/{bucket}/{prefix}/") \
                and r["path"].endswith(".safetensors"):
            out.setdefault(r["path"].rsplit("/", 1)[1], []).append((r["range"], r["response_length"]))
    return out


def header_len(s3, bucket, key):
    head = s3.client().get_object(Bucket=bucket, Key=key, Range="bytes=0-7")["Body"].read()
    return 8 + int.from_bytes(head, "little")


def wide_batch(spark, url, rows=4096, shards=2):
    """Batch shards of `rows` samples: id (I64), a (F32 × 32), b (F32), c (F32 × 32), z (F32 ×
    256); in each shard (tensors by dtype, then name, as the reference orders them): id, a, b, c,
    z. About 5 MiB a shard."""
    spark.range(0, rows * shards, numPartitions=shards).selectExpr(
        "id", "array_repeat(cast(id AS float), 32) AS a", "cast(id % 7 AS float) AS b",
        "array_repeat(cast(-id AS float), 32) AS c", "array_repeat(cast(id AS float), 256) AS z",
    ).write.format("safetensors").option("batch_size", rows).save(url)


def test_column_subsets_fetch_only_their_ranges(spark, s3, bucket):
    """A batch dataset read for a column subset: every shard GET is ranged, and the bytes the
    server sends are the headers and the selected tensors' bytes (each GET at least S3A's
    readahead), never a whole shard; two selected tensors with a small one between them come in
    one GET (the gap is read through), with a large one between them in two."""
    url = f"s3a://{bucket}/wide"
    rows = 4096
    wide_batch(spark, url, rows)
    m = manifest(s3, bucket, "wide")
    names = [s["shard_path"] for s in m["shards"]]
    sizes = {s["shard_path"]: s["bytes"] for s in m["shards"]}
    assert len(names) == 2 and min(sizes.values()) > 5 * rows * 256
    heads = {n: header_len(s3, bucket, f"wide/{n}") for n in names}
    df = spark.read.format("safetensors").load(url)

    # b alone (16 KiB a shard): its header and one ranged GET of b per shard
    mark = s3.mark()
    assert df.selectExpr("sum(b)").first()[0] == sum(i % 7 for i in range(2 * rows))
    gets = shard_gets(s3.requests_since(mark), bucket, "wide")
    assert sorted(gets) == sorted(names)
    for n, g in gets.items():
        assert all(rng and rng.startswith("bytes=") for rng, _ in g), g  # no whole-object GET
        fetched = sum(b for _, b in g)
        assert fetched <= heads[n] + 2 * READAHEAD + rows * 4, (n, g)
        assert fetched < sizes[n] // 20, (n, fetched, sizes[n])

    # a and c (512 KiB each) with b (16 KiB) between them: one range a..c, so two GETs a shard
    # (the header's, which S3A goes on reading a from, and one for the rest of a..c); skipping b
    # would take a third for c
    mark = s3.mark()
    got = df.selectExpr("sum(a[0])", "sum(c[31])").first()
    assert (got[0], got[1]) == (sum(range(2 * rows)), -sum(range(2 * rows)))
    for n, g in shard_gets(s3.requests_since(mark), bucket, "wide").items():
        assert len(g) == 2 and g[0][0] == f"bytes=0-{READAHEAD - 1}", (n, g)
        assert g[1][0].endswith(f"-{heads[n] + rows * (8 + 128 + 4 + 128) - 1}"), (n, g, heads[n])
        # header, id (within the first GET's 64 KiB), a, b, c: never z (4 MiB)
        assert sum(b for _, b in g) == heads[n] + rows * (8 + 128 + 4 + 128), (n, g)

    # id and b with a (512 KiB) between them: more than the 48 KiB they need, so a is not read
    # through (it would double what the batch fetches); b comes in a GET of its own
    mark = s3.mark()
    assert df.selectExpr("sum(id)", "sum(b)").first()[0] == sum(range(2 * rows))
    for n, g in shard_gets(s3.requests_since(mark), bucket, "wide").items():
        assert sum(b for _, b in g) <= heads[n] + 3 * READAHEAD + rows * 12, (n, g)

    # one tensor of one shard per tensor (layout=tensor, key = 'c', file = the shard's URI): the
    # other shard is not opened at all, this one for its header (planning, then the task) and c
    one = names[0]
    mark = s3.mark()
    t = spark.read.format("safetensors").option("layout", "tensor").load(url) \
        .where((F.col("key") == "c") & (F.col("file") == f"{url}/{one}")).select("data").collect()
    gets = shard_gets(s3.requests_since(mark), bucket, "wide")
    assert len(t) == 1 and bytes(t[0]["data"]) == shard_tensors(s3, bucket, "wide")[one]["c"].tobytes()
    assert set(gets) == {one}, gets
    assert sum(b for _, b in gets[one]) <= 2 * READAHEAD + rows * 128, gets[one]


def test_key_lookups_fetch_one_header_and_one_tensor(spark, s3, bucket):
    """A KV key lookup on S3: with the index, the driver reads the manifest and the index and no
    shard; the task fetches the holding shard's header and the tensor, never a whole shard, and
    no other shard is fetched at all. Without the index, the driver reads every header (only)."""
    n, dim = 6000, 256
    frame = spark.range(0, n, numPartitions=1).selectExpr(
        "format_string('k%05d', id) AS name", f"array_repeat(cast(id AS float), {dim}) AS emb")
    for prefix, index in (("kvi", "true"), ("kvn", "false")):
        frame.write.format("safetensors").option("name_col", "name").option("target_shard_size_mb", 4) \
            .option("generate_index", index).save(f"s3a://{bucket}/{prefix}")
        m = manifest(s3, bucket, prefix)
        sizes = {s["shard_path"]: s["bytes"] for s in m["shards"]}
        assert len(sizes) >= 2 and min(sizes.values()) > 1 << 20, sizes
        heads = {s: header_len(s3, bucket, f"{prefix}/{s}") for s in sizes}
        mark = s3.mark()
        hit = spark.read.format("safetensors").load(f"s3a://{bucket}/{prefix}") \
            .where(F.col("key") == "k04321__emb").select("file", "decoded").collect()
        assert len(hit) == 1 and list(hit[0]["decoded"]) == [4321.0] * dim
        holder = hit[0]["file"].rsplit("/", 1)[1]
        reqs = s3.requests_since(mark)
        gets = shard_gets(reqs, bucket, prefix)
        for s, g in gets.items():
            assert all(rng and rng.startswith("bytes=") for rng, _ in g), g
        fetched = {s: sum(b for _, b in g) for s, g in gets.items()}
        # the task: the header (in GETs of at least READAHEAD) and one 1 KiB tensor
        task = heads[holder] + 2 * READAHEAD + dim * 4
        if index == "true":
            assert set(fetched) == {holder}, fetched
            assert fetched[holder] <= task, (fetched, heads)
            parts = sum(r["response_length"] or 0 for r in reqs
                        if r["method"] == "GET" and "/_tensor_index.parquet/" in r["path"])
            assert 0 < parts <= sum(o["Size"] for o in s3.client().list_objects_v2(
                Bucket=bucket, Prefix=f"{prefix}/_tensor_index.parquet/")["Contents"])
        else:
            assert set(fetched) == set(sizes), fetched
            for s in sizes:
                assert fetched[s] <= heads[s] + READAHEAD + (task if s == holder else 0), (s, fetched, heads)
        for s in fetched:
            assert fetched[s] < sizes[s] // 4, (s, fetched[s], sizes[s])


# ---------------------------------------------------------------------------------------------
# Integrity: read option verify_checksums (spec/reading.md §5 "Checksums"), every shard a task
# reads streamed whole once and checked against the manifest's shards[].crc32c in the engine
# ---------------------------------------------------------------------------------------------

def crc_dataset(spark, s3, bucket, prefix):
    """Batch shards of at most 4 rows (8 in all) on the server; the URL and the manifest's shards."""
    url = f"s3a://{bucket}/{prefix}"
    batch_frame(spark, 8).write.format("safetensors").option("batch_size", 4).save(url)
    shards = manifest(s3, bucket, prefix)["shards"]
    assert len(shards) >= 2 and all(len(s["crc32c"]) == 8 for s in shards), shards
    return url, shards


def put(s3, bucket, key, body):
    s3.client().put_object(Bucket=bucket, Key=key, Body=body)


def scan_bytes_read(df):
    """The rows and the scan's safetensorsBytesRead metric."""
    rows = df.collect()
    leaves = df._jdf.queryExecution().executedPlan().collectLeaves()
    assert leaves.size() == 1
    return rows, leaves.apply(0).metrics().apply("safetensorsBytesRead").value()


def test_verify_checksums_fails_naming_a_corrupt_shard(spark, s3, bucket):
    """One shard's object replaced by bytes of the same size with one data byte flipped (header
    intact): with verify_checksums the read fails naming the shard, both CRC-32Cs and the option;
    without it the read returns rows (only the option checks). The same for a byte flipped on
    the wire (the stored object intact), caught in the task's whole-object stream."""
    from safetensors_spark import _native

    url, shards = crc_dataset(spark, s3, bucket, "bad")
    bad = shards[0]["shard_path"]
    body = bytearray(get(s3, bucket, f"bad/{bad}"))
    body[-1] ^= 0xFF
    put(s3, bucket, f"bad/{bad}", bytes(body))
    actual = _native.crc32c_hex(bytes(body))
    assert actual != shards[0]["crc32c"]
    with pytest.raises(Exception) as e:
        spark.read.format("safetensors").option("verify_checksums", "true").load(url).collect()
    msg = str(e.value)
    assert f"{url}/{bad}" in msg and actual in msg and shards[0]["crc32c"] in msg, msg[-3000:]
    assert "verify_checksums" in msg, msg[-3000:]
    assert spark.read.format("safetensors").load(url).count() == 8

    # in flight: the stored object is good again; the task's first GET of it is corrupted
    body[-1] ^= 0xFF
    put(s3, bucket, f"bad/{bad}", bytes(body))
    df = spark.read.format("safetensors").option("verify_checksums", "true").load(url)
    s3.fail_next("GET", 1, path=f"/bad/{bad}", corrupt=True)
    with pytest.raises(Exception) as e:
        df.collect()
    msg = str(e.value)
    assert f"{url}/{bad}" in msg and shards[0]["crc32c"] in msg and "verify_checksums" in msg, msg[-3000:]
    assert sorted(r["id"] for r in df.collect()) == list(range(8))


def test_verify_checksums_fails_on_a_truncated_object(spark, s3, bucket):
    """A shard's object cut to half its size after the scan listed it: the task's stream ends
    early and the read fails naming the shard and both sizes."""
    url, shards = crc_dataset(spark, s3, bucket, "short")
    name, size = shards[1]["shard_path"], shards[1]["bytes"]
    df = spark.read.format("safetensors").option("verify_checksums", "true").load(url)
    put(s3, bucket, f"short/{name}", get(s3, bucket, f"short/{name}")[: size // 2])
    with pytest.raises(Exception) as e:
        df.collect()
    msg = str(e.value)
    assert f"{url}/{name}" in msg and f"has {size // 2} bytes" in msg and f"records {size}" in msg, msg[-3000:]
    assert "verify_checksums" in msg, msg[-3000:]


def test_verify_checksums_reads_shards_without_a_recorded_crc(spark, s3, bucket):
    """A manifest without shards[].crc32c (written before checksums, or by another tool): the
    option reads it without a check, not an error, even with a shard's data changed."""
    url, shards = crc_dataset(spark, s3, bucket, "old")
    m = manifest(s3, bucket, "old")
    for s in m["shards"]:
        del s["crc32c"]
    put(s3, bucket, "old/dataset_manifest.json", json.dumps(m).encode())
    name = shards[0]["shard_path"]
    body = bytearray(get(s3, bucket, f"old/{name}"))
    body[-1] ^= 0xFF
    put(s3, bucket, f"old/{name}", bytes(body))
    rows = spark.read.format("safetensors").option("verify_checksums", "true").load(url).collect()
    assert sorted(r["id"] for r in rows) == list(range(8))


def test_verify_checksums_bytes_fetched(spark, s3, bucket):
    """With the option the scan's safetensorsBytesRead grows by exactly the shards' sizes, and
    the server sent exactly that many more shard bytes (its log of every GET's body): each object
    streamed whole once, on top of the header and ranges the read takes without the option."""
    url, shards = crc_dataset(spark, s3, bucket, "met")
    total = sum(s["bytes"] for s in shards)

    def read(verify):
        mark = s3.mark()
        rows, metric = scan_bytes_read(spark.read.format("safetensors")
                                       .option("verify_checksums", verify).load(url))
        sent = sum(b for g in shard_gets(s3.requests_since(mark), bucket, "met").values() for _, b in g)
        assert sorted(r["id"] for r in rows) == list(range(8))
        return metric, sent

    plain_metric, plain_sent = read("false")
    metric, sent = read("true")
    assert metric == plain_metric + total, (metric, plain_metric, total)
    assert sent == plain_sent + total, (sent, plain_sent, total)


# The start of each driver script below: a SparkSession from the JSON in argv[1] (master, conf).
SESSION_FROM_ARGS = r"""
import json, sys
from pyspark.sql import SparkSession

args = json.loads(sys.argv[1])
builder = SparkSession.builder.master(args["master"])
for k, v in args["conf"].items():
    builder = builder.config(k, v)
spark = builder.getOrCreate()
"""

CLUSTER_VERIFY_READ = SESSION_FROM_ARGS + r"""
import urllib.request

df = spark.read.format("safetensors").option("verify_checksums", "true").load(args["url"])
# listed and headers read: now the next GET of the shard (the task's whole-object stream) is
# corrupted on the wire
urllib.request.urlopen(urllib.request.Request(args["fault"], method="POST"), timeout=10).read()
print("RESULT " + json.dumps(sorted(r["id"] for r in df.collect())))
spark.stop()
"""


def test_verify_checksums_retried_task_fetches_again_on_local_cluster(s3, bucket, spark, connector_jar, tmp_path):
    """Executors of their own (local-cluster[2,1,1024], spark.task.maxFailures 4): one shard's
    first whole-object GET corrupted on the wire fails that task attempt on the executor
    (CRC-32C mismatch); Spark's retry streams the object again and the read returns every row
    once. The retry is the refetch."""
    import subprocess

    url, shards = crc_dataset(spark, s3, bucket, "retry")
    name = shards[0]["shard_path"]
    fault = f"{s3.endpoint}/_faults?method=GET&count=1&path=/retry/{name}&status=503&corrupt=1"
    mark = s3.mark()
    args = {"master": "local-cluster[2,1,1024]", "conf": cluster_conf(s3, connector_jar, {}),
            "url": url, "fault": fault}
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1")
    proc = subprocess.run([sys.executable, "-c", CLUSTER_VERIFY_READ, json.dumps(args)], env=env,
                          capture_output=True, text=True, timeout=300)
    # the connector's errors first (the tail of stderr is the cluster's shutdown)
    assert proc.returncode == 0, "\n".join(l for l in proc.stderr.splitlines() if "safetensors:" in l)[-3000:] \
        + "\n...\n" + proc.stderr[-2000:]
    [line] = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    assert json.loads(line[len("RESULT "):]) == list(range(8))
    assert "CRC-32C" in proc.stderr and name in proc.stderr, proc.stderr[-4000:]  # the failed attempt
    whole = [r for r in s3.requests_since(mark) if r["method"] == "GET" and r["path"].endswith(f"/retry/{name}")
             and r.get("response_length") == shards[0]["bytes"]]
    # (an object this small comes whole in every GET, the header reads' too): the corrupted
    # stream, then the retry's GETs of the whole object again
    bad = [i for i, r in enumerate(whole) if r.get("corrupt")]
    assert len(bad) == 1 and len(whole) > bad[0] + 1, whole


# ---------------------------------------------------------------------------------------------
# Faults (spec/dataset.md §5.6): a server that goes away, a killed executor, speculation
# ---------------------------------------------------------------------------------------------

def wait_for(cond, what, timeout=120):
    import time

    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def test_server_stopped_mid_write_fails_naming_the_path_and_keeps_the_old_data(spark, s3, bucket, tmp_path):
    """The S3 endpoint goes away after one task uploaded its shard and before the other's upload:
    the job fails within seconds (S3A's retries kept small) with "Connection refused" for the
    `s3a://` object the task was writing; once the endpoint is back the old dataset is
    byte-identical and reads as before, and what the failed write left (its abort could not reach
    the server) is only objects named by its write id, unlisted, which §5.5's rule removes."""
    import threading

    from conftest import StoppableEndpoint

    ep = StoppableEndpoint(s3)
    ep.start()
    opt = f"fs.s3a.bucket.{bucket}.endpoint"  # this bucket through the relay (a new S3A instance)
    spark.conf.set(opt, ep.endpoint)
    try:
        url = f"s3a://{bucket}/down"
        batch_frame(spark, 6).write.format("safetensors").option("batch_size", 50).save(url)
        before = {k: get(s3, bucket, k) for k in keys(s3, bucket, "down/")}
        old = manifest(s3, bucket, "down")
        go = tmp_path / "go"

        @F.udf("long")
        def hold(i):  # the rows of partition 1 wait until the endpoint is down
            import os
            import time

            while i >= 100 and not os.path.exists(str(go)):
                time.sleep(0.05)
            return i

        df = spark.range(0, 200, numPartitions=2).select(hold("id").alias("id")) \
            .selectExpr("id", "array(cast(id AS float), 1.0f) AS x")
        mark = s3.mark()

        def stop_after_partition_0_uploaded():
            # both of partition 0's shards in place (stopping after the first PUT raced with the
            # second); partition 1 holds its rows until `go`, so it has uploaded nothing
            wait_for(lambda: sum(r["method"] == "PUT" and "/down/part-00000-" in r["path"] and r["status"] == 200
                                 for r in s3.requests_since(mark)) >= 2, "partition 0's two shard uploads")
            ep.stop()
            go.touch()

        watcher = threading.Thread(target=stop_after_partition_0_uploaded, daemon=True)
        watcher.start()
        with pytest.raises(Exception) as failed:
            df.write.format("safetensors").mode("append").option("batch_size", 50).save(url)
        watcher.join(5)
        msg = str(failed.value)
        # the task's first request after the endpoint went away: the object it was writing
        assert f"s3a://{bucket}/down/" in msg and "Connection refused" in msg, msg[-3000:]

        ep.start()  # the server is back
        assert manifest(s3, bucket, "down") == old
        after = {k: get(s3, bucket, k) for k in keys(s3, bucket, "down/")}
        assert {k: v for k, v in after.items() if k in before} == before
        rows = spark.read.format("safetensors").load(url).collect()
        assert sorted(r["id"] for r in rows) == list(range(6))
        # what the abort could not remove: partition 0's two shards and the task reports under
        # _staging-<write id>/, all named by one write id that no listed shard carries
        debris = sorted(set(after) - set(before))
        shards = [k for k in debris if k.endswith(".safetensors")]
        assert len(shards) == 2 and all(k.startswith("down/part-00000-") for k in shards), debris
        wid = shards[0][: -len(".safetensors")].split("-", 3)[3]
        assert all(wid in k for k in debris) and all(k.startswith(("down/part-00000-", f"down/_staging-{wid}/"))
                                                     for k in debris), debris
        assert not any(wid in s["shard_path"] for s in old["shards"])
        # spec/dataset.md §5.5: removable by hand, and then the bucket is as before
        for k in debris:
            s3.client().delete_object(Bucket=bucket, Key=k)
        assert {k: get(s3, bucket, k) for k in keys(s3, bucket, "down/")} == before
    finally:
        ep.stop()
        spark.conf.unset(opt)


CLUSTER_WRITE = SESSION_FROM_ARGS + r"""
import os, signal, time
from pyspark import TaskContext
from pyspark.sql import functions as F

marks, mode = args["marks"], args["mode"]


def executor_pid():
    pid = os.getpid()
    while pid > 1:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if b"CoarseGrainedExecutorBackend" in f.read():
                return pid
        with open(f"/proc/{pid}/stat") as f:
            pid = int(f.read().rsplit(")", 1)[1].split()[1])
    raise RuntimeError("no executor JVM above this Python worker")


@F.udf("long")
def fault(i):
    ctx = TaskContext.get()
    p, a = ctx.partitionId(), ctx.attemptNumber()
    open(os.path.join(marks, f"p{p}-a{a}"), "a").close()
    if mode == "kill_uploading" and p == 1 and a == 0 and not os.path.exists(os.path.join(marks, "pid-p1-a0")):
        # the test kills this executor once the attempt, authorised, has uploaded a shard
        with open(os.path.join(marks, "pid-p1-a0.tmp"), "w") as f:
            f.write(str(executor_pid()))
        os.rename(os.path.join(marks, "pid-p1-a0.tmp"), os.path.join(marks, "pid-p1-a0"))
    if mode == "kill" and p == 1 and a == 0 and i == 350:
        # mid-write (Python evaluates rows in batches of 100 ahead of the writer): some of this
        # partition's shards sealed on local disk, the rest to come
        os.kill(executor_pid(), signal.SIGKILL)
        time.sleep(60)
    if mode == "speculate" and p == 1 and i == 399:
        if a > 0:
            open(os.path.join(marks, "copy-at-last-row"), "a").close()
        else:
            # the slow original: holds its last row until the speculative copy is at its own;
            # then both ask to commit, and the one denied must upload nothing
            deadline = time.time() + 60
            while time.time() < deadline and not os.path.exists(os.path.join(marks, "copy-at-last-row")):
                time.sleep(0.05)
    return i


df = spark.range(0, 400, numPartitions=2).select(fault("id").alias("id")) \
    .selectExpr("id", "array(cast(id AS float), cast(-id AS float)) AS x")
df.write.format("safetensors").option("batch_size", 25).mode("append").save(args["url"])
print("RESULT " + json.dumps(sorted(os.listdir(marks))))
spark.stop()
"""


def cluster_conf(s3, connector_jar, extra):
    conf = {"spark.jars": ",".join(str(j) for j in [connector_jar, *s3a_jars()]),
            "spark.ui.enabled": "false", "spark.executor.memory": "512m",
            "spark.pyspark.python": sys.executable, "spark.pyspark.driver.python": sys.executable,
            "spark.task.maxFailures": "4"}
    conf.update({f"spark.hadoop.{k}": v for k, v in s3.hadoop_conf().items()})
    conf.update(extra)
    return conf


def run_cluster_write(s3, bucket, prefix, master, conf, mode, tmp_path, watch=None):
    """Runs CLUSTER_WRITE in a driver process of its own; its log goes to tmp_path/cluster.log,
    which `watch(text)` (when given) is shown about every 0.1 s while the driver runs."""
    import subprocess
    import time

    marks = tmp_path / "marks"
    marks.mkdir()
    args = {"master": master, "conf": conf, "url": f"s3a://{bucket}/{prefix}", "mode": mode,
            "marks": str(marks)}
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1")
    log, out = tmp_path / "cluster.log", tmp_path / "cluster.out"
    with open(log, "wb") as err_f, open(out, "wb") as out_f:
        proc = subprocess.Popen([sys.executable, "-c", CLUSTER_WRITE, json.dumps(args)], env=env,
                                stdout=out_f, stderr=err_f)
        deadline = time.monotonic() + 300
        try:
            while proc.poll() is None:
                assert time.monotonic() < deadline, "the cluster write did not end in 300 s"
                if watch is not None:
                    watch(log.read_text(errors="replace"))
                time.sleep(0.1)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    stderr = log.read_text(errors="replace")
    assert proc.returncode == 0, stderr[-4000:]
    [line] = [l for l in out.read_text().splitlines() if l.startswith("RESULT ")]
    return json.loads(line[len("RESULT "):])


def check_exactly_once(s3, bucket, prefix, reqs, puts_once=True):
    """The rows 0..399 exactly once; every shard object is listed and was PUT once (with
    `puts_once=False`: at least once), no other shard PUT; nothing but the dataset under the
    prefix (no staging, no temporaries). Returns the shard PUTs' object names."""
    m = manifest(s3, bucket, prefix)
    got = shard_tensors(s3, bucket, prefix)
    assert sorted(int(i) for t in got.values() for i in t["id"]) == list(range(400))
    assert m["total_samples"] == 400
    listed = {s["shard_path"] for s in m["shards"]}
    on_store = keys(s3, bucket, f"{prefix}/")
    assert {k.split("/", 1)[1] for k in on_store if k.endswith(".safetensors")} == listed
    assert all(not k.split("/")[1].startswith(("_staging", ".")) for k in on_store), on_store
    puts = [p.rsplit("/", 1)[1] for p in shard_puts(reqs) if p.startswith(f"/{bucket}/{prefix}/")]
    if puts_once:
        assert sorted(puts) == sorted(listed), puts
    else:
        assert set(puts) == listed, puts
    return puts


def test_executor_killed_mid_write_on_local_cluster(s3, bucket, connector_jar, tmp_path):
    """local-cluster[2,1,1024] writing to S3: the first attempt of partition 1 kills its executor
    JVM (SIGKILL) mid-partition, with some of its 8 shards sealed on local disk. The attempt is
    re-run on the other executor; the dataset holds every row exactly once, and the bucket only
    the listed shards, each uploaded once (the killed attempt had uploaded nothing: uploads
    come after the commit coordinator's authorisation)."""
    mark = s3.mark()
    executor_tmp = tmp_path / "executor-tmp"  # the executors' java.io.tmpdir: their local work dirs
    executor_tmp.mkdir()
    conf = cluster_conf(s3, connector_jar, {"spark.executor.extraJavaOptions": f"-Djava.io.tmpdir={executor_tmp}"})
    marks = run_cluster_write(s3, bucket, "killed", "local-cluster[2,1,1024]", conf, "kill", tmp_path)
    assert {"p0-a0", "p1-a0", "p1-a1"} <= set(marks), marks  # partition 1 ran twice
    check_exactly_once(s3, bucket, "killed", s3.requests_since(mark))
    # the killed attempt's local work dir (shards sealed, never uploaded) was removed by the next
    # task that made one (the re-run): its owner lock died with the JVM (spec/dataset.md §5.6)
    assert not list(executor_tmp.glob("safetensors-task-*")), list(executor_tmp.iterdir())


def test_executor_killed_during_its_authorised_uploads_on_local_cluster(s3, bucket, connector_jar, tmp_path):
    """local-cluster[2,1,1024] writing to S3: partition 1's first attempt is authorised by the
    commit coordinator and starts uploading its 8 shards (the first 3 PUTs slowed to 1.5 s each);
    once one has reached the store the test SIGKILLs that attempt's executor JVM. Spark clears the
    dead committer's authorisation and runs the partition again; the re-run uploads every shard
    to the same final names (one PUT each, replacing an object whole). The dataset holds every
    row exactly once, the bucket only the listed shards (each loaded with `safetensors`), no
    `_staging-`, and no `safetensors-task-*` left in the executors' temp dirs (spec/dataset.md
    §5.6). The test checks the path under test was taken: a shard of partition 1 was PUT twice."""
    import threading

    mark = s3.mark()
    prefix = "uploading"
    s3.fail_next("PUT", 3, path=f"/{bucket}/{prefix}/part-00001-", delay=1.5)
    executor_tmp = tmp_path / "executor-tmp"
    executor_tmp.mkdir()
    marks = tmp_path / "marks"  # run_cluster_write makes it
    killed = {}
    done = threading.Event()

    def kill_once_a_shard_is_up():
        import time

        while not done.is_set():
            up = [r for r in s3.requests_since(mark) if r["method"] == "PUT" and r["status"] == 200
                  and r["path"].startswith(f"/{bucket}/{prefix}/part-00001-")]
            pid_file = marks / "pid-p1-a0"
            if up and pid_file.exists():
                pid = int(pid_file.read_text())
                os.kill(pid, signal.SIGKILL)
                killed.update(pid=pid, after=[r["path"] for r in up])
                return
            time.sleep(0.05)

    watcher = threading.Thread(target=kill_once_a_shard_is_up, daemon=True)
    watcher.start()
    try:
        conf = cluster_conf(s3, connector_jar, {"spark.executor.extraJavaOptions": f"-Djava.io.tmpdir={executor_tmp}"})
        got_marks = run_cluster_write(s3, bucket, prefix, "local-cluster[2,1,1024]", conf, "kill_uploading", tmp_path)
    finally:
        done.set()
        watcher.join(10)
    assert killed and len(killed["after"]) < 8, killed  # killed mid-upload
    assert {"p0-a0", "p1-a0", "p1-a1"} <= set(got_marks), got_marks  # partition 1 ran again
    puts = check_exactly_once(s3, bucket, prefix, s3.requests_since(mark), puts_once=False)
    twice = [n for n in set(puts) if puts.count(n) > 1]
    assert twice and all(n.startswith("part-00001-") for n in twice), puts
    assert not list(executor_tmp.glob("safetensors-task-*")), list(executor_tmp.iterdir())


@pytest.fixture
def two_host_cluster(tmp_path):
    """A Spark standalone cluster on loopback: a master on 127.0.0.1 and two workers of one core,
    on 127.0.0.2 and 127.0.0.3 (Spark never runs a speculative copy on a host where an attempt of
    the task runs, and every executor of local-cluster is on one host). Yields the master URL."""
    import subprocess
    import time

    import pyspark

    from conftest import free_port

    home = os.path.dirname(pyspark.__file__)
    spark_class = os.path.join(home, "bin", "spark-class")
    port = free_port()
    procs = []

    def launch(name, host, *args):
        env = dict(os.environ, SPARK_HOME=home, SPARK_LOCAL_IP=host, SPARK_LOG_DIR=str(tmp_path))
        out = open(tmp_path / f"{name}.log", "wb")
        procs.append(subprocess.Popen([spark_class, *args], env=env, stdout=out, stderr=subprocess.STDOUT))

    try:
        launch("master", "127.0.0.1", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
               "--port", str(port), "--webui-port", str(free_port()))
        for i, host in enumerate(("127.0.0.2", "127.0.0.3")):
            work = tmp_path / f"work{i}"
            work.mkdir()
            launch(f"worker{i}", host, "org.apache.spark.deploy.worker.Worker", "--host", host,
                   "--webui-port", str(free_port()), "--cores", "1", "--memory", "1g",
                   "--work-dir", str(work), f"spark://127.0.0.1:{port}")
        deadline = time.monotonic() + 90
        while sum("Successfully registered with master" in (tmp_path / f"worker{i}.log").read_text(errors="replace")
                  for i in range(2)) < 2:
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), \
                [(tmp_path / f).read_text(errors="replace")[-2000:] for f in ("master.log", "worker0.log", "worker1.log")]
            time.sleep(0.5)
        yield f"spark://127.0.0.1:{port}"
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()


def test_speculation_writes_no_duplicate_rows_or_shards(s3, bucket, connector_jar, tmp_path, two_host_cluster):
    """spark.speculation=true on a two-host standalone cluster writing to S3: partition 1's first
    attempt is slow (it holds its last row until the speculative copy reached its own), then both
    attempts finish and ask to commit. The server holds partition 1's shard PUTs until the driver
    has logged the other attempt's denial (at most 90 s), so the authorised attempt cannot finish,
    and get the other killed, before that one asks. The dataset holds every row once, the bucket
    only the listed shards, each PUT once: the attempt denied uploaded nothing."""
    mark = s3.mark()
    s3.fail_next("PUT", 8, path=f"/{bucket}/spec/part-00001-", hold=90)

    def release_once_denied(log):
        if "TaskCommitDenied" in log:
            s3.release()

    conf = cluster_conf(s3, connector_jar, {
        "spark.hadoop.fs.s3a.connection.timeout": "120s",  # a held PUT waits up to 90 s for its answer
        "spark.speculation": "true", "spark.speculation.interval": "100ms",
        "spark.speculation.multiplier": "1.5", "spark.speculation.quantile": "0.5",
        "spark.speculation.minTaskRuntime": "500ms", "spark.speculation.efficiency.enabled": "false",
        "spark.executor.cores": "1", "spark.cores.max": "2",
        "spark.scheduler.minRegisteredResourcesRatio": "1.0",
        "spark.driver.host": "127.0.0.1"})
    try:
        marks = run_cluster_write(s3, bucket, "spec", two_host_cluster, conf, "speculate", tmp_path,
                                  watch=release_once_denied)
    finally:
        s3.release()
    assert {"p0-a0", "p1-a0", "p1-a1", "copy-at-last-row"} <= set(marks), marks  # the copy ran
    check_exactly_once(s3, bucket, "spec", s3.requests_since(mark))
    # the path under test was taken: one attempt of partition 1 asked to commit and was denied
    denied = [l for l in (tmp_path / "cluster.log").read_text().splitlines() if "TaskCommitDenied" in l]
    assert len(denied) == 1 and "partition: 1," in denied[0], denied


def tamper_entry(read, write, delete, shards):
    m = json.loads(read("dataset_manifest.json"))
    m["shards"][0]["shard_path"] = "../x.safetensors"
    write("dataset_manifest.json", json.dumps(m).encode())
    return "../x.safetensors"


def tamper_size(read, write, delete, shards):
    write(shards[1], read(shards[1]) + b"\0")
    return shards[1]


def tamper_header(read, write, delete, shards):
    data = read(shards[0])
    write(shards[0], b"\xff" * 16 + data[16:])
    return shards[0]


def tamper_missing(read, write, delete, shards):
    delete(shards[1])
    return shards[1]


# what each tampering must give, on local disk as on S3: (Spark's message, the Python package's)
TAMPERINGS = {
    "entry": (tamper_entry, r"is not a shard file name", r"shard"),
    "size": (tamper_size, r"file not fully covered: .* = (\d+) bytes, but the file has \d+",
             r"the file has \d+ bytes but dataset_manifest.json says \d+"),
    "header": (tamper_header, r"header too large", r"invalid safetensors file: header too large"),
    "missing": (tamper_missing, r"listed in .*dataset_manifest.json.* missing", r"listed in dataset_manifest.json but missing"),
}


@pytest.mark.parametrize("case", sorted(TAMPERINGS))
def test_a_tampered_dataset_on_s3_fails_as_on_local_disk(spark, s3, bucket, tmp_path, case):
    """A dataset's manifest or a shard changed on the S3 server (through boto3): Spark (S3A) and
    the Python package (s3fs) fail naming the entry or shard, with the error they give for the
    same change on local disk."""
    import shutil

    from py4j.protocol import Py4JJavaError
    from safetensors_spark import SafetensorsSparkError, open_dataset

    src = tmp_path / "src"
    batch_frame(spark, 8, parts=1).write.format("safetensors").option("batch_size", 4).save(str(src))
    shards = sorted(s["shard_path"] for s in json.loads((src / "dataset_manifest.json").read_text())["shards"])
    assert len(shards) == 2
    files = [p for p in src.rglob("*") if p.is_file() and not p.name.startswith((".", "_SUCCESS"))]
    local = tmp_path / "local"
    shutil.copytree(src, local)
    c = s3.client()
    for p in files:
        c.put_object(Bucket=bucket, Key=f"ds/{p.relative_to(src).as_posix()}", Body=p.read_bytes())

    tamper, spark_msg, py_msg = TAMPERINGS[case]
    named = tamper(lambda n: (local / n).read_bytes(), lambda n, b: (local / n).write_bytes(b),
                   lambda n: (local / n).unlink(), shards)
    assert named == tamper(lambda n: get(s3, bucket, f"ds/{n}"),
                           lambda n, b: c.put_object(Bucket=bucket, Key=f"ds/{n}", Body=b),
                           lambda n: c.delete_object(Bucket=bucket, Key=f"ds/{n}"), shards)

    for where, url in (("local", str(local)), ("s3", f"s3a://{bucket}/ds")):
        with pytest.raises(Py4JJavaError) as e:
            spark.read.format("safetensors").load(url).collect()
        msg = str(e.value.java_exception)
        assert named in msg and re.search(spark_msg, msg), f"{where}: {msg[:3000]}"
    for where, url, opts in (("local", str(local), None), ("s3", f"s3://{bucket}/ds", s3.storage_options())):
        with pytest.raises(SafetensorsSparkError, match=py_msg) as e:
            # the open reads the manifest (and stats local shards); every shard is checked when
            # it is first used (spec/python.md §2.1)
            ds = open_dataset(url, storage_options=opts)
            for i in range(len(ds)):
                ds[i]
        assert named in str(e.value), f"{where}: {e.value}"


def test_compaction_on_s3_batch_and_kv_with_its_index(spark, s3, bucket):
    """spec/dataset.md §5.8.2 on s3a://: the Spark-side compaction reads and writes shards through
    S3A and commits with the conditional PUT; the same rows and tensors after."""
    from safetensors_spark.spark import compact

    url = f"s3a://{bucket}/cmp"
    for a in range(3):
        batch_frame(spark, 5, start=a * 10).write.format("safetensors").option("batch_size", 4) \
            .mode("append").save(url)
    before = sorted(tuple(r) for r in spark.read.format("safetensors").load(url).collect())
    m0 = manifest(s3, bucket, "cmp")
    [r] = compact(spark, url).collect()
    m = manifest(s3, bucket, "cmp")
    assert r.version == m0["manifest_version"] + 1 and m["operation"] == "compaction"
    assert m["total_samples"] == 15 and len(m["shards"]) < len(m0["shards"])
    assert sorted(tuple(x) for x in spark.read.format("safetensors").load(url).collect()) == before
    kv = f"s3a://{bucket}/cmpkv"
    for a in range(3):
        kv_frame(spark, 4, start=a * 4).write.format("safetensors").option("name_col", "name") \
            .option("generate_index", "true").mode("append").save(kv)
    want = {}
    for t in shard_tensors(s3, bucket, "cmpkv").values():
        want.update(t)
    [r] = compact(spark, kv, target_shard_size_mb=1).collect()
    m = manifest(s3, bucket, "cmpkv")
    assert m["operation"] == "compaction" and len(m["shards"]) == 1
    got = {}
    for t in shard_tensors(s3, bucket, "cmpkv").values():
        got.update(t)
    assert sorted(got) == sorted(want) and all(got[k].tobytes() == want[k].tobytes() for k in want)
    parts = {k.rsplit("/", 1)[1] for k in keys(s3, bucket, "cmpkv/_tensor_index.parquet/")}
    assert m["shards"][0]["shard_path"][: -len(".safetensors")] + ".parquet" in parts
    hit = spark.read.format("safetensors").load(kv).filter(F.col("key") == "k0005__emb").collect()
    assert [list(x["decoded"]) for x in hit] == [[5.0] * 3]


def test_delete_on_s3_rewrites_only_the_matching_shard_and_leaves_none_of_its_bytes(spark, s3, bucket):
    """spec/dataset.md §5.11 on s3a://: SQL DELETE (copy-on-write) and PySpark delete read and
    write shards through S3A and commit with the conditional PUT; with retention 0 and a vacuum
    no object under the dataset holds the deleted row's bytes."""
    from safetensors_spark.spark import delete, vacuum

    url = f"s3a://{bucket}/del"
    batch_frame(spark, 8).write.format("safetensors").option("batch_size", 4).option("retention", "0").save(url)
    m0 = manifest(s3, bucket, "del")
    needle = np.array([7.0, -7.0], np.float32).tobytes()

    def holders():
        return [k for k in keys(s3, bucket, "del/") if needle in get(s3, bucket, k)]

    assert holders()
    spark.sql(f"DELETE FROM safetensors.`{url}` WHERE id = 7")
    m = manifest(s3, bucket, "del")
    assert m["operation"] == "delete" and m["total_samples"] == 7
    before = {s["shard_path"] for s in m0["shards"]}
    assert len(before & {s["shard_path"] for s in m["shards"]}) == len(before) - 1
    [r] = delete(spark, url, "id = 0").collect()
    assert r.rows_removed == 1 and manifest(s3, bucket, "del")["total_samples"] == 6
    assert sorted(r.id for r in spark.read.format("safetensors").load(url).collect()) == list(range(1, 7))
    vacuum(spark, url, retention="0").collect()
    assert holders() == []


def test_kv_delete_keys_on_s3_rebuilds_the_index_and_leaves_none_of_the_tensors_bytes(spark, s3, bucket):
    """spec/dataset.md §5.11 on s3a://: PySpark delete_keys finds the shards holding the keys
    through the tensor index (and, without one, by a scan of the headers in tasks), rewrites them
    through S3A and commits with the conditional PUT; the index parts of the listed shards hold
    the keys left; with retention 0 and a vacuum no object holds a deleted tensor's bytes; the
    `safetensors` package and our Python reader see the keys left."""
    from safetensors_spark import open_dataset
    from safetensors_spark.spark import delete_keys, vacuum

    url = f"s3a://{bucket}/kvdel"
    kv_frame(spark, 12).write.format("safetensors").option("name_col", "name") \
        .option("generate_index", "true").option("retention", "0").save(url)
    m0 = manifest(s3, bucket, "kvdel")
    gone = {f"k{i:04d}" for i in (3, 7)}
    needles = [np.array([float(i)] * 3, np.float32).tobytes() for i in (3, 7)]

    def holders():
        return [k for k in keys(s3, bucket, "kvdel/") for n in needles if n in get(s3, bucket, k)]

    assert holders()
    before = {}
    for t in shard_tensors(s3, bucket, "kvdel").values():
        before.update(t)
    [r] = delete_keys(spark, url, sorted(gone) + ["nope"], commit_message="forget").collect()
    assert r.rows_removed == 2 and r.version == m0["manifest_version"] + 1
    m = manifest(s3, bucket, "kvdel")
    assert m["operation"] == "delete" and m["commit_message"] == "forget" and m["total_samples"] == 10
    left = sorted(f"k{i:04d}__emb" for i in range(12) if f"k{i:04d}" not in gone)
    got = {}
    for t in shard_tensors(s3, bucket, "kvdel").values():
        got.update(t)
    assert sorted(got) == left and all(got[k].tobytes() == before[k].tobytes() for k in left)
    # the index parts of the listed shards hold exactly the keys left
    import pyarrow.parquet as pq
    import io
    index_keys = []
    for s in m["shards"]:
        part = get(s3, bucket, f"kvdel/_tensor_index.parquet/{s['shard_path'][: -len('.safetensors')]}.parquet")
        index_keys += pq.read_table(io.BytesIO(part)).column("tensor_key").to_pylist()
    assert sorted(index_keys) == left
    hit = spark.read.format("safetensors").load(url).filter(F.col("key").isin("k0003__emb", "k0004__emb"))
    assert [x["key"] for x in hit.select("key").collect()] == ["k0004__emb"]
    vacuum(spark, url, retention="0").collect()
    assert holders() == []
    kv = open_dataset(f"s3://{bucket}/kvdel", storage_options=s3.storage_options())
    assert sorted(kv.keys()) == sorted(k[: -len("__emb")] for k in left)
    assert kv.get("k0004")["emb"].tolist() == [4.0] * 3
    # without an index: the headers are scanned in tasks
    plain = f"s3a://{bucket}/kvdel2"
    kv_frame(spark, 6).write.format("safetensors").option("name_col", "name").save(plain)
    [r] = delete_keys(spark, plain, ["k0001"]).collect()
    assert r.rows_removed == 1
    assert sorted(x["key"] for x in spark.read.format("safetensors").load(plain).select("key").collect()) == \
        [f"k{i:04d}__emb" for i in (0, 2, 3, 4, 5)]


def test_a_python_follower_reads_new_versions_from_s3(spark, s3, bucket):
    """spec/python.md §3.6 on S3: a following dataset opened on version 1 lists `_manifest_log/`
    and reads the new entries and shards through the remote store (native client), picks up the
    Spark appends, passes over a compaction and fails on a delete naming it."""
    from safetensors_spark.spark import compact, delete
    from safetensors_spark.torch import Follow, SafetensorsIterableDataset

    url = f"s3a://{bucket}/follow"
    batch_frame(spark, 6).write.format("safetensors").option("batch_size", 4).save(url)
    batch_frame(spark, 3, start=6, parts=1).write.format("safetensors").mode("append").save(url)  # 2
    compact(spark, url, batch_size=4).collect()  # 3: the same rows
    batch_frame(spark, 2, start=9, parts=1).write.format("safetensors").mode("append").save(url)  # 4

    def follower(until, **kw):
        return SafetensorsIterableDataset(f"s3://{bucket}/follow", batch_size=2, version=1,
                                          storage_options=s3.storage_options(),
                                          follow=Follow(poll_interval=0.05, until_version=until, **kw))
    got = [int(i) for b in follower(4) for i in b["id"]]
    assert sorted(got[:6]) == list(range(6)) and sorted(got[6:9]) == [6, 7, 8] and sorted(got[9:]) == [9, 10]
    delete(spark, url, "id = 1").collect()  # 5
    with pytest.raises(Exception, match="version 5 is a version of operation delete"):
        list(follower(5))
    assert len([i for b in follower(5, skip_change_commits=True) for i in b["id"]]) == 11
