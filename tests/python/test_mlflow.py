"""MLflow dataset inputs (safetensors_spark.mlflow, spec/python.md §7) against a real sqlite
tracking store: source, digest, schema and profile come from the dataset's manifest."""
import json

import mlflow
import pytest
from mlflow.tracking import MlflowClient

from safetensors_spark import ManifestError
from safetensors_spark.mlflow import dataset, log_input, manifest_digest


@pytest.fixture
def tracking(tmp_path):
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    yield MlflowClient()
    mlflow.set_tracking_uri("")


def write(spark, path, mode="errorifexists", n=10):
    spark.createDataFrame([([float(i)] * 4, i) for i in range(n)], "x array<float>, y int").coalesce(1) \
        .write.format("safetensors").mode(mode).option("batch_size", 4).option("dtypes", '{"x": "BF16"}').save(str(path))


def test_log_input_records_source_digest_schema_and_profile(spark, tmp_path, tracking):
    out = tmp_path / "train"
    write(spark, out)
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


def test_the_digest_names_one_committed_state(spark, tmp_path, tracking):
    out = tmp_path / "ds"
    write(spark, out)
    first = dataset(str(out)).digest
    assert dataset(str(out), name="again").digest == first  # same state, same digest
    write(spark, out, mode="append", n=3)
    second = dataset(str(out)).digest
    assert second != first
    write(spark, out, mode="overwrite", n=10)  # the same rows again: a new commit, a new state
    assert dataset(str(out)).digest not in (first, second)
    with mlflow.start_run() as run:
        log_input(str(out), context="training", name="named")
        log_input(str(out), context="eval", name="named")
    names = {(i.dataset.name, i.dataset.digest) for i in tracking.get_run(run.info.run_id).inputs.dataset_inputs}
    assert names == {("named", dataset(str(out)).digest)}


def test_only_a_committed_consistent_dataset_can_be_logged(spark, tmp_path, tracking):
    loose = tmp_path / "loose"
    loose.mkdir()
    (loose / "a.safetensors").write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00{}")
    with pytest.raises(ManifestError, match="not a dataset written by"):
        dataset(str(loose))
    out = tmp_path / "tampered"
    write(spark, out)
    m = json.loads((out / "dataset_manifest.json").read_text())
    m["shards"][0]["shard_path"] = "../victim.safetensors"
    (out / "dataset_manifest.json").write_text(json.dumps(m))
    with pytest.raises(ManifestError, match=r"\.\./victim"):
        dataset(str(out))
    with mlflow.start_run() as run:
        with pytest.raises(ManifestError):
            log_input(str(out))
    assert tracking.get_run(run.info.run_id).inputs.dataset_inputs == []
