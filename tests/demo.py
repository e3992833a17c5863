"""Demo: write tensors with the Rust writer, inspect and validate them with the CLI, load them in numpy."""
import json
import subprocess
import tempfile
from pathlib import Path

import ml_dtypes
import numpy as np
import safetensors

ROOT = Path(__file__).resolve().parents[1]
CLI = ROOT / "target/release/safetensors-spark"
WRITE = ROOT / "target/release/examples/write_tensors"

with tempfile.TemporaryDirectory() as tmp:
    tmp = Path(tmp)
    arrays = {
        "embedding": (np.random.default_rng(0).standard_normal((4, 8)).astype(ml_dtypes.bfloat16), "BF16"),
        "label": (np.arange(4, dtype=np.int64), "I64"),
    }
    spec = {"metadata": {"description": "demo shard"}, "tensors": []}
    for name, (arr, dtype) in arrays.items():
        (tmp / f"{name}.bin").write_bytes(arr.tobytes())
        spec["tensors"].append({"name": name, "dtype": dtype, "shape": list(arr.shape), "data_file": str(tmp / f"{name}.bin")})
    (tmp / "spec.json").write_text(json.dumps(spec))
    out = tmp / "demo.safetensors"
    subprocess.run([WRITE, tmp / "spec.json", out], check=True)
    print("$ safetensors-spark inspect demo.safetensors")
    print(subprocess.run([CLI, "inspect", out], check=True, capture_output=True, text=True).stdout)
    print(subprocess.run([CLI, "validate", out], check=True, capture_output=True, text=True).stdout.strip())
    with safetensors.safe_open(str(out), framework="np") as f:
        for name, (arr, _) in arrays.items():
            got = f.get_tensor(name)
            assert got.dtype == arr.dtype and np.array_equal(got.view(np.uint8), arr.view(np.uint8)), name
            print(f"safetensors (Python) reads {name}: {got.dtype} {list(got.shape)} identical")
print("demo ok")
