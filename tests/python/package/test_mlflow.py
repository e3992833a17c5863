"""MLflow dataset inputs (safetensors_spark.mlflow, spec/python.md §7) against a real sqlite
tracking store: source, digest, schema and profile come from the dataset's manifest. On hand-made
datasets (handmade.py); the digests of successive Spark commits: ../test_spark_python_package.py."""
import json

import mlflow
import pytest
from mlflow.tracking import MlflowClient

import handmade
from safetensors_spark import ManifestError
from safetensors_spark.mlflow import dataset, log_input, manifest_digest


@pytest.fixture
def tracking(tmp_path):
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    yield MlflowClient()
    mlflow.set_tracking_uri("")


def write(path):
    """10 samples in shards of 4, 4 and 2: x BF16 [4] per sample, y I32 (as a Spark write of
    x array<float>, y int with batch_size 4 and dtypes {"x": "BF16"} lays them out)."""
    handmade.write_batch_dataset(str(path), [4, 4, 2], batch_size=4, width=4, dtypes={"x": "BF16", "y": "I32"})


def test_log_input_records_source_digest_schema_and_profile(tmp_path, tracking):
    out = tmp_path / "train"
    write(out)
    manifest = json.loads((out / "dataset_manifest.json").read_text())
    with mlflow.start_run() as run:
        logged = log_input(str(out), context="training")
    inputs = tracking.get_run(run.info.run_id).inputs.dataset_inputs
    assert len(inputs) == 1
    got = inputs[0].dataset
    assert [(t.key, t.value) for t in inputs[0].tags] == [("mlflow.data.context", "training")]
    assert got.name == "train"
    assert got.digest == logged.digest == manifest_digest(manifest)
    assert len(got.digest) == 16
    assert got.source_type == "local"
    assert str(out) in json.loads(got.source)["uri"]
    assert json.loads(got.schema) == manifest["schema"] == {
        "x": {"dtype": "BF16", "shape": [4, 4]}, "y": {"dtype": "I32", "shape": [4]}}
    profile = json.loads(got.profile)
    assert profile == {"num_samples": 10, "num_bytes": manifest["total_bytes"], "num_shards": 3,
                       "layout": "batch", "padded_samples": 0, "dropped_samples": 0, "manifest_version": 1}


def test_only_a_committed_consistent_dataset_can_be_logged(tmp_path, tracking):
    loose = tmp_path / "loose"
    loose.mkdir()
    (loose / "a.safetensors").write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00{}")
    with pytest.raises(ManifestError, match="not a dataset written by"):
        dataset(str(loose))
    out = tmp_path / "tampered"
    write(out)
    m = json.loads((out / "dataset_manifest.json").read_text())
    m["shards"][0]["shard_path"] = "../victim.safetensors"
    (out / "dataset_manifest.json").write_text(json.dumps(m))
    with pytest.raises(ManifestError, match=r"\.\./victim"):
        dataset(str(out))
    with mlflow.start_run() as run:
        with pytest.raises(ManifestError):
            log_input(str(out))
    assert tracking.get_run(run.info.run_id).inputs.dataset_inputs == []
