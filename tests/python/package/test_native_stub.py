"""The native module's stub (safetensors_spark/_native.pyi) names exactly what the module has:
every public function, class, exception and constant, with the same parameters for the
functions (pyo3's text signatures), so a new or changed entry point fails here until the stub
says it too."""

import ast
import inspect
from pathlib import Path

import safetensors_spark
from safetensors_spark import _native

STUB = Path(safetensors_spark.__file__).with_name("_native.pyi")


def stub_names():
    tree = ast.parse(STUB.read_text())
    out = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            out[node.name] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out[node.target.id] = node
        elif isinstance(node, ast.Assign):
            out.update((t.id, node) for t in node.targets if isinstance(t, ast.Name))
    return {k: v for k, v in out.items() if not k.startswith("_")}


def test_the_stub_names_every_public_name_of_the_module_and_no_other():
    runtime = {n for n in dir(_native) if not n.startswith("_")}
    assert set(stub_names()) == runtime


def test_the_stub_functions_take_the_modules_parameters():
    for name, node in stub_names().items():
        if not isinstance(node, ast.FunctionDef):
            continue
        params = [p.name for p in inspect.signature(getattr(_native, name)).parameters.values()]
        assert [a.arg for a in node.args.args] == params, name
