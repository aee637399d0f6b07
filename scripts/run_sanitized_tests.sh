#!/usr/bin/env bash
# Builds fastree with AddressSanitizer + UndefinedBehaviorSanitizer (CMake option FASTREE_SANITIZE)
# into a throw-away directory and runs the test suite against that build. Fails on any test
# failure and on any sanitizer report, including reports from subprocesses the tests start.
#
#   scripts/run_sanitized_tests.sh                 # the whole suite
#   scripts/run_sanitized_tests.sh tests/test_fuzz.py -k pickle   # any pytest arguments
#
# The developer's own install (editable or not) is left untouched: the sanitized build goes to
# `pip install --target $WORK/site`, put first on PYTHONPATH (scripts/_sanitized_site.sh). The
# build directory (build-asan/, git-ignored) persists so a second run only recompiles what changed.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python}
export PIP_DISABLE_PIP_VERSION_CHECK=1

WORK=$(mktemp -d "${TMPDIR:-/tmp}/fastree-asan.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
SITE="$WORK/site"
LOGS="$WORK/logs"
mkdir -p "$SITE" "$LOGS"

# --no-build-isolation (scripts/_sanitized_site.sh) needs the build requirements in the current
# environment (CI only gets them inside `pip install .`'s isolated build env), CMake and Ninja
# included: a fresh venv has neither, and the machine has no system CMake.
"$PYTHON" -m pip install --quiet "scikit-build-core>=0.10" "pybind11>=3.0.1" cmake ninja
# shellcheck source=scripts/_sanitized_site.sh
source scripts/_sanitized_site.sh
build_sanitized_site "$PYTHON" "$SITE" build-asan FASTREE_SANITIZE=ON

# The ASan runtime must be the first library in the process, and python itself is not built
# with it, so it is preloaded; the UBSan runtime is pulled in by _core's own link line.
# libstdc++ is preloaded too: python does not link it, so when ASan starts it finds no real
# __cxa_throw to intercept and aborts at the first C++ exception (jaxlib throws some).
LIBASAN=$(gcc -print-file-name=libasan.so)
LIBSTDCXX=$(gcc -print-file-name=libstdc++.so)
export LD_PRELOAD="$LIBASAN $LIBSTDCXX"
# Tests that measure resident memory skip themselves: ASan's shadow memory and quarantine of
# freed blocks (256 MiB) make RSS grow with no leak.
export FASTREE_SANITIZED=1
# Only the CPU backend: no probing for TPU/GPU plugins (slow, and irrelevant to fastree).
export JAX_PLATFORMS=cpu
# Route object allocations through malloc so ASan sees them (pymalloc's arenas would hide
# use-after-free and overflows of Python objects).
export PYTHONMALLOC=malloc
# detect_leaks=0: CPython deliberately never frees much of its state (interned strings, static
# types, module dicts at exit), so LeakSanitizer reports thousands of "leaks" that are not ours.
# Reference leaks are what fastree can get wrong, and the test suite checks those with
# sys.getrefcount. Reports go to files under $LOGS so that a report from a subprocess (whose
# stderr a test may swallow) still fails this script.
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:log_path=$LOGS/asan"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:log_path=$LOGS/ubsan"

check_sanitized_core "$PYTHON" "$SITE"

# ASan's instrumented frames are several times larger than a release build's, and the suite's
# deepest walks are deep: importing flax.nnx (treescope) raises the recursion limit to 3000, and
# a custom node that makes a fresh child on every flatten then nests 3000 levels, each a C++ walk
# frame and a Python call. That overflowed the default 8 MiB main-thread stack under ASan, with
# this code and with the previous stop's (tests/test_walkers.py, the endless custom node; the
# release build walks 20,000 such levels in 8 MiB). The sanitized run gets 64 MiB where the hard
# limit allows: stack overflows are not what this run looks for.
ulimit -s 65536 2>/dev/null || ulimit -s "$(ulimit -Hs)" 2>/dev/null || true

status=0
# -p no:cacheprovider: the suite must not write .pytest_cache from a preloaded-ASan process.
"$PYTHON" -m pytest -q -p no:cacheprovider "${@:-tests}" || status=$?

if compgen -G "$LOGS/*" > /dev/null; then
    echo "== sanitizer reports:" >&2
    cat "$LOGS"/* >&2
    status=1
fi
unset LD_PRELOAD
if [ "$status" -eq 0 ]; then
    echo "== sanitized test run: clean"
else
    echo "== sanitized test run: FAILED" >&2
fi
exit "$status"
