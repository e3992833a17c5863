#!/usr/bin/env bash
# Builds the safetensors_spark wheels, one per Linux architecture the connector supports (x86_64 and
# aarch64), each abi3 (any CPython >= 3.10) and with the connector jar inside (spec/python.md §1):
# copies jvm-connector/target/safetensors-spark-*.jar (built by Maven when absent; it carries the
# native library of both architectures) into python/safetensors_spark/jars/, then runs
# `maturin build --release --zig --compatibility manylinux2014` per target: zig links against
# glibc 2.17, so the wheels are tagged manylinux_2_17 (manylinux2014) and maturin refuses to tag a
# wheel that needs more. Afterwards every wheel is checked: its platform tag, the ELF machine of
# its _native library and the jar inside. Usage:
#   bash rust-core/python/build-wheel.sh [OUT_DIR]      (default OUT_DIR target/wheels)
# Needs maturin and zig (`pip install maturin ziglang`, or a `zig` on PATH; maturin and python3 are
# taken from the venv of tests/setup-env.sh when there is one, else from PATH), and the Rust targets
# (`rustup target add x86_64-unknown-linux-gnu aarch64-unknown-linux-gnu`; added here when missing).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
OUT=${1:-$ROOT/target/wheels}
TARGETS=(x86_64-unknown-linux-gnu aarch64-unknown-linux-gnu)

# maturin and a python3 with ziglang, the venv's first (maturin runs `python3 -m ziglang`)
VENV=${VENV:-$ROOT/.venv}
[ -x "$VENV/bin/python3" ] && export PATH="$VENV/bin:$PATH"
if ! command -v maturin >/dev/null; then
  echo "build-wheel: maturin is not on PATH (pip install maturin)" >&2
  exit 1
fi
if ! python3 -c 'import ziglang' 2>/dev/null && ! command -v zig >/dev/null; then
  echo "build-wheel: maturin --zig needs zig: neither $(command -v python3) has ziglang nor is zig on PATH (pip install ziglang)" >&2
  exit 1
fi
for t in "${TARGETS[@]}"; do
  if [ ! -d "$(rustc --print sysroot)/lib/rustlib/$t" ]; then
    rustup target add "$t"
  fi
done

shopt -s nullglob
jars=("$ROOT"/jvm-connector/target/safetensors-spark-[0-9]*.jar)
if [ ${#jars[@]} -eq 0 ]; then
  mvn -B -q -f "$ROOT/jvm-connector/pom.xml" package -DskipTests
  jars=("$ROOT"/jvm-connector/target/safetensors-spark-[0-9]*.jar)
fi
if [ ${#jars[@]} -ne 1 ]; then
  echo "expected one connector jar in jvm-connector/target, found: ${jars[*]:-none}" >&2
  exit 1
fi
# the copy lives only while the wheels are built: an editable install must keep finding the jar of
# jvm-connector/target, not a stale copy
trap 'rm -rf "$HERE/python/safetensors_spark/jars"' EXIT
rm -rf "$HERE/python/safetensors_spark/jars"
mkdir -p "$HERE/python/safetensors_spark/jars"
cp "${jars[0]}" "$HERE/python/safetensors_spark/jars/"
mkdir -p "$OUT"
# its own target dir: cargo fingerprints the linker, so zig-linked builds in target/ would make the
# next Maven build recompile the jar's aarch64 library (linked with aarch64-linux-gnu-gcc) and back
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target/wheel-build}
# a linker set in the environment (tests/aarch64/run.sh sets the gcc cross linker) wins over
# maturin's zig, and the wheel would then need the build machine's glibc
unset CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_LINKER CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER
for t in "${TARGETS[@]}"; do
  rm -f "$OUT"/safetensors_spark-*"${t%%-*}".whl
  maturin build --release --locked --zig --compatibility manylinux2014 --target "$t" \
    -m "$HERE/Cargo.toml" --out "$OUT"
done

# What a user's pip sees: one wheel per architecture, abi3, manylinux2014, for that machine, with
# the jar (both native libraries) inside.
python3 - "$OUT" "$(basename "${jars[0]}")" <<'EOF'
import glob, sys, zipfile
out, jar = sys.argv[1], sys.argv[2]
machines = {"x86_64": 62, "aarch64": 183}  # ELF e_machine
for arch, machine in machines.items():
    wheels = glob.glob(f"{out}/safetensors_spark-*-cp310-abi3-*{arch}.whl")
    if len(wheels) != 1:
        sys.exit(f"build-wheel: expected one abi3 wheel for {arch} in {out}, found {wheels}")
    wheel = wheels[0]
    tags = wheel.rsplit("-", 1)[1][: -len(".whl")].split(".")
    if f"manylinux_2_17_{arch}" not in tags:
        sys.exit(f"build-wheel: {wheel}: platform tags {tags} lack manylinux_2_17_{arch}")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        natives = [n for n in names if n.startswith("safetensors_spark/_native") and n.endswith(".so")]
        if len(natives) != 1:
            sys.exit(f"build-wheel: {wheel}: expected one _native library, found {natives}")
        head = z.read(natives[0])[:20]
        got = int.from_bytes(head[18:20], "little")
        if head[:4] != b"\x7fELF" or got != machine:
            sys.exit(f"build-wheel: {wheel}: {natives[0]} is not an ELF for {arch} (e_machine {got})")
        if f"safetensors_spark/jars/{jar}" not in names:
            sys.exit(f"build-wheel: {wheel}: the jar safetensors_spark/jars/{jar} is missing")
        with z.open(f"safetensors_spark/jars/{jar}") as j, zipfile.ZipFile(j) as jz:
            for p in ("linux-x86_64", "linux-aarch64"):
                if f"native/{p}/libsafetensors_spark.so" not in jz.namelist():
                    sys.exit(f"build-wheel: {wheel}: its jar has no native/{p}/libsafetensors_spark.so")
    print(f"build-wheel: {wheel} ({'.'.join(tags)}; jar {jar} with linux-x86_64 and linux-aarch64)")
EOF
