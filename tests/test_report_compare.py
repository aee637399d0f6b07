"""``python -m benchmarks.report.compare A.json B.json``: the cells two runs both timed whose
verdicts differ, whose intervals do not overlap, and how far the ratios moved (issue 36, the
suite's run-to-run reproducibility figure). Made-up runs; nothing is timed."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench_results import OPS, PEERS, TREES, synthetic_result

from benchmarks.report.compare import cells, compare, main


def test_the_same_run_twice_agrees_everywhere() -> None:
    result = synthetic_result()
    comparison = compare(result, result)
    timed = len(TREES) * len(OPS) * len(PEERS) + len(result.workloads)
    assert len(comparison.pairs) == timed
    assert comparison.verdict_changes == [] and comparison.disjoint == []
    assert comparison.only_a == comparison.only_b == []
    assert set(comparison.moves) == {1.0}


def test_counts_verdict_changes_disjoint_intervals_and_moves() -> None:
    a = synthetic_result()
    b = synthetic_result(
        ratios={
            ("tuple3", "flatten", "jax"): 1.0,  # faster -> same: a verdict change, disjoint
            ("mlp", "copy", "optree"): 3.3,  # moved 10%, intervals overlap, still faster
            ("mlp", "tree_map3", "jax"): 4.5,  # moved 50%, disjoint, still faster
        },
        speedups={"jit-trace-lower": 0.5},  # same -> slower
    )
    comparison = compare(a, b)
    changed = {cell_a.name for cell_a, _ in comparison.verdict_changes}
    assert changed == {"flatten/tuple3 vs jax", "workload jit-trace-lower"}
    disjoint = {cell_a.name for cell_a, _ in comparison.disjoint}
    assert disjoint == {
        "flatten/tuple3 vs jax",
        "tree_map3/mlp vs jax",
        "workload jit-trace-lower",
    }
    assert sum(move > 1.35 for move in comparison.moves) == 3


def test_cells_only_one_run_has_are_counted_apart() -> None:
    a = synthetic_result()
    b = synthetic_result()
    b.rows = [row for row in b.rows if row.tree != "mlp"]
    b.workloads = b.workloads[:1]
    comparison = compare(a, b)
    assert len(comparison.only_a) == len(OPS) * len(PEERS) + 2
    assert comparison.only_b == []
    # Memory rows and the baseline's own rows are not cells: they have no verdict.
    assert not any("treedef_memory" in name or "fastree" in name for name in cells(a))


def test_main_prints_the_counts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    synthetic_result().write(a)
    synthetic_result(ratios={("tuple3", "flatten", "jax"): 1.0}).write(b)
    assert main([str(a), str(b)]) == 0
    out = capsys.readouterr().out
    total = len(TREES) * len(OPS) * len(PEERS) + 3
    assert f"verdicts that differ: 1 of {total}" in out
    assert "flatten/tuple3 vs jax: faster 3.00× [2.85–3.15] -> same 1.00× [0.95–1.05]" in out
    with pytest.raises(SystemExit):
        main([str(a), str(tmp_path / "missing.json")])
