"""Ragged columns in the Python package (spec/python.md §2, §3.2) and token packing (§3.3),
against references built in plain Python from the rows the hand-made datasets were written
with (handmade.write_ragged_dataset: the shard convention of spec/dataset.md §2.1)."""

import json
import os
import zlib

import numpy as np
import pytest
import torch

import handmade
from safetensors_spark import Ragged, ShardError, StateError, open_dataset
from safetensors_spark.torch import Packing, SafetensorsDataset, SafetensorsIterableDataset, loader

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create", "ignore:The PyTorch API of nested")

SIZES = [7, 5, 9, 3, 6]
N = sum(SIZES)
PADDED = [1, 0, 2, 0, 0]


def _rows(seed=0, n=N, longest=9, inner=()):
    rng = np.random.default_rng(seed)
    # lengths 0..longest (empty rows included); token ids encode (document, position)
    return [(1000 * i + np.arange(rng.integers(0, longest + 1))).reshape(-1, *([1] * len(inner)))
            * np.ones((1, *inner), np.int64) for i in range(n)]


TOKENS = _rows()
BOXES = _rows(seed=1, inner=(4,))  # rows of [k, 4]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("ragged") / "ds")
    handmade.write_ragged_dataset(path, SIZES, {
        "tokens": ("ragged", "I32", TOKENS, "array"),
        "boxes": ("ragged", "F32", BOXES, "array"),
        "y": ("fixed", "I64", np.arange(N)),
    }, padded=PADDED, batch_size=10)
    return path


def ids(batches):
    return [int(v) for b in batches for v in b["y"].tolist()]


def run(path, *, workers=0, stop=None, state=None, handoff=None, rank=0, world=1, **kw):
    ds = SafetensorsIterableDataset(path, rank=rank, world_size=world, **kw)
    if state is not None:
        ds.load_state_dict(state)
    out = []
    for b in loader(ds, num_workers=workers, handoff_batches=handoff):
        out.append(b)
        if stop is not None and len(out) == stop:
            break
    return out, ds


# -- numpy: open_dataset -------------------------------------------------------------------


def test_open_dataset_gives_each_row_and_the_shards_values_and_offsets(data):
    ds = open_dataset(data)
    assert ds.ragged == {"tokens": [], "boxes": [4]} and len(ds) == N
    for i in range(N):
        assert ds[i]["tokens"].tolist() == TOKENS[i].tolist()
        assert ds[i]["boxes"].shape == (len(BOXES[i]), 4) and np.array_equal(ds[i]["boxes"], BOXES[i])
    first = 0
    for (name, cols), n in zip(ds.iter_shards(["tokens", "y"]), SIZES):
        r = cols["tokens"]
        assert isinstance(r, Ragged) and len(r) == n and r.offsets[0] == 0  # pad rows are not rows
        assert [row.tolist() for row in r] == [t.tolist() for t in TOKENS[first: first + n]]
        assert r.lengths.tolist() == [len(t) for t in TOKENS[first: first + n]]
        first += n
    # the values are the mapped bytes (no copy)
    shard = ds.shards[0]
    mapped = np.frombuffer(ds._store.buffer(shard.name), np.uint8)
    assert np.shares_memory(ds.ragged_rows(shard, "tokens", 0, 3).values, mapped)


def test_published_only_manifest_takes_ragged_columns_from_the_shards_and_remote_reads(data, tmp_path):
    import shutil

    from test_python_package import upload

    path = str(tmp_path / "published")
    shutil.copytree(data, path)
    m = handmade.read_manifest(path)
    published = {k: m[k] for k in ("format_version", "safetensors_version", "total_samples", "total_bytes")}
    published["shards"] = [{k: s[k] for k in ("shard_path", "samples_count", "bytes")} for s in m["shards"]]
    published["schema"] = {c: {"dtype": t["dtype"], "shape": t["shape"]} for c, t in m["schema"].items()}
    handmade.write_manifest(path, published)
    ds = open_dataset(path)
    assert ds.layout == "batch" and ds.ragged == {"tokens": [], "boxes": [4]}
    assert [ds[i]["tokens"].tolist() for i in range(N)] == [t.tolist() for t in TOKENS]
    # remote (fsspec range reads): the same batches and blocks as local
    upload(data, "memory://ragged-remote")
    for kw in (dict(batch_size=4, shuffle=True, seed=2, ragged="padded", pad_value=-1),
               dict(batch_size=2, shuffle=True, seed=2, pack=Packing("tokens", seq_len=6, eos=1))):
        want = list(SafetensorsIterableDataset(data, **kw))
        got = list(SafetensorsIterableDataset("memory://ragged-remote", **kw))
        assert len(got) == len(want) and all(
            all(torch.equal(g[c], w[c]) for c in w) for g, w in zip(got, want))
    assert open_dataset("memory://ragged-remote")[5]["boxes"].tolist() == BOXES[5].tolist()


def _rewrite(path, shard, tensors, metadata):
    from safetensors.numpy import save_file

    file = os.path.join(path, shard)
    save_file(tensors, file, metadata=metadata)
    m = handmade.read_manifest(path)
    for s in m["shards"]:
        if s["shard_path"] == shard:
            m["total_bytes"] += os.path.getsize(file) - s["bytes"]
            s["bytes"] = os.path.getsize(file)
    handmade.write_manifest(path, m)


def test_bad_offsets_or_tensors_name_the_shard_column_and_row(tmp_path):
    from safetensors.numpy import load_file

    def fresh(name):
        path = str(tmp_path / name)
        handmade.write_ragged_dataset(path, [3, 2], {"tokens": ("ragged", "I32", TOKENS[:5], "array")})
        shard = handmade.shard_name(0)
        with open(os.path.join(path, shard), "rb") as f:
            meta = json.loads(f.read(int.from_bytes(f.read(8), "little")))["__metadata__"]
        return path, shard, load_file(os.path.join(path, shard)), meta

    path, shard, t, meta = fresh("decreasing")
    total = len(t["tokens"])
    assert total > 0
    o = np.array([0, total, 0, total], np.int64)  # row 1 runs backwards
    _rewrite(path, shard, {**t, "tokens.offsets": o}, meta)
    ds = open_dataset(path)  # the header is fine; the offsets are read when first used
    with pytest.raises(ShardError, match=r"part-00000.*row 1 of ragged column 'tokens' ends at"):
        ds[0]
    path, shard, t, meta = fresh("short")
    _rewrite(path, shard, {**t, "tokens.offsets": t["tokens.offsets"][:-1]}, meta)
    with pytest.raises(ShardError, match=r"part-00000.*'tokens.offsets' is I64 \[3\].*I64 \[4\]"):
        open_dataset(path)[0]  # the header is checked when the shard is first used
    path, shard, t, meta = fresh("missing")
    _rewrite(path, shard, {"tokens": t["tokens"]}, meta)
    m = handmade.read_manifest(path)
    m["shards"][0]["num_tensors"] = 1
    handmade.write_manifest(path, m)
    with pytest.raises(ShardError, match=r"no tensor 'tokens.offsets'"):
        open_dataset(path)[0]
    path, shard, t, meta = fresh("end")
    _rewrite(path, shard, {**t, "tokens": t["tokens"][:-1]}, meta)
    with pytest.raises(ShardError, match=r"'tokens.offsets' ends at \d+ but tensor 'tokens' holds"):
        open_dataset(path)[0]


# -- torch: forms ----------------------------------------------------------------------------


def _check_forms(batch, form, pad_value=-1):
    """Every row of ``batch`` against the written rows of its samples (column y = sample id)."""
    want_t = [TOKENS[i] for i in batch["y"].tolist()]
    want_b = [BOXES[i] for i in batch["y"].tolist()]
    if form == "offsets":
        for c, want in (("tokens", want_t), ("boxes", want_b)):
            v, o = batch[c], batch[f"{c}.offsets"].tolist()
            assert o[0] == 0 and len(o) == len(want) + 1 and o[-1] == len(v)
            assert [v[a:b].tolist() for a, b in zip(o[:-1], o[1:])] == [w.tolist() for w in want]
    elif form == "nested":
        for c, want in (("tokens", want_t), ("boxes", want_b)):
            assert batch[c].is_nested and f"{c}.offsets" not in batch
            assert [r.tolist() for r in batch[c].unbind()] == [w.tolist() for w in want]
    else:
        for c, want in (("tokens", want_t), ("boxes", want_b)):
            p, lengths = batch[c], batch[f"{c}.lengths"]
            longest = max(len(w) for w in want)
            assert p.shape[:2] == (len(want), longest) and lengths.tolist() == [len(w) for w in want]
            for row, w in zip(p, want):
                assert row[: len(w)].tolist() == w.tolist()
                assert (row[len(w):] == pad_value).all()


@pytest.mark.parametrize("form", ["offsets", "nested", "padded"])
def test_each_form_against_the_written_rows_in_process_and_in_workers(data, form):
    kw = dict(batch_size=4, shuffle=True, seed=2, ragged=form, pad_value=-1)
    base, _ = run(data, **kw)
    assert sorted(ids(base)) == list(range(N))
    for b in base:
        _check_forms(b, form)
    for workers, handoff in ((2, None), (2, 1), (3, 2)):
        got, _ = run(data, workers=workers, handoff=handoff, **kw)
        assert ids(got) == ids(base), f"{workers} workers, handoff {handoff}"
        for b in got:
            _check_forms(b, form)
    # unshuffled: batches that are runs of rows, inside a shard or across two
    for workers in (0, 2):
        got, _ = run(data, workers=workers, **dict(kw, shuffle=False))
        assert ids(got) == list(range(N))
        for b in got:
            _check_forms(b, form)


def test_default_form_is_values_and_offsets_zero_copy_for_one_run(data):
    ds = SafetensorsIterableDataset(data, columns=["tokens", "y"], batch_size=3)
    first = next(iter(ds))
    assert set(first) == {"tokens", "tokens.offsets", "y"}
    o = first["tokens.offsets"].tolist()
    assert [first["tokens"][a:b].tolist() for a, b in zip(o[:-1], o[1:])] == [t.tolist() for t in TOKENS[:3]]
    mapped = ds.dataset._store.buffer(ds.dataset.shards[0].name)
    assert np.shares_memory(first["tokens"].numpy(), np.frombuffer(mapped, np.uint8))
    # per column: one nested, the other padded
    mixed = next(iter(SafetensorsIterableDataset(data, batch_size=3, ragged={"tokens": "nested", "boxes": "padded"})))
    assert mixed["tokens"].is_nested and mixed["boxes.lengths"].tolist() == [len(b) for b in BOXES[:3]]
    with pytest.raises(ValueError, match=r"ragged must be one of \['offsets', 'nested', 'padded'\]"):
        SafetensorsIterableDataset(data, batch_size=3, ragged="jagged")
    with pytest.raises(ValueError, match="column 'y' is not a ragged column"):
        SafetensorsIterableDataset(data, batch_size=3, ragged={"y": "nested"})


def test_ragged_resume_and_equal_rank_counts(data):
    kw = dict(batch_size=3, shuffle=True, seed=5)
    full = ids(run(data, workers=2, **kw)[0])
    for k in (1, 4, 9):
        head, ds = run(data, workers=2, stop=k, **kw)
        state = ds.state_dict()
        for workers in (3, 0):
            tail, _ = run(data, workers=workers, state=state, **kw)
            assert ids(head) + ids(tail) == full, f"stop after {k}, resume with {workers} workers"
    per_rank = [ids(run(data, workers=2, rank=r, world=4, **kw)[0]) for r in range(4)]
    assert len({len(p) for p in per_rank}) == 1


def test_map_style_loader_and_getitem_with_ragged_columns(data):
    ds = SafetensorsDataset(data, ragged="padded", pad_value=-1)
    assert ds[4]["tokens"].tolist() == TOKENS[4].tolist()
    got = list(loader(ds, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(1), num_workers=2))
    assert sorted(ids(got)) == list(range(N))
    for b in got:
        _check_forms(b, "padded")
    samples = ds.__getitems__([3, 17, 4])
    assert [s["tokens"].tolist() for s in samples] == [TOKENS[i].tolist() for i in (3, 17, 4)]


# -- a user transform in the workers: decode -------------------------------------------------

IMAGES = [np.random.default_rng(i).integers(0, 255, (4, 4), dtype=np.uint8) for i in range(12)]


def decode(batch):
    """A decoder: each row is zlib-compressed 4x4 pixels; the batch becomes [B, 4, 4] uint8."""
    v, o = batch["img"].numpy(), batch["img.offsets"].tolist()
    pixels = [np.frombuffer(zlib.decompress(v[a:b].tobytes()), np.uint8).reshape(4, 4) for a, b in zip(o[:-1], o[1:])]
    return {"img": torch.from_numpy(np.stack(pixels)), "y": batch["y"]}


def test_transform_decodes_in_the_workers_and_keeps_the_pooled_handoff(tmp_path):
    path = str(tmp_path / "img")
    encoded = [np.frombuffer(zlib.compress(im.tobytes()), np.uint8) for im in IMAGES]
    assert len({len(e) for e in encoded}) > 1
    handmade.write_ragged_dataset(path, [5, 7], {"img": ("ragged", "U8", encoded, "binary"),
                                                 "y": ("fixed", "I64", np.arange(12))})
    ds = SafetensorsIterableDataset(path, batch_size=2, shuffle=True, seed=1, transform=decode)
    base = list(ds)
    for workers in (0, 2):
        got = list(loader(ds, num_workers=workers, handoff_batches=3))
        assert ids(got) == ids(base) and len(got) == 6
        for b in got:
            assert b["img"].shape == (2, 4, 4)
            assert all(np.array_equal(im, IMAGES[i]) for im, i in zip(b["img"].numpy(), b["y"].tolist()))
        if workers:
            # three batches per message, in one shared block
            ptrs = [b["img"].untyped_storage().data_ptr() for b in got]
            assert ptrs[0] == ptrs[1] == ptrs[2] and ptrs[3] == ptrs[4] == ptrs[5] and ptrs[0] != ptrs[3]
    with pytest.raises(TypeError, match="transform must return a dict"):
        next(iter(SafetensorsIterableDataset(path, batch_size=2, transform=lambda b: list(b))))


# -- packing --------------------------------------------------------------------------------


def reference_blocks(path, seq_len, eos, shuffle, seed, epoch):
    """Brute force: the documents in the epoch's global order (that of the unpacked dataset),
    concatenated in Python with eos, sliced into blocks; per block the pieces walked token by
    token."""
    plain = SafetensorsIterableDataset(path, columns=["y"], shuffle=shuffle, seed=seed)
    plain.set_epoch(epoch)
    order = [int(s["y"]) for s in plain]
    return handmade.pack_reference(((d, TOKENS[d].reshape(-1).tolist()) for d in order), seq_len, eos)


@pytest.mark.parametrize("seq_len,eos,shuffle", [(8, None, False), (8, 7, True), (5, -1, True), (1, None, True),
                                                 (40, 0, False)])
def test_packed_blocks_equal_the_brute_force_reference(data, seq_len, eos, shuffle):
    for epoch in (0, 1):
        want, dropped = reference_blocks(data, seq_len, eos, shuffle, 4, epoch)
        ds = SafetensorsIterableDataset(data, batch_size=3, shuffle=shuffle, seed=4,
                                        pack=Packing("tokens", seq_len=seq_len, eos=eos))
        ds.set_epoch(epoch)
        assert ds.num_blocks == len(want) and ds.dropped_tokens == dropped
        got = list(ds)
        assert all(b["tokens"].dtype == torch.int32 and b["cu_seqlens"].dtype == torch.int32 for b in got)
        assert handmade.as_blocks(got, seq_len) == want, f"seq_len {seq_len}, eos {eos}, epoch {epoch}"
        # single blocks without batch_size
        if epoch == 0:
            one = list(SafetensorsIterableDataset(data, shuffle=shuffle, seed=4,
                                                  pack=Packing("tokens", seq_len=seq_len, eos=eos)))
            assert [b["tokens"].tolist() for b in one] == [w["tokens"] for w in want]
            assert [b["cu_seqlens"].tolist() for b in one] == [w["cu_seqlens"] for w in want]


def test_packing_is_deterministic_per_seed_and_epoch_and_deals_equal_blocks_to_ranks(data):
    pack = Packing("tokens", seq_len=6, eos=9)

    def blocks(epoch, seed=3):
        ds = SafetensorsIterableDataset(data, batch_size=2, shuffle=True, seed=seed, pack=pack)
        ds.set_epoch(epoch)
        return handmade.as_blocks(list(ds), 6)

    assert blocks(0) == blocks(0) and blocks(0) != blocks(1) and blocks(0) != blocks(0, seed=4)
    full = blocks(1)
    for world in (2, 3):
        per_rank = [handmade.as_blocks(list(_epoch(data, r, world, pack, 1)), 6) for r in range(world)]
        assert len({len(p) for p in per_rank}) == 1
        assert len(_epoch(data, 0, world, pack, 1).dataset) == -(-len(per_rank[0]) // 2)
        n = len(full) // world * world
        # round by round, rank by rank: the single-rank order, cut to a multiple of world_size
        merged = []
        batches = [[p[i: i + 2] for i in range(0, len(p), 2)] for p in per_rank]
        for j in range(len(batches[0])):
            for r in range(world):
                merged += batches[r][j]
        assert merged == full[:n], f"world {world}"


def _epoch(path, rank, world, pack, epoch):
    ds = SafetensorsIterableDataset(path, batch_size=2, shuffle=True, seed=3, pack=pack, rank=rank, world_size=world)
    ds.set_epoch(epoch)
    return loader(ds, num_workers=2)


def test_packing_resumes_exactly_at_any_block_with_other_worker_counts(data):
    pack = Packing("tokens", seq_len=7, eos=3)
    kw = dict(batch_size=2, shuffle=True, seed=8, pack=pack)
    full = handmade.as_blocks(run(data, workers=2, **kw)[0], 7)
    want, _ = reference_blocks(data, 7, 3, True, 8, 0)
    assert full == want
    nb = -(-len(full) // 2)
    for k, workers, handoff in ((1, 3, None), (3, 0, None), (nb - 1, 2, 1), (2, 2, 2)):
        head, ds = run(data, workers=2, stop=k, **kw)
        state = ds.state_dict()
        assert state["position"] == 2 * k and state["pack"] == {"column": "tokens", "seq_len": 7, "eos": 3}
        tail, _ = run(data, workers=workers, handoff=handoff, state=state, **kw)
        assert handmade.as_blocks(head, 7) + handmade.as_blocks(tail, 7) == full, f"stop after {k}, {workers} workers"
    # another packing cannot resume this state
    with pytest.raises(StateError, match="pack"):
        SafetensorsIterableDataset(data, batch_size=2, shuffle=True, seed=8,
                                   pack=Packing("tokens", seq_len=8, eos=3)).load_state_dict(state)


def test_packing_arguments_name_what_is_wrong(data):
    with pytest.raises(ValueError, match="seq_len must be an integer >= 1.*got 0"):
        Packing("tokens", seq_len=0)
    with pytest.raises(ValueError, match="seq_len"):
        Packing("tokens", seq_len=2.5)
    with pytest.raises(ValueError, match=r"column 'boxes'.*F32 rows of inner shape \[4\].*integer token ids"):
        SafetensorsIterableDataset(data, pack=Packing("boxes", seq_len=4))
    with pytest.raises(ValueError, match="column 'y'.*is not ragged"):
        SafetensorsIterableDataset(data, pack=Packing("y", seq_len=4))
    with pytest.raises(ValueError, match="column 'nope' is not in dataset"):
        SafetensorsIterableDataset(data, pack=Packing("nope", seq_len=4))
    with pytest.raises(ValueError, match=r"eos=3000000000 does not fit column 'tokens' \(I32"):
        SafetensorsIterableDataset(data, pack=Packing("tokens", seq_len=4, eos=3_000_000_000))


def test_the_epoch_order_of_every_document_at_once_equals_locate():
    from safetensors_spark._sampling import EpochOrder

    for shuffle in (False, True):
        order = EpochOrder([7, 5, 9, 3, 0, 6], shuffle, 3, 2, 4)
        assert all(np.array_equal(a, b) for a, b in zip(order.locate_all(), order.locate(np.arange(30))))
