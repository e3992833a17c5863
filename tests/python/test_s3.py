"""The connector and the Python package against a real S3 server on loopback (moto, started by
conftest.s3_server), through Hadoop's S3A (hadoop-aws 3.4.1, the Hadoop of pyspark 4.0.5) and
fsspec's s3fs. Every file written is cross-checked with the `safetensors` package."""
import io
import json
import os
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
    on_store = {k.split("/")[1] for k in keys(s3, bucket, "modes/") if k.endswith(".safetensors")}
    assert on_store == listed and not (first & on_store)  # the overwritten shards are gone
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
    spark.createDataFrame([("n1", [7.0] * 3)], "name string, emb array<float>").write.format("safetensors") \
        .option("name_col", "name").option("duplicatesStrategy", "lastWin").option("generate_index", "true") \
        .mode("append").save(url)
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
    assert [(r["path"].rsplit("/", 1)[1], r["if_none_match"], r["status"]) for r in log_puts] == [
        ("00000000000000000001.json", "*", 200), ("00000000000000000002.json", "*", 200)]


def test_concurrent_appenders_are_all_listed(spark, s3, bucket):
    """Four appends at once to one s3a:// dataset: every save() that returns is in the final
    manifest (the losers of a version retry on top of the winner)."""
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
    threads = [threading.Thread(target=append, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and sorted(done) == [0, 1, 2, 3]
    m = manifest(s3, bucket, "conc")
    assert m["total_samples"] == 2 + 4 * 3 and m["manifest_version"] >= 5
    ids = sorted(r["id"] for r in spark.read.format("safetensors").load(url).collect())
    assert ids == sorted([0, 1] + [100 * (w + 1) + i for w in range(4) for i in range(3)])
    listed = {s["shard_path"] for s in m["shards"]}
    on_store = {k.split("/")[1] for k in keys(s3, bucket, "conc/") if k.endswith(".safetensors")}
    assert on_store == listed
    creates = [r for r in s3.requests_since(mark) if r["method"] == "PUT" and "/_manifest_log/" in r["path"]]
    assert all(r["if_none_match"] == "*" for r in creates)


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

