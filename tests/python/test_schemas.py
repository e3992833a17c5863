"""Checks of the JSON Schemas in schemas/ against hand-written cases and real safetensors output."""

import json
import struct
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

ROOT = Path(__file__).resolve().parents[2]
HEADER_SCHEMA = json.loads((ROOT / "schemas" / "safetensors-header.schema.json").read_text())
MANIFEST_SCHEMA = json.loads((ROOT / "schemas" / "dataset_manifest.schema.json").read_text())

HEADER = Draft202012Validator(HEADER_SCHEMA)
MANIFEST = Draft202012Validator(MANIFEST_SCHEMA)

ALL_DTYPES = [
    "BOOL", "F4", "F6_E2M3", "F6_E3M2", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0",
    "F8_E4M3FNUZ", "F8_E5M2FNUZ", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "C64",
    "F64", "I64", "U64",
]
WRITTEN_DTYPES = [
    "F16", "F32", "F64", "BF16", "U8", "I8", "U16", "I16", "U32", "I32", "U64", "I64", "BOOL",
]


def dtype_table_from_rust():
    """(name, writable) rows of rust-core/format/src/dtype.rs, so the schemas cannot drift from it."""
    rows = []
    for line in (ROOT / "rust-core" / "format" / "src" / "dtype.rs").read_text().splitlines():
        line = line.strip()
        if line.startswith("row(Dtype::"):
            parts = [p.strip() for p in line[len("row("):].rstrip("),").split(",")]
            rows.append((parts[1].strip('"'), parts[3] == "true"))
    return rows


def tensor(dtype="F32", shape=(2,), offsets=(0, 8), **extra):
    as_json = lambda v: list(v) if isinstance(v, tuple) else v  # noqa: E731 - keep other values as given
    entry = {"dtype": dtype, "shape": as_json(shape), "data_offsets": as_json(offsets)}
    entry.update(extra)
    return entry


def header_ok(doc):
    return HEADER.is_valid(doc)


# ---------------------------------------------------------------- schemas themselves


@pytest.mark.parametrize("schema", [HEADER_SCHEMA, MANIFEST_SCHEMA], ids=["header", "manifest"])
def test_schema_is_valid_draft_2020_12(schema):
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    Draft202012Validator.check_schema(schema)


def test_dtype_lists_match_rust_table():
    rows = dtype_table_from_rust()
    assert [name for name, _ in rows] == ALL_DTYPES
    assert sorted(name for name, w in rows if w) == sorted(WRITTEN_DTYPES)
    assert HEADER_SCHEMA["$defs"]["dtype"]["enum"] == ALL_DTYPES
    assert sorted(MANIFEST_SCHEMA["$defs"]["dtype"]["enum"]) == sorted(WRITTEN_DTYPES)


# ---------------------------------------------------------------- header schema


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_every_dtype_accepted(dtype):
    assert header_ok({"t": tensor(dtype)})


@pytest.mark.parametrize(
    "dtype",
    ["F128", "U256", "xF16junk", "F16junk", "bf16", "f32", "F32 ", " F32", "F8_E4M3FN", "C128",
     "I4", "", "BF", "F"],
)
def test_bad_dtype_rejected(dtype):
    assert not header_ok({"t": tensor(dtype)})


@pytest.mark.parametrize("dtype", [{"F32": None}, ["F32"], 32, None])
def test_dtype_must_be_a_string(dtype):
    assert not header_ok({"t": tensor(dtype)})


def test_empty_header_and_scalars_accepted():
    assert header_ok({})
    assert header_ok({"s": tensor("F64", shape=(), offsets=(0, 8))})
    assert header_ok({"z": tensor("F32", shape=(2, 0), offsets=(0, 0))})
    assert header_ok({"big": tensor("U8", shape=(2**64 - 1,), offsets=(0, 2**64 - 1))})


@pytest.mark.parametrize("offsets", [[], [0], [0, 4, 8], [-1, 4], [0, 2**64], [0, "4"], [0, None]])
def test_bad_offsets_rejected(offsets):
    assert not header_ok({"t": tensor(offsets=offsets)})


def test_offsets_as_object_rejected():
    entry = tensor()
    entry["data_offsets"] = {"begin": 0, "end": 8}
    assert not header_ok({"t": entry})


@pytest.mark.parametrize("shape", [[-1], [2**64], ["2"], [None], [1.5], "2", 2, None])
def test_bad_shape_rejected(shape):
    assert not header_ok({"t": tensor(shape=shape)})


def test_extra_tensor_field_rejected():
    assert not header_ok({"t": tensor(extra=[1])})


@pytest.mark.parametrize("field", ["dtype", "shape", "data_offsets"])
def test_missing_tensor_field_rejected(field):
    entry = tensor()
    del entry[field]
    assert not header_ok({"t": entry})


def test_positional_tensor_entry_rejected():
    assert not header_ok({"t": ["F32", [2], [0, 8]]})


@pytest.mark.parametrize("meta", [{}, {"framework": "pt"}, {"a": "", "b": "x"}, None])
def test_metadata_accepted(meta):
    assert header_ok({"__metadata__": meta, "t": tensor()})


@pytest.mark.parametrize("meta", [{"n": 1}, {"n": None}, {"n": {"x": "y"}}, {"n": ["x"]}, "pt", [], 3])
def test_bad_metadata_rejected(meta):
    assert not header_ok({"__metadata__": meta})


def test_tensor_named_metadata_rejected():
    assert not header_ok({"__metadata__": tensor()})


def test_metadata_key_is_case_sensitive():
    # `__METADATA__` is a tensor name, so a metadata-like object there is not a valid tensor.
    assert not header_ok({"__METADATA__": {"framework": "pt"}})


def parse_header(blob: bytes):
    (n,) = struct.unpack("<Q", blob[:8])
    assert 8 + n <= len(blob)
    return json.loads(blob[8 : 8 + n].decode("utf-8"))


def test_reference_writer_output_validates():
    # requirements of the suite (tests/python/requirements.txt): a broken import fails, never skips
    import ml_dtypes
    import numpy as np
    import safetensors.numpy as st_numpy

    arrays = {
        "weight": np.arange(6, dtype=np.float32).reshape(2, 3),
        "bias.bf16": np.array([[2.25, 1.0], [1.0, -1.0]], dtype=ml_dtypes.bfloat16),
        "mask": np.array([True, False, True]),
        "ids": np.array([1, 2, 3], dtype=np.int64),
        "half": np.zeros((2, 2), dtype=np.float16),
        "u": np.zeros(3, dtype=np.uint16),
        "c": np.array([1 + 1j], dtype=np.complex64),
        "scalar": np.array(1.5, dtype=np.float64),
        "empty": np.zeros((2, 0), dtype=np.float32),
    }
    for metadata in (None, {}, {"framework": "np", "k": "v"}):
        blob = st_numpy.save(arrays, metadata=metadata)
        header = parse_header(blob)
        errors = list(HEADER.iter_errors(header))
        assert errors == [], errors
        assert header["bias.bf16"]["dtype"] == "BF16"
        assert header["mask"]["dtype"] == "BOOL"
        assert header["c"]["dtype"] == "C64"
        assert ("__metadata__" in header) == (metadata is not None)


# ---------------------------------------------------------------- manifest schema

UUID = "0f8e4c2a-1b3d-4e5f-8a9b-0c1d2e3f4a5b"


def batch_manifest(**overrides):
    doc = {
        "format_version": "1.0",
        "safetensors_version": "1.0",
        "total_samples": 2,
        "total_bytes": 104,
        "shards": [
            {
                "shard_path": f"part-00000-0000-{UUID}.safetensors",
                "samples_count": 2,
                "bytes": 104,
                "partition": 0,
                "padded_samples": 0,
                "num_tensors": 1,
            }
        ],
        "schema": {"x": {"dtype": "F32", "shape": [2, 3]}},
        "format": "safetensors-spark-dataset",
        "created_by": "safetensors-spark 0.1.0",
        "manifest_version": 1,
        "layout": "batch",
        "batch_size": 2,
        "tail_strategy": "write",
        "kv_separator": None,
        "padded_samples": 0,
        "dropped_samples": 0,
    }
    doc.update(overrides)
    return doc


def empty_manifest():
    return batch_manifest(schema={}, total_samples=0, total_bytes=0, shards=[])


def kv_manifest():
    doc = batch_manifest(layout="kv", batch_size=None, tail_strategy=None, kv_separator="__")
    doc["schema"] = {"emb": {"dtype": "BF16", "shape": None}, "id": {"dtype": "I64", "shape": []}}
    doc["shards"][0]["num_tensors"] = 4
    return doc


def manifest_ok(doc):
    return MANIFEST.is_valid(doc)


def test_manifest_with_zero_shards_valid():
    assert manifest_ok(empty_manifest())


def test_manifest_with_a_shard_valid():
    assert manifest_ok(batch_manifest())


def test_kv_manifest_valid():
    assert manifest_ok(kv_manifest())


def test_pad_manifest_valid():
    doc = batch_manifest(tail_strategy="pad", padded_samples=1, total_samples=1)
    doc["shards"][0].update(samples_count=1, padded_samples=1)
    assert manifest_ok(doc)


def test_drop_manifest_valid():
    assert manifest_ok(batch_manifest(tail_strategy="drop", dropped_samples=1))


@pytest.mark.parametrize(
    "field",
    ["format_version", "safetensors_version", "total_samples", "total_bytes", "shards", "schema",
     "format", "created_by", "manifest_version", "layout", "batch_size", "tail_strategy",
     "kv_separator", "padded_samples", "dropped_samples"],
)
def test_manifest_missing_field_rejected(field):
    doc = batch_manifest()
    del doc[field]
    assert not manifest_ok(doc)


@pytest.mark.parametrize(
    "field", ["shard_path", "samples_count", "bytes", "partition", "padded_samples", "num_tensors"]
)
def test_shard_missing_field_rejected(field):
    doc = batch_manifest()
    del doc["shards"][0][field]
    assert not manifest_ok(doc)


@pytest.mark.parametrize("field", ["total_samples", "padded_samples", "dropped_samples", "total_bytes"])
def test_negative_count_rejected(field):
    assert not manifest_ok(batch_manifest(**{field: -1}))


@pytest.mark.parametrize(
    "field", ["partition", "samples_count", "padded_samples", "num_tensors", "bytes"]
)
def test_negative_shard_count_rejected(field):
    doc = batch_manifest()
    doc["shards"][0][field] = -1
    assert not manifest_ok(doc)


def test_extra_fields_rejected():
    # one name per fact: the old names beside the published ones are refused
    assert not manifest_ok(batch_manifest(tensors={}))
    doc = batch_manifest()
    doc["shards"][0]["file"] = doc["shards"][0]["shard_path"]
    assert not manifest_ok(doc)
    doc = batch_manifest()
    doc["schema"]["x"]["sample_shape"] = [3]
    assert not manifest_ok(doc)


@pytest.mark.parametrize("layout", ["Batch", "KV", "kv_mode", "", None, 1])
def test_wrong_layout_rejected(layout):
    assert not manifest_ok(batch_manifest(layout=layout))


@pytest.mark.parametrize(
    "overrides",
    [
        {"format": "safetensors"},
        {"format_version": 1},
        {"format_version": "2.0"},
        {"safetensors_version": 1},
        {"created_by": ""},
        {"manifest_version": 0},
        {"batch_size": 0},
        {"batch_size": None},
        {"tail_strategy": "PAD"},
        {"tail_strategy": None},
        {"kv_separator": "__"},
        {"total_samples": 1.5},
        {"padded_samples": 1},
        {"dropped_samples": 1},
        {"schema": {"x": {"dtype": "F8_E4M3", "shape": [2, 3]}}},
        {"schema": {"x": {"dtype": "F32", "shape": None}}},
        {"schema": {"x": {"dtype": "F32", "shape": []}}},
        {"schema": {"x": {"dtype": "F32", "shape": [2, -1]}}},
        {"shards": {}},
    ],
    ids=lambda o: json.dumps(o),
)
def test_bad_batch_manifest_rejected(overrides):
    assert not manifest_ok(batch_manifest(**overrides))


@pytest.mark.parametrize(
    "overrides",
    [{"batch_size": 2}, {"tail_strategy": "write"}, {"kv_separator": None}, {"kv_separator": ""},
     {"padded_samples": 1}],
    ids=lambda o: json.dumps(o),
)
def test_bad_kv_manifest_rejected(overrides):
    doc = kv_manifest()
    doc.update(overrides)
    assert not manifest_ok(doc)


@pytest.mark.parametrize(
    "name",
    ["dataset_manifest.json", "_tensor_index.parquet", ".part-00000-0000-x.safetensors",
     f"sub/part-00000-0000-{UUID}.safetensors", f"../part-00000-0000-{UUID}.safetensors",
     f"part-00139-0000-{UUID.upper()}.safetensors",
     f"part-0-0000-{UUID}.safetensors", f"part-00000-0000-{UUID}.safetensors.tmp"],
)
def test_bad_shard_file_name_rejected(name):
    doc = batch_manifest()
    doc["shards"][0]["shard_path"] = name
    assert not manifest_ok(doc)


def test_wide_partition_numbers_accepted():
    doc = batch_manifest()
    doc["shards"][0].update(shard_path=f"part-123456-10000-{UUID}.safetensors", partition=123456)
    assert manifest_ok(doc)


def test_shard_padding_only_with_pad():
    doc = batch_manifest()
    doc["shards"][0]["padded_samples"] = 1
    assert not manifest_ok(doc)


def test_empty_shard_rejected():
    doc = batch_manifest()
    doc["shards"][0]["samples_count"] = 0
    assert not manifest_ok(doc)
