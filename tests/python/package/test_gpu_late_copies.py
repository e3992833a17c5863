"""loader(pin_memory=True) and loader(device="cuda") against copies that complete late
(late_cuda.py: CUDA as the hardware behaves, without a GPU). A pooled pinned block must not go
back to its worker while a copy from it may still run: neither the user's
``.to("cuda", non_blocking=True)`` on the current stream from a delivered batch, nor the loader's
own copy on its side stream (spec/python.md §3.1.1). Every kind of batch that travels in pooled
blocks is covered: plain and map-style, ragged (nested), packed, mixtures, a resumed epoch."""

import gc

import numpy as np
import pytest
import torch

import handmade
from late_cuda import LateCuda
from safetensors_spark.torch import (Packing, SafetensorsDataset, SafetensorsIterableDataset, SafetensorsMixture,
                                     Source, loader)
from safetensors_spark.torch import _device

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")

LAG = 4  # a copy runs four training steps after it was queued


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    root = tmp_path_factory.mktemp("late")
    a, b, r = str(root / "a"), str(root / "b"), str(root / "ragged")
    handmade.write_batch_dataset(a, [150, 150, 100], width=3)
    handmade.write_batch_dataset(b, [90, 110], width=3)
    rng = np.random.default_rng(5)
    n = 360
    handmade.write_ragged_dataset(r, [120, 100, 140], {
        "tokens": ("ragged", "I32", [1000 * i + np.arange(rng.integers(1, 40)) for i in range(n)], "array"),
        "y": ("fixed", "I64", np.arange(n, dtype=np.int64))})
    return {"a": a, "b": b, "ragged": r}


def _resumed(path):
    first = SafetensorsIterableDataset(path, batch_size=6, shuffle=True, seed=7)
    it = iter(loader(first, num_workers=0))
    for _ in range(9):
        next(it)
    state = first.state_dict()
    del it
    ds = SafetensorsIterableDataset(path, batch_size=6, shuffle=True, seed=7)
    ds.load_state_dict(state)
    return ds


# kind -> (dataset, loader keyword arguments), made fresh for each loader
KINDS = {
    "iterable": lambda p: (SafetensorsIterableDataset(p["a"], batch_size=6, shuffle=True, seed=1), {}),
    "map_style": lambda p: (SafetensorsDataset(p["a"]), dict(batch_size=6, shuffle=True,
                                                             generator=torch.Generator().manual_seed(3))),
    "ragged_nested": lambda p: (SafetensorsIterableDataset(p["ragged"], batch_size=5, shuffle=True, seed=2,
                                                           ragged={"tokens": "nested"}), {}),
    "packed": lambda p: (SafetensorsIterableDataset(p["ragged"], batch_size=4, shuffle=True, seed=2,
                                                    pack=Packing("tokens", seq_len=24, eos=0)), {}),
    "mixture": lambda p: (SafetensorsMixture([Source(p["a"]), Source(p["b"])], weights=[2, 1], batch_size=6,
                                             num_samples=420, seed=4), {}),
    "resumed": lambda p: (_resumed(p["a"]), {}),
}


def _host(batch):
    return {k: (torch.nested.nested_tensor_from_jagged(v.values().clone(), v.offsets().clone()) if v.is_nested
                else v.clone()) for k, v in batch.items()}


def _same(a, b):
    if set(a) != set(b):
        return False
    for k in a:
        x, y = a[k], b[k]
        if x.is_nested != y.is_nested:
            return False
        if x.is_nested:
            if not (torch.equal(x.values(), y.values()) and torch.equal(x.offsets(), y.offsets())):
                return False
        elif not torch.equal(x, y):
            return False
    return True


def _assert_reused(cuda, messages):
    """The race is forced only if workers wrote messages into blocks that had held earlier ones."""
    assert messages - cuda.registrations >= messages // 3, \
        f"{cuda.registrations} blocks registered for {messages} messages: too few reused to force the race"


def _reference(kind, paths):
    ds, kw = KINDS[kind](paths)
    return [_host(b) for b in loader(ds, num_workers=0, **kw)]


def _differ(got, want):
    assert len(got) == len(want)
    return [i for i, (g, w) in enumerate(zip(got, want)) if not _same(g, w)]


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_pinned_block_is_reused_only_after_the_users_non_blocking_copies_from_it(kind, paths, monkeypatch):
    """The standard idiom: ``b = {k: v.to("cuda", non_blocking=True)}``, the host batch dropped at
    once, a step on the current stream. The block goes back to its worker only once the copies
    queued from it have run (a CUDA event on the current stream), so no copy reads a next
    message's bytes (gpu_correct2.py's ``pinned_nb`` case: 90 of 128 batches wrong before)."""
    want = _reference(kind, paths)
    cuda = LateCuda(lag=LAG)
    monkeypatch.setattr(_device, "BACKEND", cuda)
    ds, kw = KINDS[kind](paths)
    got = []
    for b in loader(ds, num_workers=2, handoff_batches=2, pin_memory=True, **kw):
        d = cuda.to_device(b)
        got.append(cuda.snapshot(d))  # the step reads the batch on the current stream
        del b, d
        cuda.tick()
    cuda.synchronize()
    gc.collect()
    assert _differ(got, want) == [], f"{kind}: batches on the device differ from the CPU batches"
    messages = -(-len(want) // 2)
    assert cuda.late_copies >= len(want) - 2, "the copies did not read pinned pooled blocks"
    _assert_reused(cuda, messages)
    assert cuda.unregistrations == cuda.registrations and cuda.violations == []


@pytest.mark.parametrize("kind", list(KINDS))
def test_device_batches_are_the_cpu_batches_when_copies_complete_late(kind, paths, monkeypatch):
    """``device="cuda"``: the step (on the current stream) sees each batch only after its copy on
    the side stream ran, and the host block is not reused while that copy may run."""
    want = _reference(kind, paths)
    cuda = LateCuda(lag=LAG)
    monkeypatch.setattr(_device, "BACKEND", cuda)
    ds, kw = KINDS[kind](paths)
    got = []
    for b in loader(ds, num_workers=2, handoff_batches=2, device="cuda", **kw):
        got.append(cuda.snapshot(b))
        del b
        cuda.tick()
    cuda.synchronize()
    assert _differ(got, want) == [], f"{kind}: device batches differ from the CPU batches"
    assert cuda.late_copies >= len(want) - 2
    _assert_reused(cuda, -(-len(want) // 2))
    assert cuda.violations == []


def test_copies_from_a_held_batch_and_from_a_loop_that_stops_early_are_waited_for(paths, monkeypatch):
    """A loop that breaks off with copies still queued: the iterator's end waits for them before
    it unregisters the blocks (late_cuda fails an unregister under a queued copy); a held host
    batch is never overwritten."""
    cuda = LateCuda(lag=50)
    monkeypatch.setattr(_device, "BACKEND", cuda)
    want = _reference("iterable", paths)
    ds, kw = KINDS["iterable"](paths)
    it = iter(loader(ds, num_workers=2, handoff_batches=2, pin_memory=True))
    got, held = [], []
    for i, b in enumerate(it):
        got.append(cuda.snapshot(cuda.to_device(b)))
        if i % 5 == 0:
            held.append((i, b))
        del b
        cuda.tick()
        if i == 30:
            break
    it.close()  # the end of the iterator: copies queued on the current stream run first
    assert cuda.unregistrations == cuda.registrations > 0 and cuda.violations == []
    cuda.synchronize()
    assert _differ(got, want[:31]) == []
    assert all(_same(_host(b), want[i]) for i, b in held), "a held batch was overwritten"
