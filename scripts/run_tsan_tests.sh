#!/usr/bin/env bash
# Builds fastree with ThreadSanitizer (CMake option FASTREE_SANITIZE_THREAD) and runs the threaded
# tests against it on a free-threaded CPython 3.13 that is itself built with ThreadSanitizer
# (scripts/build_cp313t.sh with TSAN=1), the GIL left off. Fails on any test failure and on any
# TSan report, including reports from the child interpreters the tests start
# (tests/concurrent/concurrency_harness.py's `isolated` runs every workload in one where the GIL
# is off). Reports whose racing accesses both lie outside fastree are suppressed by CPython's own
# list of its known races and by scripts/tsan.supp, each entry saying why; a report with a
# fastree (_core) frame is a finding.
#
#   scripts/run_tsan_tests.sh                                  # tests/concurrent tests/test_threads.py
#   scripts/run_tsan_tests.sh tests/concurrent -k key_caches   # any pytest arguments
#   ROOT=<dir> VENV=<dir> scripts/run_tsan_tests.sh            # defaults: ./cp313t-tsan, ./venv313t-tsan
#
# The interpreter is an instrumented one because TSan learns the happens-before edges of PyMutex
# and critical sections (what fastree's locking is built on, docs/threads.md) only from
# instrumented code: with a plain interpreter it reports every object the threads share.
# Where it cannot be built (no network to Debian's archive, a failed build), the leg prints one
# line starting "=== SKIPPED: ThreadSanitizer leg" and exits 0: the skip shows, it never passes
# silently. Everything after the interpreter exists must pass.
#
# The test dependencies are the `test-free-threaded` extra and fastree's own dependencies, wheels
# only (pyproject.toml); fastree itself is built from this checkout into a throw-away
# `pip install --target` directory, put first on PYTHONPATH (scripts/_sanitized_site.sh). The
# build directory (build-tsan/, git-ignored) persists so a second run only recompiles what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(realpath -m "${ROOT:-./cp313t-tsan}")
VENV=$(realpath -m "${VENV:-./venv313t-tsan}")

if ! TSAN=1 ROOT="$ROOT" VENV="$VENV" bash scripts/build_cp313t.sh; then
  echo "=== SKIPPED: ThreadSanitizer leg: scripts/build_cp313t.sh TSAN=1 could not make the interpreter (above)"
  exit 0
fi
PY="$VENV/bin/python"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

WORK=$(mktemp -d "${TMPDIR:-/tmp}/fastree-tsan.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
SITE="$WORK/site"
LOGS="$WORK/logs"
mkdir -p "$SITE" "$LOGS"

# Setting up (pip, the build) runs the instrumented interpreter too: CPython's own races there are
# none of this leg's business, so nothing is reported until the tests start.
export TSAN_OPTIONS="report_bugs=0"
# What fastree needs and the extra lists, read from pyproject.toml; not fastree from the index.
mapfile -t deps < <("$PY" -c '
import tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
print("\n".join(project["dependencies"] + project["optional-dependencies"]["test-free-threaded"]))')
# Wheels only: without it pip builds numpy (and hypothesis's Rust dependency) from source.
# The build requirements too: --no-build-isolation (below) keeps build-tsan/ reusable.
"$PY" -m pip install --quiet --only-binary=:all: "${deps[@]}" \
  "scikit-build-core>=0.10" "pybind11>=3.0.1" cmake ninja
# shellcheck source=scripts/_sanitized_site.sh
source scripts/_sanitized_site.sh
build_sanitized_site "$PY" "$SITE" build-tsan FASTREE_SANITIZE_THREAD=ON
# Only the CPU backend: no probing for TPU/GPU plugins (slow, and irrelevant to fastree).
export JAX_PLATFORMS=cpu
# The interpreter's default, off: fastree declares Py_mod_gil, so importing it keeps it off.
unset PYTHON_GIL

check_sanitized_core "$PY" "$SITE"

# halt_on_error=0: every race in a run is reported, not only the first; exitcode=66 (TSan's own)
# makes a process that reported one fail, which an `isolated` child's test shows. Reports go to
# files under $LOGS (tsan.<pid>) so that one from a child interpreter, whose output a test may
# swallow, still fails this script.
# The suppressions: CPython's own list of the races its free-threaded build is known to have
# (Tools/tsan/suppressions_free_threading.txt of the very source built, kept beside the
# interpreter by scripts/build_cp313t.sh; an interpreter built before it did so has it in its
# build tree), then scripts/tsan.supp.
cpython_supp="$ROOT/share/cpython-tsan-suppressions.txt"
if [ ! -f "$cpython_supp" ]; then
  cpython_supp=$(compgen -G "$ROOT-build/Python-*/Tools/tsan/suppressions_free_threading.txt" | head -n 1 || true)
fi
if [ -z "$cpython_supp" ] || [ ! -f "$cpython_supp" ]; then
  echo "error: CPython's TSan suppressions not found ($ROOT/share/cpython-tsan-suppressions.txt);" \
    "rebuild the interpreter with scripts/build_cp313t.sh TSAN=1" >&2
  exit 1
fi
cat "$cpython_supp" scripts/tsan.supp > "$WORK/tsan.supp"
export TSAN_OPTIONS="halt_on_error=0:exitcode=66:log_path=$LOGS/tsan:suppressions=$WORK/tsan.supp"

status=0
start=$(date +%s)
# -p no:cacheprovider: no .pytest_cache from the instrumented run.
[ $# -gt 0 ] || set -- tests/concurrent tests/test_threads.py
"$PY" -m pytest -q -p no:cacheprovider "$@" || status=$?
echo "== pytest took $(( $(date +%s) - start )) s"

if compgen -G "$LOGS/*" > /dev/null; then
  races=$(cat "$LOGS"/* | grep -c '^WARNING: ThreadSanitizer' || true)
  echo "== ThreadSanitizer reports ($races, in $(ls "$LOGS" | wc -l) processes):" >&2
  cat "$LOGS"/* >&2
  status=1
fi
if [ "$status" -eq 0 ]; then
  echo "== ThreadSanitizer test run: clean"
else
  echo "== ThreadSanitizer test run: FAILED" >&2
fi
exit "$status"
