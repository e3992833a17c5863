"""Row provenance in the torch iterable datasets, mixtures and ``loader()`` (spec/python.md §3.7).

Where each sample of a batch is stored, as Spark's hidden columns say it (spec/reading.md §2.1,
spec/dataset.md §5.11): ``_file`` (the shard's name, a list of str per batch), ``_row_index``
(the row among the shard's real rows, int64) and ``_added_version`` (the version that added the
shard, int64, -1 when the manifest does not record it), so ``delete_rows(path, zip(b["_file"],
b["_row_index"].tolist()))`` deletes them. The values are taken from the ``(shard, row)`` pairs
the batch was read with, in the process that reads it, and travel with the batch (in a
``loader()`` message: :class:`safetensors_spark.torch._handoff.Handoff`); nothing here runs when
provenance is off.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

NAMES = ("_file", "_row_index", "_added_version")
SOURCE = "_source"  # a mixture's: the index of the sample's source


def check_flag(provenance: Any) -> bool:
    if not isinstance(provenance, bool):
        raise ValueError(f"provenance must be True or False, got {provenance!r}")
    return provenance


def check_names(names: Iterable[str], what: str, extra: tuple[str, ...] = ()) -> None:
    """A column (or ``source_column``) named like a provenance key would be overwritten."""
    taken = sorted(set(names) & set(NAMES + extra))
    if taken:
        raise ValueError(f"provenance=True adds the keys {list(NAMES + extra)} to every batch, but {what} "
                         f"{taken} would be overwritten; select or rename the columns without them (or "
                         f"leave provenance off)")


def refuse_pack(what: str) -> None:
    raise ValueError(f"{what}: provenance=True with pack: a packed block is cut from many documents (and "
                     f"parts of them), so it has no one (_file, _row_index); read the dataset unpacked with "
                     f"provenance to trace samples, or use the block's document_ids (spec/python.md §3.7)")


class Provenance:
    """A dataset's shard names and added versions, to label read rows with."""

    def __init__(self, dataset: Any) -> None:
        self.names = [s.name for s in dataset.shards]
        self.added = np.array([-1 if s.added_version is None else s.added_version for s in dataset.shards],
                              dtype=np.int64)

    def arrays(self, shards: Any, rows: Any) -> dict[str, Any]:
        """``{_file: [str], _row_index: int64 array, _added_version: int64 array}`` of the rows
        ``rows[k]`` of shards ``shards[k]`` (dataset shard indices)."""
        s = np.asarray(shards, dtype=np.int64)
        names = self.names
        return {"_file": [names[i] for i in s.tolist()],
                "_row_index": np.array(rows, dtype=np.int64),  # a copy: never a view of a caller's array
                "_added_version": self.added[s]}

    def batch(self, batch: dict[str, Any], shards: Any, rows: Any) -> dict[str, Any]:
        """``batch`` with the provenance of its rows (tensors for the int64 ones)."""
        batch.update(as_torch(self.arrays(shards, rows)))
        return batch

    def single(self, sample: dict[str, Any], shard: int, row: int) -> dict[str, Any]:
        """``sample`` with its provenance, as the map-style dataset gives it (0-d int64 tensors)."""
        shard = int(shard)
        v = int(self.added[shard])
        sample["_file"] = self.names[shard]
        sample["_row_index"] = torch.tensor(int(row), dtype=torch.int64)
        sample["_added_version"] = torch.tensor(v, dtype=torch.int64)
        return sample


def as_torch(values: dict[str, Any]) -> dict[str, Any]:
    """Provenance values as a batch holds them: lists as they are, arrays as tensors."""
    return {k: v if isinstance(v, list) else torch.from_numpy(v) for k, v in values.items()}


def sliced(values: dict[str, Any], first: int, n: int) -> dict[str, Any]:
    """The provenance of rows ``[first, first + n)`` of a message's (lists and int64 arrays)."""
    return as_torch({k: v[first: first + n] for k, v in values.items()})
