"""The Rust block builder of token packing (spec/python.md §3.3; `_native.Packer`, used for
local shards) against the numpy reference (`PackedEpoch.reference_blocks`, the remote path) on
random ragged datasets, through the loader with and without workers, with a resume mid-epoch;
and the packing's ids options (which ids, their dtype) with their errors."""

import numpy as np
import pytest
import torch

import handmade
from safetensors_spark.torch import Packing, SafetensorsIterableDataset, loader
from safetensors_spark._packing import PackedEpoch

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")

IDS = [("position_ids", "document_ids"), ("position_ids",), ("document_ids",), ()]


def random_dataset(path, seed, dtype):
    """Shards of random sizes; document lengths 0..~60 with a few much longer than
    any block; tokens random in the dtype's range; empty pad rows after some shards."""
    rng = np.random.default_rng(seed)
    sizes = [int(n) for n in rng.integers(1, 40, rng.integers(2, 6))]
    n = sum(sizes)
    lengths = np.minimum(rng.lognormal(2.5, 1.0, n).astype(int), 200)
    lengths[rng.random(n) < 0.1] = 0
    lengths[rng.integers(0, n, 2)] = rng.integers(100, 200, 2)
    info = np.iinfo(handmade._numpy_dtype(dtype))
    rows = [rng.integers(info.min, info.max, k, endpoint=True) for k in lengths]
    padded = [int(p) for p in rng.integers(0, 3, len(sizes))]
    handmade.write_ragged_dataset(path, sizes, {"tokens": ("ragged", dtype, rows, "array")}, padded=padded)


def epoch_of(ds):
    return PackedEpoch(ds.dataset, ds.pack, ds._order(), ds._lengths)


@pytest.mark.parametrize("seed,dtype", [(0, "I32"), (1, "U16"), (2, "I64"), (3, "U8")])
def test_the_rust_builder_writes_the_reference_blocks(tmp_path, seed, dtype):
    path = str(tmp_path / "ds")
    random_dataset(path, seed, dtype)
    rng = np.random.default_rng(100 + seed)
    for eos in (None, 7):
        for seq_len in (1, 13, 64):
            for ids, ids_dtype in zip(IDS, ("int64", "int32", "int64", "int32")):
                pack = Packing("tokens", seq_len, eos=eos, ids=ids, ids_dtype=ids_dtype)
                ds = SafetensorsIterableDataset(path, batch_size=3, shuffle=True, seed=seed, pack=pack)
                ds.set_epoch(int(rng.integers(0, 5)))
                epoch = epoch_of(ds)
                nb = epoch.num_blocks
                assert nb > 3
                spans = [(0, nb), (nb - 1, nb)] + [tuple(sorted(rng.choice(nb + 1, 2, replace=False)))
                                                   for _ in range(4)]
                for b0, b1 in spans:
                    got, want = epoch.blocks(b0, b1), epoch.reference_blocks(b0, b1)
                    assert sorted(got) == sorted(["tokens", "cu_seqlens", *ids])
                    what = f"seed {seed} eos {eos} seq_len {seq_len} ids {ids} blocks [{b0}, {b1})"
                    for name, a in got.items():
                        assert a.dtype == (epoch.dtype if name == "tokens" else np.int32 if name == "cu_seqlens"
                                           else np.dtype(ids_dtype)), what
                        assert np.array_equal(a, want[name]), f"{name}: {what}"


def flat(batches, names):
    """Batches → per name the blocks laid end to end (cu_seqlens as the block-relative cuts)."""
    out = {n: [] for n in names}
    for b in batches:
        for n in names:
            if n == "cu_seqlens":
                seq = b["tokens"].shape[-1]
                cu = b[n].tolist()
                for i in range(len(b["tokens"])):
                    out[n].append([c - i * seq for c in cu if i * seq <= c <= (i + 1) * seq])
            else:
                out[n] += b[n].reshape(-1).tolist()
    return out


def test_the_loader_delivers_the_reference_blocks_with_workers_and_resumes_mid_epoch(tmp_path):
    path = str(tmp_path / "ds")
    random_dataset(path, 5, "I32")
    pack = Packing("tokens", 16, eos=-1, ids=("position_ids",), ids_dtype=torch.int32)
    names = ["tokens", "position_ids", "cu_seqlens"]
    kw = dict(batch_size=2, shuffle=True, seed=9, pack=pack)
    ds = SafetensorsIterableDataset(path, **kw)
    ds.set_epoch(1)
    ref = epoch_of(ds)
    want = [ref.reference_blocks(b, b + 1) for b in range(ref.num_blocks)]
    want = flat([{n: torch.from_numpy(w[n]) for n in names} for w in want], names)
    for workers, handoff in ((0, None), (2, None), (2, 3)):
        ds = SafetensorsIterableDataset(path, **kw)
        ds.set_epoch(1)
        got = list(loader(ds, num_workers=workers, handoff_batches=handoff))
        assert all(b["position_ids"].dtype == torch.int32 and "document_ids" not in b for b in got)
        assert flat(got, names) == want, f"{workers} workers"
    # resume mid-epoch: 3 batches with 2 workers, the rest with none (and the other way round)
    for first, then in ((2, 0), (0, 2)):
        ds = SafetensorsIterableDataset(path, **kw)
        ds.set_epoch(1)
        head = []
        for b in loader(ds, num_workers=first):
            head.append(b)
            if len(head) == 3:
                break
        state = ds.state_dict()
        again = SafetensorsIterableDataset(path, **kw)
        again.load_state_dict(state)
        tail = list(loader(again, num_workers=then))
        assert flat(head + tail, names) == want, f"resume {first} → {then} workers"


def test_packing_ids_options_name_what_is_wrong():
    for ids in ("position_ids", ("position_ids", "position_ids"), ("positions",), None, 3):
        with pytest.raises(ValueError, match=r"Packing: ids must be a list of distinct names out of "
                                             r"\['position_ids', 'document_ids'\].*got"):
            Packing("tokens", 8, ids=ids)
    for dt in ("int16", torch.float32, np.uint32, None, True, "float"):
        with pytest.raises(ValueError, match=r"Packing: ids_dtype must be int32 or int64.*got"):
            Packing("tokens", 8, ids_dtype=dt)
    with pytest.raises(ValueError, match=r"seq_len=4294967296 has positions beyond int32"):
        Packing("tokens", 2 ** 32, ids_dtype="int32")
    Packing("tokens", 2 ** 32, ids=("document_ids",), ids_dtype="int32")  # no positions: no limit
    p = Packing("tokens", 8, ids=["document_ids", "position_ids"], ids_dtype=np.int32)
    assert p.ids == ("position_ids", "document_ids") and p.ids_dtype == np.int32
    assert Packing("tokens", 8).ids_dtype == np.int64 and Packing("tokens", 8, ids_dtype=torch.int64).ids == p.ids
    # the ids carried do not decide the blocks: a state resumes with any
    assert p._state() == Packing("tokens", 8, ids=())._state()
