"""safetensors_spark.torch under torchdata's StatefulDataLoader, torch.distributed.checkpoint (DCP)
and persistent workers (spec/python.md §3.1, §5.1): every resume gives the samples of the
uninterrupted in-process run, in its order (the references of test_torch_datasets.py)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

import handmade
from safetensors_spark import StateError
from safetensors_spark.torch import SafetensorsDataset, SafetensorsIterableDataset, loader
from test_torch_datasets import N, SIZES, _free_port, global_order, ids_of

HERE = Path(__file__).resolve().parent
pytestmark = [pytest.mark.filterwarnings("ignore:This DataLoader will create"),
              pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")]
KW = dict(batch_size=3, shuffle=True, seed=5)


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
    dl = StatefulDataLoader(dataset(data, 1), batch_size=None, num_workers=workers, snapshot_every_n_steps=3)
    head = ids_of(take(dl, 4))
    state = dl.state_dict()
    same = StatefulDataLoader(dataset(data, 1), batch_size=None, num_workers=workers, snapshot_every_n_steps=3)
    same.load_state_dict(state)
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


def test_dcp_saves_the_loader_of_a_two_rank_job_and_one_rank_resumes_it(data, tmp_path):
    """A real 2-rank gloo job takes 3 batches of epoch 1 per rank, then saves a model and its
    loader with torch.distributed.checkpoint; this process (one rank, 2 workers) loads both and
    continues the epoch's global order exactly."""
    port, ckpt = _free_port(), tmp_path / "ckpt"
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2")
    procs = [subprocess.Popen([sys.executable, str(HERE / "dcp_worker.py"), data, str(ckpt),
                               str(tmp_path / f"rank{r}.txt")], env=dict(env, RANK=str(r))) for r in range(2)]
    assert [p.wait(timeout=300) for p in procs] == [0, 0]
    per_rank = [[int(v) for v in (tmp_path / f"rank{r}.txt").read_text().split()] for r in range(2)]
    head = [i for j in range(0, 6, 2) for r in range(2) for i in per_rank[r][j:j + 2]]
    model = torch.nn.Linear(3, 2)
    torch.nn.init.zeros_(model.weight)
    ds = SafetensorsIterableDataset(data, batch_size=2, shuffle=True, seed=21)
    dl = loader(ds, num_workers=2)
    state = {"model": model.state_dict(), "data": dl}
    dcp.load(state, checkpoint_id=str(ckpt))
    model.load_state_dict(state["model"])
    torch.manual_seed(0)
    assert torch.equal(model.weight, torch.nn.Linear(3, 2).weight)
    assert (ds.epoch, ds.state_dict()["position"]) == (1, 12)
    assert head + ids_of(list(dl)) == reference(data, 1, batch_size=2, seed=21)


def test_states_that_cannot_resume_exactly_are_refused(data, tmp_path):
    dl = StatefulDataLoader(dataset(data), batch_size=None, num_workers=2)
    take(dl, 3)
    state = dl.state_dict()
    # torchdata restores per-worker states only with the same num_workers: ours says so, and how
    three = StatefulDataLoader(dataset(data), batch_size=None, num_workers=3)
    three.load_state_dict(state)
    with pytest.raises(StateError, match=r"workers=2, this loader has 3.*dataset.load_state_dict"):
        list(three)
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
