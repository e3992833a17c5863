"""The forensic report's columns in Spark's `tensor` and `file` read layouts (`flags`,
`model_info`) equal what `safetensors-spark report --json` says of the same files."""
import numpy as np
import pytest
from safetensors.numpy import save_file

from test_forensics import KOHYA, MODELSPEC, lora, run_json


@pytest.fixture
def lake(tmp_path):
    """A clean file, kohya and modelspec LoRAs (the latter with an unlisted key: a warning), and a
    file with tensor warnings (integer weights, a ghost tensor, an unusual name)."""
    save_file({"a.weight": np.arange(12, dtype=np.float32).reshape(3, 4), "a.bias": np.ones(3, np.float32)},
              str(tmp_path / "clean.safetensors"))
    lora(tmp_path / "kohya.safetensors", KOHYA)
    lora(tmp_path / "modelspec.safetensors", {**MODELSPEC, "my_note": "x"})
    save_file({"q.weight": np.zeros((2, 2), np.uint8), "ghost": np.zeros((0, 4), np.float32),
               "odd name!": np.zeros(2, np.float32)},
              str(tmp_path / "warnings.safetensors"), metadata={"format": "pt"})
    return tmp_path


def reports(cli, lake):
    _, docs = run_json(cli, lake)
    return {doc["path"].rsplit("/", 1)[-1]: doc for doc in docs}


def name(uri):
    return uri.rsplit("/", 1)[-1]


def test_lake_has_clean_files_and_warnings(cli, lake):
    docs = reports(cli, lake)
    assert set(docs) == {"clean.safetensors", "kohya.safetensors", "modelspec.safetensors", "warnings.safetensors"}
    assert docs["clean.safetensors"]["flags"] == [] and docs["kohya.safetensors"]["flags"] == []
    assert [f["code"] for f in docs["modelspec.safetensors"]["flags"]] == ["metadata_unlisted_keys"]
    assert {f["code"] for f in docs["warnings.safetensors"]["flags"]} == {"integer_float_weights", "ghost_tensor", "unusual_tensor_name"}


def test_file_layout_columns_equal_the_cli_json(spark, cli, lake):
    docs = reports(cli, lake)
    df = spark.read.format("safetensors").option("layout", "file").load(str(lake))
    assert df.schema["flags"].dataType.simpleString() == "array<struct<code:string,level:string,tensor:string,message:string>>"
    assert df.schema["model_info"].dataType.fieldNames() == list(docs["kohya.safetensors"]["model_info"])
    rows = df.select("file", "flags", "model_info").collect()
    assert sorted(name(r.file) for r in rows) == sorted(docs)
    for r in rows:
        doc = docs[name(r.file)]
        assert [f.asDict() for f in r.flags] == doc["flags"], r.file
        assert r.model_info.asDict(recursive=True) == doc["model_info"], r.file


def test_tensor_layout_columns_equal_the_cli_json_on_every_row(spark, cli, lake):
    docs = reports(cli, lake)
    df = spark.read.format("safetensors").option("layout", "tensor").load(str(lake))
    rows = df.select("file", "key", "flags", "model_info").collect()
    assert len(rows) == sum(d["tensor_count"] for d in docs.values())
    for r in rows:
        doc = docs[name(r.file)]
        assert [f.asDict() for f in r.flags] == doc["flags"], (r.file, r.key)
        assert r.model_info.asDict(recursive=True) == doc["model_info"], (r.file, r.key)


def test_pruned_struct_fields_and_filters_on_them(spark, cli, lake):
    docs = reports(cli, lake)
    df = spark.read.format("safetensors").option("layout", "file").load(str(lake))
    got = {name(r.file): (r.name, r.steps, r.codes)
           for r in df.selectExpr("file", "model_info.name AS name", "model_info.training_steps AS steps",
                                  "transform(flags, f -> f.code) AS codes").collect()}
    want = {n: (d["model_info"]["name"], d["model_info"]["training_steps"], [f["code"] for f in d["flags"]])
            for n, d in docs.items()}
    assert got == want
    warned = df.where("size(flags) > 0").select("file").collect()
    assert sorted(name(r.file) for r in warned) == ["modelspec.safetensors", "warnings.safetensors"]


def test_sha256_columns_equal_the_cli_json_and_hashlib(spark, cli, lake):
    import hashlib
    from safetensors.numpy import load_file

    docs = reports(cli, lake)
    files = spark.read.format("safetensors").option("layout", "file").load(str(lake))
    got = {name(r.file): r.sha256 for r in files.select("file", "sha256").collect()}
    assert got == {n: d["sha256"] for n, d in docs.items()}
    assert got == {n: hashlib.sha256((lake / n).read_bytes()).hexdigest() for n in docs}
    tensors = spark.read.format("safetensors").option("layout", "tensor").load(str(lake))
    rows = tensors.select("file", "key", "sha256").collect()
    want = {(n, t["name"]): t["sha256"] for n, d in docs.items() for t in d["tensors"]}
    assert {(name(r.file), r.key): r.sha256 for r in rows} == want
    for n in docs:  # and the bytes themselves, as the safetensors package loads them
        for k, v in load_file(str(lake / n)).items():
            assert want[(n, k)] == hashlib.sha256(v.tobytes()).hexdigest(), (n, k)
    # a filter on the digest column: the file whose tensor it is
    some = want[("clean.safetensors", "a.weight")]
    assert [(name(r.file), r.key) for r in tensors.where(f"sha256 = '{some}'").select("file", "key").collect()] == [
        ("clean.safetensors", "a.weight")]
