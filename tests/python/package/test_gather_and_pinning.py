"""The Rust gather of shuffled batches (one call across columns and shards), and loader()'s pinned
delivery: pooled pinned blocks and the one-batch-ahead device copy (spec/python.md §3.1, §3.3).
CI has no GPU: pinning and the device copy are exercised through an injected backend
(``_device.BACKEND``) that records what CUDA would be asked to do; only the "no CUDA" error uses
the real torch.cuda."""

import gc
import json
import os
import subprocess
import sys
import weakref
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import torch

import handmade
from safetensors_spark.torch import SafetensorsDataset, SafetensorsIterableDataset, loader
from safetensors_spark.torch import _device
from safetensors_spark.torch._reader import gather_ragged, gather_rows

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")

DTYPES = [np.bool_, np.uint8, np.int8, np.uint16, np.int16, np.uint32, np.int32, np.uint64, np.int64, np.float16,
          ml_dtypes.bfloat16, np.float32, np.float64]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_the_rust_gather_gives_numpys_take_bytes_for_every_dtype(dtype):
    rng = np.random.default_rng(3)
    shapes = [(), (3,), (2, 5)]
    sizes = [7, 1, 12]
    for inner in shapes:
        shards = [rng.integers(0, 256, (n, *inner, np.dtype(dtype).itemsize), dtype=np.uint8)
                  .view(dtype).reshape(n, *inner) for n in sizes]
        which = rng.integers(0, len(sizes), 40)
        rows = np.array([rng.integers(0, sizes[s]) for s in which], dtype=np.int64)
        want = np.empty((40, *inner), dtype)
        for s in range(len(sizes)):  # the numpy take per shard the gather replaces
            m = which == s
            want[m] = shards[s].take(rows[m], axis=0)
        out = np.empty_like(want)
        out.view(np.uint8)[...] = 0xAB
        gather_rows([("c", out, shards)], which, rows)
        assert out.tobytes() == want.tobytes()


def test_the_rust_gather_refuses_bad_index_lists_naming_the_row():
    src = [np.arange(6, dtype=np.int32).reshape(3, 2), np.arange(4, dtype=np.int32).reshape(2, 2)]
    out = np.zeros((2, 2), np.int32)
    with pytest.raises(IndexError, match=r"batch row 1: row 2 is out of range for shard 1 \(2 rows\)"):
        gather_rows([("x", out, src)], np.array([0, 1]), np.array([0, 2]))
    with pytest.raises(IndexError, match=r"batch row 0: shard 2 is out of range \(2 shards\)"):
        gather_rows([("x", out, src)], np.array([2, 0]), np.array([0, 0]))
    with pytest.raises(IndexError, match="row -1 is out of range"):
        gather_rows([("x", out, src)], np.array([0, 0]), np.array([-1, 0]))
    with pytest.raises(ValueError, match="empty index list"):
        gather_rows([("x", out[:0], src)], np.array([], np.int64), np.array([], np.int64))
    with pytest.raises(ValueError, match="rows of float32"):
        gather_rows([("x", out.view(np.float32), [np.zeros((3, 3), np.float32)])], np.array([0]), np.array([0]))
    assert not out.any(), "a refused gather writes nothing"


def test_the_rust_ragged_gather_copies_each_rows_run_of_elements_and_refuses_bad_spans():
    values = [np.arange(12, dtype=np.int16).reshape(6, 2), np.arange(100, 106, dtype=np.int16).reshape(3, 2)]
    shards, starts, lengths = np.array([1, 0, 0, 1]), np.array([1, 4, 0, 0]), np.array([2, 0, 3, 1])
    out = np.zeros((6, 2), np.int16)
    gather_ragged("tokens", out, values, shards, starts, lengths)
    want = np.concatenate([values[s][b: b + n] for s, b, n in zip(shards, starts, lengths)])
    assert out.tobytes() == want.tobytes()
    with pytest.raises(IndexError, match=r"column 'tokens', batch row 1: elements \[5, 5 \+ 2\) are out of range "
                                         r"for shard 0 \(6 elements\)"):
        gather_ragged("tokens", out, values, np.array([1, 0]), np.array([0, 5]), np.array([1, 2]))
    with pytest.raises(ValueError, match="empty index list"):
        gather_ragged("tokens", out, values, np.array([], np.int64), np.array([], np.int64), np.array([], np.int64))


def test_shuffled_batches_over_many_shards_and_dtypes_equal_the_samples(tmp_path):
    """Through the reader: fixed columns of several dtypes gathered in Rust, a ragged column beside
    them copied as before; every batch row equals ds[i]."""
    path = str(tmp_path / "mixed")
    n, rng = 120, np.random.default_rng(0)
    tokens = [rng.integers(0, 1000, rng.integers(0, 6)).astype(np.int32) for _ in range(n)]
    handmade.write_ragged_dataset(path, [30, 1, 44, 45], {
        "tokens": ("ragged", "I32", tokens, "array"),
        "f": ("fixed", "F16", rng.standard_normal((n, 3)).astype(np.float16)),
        "b": ("fixed", "BF16", rng.standard_normal((n, 2, 2)).astype(ml_dtypes.bfloat16)),
        "id": ("fixed", "I64", np.arange(n, dtype=np.int64))})
    ds = SafetensorsDataset(path)
    dl = loader(ds, batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(2))
    seen = []
    for b in dl:
        ids = b["id"].tolist()
        seen.extend(ids)
        o = b["tokens.offsets"]
        for k, i in enumerate(ids):
            want = ds.dataset[i]
            assert b["f"][k].numpy().tobytes() == np.asarray(want["f"]).tobytes()
            assert b["b"][k].view(torch.int16).numpy().tobytes() == np.asarray(want["b"]).tobytes()
            assert b["tokens"][o[k]: o[k + 1]].tolist() == tokens[i].tolist()
    assert sorted(seen) == list(range(n))


class FakeCuda:
    """What loader() asks of CUDA, recorded: blocks registered as pinned and unregistered, batches
    copied into pinned memory, device copies (clones) whose events complete at their second
    query, and when each copied host batch is dropped."""

    def __init__(self):
        self.log, self.registered, self.unregistered, self.pins, self.copies = [], [], [], 0, 0

    def available(self):
        return True

    def register(self, block):
        self.registered.append((block.data_ptr(), block.numel()))
        return True

    def unregister(self, block):
        self.unregistered.append((block.data_ptr(), block.numel()))

    def pin(self, t):
        self.pins += 1
        return t.clone()

    def stream(self, device):
        return "side stream"

    def copy(self, batch, device, stream):
        i, self.copies = self.copies, self.copies + 1
        tensors = [v for v in batch.values() if isinstance(v, torch.Tensor)]  # (provenance's _file: a list)
        for v in tensors:
            weakref.finalize(v, self.log.append, ("host dropped", i))
        self.log.append(("copy", i))
        return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in batch.items()}, FakeEvent(self, i)

    def wait(self, event, batch, device):
        self.log.append(("wait", event.i))

    def record(self, device):
        self.log.append(("fence",))
        return PassedFence()


class PassedFence:
    """A fence on the current stream with nothing queued before it (late_cuda.py models the rest)."""

    def query(self):
        return True

    def synchronize(self):
        pass


class FakeEvent:
    def __init__(self, cuda, i):
        self.cuda, self.i, self.queries, self.done = cuda, i, 0, False

    def query(self):
        self.queries += 1
        if self.queries >= 2 and not self.done:
            self.done = True
            self.cuda.log.append(("done", self.i))
        return self.done

    def synchronize(self):
        if not self.done:
            self.done = True
            self.cuda.log.append(("done", self.i))


@pytest.fixture
def big(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("pin") / "big")
    handmade.write_batch_dataset(path, [150, 150, 100])
    return path


def test_pin_memory_keeps_pooled_blocks_registered_once_and_never_overwrites_a_held_batch(big, monkeypatch):
    cuda = FakeCuda()
    monkeypatch.setattr(_device, "BACKEND", cuda)
    kw = dict(batch_size=4, shuffle=True, seed=1)
    want = [(b["y"].clone(), b["x"].clone()) for b in loader(SafetensorsIterableDataset(big, **kw), num_workers=2,
                                                                handoff_batches=2)]
    got, held = [], []
    it = iter(loader(SafetensorsIterableDataset(big, **kw), num_workers=2, handoff_batches=2, pin_memory=True))
    for i, b in enumerate(it):
        got.append((b["y"].clone(), b["x"].clone()))
        blocks = [(p, n) for p, n in cuda.registered if p <= b["x"].data_ptr() < p + n]
        assert len(blocks) == 1, "a batch outside every registered (pinned) block"
        if i % 7 == 0:
            held.append((b, b["y"].clone(), b["x"].clone()))  # kept to the end: its block stays taken
    del it, b
    gc.collect()
    assert all(torch.equal(a[0], w[0]) and torch.equal(a[1], w[1]) for a, w in zip(got, want)) and len(got) == 100
    assert all(torch.equal(b["y"], y) and torch.equal(b["x"], x) for b, y, x in held), "a held batch was overwritten"
    # 50 messages of 2 batches in a handful of blocks, each registered once, all unregistered at the end
    assert 2 <= len(cuda.registered) < 50 and len(set(cuda.registered)) == len(cuda.registered)
    assert sorted(cuda.unregistered) == sorted(cuda.registered)
    assert cuda.pins == 0, "a pooled batch was copied"


@pytest.mark.parametrize("workers", [0, 2])
def test_device_copies_run_one_batch_ahead_and_host_batches_go_only_after_their_copy(big, monkeypatch, workers):
    cuda = FakeCuda()
    monkeypatch.setattr(_device, "BACKEND", cuda)
    kw = dict(batch_size=8, shuffle=True, seed=4)
    plain_ds = SafetensorsIterableDataset(big, **kw)
    plain = []
    for b in loader(plain_ds, num_workers=workers):
        plain.append((b["y"].clone(), plain_ds.state_dict()))
    ds = SafetensorsIterableDataset(big, **kw)
    n = 0
    for i, b in enumerate(loader(ds, num_workers=workers, device="cuda:0")):
        assert torch.equal(b["y"], plain[i][0])
        assert ds.state_dict() == plain[i][1], "the resume count includes a batch the loop has not taken"
        assert ("wait", i) in cuda.log and (i + 1 == len(plain) or ("copy", i + 1) in cuda.log), \
            "the next batch's copy was not issued before this batch was handed out"
        cuda.log.append(("step", i))
        n += 1
    gc.collect()
    assert n == len(plain) == 50 and cuda.copies == 50
    if workers == 0:
        assert cuda.pins > 0  # no pooled blocks: each batch copied into pinned memory
    for i in range(50):
        dropped = [k for k, e in enumerate(cuda.log) if e == ("host dropped", i)]
        done = cuda.log.index(("done", i))
        assert dropped and min(dropped) > done, f"host batch {i} dropped before its copy completed"
    assert cuda.log.index(("step", 0)) < cuda.log.index(("done", 0)), "the copy did not overlap a step"


def test_without_cuda_device_is_refused_and_pin_memory_is_dropped_with_a_warning(big, monkeypatch):
    ds = SafetensorsIterableDataset(big, batch_size=50)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # as here and in CI, on any machine
    with pytest.raises(ValueError, match=r"device='cuda' needs torch with CUDA .*is_available\(\) is False"):
        loader(ds, device="cuda")
    with pytest.raises(ValueError, match="only CUDA devices are supported"):
        loader(ds, device="meta")
    with pytest.warns(UserWarning, match="no CUDA device is available: batches are not pinned"):
        dl = loader(ds, num_workers=2, pin_memory=True)
    assert [b["y"].tolist() for b in dl] == [list(range(k, k + 50)) for k in range(0, 400, 50)]


GPU_FEED = Path(__file__).resolve().parents[3] / "jvm-connector" / "bench" / "gpu_feed.py"


def test_the_gpu_benchmark_runs_end_to_end_as_a_cpu_rehearsal_and_refuses_to_measure_without_a_gpu(tmp_path):
    """gpu_feed.py has to work the first time a GPU machine is lent (spec/performance.md §10.9):
    its rehearsal runs every mode over a real dataset with real workers; without a GPU and without
    --rehearse it refuses instead of printing CPU figures as GPU ones."""
    out = tmp_path / "feed.json"
    run = subprocess.run([sys.executable, str(GPU_FEED), "--rehearse", "--shards", "2", "--passes", "2", "--reps", "2",
                          "--step-ms", "1", "--copies", "2", "--out", str(out)], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr
    assert "REHEARSAL on the CPU (GPU figures mean nothing)" in run.stdout
    res = json.loads(out.read_text())
    assert sorted(res["modes"]) == ["cpu_only", "memcpy", "memcpy_pinned", "ours_device", "ours_pageable",
                                    "ours_pinned", "torch_pinned"]
    # every delivering mode was checked batch by batch against the CPU batches first
    assert res["wrong"] == dict.fromkeys(["cpu_only", "ours_device", "ours_pinned", "torch_pinned", "ours_pageable"], 0)
    # 2 shards of 4,096 rows, each read twice (hard links), in batches of 256: every mode delivers
    # the whole epoch in each rep, with the time to the first batch apart and the loop's CPU per batch
    for mode in ("cpu_only", "ours_device", "ours_pinned", "torch_pinned", "ours_pageable", "memcpy"):
        assert [r["batches"] for r in res["modes"][mode]] == [64, 64], (mode, res["modes"][mode])
        assert all(r["gb_s"] > 0 and r["cpu_us_per_batch"] > 0 for r in res["modes"][mode])
    assert all(r["first_s"] > 0 for r in res["modes"]["ours_device"]) and res["matmul_ms"] > 0
    assert len(res["modes"]["memcpy_pinned"]) == 2
    refused = subprocess.run([sys.executable, str(GPU_FEED), "--shards", "1"], capture_output=True, text=True,
                             timeout=120, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert refused.returncode == 1 and "needs torch with CUDA and a GPU" in refused.stderr
    assert "--rehearse checks the script without one" in refused.stderr


@pytest.mark.parametrize("options", [dict(pin_memory=True), dict(device="cuda:0")])
def test_provenance_travels_with_its_batch_through_pinning_and_the_device_copy(big, monkeypatch, options):
    monkeypatch.setattr(_device, "BACKEND", FakeCuda())
    kw = dict(batch_size=8, shuffle=True, seed=4, provenance=True)
    want = [(b["y"].clone(), b["_file"], b["_row_index"].clone())
            for b in loader(SafetensorsIterableDataset(big, **kw), num_workers=2)]
    got = [(b["y"].clone(), b["_file"], b["_row_index"].clone())
           for b in loader(SafetensorsIterableDataset(big, **kw), num_workers=2, **options)]
    assert len(got) == len(want) == 50
    for (y, files, rows), (wy, wfiles, wrows) in zip(got, want):
        assert torch.equal(y, wy) and files == wfiles and torch.equal(rows, wrows)
        # y is the sample's id; shard k of `big` holds ids 150·k … (rows from 0)
        assert [int(f.split("-")[1]) * 150 + r for f, r in zip(files, rows.tolist())] == y.tolist()
