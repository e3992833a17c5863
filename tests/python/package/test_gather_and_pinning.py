"""The Rust gather of shuffled batches (one call across columns and shards), and loader()'s pinned
delivery: pooled pinned blocks and the one-batch-ahead device copy (spec/python.md §3.1, §3.3).
CI has no GPU: pinning and the device copy are exercised through an injected backend
(``_device.BACKEND``) that records what CUDA would be asked to do; only the "no CUDA" error uses
the real torch.cuda."""

import gc
import weakref

import ml_dtypes
import numpy as np
import pytest
import torch

import handmade
from safetensors_spark.torch import SafetensorsDataset, SafetensorsIterableDataset, loader
from safetensors_spark.torch._reader import gather_rows

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
