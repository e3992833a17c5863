# Sourced by the benchmarks through prepare.sh (needs $PYTHON from tests/setup-env.sh): makes the other
# loaders' venvs under jvm-connector/bench/.venv/<name> (ignored by git), each an overlay whose own
# packages (jvm-connector/bench/loaders/<name>.txt, pinned) come first and whose base is the
# project's venv (torch and pyspark are not installed twice). A venv is remade only when its list
# or the project venv changes. A venv pip cannot make leaves <name>.unavailable with pip's reason,
# which the benchmark reports; nothing of this touches the test venv.
#
#   make_loader_venvs streaming hf ...
make_loader_venvs() {
  local bench base_site name dir req want site
  bench=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  base_site=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  mkdir -p "$bench/.venv"
  for name in "$@"; do
    dir=$bench/.venv/$name
    req=$bench/loaders/$name.txt
    want=$( (echo "$base_site"; sha256sum "$req") | sha256sum | cut -d' ' -f1)
    if [ "$(cat "$dir/.stamp" 2>/dev/null)" = "$want" ]; then continue; fi
    echo "== making the $name venv ($dir)" >&2
    rm -rf "$dir" "$bench/.venv/$name.unavailable"
    "$PYTHON" -m venv --without-pip "$dir" 2>/dev/null || python3 -m venv --without-pip "$dir"
    site=$("$dir/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    # after the overlay's own site-packages; addsitedir (not a plain path line) so the base's own
    # .pth files count too (a worktree venv that is itself an overlay, an editable install)
    echo "import site; site.addsitedir('$base_site')" > "$site/zz_project_venv.pth"
    if ! "$dir/bin/python" -m pip install -q --disable-pip-version-check -r "$req" > "$dir.pip.log" 2>&1; then
      { echo "pip could not install $req:"; grep -E 'ERROR|error' "$dir.pip.log" | tail -3; } > "$bench/.venv/$name.unavailable"
      cat "$bench/.venv/$name.unavailable" >&2
      continue
    fi
    echo "$want" > "$dir/.stamp"
  done
}
