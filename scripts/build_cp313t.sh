#!/usr/bin/env bash
# A free-threaded CPython 3.13 ("python3.13t", configure --disable-gil), which Debian does not ship:
# built from the upstream source tarball that Debian's archive carries (python3.13's orig.tar.xz,
# found in SUITE's Sources index and checked against its SHA256), installed into ROOT, and a venv
# made from it (pip from the build's own ensurepip: nothing else is downloaded). 5-12 minutes on
# two cores; idempotent: a run that finds the venv, or the interpreter, ready builds nothing. It
# reaches only Debian's archive (and apt, for build packages that are missing). docs/threads.md
# says how fastree runs without the GIL.
#
#   ROOT=<dir> VENV=<dir> bash scripts/build_cp313t.sh   (defaults: ./cp313t and ./venv313t)
#
# PREFIX=<dir> is another name for ROOT (configure's). WORK=<dir> keeps the build tree and
# build.log (default: ROOT-build); DOWNLOADS=<dir> keeps Sources.xz and the tarball (default: WORK,
# so another build's WORK can lend its download); JOBS (default: nproc), SUITE (default: forky),
# DEBIAN_MIRROR (default: http://deb.debian.org/debian).
#
# TSAN=1: the same interpreter built with ThreadSanitizer (configure --with-thread-sanitizer), for
# scripts/run_tsan_tests.sh. TSan learns the happens-before edges of PyMutex and critical sections
# only from an instrumented interpreter; with a plain one it reports races on every object the
# threads share. Its defaults are ./cp313t-tsan and ./venv313t-tsan, and a ROOT, VENV or build
# tree made the other way is refused rather than mixed. Several times slower than the plain build.
#
# fastree in it: ask pip for wheels only, or it builds the newest numpy from source (it had no
# cp313t wheel when this was written; jax and jaxlib then resolve to the newest release with a
# cp313t jaxlib wheel), e.g.
#   "$VENV/bin/pip" install --only-binary=:all: .
#   "$VENV/bin/python" -c "import sys, fastree; print(sys._is_gil_enabled())"   # False
# fastree._core declares Py_mod_gil, so the import leaves the GIL off (docs/threads.md).
set -euo pipefail
TSAN=${TSAN:-}
case "$TSAN" in
  "" | 0) TSAN=""; suffix="" ;;
  1) suffix="-tsan" ;;
  *) echo "TSAN must be 1, 0 or unset, not '$TSAN'" >&2; exit 2 ;;
esac
ROOT=$(realpath -m "${ROOT:-${PREFIX:-./cp313t$suffix}}")
VENV=$(realpath -m "${VENV:-./venv313t$suffix}")
WORK=$(realpath -m "${WORK:-$ROOT-build}")
DOWNLOADS=$(realpath -m "${DOWNLOADS:-$WORK}")
JOBS=${JOBS:-$(nproc)}
SUITE=${SUITE:-forky}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
PY="$ROOT/bin/python3.13t"

# A free-threaded 3.13 interpreter at $1, built with ThreadSanitizer exactly when TSAN=1: exit
# status 0. report_bugs=0: a TSan interpreter's own races (CPython has some, Tools/tsan lists them)
# must not decide this check; TSAN_OPTIONS means nothing to an uninstrumented interpreter.
free_threaded() {
  [ -x "$1" ] && TSAN_OPTIONS="report_bugs=0" TSAN="$TSAN" "$1" -c 'import os, sys, sysconfig
tsan = "--with-thread-sanitizer" in (sysconfig.get_config_var("CONFIG_ARGS") or "")
assert sys.version_info[:2] == (3, 13) and sysconfig.get_config_var("Py_GIL_DISABLED") == 1
assert tsan == bool(os.environ["TSAN"])' 2>/dev/null
}
# What the interpreter at $1 is, for the refusal below.
describe() {
  TSAN_OPTIONS="report_bugs=0" "$1" -c 'import sys, sysconfig
print(sys.version.split()[0], "free-threaded" if sysconfig.get_config_var("Py_GIL_DISABLED") else "with the GIL",
      "with ThreadSanitizer" if "--with-thread-sanitizer" in (sysconfig.get_config_var("CONFIG_ARGS") or "") else "without ThreadSanitizer")' 2>/dev/null || echo "not runnable"
}
kind="free-threaded${TSAN:+, ThreadSanitizer}"

if free_threaded "$VENV/bin/python"; then
  echo "ready: $VENV/bin/python ($(TSAN_OPTIONS="report_bugs=0" "$VENV/bin/python" -c 'import sys; print(sys.version.split()[0])'), $kind)"
  exit 0
fi
# Something else already there (the other kind of build, another version): refuse, never mix.
for p in "$VENV/bin/python" "$PY"; do
  if [ -x "$p" ] && ! free_threaded "$p"; then
    echo "$p is $(describe "$p"), not the $kind 3.13 wanted; choose another ROOT/VENV" >&2
    exit 1
  fi
done

if ! free_threaded "$PY"; then
  # 1. Build packages (Debian's names); only those missing are installed.
  DEPS="build-essential pkg-config curl xz-utils libssl-dev zlib1g-dev libffi-dev libbz2-dev liblzma-dev
libsqlite3-dev"
  missing=""
  for p in $DEPS; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
  if [ -n "$missing" ]; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq >/dev/null
    # shellcheck disable=SC2086  # a list of package names
    $SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
  fi

  # 2. The python3.13 source package's upstream tarball and its SHA256, from SUITE's Sources index.
  mkdir -p "$WORK" "$DOWNLOADS"
  cd "$DOWNLOADS"
  [ -s Sources.xz ] || curl -fsS "$MIRROR/dists/$SUITE/main/source/Sources.xz" -o Sources.xz
  read -r sum tarball < <(xz -dc Sources.xz | awk '
    /^Package: python3\.13$/ {p=1}
    p && /^Checksums-Sha256:/ {c=1; next}
    p && c && /orig\.tar\.xz$/ {print $1, $3; exit}
    p && c && /^[^ ]/ {c=0}
    /^$/ {p=0; c=0}')
  [ -n "${tarball:-}" ] || { echo "python3.13's orig tarball not found in $SUITE's Sources" >&2; exit 1; }

  # 3. Download (kept across runs) and verify.
  if [ ! -s "$tarball" ] || ! echo "$sum  $tarball" | sha256sum -c --quiet - 2>/dev/null; then
    curl -fsS "$MIRROR/pool/main/p/python3.13/$tarball" -o "$tarball"
    echo "$sum  $tarball" | sha256sum -c --quiet -
  fi
  echo "source: $DOWNLOADS/$tarball"
  tarball="$DOWNLOADS/$tarball"
  cd "$WORK"

  # 4. Unpack: the tarball's own top folder (Python-<version>). awk reads the whole listing: a
  # `head -1` would end tar with SIGPIPE, which pipefail makes fatal.
  src=$(tar -tJf "$tarball" | awk -F/ 'NR == 1 {print $1}')
  [ -f "$src/configure" ] || tar -xJf "$tarball"
  cd "$src"

  # 5. Configure, build, install; the output goes to build.log (its end is shown on failure). A
  # tree configured before is reused only if it was configured the same way.
  config=(--disable-gil --prefix="$ROOT" --with-ensurepip=install ${TSAN:+--with-thread-sanitizer})
  if [ -f Makefile ]; then
    had=$(./config.status --config 2>/dev/null || true)
    if [ "$had" != "${config[*]}" ]; then
      echo "$WORK/$src was configured with: $had; this build needs: ${config[*]}; choose another WORK" >&2
      exit 1
    fi
  fi
  # The build runs the interpreter it builds (module setup, compileall, ensurepip): under TSan, a
  # race CPython itself reports must not fail it (exitcode=0); its known ones are not printed.
  if [ -n "$TSAN" ]; then
    export TSAN_OPTIONS="exitcode=0:suppressions=$WORK/$src/Tools/tsan/suppressions_free_threading.txt"
  fi
  start=$(date +%s)
  log="$WORK/build.log"
  if ! {
    { [ -f Makefile ] || ./configure "${config[@]}"; } &&
      nice -n 10 make -j"$JOBS" && make install
  } >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    echo "the build failed: $log" >&2
    exit 1
  fi
  echo "built and installed into $ROOT in $(( $(date +%s) - start )) s"
  # CPython's own list of its known free-threading races, kept beside the interpreter for
  # scripts/run_tsan_tests.sh (which adds it to its own).
  if [ -n "$TSAN" ]; then
    mkdir -p "$ROOT/share"
    cp Tools/tsan/suppressions_free_threading.txt "$ROOT/share/cpython-tsan-suppressions.txt"
  fi
  free_threaded "$PY" || { echo "$PY is $(describe "$PY"), not the $kind 3.13 wanted" >&2; exit 1; }
fi

TSAN_OPTIONS="report_bugs=0" "$PY" -m venv "$VENV"
TSAN_OPTIONS="report_bugs=0" "$VENV/bin/python" -c 'import sys, sysconfig, ssl, sqlite3, lzma, bz2, ctypes
print("ready:", sys.executable, sys.version.split()[0], end=", ")'
free_threaded "$VENV/bin/python" && echo "$kind" || { echo "not the $kind 3.13 wanted" >&2; exit 1; }
