"""The builtin-shape floor workloads (benchmarks/workloads/floor.py) and their report table.

Behaviour only, nothing about how fast anything is: each floor workload's twin holds the very
leaves of the library's tree; the workloads run in a plain and an installed process at their tiny
size and give each process a distance from the floor; the child times a floor with its call and
answers both; the runner pairs call and floor round by round; results.json keeps the distances;
report.md, the README's figures block and the stdout table show them, and the chart and the
speedup tables leave the floor rows out.
"""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from bench_results import REPO_ROOT  # noqa: F401 - puts the repository root on sys.path

from benchmarks.measure.child import ANSWER_PREFIX, serve
from benchmarks.measure.results import FloorDistance, RunResult, WorkloadRow
from benchmarks.measure.workloads import (
    INSTALLED,
    PLAIN,
    installed_mode_unavailable,
    run_workloads,
)
from benchmarks.report import readme as readme_blocks
from benchmarks.report import render_markdown, render_table
from benchmarks.selection import case_selected
from benchmarks.workloads import WORKLOAD_OP, WORKLOADS
from benchmarks.workloads.base import FLOOR, Workload
from benchmarks.workloads.floor import (
    check_builtin_twin,
    check_same_leaves,
    foreign_nodes,
    mirror_containers,
    with_floor,
)

FLOOR_WORKLOADS = [w for w in WORKLOADS if w.group == FLOOR]
EXPECTED = {
    "nnx-floor-flatten",
    "nnx-floor-unflatten",
    "nnx-floor-jit-state",
    "nnx-floor-jit-call",
    "nnx-floor-decode-graph",
    "nnx-floor-decode-tree",
    "nnx-floor-decode-jax-jit",
    "equinox-floor-flatten",
    "equinox-floor-unflatten",
    "equinox-floor-filter-jit",
}


def test_the_floor_workloads_are_in_the_suite_last() -> None:
    assert {w.name for w in FLOOR_WORKLOADS} == EXPECTED
    # After every other workload: report.md and the README list them in a table of their own.
    assert [w.group for w in WORKLOADS[-len(FLOOR_WORKLOADS) :]] == [FLOOR] * len(EXPECTED)
    for workload in FLOOR_WORKLOADS:
        assert set(workload.sizes) == {"tiny", "quick", "full"}
        assert case_selected(WORKLOAD_OP, workload.name, ["workload/*-floor-*"])


def test_mirror_keeps_the_leaves_in_builtin_containers() -> None:
    from collections import namedtuple

    class Node:
        def __init__(self, *children: Any) -> None:
            self.children = list(children)

    pair = namedtuple("pair", "a b")
    tree = [Node(1, (2, 3)), {"k": pair(4, Node(5))}]

    def node(x: Any) -> Any | None:
        return {"children": mirror_containers(x.children, node)} if isinstance(x, Node) else None

    twin = mirror_containers(tree, node)
    assert twin == [{"children": [1, (2, 3)]}, {"k": pair(4, {"children": [5]})}]
    assert type(twin[1]["k"]) is pair


def test_check_same_leaves_refuses_a_twin_with_other_leaves() -> None:
    pytest.importorskip("jax")
    a, b = object(), object()
    assert check_same_leaves([a, (b,)], {"x": b, "y": a}) == 2  # any order
    with pytest.raises(RuntimeError, match="other leaves"):
        check_same_leaves([a, b], [a, object()])


def test_a_twin_with_a_library_node_or_another_shape_is_refused() -> None:
    jax = pytest.importorskip("jax")
    from collections import namedtuple

    class Box:
        def __init__(self, x: Any) -> None:
            self.x = x

    jax.tree_util.register_pytree_node(Box, lambda b: ((b.x,), None), lambda _, c: Box(*c))
    pair = namedtuple("pair", "a b")
    a, b = object(), object()
    assert foreign_nodes([pair(a, None), {"k": (b,)}]) == []
    assert foreign_nodes({"k": [Box(a)]}) == [f"['k'][0]: {Box.__module__}.{Box.__qualname__}"]
    with pytest.raises(RuntimeError, match="keeps library nodes"):
        check_builtin_twin([Box(a)], [Box(a)])
    # The same leaves, builtin nodes, but not the tree's shape: one node more.
    with pytest.raises(RuntimeError, match="nodes, the tree"):
        check_builtin_twin([Box(a)], [[(a,)]])
    assert check_builtin_twin([Box(a)], [(a,)]) == 1


@pytest.mark.parametrize("library", ["nnx", "equinox"])
def test_the_library_twins_are_builtin_nodes_of_the_models_shape(library: str) -> None:
    # The floor rows measure against this twin: it must be builtin nodes only, with the model's
    # leaves and number of nodes (an nnx Pytree's PytreeState and an nnx.State included).
    if library == "nnx":
        pytest.importorskip("flax.nnx")
        from benchmarks.workloads import nnx_floor
        from benchmarks.workloads.nnx_ops import _state

        state = _state.__wrapped__(2)
        tree, twin = (state.model, state.optimizer), nnx_floor.mirror((state.model, state.optimizer))
    else:
        pytest.importorskip("equinox")
        from benchmarks.workloads import equinox_floor
        from benchmarks.workloads.equinox_ops import _model

        tree = _model(2)
        twin = equinox_floor.mirror(tree)
    assert foreign_nodes(twin) == []
    assert check_builtin_twin(tree, twin) > 0


def test_protocol_floor_stand_ins_have_the_models_shape() -> None:
    # scripts/nnx_protocol_floor.py times jaxlib's custom-node protocol on stand-ins of no cost:
    # they must be the model's tree, node for node and leaf for leaf, with every custom node a
    # Stand (whose flatten gives the node's own children and aux data) and nothing else custom.
    pytest.importorskip("flax.nnx")
    import importlib.util
    import operator

    import jax
    from benchmarks.workloads.nnx_ops import _state

    spec = importlib.util.spec_from_file_location(
        "nnx_protocol_floor", REPO_ROOT / "scripts" / "nnx_protocol_floor.py"
    )
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    jax.tree_util.register_pytree_node(script.Stand, operator.attrgetter("pair"), operator.is_)

    state = _state.__wrapped__(2)
    tree = (state.model, state.optimizer)
    stands = script.stand_ins(tree)
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    stand_leaves, stand_treedef = jax.tree_util.tree_flatten(stands)
    assert [id(x) for x in stand_leaves] == [id(x) for x in leaves]
    assert stand_treedef.num_nodes == treedef.num_nodes

    def kinds(t: Any) -> list[str]:
        """The tree's nodes in flatten order: "builtin", "leaf" or a custom node's class name."""
        if t is None:
            return ["builtin"]
        try:
            children, _ = jax.tree_util.flatten_one_level(t)
        except ValueError:
            return ["leaf"]
        name = "builtin" if isinstance(t, (list, tuple, dict)) else type(t).__name__
        return [name] + [k for child in children for k in kinds(child)]

    real, standing = kinds(tree), kinds(stands)
    assert len(real) == len(standing)
    for a, b in zip(real, standing):
        assert (a, b) in {("builtin", "builtin"), ("leaf", "leaf")} or b == "Stand", (a, b)
    assert standing.count("Stand") == sum(1 for k in real if k not in ("builtin", "leaf")) > 0


@pytest.fixture(scope="module")
def floor_rows() -> dict[str, WorkloadRow]:
    """The floor workloads at their tiny size: one plain and one installed process, one round."""
    if installed_mode_unavailable() is not None:
        pytest.skip(installed_mode_unavailable())
    return {row.name: row for row in run_workloads(FLOOR_WORKLOADS, "tiny", 0, 1, 1)}


@pytest.mark.parametrize("workload", FLOOR_WORKLOADS, ids=lambda w: w.name)
def test_floor_workload_gives_each_process_a_distance(
    workload: Workload, floor_rows: dict[str, WorkloadRow]
) -> None:
    row = floor_rows[workload.name]
    if row.not_run and row.not_run.startswith("unavailable"):
        pytest.skip(row.not_run)  # flax, equinox or optax is missing
    assert row.not_run is None, row.not_run
    assert row.group == FLOOR and row.plain > 0 and row.installed > 0
    assert set(row.floor) == {PLAIN, INSTALLED}
    for distance in row.floor.values():
        assert distance.ratio > 0 and distance.floor_ns > 0 and len(distance.floor_samples) == 1
        assert distance.low <= distance.ratio <= distance.high
    assert "leaves" in row.description


def test_child_times_the_floor_with_the_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """A workload with a floor: both are warmed up and calibrated, and each turn answers both."""
    toy = Workload("floor-toy", "a toy", "why", lambda _size: with_floor(
        lambda: [1.0], lambda: [1.0], "toy"), {"tiny": 1}, FLOOR)  # fmt: skip
    from benchmarks.measure import child

    monkeypatch.setattr(child, "WORKLOADS", (toy,))
    requests = [
        {"cmd": "build", "name": "floor-toy", "size": "tiny", "target_ns": 0},
        {"cmd": "time", "name": "floor-toy"},
    ]
    out = io.StringIO()
    serve([json.dumps(r) + "\n" for r in requests], out)
    built, timed = (json.loads(line[len(ANSWER_PREFIX) :]) for line in out.getvalue().splitlines())
    assert built["loops"] == 1 and len(built["fingerprint"]) == 128  # the call's and the floor's
    assert set(timed) == {"ns", "floor_ns"} and timed["ns"] > 0 and timed["floor_ns"] > 0


class _Child:
    def __init__(self, mode: str) -> None:
        self.mode = mode

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        if request["cmd"] == "mode":
            return {"installed": self.mode == INSTALLED}
        if request["cmd"] == "build":
            return {"size": "toy", "fingerprint": "same", "loops": 1}
        # The call takes 3x its floor plain, 1.5x installed.
        return {"ns": 300.0 if self.mode == PLAIN else 150.0, "floor_ns": 100.0}

    def close(self) -> None:
        pass


def test_runner_pairs_call_and_floor_round_by_round() -> None:
    toy = Workload("toy", "a toy", "why", lambda _size: None, {"tiny": 1}, FLOOR)  # type: ignore
    (row,) = run_workloads([toy], "tiny", 0, pairs=2, rounds=3, spawn=_Child)
    assert row.rounds == 6 and row.speedup == pytest.approx(2.0)
    assert row.floor[PLAIN].ratio == pytest.approx(3.0)
    assert row.floor[INSTALLED].ratio == pytest.approx(1.5)
    assert row.floor[PLAIN].floor_samples == [100.0] * 6
    # A workload without a floor has no distances.
    plain = Workload("plain-toy", "a toy", "why", lambda _size: None, {"tiny": 1})  # type: ignore

    class NoFloor(_Child):
        def ask(self, request: dict[str, Any]) -> dict[str, Any]:
            answer = super().ask(request)
            answer.pop("floor_ns", None)
            return answer

    (row,) = run_workloads([plain], "tiny", 0, pairs=1, rounds=2, spawn=NoFloor)
    assert row.floor == {} and row.speedup == pytest.approx(2.0)


def _result() -> RunResult:
    result = RunResult(
        environment={"date": "today"},
        settings={"mode": "quick", "command": "python -m benchmarks --quick"},
        baseline="fastree",
        libraries={"fastree": "0"},
    )
    timed = {"rounds": 4, "confidence": 0.875, "verdict": "faster", "speedup_low": 1.9,
             "speedup_high": 2.1}  # fmt: skip
    result.workloads = [
        WorkloadRow("nnx-split", "a split", "why", group="nnx model", plain=2e3, installed=1e3,
                    speedup=2.0, **timed),
        WorkloadRow("nnx-floor-flatten", "a flatten against the twin's", "why", group=FLOOR,
                    plain=6e3, installed=3e3, speedup=2.0, **timed,
                    floor={PLAIN: FloorDistance(6.0, 5.5, 6.5, 0.875, 1e3, [1e3] * 4),
                           INSTALLED: FloorDistance(3.0, 2.8, 3.2, 0.875, 1e3, [1e3] * 4)}),
        WorkloadRow("equinox-floor-flatten", "a flatten", "why", group=FLOOR,
                    not_run="unavailable: equinox is not installed"),
    ]  # fmt: skip
    return result


def test_results_json_keeps_the_distances() -> None:
    result = _result()
    again = RunResult.from_json(result.to_json())
    assert again.workloads == result.workloads
    assert isinstance(again.workloads[1].floor[PLAIN], FloorDistance)


def test_report_has_the_floor_table() -> None:
    report = render_markdown(_result(), None)
    assert "## Distance from the builtin-shape floor" in report
    assert (
        "| **nnx-floor-flatten**: a flatten against the twin's | 1 µs | 6 µs | 6.00× [5.50–6.50] "
        "| 3 µs | 3.00× [2.80–3.20] |" in report
    )
    assert "| **equinox-floor-flatten**: a flatten | – | – | – | – | unavailable:" in report
    # The speedup tables hold the other workloads only, and come first.
    speedups = report.split("## Distance from the builtin-shape floor")[0]
    assert "| **nnx-split**: a split |" in speedups and "floor-flatten" not in speedups
    table = render_table(_result())
    assert "plain/floor 6.00x [5.50–6.50]  installed/floor 3.00x [2.80–3.20]" in table


def test_readme_block_quotes_the_report_distances() -> None:
    result = _result()
    lines = readme_blocks._workloads(result)
    report = render_markdown(result, None)
    floor_lines = [line for line in lines if "-floor-" in line]
    assert floor_lines[0] == (
        "| `nnx-floor-flatten`: a flatten against the twin's | 6.00× [5.50–6.50] | "
        "3.00× [2.80–3.20] |"
    )
    assert "6.00× [5.50–6.50]" in report and "3.00× [2.80–3.20]" in report
    # Every workload once, in the suite's order (what test_published_figures reads).
    names = [line.split("`")[1] for line in lines if line.startswith("| `")]
    assert names == [row.name for row in result.workloads]


def test_chart_leaves_the_floor_rows_out(tmp_path: Any) -> None:
    pytest.importorskip("matplotlib")
    from benchmarks.report.chart import write_chart
    from benchmarks.unsupported import Unsupported

    result = _result()
    write_chart(result, tmp_path / "chart.png")  # draws the nnx-split bar only
    assert (tmp_path / "chart.png").stat().st_size > 10_000
    result.workloads = result.workloads[1:]  # floor rows only: no speedup to draw
    with pytest.raises(Unsupported, match="no workload ran"):
        write_chart(result, tmp_path / "floor_only.png")
