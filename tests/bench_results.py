"""Made-up benchmark results (nothing timed), shared by the tests of the suite's reporting:
tests/test_report_destination.py and tests/test_report_compare.py.

The benchmark suite is not part of the installed package, so the repository root is put on
sys.path here, once, for the modules that import this one.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks.measure import stats  # noqa: E402
from benchmarks.measure.results import Row, RunResult, TreeInfo, WorkloadRow  # noqa: E402

TREES = ("tuple3", "mlp")
OPS = ("flatten", "tree_map3", "copy", "treedef_hash")
PEERS = ("jax", "optree")


def row(tree: str, op: str, library: str, ratio: float, spread: float = 0.05) -> Row:
    """One timed cell: ``ratio``, its interval +-``spread`` (the baseline: 1.0, no interval)."""
    baseline = library == "fastree"
    low, high = (None, None) if baseline else (ratio * (1 - spread), ratio * (1 + spread))
    return Row(
        tree, op, library, "ns", 1000.0 * ratio, 900.0 * ratio, 300.0 * ratio, ratio, 1, 5,
        ratio_low=low, ratio_high=high, confidence=None if baseline else 0.9375,
        verdict=None if baseline else stats.verdict(low, high),
        samples=[1000.0 * ratio] * 5,
    )  # fmt: skip


def workload(
    name: str, speedup: float, group: str = "program", spread: float = 0.05
) -> WorkloadRow:
    low, high = speedup * (1 - spread), speedup * (1 + spread)
    return WorkloadRow(
        name, f"what {name} does", f"why {name}", group=group, plain=2e6 * speedup,
        installed=2e6, speedup=speedup, speedup_low=low, speedup_high=high,
        confidence=0.979, verdict=stats.verdict(low, high), rounds=10,
        loops={"plain": 1, "installed": 1},
    )  # fmt: skip


def synthetic_result(
    ratios: dict[tuple[str, str, str], float] | None = None,
    speedups: dict[str, float] | None = None,
    **settings: object,
) -> RunResult:
    """A quick run over TREES x OPS against PEERS, three workloads and treedef memory; every
    ratio 3.0 and every speedup 2.0 unless ``ratios`` ((tree, op, peer) -> ratio) or
    ``speedups`` (workload -> speedup) say otherwise. ``settings`` override the run's settings."""
    ratios = ratios or {}
    speedups = {"eqx-train-step": 2.0, "jit-trace-lower": 1.0, "nnx-split": 8.0, **(speedups or {})}
    result = RunResult(
        environment={
            "cpu": "test cpu",
            "cpu_count": 2,
            "date": "2026-01-02T03:04:05+00:00",
            "python": "3.x",
            "device": "cpu",
            "source_revision": "abc1234",
            "load_average_start": [1.5, 1.2, 1.0],
            "load_average_end": [2.25, 1.5, 1.1],
            "workload_libraries": "equinox 0, flax 0",
        },
        settings={
            "mode": "quick",
            "command": "python -m benchmarks --quick",
            "target_ms_per_round": 2,
            "min_rounds": 5,
            "max_rounds": 11,
            "tolerance": 0.05,
            "max_seconds_per_case": 1.0,
            "workload_pairs": 2,
            "workload_rounds": 5,
            "only": [],
            "leaves": "default",
            **settings,
        },
        baseline="fastree",
        libraries={"fastree": "0.1", "jax": "0.2", "optree": "0.3"},
        duration_s=480.0,
    )
    for tree in TREES:
        result.trees.append(TreeInfo(tree, f"{tree}, as built", "numpy", 3, 4))
        for op in OPS:
            result.rows.append(row(tree, op, "fastree", 1.0))
            for peer in PEERS:
                result.rows.append(row(tree, op, peer, ratios.get((tree, op, peer), 3.0)))
    for library, size in (("fastree", 30.0), ("jax", 75.0), ("optree", 190.0)):
        result.rows.append(
            Row("mlp", "treedef_memory", library, "bytes/node", size, size, None, size / 30,
                None, 3)  # fmt: skip
        )
    groups = {"nnx-split": "nnx model"}
    result.workloads = [
        workload(name, speedup, groups.get(name, "program")) for name, speedup in speedups.items()
    ]
    return result
