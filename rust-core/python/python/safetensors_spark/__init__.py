"""Train PyTorch models from datasets written by ``df.write.format("safetensors")``.

* :func:`open_dataset` — the dataset: ``len``, ``columns``, ``manifest``, ``ds[i]``, ``ds.get(key)``;
  ``version=`` / ``timestamp=`` read an earlier committed version.
* :func:`history` — the dataset's versions: time, operation, rows and bytes added and removed.
* :mod:`safetensors_spark.torch` — ``SafetensorsDataset``, ``SafetensorsIterableDataset``, ``loader``
  (imports torch; imported on first use of the attribute).
* :mod:`safetensors_spark.spark` — ``configure(SparkSession.builder)`` with the connector jar.
* :mod:`safetensors_spark.mlflow` — ``log_input(path)``: the dataset as an MLflow dataset input.

The format rules (header validation, manifest fields, shard names) are the Rust engine's, in the
native module ``safetensors_spark._native``; see spec/python.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._dataset import Dataset, Ragged, history, open_dataset
from ._filter import Filter
from ._errors import (
    ColumnNotFoundError,
    IndexFileError,
    KeyNotFoundError,
    ManifestError,
    SafetensorsSparkError,
    ShardError,
    StateError,
)
from ._native import VERSION as __version__

if TYPE_CHECKING:
    import os
    from collections.abc import Iterable, Sequence
    from types import ModuleType

__all__ = [
    "open_dataset",
    "vacuum",
    "compact",
    "delete_keys",
    "delete_rows",
    "history",
    "Dataset",
    "Ragged",
    "Filter",
    "SafetensorsSparkError",
    "ManifestError",
    "ShardError",
    "IndexFileError",
    "KeyNotFoundError",
    "ColumnNotFoundError",
    "StateError",
    "__version__",
]


def _flag(command: str, name: str, value: Any) -> bool:
    """A boolean argument: ``True`` or ``False`` only (``1``, ``"yes"`` are refused naming it:
    a value that is not what it must be is never read as false, issue #39)."""
    if not isinstance(value, bool):
        raise ValueError(f"{command}: {name}={value!r}: expected True or False")
    return value


def _whole(command: str, name: str, value: Any) -> int | None:
    """A count argument: None or an integer ≥ 0 (not a bool; the engine then says which values
    the dataset takes, e.g. ``batch_size`` 0), else refused naming it."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ValueError(f"{command}: {name}={value!r}: expected a whole number (or None)")
    return value


def _local(command: str, path: str | os.PathLike[str], spark_call: str | None = None) -> str:
    """The local path of ``path``; a URL (``s3://…``) is refused naming the Spark entry point
    (``spark_call``, default ``safetensors_spark.spark.<command>(spark, path)``)."""
    import os

    p = os.fspath(path)
    if isinstance(p, str) and "://" in p and not p.startswith("file://"):
        raise ValueError(f"{command}: {p}: local paths only; for a dataset on an object store or HDFS "
                         f"use {spark_call or f'safetensors_spark.spark.{command}(spark, path)'}")
    return p[len("file://"):] if isinstance(p, str) and p.startswith("file://") else p


def vacuum(path: str | os.PathLike[str], retention: str | None = None, dry_run: bool = False,
           allow_shorter_retention: bool = False) -> dict[str, Any]:
    """Deletes the shards of a local dataset that no version inside the retention period lists
    (spec/dataset.md §5.8.1) and commits a ``vacuum`` version; ``dry_run`` only lists them.

    ``retention``: ``"<n> seconds|minutes|hours|days"`` or ``"0"``; None for the dataset's own
    (default 7 days). A shorter one than the dataset's needs ``allow_shorter_retention=True``.
    Returns ``{"plan": {...}, "dry_run": bool, "version": int or None}``. Progress (files
    deleted): INFO records of the ``safetensors_spark.progress`` logger (spec/python.md §1.1).
    """
    import json
    import os

    from . import _native, _progress

    if retention is not None and not isinstance(retention, str):
        raise ValueError(f"vacuum: retention={retention!r}: expected a string, '<n> seconds|minutes|"
                         f"hours|days' or '0' (e.g. retention='7 days'), or None")
    dry_run = _flag("vacuum", "dry_run", dry_run)
    allow_shorter_retention = _flag("vacuum", "allow_shorter_retention", allow_shorter_retention)
    path = _local("vacuum", path)
    return json.loads(_native.vacuum(os.fspath(path), retention, dry_run, allow_shorter_retention,
                                     _progress.native_callback(f"vacuum {os.fspath(path)}", "files deleted")))


def compact(path: str | os.PathLike[str], batch_size: int | None = None, target_shard_size_mb: int | None = None,
            partitions: str | Sequence[str] = (), dry_run: bool = False,
            commit_message: str | None = None) -> list[dict[str, Any]]:
    """Merges the small shards of a local dataset into full ones as one ``compaction`` version,
    the same rows and values (spec/dataset.md §5.8.2); ``dry_run`` only returns the plan.

    Batch layout: shards with fewer than ``batch_size`` rows (the dataset's; giving another is an
    error) are cut again at ``batch_size``. KV layout: shards smaller than
    ``target_shard_size_mb`` (default 300) are packed whole. ``partitions``: ``"column=value"``
    strings choosing partition datasets of a ``partitionBy`` root (default: all). Returns one
    ``{"dataset", "plan", "dry_run", "version", "committed_on", "replaced_deleted"}`` per dataset
    directory. A dataset with a tensor index is refused (use ``safetensors-spark compact``).
    Progress (new shards written, bytes read): INFO records of the ``safetensors_spark.progress``
    logger (spec/python.md §1.1).
    """
    import json
    import os

    from . import _native, _progress

    if isinstance(partitions, str):
        partitions = [partitions]
    path = _local("compact", path)
    batch_size = _whole("compact", "batch_size", batch_size)
    target_shard_size_mb = _whole("compact", "target_shard_size_mb", target_shard_size_mb)
    dry_run = _flag("compact", "dry_run", dry_run)
    if commit_message is not None and not isinstance(commit_message, str):
        raise ValueError(f"compact: commit_message={commit_message!r}: expected a string or None")
    return json.loads(_native.compact(os.fspath(path), batch_size, target_shard_size_mb, list(partitions),
                                      dry_run, commit_message,
                                      _progress.native_callback(f"compact {os.fspath(path)}", "shards written")))


def delete_keys(path: str | os.PathLike[str], keys: Iterable[str], dry_run: bool = False,
                commit_message: str | None = None) -> dict[str, Any]:
    """Deletes ``keys`` from the local KV dataset at ``path`` as one ``delete`` version
    (spec/dataset.md §5.11, copy-on-write): each shard holding one of them is rewritten without
    it; keys the dataset does not hold are ignored. Returns ``{"dataset", "plan", "dry_run",
    "version", "committed_on", "rows_removed", "replaced_deleted"}`` (``version`` None when
    nothing matched or dry). The replaced shards stay for the retention period; a vacuum then
    removes their bytes. A dataset with a tensor index is refused (use ``safetensors-spark
    delete --keys``)."""
    import json
    import os

    from . import _native

    path = _local("delete_keys", path, "safetensors_spark.spark.delete_keys(spark, path, keys)")
    if isinstance(keys, (str, bytes)):
        raise ValueError("delete_keys: keys must be an iterable of strings, not one string")
    key_list = list(keys)
    bad = [k for k in key_list if not isinstance(k, str)]
    if bad:
        raise ValueError(f"delete_keys: keys must be strings; got {bad[0]!r}")
    dry_run = _flag("delete_keys", "dry_run", dry_run)
    if commit_message is not None and not isinstance(commit_message, str):
        raise ValueError(f"delete_keys: commit_message={commit_message!r}: expected a string or None")
    out: dict[str, Any] = json.loads(_native.delete(os.fspath(path), keys=key_list, dry_run=dry_run,
                                                    commit_message=commit_message))
    return out


def delete_rows(path: str | os.PathLike[str], rows: Iterable[tuple[str, int]], dry_run: bool = False,
                commit_message: str | None = None) -> dict[str, Any]:
    """Deletes rows of the local batch dataset at ``path`` as one ``delete`` version
    (spec/dataset.md §5.11): ``rows`` are ``(shard, row_index)`` pairs, as provenance gives them
    (``open_dataset(path, provenance=True)``: ``_file`` — a shard name or path, its last
    component is used — and ``_row_index``). The shards holding them are rewritten without them
    (kept rows cut again at ``batch_size``). Returns the outcome as :func:`delete_keys` does."""
    import json
    import os

    from . import _native

    path = _local("delete_rows", path, "safetensors_spark.spark.delete(spark, path, \"_file = '…' AND "
                                       "_row_index = …\")")
    by_shard: dict[str, list[int]] = {}
    for item in rows:
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)
                and isinstance(item[1], int) and not isinstance(item[1], bool) and item[1] >= 0):
            raise ValueError(f"delete_rows: each row is a (shard, row_index) pair with row_index >= 0; "
                             f"got {item!r}")
        by_shard.setdefault(item[0].replace("\\", "/").rsplit("/", 1)[-1], []).append(item[1])
    dry_run = _flag("delete_rows", "dry_run", dry_run)
    if commit_message is not None and not isinstance(commit_message, str):
        raise ValueError(f"delete_rows: commit_message={commit_message!r}: expected a string or None")
    out: dict[str, Any] = json.loads(_native.delete(os.fspath(path), rows=by_shard, dry_run=dry_run,
                                                    commit_message=commit_message))
    return out


def __getattr__(name: str) -> ModuleType:
    # `safetensors_spark.torch` / `.spark` / `.mlflow` without importing torch, pyspark or mlflow
    # at package import.
    if name in ("torch", "spark", "mlflow"):
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'safetensors_spark' has no attribute '{name}'")
