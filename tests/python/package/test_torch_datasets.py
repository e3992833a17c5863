"""safetensors_spark.torch: map-style and iterable datasets, rank/worker splits, the global order,
padding, resume (spec/python.md §3-§5). Hand-made datasets (tests/python/handmade.py) give exact
control of shard sizes; test_python_package.py covers datasets written by the Spark connector."""

import gc
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import handmade
from safetensors_spark import StateError, open_dataset
from safetensors_spark.torch import SafetensorsDataset, SafetensorsIterableDataset, loader

SIZES = [7, 5, 9, 3, 6]  # 30 samples in 5 shards of uneven size
N = sum(SIZES)
HERE = Path(__file__).resolve().parent
# 3 DataLoader workers on a 2-core machine are the point of some tests
pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = tmp_path_factory.mktemp("torch") / "ds"
    handmade.write_batch_dataset(str(path), SIZES, padded=[1, 0, 0, 2, 0], batch_size=10)
    return str(path)


def ids_of(batches):
    return [int(v) for b in batches for v in b["y"].reshape(-1).tolist()]


def run(path, *, workers=0, rank=0, world=1, stop=None, state=None, use_loader=True, handoff=None, **kw):
    """Iterates one epoch of rank `rank`; returns (batches, dataset)."""
    ds = SafetensorsIterableDataset(path, rank=rank, world_size=world, **kw)
    if state is not None:
        ds.load_state_dict(state)
    dl = loader(ds, num_workers=workers, handoff_batches=handoff) if use_loader else \
        DataLoader(ds, batch_size=None, num_workers=workers)
    out = []
    for b in dl:
        out.append(b)
        if stop is not None and len(out) == stop:
            break
    return out, ds


def global_order(path, world, workers=0, **kw):
    """Interleaves the ranks' batches round by round: the order the job consumed samples in."""
    per_rank = [run(path, workers=workers, rank=r, world=world, **kw)[0] for r in range(world)]
    counts = {len(ids_of(b)) for b in per_rank}
    assert len(counts) == 1, f"ranks got different sample counts: {[len(ids_of(b)) for b in per_rank]}"
    assert len({len(b) for b in per_rank}) == 1, "ranks got different batch counts"
    order = []
    for j in range(len(per_rank[0])):
        for r in range(world):
            order.extend(ids_of([per_rank[r][j]]))
    return order, per_rank


def test_map_style_values_zero_copy_and_no_pad_rows(data):
    ds = SafetensorsDataset(data)
    assert len(ds) == N
    for i in range(N):
        s = ds[i]
        assert s["y"].dtype == torch.int64 and int(s["y"]) == i
        assert s["x"].tolist() == [float(i), float(i * 10)]
    a, b = ds[3]["x"], ds[3]["x"]
    assert a.data_ptr() == b.data_ptr(), "two reads of a sample must view the same mapped bytes (no copy)"
    assert ds[-1]["y"].item() == N - 1
    with pytest.raises(IndexError, match="out of range"):
        ds[N]
    with pytest.raises(IndexError, match="out of range"):
        ds[-N - 1]
    only_x = SafetensorsDataset(data, columns=["x"])
    assert list(only_x[0]) == ["x"]


def test_map_style_batch_fetch_equals_reading_each_index(data):
    import pickle

    ds = SafetensorsDataset(data)
    cases = [
        [29, 0, 7, 7, 12, 3, -1, 15, 16, 17],  # scattered over every shard, a repeat, a negative index
        [6, 0, 5, 1, 4, 2, 3, 11, 7, 10, 8, 9],  # two shards, shuffled: a take per shard
        [7, 8, 9, 10, 11],  # one contiguous run: views of the map
        [1, 2, 3, 12, 13],  # two runs
    ]
    for idx in cases:
        got = ds.__getitems__(idx)
        want = [ds[i] for i in idx]
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert list(g) == list(w)
            for c in g:
                assert g[c].dtype == w[c].dtype and g[c].shape == w[c].shape and torch.equal(g[c], w[c]), (idx, c)
    with pytest.raises(IndexError, match="out of range"):
        ds.__getitems__([0, N])
    with pytest.raises(IndexError, match="out of range"):
        ds.__getitems__([-N - 1])
    # a DataLoader with a random sampler fetches through __getitems__: the same batches as one
    # that reads index by index (torch skips a __getitems__ that is None)
    class PerIndex(SafetensorsDataset):
        __getitems__ = None

    def epoch(d):
        return list(DataLoader(d, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(3)))

    fast, slow = epoch(ds), epoch(PerIndex(data))
    assert sorted(torch.cat([b["y"] for b in fast]).tolist()) == list(range(N))
    assert len(fast) == len(slow) == 4
    for f, w in zip(fast, slow):
        assert torch.equal(f["y"], w["y"]) and torch.equal(f["x"], w["x"]) and f["x"].dtype == torch.float32
    # the maps of this process are not pickled (DataLoader workers under spawn get a fresh copy)
    again = pickle.loads(pickle.dumps(ds))
    assert again[5]["y"].item() == 5 and again.__getitems__([5, 28])[1]["y"].item() == 28


@pytest.mark.parametrize("workers", [0, 2, 3])
def test_unshuffled_epoch_is_manifest_order_without_pad_rows(data, workers):
    batches, ds = run(data, workers=workers, batch_size=4)
    assert ids_of(batches) == list(range(N))
    assert [b["x"].shape[0] for b in batches] == [4] * 7 + [2]
    assert len(ds) == len(batches)
    assert batches[0]["x"].dtype == torch.float32 and batches[0]["x"].shape == (4, 2)


def test_contiguous_batch_inside_a_shard_is_a_view_of_the_map(data):
    ds = SafetensorsIterableDataset(data, batch_size=3)
    first = next(iter(ds))
    again = next(iter(ds))
    assert first["x"].data_ptr() == again["x"].data_ptr(), "rows 0..2 of shard 0 must be the mapped bytes, not a copy"
    mapped = ds.dataset._store.buffer(ds.dataset.shards[0].name)
    assert np.shares_memory(first["x"].numpy(), np.frombuffer(mapped, np.uint8))


@pytest.mark.parametrize("shuffle", [False, True])
def test_global_order_is_the_same_for_world_size_1_2_4_and_any_workers(data, shuffle):
    kw = dict(batch_size=3, shuffle=shuffle, seed=11)
    base, _ = global_order(data, 1, **kw)
    assert sorted(base) == list(range(N))
    for world, workers in [(2, 0), (2, 2), (2, 3), (4, 0), (4, 2)]:
        order, per_rank = global_order(data, world, workers=workers, **kw)
        assert order[:N] == base, f"world size {world}, {workers} workers changed the global order"
        # padding repeats the start of the order; ranks are disjoint on the real samples
        assert order[N:] == base[: len(order) - N]
        assert len(order) - N < world
        assert sorted(set(order)) == list(range(N))


def test_shuffle_is_deterministic_per_seed_and_epoch(data):
    def epoch_order(epoch, seed=3):
        ds = SafetensorsIterableDataset(data, batch_size=4, shuffle=True, seed=seed)
        ds.set_epoch(epoch)
        return ids_of(list(loader(ds)))

    e0 = epoch_order(0)
    assert e0 == epoch_order(0)
    assert sorted(e0) == list(range(N))
    assert e0 != list(range(N))
    e1 = epoch_order(1)
    assert sorted(e1) == list(range(N)) and e1 != e0
    assert epoch_order(0, seed=4) != e0


def test_shuffle_keeps_locality_with_a_small_block(data):
    ds = SafetensorsIterableDataset(data, batch_size=5, shuffle=True, seed=1, shuffle_block_size=5)
    shard_of = np.repeat(np.arange(len(SIZES)), SIZES)
    for b in loader(ds):
        assert len(set(shard_of[b["y"].numpy()])) <= 2, "a 5-sample block spans at most two neighbouring shards"


@pytest.mark.parametrize("world", [2, 4])
def test_every_rank_gets_the_same_count_disjoint_union_is_everything(data, world):
    for drop_last in (False, True):
        per_rank = [ids_of(run(data, rank=r, world=world, batch_size=4, shuffle=True, drop_last=drop_last)[0])
                    for r in range(world)]
        counts = {len(p) for p in per_rank}
        assert len(counts) == 1
        allids = [i for p in per_rank for i in p]
        if drop_last:
            assert counts == {(N // (world * 4)) * 4}
            assert len(set(allids)) == len(allids)
        else:
            assert counts == {-(-N // world)}
            assert set(allids) == set(range(N))
            assert len(allids) - len(set(allids)) == len(allids) - N


def test_dataloader_2_then_3_workers_on_2_ranks(data):
    for workers in (2, 3):
        per_rank = [ids_of(run(data, rank=r, world=2, workers=workers, batch_size=2, shuffle=True, seed=9)[0])
                    for r in range(2)]
        assert len(per_rank[0]) == len(per_rank[1]) == N // 2
        assert not set(per_rank[0]) & set(per_rank[1])
        assert set(per_rank[0]) | set(per_rank[1]) == set(range(N))


@pytest.mark.parametrize("shuffle", [False, True])
def test_resume_at_several_points_with_other_worker_counts_equals_the_uninterrupted_run(data, shuffle):
    kw = dict(batch_size=3, shuffle=shuffle, seed=5)
    full = ids_of(run(data, workers=2, **kw)[0])
    assert sorted(full) == list(range(N))
    nb = -(-N // 3)
    for k in (1, 4, nb - 1, nb):
        head, ds = run(data, workers=2, stop=k, **kw)
        state = ds.state_dict()
        assert state["position"] == min(3 * k, N)
        for workers in (3, 0):
            tail, _ = run(data, workers=workers, state=state, **kw)
            assert ids_of(head) + ids_of(tail) == full, f"stop after {k} batches, resume with {workers} workers"


@pytest.mark.parametrize("handoff", [1, 2, 3, None])
def test_several_batches_per_worker_message_keep_order_counts_and_resume(data, handoff):
    """loader() sends `handoff` batches per worker message and splits them again: batches,
    order and the resume count are those of one batch at a time, on 2 ranks with 2 and 3
    workers, resumed inside a message and at its edges."""
    kw = dict(batch_size=2, shuffle=True, seed=3)
    base = [run(data, rank=r, world=2, **kw)[0] for r in range(2)]  # in-process, batch by batch
    want = [ids_of(b) for b in base]
    for workers in (2, 3):
        for r in range(2):
            got, _ = run(data, rank=r, world=2, workers=workers, handoff=handoff, **kw)
            assert [len(b["y"]) for b in got] == [len(b["y"]) for b in base[r]]
            assert ids_of(got) == want[r], f"rank {r}, {workers} workers, handoff {handoff}"
    nb = len(run(data, rank=0, world=2, **kw)[0])
    for k in (1, 2, 3, nb - 1):
        head, ds = run(data, rank=0, world=2, workers=2, handoff=handoff, stop=k, **kw)
        state = ds.state_dict()
        assert state["position"] == k * 2 * 2, f"stopped after {k} batches"
        tail, _ = run(data, rank=0, world=2, workers=3, handoff=handoff, state=state, **kw)
        assert ids_of(head) + ids_of(tail) == want[0], f"stop after {k} batches, handoff {handoff}"


def test_batches_of_one_worker_message_share_one_shared_memory_block(data):
    ds = SafetensorsIterableDataset(data, batch_size=2, shuffle=True, seed=3)
    got = list(loader(ds, num_workers=2, handoff_batches=3))
    assert [len(b["y"]) for b in got] == [2] * 15
    blocks = [b["x"].untyped_storage().data_ptr() for b in got]
    # messages of 3 batches: batches 0-2 from worker 0, 3-5 from worker 1, ... each one block
    assert all(blocks[i] == blocks[i - i % 3] for i in range(15)) and len(set(blocks)) == 5
    one = list(loader(SafetensorsIterableDataset(data, batch_size=2, shuffle=True, seed=3), num_workers=2,
                      handoff_batches=1))
    assert len({b["x"].untyped_storage().data_ptr() for b in one}) == 15
    assert ids_of(one) == ids_of(got)
    # a collate_fn runs per message in the worker: the loader then sends one batch per message
    collated = list(loader(ds, num_workers=2, collate_fn=lambda b: {**b, "n": len(b["y"])}))
    assert [b["n"] for b in collated] == [2] * 15 and ids_of(collated) == ids_of(got)
    # the automatic size: as many batches as fit in 8 MiB (here all of them: tiny samples)
    assert loader(ds, num_workers=2).handoff_batches > 15


def test_a_pooled_block_is_released_only_when_every_tensor_of_its_message_is_gone():
    from safetensors_spark.torch._handoff import Handoff, Releases

    block = torch.arange(48, dtype=torch.uint8)
    layout = [("a", torch.uint8, (3, 8), 0, 24), ("b", torch.int16, (3, 4), 24, 24)]
    flags, blocks = np.zeros((2, 4), dtype=np.uint8), {}
    holds = {"view": lambda t: t[1:], "detach": lambda t: t.detach(), "numpy": lambda t: t.numpy(),
             "storage": lambda t: t.untyped_storage(), "dtype view": lambda t: t.view(torch.int8)}
    for i, (name, hold) in enumerate(holds.items()):
        msg = Handoff([2, 1], slot=(1, 3, block if i == 0 else None, layout))
        batches = list(msg.batches(blocks, Releases(flags)))
        assert [b["a"].shape[0] for b in batches] == [2, 1] and batches[1]["b"].dtype == torch.int16
        assert batches[0]["a"][1].tolist() == list(range(8, 16))  # the block's bytes, no copy
        kept = hold(batches[1]["a"])
        del batches, msg
        gc.collect()
        assert flags[1, 3] == 0, f"released while a {name} of a batch lives"
        del kept
        gc.collect()
        assert flags[1, 3] == 1, f"not released after the {name} went"
        flags[1, 3] = 0  # the worker takes it again
    assert flags.sum() == 0 and list(blocks) == [(1, 3)]


def test_workers_reuse_released_blocks_and_never_overwrite_a_held_batch(tmp_path, monkeypatch):
    from safetensors_spark.torch._handoff import Handoff

    path = str(tmp_path / "big")
    handmade.write_batch_dataset(path, [150, 150, 100])
    kw = dict(batch_size=4, shuffle=True, seed=1)
    want = ids_of(run(path, **kw)[0])
    seen = {"pooled": 0, "reused": 0, "fresh": 0}
    batches = Handoff.batches

    def counting(self, blocks=None, release=None):
        key = "fresh" if self.slot is None else ("pooled" if self.slot[2] is not None else "reused")
        seen[key] += 1
        return batches(self, blocks, release)

    monkeypatch.setattr(Handoff, "batches", counting)
    got, held = [], []
    for i, b in enumerate(loader(SafetensorsIterableDataset(path, **kw), num_workers=2, handoff_batches=2)):
        got.extend(ids_of([b]))
        if i % 7 == 0:
            held.append((b, b["y"].clone(), b["x"].clone()))  # kept to the end: its block stays taken
    assert got == want
    assert all(torch.equal(b["y"], y) and torch.equal(b["x"], x) for b, y, x in held)
    assert seen["reused"] > 0 and seen["fresh"] == 0, seen
    assert seen["pooled"] + seen["reused"] == len(want) // 8  # 100 batches of 4 in messages of 2


@pytest.mark.parametrize("workers,handoff", [(0, None), (2, 1), (2, None), (3, 2)])
def test_map_style_loader_batches_the_samplers_indices_in_order(data, workers, handoff):
    ds = SafetensorsDataset(data)
    seq = loader(ds, batch_size=4, num_workers=workers, handoff_batches=handoff)
    assert len(seq) == 8
    got = list(seq)
    assert len(seq) == 8 and [len(b["y"]) for b in got] == [4] * 7 + [2]
    assert ids_of(got) == list(range(N))  # a SequentialSampler; pad rows never appear
    assert got[3]["x"][1].tolist() == [13.0, 130.0]
    cut = loader(ds, batch_size=4, drop_last=True, num_workers=workers, handoff_batches=handoff)
    assert len(cut) == 7
    cut = list(cut)
    assert ids_of(cut) == list(range(28))
    # shuffle: the permutation torch's RandomSampler draws with the same generator, a new one
    # per iterator (epoch)
    dl = loader(ds, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(5), num_workers=workers,
                handoff_batches=handoff)
    want_gen = torch.Generator().manual_seed(5)
    sampler = torch.utils.data.RandomSampler(ds, generator=want_gen)
    first, second = ids_of(list(dl)), ids_of(list(dl))
    assert first == list(sampler) and second == list(sampler) and first != second
    # any sampler: repeats, negative indices (Python's), weights
    picks = [29, 0, 0, -1, 5, 17, 17, 3]
    assert ids_of(list(loader(ds, batch_size=3, sampler=picks, num_workers=workers))) == [29, 0, 0, 29, 5, 17, 17, 3]
    weighted = torch.utils.data.WeightedRandomSampler([0.0] * 10 + [1.0] * 20, 50,
                                                      generator=torch.Generator().manual_seed(1))
    drawn = ids_of(list(loader(ds, batch_size=8, sampler=weighted, num_workers=workers)))
    assert len(drawn) == 50 and min(drawn) >= 10


def test_map_style_loader_arguments_are_checked(data, tmp_path):
    ds = SafetensorsDataset(data)
    for bad in (None, 0, True, 2.0):
        with pytest.raises(ValueError, match=r"batch_size must be an integer >= 1 for a map-style .*got"):
            loader(ds, batch_size=bad)
    with pytest.raises(ValueError, match="sampler and shuffle=True are mutually exclusive"):
        loader(ds, batch_size=2, sampler=[1, 2], shuffle=True)
    with pytest.raises(ValueError, match="batch_sampler is not supported"):
        loader(ds, batch_size=2, batch_sampler=[[1, 2]])
    with pytest.raises(IndexError, match=f"sample index 30 is out of range for dataset .* with {N} samples"):
        iter(loader(ds, batch_size=2, sampler=[1, 30], num_workers=2))
    with pytest.raises(TypeError, match="takes a SafetensorsIterableDataset or a SafetensorsDataset, got list"):
        loader([1, 2], batch_size=2)
    kv = str(tmp_path / "kv")
    values = handmade.write_kv_dataset(kv, [["b", "a", "c"], ["e", "d"]])
    got = list(loader(SafetensorsDataset(kv), batch_size=2, num_workers=2))
    assert [int(v) for b in got for v in b["label"].tolist()] == [int(values[k]["label"]) for k in "abcde"]


def test_resume_with_a_plain_dataloader_and_batches_consumed(data):
    kw = dict(batch_size=4, shuffle=True, seed=2)
    full = ids_of(run(data, workers=0, **kw)[0])
    head, ds = run(data, workers=2, stop=3, use_loader=False, **kw)
    state = ds.state_dict(batches_consumed=3)
    tail, _ = run(data, workers=3, state=state, use_loader=False, **kw)
    assert ids_of(head) + ids_of(tail) == full
    with pytest.raises(StateError, match="batches_consumed=99"):
        ds.state_dict(batches_consumed=99)


def test_resume_with_another_world_size_continues_the_global_order(data):
    kw = dict(batch_size=2, shuffle=True, seed=8)
    base, _ = global_order(data, 1, **kw)
    head, ds0 = run(data, rank=0, world=2, stop=3, **kw)
    state = ds0.state_dict()
    assert state["position"] == 3 * 2 * 2
    order, _ = global_order(data, 4, state=state, **kw)
    assert base[:12] + order[: N - 12] == base


def test_resume_state_is_checked(data, tmp_path):
    ds = SafetensorsIterableDataset(data, batch_size=2, shuffle=True, seed=1)
    state = ds.state_dict()
    other = SafetensorsIterableDataset(data, batch_size=2, shuffle=True, seed=2)
    with pytest.raises(StateError, match="seed"):
        other.load_state_dict(state)
    changed = tmp_path / "changed"
    handmade.write_batch_dataset(str(changed), [7, 5, 9, 3, 7])
    with pytest.raises(StateError, match="shards changed"):
        SafetensorsIterableDataset(str(changed), batch_size=2, shuffle=True, seed=1).load_state_dict(state)
    with pytest.raises(StateError, match="not a SafetensorsIterableDataset state"):
        ds.load_state_dict({"epoch": 0})
    # position: at most total_samples (N: the epoch is over); beyond it is refused, naming both
    for position, ok in ((N, True), (N + 1, False), (10**9, False), (True, False), (-1, False)):
        fresh = SafetensorsIterableDataset(data, batch_size=2, shuffle=True, seed=1)
        bad = dict(state, position=position)
        if ok:
            fresh.load_state_dict(bad)
            assert list(fresh) == []
        else:
            with pytest.raises(ValueError, match="position") as e:
                fresh.load_state_dict(bad)
            if position == N + 1:
                assert f"position={N + 1}" in str(e.value) and f"total_samples={N}" in str(e.value)
    # a state taken inside the padding (4 ranks over 30 samples, 7 a batch: the epoch's positions
    # run to 32) says N, which every world size resumes as the end of the epoch
    padded = SafetensorsIterableDataset(data, batch_size=7, rank=0, world_size=4)
    assert padded.state_dict(batches_consumed=2)["position"] == N


def test_set_epoch_and_resume_of_a_later_epoch(data):
    kw = dict(batch_size=4, shuffle=True, seed=6)
    ds = SafetensorsIterableDataset(data, **kw)
    ds.set_epoch(2)
    full2 = ids_of(list(loader(ds)))
    head, ds2 = [], SafetensorsIterableDataset(data, **kw)
    ds2.set_epoch(2)
    for b in loader(ds2, num_workers=2):
        head.append(b)
        if len(head) == 2:
            break
    state = ds2.state_dict()
    assert state["epoch"] == 2
    ds3 = SafetensorsIterableDataset(data, **kw)
    ds3.load_state_dict(state)
    ds3.set_epoch(2)  # the training loop's set_epoch of the resumed epoch keeps the resume point
    assert ids_of(head) + ids_of(list(loader(ds3, num_workers=2))) == full2
    ds3.set_epoch(3)
    assert sorted(ids_of(list(loader(ds3)))) == list(range(N))


def test_single_samples_without_batch_size(data):
    ds = SafetensorsIterableDataset(data, shuffle=True, seed=4, rank=1, world_size=2)
    got = list(loader(ds, num_workers=2))
    assert len(got) == N // 2 and got[0]["x"].shape == (2,) and got[0]["y"].shape == ()


def test_pickled_under_spawn_workers(data):
    ds = SafetensorsIterableDataset(data, batch_size=4, shuffle=True, seed=7)
    want = ids_of(list(loader(ds)))
    got = ids_of(list(loader(ds, num_workers=2, multiprocessing_context="spawn")))
    assert got == want


def test_arguments_are_checked(data):
    with pytest.raises(ValueError, match="batch_size"):
        SafetensorsIterableDataset(data, batch_size=0)
    with pytest.raises(ValueError, match="rank"):
        SafetensorsIterableDataset(data, rank=2, world_size=2)
    with pytest.raises(KeyError, match="column 'nope' is not in dataset"):
        SafetensorsIterableDataset(data, columns=["x", "nope"])
    with pytest.raises(ValueError, match="in_order=False"):
        loader(SafetensorsIterableDataset(data), num_workers=1, in_order=False)
    with pytest.raises(ValueError, match="do not pass batch_size"):
        loader(SafetensorsIterableDataset(data), batch_size=4)
    for bad in (0, -1, True, "2", 1.5):
        with pytest.raises(ValueError, match=r"handoff_batches must be an integer >= 1 or None .*got"):
            loader(SafetensorsIterableDataset(data, batch_size=2), num_workers=2, handoff_batches=bad)


def test_kv_dataset_batches_stack_rows_and_get(tmp_path):
    path = str(tmp_path / "kv")
    values = handmade.write_kv_dataset(path, [["b", "a", "c"], ["e", "d"]])
    ds = SafetensorsIterableDataset(path, batch_size=2)
    batches = list(loader(ds))
    assert [b["emb"].shape for b in batches] == [(2, 2), (2, 2), (1, 2)]
    labels = [int(v) for b in batches for v in b["label"].tolist()]
    # sample order: shards in manifest order, keys sorted inside a shard
    assert labels == [int(values[k]["label"]) for k in ["a", "b", "c", "d", "e"]]
    m = SafetensorsDataset(path)
    assert m.get("d")["emb"].tolist() == values["d"]["emb"].tolist()


def test_bf16_and_unsigned_dtypes_reach_torch(tmp_path):
    import ml_dtypes
    from safetensors.numpy import save_file

    path = tmp_path / "dt"
    path.mkdir()
    arrays = {"bf": np.array([[1.5, -2.0], [0.25, 3.0]], dtype=ml_dtypes.bfloat16),
              "h": np.array([[1.5, 2.0], [3.0, 4.0]], dtype=np.float16),
              "u16": np.array([1, 65535], np.uint16), "u32": np.array([1, 2**32 - 1], np.uint32),
              "u64": np.array([1, 2**64 - 1], np.uint64), "b": np.array([True, False])}
    name = handmade.shard_name(0)
    save_file(arrays, str(path / name))
    schema = {k: {"dtype": d, "shape": [2, *v.shape[1:]]} for (k, v), d in
              zip(arrays.items(), ["BF16", "F16", "U16", "U32", "U64", "BOOL"])}
    handmade.write_manifest(str(path), handmade._manifest(
        [{"shard_path": name, "samples_count": 2, "bytes": os.path.getsize(path / name)}], schema))
    s = SafetensorsDataset(str(path))[1]
    assert s["bf"].dtype == torch.bfloat16 and s["bf"].tolist() == [0.25, 3.0]
    assert s["h"].dtype == torch.float16 and s["h"].tolist() == [3.0, 4.0]
    assert (s["u16"].dtype, s["u16"].item()) == (torch.uint16, 65535)
    assert (s["u32"].dtype, s["u32"].item()) == (torch.uint32, 2**32 - 1)
    assert s["u64"].dtype == torch.uint64 and s["u64"].view(torch.int64).item() == -1
    assert s["b"].dtype == torch.bool and s["b"].item() is False
    assert open_dataset(str(path)).layout == "batch"
    # the same dtypes through worker messages in pooled blocks (iterable and map-style loader())
    want = {k: _to_list(v) for k, v in s.items()}
    for made in (loader(SafetensorsIterableDataset(str(path), batch_size=1, shuffle=True, seed=1), num_workers=2,
                        handoff_batches=2),
                 loader(SafetensorsDataset(str(path)), batch_size=1, sampler=[1, 0], num_workers=2,
                        handoff_batches=2)):
        got = {}
        for b in made:
            if bool(b["b"][0]) is False:  # sample 1
                got = {k: _to_list(v[0]) for k, v in b.items()}
                assert {k: v.dtype for k, v in b.items()} == {k: v.dtype for k, v in s.items()}
        assert got == want


def _to_list(t):
    return t.view(torch.int64).tolist() if t.dtype == torch.uint64 else t.tolist()


def test_two_process_torch_distributed_gloo(data, tmp_path):
    """A real 2-rank gloo job on loopback: rank and world size come from torch.distributed. After
    2 batches the ranks save their loader with torch.distributed.checkpoint; one process (world
    size 1, 1 worker) loads it and continues the global order (spec/python.md §5.1)."""
    port, ckpt = _free_port(), str(tmp_path / "ckpt")
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2")
    procs = [subprocess.Popen([sys.executable, str(HERE / "dist_worker.py"), data, str(tmp_path / f"rank{r}.txt"),
                               ckpt], env=dict(env, RANK=str(r))) for r in range(2)]
    assert [p.wait(timeout=300) for p in procs] == [0, 0]
    per_rank = [[int(v) for v in (tmp_path / f"rank{r}.txt").read_text().split()] for r in range(2)]
    assert len(per_rank[0]) == len(per_rank[1]) == N // 2
    assert set(per_rank[0]).isdisjoint(per_rank[1]) and set(per_rank[0]) | set(per_rank[1]) == set(range(N))
    base, _ = global_order(data, 1, batch_size=3, shuffle=True, seed=21)
    order = []
    for j in range(0, len(per_rank[0]), 3):
        order += per_rank[0][j:j + 3] + per_rank[1][j:j + 3]
    assert order == base
    import torch.distributed.checkpoint as dcp

    resumed = loader(SafetensorsIterableDataset(data, batch_size=3, shuffle=True, seed=21), num_workers=1)
    with pytest.warns(UserWarning, match="load in a single process"):
        dcp.load({"data": resumed}, checkpoint_id=ckpt)
    assert resumed.state_dict()["position"] == 2 * 3 * 2
    assert base[:12] + ids_of(list(resumed)) == base


def _free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
