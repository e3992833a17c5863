"""writeStream.format("safetensors") (spec/dataset.md §5.7): real streaming queries (a file source,
a checkpoint, Trigger.AvailableNow) stopped and restarted; a batch re-run after its checkpoint
commit entry is deleted changes nothing; a batch that fails leaves no listed shard; read back
with the Spark reader, our Python package and the safetensors package."""
import json
import shutil
from pathlib import Path

import pytest
from py4j.protocol import Py4JJavaError
from safetensors.numpy import load_file

import safetensors_spark


def error_text(action):
    try:
        action()
    except Py4JJavaError as e:
        return str(e.java_exception)
    except Exception as e:  # pyspark's StreamingQueryException / IllegalArgumentException
        return str(e)
    raise AssertionError("expected the query to fail")


def manifest(d):
    return json.loads((Path(d) / "dataset_manifest.json").read_text())


def shard_files(d):
    return sorted(p.name for p in Path(d).glob("*.safetensors"))


def add_input(spark, inp, name, rows, schema):
    """One input file: one micro-batch with maxFilesPerTrigger=1 (written aside, then moved in)."""
    tmp = inp.parent / f"tmp-{name}"
    spark.createDataFrame(rows, schema).coalesce(1).write.parquet(str(tmp))
    part = next(tmp.glob("part-*.parquet"))
    inp.mkdir(exist_ok=True)
    shutil.move(str(part), str(inp / f"{name}.parquet"))
    shutil.rmtree(tmp)


def forget_commit(ck, batch):
    """Deletes the checkpoint's record that `batch` committed (and Hadoop's checksum of it): the
    restarted query runs that batch again."""
    (ck / "commits" / str(batch)).unlink()
    (ck / "commits" / f".{batch}.crc").unlink(missing_ok=True)


def run(spark, inp, out, ck, schema, **options):
    """Runs the stream over every input file not yet processed, then returns the query id."""
    w = (spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(inp))
         .writeStream.format("safetensors").option("checkpointLocation", str(ck)))
    for k, v in options.items():
        w = w.option(k, v)
    q = w.trigger(availableNow=True).start(str(out))
    try:
        q.awaitTermination()
    finally:
        q.stop()
    return q.id


BATCH_SCHEMA = "i long, x array<float>"


def batch_rows(lo, hi):
    return [(i, [float(i), -float(i)]) for i in range(lo, hi)]


def sample_rows(spark, out):
    return sorted((r.i, tuple(r.x)) for r in spark.read.format("safetensors").load(str(out)).collect())


def st_rows(out):
    """(i, x) of every listed sample, through the safetensors package."""
    got = []
    for s in manifest(out)["shards"]:
        t = load_file(str(Path(out) / s["shard_path"]))
        n = s["samples_count"]
        got += [(int(i), tuple(float(v) for v in x)) for i, x in zip(t["i"][:n], t["x"][:n])]
    return sorted(got)


def test_batch_mode_stream_restart_and_replay(spark, tmp_path):
    inp, out, ck = tmp_path / "in", tmp_path / "out", tmp_path / "ck"
    add_input(spark, inp, "f0", batch_rows(0, 10), BATCH_SCHEMA)
    add_input(spark, inp, "f1", batch_rows(10, 20), BATCH_SCHEMA)
    qid = run(spark, inp, out, ck, BATCH_SCHEMA, batch_size=4)
    m = manifest(out)
    assert m["stream_commits"] == {qid: 1}, m.get("stream_commits")
    assert (m["total_samples"], m["layout"], m["batch_size"]) == (20, "batch", 4)
    want = [(i, (float(i), -float(i))) for i in range(20)]
    assert sample_rows(spark, out) == want
    assert st_rows(out) == want

    # stopped; a new file; restarted from the checkpoint: the same query id, batch 2 appended
    add_input(spark, inp, "f2", batch_rows(20, 30), BATCH_SCHEMA)
    assert run(spark, inp, out, ck, BATCH_SCHEMA, batch_size=4) == qid
    m = manifest(out)
    assert m["stream_commits"] == {qid: 2}
    # each micro-batch is one version recording what and who (dataset.md §5.8)
    assert (m["operation"], m["app_id"]) == ("stream_batch", spark.sparkContext.applicationId)
    assert all(len(s["crc32c"]) == 8 for s in m["shards"])
    want = [(i, (float(i), -float(i))) for i in range(30)]
    assert sample_rows(spark, out) == want
    assert st_rows(out) == want
    ds = safetensors_spark.open_dataset(str(out))
    assert len(ds) == 30
    assert sorted(int(ds[k]["i"]) for k in range(len(ds))) == list(range(30))

    # replay: the checkpoint loses its commit of batch 2, so the restarted query runs batch 2
    # again (same files, same id); the dataset records it and nothing changes
    before = ((out / "dataset_manifest.json").read_text(), shard_files(out))
    forget_commit(ck, 2)
    assert run(spark, inp, out, ck, BATCH_SCHEMA, batch_size=4) == qid
    assert (ck / "commits" / "2").exists()  # the batch did run
    assert ((out / "dataset_manifest.json").read_text(), shard_files(out)) == before
    assert not list(out.glob("_staging-*"))
    assert sample_rows(spark, out) == want


KV_SCHEMA = "k string, x array<float>"


def kv_rows(keys, scale):
    return [(k, [scale * float(n)]) for n, k in enumerate(keys)]


def kv_values(out):
    """key -> x of every key, through our Python package."""
    ds = safetensors_spark.open_dataset(str(out))
    return {k: tuple(float(v) for v in ds.get(k)["x"].reshape(-1)) for k in ds.keys()}


def test_kv_mode_stream_keys_across_batches(spark, tmp_path):
    inp, out, ck = tmp_path / "in", tmp_path / "out", tmp_path / "ck"
    opts = dict(name_col="k", duplicatesStrategy="lastWin")
    add_input(spark, inp, "f0", kv_rows(["a", "b", "c"], 1.0), KV_SCHEMA)
    add_input(spark, inp, "f1", kv_rows(["c", "d"], 10.0), KV_SCHEMA)  # c again: lastWin
    qid = run(spark, inp, out, ck, KV_SCHEMA, **opts)
    m = manifest(out)
    assert (m["stream_commits"], m["layout"], m["total_samples"]) == ({qid: 1}, "kv", 4)
    want = {"a": (0.0,), "b": (1.0,), "c": (0.0,), "d": (10.0,)}
    assert kv_values(out) == want
    tensors = {}
    for s in m["shards"]:
        tensors.update({k: tuple(v.tolist()) for k, v in load_file(str(out / s["shard_path"])).items()})
    assert tensors == {f"{k}__x": v for k, v in want.items()}
    assert spark.read.format("safetensors").load(str(out)).count() == 4  # one row per tensor

    # replay of batch 1 (its key c is in the dataset now): nothing changes
    before = ((out / "dataset_manifest.json").read_text(), shard_files(out))
    forget_commit(ck, 1)
    assert run(spark, inp, out, ck, KV_SCHEMA, **opts) == qid
    assert ((out / "dataset_manifest.json").read_text(), shard_files(out)) == before


def test_kv_fail_strategy_replay_is_not_a_duplicate(spark, tmp_path):
    """duplicatesStrategy=fail: a new batch repeating a key fails the query; a replayed batch (its
    keys are in the dataset because it committed) is not a duplicate and changes nothing."""
    inp, out, ck = tmp_path / "in", tmp_path / "out", tmp_path / "ck"
    add_input(spark, inp, "f0", kv_rows(["a", "b"], 1.0), KV_SCHEMA)
    qid = run(spark, inp, out, ck, KV_SCHEMA, name_col="k")
    before = ((out / "dataset_manifest.json").read_text(), shard_files(out))
    forget_commit(ck, 0)
    assert run(spark, inp, out, ck, KV_SCHEMA, name_col="k") == qid
    assert ((out / "dataset_manifest.json").read_text(), shard_files(out)) == before

    add_input(spark, inp, "f1", kv_rows(["z", "b"], 2.0), KV_SCHEMA)
    e = error_text(lambda: run(spark, inp, out, ck, KV_SCHEMA, name_col="k"))
    assert "b" in e and "duplicate" in e.lower(), e
    assert ((out / "dataset_manifest.json").read_text(), shard_files(out)) == before
    assert manifest(out)["stream_commits"] == {qid: 0}


def test_failed_batch_lists_no_partial_shard(spark, tmp_path):
    """Batch 1 fails in its task after sealing shards (a value that does not fit I8): the query
    fails, the manifest still lists batch 0 only, and no file of batch 1 is left behind."""
    inp, out, ck = tmp_path / "in", tmp_path / "out", tmp_path / "ck"
    opts = dict(batch_size=2, dtypes=json.dumps({"i": "I8"}))
    add_input(spark, inp, "f0", batch_rows(0, 6), BATCH_SCHEMA)
    qid = run(spark, inp, out, ck, BATCH_SCHEMA, **opts)
    before = ((out / "dataset_manifest.json").read_text(), shard_files(out))
    assert len(before[1]) == 3
    add_input(spark, inp, "f1", batch_rows(6, 12) + [(1000, [0.0, 0.0])], BATCH_SCHEMA)
    e = error_text(lambda: run(spark, inp, out, ck, BATCH_SCHEMA, **opts))
    assert "1000" in e and "I8" in e, e
    assert ((out / "dataset_manifest.json").read_text(), shard_files(out)) == before
    assert manifest(out)["stream_commits"] == {qid: 0}
    assert not list(out.glob("_staging-*"))
    assert sample_rows(spark, out) == [(i, (float(i), -float(i))) for i in range(6)]


@pytest.mark.parametrize("case", ["update", "partitionBy", "no path", "bad option"])
def test_stream_sink_refusals(spark, tmp_path, case):
    inp, out, ck = tmp_path / "in", tmp_path / "out", tmp_path / "ck"
    add_input(spark, inp, "f0", batch_rows(0, 4), BATCH_SCHEMA)
    w = (spark.readStream.schema(BATCH_SCHEMA).parquet(str(inp)).writeStream.format("safetensors")
         .option("checkpointLocation", str(ck)).option("batch_size", 2).trigger(availableNow=True))
    expected = {
        "update": "supports outputMode append only",
        "partitionBy": "partitionBy is not supported by the streaming sink",
        "no path": "the streaming sink needs an output path",
        "bad option": "unknown option 'batchsize'",
    }[case]

    def start():
        if case == "update":
            q = w.outputMode("update").start(str(out))
        elif case == "partitionBy":
            q = w.partitionBy("i").start(str(out))
        elif case == "no path":
            q = w.start()
        else:
            q = w.option("batchsize", 3).start(str(out))
        try:
            q.awaitTermination()
        finally:
            q.stop()

    e = error_text(start)
    assert expected in e, e
    assert not out.exists() or shard_files(out) == []


def test_a_python_follower_reads_the_batches_a_streaming_query_commits_after_it_started(spark, tmp_path):
    """Continuous training (spec/python.md §3.6): a ``SafetensorsIterableDataset(follow=...)``
    opened on the sink's first version reads that epoch, then each micro-batch the query commits
    (delta log entries of operation ``stream_batch``), and a compaction in between adds nothing."""
    import threading

    from safetensors_spark.torch import Follow, SafetensorsIterableDataset

    inp, out, ck = tmp_path / "in", tmp_path / "out", tmp_path / "ck"
    schema = "id long, x array<float>"
    add_input(spark, inp, "b0", [(i, [float(i)] * 2) for i in range(0, 6)], schema)
    run(spark, inp, out, ck, schema, batch_size=4)
    ds = SafetensorsIterableDataset(str(out), batch_size=2, follow=Follow(poll_interval=0.05, until_version=4))
    assert ds.dataset.version == 1

    def more():
        add_input(spark, inp, "b1", [(i, [float(i)] * 2) for i in range(6, 11)], schema)
        add_input(spark, inp, "b2", [(i, [float(i)] * 2) for i in range(11, 13)], schema)
        run(spark, inp, out, ck, schema, batch_size=4)  # versions 2 and 3
        safetensors_spark.compact(str(out), batch_size=4)  # version 4: the same rows
        add_input(spark, inp, "b3", [(i, [float(i)] * 2) for i in range(13, 14)], schema)
        run(spark, inp, out, ck, schema, batch_size=4)  # version 5: beyond until_version

    writer = threading.Thread(target=more)
    writer.start()
    got = [int(i) for b in ds for i in b["id"]]
    writer.join()
    assert sorted(got[:6]) == list(range(6)) and sorted(got[6:]) == list(range(6, 13))
    ops = [h["operation"] for h in safetensors_spark.history(str(out))]
    assert ops[1:] == ["stream_batch", "stream_batch", "compaction", "stream_batch"]
    log = sorted(p.name for p in (out / "_manifest_log").iterdir())
    assert json.loads((out / "_manifest_log" / log[1]).read_text())["log_format"] == 2
