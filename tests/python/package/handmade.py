"""Datasets written by hand (safetensors + a manifest of the published shape plus ours), for the
Python package's tests that need exact control of shards, padding and broken files."""

import json
import os
import uuid

import numpy as np
from safetensors.numpy import save_file

WRITE_ID = "0f8fad5b-d9cb-469f-a165-70867728950e"


def shard_name(partition, shard=0):
    return f"part-{partition:05d}-{shard:04d}-{WRITE_ID}.safetensors"


def write_batch_dataset(path, shard_sizes, *, batch_size=None, padded=None, columns=("x", "y"),
                        published_only=False, metadata=True, width=2, dtypes=None):
    """Batch layout: shard k holds samples with ids offset..offset+n-1; column x = [id, id*10, …]
    (``width`` values, F32), y = id (I64); ``dtypes`` gives other dtypes (column → safetensors
    dtype name). ``padded[k]`` zero rows follow the real ones. Returns all ids in order."""
    dtypes = {"x": "F32", "y": "I64", **(dtypes or {})}
    numpy_types = {c: _numpy_dtype(d) for c, d in dtypes.items()}
    os.makedirs(path, exist_ok=True)
    padded = padded or [0] * len(shard_sizes)
    batch_size = batch_size or max(n + p for n, p in zip(shard_sizes, padded))
    shards, offset = [], 0
    for k, (n, p) in enumerate(zip(shard_sizes, padded)):
        ids = np.arange(offset, offset + n)
        tensors = {}
        if "x" in columns:
            x = np.stack([ids * 10**j for j in range(width)], axis=1)
            tensors["x"] = np.concatenate([x, np.zeros((p, width))]).astype(numpy_types["x"])
        if "y" in columns:
            tensors["y"] = np.concatenate([ids, np.zeros(p, np.int64)]).astype(numpy_types["y"])
        meta = {"safetensors_spark.layout": "batch", "safetensors_spark.samples": str(n),
                "safetensors_spark.padded_samples": str(p)} if metadata else None
        name = shard_name(k)
        save_file(tensors, os.path.join(path, name), metadata=meta)
        entry = {"shard_path": name, "samples_count": n, "bytes": os.path.getsize(os.path.join(path, name))}
        if not published_only:
            entry.update(partition=k, padded_samples=p, num_tensors=len(tensors))
        shards.append(entry)
        offset += n
    schema = {}
    if "x" in columns:
        schema["x"] = {"dtype": dtypes["x"], "shape": [batch_size, width]}
    if "y" in columns:
        schema["y"] = {"dtype": dtypes["y"], "shape": [batch_size]}
    manifest = _manifest(shards, schema)
    if not published_only:
        manifest.update(format="safetensors-spark-dataset", created_by="tests", manifest_version=1,
                        layout="batch", batch_size=batch_size, tail_strategy="pad" if any(padded) else "write",
                        kv_separator=None, padded_samples=sum(padded), dropped_samples=0)
    write_manifest(path, manifest)
    return list(range(offset))


def write_ragged_dataset(path, shard_sizes, columns, *, padded=None, batch_size=None):
    """Batch layout with ragged columns, by the convention of spec/dataset.md §2.1 (the one
    builder of such datasets for the package's tests, until a Spark write replaces it).
    ``columns``: column → ``("ragged", dtype, rows, element)`` (``rows``: one numpy array per
    sample in global order, ``[length, *inner_shape]``; ``element``: array|binary|string) or
    ``("fixed", dtype, array)`` (``[N, *sample shape]``). Shard k holds the next
    ``shard_sizes[k]`` samples, then ``padded[k]`` pad rows (empty rows for a ragged column,
    zeros for a fixed one). Returns the manifest."""
    os.makedirs(path, exist_ok=True)
    padded = padded or [0] * len(shard_sizes)
    batch_size = batch_size or max(n + p for n, p in zip(shard_sizes, padded))
    ragged_names = [c for c, spec in columns.items() if spec[0] == "ragged"]
    shards, offset = [], 0
    for k, (n, p) in enumerate(zip(shard_sizes, padded)):
        tensors = {}
        for c, spec in columns.items():
            dt = _numpy_dtype(spec[1])
            if spec[0] == "ragged":
                rows = [np.asarray(r, dtype=dt) for r in spec[2][offset: offset + n]]
                inner = tuple(np.asarray(spec[2][0]).shape[1:]) if spec[2] else ()
                lengths = [len(r) for r in rows] + [0] * p
                tensors[c] = np.concatenate(rows).astype(dt).reshape(-1, *inner) if rows \
                    else np.zeros((0, *inner), dt)
                tensors[f"{c}.offsets"] = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
            else:
                a = np.asarray(spec[2][offset: offset + n], dtype=dt)
                tensors[c] = np.concatenate([a, np.zeros((p, *a.shape[1:]), dt)])
        meta = {"safetensors_spark.layout": "batch", "safetensors_spark.samples": str(n),
                "safetensors_spark.padded_samples": str(p), "safetensors_spark.format_version": "1",
                "safetensors_spark.write_id": WRITE_ID}
        if ragged_names:
            meta["safetensors_spark.ragged"] = json.dumps(ragged_names)
        name = shard_name(k)
        save_file(tensors, os.path.join(path, name), metadata=meta)
        shards.append({"shard_path": name, "samples_count": n, "bytes": os.path.getsize(os.path.join(path, name)),
                       "partition": k, "padded_samples": p, "num_tensors": len(tensors)})
        offset += n
    schema = {}
    for c, spec in columns.items():
        if spec[0] == "ragged":
            inner = list(np.asarray(spec[2][0]).shape[1:]) if spec[2] else []
            schema[c] = {"dtype": spec[1], "shape": None,
                         "ragged": {"inner_shape": inner, "element": spec[3]}}
        else:
            schema[c] = {"dtype": spec[1], "shape": [batch_size, *np.asarray(spec[2]).shape[1:]]}
    manifest = _manifest(shards, schema)
    manifest.update(format="safetensors-spark-dataset", created_by="tests", manifest_version=1,
                    layout="batch", batch_size=batch_size, tail_strategy="pad" if any(padded) else "write",
                    kv_separator=None, padded_samples=sum(padded), dropped_samples=0)
    write_manifest(path, manifest)
    return manifest


def write_kv_dataset(path, shard_keys, *, published_only=False, separator="__", metadata=True):
    """KV layout: key k gets emb = [len(k), hash] (F32, shape [2]) and label = index (I32)."""
    os.makedirs(path, exist_ok=True)
    shards, i = [], 0
    values = {}
    for k, keys in enumerate(shard_keys):
        tensors = {}
        for key in keys:
            emb = np.array([len(key), i], np.float32)
            label = np.array(i, np.int32)
            tensors[f"{key}{separator}emb"] = emb
            tensors[f"{key}{separator}label"] = label
            values[key] = {"emb": emb, "label": label}
            i += 1
        meta = {"safetensors_spark.layout": "kv", "safetensors_spark.samples": str(len(keys)),
                "safetensors_spark.padded_samples": "0", "safetensors_spark.kv_separator": separator} \
            if metadata else None
        name = shard_name(k)
        save_file(tensors, os.path.join(path, name), metadata=meta)
        entry = {"shard_path": name, "samples_count": len(keys), "bytes": os.path.getsize(os.path.join(path, name))}
        if not published_only:
            entry.update(partition=k, padded_samples=0, num_tensors=len(tensors))
        shards.append(entry)
    schema = {"emb": {"dtype": "F32", "shape": [2]}, "label": {"dtype": "I32", "shape": []}}
    manifest = _manifest(shards, schema)
    if not published_only:
        manifest.update(format="safetensors-spark-dataset", created_by="tests", manifest_version=1,
                        layout="kv", batch_size=None, tail_strategy=None, kv_separator=separator,
                        padded_samples=0, dropped_samples=0)
    write_manifest(path, manifest)
    return values


def write_index(path, row_group_size=None):
    """``_tensor_index.parquet/<shard stem>.parquet``: one part per shard, from its header, rows
    sorted by tensor_key (spec/dataset.md §6.1), as the engine writes it (in row groups of
    ``row_group_size`` rows when given). Returns all rows."""
    import pyarrow as pa
    import pyarrow.compute  # noqa: F401 (pa.compute)
    import pyarrow.parquet as pq

    manifest = read_manifest(path)
    rows = {c: [] for c in ("tensor_key", "file_name", "dtype", "shape", "data_start", "data_end",
                            "sample_key", "column")}
    for s in manifest["shards"]:
        file = os.path.join(path, s["shard_path"])
        with open(file, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(n))
        for name, info in header.items():
            if name == "__metadata__":
                continue
            key, column = name.rsplit("__", 1)
            rows["tensor_key"].append(name)
            rows["file_name"].append(s["shard_path"])
            rows["dtype"].append(info["dtype"])
            rows["shape"].append(info["shape"])
            rows["data_start"].append(8 + n + info["data_offsets"][0])
            rows["data_end"].append(8 + n + info["data_offsets"][1])
            rows["sample_key"].append(key)
            rows["column"].append(column)
    table = pa.table({**rows, "shape": pa.array(rows["shape"], pa.list_(pa.int64()))})
    os.makedirs(os.path.join(path, "_tensor_index.parquet"), exist_ok=True)
    for s in manifest["shards"]:
        part = table.filter(pa.compute.equal(table["file_name"], s["shard_path"])).sort_by("tensor_key")
        stem = s["shard_path"][: -len(".safetensors")]
        pq.write_table(part, os.path.join(path, "_tensor_index.parquet", stem + ".parquet"),
                       row_group_size=row_group_size)
    return table


def _numpy_dtype(name):
    if name == "BF16":
        import ml_dtypes

        return ml_dtypes.bfloat16
    return {"F32": np.float32, "F64": np.float64, "I32": np.int32, "I64": np.int64, "U8": np.uint8,
            "U16": np.uint16, "I16": np.int16, "F16": np.float16, "BOOL": np.bool_}[name]


def _manifest(shards, schema):
    return {"format_version": "1.0", "safetensors_version": "1.0",
            "total_samples": sum(s["samples_count"] for s in shards),
            "total_bytes": sum(s["bytes"] for s in shards), "shards": shards, "schema": schema}


def read_manifest(path):
    with open(os.path.join(path, "dataset_manifest.json")) as f:
        return json.load(f)


def write_manifest(path, manifest):
    with open(os.path.join(path, "dataset_manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)


def random_name():
    return uuid.uuid4().hex


def pack_reference(documents, seq_len, eos):
    """Brute force of spec/python.md §3.3: ``documents`` = ``(document id, token list)`` in stream
    order, each followed by ``eos`` (when not None), one stream cut into blocks of ``seq_len``; per
    block the pieces walked token by token. Returns the blocks (tokens, position_ids,
    document_ids, cu_seqlens as lists) and the dropped token count."""
    stream, owner = [], []
    for d, tokens in documents:
        toks = list(tokens) + ([eos] if eos is not None else [])
        stream += toks
        owner += [d] * len(toks)
    blocks = []
    for b in range(len(stream) // seq_len):
        toks, docs = stream[b * seq_len: (b + 1) * seq_len], owner[b * seq_len: (b + 1) * seq_len]
        pos, cu = [], [0]
        for i, d in enumerate(docs):
            new = i == 0 or d != docs[i - 1]
            if new and i:
                cu.append(i)
            pos.append(0 if new else pos[-1] + 1)
        blocks.append({"tokens": toks, "position_ids": pos, "document_ids": docs, "cu_seqlens": cu + [seq_len]})
    return blocks, len(stream) - len(blocks) * seq_len


def as_blocks(batches, seq_len):
    """Batches of packed blocks → per-block dicts (cu_seqlens cut back into blocks)."""
    out = []
    for b in batches:
        cu = b["cu_seqlens"].tolist()
        for i in range(len(b["tokens"])):
            lo, hi = i * seq_len, (i + 1) * seq_len
            out.append({"tokens": b["tokens"][i].tolist(), "position_ids": b["position_ids"][i].tolist(),
                        "document_ids": b["document_ids"][i].tolist(),
                        "cu_seqlens": [c - lo for c in cu if lo <= c <= hi]})
    return out


def stateful_resumed(make_dataset, stop_after, *, num_workers, snapshot_every):
    """torchdata's StatefulDataLoader over ``make_dataset()`` stopped after ``stop_after``
    batches: ``(the batches taken, its state_dict(), a new StatefulDataLoader over a fresh
    dataset that has loaded that state)``."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    def new():
        return StatefulDataLoader(make_dataset(), batch_size=None, num_workers=num_workers,
                                  snapshot_every_n_steps=snapshot_every)

    dl, head = new(), []
    for batch in dl:
        head.append(batch)
        if len(head) == stop_after:
            break
    state = dl.state_dict()
    same = new()
    same.load_state_dict(state)
    return head, state, same


def _commit_full_entry(path, manifest):
    """Writes ``manifest`` as the dataset's manifest and as its version's log entry in the
    whole-manifest form of logs written before log format 2 (still read, spec/dataset.md §5.10)."""
    import time

    manifest["committed_at_ms"] = int(time.time() * 1000)
    write_manifest(path, manifest)
    log = os.path.join(path, "_manifest_log")
    os.makedirs(log, exist_ok=True)
    with open(os.path.join(log, f"{manifest['manifest_version']:020d}.json"), "w") as f:
        json.dump(manifest, f, indent=1)


def start_log(path):
    """Gives a :func:`write_batch_dataset` dataset its version 1 in ``_manifest_log/``."""
    m = read_manifest(path)
    m.update(manifest_version=1, operation="create")
    _commit_full_entry(path, m)


def append_shard(path, n, width=2):
    """Appends one shard of ``n`` samples (ids continuing the dataset's, columns as
    :func:`write_batch_dataset` writes them) as a new version; returns the new ids."""
    m = read_manifest(path)
    offset = m["total_samples"]
    ids = np.arange(offset, offset + n)
    tensors = {"x": np.stack([ids * 10**j for j in range(width)], axis=1).astype(np.float32),
               "y": ids.astype(np.int64)}
    k = len(m["shards"])
    name = shard_name(k, m["manifest_version"])
    meta = {"safetensors_spark.layout": "batch", "safetensors_spark.samples": str(n),
            "safetensors_spark.padded_samples": "0"}
    save_file(tensors, os.path.join(path, name), metadata=meta)
    m["shards"].append({"shard_path": name, "samples_count": n, "bytes": os.path.getsize(os.path.join(path, name)),
                        "partition": k, "padded_samples": 0, "num_tensors": 2})
    m["shards"].sort(key=lambda s: s["shard_path"])
    m["total_samples"] += n
    m["total_bytes"] = sum(s["bytes"] for s in m["shards"])
    m.update(manifest_version=m["manifest_version"] + 1, operation="append")
    _commit_full_entry(path, m)
    return ids.tolist()
