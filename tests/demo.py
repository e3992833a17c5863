"""Demo: Spark writes a DataFrame as safetensors shards; Python `safetensors` and Spark read them back.

Usage: python tests/demo.py path/to/safetensors-spark-<version>.jar
"""
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import ml_dtypes
import numpy as np
import safetensors.numpy
import torch
from pyspark.sql import SparkSession

ROOT = Path(__file__).resolve().parents[1]
CLI = ROOT / "target" / "release" / "safetensors-spark"
jar = sys.argv[1]

spark = (
    SparkSession.builder.master("local[2]")
    .config("spark.jars", jar)
    .config("spark.ui.enabled", "false")
    .getOrCreate()
)
spark.sparkContext.setLogLevel("ERROR")

rows, dim = 1000, 64
rng = np.random.default_rng(0)
emb = rng.standard_normal((rows, dim)).astype(np.float32)
labels = rng.integers(0, 10, rows)
df = spark.createDataFrame(
    [(f"item{i}", emb[i].astype(float).tolist(), int(labels[i])) for i in range(rows)],
    "id string, embedding array<double>, label long",
).repartition(2)

with tempfile.TemporaryDirectory() as tmp:
    batch_dir, kv_dir = Path(tmp) / "batch", Path(tmp) / "kv"

    # Batch mode: every 256 rows of a partition -> one shard with stacked [256, 64] BF16 embeddings.
    (df.write.format("safetensors").option("batch_size", 256).option("columns", "embedding,label")
       .option("dtypes", json.dumps({"embedding": "BF16"})).save(str(batch_dir)))
    manifest = json.loads((batch_dir / "dataset_manifest.json").read_text())
    print(f"batch mode: {len(manifest['shards'])} shards, {manifest['total_samples']} samples, schema {manifest['schema']}")
    print(subprocess.run([CLI, "inspect", batch_dir / manifest["shards"][0]["shard_path"]], check=True, capture_output=True, text=True).stdout)

    # Read every shard with the reference package and compare with numpy's own BF16 rounding.
    got_emb = np.concatenate([safetensors.numpy.load_file(str(batch_dir / s["shard_path"]))["embedding"] for s in manifest["shards"]])
    got_lab = np.concatenate([safetensors.numpy.load_file(str(batch_dir / s["shard_path"]))["label"] for s in manifest["shards"]])
    assert got_emb.dtype == ml_dtypes.bfloat16 and got_emb.shape == (rows, dim)
    # Partitions reorder rows: match each written row to its source by label and exact BF16 bits.
    want = {(int(l), emb[i].astype(ml_dtypes.bfloat16).tobytes()) for i, l in enumerate(labels)}
    assert {(int(l), e.tobytes()) for l, e in zip(got_lab, got_emb)} == want
    print(f"safetensors (Python) read {rows} rows back: BF16 values identical to numpy/ml_dtypes rounding")

    # KV mode: one tensor per row and column, named <id>__<column>.
    df.write.format("safetensors").option("name_col", "id").option("dtype", "F32").save(str(kv_dir))
    kv = {}
    for s in json.loads((kv_dir / "dataset_manifest.json").read_text())["shards"]:
        kv.update(safetensors.numpy.load_file(str(kv_dir / s["shard_path"])))
    assert np.array_equal(kv["item42__embedding"], emb[42]) and kv["item42__label"] == labels[42]
    print(f"KV mode: {len(kv)} tensors, e.g. item42__embedding {kv['item42__embedding'].dtype} {list(kv['item42__embedding'].shape)}")

    # Spark reads the batch dataset back one row per sample (BF16 -> float) ...
    back = spark.read.format("safetensors").load(str(batch_dir))
    print("spark.read per sample:", back.schema.simpleString())
    got = {(r.label, np.array(r.embedding, dtype=np.float32).astype(ml_dtypes.bfloat16).tobytes()) for r in back.collect()}
    assert back.count() == rows and got == want
    # ... and looks a key up in the KV dataset, one row per tensor (only the shard holding it is opened).
    hit = spark.read.format("safetensors").load(str(kv_dir)).where("key = 'item42__embedding'").select("dtype", "shape", "decoded").collect()
    assert len(hit) == 1 and np.array_equal(np.array(hit[0].decoded, dtype=np.float32), emb[42])
    print(f"spark.read per tensor: item42__embedding -> {hit[0].dtype} {hit[0].shape}, values equal")

    # PyTorch: the three-line training loop over the batch dataset (package safetensors_spark).
    from safetensors_spark.torch import SafetensorsIterableDataset, loader
    ds = SafetensorsIterableDataset(str(batch_dir), batch_size=100, shuffle=True, seed=0)
    batches = [batch for batch in loader(ds, num_workers=2)]
    got = {(int(l), e.view(torch.int16).numpy().tobytes()) for b in batches for l, e in zip(b["label"], b["embedding"])}
    assert batches[0]["embedding"].dtype == torch.bfloat16 and got == want
    print(f"PyTorch: {len(batches)} shuffled batches of {list(batches[0]['embedding'].shape)} bfloat16, every row once")

spark.stop()
print("demo ok")
