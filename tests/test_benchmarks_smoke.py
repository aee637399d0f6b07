"""Smoke tests of the benchmark suite (benchmarks/): it runs end to end, and its adapters agree.

The suite itself is not part of the installed package, so the repository root is put on sys.path.
These tests time nothing worth reading; they check the outputs' shape and the adapters' leaves.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks.cli import parse_args  # noqa: E402
from benchmarks.guard import compare_leaves, leaves_disagreement  # noqa: E402
from benchmarks.leaves import leaf_factory  # noqa: E402
from benchmarks.libraries import LOADERS  # noqa: E402
from benchmarks.ops import OPS, TREE_OPS  # noqa: E402
from benchmarks.report.publish import PUBLISHED_REPORT, publish  # noqa: E402
from benchmarks.results import RunResult  # noqa: E402
from benchmarks.selection import case_selected  # noqa: E402
from benchmarks.trees import RECIPES, build_case  # noqa: E402
from benchmarks.unsupported import Unsupported  # noqa: E402

HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None

# Pytree libraries checked against jax.tree_util (nnx only does split/merge on a module, and
# fastree-plain only times the plain twin of the identity_copy case, fastree-noaux only flatten and
# structure of custom-node trees with the aux checks off: see test_noaux_adapter).
TREE_LIBRARIES = [
    name for name in LOADERS if name not in ("nnx", "fastree-plain", "fastree-noaux")
]
GUARD_TREES = [
    "tuple3",
    "mlp",
    "transformer-12",
    "adam-state",
    "custom-nodes",
    "nnx-state",
    "deep-500",
]


def _case(tree_name: str):
    recipe = next(r for r in RECIPES if r.name == tree_name)
    try:
        return build_case(recipe, "numpy", leaf_factory("numpy", "cpu"))
    except Unsupported as reason:  # flax missing for nnx-state
        pytest.skip(str(reason))


def _library(name: str):
    try:
        return LOADERS[name]()
    except Unsupported as reason:  # optional library not installed, or fastree mid-rebuild
        pytest.skip(str(reason))


# ------------------------------------------------------------------------------------------------
# end to end


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One tiny run of ``python -m benchmarks`` in a subprocess, as a user would start it."""
    out = tmp_path_factory.mktemp("bench_out")
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks",
            "--quick",
            "--only",
            "flatten/tuple3",
            "--out",
            str(out),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr
    assert "flatten/tuple3" in completed.stderr  # the per-case progress line
    assert "tuple3" in completed.stdout  # the final table
    return out


def test_results_json_has_expected_rows(quick_run: Path) -> None:
    result = RunResult.from_json((quick_run / "results.json").read_text())
    assert set(json.loads((quick_run / "results.json").read_text())) >= {
        "environment",
        "settings",
        "baseline",
        "libraries",
        "trees",
        "rows",
        "skipped",
        "excluded",
    }
    assert result.settings["mode"] == "quick"
    assert [tree.name for tree in result.trees] == ["tuple3"]
    assert {(row.op, row.tree) for row in result.rows} == {("flatten", "tuple3")}
    libraries = {row.library for row in result.rows}
    assert "jax" in libraries
    for row in result.rows:
        assert row.unit == "ns" and 0 < row.min <= row.median
        assert row.loops >= 1 and row.repeats >= 1
        if "fastree" in libraries:
            assert row.ratio is not None and row.ratio > 0
    for key in ("python", "cpu", "date", "device", "libraries"):
        assert result.environment[key]


def test_report_has_a_table(quick_run: Path) -> None:
    report = (quick_run / "report.md").read_text()
    assert "### tuple3" in report
    assert "| op | ns/leaf |" in report
    assert "| flatten |" in report
    assert "## Environment" in report


def test_chart_written_or_noted(quick_run: Path) -> None:
    result = RunResult.from_json((quick_run / "results.json").read_text())
    chart_notes = [note for note in result.skipped if note.op == "chart"]
    if HAS_MATPLOTLIB and "fastree" in result.libraries:
        assert (quick_run / "chart.png").stat().st_size > 0
    else:
        assert chart_notes, "a missing chart must come with a note saying why"


def test_publish_writes_results_md(quick_run: Path, tmp_path: Path) -> None:
    result = RunResult.from_json((quick_run / "results.json").read_text())
    chart = quick_run / "chart.png"
    report = publish(result, chart if chart.exists() else None, destination=tmp_path)
    assert report == tmp_path / PUBLISHED_REPORT
    assert "do not edit by hand" in report.read_text()
    assert (tmp_path / "results_chart.png").exists() == chart.exists()


# ------------------------------------------------------------------------------------------------
# adapters


@pytest.mark.parametrize("tree_name", GUARD_TREES)
@pytest.mark.parametrize("library_name", TREE_LIBRARIES)
def test_adapter_leaves_match_jax(library_name: str, tree_name: str) -> None:
    library = _library(library_name)
    case = _case(tree_name)
    try:
        api = library.api_for(case)
    except Unsupported as reason:
        # Only dm-tree is expected to decline trees (None as a node, custom/nnx nodes).
        assert library_name in ("dm-tree", "torch"), reason
        pytest.skip(str(reason))
    assert leaves_disagreement(api, case) is None


@pytest.mark.parametrize("library_name", TREE_LIBRARIES)
def test_every_op_runs_through_each_adapter(library_name: str) -> None:
    """Each op's prepared call runs once on the 3-leaf tuple, or is skipped with a reason."""
    library = _library(library_name)
    case = _case("tuple3")
    api = library.api_for(case)
    for op in TREE_OPS:
        if op not in library.ops or OPS[op].prepare is None:
            continue
        try:
            fn, args = OPS[op].prepare(api, case)
        except Unsupported as reason:
            assert str(reason), f"{library_name}/{op}: a skip needs a reason"
            continue
        fn(*args)


@pytest.mark.parametrize(
    ("tree_name", "op", "library_names"),
    [
        ("shared-graph", "split_merge", ["fastree", "nnx"]),
        ("modules-12", "identity_copy", ["fastree", "fastree-plain"]),
    ],
)
def test_identity_cases_run(tree_name: str, op: str, library_names: list[str]) -> None:
    """The identity-preserving cases: each library's prepared call runs and keeps what it must."""
    case = _case(tree_name)
    results = {}
    for name in library_names:
        library = _library(name)
        assert op in library.ops
        api = library.api_for(case)
        assert leaves_disagreement(api, case) is None
        fn, args = OPS[op].prepare(api, case)
        results[name] = fn(*args)
    if op == "split_merge":
        for name, graph in results.items():
            assert graph.embed is graph.unembed, name
        fastree_graph = results["fastree"]
        assert len(fastree_graph.blocks) == len(case.tree["blocks"])
        assert fastree_graph is not case.extras["fastree_graph"]
    else:
        import fastree.tree_util as tu

        identity_tree, plain_tree = case.extras["identity_tree"], case.tree
        leaves = tu.tree_leaves(plain_tree)
        for name, source in (("fastree", identity_tree), ("fastree-plain", plain_tree)):
            rebuilt = results[name]
            assert type(rebuilt) is type(source) and rebuilt is not source
            assert all(a is b for a, b in zip(tu.tree_leaves(rebuilt), leaves, strict=True))
        assert "&" not in repr(tu.tree_structure(identity_tree))  # nothing shared
        assert type(identity_tree) is not type(plain_tree)


def test_guard_reports_a_library_with_different_leaves() -> None:
    case = _case("tuple3")
    jax_api = LOADERS["jax"]().api_for(case)
    from dataclasses import replace

    reversed_leaves = replace(jax_api, leaves=lambda tree: list(reversed(jax_api.leaves(tree))))
    assert "not the same object" in leaves_disagreement(reversed_leaves, case)


# ------------------------------------------------------------------------------------------------
# options


@pytest.mark.parametrize(
    ("pattern", "op", "tree", "selected"),
    [
        ("flatten/transformer*", "flatten", "transformer-12", True),
        ("flatten/transformer*", "flatten", "transformer-12@jax", True),
        ("flatten/transformer*", "leaves", "transformer-12", False),
        ("tuple3", "tree_map", "tuple3", True),
        ("tree_map*", "tree_map3", "mlp", True),
        ("*/*@jax", "flatten", "transformer-12", False),
        ("*/*@jax", "flatten", "transformer-12@jax", True),
        ("flatten/tuple3", "flatten", "tuple3@sharded", True),
        ("flatten/tuple3@jax", "flatten", "tuple3@sharded", False),
    ],
)
def test_only_pattern(pattern: str, op: str, tree: str, selected: bool) -> None:
    assert case_selected(op, tree, [pattern]) is selected


def test_write_results_refuses_a_partial_run() -> None:
    with pytest.raises(SystemExit):
        parse_args(["--quick", "--write-results"])


def test_noaux_adapter_times_custom_nodes_only() -> None:
    """fastree-noaux gives fastree's leaves with the aux checks off, and only on custom nodes."""
    library = _library("fastree-noaux")
    case = _case("custom-nodes")
    api = library.api_for(case)
    leaves, _ = api.flatten(case.tree)
    assert compare_leaves(leaves, case.reference_leaves) is None
    assert api.structure(case.tree) == api.flatten(case.tree)[1]
    with pytest.raises(Unsupported):
        library.api_for(_case("tuple3"))
