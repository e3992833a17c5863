"""The reference notes' positive and negative vectors through `safetensors-spark validate`.

Each case records our verdict and the reference's. Where the reference is lax (duplicate keys,
unknown fields, lax entry forms) we must reject what it accepts; everywhere else we agree.
"""
import json

import pytest
import safetensors

U8 = '{"dtype":"U8","shape":[1],"data_offsets":[0,1]}'
F32_4 = '{{"dtype":"F32","shape":[4],"data_offsets":{}}}'


def framed(header, data=b"", n=None):
    h = header.encode() if isinstance(header, str) else header
    return (len(h) if n is None else n).to_bytes(8, "little") + h + data


# (id, file bytes, we accept, reference accepts, words our message must contain)
CASES = [
    ("empty file", b"", False, False, "header too small"),
    ("7 bytes", b"\x00" * 7, False, False, "header too small"),
    ("N=0", framed(""), False, False, "invalid JSON"),
    ("N beyond file", framed("{}", n=1000), False, False, "invalid header length"),
    ("N over cap", framed("{}", n=100_000_001), False, False, "header too large"),
    ("N = u64 max", framed("{}", n=2**64 - 1), False, False, "header too large"),
    ("non UTF-8", framed(b"\xff"), False, False, "UTF-8"),
    ("NUL padded", framed(b"{}\x00\x00"), False, False, "invalid JSON"),
    ("trailing x", framed("{}x"), False, False, "invalid JSON"),
    ("BOM", framed("\ufeff{}"), False, False, "invalid JSON"),
    ("leading whitespace", framed(" \t\n{}"), True, True, None),
    ("trailing whitespace", framed("{}\r \t\n"), True, True, None),
    ("trailing comma", framed('{"a":' + U8 + ",}", b"\x00"), False, False, "invalid JSON"),
    ("top-level array", framed("[]"), False, False, "must be a JSON object"),
    ("hole", framed('{"a":' + F32_4.format("[0,16]") + ',"b":' + F32_4.format("[32,48]") + "}", bytes(48)), False, False, "tensor `b`"),
    ("overlap", framed('{"a":' + F32_4.format("[0,16]") + ',"b":' + F32_4.format("[8,24]") + "}", bytes(24)), False, False, "overlap"),
    ("same range twice", framed('{"a":' + F32_4.format("[0,16]") + ',"b":' + F32_4.format("[0,16]") + "}", bytes(16)), False, False, "overlap"),
    ("reversed offsets", framed('{"a":' + F32_4.format("[0,16]") + ',"b":' + F32_4.format("[16,8]") + "}", bytes(16)), False, False, "end before they begin"),
    ("first offset not 0", framed('{"a":' + F32_4.format("[4,20]") + "}", bytes(20)), False, False, "hole"),
    ("json order differs", framed('{"b":' + F32_4.format("[16,32]") + ',"a":' + F32_4.format("[0,16]") + "}", bytes(32)), True, True, None),
    ("zero-size shares offset", framed('{"z":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},"a":' + U8 + "}", b"\x07"), True, True, None),
    ("trailing byte", framed('{"a":' + U8 + "}", b"\x00\x00"), False, False, "not fully covered"),
    ("data short", framed('{"a":' + F32_4.format("[0,16]") + "}", bytes(15)), False, False, "not fully covered"),
    ("{} plus a byte", framed("{}", b"\x00"), False, False, "not fully covered"),
    ("size mismatch", framed('{"a":{"dtype":"I32","shape":[2,2],"data_offsets":[0,4]}}', bytes(4)), False, False, "needs 16 bytes"),
    ("shape overflow", framed('{"a":{"dtype":"I32","shape":[2,18446744073709551614],"data_offsets":[0,8]}}', bytes(8)), False, False, "overflow"),
    ("F4 odd count", framed('{"a":{"dtype":"F4","shape":[3],"data_offsets":[0,1]}}', bytes(1)), False, False, "byte boundary"),
    ("F6 two", framed('{"a":{"dtype":"F6_E2M3","shape":[2],"data_offsets":[0,1]}}', bytes(1)), False, False, "byte boundary"),
    ("F4 [2,3]", framed('{"a":{"dtype":"F4","shape":[2,3],"data_offsets":[0,3]}}', bytes(3)), True, True, None),
    ("F6 [4]", framed('{"a":{"dtype":"F6_E3M2","shape":[4],"data_offsets":[0,3]}}', bytes(3)), True, True, None),
    ("lowercase dtype", framed('{"a":{"dtype":"u8","shape":[1],"data_offsets":[0,1]}}', b"\x00"), False, False, "unknown dtype `u8`"),
    ("shape 2.0", framed('{"a":{"dtype":"U8","shape":[2.0],"data_offsets":[0,2]}}', bytes(2)), False, False, "shape"),
    ("shape -0", framed('{"a":{"dtype":"U8","shape":[-0],"data_offsets":[0,0]}}'), False, False, "shape"),
    ("shape string", framed('{"a":{"dtype":"U8","shape":["2"],"data_offsets":[0,2]}}', bytes(2)), False, False, "shape"),
    ("offsets 1 item", framed('{"a":{"dtype":"U8","shape":[0],"data_offsets":[0]}}'), False, False, "data_offsets"),
    ("offsets 3 items", framed('{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1,1]}}', b"\x00"), False, False, "data_offsets"),
    ("missing field", framed('{"a":{"dtype":"U8","shape":[1]}}', b"\x00"), False, False, "missing field `data_offsets`"),
    ("metadata value int", framed('{"__metadata__":{"k":1}}'), False, False, "must be a string"),
    ("metadata string", framed('{"__metadata__":"x"}'), False, False, "__metadata__"),
    ("metadata null", framed('{"__metadata__":null}'), True, True, None),
    ("metadata empty", framed('{"__metadata__":{}}'), True, True, None),
    ("empty name", framed('{"":' + U8 + "}", b"\x00"), True, True, None),
    ("depth 200", framed('{"__metadata__":' + "[" * 200 + "]" * 200 + "}"), False, False, "invalid JSON"),
    ("raw control char in key", framed('{"a\x01":' + U8 + "}", b"\x00"), False, False, "invalid JSON"),
    ("lone surrogate", framed('{"\\ud800":' + U8 + "}", b"\x00"), False, False, "invalid JSON"),
    # Where the reference is lax and we are strict.
    ("duplicate key identical", framed('{"a":' + U8 + ',"a":' + U8 + "}", b"\x00"), False, True, "duplicate key `a`"),
    ("duplicate key bogus first", framed('{"a":{"dtype":"U8","shape":[999999999],"data_offsets":[5,7]},"a":' + U8 + "}", b"\x00"), False, True, "duplicate key `a`"),
    ("duplicate metadata key", framed('{"__metadata__":{"k":"1","k":"2"}}'), False, True, "duplicate key `k`"),
    ("unknown tensor field", framed('{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"extra":[]}}', b"\x00"), False, True, "unknown field `extra`"),
    ("dtype as enum map", framed('{"a":{"dtype":{"U8":null},"shape":[1],"data_offsets":[0,1]}}', b"\x00"), False, True, "dtype must be a string"),
    ("positional entry", framed('{"a":["U8",[1],[0,1]]}', b"\x00"), False, True, "must be an object"),
    ("tensor named __metadata__", framed('{"__metadata__":' + U8 + "}", b"\x00"), False, False, "__metadata__"),
]


def reference_accepts(data):
    """The reference's verdict: only its own rejection (SafetensorError) counts as one; any other
    exception (a crash, a changed API) fails the test."""
    try:
        safetensors.deserialize(data)
        return True
    except safetensors.SafetensorError:
        return False


@pytest.mark.parametrize("case_id,data,ours,reference,words", CASES, ids=[c[0] for c in CASES])
def test_vector(tmp_path, cli, case_id, data, ours, reference, words):
    path = tmp_path / "case.safetensors"
    path.write_bytes(data)
    assert reference_accepts(data) == reference, "the reference's verdict changed"
    result = cli("validate", path)
    assert (result.returncode == 0) == ours, result.stdout + result.stderr
    if words:
        assert result.stdout.startswith(f"{path}: "), result.stdout
        assert words in result.stdout, result.stdout


def test_header_of_exactly_the_cap_is_accepted_and_one_more_is_not(tmp_path, cli):
    ok = tmp_path / "cap.safetensors"
    ok.write_bytes(framed(b"{}" + b" " * (100_000_000 - 2)))
    over = tmp_path / "over.safetensors"
    over.write_bytes(framed(b"{}" + b" " * (100_000_001 - 2)))
    result = cli("validate", ok, over)
    assert result.returncode == 1
    assert f"{ok}: ok" in result.stdout
    assert f"{over}: header too large" in result.stdout


def test_inspect_prints_json_per_file_and_fails_on_a_bad_one(tmp_path, cli):
    import numpy as np
    import safetensors.numpy

    good = tmp_path / "model.safetensors"
    safetensors.numpy.save_file(
        {"w": np.zeros((2, 3), np.float32), "b": np.zeros(3, np.int64)}, str(good),
        metadata={"trigger_words": "sks dog", "description": "a test"},
    )
    result = cli("inspect", good)
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["metadata"] == {"trigger_words": "sks dog", "description": "a test"}
    assert [(t["name"], t["dtype"], t["shape"], t["data_offsets"]) for t in info["tensors"]] == [
        ("b", "I64", [3], [0, 24]),
        ("w", "F32", [2, 3], [24, 48]),
    ]
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"xx")
    result = cli("inspect", good, bad)
    assert result.returncode == 1
    assert f"{bad}: header too small" in result.stderr
    assert cli("validate").returncode == 2
