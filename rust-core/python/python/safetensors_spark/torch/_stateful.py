"""Resume under torchdata's ``StatefulDataLoader`` and live workers (spec/python.md §5.1).

* Inside a DataLoader worker, ``SafetensorsIterableDataset.state_dict()`` gives a *worker state*:
  where this worker's iterator stands (the iterator's epoch and start position, the worker's
  batches yielded so far). ``StatefulDataLoader`` collects one per worker and gives each back to
  its worker on resume (same ``num_workers``), which then skips the batches it had yielded.
* A whole ``StatefulDataLoader.state_dict()`` given to the dataset's ``load_state_dict()`` in the
  training process is turned into the dataset's own state ``(epoch, position)``: the batches the
  loop took from the iterator (``_snapshot_step + _steps_since_snapshot``) dealt from the
  iterator's start as the run dealt them. That state resumes exactly with any worker count and
  world size.
* :class:`LiveEpoch`: the epoch and start position of the next iterator in a small
  shared-memory tensor, which workers read when an iterator starts, so ``set_epoch()`` and
  ``load_state_dict()`` reach workers that outlive an iterator (``persistent_workers=True``).
"""

import torch

from .._errors import StateError

# the fields of a worker state beside the order settings the dataset checks for every state
WORKER_RUN_FIELDS = ("rank", "world_size", "batch_size", "drop_last")


class LiveEpoch:
    """``[epoch, start position, start segment]`` in shared memory: written by the training
    process before an iterator's workers start or resume, read by each worker when its iterator
    starts (the segment: a following dataset's, spec/python.md §3.6; 0 otherwise)."""

    def __init__(self):
        self.values = torch.zeros(3, dtype=torch.int64).share_memory_()

    def publish(self, epoch, start, segment=0):
        self.values[0], self.values[1], self.values[2] = int(epoch), int(start), int(segment)

    def read(self):
        epoch, start, _ = self.values.tolist()
        return epoch, start

    def segment(self):
        return int(self.values[2])


def worker_state(ds, common, progress):
    """A DataLoader worker's state: ``common`` (version, order settings, fingerprint) with the
    worker, its iterator's epoch and start, the batches it yielded, and the run's rank split."""
    info = torch.utils.data.get_worker_info()
    if progress is None:  # no iterator yet in this worker: the one it would start
        epoch, start, _ = ds._worker_start(peek=True)
        yielded = 0
    else:
        epoch, start, yielded = progress["epoch"], progress["start"], progress["consumed"]
    return {
        **common,
        "epoch": epoch,
        "start": start,
        "worker": {"id": info.id, "workers": info.num_workers, "yielded": yielded},
        "rank": ds.rank,
        "world_size": ds.world_size,
        "batch_size": ds.batch_size,
        "drop_last": ds.drop_last,
    }


def load_worker_state(ds, state):
    """In a worker: the resume point ``(epoch, start, yielded)`` of this worker's next iterator.
    Only the run that saved it can use it (same workers, ranks, batch size): anything else is
    refused, naming the field and what resumes instead."""
    info = torch.utils.data.get_worker_info()
    hint = ("a worker state resumes only the same split; for another worker count, world size or "
            "batch_size call dataset.load_state_dict(<the StatefulDataLoader's state_dict()>) in the "
            "training process and start the new loader without its load_state_dict() "
            "(spec/python.md §5.1)")
    if info is None:
        raise StateError(f"cannot resume: this is one DataLoader worker's state (worker "
                         f"{state['worker'].get('id')!r}); load the whole StatefulDataLoader.state_dict() "
                         f"instead, which holds every worker's")
    w = state["worker"]
    for field, saved, mine in (("workers", w.get("workers"), info.num_workers), ("worker", w.get("id"), info.id),
                               *((f, state.get(f), getattr(ds, f)) for f in WORKER_RUN_FIELDS)):
        if saved != mine:
            raise StateError(f"cannot resume: worker state has {field}={saved!r}, this loader has {mine!r}: {hint}")
    yielded = w.get("yielded")
    if not _whole(yielded) or not _whole(state.get("start")):
        raise StateError(f"worker state start/yielded must be integers >= 0, got "
                         f"{state.get('start')!r}/{yielded!r}")
    return state["epoch"], state["start"], yielded


def from_loader_state(ds, state):
    """The dataset state ``{.., epoch, position}`` of a ``StatefulDataLoader.state_dict()``.

    With ``num_workers=0`` torchdata keeps the dataset's own state (``dataset_state``). With
    workers it keeps one worker state per worker and counts the batches the loop took from the
    iterator (``_snapshot_step`` at the last snapshot + ``_steps_since_snapshot``); every rank
    took as many, so ``position`` = the iterator's start + those batches dealt as the saving run
    dealt them (its world size and batch size, from the worker states)."""
    if "_snapshot" not in state:
        inner = state.get("dataset_state")
        if not isinstance(inner, dict):
            raise StateError("cannot resume: this StatefulDataLoader state holds no SafetensorsIterableDataset "
                             "state (dataset_state is missing): was it saved from a loader over this dataset?")
        return inner
    snap = state["_snapshot"]
    workers = snap.get("_worker_snapshots") or {}
    states = [(w or {}).get("dataset_state") for w in workers.values()]
    if not states or any(not isinstance(s, dict) or "worker" not in s for s in states):
        raise StateError("cannot resume: this StatefulDataLoader state lacks a SafetensorsIterableDataset worker "
                         "state for some worker (dataset_state); was it saved from a loader over this dataset?")
    first = states[0]
    for s in states[1:]:
        for field in ("epoch", "start", *WORKER_RUN_FIELDS):
            if s.get(field) != first.get(field):
                raise StateError(f"cannot resume: the workers' states disagree on {field} "
                                 f"({first.get(field)!r} vs {s.get(field)!r}): not one iterator's state")
    taken = snap.get("_snapshot_step", 0) + state.get("_steps_since_snapshot", 0)
    if not _whole(taken) or not _whole(first.get("start")):
        raise StateError(f"cannot resume: StatefulDataLoader state counts {taken!r} batches from "
                         f"start {first.get('start')!r}; both must be integers >= 0")
    plan = ds._plan(first["start"], world_size=first["world_size"], batch_size=first["batch_size"],
                    drop_last=first["drop_last"])
    if taken > plan.num_batches:
        raise StateError(f"cannot resume: StatefulDataLoader state says {taken} batches were taken, but a rank "
                         f"has only {plan.num_batches} in epoch {first['epoch']} from position {first['start']}")
    out = {k: v for k, v in first.items() if k not in ("start", "worker", *WORKER_RUN_FIELDS)}
    out["position"] = min(plan.position_after(taken), ds._units())
    return out


def _whole(v):
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0
