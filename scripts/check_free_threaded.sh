#!/usr/bin/env bash
# The free-threaded leg (issue 45, docs/threads.md): a free-threaded CPython 3.13 built here
# (scripts/build_cp313t.sh), fastree installed into a venv of it from this checkout, then
#   1. `import fastree` under -W error, PYTHON_GIL unset: the GIL must stay off by itself (the
#      module declares Py_mod_gil, docs/threads.md);
#   2. the given pytest arguments, the GIL left off the same way, e.g. tests/concurrent and a
#      core subset, or `tests` for the whole suite.
# The test dependencies are the `test-free-threaded` extra (pyproject.toml): libraries with no
# cp313t wheels (flax: tensorstore has none) are left out, and their tests skip.
#
#   ROOT=<dir> VENV=<dir> bash scripts/check_free_threaded.sh [pytest args...]
#
# Where the interpreter cannot be built (no network to Debian's archive, a failed build), the leg
# prints one line starting "=== SKIPPED: free-threaded leg" with the reason, and exits 0: CI shows
# the skip, it never passes silently. Everything after the interpreter exists must pass.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(realpath -m "${ROOT:-./cp313t}")
VENV=$(realpath -m "${VENV:-./venv313t}")

if ! ROOT="$ROOT" VENV="$VENV" bash scripts/build_cp313t.sh; then
  echo "=== SKIPPED: free-threaded leg: scripts/build_cp313t.sh could not make the interpreter (above)"
  exit 0
fi
PY="$VENV/bin/python"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
# Wheels only: without it pip builds numpy (and hypothesis's Rust dependency) from source.
"$PY" -m pip install --quiet --only-binary=:all: ".[test-free-threaded]"
"$PY" -c 'import sys, jax, numpy; print(f"Python {sys.version.split()[0]} (free-threaded), jax {jax.__version__}, numpy {numpy.__version__}")'

unset PYTHON_GIL  # the interpreter's default: off
"$PY" -W error -c '
import sys
import fastree, fastree.tree_util as tu
assert not sys._is_gil_enabled(), "importing fastree turned the GIL on"
leaves, treedef = tu.tree_flatten({"a": [1, (2, 3)], "b": None})
assert tu.tree_unflatten(treedef, leaves) == {"a": [1, (2, 3)], "b": None}
print("import fastree: the GIL is off")
'
"$PY" -m pytest -p no:cacheprovider "$@"
