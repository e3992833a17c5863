"""Builds batch-mode datasets with ragged columns by hand, exactly per the convention of
spec/dataset.md §2.1 / spec/dataset.md §2.1 (values tensor `c` + `c.offsets` I64 [rows + 1], shard
`__metadata__` with `safetensors_spark.ragged`, the manifest's `schema.<c>.ragged`), so that the
read path can be tested apart from the writer (a Spark write can replace `build_dataset` later)."""

import json
import uuid
from pathlib import Path

import numpy as np
import safetensors.numpy

DTYPES = {"I8": np.int8, "I16": np.int16, "I32": np.int32, "I64": np.int64, "U8": np.uint8,
          "F16": np.float16, "F32": np.float32, "F64": np.float64, "BOOL": np.bool_}


class Column:
    """`kind`: "array" (rows are numpy arrays of shape [n, *inner]), "binary" (bytes), "string"
    (str), or "fixed" (rows are numpy arrays of one shape)."""

    def __init__(self, kind, dtype="U8", inner_shape=()):
        self.kind, self.dtype, self.inner_shape = kind, dtype, tuple(inner_shape)

    @property
    def ragged(self):
        return self.kind != "fixed"


def row_values(col, row):
    if col.kind == "binary":
        return np.frombuffer(bytes(row), dtype=np.uint8)
    if col.kind == "string":
        return np.frombuffer(row.encode("utf-8") if isinstance(row, str) else bytes(row), dtype=np.uint8)
    return np.asarray(row, dtype=DTYPES[col.dtype]).reshape((-1, *col.inner_shape) if col.ragged else np.shape(row))


def shard_tensors(columns, rows, padded):
    """The tensors of one shard of `rows` ({column: list of rows}) plus `padded` padding rows."""
    tensors = {}
    for name, col in columns.items():
        vals = [row_values(col, r) for r in rows[name]]
        if col.ragged:
            lengths = [len(v) for v in vals] + [0] * padded
            offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
            dt = np.uint8 if col.kind in ("binary", "string") else DTYPES[col.dtype]
            inner = () if col.kind in ("binary", "string") else col.inner_shape
            tensors[name] = np.concatenate(vals).astype(dt) if vals else np.zeros((0, *inner), dt)
            tensors[name] = tensors[name].reshape((-1, *inner))
            tensors[f"{name}.offsets"] = offsets
        else:
            stacked = np.stack(vals)
            pad = np.zeros((padded, *stacked.shape[1:]), stacked.dtype)
            tensors[name] = np.concatenate([stacked, pad])
    return tensors


def write_shard(path, columns, rows, padded=0, write_id=None, metadata_overrides=None):
    n = len(next(iter(rows.values())))
    meta = {
        "safetensors_spark.format_version": "1",
        "safetensors_spark.layout": "batch",
        "safetensors_spark.write_id": write_id or uuid.uuid4().hex,
        "safetensors_spark.samples": str(n),
        "safetensors_spark.padded_samples": str(padded),
    }
    ragged = [c for c, col in columns.items() if col.ragged]
    if ragged:
        meta["safetensors_spark.ragged"] = json.dumps(ragged)
    meta.update(metadata_overrides or {})
    tensors = shard_tensors(columns, rows, padded)
    safetensors.numpy.save_file(tensors, str(path), metadata=meta)
    return tensors


def build_dataset(out, columns, shards, padded=None, batch_size=None, tensors_hook=None):
    """A dataset directory: one shard per entry of `shards` ({column: rows}), `padded[i]` padding
    rows in shard i (tail_strategy pad when any), and its dataset_manifest.json. `tensors_hook(i,
    tensors)` may change shard i's tensors before they are saved (to build corrupt shards)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    padded = padded or [0] * len(shards)
    write_id = str(uuid.uuid4())
    batch_size = batch_size or max(len(next(iter(s.values()))) + p for s, p in zip(shards, padded))
    entries = []
    for i, (rows, pad) in enumerate(zip(shards, padded)):
        name = f"part-{i:05d}-0000-{uuid.uuid4()}.safetensors"
        path = out / name
        n = len(next(iter(rows.values())))
        tensors = shard_tensors(columns, rows, pad)
        if tensors_hook:
            tensors = tensors_hook(i, tensors) or tensors
        meta = {
            "safetensors_spark.format_version": "1",
            "safetensors_spark.layout": "batch",
            "safetensors_spark.write_id": write_id,
            "safetensors_spark.samples": str(n),
            "safetensors_spark.padded_samples": str(pad),
        }
        ragged = [c for c, col in columns.items() if col.ragged]
        if ragged:
            meta["safetensors_spark.ragged"] = json.dumps(ragged)
        safetensors.numpy.save_file(tensors, str(path), metadata=meta)
        entries.append({"shard_path": name, "samples_count": n, "bytes": path.stat().st_size,
                        "partition": i, "padded_samples": pad, "num_tensors": len(tensors)})
    entries.sort(key=lambda e: e["shard_path"])
    schema = {}
    for c, col in columns.items():
        if col.ragged:
            binary = col.kind in ("binary", "string")
            schema[c] = {"dtype": "U8" if binary else col.dtype, "shape": None,
                         "ragged": {"inner_shape": [] if binary else list(col.inner_shape), "element": col.kind}}
        else:
            sample = np.shape(shards[0][c][0])
            schema[c] = {"dtype": col.dtype, "shape": [batch_size, *sample]}
    manifest = {
        "format_version": "1.0", "safetensors_version": "1.0",
        "total_samples": sum(e["samples_count"] for e in entries),
        "total_bytes": sum(e["bytes"] for e in entries),
        "shards": entries, "schema": schema,
        "format": "safetensors-spark-dataset", "created_by": "tests/python/ragged_data.py", "manifest_version": 1,
        "layout": "batch", "batch_size": batch_size, "tail_strategy": "pad" if any(padded) else "write",
        "kv_separator": None, "padded_samples": sum(padded), "dropped_samples": 0,
    }
    (out / "dataset_manifest.json").write_text(json.dumps(manifest, indent=2))
    return out
