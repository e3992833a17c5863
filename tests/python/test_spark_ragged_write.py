"""Ragged columns written through Spark (spec/dataset.md §2.1), every shard read back with the
`safetensors` package and torch and compared byte for byte with a reference built with numpy."""
import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import safetensors
import safetensors.numpy
import torch
from pyspark.sql import types as T

SCHEMA = T.StructType([
    T.StructField("i", T.LongType()),
    T.StructField("tok", T.ArrayType(T.IntegerType())),
    T.StructField("emb", T.ArrayType(T.ArrayType(T.FloatType()))),
    T.StructField("jpeg", T.BinaryType()),
    T.StructField("txt", T.StringType()),
])


def rows(n):
    out = []
    for i in range(n):
        k = (i * 7) % 5
        out.append((i, list(range(i, i + k)), [[float(i) + 0.1 * j, -1.5 * j] for j in range(i % 3)],
                    bytes([i % 256] * ((i * 3) % 4)), "é" * (i % 3)))
    return out


def shards(path):
    return sorted(p for p in Path(path).iterdir() if p.suffix == ".safetensors" and not p.name.startswith((".", "_")))


def check_shard(p, expected_rows, pad, emb_dtype):
    """expected_rows: the shard's real rows, in order."""
    tensors = safetensors.numpy.load_file(str(p))
    with safetensors.safe_open(str(p), "pt") as f:
        meta = f.metadata()
        pt = {k: f.get_tensor(k) for k in f.keys()}
    assert json.loads(meta["safetensors_spark.ragged"]) == ["tok", "emb", "jpeg", "txt"]
    n = len(expected_rows) + pad
    ref = {"i": np.array([r[0] for r in expected_rows] + [0] * pad, dtype=np.int64)}
    for c, idx, to_np in [
        ("tok", 1, lambda v: np.array(v, dtype=np.int32).reshape(-1)),
        ("emb", 2, lambda v: np.array(v, dtype=np.float32).reshape(-1, 2).astype(emb_dtype)),
        ("jpeg", 3, lambda v: np.frombuffer(v, dtype=np.uint8)),
        ("txt", 4, lambda v: np.frombuffer(v.encode("utf-8"), dtype=np.uint8)),
    ]:
        parts = [to_np(r[idx]) for r in expected_rows]
        lens = [len(x) for x in parts] + [0] * pad
        ref[c] = np.concatenate(parts) if parts else np.zeros(0)
        ref[c + ".offsets"] = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
        assert ref[c + ".offsets"].shape == (n + 1,)
    assert sorted(tensors) == sorted(ref)
    for k, v in ref.items():
        assert tensors[k].shape == v.shape or v.size == 0, k
        assert tensors[k].tobytes() == v.tobytes(), k
        assert pt[k].numpy().tobytes() == v.tobytes() if pt[k].dtype != torch.bfloat16 else True
    # torch's jagged layout takes the two tensors as they are
    nt = torch.nested.nested_tensor_from_jagged(pt["tok"], pt["tok.offsets"])
    assert [t.tolist() for t in nt.unbind()] == [list(r[1]) for r in expected_rows] + [[]] * pad


@pytest.mark.parametrize("tail", ["write", "drop", "pad"])
def test_ragged_columns_round_trip_byte_for_byte(spark, tmp_path, tail):
    data = rows(11)
    df = spark.createDataFrame(data, SCHEMA).repartition(1, "i").sortWithinPartitions("i")
    out = str(tmp_path / "d")
    (df.write.format("safetensors").option("batch_size", "4").option("tail_strategy", tail)
     .option("ragged", "tok,emb").option("dtypes", '{"emb": "BF16"}').option("generate_index", "true")
     .mode("overwrite").save(out))
    files = shards(out)
    rows_per = [4, 4, 3] if tail != "drop" else [4, 4]
    assert len(files) == len(rows_per)
    start = 0
    for f, k in zip(files, rows_per):
        check_shard(f, data[start:start + k], 1 if (tail == "pad" and k == 3) else 0, ml_dtypes.bfloat16)
        start += k
    m = json.loads((Path(out) / "dataset_manifest.json").read_text())
    assert m["schema"]["emb"] == {"dtype": "BF16", "shape": None, "ragged": {"inner_shape": [2], "element": "array"}}
    assert m["schema"]["txt"]["ragged"] == {"inner_shape": [], "element": "string"}
    assert all(s["num_tensors"] == 9 for s in m["shards"])
    # an append inherits ragged-ness; a conflicting option is refused and writes nothing
    df.write.format("safetensors").mode("append").save(out)
    assert len(shards(out)) == 2 * len(rows_per)
    before = sorted(p.name for p in Path(out).iterdir())
    with pytest.raises(Exception, match="option ragged is ''"):
        df.write.format("safetensors").option("ragged", "").mode("append").save(out)
    assert sorted(p.name for p in Path(out).iterdir()) == before


def test_ragged_bad_input_names_column_and_row_and_writes_nothing(spark, tmp_path):
    s = T.StructType([T.StructField("x", T.ArrayType(T.ArrayType(T.IntegerType())))])
    df = spark.createDataFrame([([[1, 2]],), ([[3, 4, 5]],)], s).coalesce(1)
    out = tmp_path / "bad"
    with pytest.raises(Exception, match=r"column 'x', row 1: inner shape \[3\] differs from the column's inner shape \[2\]"):
        df.write.format("safetensors").option("batch_size", "2").option("ragged", "x").save(str(out))
    assert not out.exists() or shards(out) == []
    flat = spark.createDataFrame([([1, 2],), ([3],)], T.StructType([T.StructField("x", T.ArrayType(T.IntegerType()))])).coalesce(1)
    with pytest.raises(Exception, match="name the column in option ragged"):
        flat.write.format("safetensors").option("batch_size", "2").save(str(tmp_path / "bad2"))
    coll = spark.createDataFrame([([1], [2])], "x array<int>, `x.offsets` array<int>")
    with pytest.raises(Exception, match="tensor 'x.offsets', which is also the name of written column 'x.offsets'"):
        coll.write.format("safetensors").option("batch_size", "2").option("ragged", "x").save(str(tmp_path / "bad3"))


def test_ragged_columns_with_partition_by(spark, tmp_path):
    from pyspark.sql import functions as F
    data = rows(6)
    df = spark.createDataFrame(data, SCHEMA).withColumn("p", (F.col("i") % 2).cast("int")).coalesce(1).sortWithinPartitions("i")
    out = tmp_path / "parts"
    df.write.format("safetensors").option("batch_size", "8").option("ragged", "tok,emb").partitionBy("p").save(str(out))
    for p in (0, 1):
        [f] = shards(out / f"p={p}")
        check_shard(f, [r for r in data if r[0] % 2 == p], 0, np.float32)


def test_spark_written_ragged_dataset_reads_back_in_spark_and_packs_in_python(spark, tmp_path):
    """One dataset Spark writes, read back three ways: Spark per sample, the Python package per
    sample, and packed into blocks against a brute-force stream of the written documents."""
    from safetensors_spark import open_dataset
    from safetensors_spark.torch import Packing, SafetensorsIterableDataset, loader
    data = rows(37)
    df = spark.createDataFrame(data, SCHEMA).repartition(1, "i").sortWithinPartitions("i")
    out = str(tmp_path / "d")
    (df.write.format("safetensors").option("batch_size", "8").option("tail_strategy", "pad")
     .option("ragged", "tok,emb").mode("overwrite").save(out))
    back = sorted(spark.read.format("safetensors").load(out).collect(), key=lambda r: r["i"])
    f32 = lambda e: np.array(e, np.float32).reshape(-1, 2).tolist()  # noqa: E731 (Spark's float is F32)
    assert [(r["i"], list(r["tok"]), f32(r["emb"]), bytes(r["jpeg"]), r["txt"]) for r in back] \
        == [(i, t, f32(e), j, s) for i, t, e, j, s in data]
    ds = open_dataset(out)
    assert len(ds) == 37
    for k in range(37):
        s = ds[k]
        assert s["i"] == k and s["tok"].tolist() == data[k][1] and s["jpeg"].tobytes() == data[k][3]
        assert s["txt"].tobytes().decode("utf-8") == data[k][4]
        assert s["emb"].reshape(-1, 2).tolist() == f32(data[k][2])
    eos, seq = -1, 5
    stream = [t for r in data for t in r[1] + [eos]]
    want = [stream[b * seq:(b + 1) * seq] for b in range(len(stream) // seq)]
    packed = SafetensorsIterableDataset(out, batch_size=3, shuffle=False, pack=Packing("tok", seq, eos))
    got = [blk for b in loader(packed, num_workers=2) for blk in b["tokens"].tolist()]
    assert got == want[:len(got)] and len(got) == len(want) // 3 * 3
    shuffled = SafetensorsIterableDataset(out, batch_size=None, shuffle=True, seed=4, pack=Packing("tok", seq, eos))
    blocks = [b["tokens"].tolist() for b in loader(shuffled, num_workers=0)]
    # the same documents in another order: every block's tokens come from the stream, and what
    # the blocks lack is exactly the dropped tail
    from collections import Counter
    delivered = Counter(t for b in blocks for t in b)
    assert len(blocks) == len(want) and blocks != want
    assert not delivered - Counter(stream)
    assert sum((Counter(stream) - delivered).values()) == shuffled.dropped_tokens == len(stream) % seq


def test_spark_written_mask_column_filters_the_documents_python_packs(spark, tmp_path):
    """The LLM pipeline: Spark scores and tokenizes, writes a boolean mask column (`keep`) beside
    the ragged tokens; Python packs only the kept documents (spec/python.md §3.3/§3.4), against
    a brute-force stream of the kept documents in the filtered order, split over two ranks."""
    import sys
    from pyspark.sql import functions as F
    from safetensors_spark import open_dataset
    from safetensors_spark.torch import Filter, Packing, SafetensorsIterableDataset
    sys.path.insert(0, str(Path(__file__).parent / "package"))
    from handmade import as_blocks
    from test_filter_pack import ref_packed_rank, ref_stream

    data = rows(41)
    df = (spark.createDataFrame(data, SCHEMA).select("i", "tok")
          .withColumn("score", (F.col("i") * 37 % 100) / 100.0)
          .withColumn("keep", (F.col("score") > 0.3) & (F.size("tok") >= 1))
          .repartition(3, "i").sortWithinPartitions("i"))
    out = str(tmp_path / "d")
    df.write.format("safetensors").option("ragged", "tok").option("batch_size", "4").mode("overwrite").save(out)
    ds = open_dataset(out)
    assert ds.schema["keep"]["dtype"] == "BOOL" and len(ds.shards) > 3  # shards of 4 samples
    ids = [int(ds[k]["i"]) for k in range(len(ds))]  # id of each sample, in the dataset's order
    tokens = [np.asarray(data[i][1], np.int32) for i in ids]
    keep = [(i * 37 % 100) / 100.0 > 0.3 and len(data[i][1]) >= 1 for i in ids]
    assert 0 < sum(keep) < len(ids)
    pack = Packing("tok", seq_len=4, eos=-1)
    want, dropped = ref_stream(lambda k: keep[k], 4, -1, True, 2, 0, tokens=tokens,
                               sizes=[s.samples for s in ds.shards])
    for r in range(2):
        packed = SafetensorsIterableDataset(out, batch_size=2, shuffle=True, seed=2, rank=r, world_size=2,
                                            filter=Filter.mask("keep"), pack=pack)
        assert packed.num_blocks == len(want) and packed.dropped_tokens == dropped
        assert as_blocks(packed, 4) == [b for batch in ref_packed_rank(want, 2, r, 2, False) for b in batch]
