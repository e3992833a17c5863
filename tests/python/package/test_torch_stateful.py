"""safetensors_spark.torch under torchdata's StatefulDataLoader, torch.distributed.checkpoint (DCP)
and persistent workers (spec/python.md §3.1, §5.1): every resume gives the samples of the
uninterrupted in-process run, in its order (the references of test_torch_datasets.py)."""

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

import handmade
from safetensors_spark import StateError
from safetensors_spark.torch import Packing, SafetensorsDataset, SafetensorsIterableDataset, loader
from test_torch_datasets import N, SIZES, global_order, ids_of

pytestmark = [pytest.mark.filterwarnings("ignore:This DataLoader will create"),
              pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")]
KW = dict(batch_size=3, shuffle=True, seed=5)
_FAILED_AT_START = []


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = tmp_path_factory.mktemp("stateful") / "ds"
    handmade.write_batch_dataset(str(path), SIZES, padded=[1, 0, 0, 2, 0], batch_size=10)
    return str(path)


def dataset(path, epoch=0, **kw):
    ds = SafetensorsIterableDataset(path, **{**KW, **kw})
    ds.set_epoch(epoch)
    return ds


def reference(path, epoch, **kw):
    """The uninterrupted epoch, read in this process."""
    return ids_of(list(dataset(path, epoch, **kw)))


def take(dl, k):
    out = []
    for b in dl:
        out.append(b)
        if len(out) == k:
            break
    return out


@pytest.mark.parametrize("workers", [0, 2])
def test_stateful_dataloader_resumes_exactly_with_its_state_and_with_another_worker_count(data, workers):
    """torchdata's own resume (same num_workers: per-worker states, a snapshot every 3 steps, so
    a resume after 4 batches replays one) and ours (the dataset loads the StatefulDataLoader's
    state: the batches taken, dealt from the iterator's start; then any worker count)."""
    full = reference(data, 1)
    assert sorted(full) == list(range(N))
    head, state, same = handmade.stateful_resumed(lambda: dataset(data, 1), 4, num_workers=workers, snapshot_every=3)
    head = ids_of(head)
    assert head + ids_of(list(same)) == full, "StatefulDataLoader's own resume"
    for other in {0: (2,), 2: (1, 3)}[workers]:
        ds = dataset(data)  # epoch 0: the state says 1
        ds.load_state_dict(state)
        assert {k: ds.state_dict()[k] for k in ("epoch", "position")} == {"epoch": 1, "position": 12}
        tail = ids_of(list(StatefulDataLoader(ds, batch_size=None, num_workers=other)))
        assert head + tail == full, f"{workers} workers resumed with {other}"


def test_stateful_dataloader_state_resumes_on_another_world_size(data):
    """Rank 0 of 2 stops under StatefulDataLoader (2 workers); its state, loaded by the dataset,
    continues the world-size-independent global order on 4 ranks."""
    kw = dict(batch_size=2, shuffle=True, seed=8)
    base, _ = global_order(data, 1, **kw)
    dl = StatefulDataLoader(SafetensorsIterableDataset(data, rank=0, world_size=2, **kw), batch_size=None,
                            num_workers=2)
    take(dl, 3)
    ds = SafetensorsIterableDataset(data, **kw)
    ds.load_state_dict(dl.state_dict())
    state = ds.state_dict()
    assert state["position"] == 3 * 2 * 2
    order, _ = global_order(data, 4, state=state, **kw)
    assert base[:12] + order[: N - 12] == base


def test_persistent_workers_follow_set_epoch_and_load_state_dict(data):
    """The same worker processes serve every epoch: each epoch gives its own reference order
    (set_epoch reaches them), a load_state_dict between epochs resumes them mid-epoch, under
    loader() (several batches per message), StatefulDataLoader and a plain DataLoader; the
    map-style loader's workers get each iterator's new sample of indices."""
    ref = [reference(data, e) for e in range(2)]
    assert ref[0] != ref[1]
    for make in (lambda ds: loader(ds, num_workers=2, persistent_workers=True, handoff_batches=2),
                 lambda ds: StatefulDataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True),
                 lambda ds: DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True)):
        ds = dataset(data)
        dl, pids = make(ds), None
        for epoch in range(2):
            ds.set_epoch(epoch)
            assert ids_of(list(dl)) == ref[epoch], f"{type(dl).__name__}, epoch {epoch}"
            now = [w.pid for w in dl._iterator._workers]
            assert pids in (None, now), "persistent workers were restarted"
            pids = now
        ds.load_state_dict({**ds.state_dict(batches_consumed=0), "epoch": 0, "position": 9})
        assert ids_of(list(dl)) == ref[0][9:], type(dl).__name__
        assert [w.pid for w in dl._iterator._workers] == pids
    m = SafetensorsDataset(data)
    dl = loader(m, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(1), num_workers=2,
                persistent_workers=True)
    draws = torch.Generator().manual_seed(1)
    for epoch in range(2):
        want = [int(m[int(i)]["y"]) for i in torch.utils.data.RandomSampler(m, generator=draws)]
        assert ids_of(list(dl)) == want, f"map-style, iterator {epoch}"


def test_dcp_round_trip_of_model_and_loader_resumes_on_another_world_size(data, tmp_path):
    """torch.distributed.checkpoint saves a model and loader() (Stateful) after 4 batches (2
    workers); loaded into a fresh model and loader (3 workers) it continues the epoch exactly, and
    loaded into the datasets of 2 ranks it continues the global order (the 2-process gloo job of
    test_torch_datasets.py saves from 2 ranks and resumes on 1)."""
    kw = dict(batch_size=2, shuffle=True, seed=21)
    full = reference(data, 1, **kw)
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    dl = loader(dataset(data, 1, **kw), num_workers=2)
    head = ids_of(take(dl, 4))
    ckpt = str(tmp_path / "ckpt")
    with pytest.warns(UserWarning, match="single process"):
        dcp.save({"model": model.state_dict(), "data": dl}, checkpoint_id=ckpt)
    fresh = torch.nn.Linear(3, 2)
    torch.nn.init.zeros_(fresh.weight)
    resumed = loader(dataset(data, **kw), num_workers=3)
    state = {"model": fresh.state_dict(), "data": resumed}
    with pytest.warns(UserWarning, match="single process"):
        dcp.load(state, checkpoint_id=ckpt)
    assert torch.equal(fresh.weight, model.weight)
    assert (resumed.dataset.epoch, resumed.state_dict()["position"]) == (1, 8)
    assert head + ids_of(list(resumed)) == full
    ranks = [dataset(data, rank=r, world_size=2, **kw) for r in range(2)]
    for ds in ranks:
        with pytest.warns(UserWarning, match="single process"):
            dcp.load({"data": ds}, checkpoint_id=ckpt)
    per_rank = [ids_of(list(ds)) for ds in ranks]
    order = [i for j in range(0, len(per_rank[0]), 2) for r in range(2) for i in per_rank[r][j:j + 2]]
    assert head + order[: N - 8] == full


def test_states_that_cannot_resume_exactly_are_refused(data, tmp_path):
    dl = StatefulDataLoader(dataset(data), batch_size=None, num_workers=2)
    take(dl, 3)
    state = dl.state_dict()
    # torchdata restores per-worker states only with the same num_workers: ours says so, and how
    one = StatefulDataLoader(dataset(data), batch_size=None, num_workers=1)
    one.load_state_dict(state)
    with pytest.raises(StateError, match=r"workers=2, this loader has 1.*dataset.load_state_dict") as failed:
        list(one)
    # torch joins each worker of an iterator whose workers failed at start with a 5 s timeout when
    # the iterator is collected, and skips that at exit: keep it (its traceback) until then
    _FAILED_AT_START.append(failed.value.__traceback__)
    # another seed, another dataset: named
    with pytest.raises(StateError, match="seed=5, this dataset iterator has 6"):
        dataset(data, seed=6).load_state_dict(state)
    changed = tmp_path / "changed"
    handmade.write_batch_dataset(str(changed), [7, 5, 9, 3, 7])
    with pytest.raises(StateError, match="shards changed"):
        SafetensorsIterableDataset(str(changed), **KW).load_state_dict(state)
    # one worker's state is not the loader's
    worker = state["_snapshot"]["_worker_snapshots"]["worker_0"]["dataset_state"]
    with pytest.raises(StateError, match="one DataLoader worker's state"):
        dataset(data).load_state_dict(worker)
    # a map-style loader's order is its sampler's, which keeps no state; in_order=False: no prefix
    with pytest.raises(StateError, match="sampler keeps no resumable state"):
        loader(SafetensorsDataset(data), batch_size=2).state_dict()
    with pytest.raises(ValueError, match="in_order=False.*prefix"):
        loader(dataset(data), num_workers=1, in_order=False)


def test_packed_blocks_resume_under_stateful_dataloader(tmp_path):
    """Packing (§3.3) under StatefulDataLoader with 2 workers: its own resume and ours (to 1
    worker) give the brute-force reference blocks of test_ragged.py."""
    from handmade import as_blocks
    from test_ragged import PADDED, TOKENS, reference_blocks
    from test_ragged import SIZES as RAGGED_SIZES
    from test_ragged import N as RAGGED_N

    path = str(tmp_path / "ragged")
    handmade.write_ragged_dataset(path, RAGGED_SIZES, {"tokens": ("ragged", "I32", TOKENS, "array"),
                                                       "y": ("fixed", "I64", np.arange(RAGGED_N))},
                                  padded=PADDED, batch_size=10)
    want, _ = reference_blocks(path, 8, 7, True, 4, 1)

    def packed(epoch=1):
        ds = SafetensorsIterableDataset(path, batch_size=2, shuffle=True, seed=4, pack=Packing("tokens", 8, eos=7))
        ds.set_epoch(epoch)
        return ds

    dl = StatefulDataLoader(packed(), batch_size=None, num_workers=2)
    head = as_blocks(take(dl, 3), 8)
    state = dl.state_dict()
    same = StatefulDataLoader(packed(), batch_size=None, num_workers=2)
    same.load_state_dict(state)
    assert head + as_blocks(list(same), 8) == want
    ds = packed(0)
    ds.load_state_dict(state)
    assert ds.state_dict()["position"] == 6
    assert head + as_blocks(list(StatefulDataLoader(ds, batch_size=None, num_workers=1)), 8) == want
