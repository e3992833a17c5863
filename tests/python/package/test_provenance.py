"""Row provenance in the torch iterable dataset, mixtures and loader() (spec/python.md §3.7).

Every sample yielded with ``provenance=True`` is checked against the row its ``_file`` and
``_row_index`` name, read straight from that shard file with the ``safetensors`` package (dim 0
of every column of a batch-layout shard is the row), under shuffle, a filter, real DataLoader
workers with loader()'s shared-memory handoff, resume, ranks, follow and mixtures; then a sample
found by value is deleted with ``delete_rows`` through its provenance."""

import os
import shutil

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file
from torch.utils.data import DataLoader

import handmade
import safetensors_spark
from safetensors_spark import Filter
from safetensors_spark.torch import (Follow, Packing, SafetensorsDataset, SafetensorsIterableDataset,
                                     SafetensorsMixture, Source, loader)
from safetensors_spark._native import ragged_offsets_name as offsets_name

SIZES = [7, 5, 9, 3, 6]  # 30 samples, uneven shards, some padded
PADDED = [1, 0, 0, 2, 0]
N = sum(SIZES)
ADDED = {0: 1, 2: 2, 3: 3}  # shards' added_version in the manifest; shards 1 and 4 record none
KEYS = ("_file", "_row_index", "_added_version")
pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")


def write(path, sizes=SIZES, padded=PADDED, added=ADDED, width=3):
    handmade.write_batch_dataset(path, sizes, padded=padded, batch_size=10, width=width)
    m = handmade.read_manifest(path)
    for k, v in added.items():
        m["shards"][k]["added_version"] = v
    handmade.write_manifest(path, m)
    return path


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write(str(tmp_path_factory.mktemp("prov") / "ds"))


def truth(path):
    """shard name → (its tensors read by the safetensors package, real rows, added_version or -1)."""
    m = handmade.read_manifest(path)
    return {s["shard_path"]: (load_file(os.path.join(path, s["shard_path"])), s["samples_count"],
                              s.get("added_version", -1)) for s in m["shards"]}


def samples(batches, ragged=None):
    """Per-sample dicts of batches (numpy values; ``ragged``: column → form of the batches)."""
    out = []
    for b in batches:
        n = len(b["_file"])
        assert all(isinstance(f, str) for f in b["_file"])
        for key in ("_row_index", "_added_version"):
            assert b[key].dtype == torch.int64 and b[key].shape == (n,)
        for k in range(n):
            s = {"_file": b["_file"][k], "_row_index": int(b["_row_index"][k]),
                 "_added_version": int(b["_added_version"][k])}
            for c, t in b.items():
                if c in KEYS or c in ("_source", "src") or c.endswith(".offsets") or c.endswith(".lengths"):
                    continue
                form = (ragged or {}).get(c)
                if form == "offsets":
                    o = b[offsets_name(c)]
                    s[c] = t[int(o[k]): int(o[k + 1])].numpy()
                elif form == "nested":
                    s[c] = t.unbind()[k].numpy()
                elif form == "padded":
                    s[c] = t[k][: int(b[f"{c}.lengths"][k])].numpy()
                else:
                    assert len(t) == n
                    s[c] = t[k].numpy()
            if "_source" in b:
                s["_source"] = int(b["_source"][k])
            out.append(s)
    return out


def check(found, path, ragged=()):
    """Each sample equals the row its provenance names; returns the (file, row) pairs in order."""
    shards = truth(path)
    pairs = []
    for s in found:
        tensors, real, added = shards[s["_file"]]
        r = s["_row_index"]
        assert 0 <= r < real, s
        assert s["_added_version"] == added
        for c, v in s.items():
            if c in KEYS or c == "_source":
                continue
            if c in ragged:
                o = tensors[offsets_name(c)]
                want = tensors[c][o[r]: o[r + 1]]
            else:
                want = tensors[c][r]
            np.testing.assert_array_equal(v, want, err_msg=f"{c} of {s['_file']} row {r}")
        pairs.append((s["_file"], r))
    return pairs


def all_rows(path, keep=lambda y: True):
    """Every (file, row) of the dataset's real rows whose y ``keep`` keeps."""
    return sorted((name, r) for name, (t, real, _) in truth(path).items() for r in range(real) if keep(int(t["y"][r])))


KEPT = Filter.where("y", "not in", list(range(0, N, 4)))


def test_shuffled_filtered_samples_through_loader_workers_and_a_resume_are_the_rows_they_name(data):
    def make():
        return SafetensorsIterableDataset(data, batch_size=3, shuffle=True, seed=7, shuffle_block_size=8,
                                          filter=KEPT, provenance=True)

    ds = make()
    head = []
    for b in loader(ds, num_workers=2):  # several batches per message, pooled blocks
        head.append(b)
        if len(head) == 2:
            break
    state = ds.state_dict()
    again = make()
    again.load_state_dict(state)
    tail = list(loader(again, num_workers=2, handoff_batches=2))
    pairs = check(samples(head + tail), data)
    assert sorted(pairs) == all_rows(data, lambda y: y % 4 != 0)  # each kept row once, none other
    # the same order as one process reading the whole epoch
    assert pairs == check(samples(list(make())), data)


@pytest.mark.parametrize("world,drop_last", [(3, False), (4, True)])
def test_every_rank_gets_the_rows_its_samples_name(data, world, drop_last):
    pairs = []
    for rank in range(world):
        ds = SafetensorsIterableDataset(data, batch_size=2, shuffle=True, seed=3, rank=rank, world_size=world,
                                        drop_last=drop_last, provenance=True)
        pairs += check(samples(loader(ds, num_workers=2)), data)
    # padding repeats the start of the order; drop_last leaves a tail out: never a row not in it
    assert set(pairs) <= set(all_rows(data))
    assert len(set(pairs)) == (N if not drop_last else N // (world * 2) * world * 2)


@pytest.mark.parametrize("how", ["in_process", "dataloader_workers", "one_batch_a_message", "transform", "single"])
def test_every_way_a_batch_reaches_the_loop_carries_its_provenance(data, how):
    kw = dict(batch_size=4, shuffle=True, seed=1, provenance=True)
    if how == "transform":  # batches finished in the worker, sent packed in one block (Listed _file)
        kw["transform"] = lambda b: {**b, "x2": b["x"] * 2}
    if how == "single":
        kw["batch_size"] = None
    ds = SafetensorsIterableDataset(data, **kw)
    if how == "in_process":
        got = list(ds)
    elif how == "dataloader_workers":  # torch's own handoff, one batch per item
        got = list(DataLoader(ds, batch_size=None, num_workers=2))
    elif how == "one_batch_a_message":
        got = list(loader(ds, num_workers=2, handoff_batches=1))
    else:
        got = list(loader(ds, num_workers=2))
    if how == "single":
        assert isinstance(got[0]["_file"], str) and got[0]["_row_index"].shape == ()
        got = [{k: [v] if k == "_file" else v.reshape(1, *v.shape) for k, v in s.items()} for s in got]
    found = samples(got)
    if how == "transform":
        for s in found:
            np.testing.assert_array_equal(s.pop("x2"), s["x"] * 2)
    assert sorted(check(found, data)) == all_rows(data)
    off = SafetensorsIterableDataset(data, **{**kw, "provenance": False})
    assert not set(KEYS) & set(next(iter(loader(off, num_workers=1)))) and not set(KEYS) & set(next(iter(off)))


def test_a_stateful_dataloader_resume_keeps_provenance_with_each_sample(data):
    def make():
        return SafetensorsIterableDataset(data, batch_size=3, shuffle=True, seed=2, filter=KEPT, provenance=True)

    head, _, same = handmade.stateful_resumed(make, 3, num_workers=2, snapshot_every=1)
    pairs = check(samples(head + list(same)), data)
    assert sorted(pairs) == all_rows(data, lambda y: y % 4 != 0)


@pytest.mark.parametrize("form", ["offsets", "nested", "padded"])
def test_ragged_rows_are_the_rows_they_name(tmp_path, form):
    rng = np.random.default_rng(0)
    rows = [rng.integers(0, 1000, size=rng.integers(0, 6)).astype(np.int32) for _ in range(N)]
    path = str(tmp_path / "ragged")
    handmade.write_ragged_dataset(path, SIZES, {"tokens": ("ragged", "I32", rows, "array"),
                                                "y": ("fixed", "I64", np.arange(N))}, padded=PADDED, batch_size=10)
    ds = SafetensorsIterableDataset(path, batch_size=4, shuffle=True, seed=4, ragged=form, provenance=True)
    found = samples(loader(ds, num_workers=2), {"tokens": form})
    assert sorted(check(found, path, ragged=("tokens",))) == all_rows(path)


def test_followed_versions_give_the_rows_of_their_own_shards(tmp_path):
    path = write(str(tmp_path / "ds"), sizes=[4, 4, 3], padded=[0, 0, 0], added={}, width=2)
    handmade.start_log(path)
    handmade.append_shard(path, 3)  # version 2
    handmade.append_shard(path, 2)  # version 3
    ds = SafetensorsIterableDataset(path, version=1, batch_size=2, shuffle=True, provenance=True,
                                    follow=Follow(until_version=3, poll_interval=0.05))
    found = samples(loader(ds, num_workers=2))
    pairs = check(found, path)
    assert sorted(pairs) == all_rows(path)
    new = {s["shard_path"] for s in handmade.read_manifest(path)["shards"][3:]}
    assert {f for f, _ in pairs[-5:]} == new  # the appended rows come after the epoch, from their shards


def test_a_mixture_names_each_samples_source_shard_and_row_through_workers_and_a_resume(data, tmp_path):
    other = write(str(tmp_path / "other"), sizes=[4, 6], padded=[0, 0], added={1: 9}, width=3)

    def make(batch_size=4):
        return SafetensorsMixture([data, Source(other, filter=Filter.where("y", ">", 1))], weights=[1, 2],
                                  num_samples=40, batch_size=batch_size, seed=3, source_column="src",
                                  provenance=True)

    mix = make()
    assert mix.source_paths == [data, other]
    head = []
    for b in loader(mix, num_workers=2):
        head.append(b)
        if len(head) == 3:
            break
    again = make()
    again.load_state_dict(mix.state_dict())
    batches = head + list(loader(again, num_workers=2))
    for b in batches:
        assert torch.equal(b["_source"], b["src"])
    found = samples(batches)
    by_source = [[s for s in found if s["_source"] == i] for i in (0, 1)]
    assert [len(s) for s in by_source] == mix.source_counts
    check(by_source[0], data)
    pairs = check(by_source[1], other)
    assert all(int(truth(other)[f][0]["y"][r]) > 1 for f, r in pairs)  # the filter's kept rows only
    # in one process, unbatched: the same samples in the same order
    single = list(make(batch_size=None))
    assert isinstance(single[0]["_file"], str) and single[0]["_source"].shape == ()
    assert [(s["_file"], int(s["_row_index"]), int(s["_source"])) for s in single] == \
        [(s["_file"], s["_row_index"], s["_source"]) for s in found]


def test_a_sample_found_in_training_is_deleted_by_its_provenance_and_every_other_row_kept(data, tmp_path):
    path = str(tmp_path / "ds")
    shutil.copytree(data, path)
    ds = SafetensorsIterableDataset(path, batch_size=4, shuffle=True, seed=9, provenance=True)
    bad = None
    for b in loader(ds, num_workers=2):
        hit = (b["y"] == 17).nonzero().flatten().tolist()
        if hit:
            bad = (b["_file"][hit[0]], int(b["_row_index"][hit[0]]))
    assert bad is not None
    result = safetensors_spark.delete_rows(path, [bad])
    assert result["rows_removed"] == 1
    after = SafetensorsIterableDataset(path, batch_size=5, provenance=True)
    found = samples(loader(after, num_workers=2))
    assert sorted(int(s["y"]) for s in found) == [i for i in range(N) if i != 17]
    check(found, path)
    rewritten = {s["shard_path"] for s in handmade.read_manifest(path)["shards"]} - set(truth(data))
    assert len(rewritten) == 1 and {s["_added_version"] for s in found if s["_file"] in rewritten} == \
        {result["version"]}


def test_bad_provenance_settings_are_refused(data, tmp_path):
    for bad in (1, "yes", None):
        with pytest.raises(ValueError, match="provenance must be True or False"):
            SafetensorsIterableDataset(data, provenance=bad)
        with pytest.raises(ValueError, match="provenance must be True or False"):
            SafetensorsMixture([data], provenance=bad)
    docs = str(tmp_path / "docs")
    handmade.write_ragged_dataset(docs, [2, 2], {"tokens": ("ragged", "I32", [np.arange(3)] * 4, "array"),
                                                 "_row_index": ("fixed", "I64", np.arange(4))})
    with pytest.raises(ValueError, match="provenance=True with pack: a packed block is cut from many documents"):
        SafetensorsIterableDataset(docs, pack=Packing("tokens", 4), provenance=True)
    with pytest.raises(ValueError, match="SafetensorsMixture: provenance=True with pack"):
        SafetensorsMixture([Source(docs, columns=["tokens"])], pack=Packing("tokens", 4), provenance=True)
    with pytest.raises(ValueError, match=r"column\(s\) \['_row_index'\] would be overwritten"):
        SafetensorsIterableDataset(docs, columns=["_row_index"], provenance=True)
    SafetensorsIterableDataset(docs, columns=["_row_index"])  # without provenance, a column like any other
    with pytest.raises(ValueError, match=r"\['_file'\] would be overwritten"):
        SafetensorsMixture([Source(data, columns={"_file": "x"})], provenance=True)
    with pytest.raises(ValueError, match=r"\['_source'\] would be overwritten"):
        SafetensorsMixture([data], source_column="_source", provenance=True)


def test_kv_samples_name_the_keys_position_as_open_dataset_does(tmp_path):
    path = str(tmp_path / "kv")
    values = handmade.write_kv_dataset(path, [["c", "a", "b"], ["e", "d"]])
    ref = safetensors_spark.open_dataset(path, provenance=True)
    where = {(s["_file"], s["_row_index"]): s for s in ref}
    ds = SafetensorsIterableDataset(path, batch_size=2, shuffle=True, seed=1, provenance=True)
    found = samples(loader(ds, num_workers=2))
    assert sorted((s["_file"], s["_row_index"]) for s in found) == sorted(where)
    for s in found:
        want = where[(s["_file"], s["_row_index"])]
        assert s["_added_version"] == -1 and want["_added_version"] is None
        np.testing.assert_array_equal(s["emb"], want["emb"])
        np.testing.assert_array_equal(s["label"], want["label"])
    assert sorted(int(s["label"]) for s in found) == sorted(int(v["label"]) for v in values.values())


def test_loader_over_the_map_style_dataset_keeps_its_provenance(data):
    ds = SafetensorsDataset(data, provenance=True)
    for workers in (0, 2):
        found = samples(loader(ds, batch_size=4, shuffle=True, num_workers=workers))
        assert sorted(check(found, data)) == all_rows(data)
