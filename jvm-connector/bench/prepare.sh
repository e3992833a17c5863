# Sourced by epoch.sh, tokens.sh and remote.sh: the project's venv and $PYTHON
# (tests/setup-env.sh), the connector jar (built with cargo + Maven when jvm-connector/target has
# none) and make_loader_venvs (loaders/venvs.sh).
# shellcheck source=/dev/null
source "$(dirname "${BASH_SOURCE[0]}")/../../tests/setup-env.sh"
if ! ls "$ROOT"/jvm-connector/target/safetensors-spark-*.jar >/dev/null 2>&1; then
  echo "== building the connector jar (cargo + maven)" >&2
  (cd "$ROOT" && mvn -B -q -f jvm-connector/pom.xml package -DskipTests)
fi
# shellcheck source=/dev/null
source "$(dirname "${BASH_SOURCE[0]}")/loaders/venvs.sh"
