"""Writes the datasets tests/aarch64/run.sh reads on aarch64: a local Spark (x86_64, the jar's
linux-x86_64 library) writes a batch-mode and a KV-mode dataset whose columns cover every dtype
family and the values where machines could differ (NaN payloads, -0.0, subnormals, infinities,
F16/BF16 rounding ties, integer edges).

Usage: python tests/aarch64/write_dataset.py JAR OUT_DIR   (OUT_DIR/batch and OUT_DIR/kv)
"""
import json
import struct
import sys
from pathlib import Path

from pyspark.sql import SparkSession

jar, out = sys.argv[1], Path(sys.argv[2])
spark = (SparkSession.builder.master("local[2]").config("spark.jars", jar)
         .config("spark.ui.enabled", "false").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")


def f64(bits):
    return struct.unpack("<d", struct.pack("<Q", bits))[0]


specials = [0.0, -0.0, 1.0, -1.0, 0.5, 1 + 2 ** -8, 1 + 2 ** -7, 65504.0, 65520.0, 2 ** -24, 2 ** -25,
            f64(1), 1e-310, float("inf"), float("-inf"), float("nan"), f64(0xFFF8_0000_0000_1234),
            3.141592653589793, -2.718281828459045, 1e30, -1e-30]
rows = []
for i in range(300):
    x = [specials[(i + j) % len(specials)] if j % 2 == 0 else (i * 7919 + j * 104729) % 100003 / 97.0 - 500
         for j in range(8)]
    rows.append((f"k{i:04d}", x, x, x, x, i * 1_000_003 - 2 ** 40, [(i + j) % 256 - 128 for j in range(5)],
                 [(i >> j) & 1 == 1 for j in range(7)], (i * 37) % 65536))
schema = ("key string, f64 array<double>, f32 array<double>, f16 array<double>, bf16 array<double>, "
          "i64 long, i8 array<int>, flag array<boolean>, u16 int")
df = spark.createDataFrame(rows, schema).repartition(3)
dtypes = json.dumps({"f64": "F64", "f32": "F32", "f16": "F16", "bf16": "BF16", "i64": "I64", "i8": "I8",
                     "flag": "BOOL", "u16": "U16"})
(df.write.format("safetensors").option("batch_size", 64).option("dtypes", dtypes)
   .option("columns", "f64,f32,f16,bf16,i64,i8,flag,u16").mode("overwrite").save(str(out / "batch")))
(df.write.format("safetensors").option("name_col", "key").option("dtypes", dtypes)
   .option("target_shard_size_mb", 1).mode("overwrite").save(str(out / "kv")))
spark.stop()
print(f"write_dataset: wrote {out / 'batch'} and {out / 'kv'}")
