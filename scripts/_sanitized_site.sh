# Sourced by scripts/run_sanitized_tests.sh (ASan + UBSan) and scripts/run_tsan_tests.sh (TSan):
# the part of a sanitizer leg that does not depend on the sanitizer. Not run on its own.
#
# build_sanitized_site PYTHON SITE BUILD_DIR CMAKE_OPTION
#   Builds this checkout with the CMake option (FASTREE_SANITIZE=ON, FASTREE_SANITIZE_THREAD=ON)
#   into the `pip install --target` directory SITE, and makes that build the one `fastree` imports
#   in this shell and in every process it starts. RelWithDebInfo and no stripping (pybind11 strips
#   Release modules), so reports name file:line. --no-build-isolation keeps BUILD_DIR (git-
#   ignored) reusable between runs, so a second run only recompiles what changed; it needs the
#   build requirements in PYTHON's environment (the callers install them).
#
# check_sanitized_core PYTHON SITE
#   Fails unless `fastree._core` imports from SITE (and says which build was imported instead).

build_sanitized_site() {
  local python="$1" site="$2" build_dir="$3" option="$4"
  echo "== building the sanitized extension ($build_dir/, $option)"
  "$python" -m pip install --quiet --no-deps --no-build-isolation --target "$site" \
    -Cbuild-dir="$build_dir" -Ccmake.define."$option" \
    -Ccmake.build-type=RelWithDebInfo -Cinstall.strip=false .
  # An editable install of fastree registers an import hook (a meta-path finder, from a .pth
  # file) that wins over PYTHONPATH. sitecustomize runs after .pth files, in this process and in
  # every subprocess and child interpreter the tests start, so it can take that hook out and let
  # PYTHONPATH decide.
  cat > "$site/sitecustomize.py" <<'PY'
import sys

sys.meta_path[:] = [
    f for f in sys.meta_path if not type(f).__module__.startswith("_editable_skbc_fastree")
]
PY
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
}

check_sanitized_core() {
  local python="$1" site="$2" core
  core=$("$python" -c "import fastree._core as c; print(c.__file__)")
  case "$core" in
    "$site"/*) echo "== testing $core" ;;
    *) echo "error: imported $core instead of the sanitized build in $site" >&2; return 1 ;;
  esac
}
