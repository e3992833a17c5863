#!/usr/bin/env bash
# The aarch64 checks, under emulation (qemu-aarch64 user mode) on an x86_64 Linux machine; not part
# of tests/run-all.sh (it takes tens of minutes: spec/contributing.md "aarch64" has the figures).
#   bash tests/aarch64/run.sh [STEP...]      STEP: unit probe jar spark wheel (default: all five)
#  unit   the format, dataset and engine crates' tests built for aarch64-unknown-linux-gnu and run
#         under qemu-aarch64 (cargo's runner);
#  probe  engine/examples/arch_probe (CRC-32C at every alignment, every conversion, decoding at every
#         byte offset, header parse, file bytes) natively and under qemu on three CPU models
#         (max, cortex-a53, neoverse-n1): the outputs must be identical;
#  jar    the connector jar (both libraries inside) on an aarch64 JVM (Debian's openjdk-17 arm64,
#         fetched with apt-get download, never installed) under qemu: JarSmoke.java loads the
#         linux-aarch64 library through NativeLib, calls JNI entry points, validates shards written
#         on x86_64; its output must equal the x86_64 JVM's; a JVM claiming os.arch=riscv64 must get
#         the loader's unsupported-platform error;
#  spark  spark.read.format("safetensors") of the datasets below in a local[1] Spark (pyspark's jars)
#         on that aarch64 JVM (SparkRead.java): rows as JSON must equal the x86_64 JVM's;
#  wheel  the aarch64 wheel (rust-core/python/build-wheel.sh) installed with pip's --platform check
#         for an aarch64 CPython 3.11 (Debian's arm64 python3.11, fetched the same way) with its
#         dependencies' and its bf16 extra's (ml_dtypes) aarch64 wheels; it reads datasets a Spark on x86_64 wrote
#         (write_dataset.py) and read_dataset.py's output must equal the x86_64 package's.
# Installs what it lacks (rust target, gcc-aarch64-linux-gnu, qemu-user; downloads go to
# target/aarch64-emu/, reused by later runs). Exit status 1 at the first difference or failure.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
# shellcheck source=/dev/null
source "$ROOT/tests/setup-env.sh" # venv ($PYTHON), the aarch64 rust target and linker
cd "$ROOT"
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(unit probe jar spark wheel)
for s in "${steps[@]}"; do
  case "$s" in unit | probe | jar | spark | wheel) ;; *)
    echo "aarch64: unknown step '$s' (allowed: unit probe jar spark wheel)" >&2
    exit 2
    ;;
  esac
done

TARGET=aarch64-unknown-linux-gnu
SYSROOT=/usr/aarch64-linux-gnu # libc6-arm64-cross, installed with gcc-aarch64-linux-gnu
WORK=$ROOT/target/aarch64-emu
OUT=$WORK/out
mkdir -p "$WORK" "$OUT" "$WORK/tmp"
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L $SYSROOT"
if ! command -v qemu-aarch64 >/dev/null; then
  sudo=
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq qemu-user >/dev/null
fi

# arm64 .debs from Debian, unpacked into $WORK/root (apt-get with its own state: the machine's apt
# configuration and dpkg database are not touched)
fetch_arm64() {
  local state=$WORK/apt
  local opts=(-o APT::Architecture=arm64 -o "APT::Architectures::=arm64" -o "Dir::State::Lists=$state/lists"
    -o "Dir::Cache=$state/cache" -o "Dir::State::status=$state/status" -o Debug::NoLocking=1)
  mkdir -p "$state/lists/partial" "$state/cache/archives/partial" "$WORK/debs" "$WORK/root"
  touch "$state/status"
  [ -n "$(ls "$state/lists" 2>/dev/null | grep -v partial)" ] || apt-get "${opts[@]}" update -qq
  local pkg
  for pkg in "$@"; do
    if ! ls "$WORK/debs/${pkg}"_*.deb >/dev/null 2>&1; then
      (cd "$WORK/debs" && apt-get "${opts[@]}" download "$pkg:arm64" 2>&1 | grep -v -e '^Get:' -e unsandboxed || true)
      ls "$WORK/debs/${pkg}"_*.deb >/dev/null
      dpkg -x "$WORK/debs/${pkg}"_*.deb "$WORK/root"
    fi
  done
}
ARM_LIBS=$WORK/root/lib/aarch64-linux-gnu:$WORK/root/usr/lib/aarch64-linux-gnu
arm() { QEMU_LD_PREFIX=$SYSROOT LD_LIBRARY_PATH=$ARM_LIBS qemu-aarch64 "$@"; }

timed() { # name command...: runs, prints the seconds it took
  local start=$SECONDS
  "${@:2}"
  echo "aarch64: $1 passed ($((SECONDS - start)) s)"
}

same() { # label x86_file arm_file
  if ! diff -u "$2" "$3" >"$OUT/$1.diff"; then
    echo "aarch64: $1: aarch64 output differs from x86_64 ($(grep -c '^[-+][^-+]' "$OUT/$1.diff") lines, $OUT/$1.diff):" >&2
    head -20 "$OUT/$1.diff" >&2
    return 1
  fi
  echo "aarch64: $1: $(wc -l <"$2") lines identical on x86_64 and aarch64"
}

step_unit() {
  if ! nice cargo test --locked --target "$TARGET" -p safetensors-spark-format -p safetensors-spark-dataset \
    -p safetensors-spark-engine >"$OUT/unit.log" 2>&1; then
    tail -40 "$OUT/unit.log" >&2
    echo "aarch64: unit tests failed under qemu-aarch64 ($OUT/unit.log)" >&2
    return 1
  fi
  grep -E '^test result' "$OUT/unit.log" | awk '{p += $4; f += $6; i += $8} END {print "aarch64: unit: " p " passed, " f " failed, " i " ignored in " NR " test binaries"}'
}

step_probe() {
  nice cargo build --locked --release -q -p safetensors-spark-engine --example arch_probe
  nice cargo build --locked --release -q -p safetensors-spark-engine --example arch_probe --target "$TARGET"
  target/release/examples/arch_probe >"$OUT/probe-x86_64.txt"
  local cpu
  for cpu in max cortex-a53 neoverse-n1; do
    QEMU_CPU=$cpu arm "target/$TARGET/release/examples/arch_probe" >"$OUT/probe-aarch64-$cpu.txt"
    same "probe-$cpu" "$OUT/probe-x86_64.txt" "$OUT/probe-aarch64-$cpu.txt"
  done
}

connector_jar() {
  local jars=(jvm-connector/target/safetensors-spark-[0-9]*.jar)
  if [ ! -f "${jars[0]}" ]; then
    mvn -B -q -f jvm-connector/pom.xml package -DskipTests
    jars=(jvm-connector/target/safetensors-spark-[0-9]*.jar)
  fi
  echo "$ROOT/${jars[0]}"
}

# x86_64 Spark writes the datasets both the jar step and the wheel step read (once per jar build)
datasets() {
  local jar=$1
  if [ ! -f "$WORK/data/.jar" ] || [ "$(cat "$WORK/data/.jar")" != "$(sha256sum "$jar")" ]; then
    rm -rf "$WORK/data"
    "$PYTHON" "$HERE/write_dataset.py" "$jar" "$WORK/data"
    sha256sum "$jar" >"$WORK/data/.jar"
  fi
}

step_jar() {
  local jar
  jar=$(connector_jar)
  datasets "$jar"
  arm_jre
  mkdir -p "$WORK/classes"
  javac -d "$WORK/classes" -cp "$jar" --release 17 "$HERE/JarSmoke.java"
  local files=("$WORK"/data/batch/*.safetensors)
  java -cp "$jar:$WORK/classes" JarSmoke linux-x86_64 "${files[@]}" >"$OUT/jar-x86_64.txt"
  arm "$JRE/bin/java" -cp "$jar:$WORK/classes" JarSmoke linux-aarch64 "${files[@]}" >"$OUT/jar-aarch64.txt"
  same jar "$OUT/jar-x86_64.txt" "$OUT/jar-aarch64.txt"
  # a platform the jar has no library for: the loader's own error, not the JVM's
  local msg want="safetensors-spark: unsupported platform linux-riscv64 (os.name=Linux, os.arch=riscv64): the jar has a native library for linux-x86_64, linux-aarch64 only"
  if msg=$(java -Dos.arch=riscv64 -cp "$jar:$WORK/classes" JarSmoke linux-riscv64 2>&1); then
    echo "aarch64: the jar loaded on os.arch=riscv64" >&2
    return 1
  fi
  grep -qF "UnsatisfiedLinkError: $want" <<<"$msg" ||
    { echo "aarch64: os.arch=riscv64 gave: $msg" >&2; return 1; }
}

JRE=$WORK/root/usr/lib/jvm/java-17-openjdk-arm64
arm_jre() { # Debian's arm64 openjdk-17 JRE, unpacked into $JRE
  fetch_arm64 openjdk-17-jre-headless zlib1g
  # the package's absolute links into /etc/java-17-openjdk (the host's x86_64 JDK has its own):
  # point them at the unpacked copy
  find "$JRE" -type l -lname '/etc/java-17-openjdk/*' | while read -r l; do
    ln -sfn "$WORK/root$(readlink "$l")" "$l"
  done
}

# JDK 17 module opens Spark needs (jvm-connector/pom.xml test.java.opts)
SPARK_OPENS=(--add-opens=java.base/java.lang=ALL-UNNAMED --add-opens=java.base/java.lang.invoke=ALL-UNNAMED
  --add-opens=java.base/java.lang.reflect=ALL-UNNAMED --add-opens=java.base/java.io=ALL-UNNAMED
  --add-opens=java.base/java.net=ALL-UNNAMED --add-opens=java.base/java.nio=ALL-UNNAMED
  --add-opens=java.base/java.util=ALL-UNNAMED --add-opens=java.base/java.util.concurrent=ALL-UNNAMED
  --add-opens=java.base/java.util.concurrent.atomic=ALL-UNNAMED --add-opens=java.base/jdk.internal.ref=ALL-UNNAMED
  --add-opens=java.base/sun.nio.ch=ALL-UNNAMED --add-opens=java.base/sun.nio.cs=ALL-UNNAMED
  --add-opens=java.base/sun.security.action=ALL-UNNAMED --add-opens=java.base/sun.util.calendar=ALL-UNNAMED
  -Djdk.reflect.useDirectMethodHandle=false -Dio.netty.tryReflectionSetAccessible=true)

step_spark() {
  local jar spark_jars
  jar=$(connector_jar)
  datasets "$jar"
  arm_jre
  spark_jars=$("$PYTHON" -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')
  mkdir -p "$WORK/classes"
  javac -d "$WORK/classes" -cp "$jar:$spark_jars/*" --release 17 "$HERE/SparkRead.java"
  local cp="$jar:$spark_jars/*:$WORK/classes" data=("$WORK/data/batch" "$WORK/data/kv")
  SPARK_LOCAL_IP=127.0.0.1 java "${SPARK_OPENS[@]}" -cp "$cp" SparkRead "${data[@]}" >"$OUT/spark-x86_64.txt"
  SPARK_LOCAL_IP=127.0.0.1 arm "$JRE/bin/java" "${SPARK_OPENS[@]}" -Djava.io.tmpdir="$WORK/tmp" -cp "$cp" \
    SparkRead "${data[@]}" >"$OUT/spark-aarch64.txt"
  same spark "$OUT/spark-x86_64.txt" "$OUT/spark-aarch64.txt"
}

step_wheel() {
  local jar
  jar=$(connector_jar)
  datasets "$jar"
  # zig for maturin --zig (build-wheel.sh), in a folder of its own: the venv stays as its
  # requirements file says
  if [ ! -x "$WORK/ziglang/ziglang/zig" ]; then
    "$PYTHON" -m pip install -q --disable-pip-version-check --target "$WORK/ziglang" "ziglang==0.17.1"
  fi
  rm -rf "$WORK/wheels"
  PATH="$WORK/ziglang/ziglang:$PATH" bash rust-core/python/build-wheel.sh "$WORK/wheels"
  local wheels=("$WORK"/wheels/*aarch64.whl)
  [ -f "${wheels[0]}" ] || { echo "aarch64: build-wheel.sh made no aarch64 wheel" >&2; return 1; }
  fetch_arm64 python3.11-minimal libpython3.11-minimal libpython3.11-stdlib libexpat1 libffi8 libssl3 \
    libbz2-1.0 liblzma5 libuuid1 zlib1g
  # pip checks the wheel's tags against an aarch64 CPython 3.11 on a glibc 2.17 (manylinux2014) system
  rm -rf "$WORK/site"
  "$PYTHON" -m pip install -q --disable-pip-version-check --no-compile --target "$WORK/site" \
    --platform manylinux2014_aarch64 --python-version 3.11 --implementation cp --abi cp311 \
    --only-binary=:all: "${wheels[0]}[bf16]" "numpy>=1.24" "fsspec>=2023.1"
  local data=("$WORK/data/batch" "$WORK/data/kv")
  "$PYTHON" "$HERE/read_dataset.py" "${data[@]}" >"$OUT/wheel-x86_64.txt"
  (cd "$WORK" && PYTHONHOME=$WORK/root/usr PYTHONPATH=$WORK/site PYTHONDONTWRITEBYTECODE=1 \
    arm "$WORK/root/usr/bin/python3.11" -c 'import platform, sys; assert platform.machine() == "aarch64", platform.machine()
import safetensors_spark; assert safetensors_spark.__file__.startswith(sys.argv[1]), safetensors_spark.__file__
sys.argv = sys.argv[2:]; exec(open(sys.argv[0]).read())' "$WORK/site" "$HERE/read_dataset.py" "${data[@]}") >"$OUT/wheel-aarch64.txt"
  same wheel "$OUT/wheel-x86_64.txt" "$OUT/wheel-aarch64.txt"
}

total=$SECONDS
for s in "${steps[@]}"; do
  timed "$s" "step_$s"
done
echo "aarch64: all passed (${steps[*]}; $((SECONDS - total)) s)"
