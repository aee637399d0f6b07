"""Smoke tests of the benchmark suite (benchmarks/): it runs end to end, and its adapters agree.

The suite itself is not part of the installed package, so the repository root is put on sys.path.
These tests time nothing worth reading; they check the outputs' shape, the adapters' leaves, the
dict-order trees' orders, that every end-to-end workload runs plain and with fastree installed (at
its tiny size, one repeat) with equal results, and that both charts draw.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks import dict_orders  # noqa: E402
from benchmarks.cli import parse_args  # noqa: E402
from benchmarks.guard import compare_leaves, leaves_disagreement  # noqa: E402
from benchmarks.leaves import leaf_factory  # noqa: E402
from benchmarks.libraries import LOADERS  # noqa: E402
from benchmarks.ops import DICT_ORDER_OPS, OPS, TREE_OPS  # noqa: E402
from benchmarks.report import render_markdown, render_table  # noqa: E402
from benchmarks.report.publish import PUBLISHED_DETAILS, PUBLISHED_REPORT, publish  # noqa: E402
from benchmarks.results import Row, RunResult, TreeInfo, WorkloadRow  # noqa: E402
from benchmarks.runner import plan  # noqa: E402
from benchmarks.selection import case_selected  # noqa: E402
from benchmarks.settings import QUICK  # noqa: E402
from benchmarks.timing import measure_modes  # noqa: E402
from benchmarks.trees import RECIPES, build_case  # noqa: E402
from benchmarks.unsupported import Unsupported  # noqa: E402
from benchmarks.workloads import WORKLOADS  # noqa: E402
from benchmarks.workloads.base import Prepared, Workload  # noqa: E402
from benchmarks.workloads.install import fastree_installer  # noqa: E402
from benchmarks.workloads.run import run_one, run_workloads  # noqa: E402

HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None

# Pytree libraries checked against jax.tree_util (nnx only does split/merge on a module, and
# fastree-plain only times the plain twin of the identity_copy case, fastree-noaux only flatten and
# structure of custom-node trees with the aux checks off: see test_noaux_adapter).
TREE_LIBRARIES = [name for name in LOADERS if name not in ("nnx", "fastree-plain", "fastree-noaux")]
GUARD_TREES = [
    "tuple3",
    "mlp",
    "transformer-12",
    "adam-state",
    "custom-nodes",
    "nnx-state",
    "deep-500",
    "dict-10k",
    *(f"dict-10k-{order}" for order in ("natural", "flax", "reversed", "nearly", "random")),
]
DICT_VARIANTS = [recipe.name for recipe in RECIPES if recipe.variant_of == "dict-10k"]


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
    """One tiny run of ``python -m benchmarks`` in a subprocess, as a user would start it: one
    tree op and the cheapest end-to-end workload (which needs no optional library)."""
    out = tmp_path_factory.mktemp("bench_out")
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks",
            "--quick",
            "--only",
            "flatten/tuple3",
            "--only",
            "workload/checkpoint-paths",
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
    assert [row.name for row in result.workloads] == ["checkpoint-paths"]
    (workload,) = result.workloads
    if workload.not_run is None:
        assert workload.plain > 0 and workload.installed > 0 and workload.speedup > 0
        assert workload.repeats == QUICK.workload_repeats
    else:
        # No fastree.installed() (or fastree missing): said so, not silently dropped.
        assert workload.not_run.startswith("unavailable"), workload.not_run


def test_report_has_a_table(quick_run: Path) -> None:
    report = (quick_run / "report.md").read_text()
    assert "### tuple3" in report
    assert "| op | ns/leaf |" in report
    assert "| flatten |" in report
    assert "## Environment" in report


def test_report_lists_the_workload(quick_run: Path) -> None:
    report = (quick_run / "report.md").read_text()
    assert "## End-to-end workloads: plain vs fastree installed" in report
    assert "| **checkpoint-paths**:" in report


def test_charts_written_or_noted(quick_run: Path) -> None:
    result = RunResult.from_json((quick_run / "results.json").read_text())
    for name, what in (("chart.png", "chart"), ("chart_details.png", "detail chart")):
        notes = [note for note in result.skipped if note.op == what]
        if HAS_MATPLOTLIB and "fastree" in result.libraries:
            assert (quick_run / name).stat().st_size > 0
        else:
            assert notes, f"a missing {name} must come with a note saying why"


def test_publish_writes_results_md(quick_run: Path, tmp_path: Path) -> None:
    result = RunResult.from_json((quick_run / "results.json").read_text())
    chart, details = quick_run / "chart.png", quick_run / "chart_details.png"
    report = publish(
        result,
        chart if chart.exists() else None,
        destination=tmp_path,
        details=details if details.exists() else None,
    )
    assert report == tmp_path / PUBLISHED_REPORT
    assert "do not edit by hand" in report.read_text()
    assert (tmp_path / "results_chart.png").exists() == chart.exists()
    assert (tmp_path / PUBLISHED_DETAILS).exists() == details.exists()
    if details.exists():
        assert f"]({PUBLISHED_DETAILS})" in report.read_text()


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


# ------------------------------------------------------------------------------------------------
# dict-order trees (issue 15)


def _numpy_leaf():
    return leaf_factory("numpy", "cpu")


def test_dict_orders_are_the_orders_named() -> None:
    leaf, n = _numpy_leaf(), 1_000
    ordered = dict_orders.sorted_dict(leaf, n)
    keys = list(ordered)
    assert keys == sorted(keys) and len(keys) == n
    assert list(dict_orders.reversed_dict(leaf, n)) == keys[::-1]
    for build in (dict_orders.nearly_sorted_dict, dict_orders.random_dict):
        built = list(build(leaf, n))
        assert sorted(built) == keys and built != keys  # same keys, another order
    nearly = list(dict_orders.nearly_sorted_dict(leaf, n))
    out_of_place = sum(a != b for a, b in zip(nearly, keys, strict=True))
    assert 0 < out_of_place <= 0.02 * n  # ~1% of the keys, each swap moving two
    shuffled = list(dict_orders.random_dict(leaf, n))
    assert sum(a != b for a, b in zip(shuffled, keys, strict=True)) > n // 2
    assert list(dict_orders.random_dict(leaf, n)) == shuffled  # seeded: every run the same
    # Numbered names: insertion order is numeric, JAX's sorted order is not.
    for build, first in ((dict_orders.natural_dict, "k"), (dict_orders.flax_dict, "Dense_")):
        names = list(build(leaf, n))
        assert names[:3] == [f"{first}0", f"{first}1", f"{first}2"]
        assert names != sorted(names)
    # One distinct leaf per key, so the guard can tell a reordering apart.
    assert len({id(v) for v in ordered.values()}) == n


def test_dict_order_variants_planned_with_their_ops() -> None:
    assert DICT_VARIANTS == [
        "dict-10k-natural",
        "dict-10k-flax",
        "dict-10k-reversed",
        "dict-10k-nearly",
        "dict-10k-random",
    ]
    planned = {tree.name: tree.ops for tree in plan(QUICK, None, [])}
    assert "dict-10k" in planned and "treedef_hash" in planned["dict-10k"]
    for name in DICT_VARIANTS:
        assert planned[name] == list(DICT_ORDER_OPS)
    assert {"flatten", "leaves", "unflatten", "tree_map", "flatten_up_to"} <= set(DICT_ORDER_OPS)
    case = _case("dict-10k-natural")
    assert len(case.tree) == dict_orders.NUM_KEYS == len(case.reference_leaves)


# ------------------------------------------------------------------------------------------------
# end-to-end workloads (issue 13)


def _installer():
    """fastree.installed when this fastree has it; otherwise a stand-in, so the workloads still
    run through both modes (the stand-in routes nothing)."""
    try:
        return fastree_installer()
    except Unsupported:
        return contextlib.nullcontext


@pytest.mark.parametrize("workload", WORKLOADS, ids=lambda w: w.name)
def test_workload_runs_plain_and_installed(workload: Workload) -> None:
    """Each workload, at its tiny size and one repeat: both modes run and agree."""
    row = run_one(workload, workload.sizes["tiny"], target_ns=0, repeats=1, installer=_installer())
    if row.not_run and row.not_run.startswith("unavailable"):
        pytest.skip(row.not_run)  # an optional library (equinox, optax, flax) is missing
    assert row.not_run is None, row.not_run
    assert row.plain > 0 and row.installed > 0 and row.speedup > 0
    assert row.loops == {"plain": 1, "installed": 1} and row.repeats == 1
    assert row.why and row.description.startswith(workload.description)
    assert set(workload.sizes) == {"tiny", "quick", "full"}


def test_workloads_unavailable_without_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    fastree = pytest.importorskip("fastree")
    monkeypatch.delattr(fastree, "installed", raising=False)
    rows = run_workloads(WORKLOADS[:2], "tiny", 0, 1)
    assert [row.name for row in rows] == [w.name for w in WORKLOADS[:2]]
    for row in rows:
        assert row.speedup is None and row.not_run.startswith("unavailable: "), row.not_run


def test_installed_routes_jax_functions() -> None:
    """With the real fastree.installed(), a workload's jax.tree calls reach fastree."""
    try:
        installer = fastree_installer()
    except Unsupported as reason:
        pytest.skip(str(reason))
    import fastree
    import jax

    with installer():
        assert jax.tree.map is fastree.tree.map
    assert jax.tree.map is not fastree.tree.map


class _Flag:
    """A stand-in installer that only flips a flag the workload reads."""

    def __init__(self) -> None:
        self.on = False
        self.entered = 0

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        self.on, self.entered = True, self.entered + 1
        try:
            yield
        finally:
            self.on = False


def _toy(call, compare=None) -> Workload:
    prepared = Prepared(call, "toy") if compare is None else Prepared(call, "toy", compare)
    return Workload("toy", "a toy", "nothing", lambda _size: prepared, {"tiny": 1})


def test_workload_whose_modes_disagree_is_excluded() -> None:
    flag = _Flag()
    row = run_one(_toy(lambda: {"x": float(flag.on)}), 1, 0, 1, flag)
    assert row.speedup is None and row.not_run.startswith("EXCLUDED"), row.not_run


def test_workload_failing_when_installed_is_reported() -> None:
    flag = _Flag()

    def call() -> int:
        if flag.on:
            raise ValueError("boom")
        return 1

    row = run_one(_toy(call), 1, 0, 1, flag)
    assert row.not_run == "raised ValueError in mode 'installed': boom"


def test_workload_failing_later_when_installed_is_reported() -> None:
    """A failure in a timed repeat (not the warm-up) is a note too, not a crashed run."""
    flag, calls = _Flag(), []

    def call() -> int:
        calls.append(flag.on)
        if flag.on and calls.count(True) > 2:
            raise KeyError("late")
        return 1

    row = run_one(_toy(call), 1, 0, 2, flag)
    assert row.not_run == "raised KeyError in mode 'installed': 'late'"


def test_workload_whose_build_breaks_is_reported() -> None:
    def build(_size: int) -> Prepared:
        raise AttributeError("module 'equinox' has no attribute 'filter_jit'")

    row = run_one(Workload("toy", "a toy", "nothing", build, {"tiny": 1}), 1, 0, 1, _Flag())
    assert row.not_run.startswith("building it raised AttributeError"), row.not_run


def test_run_takes_fastree_out_of_jax_first() -> None:
    """Under fastree.run / FASTREE_INSTALL=1 the suite uninstalls, or "jax" would be fastree."""
    fastree = pytest.importorskip("fastree")
    if not hasattr(fastree, "install"):
        pytest.skip("this fastree has no install()")
    from benchmarks.runner import _take_fastree_out_of_jax

    fastree.uninstall()  # the suite may run installed (.ci/run); conftest.py restores that after
    assert _take_fastree_out_of_jax() is None
    fastree.install()
    try:
        assert "uninstalled for the run" in _take_fastree_out_of_jax()
        assert not fastree.is_installed()
    finally:
        fastree.uninstall()


def test_measure_modes_enters_each_mode_around_its_own_repeats() -> None:
    flag, seen = _Flag(), []

    def call() -> bool:
        seen.append(flag.on)
        return flag.on

    timings, results = measure_modes(call, {"plain": contextlib.nullcontext, "on": flag}, 0, 3)
    assert results == {"plain": False, "on": True}
    assert set(timings) == {"plain", "on"} and all(len(t.samples_ns) == 3 for t in timings.values())
    assert flag.entered == 1 + 3  # warm-up and calibration together, then once per repeat
    assert seen.count(True) == seen.count(False)  # loops of 1 call: the same work in each mode


# ------------------------------------------------------------------------------------------------
# report and charts from a made-up result (no timing)


def _synthetic_result() -> RunResult:
    result = RunResult(
        environment={"cpu": "test cpu", "date": "today"},
        settings={
            "mode": "quick",
            "command": "python -m benchmarks --quick",
            "target_ms_per_repeat": 2,
            "repeats": 3,
        },
        baseline="fastree",
        libraries={"fastree": "0", "jax": "0", "optree": "0", "dm-tree": "0"},
    )
    trees = [("tuple3", None), ("dict-10k", None)]
    trees += [(name, "dict-10k") for name in DICT_VARIANTS]
    for index, (name, variant_of) in enumerate(trees):
        result.trees.append(TreeInfo(name, f"{name}, as built", "numpy", 3, 4, variant_of))
        for op in DICT_ORDER_OPS:
            for library, ratio in (("fastree", 1.0), ("jax", 0.8 + index), ("optree", 3.0)):
                result.rows.append(
                    Row(name, op, library, "ns", 1000.0 * ratio, 900.0, 300.0, ratio, 1, 1)
                )
    result.rows.append(Row("tuple3", "flatten", "dm-tree", "ns", 5e3, 5e3, 1e3, 5.0, 1, 1))
    result.workloads = [
        WorkloadRow("fast", "a call", "why", 2e6, 1e6, 2e6, 1e6, 2.0, {"plain": 1}, 1),
        WorkloadRow("slow", "a call", "why", 1e6, 1.1e6, 1e6, 1e6, 0.91, {"plain": 1}, 1),
        WorkloadRow("missing", "a call", "why", not_run="unavailable: no library"),
    ]
    return result


def test_results_json_round_trip_keeps_variants_and_workloads() -> None:
    result = _synthetic_result()
    again = RunResult.from_json(result.to_json())
    assert again.trees == result.trees and again.workloads == result.workloads
    # results.json files written before workloads existed still load.
    old = json.loads(result.to_json())
    del old["workloads"]
    for tree in old["trees"]:
        del tree["variant_of"]
    assert RunResult.from_json(json.dumps(old)).workloads == []


def test_report_tables_for_variants_and_workloads() -> None:
    result = _synthetic_result()
    report = render_markdown(result, "chart.png", "chart_details.png")
    assert "## dict-10k and its variants" in report
    assert "| dict-10k-natural: as built |" in report
    # Variants are left out of the means: jax's tuple3 and dict-10k ratios are 0.8 and 1.8.
    assert "| flatten | 1.20× (n=2) | 3.00× (n=2) | 5.00× (n=1) |" in report
    assert "| **fast**: a call | 2 ms | 1 ms | **2.00×** | why |" in report
    assert "unavailable: no library" in report
    assert report.index("](chart.png)") < report.index("](chart_details.png)")
    table = render_table(result)
    assert "end-to-end workloads" in table and "not run: unavailable: no library" in table


@pytest.mark.skipif(not HAS_MATPLOTLIB, reason="matplotlib is not installed")
def test_charts_draw_every_panel(tmp_path: Path) -> None:
    from benchmarks.report.chart import write_chart
    from benchmarks.report.chart_details import write_detail_chart

    result = _synthetic_result()
    write_chart(result, tmp_path / "chart.png")
    write_detail_chart(result, tmp_path / "details.png")
    assert (tmp_path / "chart.png").stat().st_size > 10_000
    assert (tmp_path / "details.png").stat().st_size > 10_000
    # Nothing to compare: a note, not an empty picture.
    empty = RunResult({}, {"mode": "quick"}, "fastree", {})
    with pytest.raises(Unsupported):
        write_chart(empty, tmp_path / "empty.png")
    with pytest.raises(Unsupported):
        write_detail_chart(empty, tmp_path / "empty.png")
