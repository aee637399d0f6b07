#!/usr/bin/env bash
# CPython 3.14 on this Debian 12 machine, which has none: Debian forky's own python3.14 binary packages,
# unpacked into ROOT (no root-wide install, nothing compiled), the interpreter patched to use the glibc
# unpacked beside it, and a venv made from it with pip. About a minute; idempotent. `.ci/run` and
# `scripts/version_matrix.py --only py314` use it to test fastree on 3.14 (a fresh CI machine has no
# 3.14 either); it reaches only Debian's archive and PyPI.
#
#   ROOT=<dir> VENV=<dir> bash scripts/get_cp314.sh   (defaults: ./cp314-root and ./venv314)
#
# Build a C extension against it with CPATH="$ROOT/usr/include" (Debian's multiarch pyconfig.h
# includes <x86_64-linux-gnu/python3.14/pyconfig.h>), e.g.
#   CPATH="$ROOT/usr/include" "$VENV/bin/pip" install ".[test]"
# Run the venv's python by its absolute path: 3.14's site warns about a relative sys.prefix.
set -euo pipefail
ROOT=$(realpath -m "${ROOT:-./cp314-root}")
VENV=$(realpath -m "${VENV:-./venv314}")
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
SUITE=${SUITE:-forky}
PKGS="python3.14 python3.14-minimal libpython3.14-minimal libpython3.14-stdlib libpython3.14 python3.14-dev
libpython3.14-dev libexpat1-dev libc6 libssl3t64 libexpat1 zlib1g libffi8 liblzma5 libbz2-1.0 libncursesw6
libreadline8t64 libsqlite3-0 libtinfo6 libuuid1 libzstd1 libdb5.3t64 libmpdec4"

if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c 'import sys, ssl; assert sys.version_info[:2] == (3, 14)' 2>/dev/null; then
  echo "ready: $VENV/bin/python ($("$VENV/bin/python" -c 'import sys; print(sys.version.split()[0])'))"; exit 0
fi
command -v patchelf >/dev/null || { apt-get update -qq >/dev/null; apt-get install -y -qq patchelf >/dev/null; }
mkdir -p "$ROOT/.debs"
if [ ! -x "$ROOT/usr/bin/python3.14" ]; then
  curl -fsS "$MIRROR/dists/$SUITE/main/binary-amd64/Packages.xz" -o "$ROOT/.debs/Packages.xz"
  for p in $PKGS; do
    # the first stanza of package $p: its Filename and SHA256
    read -r file sum < <(xz -dc "$ROOT/.debs/Packages.xz" | awk -v p="$p" '
      $0 == "Package: " p {on=1} on && /^Filename: / {f=$2} on && /^SHA256: / {s=$2}
      on && /^$/ {print f, s; exit}')
    [ -n "${file:-}" ] || { echo "package $p not found in $SUITE"; exit 1; }
    deb="$ROOT/.debs/$(basename "$file")"
    [ -f "$deb" ] || curl -fsS "$MIRROR/$file" -o "$deb"
    echo "$sum  $deb" | sha256sum -c --quiet
    dpkg-deb -x "$deb" "$ROOT"
  done
  lib="$ROOT/usr/lib/x86_64-linux-gnu"
  loader="$lib/ld-linux-x86-64.so.2"
  [ -e "$loader" ] || loader=$(ls "$ROOT"/lib64/ld-linux-x86-64.so.2 "$ROOT"/usr/lib64/ld-linux-x86-64.so.2 2>/dev/null | head -1)
  patchelf --set-interpreter "$loader" --force-rpath --set-rpath "$lib" "$ROOT/usr/bin/python3.14"
fi
"$ROOT/usr/bin/python3.14" -m venv --without-pip "$VENV"
tmp=$(mktemp -d)
python3 -m pip download -q --no-deps -d "$tmp" pip
"$VENV/bin/python" "$(ls "$tmp"/pip-*.whl)/pip" install -q --no-index "$(ls "$tmp"/pip-*.whl)"
rm -rf "$tmp"
"$VENV/bin/python" -c 'import sys, ssl, sqlite3, lzma, bz2, ctypes; print("ready:", sys.executable, sys.version.split()[0])'
