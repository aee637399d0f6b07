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
# PREFIX=<dir> is another name for ROOT (configure's). WORK=<dir> keeps the tarball, the build
# tree and build.log (default: ROOT-build); JOBS (default: nproc), SUITE (default: forky),
# DEBIAN_MIRROR (default: http://deb.debian.org/debian).
#
# fastree in it: ask pip for wheels only, or it builds the newest numpy from source (it had no
# cp313t wheel when this was written; jax and jaxlib then resolve to the newest release with a
# cp313t jaxlib wheel), e.g.
#   "$VENV/bin/pip" install --only-binary=:all: .
#   "$VENV/bin/python" -c "import sys, fastree; print(sys._is_gil_enabled())"   # False
# fastree._core declares Py_mod_gil, so the import leaves the GIL off (docs/threads.md).
set -euo pipefail
ROOT=$(realpath -m "${ROOT:-${PREFIX:-./cp313t}}")
VENV=$(realpath -m "${VENV:-./venv313t}")
WORK=$(realpath -m "${WORK:-$ROOT-build}")
JOBS=${JOBS:-$(nproc)}
SUITE=${SUITE:-forky}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
PY="$ROOT/bin/python3.13t"

# A free-threaded 3.13 interpreter at $1: exit status 0.
free_threaded() {
  [ -x "$1" ] && "$1" -c 'import sys, sysconfig
assert sys.version_info[:2] == (3, 13) and sysconfig.get_config_var("Py_GIL_DISABLED") == 1' 2>/dev/null
}

if free_threaded "$VENV/bin/python"; then
  echo "ready: $VENV/bin/python ($("$VENV/bin/python" -c 'import sys; print(sys.version.split()[0])'), free-threaded)"
  exit 0
fi

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
  mkdir -p "$WORK"
  cd "$WORK"
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
  echo "source: $tarball"

  # 4. Unpack: the tarball's own top folder (Python-<version>). awk reads the whole listing: a
  # `head -1` would end tar with SIGPIPE, which pipefail makes fatal.
  src=$(tar -tJf "$tarball" | awk -F/ 'NR == 1 {print $1}')
  [ -f "$src/configure" ] || tar -xJf "$tarball"
  cd "$src"

  # 5. Configure, build, install; the output goes to build.log (its end is shown on failure).
  start=$(date +%s)
  log="$WORK/build.log"
  if ! {
    { [ -f Makefile ] || ./configure --disable-gil --prefix="$ROOT" --with-ensurepip=install; } &&
      nice -n 10 make -j"$JOBS" && make install
  } >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    echo "the build failed: $log" >&2
    exit 1
  fi
  echo "built and installed into $ROOT in $(( $(date +%s) - start )) s"
  free_threaded "$PY" || { echo "$PY is not a free-threaded 3.13" >&2; exit 1; }
fi

"$PY" -m venv "$VENV"
"$VENV/bin/python" -c 'import sys, sysconfig, ssl, sqlite3, lzma, bz2, ctypes
print("ready:", sys.executable, sys.version.split()[0], "free-threaded" if sysconfig.get_config_var("Py_GIL_DISABLED") else "WITH THE GIL")'
