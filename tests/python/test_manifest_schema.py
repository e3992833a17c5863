"""Manifests built by the Rust commit step validate against our JSON Schema and against the
published dataset layout's field rules (spec/dataset.md §5.1), and the tensor index written by the
Rust engine is read by pyarrow with the columns and types of spec/dataset.md §6."""

import json
import subprocess
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from jsonschema import Draft202012Validator

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = Draft202012Validator(
    json.loads((ROOT / "schemas" / "dataset_manifest.schema.json").read_text())
)
# The published layout's field rules, as its JSON schema states them (../shared reference notes,
# training-loaders.md §4): these fields required with these types, other properties allowed, and
# at least one shard. We differ on that last rule only: a write of an empty DataFrame commits a
# manifest with no shards (spec/dataset.md §5.1), so it is checked separately below.
PUBLISHED = Draft202012Validator({
    "type": "object",
    "required": ["format_version", "safetensors_version", "total_samples", "total_bytes", "shards"],
    "properties": {
        "format_version": {"type": "string"},
        "safetensors_version": {"type": "string"},
        "total_samples": {"type": "integer", "minimum": 0},
        "total_bytes": {"type": "integer", "minimum": 0},
        "shards": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["shard_path", "samples_count", "bytes"],
                "properties": {
                    "shard_path": {"type": "string"},
                    "samples_count": {"type": "integer", "minimum": 0},
                    "bytes": {"type": "integer", "minimum": 0},
                },
            },
        },
        "schema": {
            "type": "object",
            "additionalProperties": {
                "type": "object",
                "required": ["dtype", "shape"],
                "properties": {"dtype": {"type": "string"}},
            },
        },
    },
})
EXPECTED = {
    "batch", "batch_pad", "batch_drop", "kv", "kv_last_win", "empty_batch", "empty_kv",
    "batch_appended", "kv_appended", "appended_to_empty",
}


@pytest.fixture(scope="module")
def examples(rust_tools, tmp_path_factory):
    index = tmp_path_factory.mktemp("index") / "_tensor_index.parquet"
    out = subprocess.run(
        [str(rust_tools / "examples" / "manifest_examples"), str(index)],
        capture_output=True, text=True, check=True,
    )
    items = json.loads(out.stdout)
    return {i["name"]: i["manifest"] for i in items}, index


def test_every_example_is_present(examples):
    manifests, _ = examples
    assert set(manifests) == EXPECTED


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_manifest_validates_against_schema(examples, name):
    m = examples[0][name]
    errors = sorted(MANIFEST.iter_errors(m), key=str)
    assert not errors, "\n".join(e.message for e in errors)
    # The published field rules, but for the at-least-one-shard rule we deliberately differ on.
    published = sorted(PUBLISHED.iter_errors(m), key=str)
    if m["shards"]:
        assert not published, "\n".join(e.message for e in published)
    else:
        assert [e.validator for e in published] == ["minItems"]
    assert m["format_version"] == "1.0" and m["safetensors_version"] == "1.0"
    # Invariants the schema cannot express (spec/dataset.md §5).
    assert m["total_samples"] == sum(s["samples_count"] for s in m["shards"])
    assert m["padded_samples"] == sum(s["padded_samples"] for s in m["shards"])
    assert m["total_bytes"] == sum(s["bytes"] for s in m["shards"])
    files = [s["shard_path"] for s in m["shards"]]
    assert files == sorted(files, key=lambda f: f.encode()) and len(set(files)) == len(files)
    if not m["shards"]:
        assert m["schema"] == {}
    if m["layout"] == "batch":
        for s in m["shards"]:
            assert s["num_tensors"] == len(m["schema"])
        for t in m["schema"].values():
            assert t["shape"][0] == m["batch_size"]


def test_example_specifics(examples):
    m = examples[0]
    assert list(m["batch"]["schema"]) == ["pixels", "label"]  # write order kept
    assert m["batch"]["schema"]["pixels"] == {"dtype": "F16", "shape": [4, 2, 2]}
    assert m["batch_pad"]["padded_samples"] == 3
    assert m["batch_drop"]["dropped_samples"] == 5
    assert m["kv"]["schema"]["pixels"]["shape"] is None
    assert m["kv"]["schema"]["label"]["shape"] == []
    assert m["kv_last_win"]["total_samples"] == 3  # keys a, b, c
    assert len(m["batch_appended"]["shards"]) == len(m["batch"]["shards"]) + 1
    assert m["batch_appended"]["total_samples"] == m["batch"]["total_samples"] + 2
    assert m["batch"]["manifest_version"] == 1 and m["batch_appended"]["manifest_version"] == 2


def test_schema_rejects_a_broken_example(examples):
    m = json.loads(json.dumps(examples[0]["kv"]))
    m["padded_samples"] = 1
    assert list(MANIFEST.iter_errors(m))


def test_index_read_by_pyarrow(examples):
    _, index = examples
    assert index.is_file()
    table = pq.read_table(index)
    assert table.schema.names == [
        "tensor_key", "file_name", "dtype", "shape", "data_start", "data_end", "sample_key",
        "column",
    ]
    types = {f.name: f.type for f in table.schema}
    for name in ["tensor_key", "file_name", "dtype", "sample_key", "column"]:
        assert types[name] == pa.string(), name
    assert pa.types.is_list(types["shape"]) and types["shape"].value_type == pa.int64()
    assert types["data_start"] == pa.int64() and types["data_end"] == pa.int64()
    assert [f.name for f in table.schema if f.nullable] == ["sample_key"]
    rows = table.to_pylist()
    assert rows == sorted(rows, key=lambda r: (r["file_name"].encode(), r["data_start"]))
    batch = [r for r in rows if r["sample_key"] is None]
    kv = [r for r in rows if r["sample_key"] is not None]
    assert batch and kv
    assert all(r["column"] == r["tensor_key"] for r in batch)
    assert all(r["tensor_key"] == f'{r["sample_key"]}__{r["column"]}' for r in kv)
    assert {tuple(r["shape"]) for r in batch if r["column"] == "pixels"} == {(4, 2, 2), (3, 2, 2)}
    for r in rows:
        assert r["data_end"] >= r["data_start"] >= 8
