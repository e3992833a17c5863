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

import importlib

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

__all__ = [
    "open_dataset",
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


def __getattr__(name):
    # `safetensors_spark.torch` / `.spark` / `.mlflow` without importing torch, pyspark or mlflow
    # at package import.
    if name in ("torch", "spark", "mlflow"):
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'safetensors_spark' has no attribute '{name}'")
