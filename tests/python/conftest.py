"""Shared fixtures: the repository root and the release build of the Rust tools."""
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RELEASE = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target")) / "release"


@pytest.fixture(scope="session")
def rust_tools():
    """Builds the CLI and the test examples once per session; returns the release directory."""
    subprocess.run(
        ["cargo", "build", "--release", "--locked", "-p", "safetensors-spark-core", "--bins", "--examples"],
        cwd=ROOT,
        check=True,
    )
    return RELEASE


@pytest.fixture(scope="session")
def cli(rust_tools):
    """Runs `safetensors-spark ARGS...` and returns the CompletedProcess."""
    exe = rust_tools / "safetensors-spark"

    def run(*args):
        return subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True)

    return run
