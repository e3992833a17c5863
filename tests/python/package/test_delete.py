"""Deleting samples without Spark (spec/dataset.md §5.11): a bad sample found through provenance
(``open_dataset(provenance=True)``) is deleted by ``delete_rows``, a KV dataset's keys by
``delete_keys`` and the CLI's ``delete --keys``; after a vacuum with retention 0 no byte of a
deleted sample is left in any file of the dataset directory."""

import json
import os

import numpy as np
import pytest

import safetensors_spark
from safetensors_spark import ManifestError, open_dataset

from handmade import read_manifest, write_batch_dataset, write_kv_dataset, write_manifest

def files_containing(root, needle):
    hits = []
    for d, _, files in os.walk(root):
        for f in files:
            with open(os.path.join(d, f), "rb") as fh:
                if needle in fh.read():
                    hits.append(os.path.join(d, f))
    return hits


def with_retention_zero(path):
    m = read_manifest(path)
    m["retention_seconds"] = 0
    write_manifest(path, m)


def test_a_sample_found_by_provenance_is_deleted_and_vacuum_leaves_none_of_its_bytes(tmp_path):
    path = str(tmp_path / "ds")
    ids = write_batch_dataset(path, [4, 4, 3], batch_size=4, width=3)
    with_retention_zero(path)
    ds = open_dataset(path, provenance=True)
    # the "bad" sample: id 6, found by its values
    bad = next(s for s in ds if int(s["y"]) == 6)
    assert (bad["_file"], bad["_row_index"], bad["_added_version"]) == (ds.shards[1].name, 2, None)
    needle = np.asarray(bad["x"]).tobytes()  # 60.0, 600.0, 6000.0 as F32: in no other sample
    assert files_containing(path, needle)
    out = safetensors_spark.delete_rows(path, [(bad["_file"], bad["_row_index"])], commit_message="bad sample")
    assert out["version"] == 2 and out["rows_removed"] == 1
    after = open_dataset(path, provenance=True)
    assert sorted(int(s["y"]) for s in after) == [i for i in ids if i != 6]
    # the rewritten shard carries the delete's version; the untouched ones are listed as before
    added = {s["_file"]: s["_added_version"] for s in after}
    assert added[ds.shards[0].name] is None and added[ds.shards[2].name] is None
    assert {v for f, v in added.items() if f not in (ds.shards[0].name, ds.shards[2].name)} == {2}
    h = safetensors_spark.history(path)
    assert (h[-1]["version"], h[-1]["operation"], h[-1]["total_rows"]) == (2, "delete", len(ids) - 1)
    assert h[-1]["commit_message"] == "bad sample"
    # retention 0: the replaced shard went at commit; a vacuum removes what older versions listed
    safetensors_spark.vacuum(path, retention="0")
    assert files_containing(path, needle) == []
    assert sorted(int(s["y"]) for s in open_dataset(path)) == [i for i in ids if i != 6]


def test_with_the_default_retention_the_old_version_still_reads_the_row(tmp_path):
    path = str(tmp_path / "ds")
    write_batch_dataset(path, [2, 2], batch_size=2)
    first, second = (s.name for s in open_dataset(path).shards)
    safetensors_spark.delete_rows(path, [(first, 0)])
    out = safetensors_spark.delete_rows(path, [(os.path.join(path, second), 1)])  # a path works too
    assert out["version"] == 3 and out["replaced_deleted"] is False
    assert [int(s["y"]) for s in open_dataset(path)] == [1, 2]
    assert [int(s["y"]) for s in open_dataset(path, version=2)] == [1, 2, 3]
    h = safetensors_spark.history(path)
    assert (h[-1]["operation"], h[-1]["rows_removed"], h[-1]["rows_added"]) == ("delete", 2, 1)


def test_kv_keys_are_deleted_from_the_shards_holding_them(tmp_path):
    path = str(tmp_path / "kv")
    values = write_kv_dataset(path, [["a", "b", "c"], ["d"]])
    dry = safetensors_spark.delete_keys(path, ["b", "zz"], dry_run=True)
    assert (dry["version"], dry["rows_removed"]) == (None, 1)
    out = safetensors_spark.delete_keys(path, ["b", "zz"])
    assert (out["version"], out["rows_removed"]) == (2, 1)
    ds = open_dataset(path)
    assert sorted(ds.keys()) == ["a", "c", "d"]
    np.testing.assert_array_equal(ds.get("c")["emb"], values["c"]["emb"])
    with pytest.raises(Exception, match="b"):
        ds.get("b")


def test_bad_deletes_are_refused_naming_what_is_wrong(tmp_path):
    path = str(tmp_path / "ds")
    write_batch_dataset(path, [2], batch_size=2)
    name = open_dataset(path).shards[0].name
    with pytest.raises(ManifestError, match="row 5 of shard"):
        safetensors_spark.delete_rows(path, [(name, 5)])
    with pytest.raises(ManifestError, match="not listed"):
        safetensors_spark.delete_rows(path, [("part-00009-0000-0f8fad5b-d9cb-469f-a165-70867728950e.safetensors", 0)])
    with pytest.raises(ManifestError, match="batch layout"):
        safetensors_spark.delete_keys(path, ["k"])
    with pytest.raises(ValueError, match="row_index >= 0"):
        safetensors_spark.delete_rows(path, [(name, -1)])
    with pytest.raises(ValueError, match="not one string"):
        safetensors_spark.delete_keys(path, "k")
    with pytest.raises(ValueError, match="provenance must be True or False"):
        open_dataset(path, provenance=1)
    assert read_manifest(path)["manifest_version"] == 1


def test_the_cli_deletes_keys_from_a_file(tmp_path, cli):
    path = str(tmp_path / "kv")
    write_kv_dataset(path, [["a", "b"], ["c"]])
    keys = tmp_path / "keys.txt"
    keys.write_text("a\r\n\nc\n")
    r = cli("delete", "--keys", keys, "--message", "request 7", path)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert (out["version"], out["rows_removed"]) == (2, 2)
    assert open_dataset(path).keys() == ["b"]
    r = cli("delete", path)
    assert r.returncode == 2 and "--keys FILE or --rows FILE" in r.stderr
    # a batch dataset's rows: SHARD ROW lines, as provenance gives them
    batch = str(tmp_path / "ds")
    write_batch_dataset(batch, [3], batch_size=3)
    name = open_dataset(batch).shards[0].name
    rows = tmp_path / "rows.txt"
    rows.write_text(f"{name} 1\n")
    r = cli("delete", "--rows", rows, batch)
    assert r.returncode == 0, r.stderr
    assert [int(s["y"]) for s in open_dataset(batch)] == [0, 2]
    rows.write_text(f"{name} one\n")
    r = cli("delete", "--rows", rows, batch)
    assert r.returncode == 1 and "line 1: row 'one' is not a whole number" in r.stderr


def test_the_torch_map_dataset_gives_provenance_that_deletes_the_sample(tmp_path):
    import torch
    from safetensors_spark.torch import SafetensorsDataset

    path = str(tmp_path / "ds")
    write_batch_dataset(path, [3, 3], batch_size=3)
    ds = SafetensorsDataset(path, provenance=True)
    one = ds[4]
    assert (one["_file"], int(one["_row_index"]), int(one["_added_version"])) == (ds.dataset.shards[1].name, 1, -1)
    batches = list(torch.utils.data.DataLoader(ds, batch_size=4))
    files = [f for b in batches for f in b["_file"]]
    rows = torch.cat([b["_row_index"] for b in batches]).tolist()
    ys = torch.cat([b["y"] for b in batches]).tolist()
    bad = ys.index(4)
    safetensors_spark.delete_rows(path, [(files[bad], rows[bad])])
    again = SafetensorsDataset(path, provenance=True)
    assert [int(again[i]["y"]) for i in range(len(again))] == [0, 1, 2, 3, 5]
    assert int(again[3]["_added_version"]) == 2
    with pytest.raises(ValueError, match="provenance must be True or False"):
        SafetensorsDataset(path, provenance="yes")
    assert "_file" not in SafetensorsDataset(path)[0]
