"""The package's public API is what spec/python.md documents: the helpers the package's own
modules call on a dataset, a filter or a packing are private (a leading underscore), so a new
public name fails here until it is documented and listed."""

import inspect

import safetensors_spark
import safetensors_spark.torch as sst
from safetensors_spark import Dataset, Filter, Ragged

DOCUMENTED = {
    Dataset: {"bytes_fetched", "cache_stats", "get", "io_counters", "iter_shards", "keys", "prefetch",
              "ragged_rows", "verify_checksums"},
    Ragged: {"lengths", "offsets", "values"},
    Filter: {"length", "mask", "where"},
    sst.Packing: set(),
    sst.Source: set(),
    sst.Follow: set(),
    sst.SafetensorsDataset: {"get"},
    sst.SafetensorsIterableDataset: {"epoch", "load_state_dict", "set_epoch", "state_dict"},
    sst.SafetensorsMixture: {"epoch", "load_state_dict", "set_epoch", "source_counts", "source_paths",
                                 "state_dict"},
}


def own_public(cls):
    """Public names ``cls`` defines itself (inherited torch names are torch's)."""
    return {n for c in inspect.getmro(cls) if c.__module__.startswith("safetensors_spark")
            for n in vars(c) if not n.startswith("_")}


def test_the_classes_have_only_their_documented_public_names():
    for cls, names in DOCUMENTED.items():
        assert own_public(cls) == names, cls.__name__


def test_the_packages_export_what_they_document():
    assert set(safetensors_spark.__all__) == {
        "open_dataset", "vacuum", "compact", "delete_keys", "delete_rows", "history", "Dataset", "Ragged", "Filter", "SafetensorsSparkError",
        "ManifestError", "ShardError", "IndexFileError", "KeyNotFoundError", "ColumnNotFoundError", "StateError",
        "__version__"}
    assert set(sst.__all__) == {"SafetensorsDataset", "SafetensorsIterableDataset", "SafetensorsMixture", "Source",
                                "Filter", "Follow", "Packing", "loader"}
    for module in (safetensors_spark, sst):
        assert all(hasattr(module, n) for n in module.__all__)
