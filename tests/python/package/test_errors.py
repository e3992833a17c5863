"""The package's exceptions are raised by the Rust rules themselves (rust-core/python/src/lib.rs
imports safetensors_spark._errors): ``_native`` defines no exception class of its own, every
native rule that fails raises one of the public classes with a message naming what it is about,
and no module of the package catches a native error to raise another in its place. A hand
translation that comes back fails here."""

import ast
import json
import os
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

import safetensors_spark
from safetensors_spark import (
    ColumnNotFoundError,
    IndexFileError,
    KeyNotFoundError,
    ManifestError,
    SafetensorsSparkError,
    ShardError,
    StateError,
    _native,
)

PUBLIC = {ManifestError, ShardError, IndexFileError, KeyNotFoundError, ColumnNotFoundError, StateError,
          SafetensorsSparkError}
PACKAGE = Path(safetensors_spark.__file__).parent

# the base classes spec/python.md documents: `except ValueError` / `except KeyError` code keeps working
DOCUMENTED_BASES = {
    ManifestError: ValueError,
    ShardError: ValueError,
    IndexFileError: ValueError,
    StateError: ValueError,
    KeyNotFoundError: KeyError,
    ColumnNotFoundError: KeyError,
}


def test_the_public_classes_keep_their_documented_bases():
    for cls, base in DOCUMENTED_BASES.items():
        assert issubclass(cls, SafetensorsSparkError) and issubclass(cls, base), cls
        assert cls.__module__ == "safetensors_spark._errors" and getattr(safetensors_spark, cls.__name__) is cls
    assert issubclass(SafetensorsSparkError, Exception)


def test_the_native_module_defines_no_exception_class_of_its_own():
    classes = {name: v for name in dir(_native) for v in [getattr(_native, name)]
               if isinstance(v, type) and issubclass(v, BaseException)}
    assert all(v in PUBLIC for v in classes.values()), classes


def _header_bytes(tensors, metadata=None):
    """A valid shard's bytes (safetensors' own writer) and its header's N bytes."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "s.safetensors")
        save_file(tensors, p, metadata=metadata)
        data = Path(p).read_bytes()
    n = int.from_bytes(data[:8], "little")
    return data, data[8: 8 + n]


def _kv_header():
    data, head = _header_bytes({"a__x": np.zeros(2, np.float32), "b__x": np.ones(2, np.float32)})
    return _native.Header.parse(head, len(data), "mem://kv.safetensors")


def _batch_header():
    data, head = _header_bytes({"t": np.arange(3, dtype=np.int64), "t.offsets": np.array([0, 1, 2], np.int64)})
    return _native.Header.parse(head, len(data), "mem://batch.safetensors")


def _calls(tmp_path):
    """``(what, call, class, message start)`` for a failing call of every native rule that raises."""
    linked = tmp_path / "linked"
    linked.mkdir()
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", linked / "_manifest_log")
    missing = str(tmp_path / "missing")
    return [
        ("check_prefix", lambda: _native.check_prefix(b"\xff" * 8, 16, "mem://f"), ShardError,
         "mem://f: invalid safetensors file: "),
        ("Header.parse", lambda: _native.Header.parse(b"{not json", 100, "mem://f"), ShardError,
         "mem://f: invalid safetensors file: "),
        ("Header.split_kv", lambda: _kv_header().split_kv([("y", "F32", [2])], "__"), ShardError,
         "mem://kv.safetensors: "),
        ("Header.count_kv_keys", lambda: _kv_header().count_kv_keys([("x", "I64", [2])], "__"), ShardError,
         "mem://kv.safetensors: "),
        ("Header.check_ragged", lambda: _batch_header().check_ragged("t", "NOPE", [], 2), ShardError,
         "mem://batch.safetensors: column 't': unknown dtype NOPE"),
        ("Header.check_index_row",
         lambda: _kv_header().check_index_row("a__x", "I64", [2], 0, 8, "a", "x", "__", "part: key 'a'"),
         IndexFileError, "part: key 'a': "),
        ("check_ragged_offsets", lambda: _native.check_ragged_offsets("t", b"\0" * 7, 0, "mem://f"), ShardError,
         "mem://f: column 't': offsets of 7 bytes"),
        ("parse_manifest", lambda: _native.parse_manifest("{", "mem://m.json"), ManifestError, "mem://m.json: "),
        ("parse_manifest (shard name)",
         lambda: _native.parse_manifest(json.dumps({"schema": {}, "total_samples": 0, "shards": [
             {"shard_path": "../x.safetensors", "samples_count": 0, "bytes": 8}]}), "mem://m.json"),
         ManifestError, "mem://m.json: "),
        ("check_index_file_name", lambda: _native.check_index_file_name("../x.safetensors", "mem://part"),
         IndexFileError, "mem://part: file_name "),
        ("select_version", lambda: _native.select_version("[]", "mem://ds", "3"), ManifestError, "mem://ds: "),
        ("parse_log_entry", lambda: _native.parse_log_entry(1, "{", "mem://ds"), ManifestError, "mem://ds: "),
        ("check_version_shards", lambda: _native.check_version_shards("{", 1, "{}", "mem://ds"), ShardError,
         "mem://ds: "),
        ("log_entry_version", lambda: _native.log_entry_version("9" * 20 + ".json", "mem://ds"), ManifestError,
         "mem://ds: "),
        ("history", lambda: _native.history("not json", "mem://ds"), ManifestError, "mem://ds: "),
        ("own_dir", lambda: _native.own_dir(str(linked), "_manifest_log"), ManifestError,
         f"{linked / '_manifest_log'}: "),
        ("index_part_name", lambda: _native.index_part_name("x.txt"), ManifestError, "'x.txt'"),
        ("vacuum", lambda: _native.vacuum(missing), ManifestError, "vacuum: "),
        ("compact", lambda: _native.compact(missing), ManifestError, "compact: "),
        ("file_crc32c", lambda: _native.file_crc32c(missing), ManifestError, ""),
        ("validate_dataset", lambda: _native.validate_dataset(missing), ManifestError, ""),
    ]


def test_every_native_rule_raises_a_public_class_naming_what_it_is_about(tmp_path):
    seen = set()
    for what, call, cls, start in _calls(tmp_path):
        with pytest.raises(SafetensorsSparkError) as e:
            call()
        assert type(e.value) is cls, (what, type(e.value))
        assert isinstance(e.value, DOCUMENTED_BASES[cls]), what
        assert str(e.value).startswith(start), (what, str(e.value))
        seen.add(what.split(" ")[0])
    # a native rule that can fail and is missing above: add it (the stub lists them all)
    assert {"check_prefix", "parse_manifest", "check_index_file_name", "select_version", "parse_log_entry",
            "check_version_shards", "log_entry_version", "history", "own_dir", "check_ragged_offsets",
            "index_part_name", "vacuum", "compact", "file_crc32c", "validate_dataset"} <= seen


def hand_translations(text, name):
    """Where ``text`` catches a native error to raise another: ``_native.SomeError`` anywhere, or a
    handler of a public class whose body raises a public class (a message rewritten in Python)."""
    names = {c.__name__ for c in PUBLIC}

    def called(r):
        return getattr(r.exc.func, "id", getattr(r.exc.func, "attr", None))

    found = []
    for node in ast.walk(ast.parse(text, name)):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "_native" \
                and node.attr.endswith("Error"):
            found.append(f"{name}:{node.lineno}: _native.{node.attr}")
        if not isinstance(node, ast.ExceptHandler) or node.type is None:
            continue
        caught = {n.id for n in ast.walk(node.type) if isinstance(n, ast.Name)} | \
                 {n.attr for n in ast.walk(node.type) if isinstance(n, ast.Attribute)}
        if not caught & names:
            continue
        for r in ast.walk(ast.Module(body=node.body, type_ignores=[])):
            if isinstance(r, ast.Raise) and isinstance(r.exc, ast.Call) and called(r) in names:
                found.append(f"{name}:{node.lineno}: except {sorted(caught & names)} raises {called(r)}")
    return found


def test_no_module_of_the_package_translates_an_error():
    sources = sorted(PACKAGE.rglob("*.py"))
    assert len(sources) > 10, PACKAGE
    found = [f for source in sources for f in hand_translations(source.read_text(), source.name)]
    assert found == [], found


def test_the_source_check_sees_a_hand_translation():
    """The check above fails on the patterns it is there for (it is not vacuous)."""
    old = ("try:\n    _native.parse_manifest(text)\nexcept _native.ManifestError as e:\n"
           "    raise ManifestError(f'{url}: {e}') from None\n")
    again = ("try:\n    _native.parse_manifest(text, url)\nexcept (OSError, errors.ShardError) as e:\n"
             "    if e:\n        raise IndexFileError(f'{url}: {e}') from None\n")
    allowed = "try:\n    _native.own_dir(root, name)\nexcept ManifestError:\n    linked = True\n"
    assert len(hand_translations(old, "old.py")) == 2
    assert hand_translations(again, "again.py") == ["again.py:3: except ['ShardError'] raises IndexFileError"]
    assert hand_translations(allowed, "allowed.py") == []
