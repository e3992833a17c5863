"""`safetensors-spark report`: a crafted file per flag (each gives exactly its flag), clean files
(none), hashes equal to hashlib's, kohya/modelspec metadata in named fields, sharded checkpoints,
path expansion, exit codes and the terminal table (spec/forensics.md)."""
import hashlib
import json
import os
import pty
import subprocess

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

A = '"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}'


def tensor(name, dtype, shape, begin, end):
    return f'"{name}":{{"dtype":"{dtype}","shape":{json.dumps(shape)},"data_offsets":[{begin},{end}]}}'


def framed(header, data_len=0, pad=8, n=None):
    h = header.encode() if isinstance(header, str) else header
    while len(h) % pad:
        h += b" "
    return (len(h) if n is None else n).to_bytes(8, "little") + h + bytes(range(256)) * (data_len // 256) + bytes(range(data_len % 256))


def not_utf8():
    b = framed("{" + tensor("a\u0001", "F32", [2], 0, 8) + "}", 8)
    return b.replace(b"\x01", b"\xff", 1)


# (flag code, file bytes). Errors first, then warnings, then the info flag.
CORPUS = [
    ("header_too_small", b"\x01\x00\x00"),
    ("header_too_large", framed("{}", n=200_000_000)),
    ("header_beyond_file", framed("{}", n=100)),
    ("header_not_utf8", not_utf8()),
    ("header_invalid_json", framed('{"a":')),
    ("duplicate_key", framed("{" + A + "," + A + "}", 8)),
    ("metadata_not_string_map", framed('{"__metadata__":{"k":1},' + A + "}", 8)),
    ("tensor_entry_invalid", framed('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}}', 8)),
    ("unknown_dtype", framed("{" + tensor("a", "F33", [2], 0, 8) + "}", 8)),
    ("invalid_shape", framed('{"a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}}', 8)),
    ("invalid_offsets", framed('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8,8]}}', 8)),
    ("reversed_offsets", framed("{" + A + "," + tensor("b", "F32", [2], 8, 4) + "}", 8)),
    ("overlapping_offsets", framed("{" + A + "," + tensor("b", "F32", [2], 4, 12) + "}", 12)),
    ("bytes_outside_tensors", framed("{" + A + "," + tensor("b", "F32", [2], 12, 20) + "}", 20)),
    ("bytes_outside_tensors", framed("{" + A + "}", 9)),
    ("size_overflow", framed("{" + tensor("a", "U8", [2**63, 4], 0, 8) + "}", 8)),
    ("size_not_byte_aligned", framed("{" + tensor("a", "F4", [3], 0, 2) + "}", 2)),
    ("offsets_shape_mismatch", framed("{" + tensor("a", "F32", [3], 0, 8) + "}", 8)),
    ("data_past_end", framed("{" + A + "}", 5)),
    ("ghost_tensor", framed("{" + A + "," + tensor("ghost", "F16", [0, 4096], 8, 8) + "}", 8)),
    ("metadata_malformed", framed('{"__metadata__":{"ss_tag_frequency":"{oops"},' + A + "}", 8)),
    ("metadata_spoofed", framed('{"__metadata__":{"f\u043ermat":"pt"},' + A + "}", 8)),
    ("metadata_unlisted_keys", framed('{"__metadata__":{"payload":"x"},' + A + "}", 8)),
    ("integer_float_weights", framed("{" + tensor("model.layer.weight", "U8", [8], 0, 8) + "}", 8)),
    ("unusual_tensor_name", framed("{" + tensor("a;rm -rf", "F32", [2], 0, 8) + "}", 8)),
    ("misaligned_tensor", framed("{" + A + "}", 8, pad=1)),
]
LEVEL = {"error": 2, "warning": 1, "info": 0}


def run_json(cli, *args):
    p = cli("report", "--json", *args)
    assert p.stderr == "" or p.returncode == 2, p.stderr
    return p, [json.loads(line) for line in p.stdout.splitlines()]


@pytest.mark.parametrize("code,data", CORPUS, ids=[f"{i}-{c}" for i, (c, _) in enumerate(CORPUS)])
def test_each_crafted_file_gives_exactly_its_flag(cli, tmp_path, code, data):
    path = tmp_path / "crafted.safetensors"
    path.write_bytes(data)
    p, docs = run_json(cli, path)
    [doc] = docs
    assert [f["code"] for f in doc["flags"]] == [code], doc["flags"]
    flag = doc["flags"][0]
    assert flag["message"]
    assert p.returncode == LEVEL[flag["level"]], (p.returncode, flag)
    # Error flags are exactly the files the strict reader rejects.
    assert (flag["level"] == "error") == (doc["strict_error"] is not None)
    assert (flag["level"] == "error") == (cli("validate", path).returncode != 0)
    assert doc["verdict"] == {"error": "invalid", "warning": "warnings", "info": "clean"}[flag["level"]]
    if doc["header_size"] is not None and flag["level"] != "error":
        # A valid file is hashed like hashlib does.
        assert doc["sha256"] == hashlib.sha256(data).hexdigest()


def test_huge_tensor_from_a_sparse_file_without_reading_it(cli, tmp_path):
    n = 2**31 + 1
    head = framed("{" + tensor("big", "U8", [n], 0, n) + "}")
    path = tmp_path / "huge.safetensors"
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(len(head) + n)
    p, [doc] = run_json(cli, "--no-hash", path)
    assert [f["code"] for f in doc["flags"]] == ["huge_tensor"]
    assert doc["flags"][0]["tensor"] == "big"
    assert str(n) in doc["flags"][0]["message"]
    assert p.returncode == 1
    assert doc["sha256"] is None


def clean_tensors():
    rng = np.random.default_rng(7)
    return {
        "encoder.layers.0.weight": rng.standard_normal((64, 32)).astype(np.float32),
        "encoder.layers.0.bias": rng.standard_normal(32).astype(np.float16),
        "position_ids": np.arange(77, dtype=np.int64),
        "scale": np.array(3.5, dtype=np.float64),
        "mask": rng.integers(0, 2, (5, 3)).astype(np.uint8),
    }


def test_clean_file_no_flags_and_hashes_equal_hashlib(cli, tmp_path):
    path = tmp_path / "clean.safetensors"
    tensors = clean_tensors()
    save_file(tensors, str(path), metadata={"format": "pt"})
    p, [doc] = run_json(cli, path)
    assert p.returncode == 0, doc["flags"]
    assert doc["flags"] == [] and doc["verdict"] == "clean"
    raw = path.read_bytes()
    assert doc["file_size"] == len(raw)
    assert doc["header_size"] == int.from_bytes(raw[:8], "little")
    assert doc["sha256"] == hashlib.sha256(raw).hexdigest()
    assert doc["tensor_count"] == len(tensors)
    assert doc["parameter_count"] == sum(t.size for t in tensors.values())
    assert doc["bytes_per_dtype"] == {"F32": 64 * 32 * 4, "F16": 64, "I64": 77 * 8, "F64": 8, "U8": 15}
    loaded = load_file(str(path))
    by_name = {t["name"]: t for t in doc["tensors"]}
    assert set(by_name) == set(tensors)
    for name, t in by_name.items():
        assert t["sha256"] == hashlib.sha256(loaded[name].tobytes()).hexdigest(), name
        begin, end = t["data_offsets"]
        assert raw[t["data_start"]:t["data_start"] + end - begin] == loaded[name].tobytes()
        assert t["data_start"] % t["aligned_to"] == 0
    assert doc["model_info"]["format"] == "pt"
    # --no-hash: same report without digests.
    _, [nohash] = run_json(cli, "--no-hash", path)
    assert nohash["sha256"] is None and all(t["sha256"] is None for t in nohash["tensors"])
    assert nohash["flags"] == doc["flags"] and nohash["tensor_count"] == doc["tensor_count"]


def test_hashes_of_a_file_larger_than_the_buffer(cli, tmp_path):
    rng = np.random.default_rng(1)
    tensors = {f"t{i}": rng.standard_normal(300_001 + i).astype(np.float32) for i in range(4)}
    path = tmp_path / "big.safetensors"
    save_file(tensors, str(path))
    _, [doc] = run_json(cli, path)
    assert doc["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    for t in doc["tensors"]:
        assert t["sha256"] == hashlib.sha256(tensors[t["name"]].tobytes()).hexdigest()


KOHYA = {
    "ss_output_name": "inkwash_style",
    "ss_sd_model_name": "sd_xl_base_1.0.safetensors",
    "ss_base_model_version": "sdxl_base_v1-0",
    "ss_resolution": "(1024, 1024)",
    "ss_network_module": "networks.lora",
    "ss_network_dim": "16",
    "ss_network_alpha": "8.0",
    "ss_steps": "2400",
    "ss_epoch": "12",
    "ss_num_train_images": "200",
    "ss_training_comment": "see https://civitai.com/models/98765/inkwash?modelVersionId=43210",
    "ss_tag_frequency": json.dumps({"10_inkwash": {"inkwash": 40, "mountain": 12}, "2_reg": {"mountain": 3, "river": 1}}),
    "ss_dataset_dirs": json.dumps({"10_inkwash": {"n_repeats": 10, "img_count": 40}}),
    "ss_seed": "42",
    "sshs_model_hash": "0123abcd",
}
MODELSPEC = {
    "modelspec.sai_model_spec": "1.0.0",
    "modelspec.architecture": "stable-diffusion-v1/lora",
    "modelspec.implementation": "https://github.com/Stability-AI/generative-models",
    "modelspec.title": "Ink Wash",
    "modelspec.description": "Chinese ink wash painting style",
    "modelspec.author": "someone",
    "modelspec.license": "openrail",
    "modelspec.resolution": "512x512",
    "modelspec.trigger_phrase": "inkwash, ink painting",
    "modelspec.date": "2024-05-01",
    "format": "pt",
}


def lora(path, metadata):
    save_file({"lora_unet_down.lora_up.weight": np.zeros((4, 8), np.float16), "lora_unet_down.alpha": np.array(8.0, np.float16)}, str(path), metadata=metadata)


def test_kohya_metadata_in_named_fields(cli, tmp_path):
    path = tmp_path / "kohya.safetensors"
    lora(path, KOHYA)
    p, [doc] = run_json(cli, path)
    assert p.returncode == 0, doc["flags"]
    info = doc["model_info"]
    assert info["name"] == "inkwash_style"
    assert info["base_model"] == "sd_xl_base_1.0.safetensors"
    assert info["resolution"] == "1024x1024"
    assert info["training_tool"] == "kohya-ss sd-scripts"
    assert info["network_module"] == "networks.lora" and info["network_dim"] == "16"
    assert (info["training_steps"], info["training_epochs"], info["training_images"]) == (2400, 12, 200)
    assert (info["civitai_model_id"], info["civitai_version_id"]) == (98765, 43210)
    assert info["tag_frequency"] == [{"tag": "inkwash", "count": 40}, {"tag": "mountain", "count": 15}, {"tag": "river", "count": 1}]
    assert info["distinct_tags"] == 3
    assert info["sources"]["name"] == "ss_output_name"
    assert doc["metadata"] == KOHYA  # the raw map keeps everything


def test_modelspec_metadata_in_named_fields(cli, tmp_path):
    path = tmp_path / "modelspec.safetensors"
    lora(path, {**MODELSPEC, "my_note": "x"})
    p, [doc] = run_json(cli, path)
    info = doc["model_info"]
    assert info["name"] == "Ink Wash"
    assert info["description"] == "Chinese ink wash painting style"
    assert info["author"] == "someone" and info["license"] == "openrail"
    assert info["architecture"] == "stable-diffusion-v1/lora"
    assert info["resolution"] == "512x512"
    assert info["trigger_words"] == ["inkwash", "ink painting"]
    assert info["date"] == "2024-05-01" and info["format"] == "pt"
    assert info["training_tool"] is None
    # The one key outside the allowlist is listed, as a warning.
    assert doc["unlisted_metadata_keys"] == ["my_note"]
    assert [f["code"] for f in doc["flags"]] == ["metadata_unlisted_keys"]
    assert p.returncode == 1


def shard(path, names):
    save_file({n: np.full(4, i, np.float32) for i, n in enumerate(names)}, str(path))


def test_sharded_checkpoint_with_a_missing_and_an_extra_tensor(cli, tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    shard(model / "model-00001-of-00002.safetensors", ["embed.weight", "layers.0.weight", "stowaway"])
    shard(model / "model-00002-of-00002.safetensors", ["layers.1.weight", "lm_head.weight"])
    weight_map = {
        "embed.weight": "model-00001-of-00002.safetensors",
        "layers.0.weight": "model-00001-of-00002.safetensors",
        "layers.1.weight": "model-00002-of-00002.safetensors",
        "lm_head.weight": "model-00002-of-00002.safetensors",
        "layers.2.weight": "model-00002-of-00002.safetensors",
    }
    (model / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 80}, "weight_map": weight_map}))
    p, docs = run_json(cli, "--no-hash", model)
    files = [d for d in docs if d["kind"] == "file"]
    [m] = [d for d in docs if d["kind"] == "model"]
    assert len(files) == 2 and all(f["flags"] == [] for f in files)
    assert sorted((f["code"], f["tensor"]) for f in m["flags"]) == [
        ("index_tensor_extra", "stowaway"),
        ("index_tensor_missing", "layers.2.weight"),
    ]
    assert m["verdict"] == "invalid" and p.returncode == 2
    assert m["tensor_count"] == 5 and m["parameter_count"] == 20 and m["data_bytes"] == 80
    assert m["bytes_per_dtype"] == {"F32": 80}
    # Fixed map: one clean model.
    weight_map.pop("layers.2.weight")
    weight_map["stowaway"] = "model-00001-of-00002.safetensors"
    (model / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 80}, "weight_map": weight_map}))
    p, docs = run_json(cli, model / "model.safetensors.index.json")
    [m] = [d for d in docs if d["kind"] == "model"]
    assert m["flags"] == [] and m["verdict"] == "clean" and p.returncode == 0
    assert len([d for d in docs if d["kind"] == "file"]) == 2  # shards reported from the index


def test_directories_globs_order_and_exit_status(cli, tmp_path):
    lake = tmp_path / "lake"
    (lake / "a" / "b").mkdir(parents=True)
    for i in range(6):
        save_file({"x": np.full(3, i, np.float32)}, str(lake / ("a" if i % 2 else "a/b") / f"m{i}.safetensors"))
    (lake / "a" / "notes.txt").write_text("not a model")
    p, docs = run_json(cli, "--jobs", "3", lake)
    assert p.returncode == 0
    paths = [d["path"] for d in docs]
    # Each directory's entries by name, directories walked where they sort.
    assert [os.path.relpath(x, lake) for x in paths] == ["a/b/m0.safetensors", "a/b/m2.safetensors", "a/b/m4.safetensors", "a/m1.safetensors", "a/m3.safetensors", "a/m5.safetensors"]
    p, docs = run_json(cli, str(lake / "a" / "*.safetensors"))
    assert sorted(os.path.basename(d["path"]) for d in docs) == ["m1.safetensors", "m3.safetensors", "m5.safetensors"]
    (lake / "bad.safetensors").write_bytes(framed("{" + A + "}", 5))
    p, _ = run_json(cli, lake)
    assert p.returncode == 2
    p = cli("report", "--json", tmp_path / "nope" / "*.safetensors")
    assert p.returncode == 2 and "no file matches" in p.stderr
    p = cli("report", "--json", tmp_path / "missing.safetensors")
    assert p.returncode == 2 and "missing.safetensors" in p.stderr
    p = cli("report", "--bogus", lake)
    assert p.returncode == 2 and "unknown option" in p.stderr
    p = cli("report")
    assert p.returncode == 2 and "no PATH" in p.stderr


def on_terminal(cmd, timeout=None):
    """Runs `cmd` with its stdout on a pseudo-terminal: the CompletedProcess and what it wrote there."""
    master, slave = pty.openpty()
    try:
        proc = subprocess.run(cmd, stdout=slave, stderr=subprocess.PIPE, timeout=timeout)
    finally:
        os.close(slave)
    out = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    return proc, out.decode()


def test_a_table_on_a_terminal(rust_tools, tmp_path):
    path = tmp_path / "kohya.safetensors"
    lora(path, {**KOHYA, "payload": "x"})
    proc, text = on_terminal([str(rust_tools / "safetensors-spark"), "report", str(path)])
    assert proc.returncode == 1
    assert "VERDICT" in text and "warnings" in text and "metadata_unlisted_keys" in text
    assert "name=inkwash_style" in text
    assert hashlib.sha256(path.read_bytes()).hexdigest() in text
    assert not text.lstrip().startswith("{")
