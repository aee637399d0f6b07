#!/usr/bin/env bash
# GPU-backed trees: the benchmark's tree cells with jax-array leaves on the GPU, and the end-to-end
# workloads (the equinox and flax nnx train steps among them) with JAX's default device a GPU.
#
#   bash scripts/gpu_check.sh [OUT_DIR]        (default OUT_DIR: gpu_out/)
#
# For a machine whose python3 already has JAX with CUDA, flax, equinox, optax, pybind11 and
# scikit-build-core, and no network: it builds fastree from this working tree
# (pip install --no-build-isolation --no-index --no-deps .), then runs the suite's quick mode on a
# chosen subset, each step under its own time limit, about 8 minutes in all. OUT_DIR gets:
#   environment.txt   the card (nvidia-smi), Python, the installed libraries, jax.devices()
#   build.log         the pip build
#   bench/            results.json, report.md, chart.png, chart_details.png of the run
#   summary.txt       what ran, what each step returned, how long it took
# Any missing piece (no GPU, a build that fails) ends the script with a message, not a hang.
#
# GPU_CHECK_DEVICE=cpu runs the same steps with the leaves on the CPU: a dry run of the script on
# a machine without a GPU (its figures say nothing about GPUs). GPU_CHECK_BUILD=0 skips step 2 and
# measures the fastree already installed (an editable development install, say).
set -uo pipefail
cd "$(dirname "$0")/.."

OUT="${1:-gpu_out}"
PY="${PYTHON:-python3}"
DEVICE="${GPU_CHECK_DEVICE:-gpu}"
BUILD_LIMIT_S="${GPU_CHECK_BUILD_S:-180}"
BENCH_LIMIT_S="${GPU_CHECK_BENCH_S:-270}"
# The workloads run a plain and an installed process side by side: with JAX's default
# preallocation (75% of the GPU's memory per process) the second one runs out of memory (seen on an
# H200: CUDA_ERROR_OUT_OF_MEMORY in nnx-jit-train-step). Each process takes what it needs instead.
export XLA_PYTHON_CLIENT_PREALLOCATE="${XLA_PYTHON_CLIENT_PREALLOCATE:-false}"
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
say() { echo "$*" | tee -a "$SUMMARY"; }
started=$(date +%s)

# 1. The environment, and whether JAX sees a GPU at all.
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "host: $(uname -srm), $(nproc) CPUs"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  "$PY" - <<'EOF'
import platform
from importlib import metadata
print("python:", platform.python_version(), platform.python_implementation())
for name in ("jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda12-plugin", "flax", "equinox",
             "optax", "chex", "numpy", "optree", "dm-tree", "pybind11", "scikit-build-core"):
    try:
        print(f"{name}: {metadata.version(name)}")
    except metadata.PackageNotFoundError:
        print(f"{name}: not installed")
import jax
print("jax.devices():", jax.devices())
print("default backend:", jax.default_backend())
EOF
} >"$OUT/environment.txt" 2>&1
cat "$OUT/environment.txt"
if [ "$DEVICE" = gpu ] && ! grep -q "^default backend: gpu" "$OUT/environment.txt"; then
  say "gpu_check: JAX has no GPU backend here (see $OUT/environment.txt); nothing measured"
  exit 2
fi

# 2. fastree from this working tree, with every core the machine has.
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
t0=$(date +%s)
if [ "${GPU_CHECK_BUILD:-1}" = 0 ]; then
  say "build: skipped (GPU_CHECK_BUILD=0)"
else
timeout "$BUILD_LIMIT_S" "$PY" -m pip install --no-build-isolation --no-index --no-deps \
  --disable-pip-version-check . >"$OUT/build.log" 2>&1
rc=$?
say "build: exit $rc in $(( $(date +%s) - t0 )) s (limit ${BUILD_LIMIT_S} s)"
if [ $rc -ne 0 ]; then
  tail -n 30 "$OUT/build.log"
  exit 3
fi
fi
# From the repository root Python would find python/fastree only through the install; check that
# the import is the build just made, not a copy from elsewhere.
"$PY" -c "import fastree, fastree._core as c; print('fastree', fastree.__version__, 'from', c.__file__)" \
  | tee -a "$SUMMARY"

# 3. The benchmark, quick mode: every tree cell with jax-array leaves on the device, and the
# end-to-end workloads whose step runs arrays on the default device (a GPU here). The host-only
# workloads (checkpoint-paths, the nnx tree_* calls) are left to the CPU runs.
t0=$(date +%s)
timeout --signal=INT "$BENCH_LIMIT_S" "$PY" -m benchmarks --quick --device "$DEVICE" \
  --leaves jax --only '*/*@jax' \
  --only 'workload/equinox-filter-jit' --only 'workload/nnx-train-step' \
  --only 'workload/nnx-jit-train-step' --only 'workload/nnx-jit-call' \
  --only 'workload/nnx-jax-jit-call' --only 'workload/optax-adamw-eager' \
  --only 'workload/jit-trace-lower' \
  --workload-rounds 3 --out "$OUT/bench" 2>&1 | tee "$OUT/bench.log" | tail -n 60
rc=${PIPESTATUS[0]}
say "benchmark: exit $rc in $(( $(date +%s) - t0 )) s (limit ${BENCH_LIMIT_S} s)"
say "total: $(( $(date +%s) - started )) s"
exit $rc
