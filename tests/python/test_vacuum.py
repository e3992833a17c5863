"""Vacuum of a dataset Spark wrote, from Python and the CLI (spec/dataset.md §5.8.1)."""

import json

import pytest

import safetensors_spark


def _tree(d):
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def _append(spark, path, tag):
    df = spark.createDataFrame([([float(tag * 100 + i)],) for i in range(4)], "x array<float>")
    df.coalesce(1).write.format("safetensors").option("batch_size", 2).mode("append").save(str(path))


def test_python_and_cli_vacuum(spark, tmp_path, cli):
    ds = tmp_path / "ds"
    _append(spark, ds, 1)
    _append(spark, ds, 2)
    with pytest.raises(ValueError, match="retention '-1 days': expected a duration"):
        safetensors_spark.vacuum(ds, retention="-1 days")
    with pytest.raises(ValueError, match="shorter than the dataset's retention 604800 s"):
        safetensors_spark.vacuum(ds, retention="0")
    before = _tree(ds)
    out = safetensors_spark.vacuum(ds, retention="0", dry_run=True, allow_shorter_retention=True)
    assert out["dry_run"] and out["version"] is None and out["plan"]["prune_versions"] == [1]
    assert _tree(ds) == before
    out = safetensors_spark.vacuum(ds, retention="0", allow_shorter_retention=True)
    assert out["version"] == 3
    m = json.loads((ds / "dataset_manifest.json").read_text())
    assert m["operation"] == "vacuum" and m["vacuumed"] == {"files": 0, "bytes": 0}
    assert len(safetensors_spark.open_dataset(str(ds))) == 8
    # the CLI: a dry run with the dataset's retention changes nothing
    before = _tree(ds)
    r = cli("vacuum", "--dry-run", ds)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["dry_run"] is True
    assert _tree(ds) == before
