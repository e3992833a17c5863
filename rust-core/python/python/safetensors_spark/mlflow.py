"""A dataset written by ``df.write.format("safetensors")`` as an MLflow dataset input.

    import mlflow
    from safetensors_spark.mlflow import log_input
    with mlflow.start_run():
        log_input("/data/train", context="training")        # or s3://bucket/train

The dataset is opened with :func:`safetensors_spark.open_dataset` (manifest parsed and checked by
the Rust engine, shard sizes checked), so only a committed, consistent dataset can be logged.

* ``source``: the dataset's path, resolved by MLflow (local path, ``s3://``, ``gs://``, …).
* ``digest``: the first 16 hex digits of the SHA-256 of the manifest's canonical JSON. Every
  commit writes a new ``manifest_version`` and new shard names, so a digest names exactly one
  committed state of the dataset; logging the same state twice gives the same digest.
* ``schema``: the manifest's ``schema`` (column → ``dtype`` and ``shape``, as published).
* ``profile``: samples, bytes, shards, layout, padded and dropped samples, manifest version.
  The version is the one to read back: ``open_dataset(path, version=d.version)`` (or
  ``spark.read.option("versionAsOf", …)``) gives exactly the logged samples while the version is
  retained (spec/dataset.md §5.8), and its manifest has the logged digest.

See spec/python.md §7. Needs ``mlflow`` (or ``mlflow-skinny``), imported on first use.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from typing import Any

from ._dataset import Dataset as _SafetensorsDataset, open_dataset

__all__ = ["dataset", "log_input", "manifest_digest"]


def _mlflow() -> tuple[Any, Any, Any]:
    try:
        import mlflow
        from mlflow.data.dataset import Dataset
        from mlflow.data.dataset_source_registry import resolve_dataset_source
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("safetensors_spark.mlflow needs mlflow: pip install mlflow-skinny") from e
    return mlflow, Dataset, resolve_dataset_source


def manifest_digest(manifest: Mapping[str, Any]) -> str:
    """The digest MLflow records for a dataset: 16 hex digits of SHA-256 of the canonical manifest."""
    canonical = json.dumps(manifest, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]


def _profile(manifest: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "num_samples": manifest["total_samples"],
        "num_bytes": manifest["total_bytes"],
        "num_shards": len(manifest["shards"]),
        "layout": manifest.get("layout"),
        "padded_samples": manifest.get("padded_samples", 0),
        "dropped_samples": manifest.get("dropped_samples", 0),
        "manifest_version": manifest.get("manifest_version"),
    }


_CLASS: Any = None


def _dataset_class() -> Any:
    """``SafetensorsMlflowDataset``, a subclass of mlflow's ``Dataset`` (made once, on first use,
    so that importing this module does not import mlflow)."""
    global _CLASS
    if _CLASS is None:
        _, Dataset, resolve_dataset_source = _mlflow()

        class SafetensorsMlflowDataset(Dataset):  # type: ignore[misc, valid-type]  # mlflow's, imported at run time
            def __init__(self, ds: _SafetensorsDataset, name: str | None = None) -> None:
                self.manifest = ds.manifest
                self.path = ds.path
                #: the manifest version logged (read it back with ``open_dataset(path, version=…)``)
                self.version = ds.version
                default_name = ds.path.rstrip("/").rsplit("/", 1)[-1] or ds.path
                super().__init__(source=resolve_dataset_source(ds.path), name=name or default_name,
                                 digest=manifest_digest(ds.manifest))

            def _compute_digest(self) -> str:
                return manifest_digest(self.manifest)

            @property
            def schema(self) -> dict[str, Any]:
                return self.manifest["schema"]

            @property
            def profile(self) -> dict[str, Any]:
                return _profile(self.manifest)

            def to_dict(self) -> dict[str, str]:
                out = super().to_dict()
                out.update({"schema": json.dumps(self.schema), "profile": json.dumps(self.profile)})
                return out

        _CLASS = SafetensorsMlflowDataset
    return _CLASS


def dataset(path: str | os.PathLike[str], *, name: str | None = None,
            storage_options: Mapping[str, Any] | None = None, version: int | None = None) -> Any:
    """The MLflow dataset of the safetensors dataset at ``path`` (see the module docs): its
    current state, or committed version ``version``."""
    ds = open_dataset(path, storage_options=storage_options, check_headers=False, version=version)
    return _dataset_class()(ds, name)


def log_input(path: str | os.PathLike[str], *, context: str | None = None, name: str | None = None,
              storage_options: Mapping[str, Any] | None = None, version: int | None = None) -> Any:
    """Logs the dataset at ``path`` (its current state, or version ``version``) as an input of
    the active MLflow run (starting one if needed, as ``mlflow.log_input`` does); returns the
    logged dataset, whose ``version`` and ``digest`` name the state logged."""
    mlflow, _, _ = _mlflow()
    d = dataset(path, name=name, storage_options=storage_options, version=version)
    mlflow.log_input(d, context=context)
    return d
