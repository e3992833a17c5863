"""Token data: a Spark DataFrame of tokenized documents → one shuffled epoch of packed blocks.

Issue 25 item 6. Run it through jvm-connector/bench/tokens.sh, which prepares the venvs. The
same three roles as epoch.py, whose helpers (process-tree memory sampler, page-cache read floor,
machine description) it reuses:

* ``run`` (default; the project's venv): the orchestrator. One conversion process per group of
  paths, then per path the page-cache read rate of its own bytes, then the epochs (one fresh
  process per epoch, paths in rotating order, ``--reps`` rounds) with the peak memory of each
  epoch's process tree; prints the tables and the targets, writes the JSON file.
* ``convert --group G``: in the group's venv, starts a local Spark, generates the corpus (the
  same documents in every venv), caches it, and times the group's conversions (an untimed
  warm-up on 1/20 of the documents first; then ``--reps`` rounds in rotating order, each after a
  ``sync()``); keeps the last round's outputs and prints JSON.
* ``epoch --path P``: in the path's venv, builds the path's loader over the kept output and runs
  one shuffled epoch of packed blocks (documents in shuffled order, each followed by EOS, cut
  into SEQ_LEN-token blocks, batches of BLOCKS blocks, 2 DataLoader workers) as the tool's users
  write it; the step reads every token of every batch (a sum and an EOS count, which the
  orchestrator checks against the corpus); prints JSON.

``ours`` (the ragged batch write + the packing loader, issue 25 items 1 and 5) is isolated in
``OURS_WRITE_OPTIONS``, ``ours_open`` and ``ours_loader`` below; where this tree cannot write or
pack ragged columns yet, the run says why and measures the others (it never makes up a number).
What every number means: spec/performance.md §12.
"""
import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import epoch as E  # noqa: E402 - the epoch benchmark's helpers (stdlib-only at import)

# ------------------------------------------------------------------------------------------
# The corpus (stated in spec/performance.md §12.2; change both together)
DOCS = 250_000
SEED = 25  # mixed into every hash below
MEDIAN_LEN = 400  # tokens
SIGMA = 1.0  # of ln(length)
MAX_LEN = 32_768
VOCAB = 50_257  # GPT-2's; ids 0 … 50255 are document tokens
EOS = 50_256
SEQ_LEN = 2048  # tokens per packed block
BLOCKS = 8  # blocks per batch
WORKERS = 2
SHARD_DOCS = 16_384  # ours: batch_size (documents per shard), ≈ 43 MB of tokens per shard
HF_MAP_BATCH = 1000  # datasets.map's default batch_size: group_texts drops each batch's remainder

PATHS = {
    "ours": ("main", "ragged batch write (option ragged=tokens) + SafetensorsIterableDataset packing option + loader()"),
    "ours_kv": ("main", "KV write (name_col=key, one tensor per document) + SafetensorsIterableDataset(batch_size=None) per document + numpy packing in the workers"),
    "parquet": ("main", "df.write.parquet (list<int32>, snappy) + pyarrow row groups in an IterableDataset + numpy packing"),
    "streaming": ("streaming", "dataframe_to_mds (tokens as ndarray:int32) + StreamingDataset + llm-foundry ConcatTokensDataset-style packing"),
    "hf": ("hf", "Dataset.from_spark + shuffle + map(group_texts, batched, num_proc=2) + DataLoader(shuffle=True)"),
}
GROUPS = {"main": ["ours", "ours_kv", "parquet", "noop"], "streaming": ["streaming"], "hf": ["hf"]}
OTHERS = ("parquet", "streaming", "hf")

# Targets (issue 25 item 6)
EPOCH_VS_BEST_OTHER = 5.0
EPOCH_VS_FLOOR = 0.5

def log(msg):
    print(f"[tokens-bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _mix(h):
    import numpy as np

    h = h ^ (h >> np.uint64(31))
    h = h * np.uint64(0x94D049BB133111EB)
    h = h ^ (h >> np.uint64(29))
    h = h * np.uint64(0xBF58476D1CE4E5B9)
    return h ^ (h >> np.uint64(32))


def doc_lengths(ids):
    """Length of each document id (int64 numpy array): log-normal with median MEDIAN_LEN and
    sigma SIGMA of ln(length), by Box–Muller from two 53-bit uniforms that are integer hashes of
    (SEED, id), floored and clipped to [1, MAX_LEN]. The transcendental functions are Python's
    ``math`` (the C library's), not numpy's, so every venv's numpy gives the same lengths."""
    import numpy as np

    u = ids.astype(np.uint64) * np.uint64(2) + np.uint64(SEED << 40)
    with np.errstate(over="ignore"):
        a = (_mix(u) >> np.uint64(11)).tolist()
        b = (_mix(u + np.uint64(1)) >> np.uint64(11)).tolist()
    mu, two53 = math.log(MEDIAN_LEN), float(1 << 53)
    out = [min(MAX_LEN, max(1, int(math.exp(mu + SIGMA * math.sqrt(-2.0 * math.log((x + 1) / two53))
                                              * math.cos(2.0 * math.pi * (y / two53))))))
           for x, y in zip(a, b)]
    return np.array(out, dtype=np.int64)


def doc_tokens(ids, lengths):
    """(values int32, offsets int64) of these documents: token j of document d is an integer
    hash of (SEED, d, j) modulo EOS, so no document token equals EOS."""
    import numpy as np

    offsets = np.zeros(len(ids) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    total = int(offsets[-1])
    doc = np.repeat(ids.astype(np.uint64), lengths)
    pos = np.arange(total, dtype=np.uint64) - np.repeat(offsets[:-1].astype(np.uint64), lengths)
    with np.errstate(over="ignore"):
        h = _mix(doc * np.uint64(0x9E3779B97F4A7C15) + pos * np.uint64(0xD1B54A32D192ED03) + np.uint64(SEED))
    return (h % np.uint64(EOS)).astype(np.int32), offsets


def gen_batch(ids):
    import numpy as np
    import pyarrow as pa

    lengths = doc_lengths(ids)
    values, offsets = doc_tokens(ids, lengths)
    tokens = pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(values))
    key = pa.array([f"d{i}" for i in ids.tolist()], type=pa.string())
    return pa.RecordBatch.from_arrays([pa.array(ids, type=pa.int64()), key, tokens], names=["doc_id", "key", "tokens"])


def make_df(spark, docs, partitions):
    """The corpus as a Spark DataFrame: spark.range(docs) in ``partitions`` partitions →
    mapInArrow(gen_batch): doc_id bigint, key string ("d<id>", for the KV write), tokens
    array<int>; cached and counted (not timed)."""

    def gen(batches):
        for b in batches:
            yield gen_batch(b.column(0).to_numpy())

    df = spark.range(0, docs, 1, partitions).mapInArrow(gen, "doc_id bigint, key string, tokens array<int>")
    df.cache()
    n = df.count()
    assert n == docs, (n, docs)
    return df


def corpus_stats(docs):
    """What a full epoch holds: documents, tokens (without EOS), the sum of the token ids, the
    longest document, length quantiles."""
    import numpy as np

    tokens = total = 0
    lens = []
    for lo in range(0, docs, 20_000):
        ids = np.arange(lo, min(docs, lo + 20_000), dtype=np.int64)
        ln = doc_lengths(ids)
        v, _ = doc_tokens(ids, ln)
        tokens += int(ln.sum())
        total += int(v.sum(dtype=np.int64))
        lens.append(ln)
    ln = np.concatenate(lens)
    q = {f"p{p}": int(np.percentile(ln, p)) for p in (1, 10, 50, 90, 99)}
    return {"docs": docs, "tokens": tokens, "token_sum": total, "max_len": int(ln.max()), "mean_len": float(ln.mean()),
            "clipped_at_max": int((ln == MAX_LEN).sum()), "quantiles": q}


def build_spark(args, app):
    return E.build_spark(args, app)


def safetensors_header_bytes(location):
    """Bytes of every shard's header (the 8-byte length + the JSON header)."""
    import struct

    total = 0
    for f in sorted(Path(location).rglob("*.safetensors")):
        with open(f, "rb") as fh:
            total += 8 + struct.unpack("<Q", fh.read(8))[0]
    return total


# ==========================================================================================
# ours: the ONE place to adapt once the ragged writer and the packing loader are merged.
# Written against spec (design-wave3.md): option `ragged` names the array columns stored as
# values + offsets; the packing option of the Python loader takes seq_len and eos.

OURS_WRITE_OPTIONS = {"ragged": "tokens", "batch_size": str(SHARD_DOCS)}


def ours_open(location):
    """Opens the written dataset as the loader will (manifest + every header checked)."""
    from safetensors_spark import open_dataset

    ds = open_dataset(location)
    if len(ds) == 0:
        raise RuntimeError("empty dataset")
    return {"location": location, "samples": len(ds)}


def ours_loader(kept):
    """The packing loader (spec/python.md §3.3): per (seed, epoch) a permutation of all documents,
    each followed by EOS, cut into SEQ_LEN blocks; batches of BLOCKS blocks; loader() with 2
    workers. As a user who wants speed sets it: each batch carries the tokens, int32
    position_ids (RoPE positions restarting at every document) and cu_seqlens (flash-attn
    varlen), not document_ids — still more than the other paths, which hand over tokens only."""
    from safetensors_spark.torch import Packing, SafetensorsIterableDataset, loader

    ds = SafetensorsIterableDataset(kept["location"], batch_size=BLOCKS, shuffle=True, seed=0,
                                    pack=Packing("tokens", SEQ_LEN, eos=EOS, ids=("position_ids",),
                                                 ids_dtype="int32"))
    return loader(ds, num_workers=WORKERS)


# ==========================================================================================
# Conversions (role `convert`)


def conversions(group, df):
    """name -> function(out path) -> kept info, for the group's timed conversions."""
    cols = df.select("tokens")
    if group == "main":

        def ours(p):
            w = cols.write.format("safetensors")
            for k, v in OURS_WRITE_OPTIONS.items():
                w = w.option(k, v)
            w.save(p)
            return ours_open(p)

        def ours_kv(p):
            df.select("key", "tokens").write.format("safetensors").option("name_col", "key").save(p)
            from safetensors_spark import open_dataset

            return {"location": p, "samples": len(open_dataset(p))}

        def parquet(p):
            cols.write.option("compression", "snappy").parquet(p)
            return {"location": p}

        def noop(p):
            cols.write.format("noop").mode("overwrite").save()
            return {}

        return {"ours": ours, "ours_kv": ours_kv, "parquet": parquet, "noop": noop}
    if group == "streaming":
        from streaming.base.converters import dataframe_to_mds

        def streaming(p):
            dataframe_to_mds(cols, merge_index=True, mds_kwargs={"out": p, "columns": {"tokens": "ndarray:int32"}})
            return {"location": p}

        return {"streaming": streaming}
    if group == "hf":
        from datasets import Dataset

        def hf(p):
            ds = Dataset.from_spark(cols, cache_dir=p)
            return {"location": p, "files": [f["filename"] for f in ds.cache_files], "samples": len(ds)}

        return {"hf": hf}
    raise ValueError(f"unknown group {group}")


def role_convert(args):
    import numpy as np  # noqa: F401 - imported before any timing

    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    spark = build_spark(args, f"tokens-bench-convert-{args.group}")
    spark.sparkContext.setLogLevel("ERROR")
    out = {"group": args.group, "times": {}, "bytes": {}, "header_bytes": {}, "kept": {}, "warmup_s": {}, "failed": {}}
    try:
        t0 = time.perf_counter()
        small = make_df(spark, max(1000, args.docs // 20), args.partitions)
        fns = conversions(args.group, small)
        for name, fn in list(fns.items()):
            w0 = time.perf_counter()
            loc = work / f"warmup-{name}"
            try:
                fn(str(loc))
            except Exception as e:  # noqa: BLE001 - a path this tree cannot run: say why, go on
                out["failed"][name] = E.first_line(f"{type(e).__name__}: {e}")
                log(f"{args.group}: {name} cannot run here: {out['failed'][name]}")
            out["warmup_s"][name] = time.perf_counter() - w0
            shutil.rmtree(loc, ignore_errors=True)
        small.unpersist()
        df = make_df(spark, args.docs, args.partitions)
        out["generate_s"] = time.perf_counter() - t0
        log(f"{args.group}: {args.docs} documents generated and cached ({out['generate_s']:.1f} s with warm-up)")
        fns = {k: v for k, v in conversions(args.group, df).items() if k not in out["failed"]}
        names = list(fns)
        for rep in range(args.reps):
            order = names[rep % len(names):] + names[: rep % len(names)] if names else []
            for name in order:
                loc = work / f"{name}-r{rep}"
                os.sync()
                t1 = time.perf_counter()
                info = fns[name](str(loc))
                out["times"].setdefault(name, []).append(time.perf_counter() - t1)
                if loc.exists():
                    out["bytes"][name] = E.dir_bytes(loc)
                    if name.startswith("ours"):
                        out["header_bytes"][name] = safetensors_header_bytes(loc)
                if rep == args.reps - 1:
                    out["kept"][name] = info
                else:
                    shutil.rmtree(loc, ignore_errors=True)
                log(f"{args.group} rep {rep + 1}/{args.reps} {name}: {out['times'][name][-1]:.3f} s")
    finally:
        spark.stop()
    print(json.dumps(out))


# ==========================================================================================
# Epochs (role `epoch`). Each loader yields {"tokens": [BLOCKS, SEQ_LEN] integer tensor}.


class NumpyPacker:
    """Packs a stream of documents into SEQ_LEN blocks with numpy, as a performance-minded user
    writes it: documents come in chunks (values + lengths), EOS is inserted after each, the
    remainder is carried to the next chunk, full blocks leave in batches of BLOCKS."""

    def __init__(self):
        import numpy as np

        self.np = np
        self.carry = np.empty(0, dtype=np.int32)
        self.blocks = []

    def add(self, values, lengths):
        np = self.np
        ends = np.cumsum(lengths)
        stream = np.insert(values.astype(np.int32, copy=False), ends, np.int32(EOS))
        if len(self.carry):
            stream = np.concatenate([self.carry, stream])
        n = len(stream) // SEQ_LEN
        self.carry = stream[n * SEQ_LEN:].copy()
        if n:
            self.blocks.append(stream[: n * SEQ_LEN].reshape(n, SEQ_LEN))
        return self._batches(final=False)

    def _batches(self, final):
        np = self.np
        import torch

        have = sum(len(b) for b in self.blocks)
        if have < BLOCKS and not final:
            return
        allb = np.concatenate(self.blocks) if len(self.blocks) > 1 else self.blocks[0] if self.blocks else None
        self.blocks = []
        if allb is None:
            return
        k = len(allb) // BLOCKS * BLOCKS
        for lo in range(0, k, BLOCKS):
            yield {"tokens": torch.from_numpy(np.ascontiguousarray(allb[lo: lo + BLOCKS]))}
        if k < len(allb):
            if final:  # the last, shorter batch of whole blocks
                yield {"tokens": torch.from_numpy(np.ascontiguousarray(allb[k:]))}
            else:
                self.blocks = [allb[k:]]

    def finish(self):
        return self._batches(final=True)


class ParquetTokens:
    """An IterableDataset over Spark's Parquet part files with pyarrow: each epoch the row
    groups are permuted (seeded) and dealt to the workers; a row group's documents are permuted
    and packed with numpy (each worker packs its own stream; its last partial block is dropped)."""

    def __init__(self, path, seed=0):
        import pyarrow.parquet as pq

        files = [str(f) for f in sorted(Path(path).glob("*.parquet"))]
        self.groups = [(f, g) for f in files for g in range(pq.ParquetFile(f).num_row_groups)]
        self.seed = seed

    def __iter__(self):
        import numpy as np
        import pyarrow.parquet as pq
        import torch

        info = torch.utils.data.get_worker_info()
        wid, nw = (info.id, info.num_workers) if info else (0, 1)
        order = np.random.default_rng(self.seed).permutation(len(self.groups))
        packer = NumpyPacker()
        for k in order[wid::nw].tolist():
            f, g = self.groups[k]
            col = pq.ParquetFile(f).read_row_group(g, columns=["tokens"]).column("tokens").combine_chunks()
            perm = np.random.default_rng([self.seed, k]).permutation(len(col))
            for lo in range(0, len(col), 4096):
                part = col.take(perm[lo: lo + 4096])
                yield from packer.add(part.flatten().to_numpy(), part.value_lengths().to_numpy())
        yield from packer.finish()


def parquet_loader(kept):
    import torch

    class DS(ParquetTokens, torch.utils.data.IterableDataset):
        pass

    return torch.utils.data.DataLoader(DS(kept["location"]), batch_size=None, num_workers=WORKERS)


def ours_kv_loader(kept):
    """KV mode as it is today: one tensor per document, read one sample at a time in shuffled
    order by SafetensorsIterableDataset(batch_size=None), packed with numpy in each worker."""
    import numpy as np
    import torch
    from safetensors_spark.torch import SafetensorsIterableDataset

    class Packed(torch.utils.data.IterableDataset):
        def __init__(self):
            self.docs = SafetensorsIterableDataset(kept["location"], columns=["tokens"], batch_size=None, shuffle=True, seed=0)

        def __iter__(self):
            packer = NumpyPacker()
            chunk = []
            for s in self.docs:
                chunk.append(s["tokens"].numpy())
                if len(chunk) == 256:
                    yield from packer.add(np.concatenate(chunk), np.array([len(c) for c in chunk]))
                    chunk = []
            if chunk:
                yield from packer.add(np.concatenate(chunk), np.array([len(c) for c in chunk]))
            yield from packer.finish()

    return torch.utils.data.DataLoader(Packed(), batch_size=None, num_workers=WORKERS)


def streaming_loader(kept):
    """MosaicML Streaming as its users pack: StreamingDataset(shuffle=True) read sample by
    sample, concatenated into a Python list buffer with EOS and cut into blocks exactly as
    llm-foundry's ConcatTokensDataset does (``buffer = buffer + ids + eos``; while the buffer
    holds a block: yield its first SEQ_LEN tokens, keep the rest); DataLoader stacks BLOCKS."""
    import numpy as np
    import torch
    from streaming import StreamingDataset

    try:
        from streaming.base.util import clean_stale_shared_memory

        clean_stale_shared_memory()
    except Exception:  # noqa: BLE001 - best effort
        pass
    sds = StreamingDataset(local=kept["location"], shuffle=True, shuffle_seed=0, batch_size=BLOCKS)

    class Concat(torch.utils.data.IterableDataset):
        def __iter__(self):
            buffer = []
            for sample in sds:
                buffer = buffer + sample["tokens"].tolist() + [EOS]
                while len(buffer) >= SEQ_LEN:
                    block = buffer[:SEQ_LEN]
                    buffer = buffer[SEQ_LEN:]
                    yield {"tokens": np.asarray(block, dtype=np.int32)}

    return torch.utils.data.DataLoader(Concat(), batch_size=BLOCKS, num_workers=WORKERS)


def hf_loader(kept, tmp):
    """HF datasets as run_clm.py users write it: the from_spark Arrow files, documents shuffled
    (seeded; the indices kept in memory, so no epoch reuses another's cached indices file),
    ``map(group_texts, batched=True, num_proc=2)`` concatenating each map batch's
    documents (each + EOS) and cutting SEQ_LEN blocks (a map batch's remainder is dropped), then
    ``with_format("torch")`` and a DataLoader(shuffle=True). Returns (loader, map seconds)."""
    from itertools import chain

    import torch
    from datasets import Dataset, concatenate_datasets, disable_progress_bars

    disable_progress_bars()
    parts = [Dataset.from_file(f) for f in kept["files"]]
    ds = parts[0] if len(parts) == 1 else concatenate_datasets(parts)

    def group_texts(examples):
        concatenated = list(chain.from_iterable(ids + [EOS] for ids in examples["tokens"]))
        total = len(concatenated) // SEQ_LEN * SEQ_LEN
        return {"tokens": [concatenated[i: i + SEQ_LEN] for i in range(0, total, SEQ_LEN)]}

    t0 = time.perf_counter()
    packed = ds.shuffle(seed=0, keep_in_memory=True).map(group_texts, batched=True, batch_size=HF_MAP_BATCH, num_proc=WORKERS,
                                    remove_columns=ds.column_names, cache_file_name=str(Path(tmp) / "packed.arrow"))
    map_s = time.perf_counter() - t0
    packed = packed.with_format("torch")
    return torch.utils.data.DataLoader(packed, batch_size=BLOCKS, shuffle=True, num_workers=WORKERS,
                                       generator=torch.Generator().manual_seed(0)), map_s


def role_epoch(args):
    import warnings

    import torch

    warnings.simplefilter("ignore")  # read-only buffers, loaders' deprecations
    kept = json.loads(args.kept)
    torch.set_num_threads(1)  # the step runs in the training process; workers read and pack
    tmp = tempfile.mkdtemp(prefix="tokens-epoch-", dir=args.workdir)
    res = {"path": args.path}
    # the tool's modules are imported before the clock starts: an import is not part of an epoch
    # (MosaicML Streaming's takes seconds: it imports its cloud clients)
    for m in {"ours": ["safetensors_spark.torch"], "ours_kv": ["safetensors_spark.torch"], "parquet": ["pyarrow.parquet"],
              "streaming": ["streaming"], "hf": ["datasets"]}[args.path]:
        __import__(m)
    try:
        t0 = time.perf_counter()
        if args.path == "hf":
            dl, res["map_s"] = hf_loader(kept, tmp)
        else:
            dl = {"ours": ours_loader, "ours_kv": ours_kv_loader, "parquet": parquet_loader,
                  "streaming": streaming_loader}[args.path](kept)
        blocks = batches = token_sum = eos = 0
        first_batch_s = None
        for b in dl:
            t = b["tokens"]
            assert t.dim() == 2 and t.shape[1] == SEQ_LEN, tuple(t.shape)
            token_sum += int(t.sum(dtype=torch.int64))
            eos += int((t == EOS).sum())
            blocks += int(t.shape[0])
            batches += 1
            if first_batch_s is None:
                first_batch_s = time.perf_counter() - t0
        res.update({"epoch_s": time.perf_counter() - t0, "blocks": blocks, "batches": batches, "tokens": blocks * SEQ_LEN,
                    "token_sum": token_sum, "eos": eos, "first_batch_s": first_batch_s})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(res))


# ==========================================================================================
# The orchestrator (role `run`)


def drop_bound(path, docs):
    """The most tokens a path may leave out of an epoch: the last partial block of each stream
    it packs separately (ours: one global stream; a worker's stream for Parquet, Streaming and
    KV; a map batch for HF's group_texts)."""
    streams = {"ours": 1, "hf": math.ceil(docs / HF_MAP_BATCH)}.get(path, WORKERS)
    return streams * (SEQ_LEN - 1)


def check_epoch(path, r, stats):
    """Whether an epoch delivered the corpus: tokens delivered + dropped = tokens + EOS, with
    the dropped part within the path's bound, and the delivered sums consistent with it."""
    full = stats["tokens"] + stats["docs"]
    dropped = full - r["tokens"]
    full_sum = stats["token_sum"] + stats["docs"] * EOS
    ok = (0 <= dropped <= drop_bound(path, stats["docs"])
          and stats["docs"] - dropped <= r["eos"] <= stats["docs"]
          and 0 <= full_sum - r["token_sum"] <= dropped * EOS)
    return ok, dropped


def role_run(args):
    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="safetensors-tokens-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    log(f"outputs in {work}; {args.docs} documents; reps {args.reps}; paths {','.join(args.paths)}")
    machine = E.machine_info()
    for v in ("petastorm",):
        machine.pop(f"versions_{v}", None)
    t_start = time.perf_counter()
    stats = corpus_stats(args.docs)
    log(f"corpus: {stats['docs']} documents, {stats['tokens']:,} tokens (mean {stats['mean_len']:.0f}, "
        f"max {stats['max_len']}, quantiles {stats['quantiles']})")
    result = {"machine": machine, "params": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
              "corpus": dict(stats, median_len=MEDIAN_LEN, sigma=SIGMA, max_len_clip=MAX_LEN, seed=SEED, vocab=VOCAB, eos=EOS,
                             seq_len=SEQ_LEN, blocks_per_batch=BLOCKS),
              "paths": {p: {"what": PATHS[p][1]} for p in args.paths}, "targets": []}
    unavailable = {}
    for name in ("streaming", "hf"):
        reason_file = HERE / ".venv" / f"{name}.unavailable"
        if name in args.paths and (reason_file.exists() or not Path(E.venv_python(name)).exists()):
            unavailable[name] = reason_file.read_text().strip() if reason_file.exists() else "its venv was not created (run tokens.sh)"
    try:
        conv = {}
        for g in [g for g in GROUPS if any(p in args.paths for p in GROUPS[g])]:
            if g in unavailable:
                continue
            cmd = [E.venv_python(g), __file__, "convert", "--group", g, "--docs", str(args.docs), "--reps", str(args.reps),
                   "--workdir", str(work / g), "--jar", str(args.jar), "--cores", str(args.cores),
                   "--partitions", str(args.partitions), "--driver-memory", args.driver_memory]
            log(f"conversion group {g} …")
            res, err, _ = E.run_sub(cmd, args.convert_timeout)
            if err:
                for p in GROUPS[g]:
                    unavailable.setdefault(p, f"conversion failed: {err}")
                log(f"group {g}: {err}")
                continue
            conv[g] = res
            for p, why in res.get("failed", {}).items():
                unavailable.setdefault(p, f"cannot run in this tree: {why}")
        result["conversions"] = conv
        kept = {}
        for res in conv.values():
            kept.update(res["kept"])

        # the page-cache read rate of each path's own bytes (epoch.py's read_floor)
        floors = {}
        for p in args.paths:
            if p in kept and p not in unavailable:
                files = [f for f in E.data_files(kept[p]["location"]) if f.stat().st_size]
                nbytes, times = E.read_floor(files, 3)
                floors[p] = {"bytes": nbytes, "times": times, "median_s": E.median(times),
                             "gb_per_s": nbytes / E.median(times) / 1e9,
                             "tokens_per_s": (stats["tokens"] + stats["docs"]) / E.median(times)}
                log(f"read floor {p}: {nbytes / 2**20:.0f} MiB in {E.median(times):.3f} s ({floors[p]['gb_per_s']:.2f} GB/s)")
        result["read_floor"] = floors

        runnable = [p for p in args.paths if p in kept and p not in unavailable]
        for p in args.paths:
            if p not in runnable and p not in unavailable:
                unavailable[p] = "no converted output"
        epochs = {p: [] for p in runnable}
        for rep in range(args.reps):
            order = runnable[rep % len(runnable):] + runnable[: rep % len(runnable)] if runnable else []
            for p in order:
                if p in unavailable:
                    continue
                E.warm_page_cache(E.data_files(kept[p]["location"]))
                cmd = [E.venv_python(PATHS[p][0]), __file__, "epoch", "--path", p, "--kept", json.dumps(kept[p]),
                       "--workdir", str(work)]
                res, err, sampler = E.run_sub(cmd, args.epoch_timeout, sampler_pid_cb=True)
                if err:
                    unavailable[p] = f"epoch failed: {err}"
                    log(f"epoch {p}: {err}")
                    continue
                res["peak"] = dict(sampler.peak)
                res["data_ok"], res["dropped"] = check_epoch(p, res, stats)
                epochs[p].append(res)
                Path(args.out).write_text(json.dumps(dict(result, epochs=epochs, unavailable=unavailable), indent=1))
                log(f"epoch rep {rep + 1}/{args.reps} {p}: {res['epoch_s']:.3f} s, {res['tokens']:,} tokens, "
                    f"peak RSS {res['peak']['rss'] / 2**20:.0f} MiB over {res['peak']['procs']} processes, "
                    f"{'data ok' if res['data_ok'] else 'DATA MISMATCH'}")
        result["epochs"] = epochs
        result["unavailable"] = unavailable
        machine["loadavg_end"] = os.getloadavg()
        result["wall_s"] = time.perf_counter() - t_start
    finally:
        if not args.keep and not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    report(args, result)
    Path(args.out).write_text(json.dumps(result, indent=1))
    log(f"results written to {args.out} ({result['wall_s'] / 60:.1f} min)")


def short(reason, limit=100):
    """A reason cut for the tables (the JSON file keeps it whole)."""
    return reason if len(reason) <= limit else reason[: limit - 1] + "…"


def report(args, result):
    conv, epochs, unavailable = result.get("conversions", {}), result.get("epochs", {}), result["unavailable"]
    floors = result.get("read_floor", {})
    ctimes, cbytes, hbytes = {}, {}, {}
    for res in conv.values():
        ctimes.update({k: E.median(v) for k, v in res["times"].items()})
        cbytes.update(res["bytes"])
        hbytes.update(res.get("header_bytes", {}))
    summary = {}
    for p in args.paths:
        s = {"convert_s": ctimes.get(p), "convert_times": (conv.get(PATHS[p][0]) or {}).get("times", {}).get(p),
             "bytes": cbytes.get(p), "header_bytes": hbytes.get(p), "floor": floors.get(p)}
        runs = epochs.get(p) or []
        if runs:
            e = E.median([r["epoch_s"] for r in runs])
            s.update({"epoch_s": e, "epoch_times": [r["epoch_s"] for r in runs], "tokens": runs[0]["tokens"],
                      "tokens_per_s": runs[0]["tokens"] / e, "dropped": max(r["dropped"] for r in runs),
                      "first_batch_s": E.median([r["first_batch_s"] or 0 for r in runs]),
                      "cpu_s": E.median([r["cpu_s"] for r in runs]),
                      "peak_rss": max(r["peak"]["rss"] for r in runs), "peak_pss": max(r["peak"]["pss"] for r in runs),
                      "procs": max(r["peak"]["procs"] for r in runs), "data_ok": all(r["data_ok"] for r in runs)})
            if p == "hf":
                s["map_s"] = E.median([r["map_s"] for r in runs])
            if s["floor"]:
                s["of_floor"] = s["tokens_per_s"] / s["floor"]["tokens_per_s"]
        summary[p] = s
    result["summary"] = summary
    ours = summary.get("ours", {})
    rows = []
    for p in args.paths:
        s = summary[p]
        if "epoch_s" not in s:
            rows.append([p, E.fmt(s.get("convert_s")), "—", E.fmt((s.get("bytes") or 0) / 2**20, ".1f") if s.get("bytes") else "—",
                         "—", "—", "—", "—", "—", "—", "—", "—", "not measured: " + short(unavailable.get(p, "?"))])
            continue
        cr = s["convert_s"] / ours["convert_s"] if s.get("convert_s") and ours.get("convert_s") else None
        er = ours["tokens_per_s"] / s["tokens_per_s"] if ours.get("tokens_per_s") else None
        fl = s.get("floor") or {}
        rows.append([p, E.fmt(s.get("convert_s")), E.fmt(cr, ".2f"), E.fmt((s.get("bytes") or 0) / 2**20, ".1f"),
                     E.fmt(s["epoch_s"]) + (f" (map {s['map_s']:.1f})" if "map_s" in s else ""), E.fmt(s["first_batch_s"]),
                     E.fmt(s["tokens_per_s"] / 1e6, ".2f"), E.fmt(er, ".2f"),
                     E.fmt(fl.get("tokens_per_s", 0) / 1e6, ".0f"), E.fmt(s.get("of_floor", 0) * 100, ".1f"),
                     E.fmt(s["peak_rss"] / 2**20, ".0f") + f" / {s['peak_pss'] / 2**20:.0f} ({s['procs']})",
                     E.fmt(s["cpu_s"], ".1f"),
                     ("data ok" if s["data_ok"] else "DATA MISMATCH") + f", {s['dropped']:,} dropped"])
    c = result["corpus"]
    E.print_table(f"{c['docs']:,} documents, {c['tokens']:,} tokens → one shuffled epoch of {SEQ_LEN}-token blocks "
                  f"(batches of {BLOCKS}, {WORKERS} workers), medians of {args.reps}",
                  ["path", "convert s", "÷ ours", "on disk MiB", "epoch s", "1st batch s", "Mtokens/s", "ours ×",
                   "floor Mtok/s", "% floor", "peak RSS / PSS MiB (procs)", "CPU s", "data"], rows)
    if "noop" in ctimes:
        print(f"\nnoop (Spark producing the tokens column, nothing written): {ctimes['noop']:.3f} s")
    k, r = summary.get("ours_kv", {}), summary.get("ours", {})
    print_kv = [[name, E.fmt(s.get("convert_s")), E.fmt((s.get("header_bytes") or 0) / 2**20, ".2f") if s.get("header_bytes") else "—",
                 E.fmt((s.get("bytes") or 0) / 2**20, ".1f") if s.get("bytes") else "—", E.fmt(s.get("epoch_s")),
                 E.fmt((s.get("tokens_per_s") or 0) / 1e6, ".2f") if s.get("tokens_per_s") else "—",
                 "" if s.get("epoch_s") else short(unavailable.get(key, ""))]
                for name, key, s in (("ours (ragged batch)", "ours", r), ("ours_kv (KV)", "ours_kv", k))]
    E.print_table("KV mode against ragged batch mode, same corpus", ["layout", "write s", "header MiB", "on disk MiB", "epoch s",
                                                                    "Mtokens/s", "note"], print_kv)

    targets = result["targets"]
    others = {p: summary[p] for p in OTHERS if summary.get(p, {}).get("tokens_per_s")}
    if ours.get("tokens_per_s") and others:
        best = max(others, key=lambda p: others[p]["tokens_per_s"])
        x = ours["tokens_per_s"] / others[best]["tokens_per_s"]
        targets.append({"target": f"ours epoch tokens/s ≥ {EPOCH_VS_BEST_OTHER}× the best other ({best})", "observed": x,
                        "result": E.mark(x >= EPOCH_VS_BEST_OTHER)})
    if ours.get("of_floor") is not None:
        targets.append({"target": f"ours epoch tokens/s ≥ {EPOCH_VS_FLOOR:.0%} of the page-cache read rate of its bytes",
                        "observed": ours["of_floor"], "result": E.mark(ours["of_floor"] >= EPOCH_VS_FLOOR)})
    conv_others = {p: ctimes[p] for p in OTHERS if ctimes.get(p)}
    if ctimes.get("ours") and conv_others:
        fastest = min(conv_others, key=conv_others.get)
        x = ctimes["ours"] / conv_others[fastest]
        targets.append({"target": f"ours conversion ≤ the fastest other ({fastest})", "observed": x, "result": E.mark(x <= 1.0)})
    if "ours" in unavailable:
        targets.append({"target": "every target above needs ours", "observed": None,
                        "result": "not measured: " + short(unavailable["ours"])})
    E.print_table("Targets", ["target", "observed", "result"], [[t["target"], E.fmt(t["observed"], ".3g"), t["result"]] for t in targets])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("role", nargs="?", default="run", choices=["run", "convert", "epoch"])
    ap.add_argument("--docs", type=int, default=DOCS, help=f"documents in the corpus (default {DOCS:,}; 20000 is a quick check)")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--paths", default=",".join(PATHS), help=f"comma-separated subset of {','.join(PATHS)}")
    ap.add_argument("--out", default="tokens-results.json")
    ap.add_argument("--workdir", default=None, help="where outputs go (default: a temp dir, removed at the end)")
    ap.add_argument("--keep", action="store_true", help="keep the outputs")
    ap.add_argument("--jar", default=None)
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--partitions", type=int, default=None)
    ap.add_argument("--driver-memory", default="4g")
    ap.add_argument("--convert-timeout", type=int, default=3600)
    ap.add_argument("--epoch-timeout", type=int, default=1800)
    ap.add_argument("--group", help=argparse.SUPPRESS)
    ap.add_argument("--path", help=argparse.SUPPRESS)
    ap.add_argument("--kept", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role == "epoch":
        return role_epoch(args)
    args.partitions = args.partitions or args.cores
    args.jar = E.connector_jar(args.jar)
    if args.role == "convert":
        return role_convert(args)
    E.require_jar(args.jar)
    E.run_paths(args, PATHS, role_run)


if __name__ == "__main__":
    main()
