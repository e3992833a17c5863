"""Dataset rules live once, in Rust (issue 42): the Python package takes the dataset's file names,
shard metadata keys, the default KV separator, the ragged offsets name and the log entry name from
``_native`` (dataset::names). A copy that comes back as a string literal in the package's sources
fails here; the values themselves are checked against the Rust rules' behaviour."""

import ast
from pathlib import Path

import pytest

import safetensors_spark
from safetensors_spark import _native

PACKAGE = Path(safetensors_spark.__file__).parent

RULE_VALUES = {_native.MANIFEST_FILE_NAME, _native.MANIFEST_LOG_DIR, _native.INDEX_DIR_NAME,
               _native.LAYOUT_METADATA_KEY, _native.KV_SEPARATOR_METADATA_KEY, _native.SAMPLES_METADATA_KEY,
               _native.PADDED_SAMPLES_METADATA_KEY, _native.RAGGED_METADATA_KEY, _native.DEFAULT_KV_SEPARATOR}


def literals(tree):
    """Every string constant that is not a docstring, and every f-string's literal parts and
    format specs."""
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node
        elif isinstance(node, ast.FormattedValue) and node.format_spec is not None:
            for part in node.format_spec.values:
                if isinstance(part, ast.Constant):
                    yield ast.Constant(value="format:" + part.value, lineno=node.lineno)


@pytest.mark.parametrize("source", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_copy_of_a_dataset_rule_in_the_python_sources(source):
    copies = []
    for node in literals(ast.parse(source.read_text())):
        v = node.value
        if v in RULE_VALUES or v == ".offsets" or v.endswith(".offsets") or v == "format:020d" or v == "format:020":
            copies.append((node.lineno, v))
    assert copies == [], f"{source.name}: literal copies of Rust dataset rules (use _native's): {copies}"


def test_the_native_rules_are_the_published_ones():
    assert _native.MANIFEST_FILE_NAME == "dataset_manifest.json"
    assert _native.manifest_log_file_name(7) == "00000000000000000007.json"
    assert _native.log_entry_version(_native.manifest_log_file_name(12345), "dataset") == 12345
    assert _native.ragged_offsets_name("tokens") == "tokens.offsets"
    assert _native.DEFAULT_KV_SEPARATOR == "__"
    assert all(k.startswith("safetensors_spark.") for k in (_native.LAYOUT_METADATA_KEY, _native.SAMPLES_METADATA_KEY,
                                                             _native.PADDED_SAMPLES_METADATA_KEY,
                                                             _native.RAGGED_METADATA_KEY,
                                                             _native.KV_SEPARATOR_METADATA_KEY))
