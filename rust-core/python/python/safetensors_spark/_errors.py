"""Exceptions of the package: one base class, one subclass per kind of problem."""


class SafetensorsSparkError(Exception):
    """Base class of every error this package raises."""


class ManifestError(SafetensorsSparkError, ValueError):
    """``dataset_manifest.json`` is missing, unreadable, invalid, or lists an unsafe shard name."""


class ShardError(SafetensorsSparkError, ValueError):
    """A shard is missing, or its size or header disagrees with the manifest or the format."""


class IndexFileError(SafetensorsSparkError, ValueError):
    """``_tensor_index.parquet`` disagrees with the manifest or the shards."""


class _MessageKeyError(SafetensorsSparkError, KeyError):
    # KeyError's str() quotes its argument; these carry sentences.
    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class KeyNotFoundError(_MessageKeyError):
    """``Dataset.get(key)``: no sample has this key."""


class ColumnNotFoundError(_MessageKeyError):
    """A requested column is not one of the dataset's columns."""


class StateError(SafetensorsSparkError, ValueError):
    """A resume state does not fit this dataset or these iteration settings."""
