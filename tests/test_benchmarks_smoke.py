"""Smoke tests of the benchmark suite (benchmarks/): it runs end to end, and its parts do their job.

The suite itself is not part of the installed package, so the repository root is put on sys.path.
These tests time nothing worth reading and no assertion depends on a timing: they check the
outputs' shape, the adapters' leaves, the dict-order trees' orders, the statistics (intervals
against the binomial distribution, verdicts), the rounds policy, that every end-to-end workload
runs in a plain and an installed process (at its tiny size, one round) with equal results, how
the process runner treats failures and disagreements (with a stand-in for the processes), and
that both charts draw.
"""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks.cli import parse_args  # noqa: E402
from benchmarks.data import dict_orders  # noqa: E402
from benchmarks.data.leaves import leaf_factory  # noqa: E402
from benchmarks.data.operations import DICT_ORDER_OPS, TREE_OPS  # noqa: E402
from benchmarks.data.trees import RECIPES, build_case  # noqa: E402
from benchmarks.libraries import LOADERS  # noqa: E402
from benchmarks.libraries.base import compare_leaves  # noqa: E402
from benchmarks.measure import stats  # noqa: E402
from benchmarks.measure.calls import CALLS  # noqa: E402
from benchmarks.measure.child import ANSWER_PREFIX, serve  # noqa: E402
from benchmarks.measure.guard import leaves_disagreement  # noqa: E402
from benchmarks.measure.install import fastree_installer  # noqa: E402
from benchmarks.measure.results import Row, RunResult, TreeInfo, WorkloadRow  # noqa: E402
from benchmarks.measure.timing import Rounds, measure  # noqa: E402
from benchmarks.measure.workloads import (  # noqa: E402
    INSTALLED,
    PLAIN,
    installed_mode_unavailable,
    run_workloads,
)
from benchmarks.report import render_markdown, render_table  # noqa: E402
from benchmarks.report.publish import PUBLISHED_DETAILS, PUBLISHED_REPORT  # noqa: E402
from benchmarks.runner import plan  # noqa: E402
from benchmarks.selection import case_selected  # noqa: E402
from benchmarks.settings import QUICK  # noqa: E402
from benchmarks.unsupported import Unsupported  # noqa: E402
from benchmarks.workloads import WORKLOADS  # noqa: E402
from benchmarks.workloads.base import Workload  # noqa: E402

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
            "--workload-rounds",
            "1",
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
        assert row.loops >= 1 and QUICK.rounds.minimum <= row.repeats <= QUICK.rounds.maximum
        assert len(row.samples) == row.repeats
        if "fastree" in libraries:
            assert row.ratio is not None and row.ratio > 0
            if row.library != "fastree":
                assert row.ratio_low <= row.ratio <= row.ratio_high
                assert row.verdict in ("faster", "same", "slower")
                assert row.confidence >= stats.CONFIDENCE
    for key in ("python", "cpu", "date", "device", "libraries"):
        assert result.environment[key]
    assert [row.name for row in result.workloads] == ["checkpoint-paths"]
    (workload,) = result.workloads
    if workload.not_run is None:
        assert workload.plain > 0 and workload.installed > 0 and workload.speedup > 0
        assert workload.rounds == QUICK.workload_pairs  # one round per pair (--workload-rounds 1)
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
    assert "## End-to-end workloads: plain JAX vs fastree installed first" in report
    assert "| **checkpoint-paths**:" in report


def test_charts_written_or_noted(quick_run: Path) -> None:
    result = RunResult.from_json((quick_run / "results.json").read_text())
    for name, what in (("chart.png", "chart"), ("chart_details.png", "detail chart")):
        notes = [note for note in result.skipped if note.op == what]
        if HAS_MATPLOTLIB and "fastree" in result.libraries:
            assert (quick_run / name).stat().st_size > 0
        else:
            assert notes, f"a missing {name} must come with a note saying why"


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
        if op not in library.ops or op not in CALLS:
            continue
        try:
            fn, args = CALLS[op](api, case)
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
        fn, args = CALLS[op](api, case)
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
        parse_args(["--only", "flatten", "--write-results"])
    assert parse_args(["--quick", "--write-results"]).write_results  # a quick run says it is one


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
# dict-order trees


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
# end-to-end workloads


@pytest.fixture(scope="module")
def workload_rows() -> dict[str, WorkloadRow]:
    """Every workload at its tiny size: one plain and one installed process, one round."""
    if installed_mode_unavailable() is not None:
        pytest.skip(installed_mode_unavailable())
    rows = run_workloads(WORKLOADS, "tiny", 0, pairs=1, rounds=1)
    return {row.name: row for row in rows}


@pytest.mark.parametrize("workload", WORKLOADS, ids=lambda w: w.name)
def test_workload_runs_plain_and_installed(
    workload: Workload, workload_rows: dict[str, WorkloadRow]
) -> None:
    """Both processes ran it, and their results fingerprint the same."""
    row = workload_rows[workload.name]
    if row.not_run and row.not_run.startswith("unavailable"):
        pytest.skip(row.not_run)  # an optional library (equinox, optax, flax) is missing
    assert row.not_run is None, row.not_run
    assert row.plain > 0 and row.installed > 0 and row.speedup > 0 and row.rounds == 1
    assert row.loops == {"plain": 1, "installed": 1}
    assert row.verdict == "same"  # one round proves nothing
    assert row.why and row.description.startswith(workload.description)
    assert set(workload.sizes) == {"tiny", "quick", "full"}


def test_child_answers_requests() -> None:
    """The child's protocol, served in this process: mode, build, time, and failures."""
    import io

    requests = [
        {"cmd": "mode"},
        {"cmd": "build", "name": "checkpoint-paths", "size": "tiny", "target_ns": 0},
        {"cmd": "time", "name": "checkpoint-paths"},
        {"cmd": "build", "name": "no-such-workload", "size": "tiny", "target_ns": 0},
    ]
    out = io.StringIO()
    serve([json.dumps(r) + "\n" for r in requests], out)
    lines = out.getvalue().splitlines()
    assert all(line.startswith(ANSWER_PREFIX) for line in lines)
    mode, built, timed, missing = (json.loads(line[len(ANSWER_PREFIX) :]) for line in lines)
    assert set(mode) == {"installed"}
    assert built["loops"] == 1 and len(built["fingerprint"]) == 64 and "layers" in built["size"]
    assert timed["ns"] > 0
    assert missing == {"not_run": "no workload named 'no-such-workload'"}


def test_installed_mode_needs_install(monkeypatch: pytest.MonkeyPatch) -> None:
    fastree = pytest.importorskip("fastree")
    assert installed_mode_unavailable() is None
    monkeypatch.delattr(fastree, "install")
    assert installed_mode_unavailable().startswith("unavailable: ")


def test_installed_routes_jax_functions() -> None:
    """With the real fastree.installed(), jax.tree calls reach fastree (what the report lists)."""
    try:
        installer = fastree_installer()
    except Unsupported as reason:
        pytest.skip(str(reason))
    import fastree
    import jax

    with installer():
        assert jax.tree.map is fastree.tree.map
    assert jax.tree.map is not fastree.tree.map


def _toy(name: str = "toy") -> Workload:
    return Workload(name, "a toy", "nothing", lambda _size: None, {"tiny": 1})  # type: ignore


class _Child:
    """Stands in for a child process: answers from a function, logs every request."""

    def __init__(self, mode: str, answer, log: list, installed: bool | None = None) -> None:
        self.mode, self.answer, self.log = mode, answer, log
        self.installed = (mode == INSTALLED) if installed is None else installed
        self.closed = False

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        self.log.append((self.mode, request["cmd"]))
        if request["cmd"] == "mode":
            return {"installed": self.installed}
        return self.answer(self.mode, request, len(self.log))

    def close(self) -> None:
        self.closed = True


def _spawner(answer, installed: bool | None = None):
    log: list = []
    children: list[_Child] = []

    def spawn(mode: str) -> _Child:
        children.append(_Child(mode, answer, log, installed))
        return children[-1]

    return spawn, log, children


def _built(fingerprint: str = "same") -> dict[str, Any]:
    return {"size": "toy", "fingerprint": fingerprint, "loops": 1}


def test_workload_rounds_take_turns_and_pair() -> None:
    counter = {"installed": 1000.0}

    def answer(mode: str, request: dict[str, Any], _n: int) -> dict[str, Any]:
        if request["cmd"] == "build":
            return _built()
        if mode == PLAIN:
            return {"ns": 2000.0}
        counter["installed"] += 1
        return {"ns": counter["installed"]}

    spawn, log, children = _spawner(answer)
    (row,) = run_workloads([_toy()], "tiny", 0, pairs=2, rounds=3, spawn=spawn)
    timed = [mode for mode, command in log if command == "time"]
    # Each round: both processes, which goes first alternating; the next pair starts over.
    assert timed == [PLAIN, INSTALLED, INSTALLED, PLAIN, PLAIN, INSTALLED] * 2
    assert len(children) == 4 and all(child.closed for child in children)
    assert row.rounds == 6 and row.not_run is None
    assert row.installed_samples == [1001.0, 1002.0, 1003.0, 1004.0, 1005.0, 1006.0]
    assert row.plain_samples == [2000.0] * 6
    ratios = sorted(2000.0 / x for x in row.installed_samples)
    assert row.speedup == pytest.approx((ratios[2] + ratios[3]) / 2)
    assert (row.speedup_low, row.speedup_high) == (ratios[0], ratios[-1])
    assert row.verdict == "faster" and row.confidence == pytest.approx(0.96875)


def test_workload_whose_modes_disagree_is_excluded() -> None:
    spawn, log, _ = _spawner(lambda mode, _request, _n: _built(fingerprint=mode))
    (row,) = run_workloads([_toy()], "tiny", 0, pairs=2, rounds=3, spawn=spawn)
    assert row.speedup is None and row.not_run.startswith("EXCLUDED"), row.not_run
    assert not any(command == "time" for _mode, command in log)  # never timed


def test_workload_failing_when_installed_is_reported() -> None:
    def answer(mode: str, request: dict[str, Any], _n: int) -> dict[str, Any]:
        if request["cmd"] == "build":
            if mode == INSTALLED and request["name"] == "bad":
                return {"not_run": "raised ValueError: boom"}
            return _built()
        return {"ns": 1.0}

    spawn, _log, _ = _spawner(answer)
    rows = run_workloads([_toy("bad"), _toy("good")], "tiny", 0, pairs=1, rounds=3, spawn=spawn)
    assert rows[0].not_run == "raised ValueError: boom (in the installed process only)"
    assert rows[1].not_run is None and rows[1].rounds == 3


def test_workload_failing_while_timed_is_reported() -> None:
    def answer(mode: str, request: dict[str, Any], n: int) -> dict[str, Any]:
        if request["cmd"] == "build":
            return _built()
        if mode == INSTALLED and n > 8:
            return {"not_run": "raised KeyError: 'late'"}
        return {"ns": 1.0}

    spawn, _log, _ = _spawner(answer)
    (row,) = run_workloads([_toy()], "tiny", 0, pairs=1, rounds=5, spawn=spawn)
    assert row.not_run == "raised KeyError: 'late' (in the installed process)"


def test_workload_missing_library_is_unavailable_in_both() -> None:
    spawn, _log, _ = _spawner(lambda *_args: {"not_run": "unavailable: equinox is not installed"})
    (row,) = run_workloads([_toy()], "tiny", 0, pairs=2, rounds=2, spawn=spawn)
    assert row.not_run == "unavailable: equinox is not installed"


def test_workload_process_that_did_not_install_is_refused() -> None:
    spawn, _log, children = _spawner(lambda *_args: _built(), installed=False)
    (row,) = run_workloads([_toy()], "tiny", 0, pairs=1, rounds=2, spawn=spawn)
    assert row.not_run == "unavailable: the installed process ran with fastree not installed"
    assert all(child.closed for child in children)


def test_workload_process_that_died_is_reported() -> None:
    def answer(mode: str, request: dict[str, Any], _n: int) -> dict[str, Any]:
        raise RuntimeError(f"the {mode} process failed (exit -11): Segmentation fault")

    spawn, _log, children = _spawner(answer)
    (row,) = run_workloads([_toy()], "tiny", 0, pairs=1, rounds=2, spawn=spawn)
    assert row.not_run.startswith("the plain process failed (exit -11)")
    assert all(child.closed for child in children)


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


# ------------------------------------------------------------------------------------------------
# rounds and statistics


def _coverage(n: int, low: int) -> float:
    """P(the median lies in [sorted[low], sorted[n-1-low]]) for n independent rounds."""
    below = sum(math.comb(n, k) for k in range(low + 1)) / 2**n
    return 1 - 2 * below


@pytest.mark.parametrize("n", range(2, 31))
def test_interval_ranks_are_the_narrowest_that_reach_the_confidence(n: int) -> None:
    low, high, coverage = stats.interval_ranks(n)
    assert high == n - 1 - low  # symmetric
    assert coverage == pytest.approx(_coverage(n, low))
    if _coverage(n, 0) >= stats.CONFIDENCE:
        assert coverage >= stats.CONFIDENCE
        assert _coverage(n, low + 1) < stats.CONFIDENCE  # one rank further in falls short
    else:
        assert low == 0  # too few rounds: the whole range, at its own, lower, confidence


def test_estimate_and_verdicts() -> None:
    estimate = stats.estimate([1.3, 0.9, 1.2, 1.1, 1.25])
    assert (estimate.value, estimate.low, estimate.high) == (1.2, 0.9, 1.3)
    assert estimate.rounds == 5 and estimate.verdict == stats.SAME  # 0.9 <= 1 <= 1.3
    assert stats.estimate([1.3, 1.1, 1.2, 1.15, 1.25]).verdict == stats.FASTER
    assert stats.estimate([0.8, 0.7, 0.9, 0.85, 0.75]).verdict == stats.SLOWER
    assert stats.estimate([2.0, 2.1]).verdict == stats.SAME  # two rounds prove nothing
    paired = stats.paired([2.0, 4.0, 6.0], [1.0, 2.0, 3.0])
    assert (paired.value, paired.low, paired.high) == (2.0, 2.0, 2.0)


def _counting_candidates() -> tuple[dict[str, Any], dict[str, int]]:
    calls = {"a": 0, "b": 0}

    def make(name: str):
        def fn() -> None:
            calls[name] += 1

        return fn

    return {name: (make(name), ()) for name in calls}, calls


@pytest.mark.parametrize(
    ("tolerance", "expected"), [(math.inf, 3), (-1.0, 6)], ids=["settles", "never-settles"]
)
def test_rounds_stop_at_the_minimum_or_the_maximum(tolerance: float, expected: int) -> None:
    candidates, _calls = _counting_candidates()
    rounds = Rounds(minimum=3, maximum=6, tolerance=tolerance, max_seconds=1e9)
    timings, failures = measure(candidates, 0, rounds, baseline="a")
    assert not failures
    assert {name: len(t.samples_ns) for name, t in timings.items()} == {
        "a": expected,
        "b": expected,
    }


def test_rounds_stop_when_time_runs_out() -> None:
    candidates, _calls = _counting_candidates()
    rounds = Rounds(minimum=2, maximum=50, tolerance=-1.0, max_seconds=0.0)
    timings, _ = measure(candidates, 0, rounds, baseline="a")
    assert len(timings["a"].samples_ns) == 2


def test_a_candidate_that_raises_is_reported_not_timed() -> None:
    def broken() -> None:
        raise KeyError("nope")

    candidates, _ = _counting_candidates()
    candidates["broken"] = (broken, ())
    timings, failures = measure(candidates, 0, Rounds(2, 2, 0.0, 1.0), baseline="a")
    assert set(timings) == {"a", "b"} and isinstance(failures["broken"], KeyError)


# ------------------------------------------------------------------------------------------------
# report and charts from a made-up result (no timing)


def _row(tree: str, op: str, library: str, ratio: float, low: float, high: float) -> Row:
    verdict = stats.verdict(low, high) if library != "fastree" else None
    return Row(
        tree, op, library, "ns", 1000.0 * ratio, 900.0, 300.0, ratio, 1, 5,
        ratio_low=low, ratio_high=high, confidence=0.9375, verdict=verdict,
        samples=[1000.0 * ratio] * 5,
    )  # fmt: skip


def _synthetic_result() -> RunResult:
    result = RunResult(
        environment={"cpu": "test cpu", "date": "today", "python": "3.x"},
        settings={
            "mode": "quick",
            "command": "python -m benchmarks --quick",
            "target_ms_per_round": 2,
            "min_rounds": 5,
            "max_rounds": 11,
            "tolerance": 0.05,
            "max_seconds_per_case": 1.0,
        },
        baseline="fastree",
        libraries={"fastree": "0", "jax": "0", "optree": "0", "dm-tree": "0"},
    )
    trees = [("tuple3", None), ("dict-10k", None)]
    trees += [(name, "dict-10k") for name in DICT_VARIANTS]
    for index, (name, variant_of) in enumerate(trees):
        result.trees.append(TreeInfo(name, f"{name}, as built", "numpy", 3, 4, variant_of))
        for op in DICT_ORDER_OPS:
            jax = 0.8 + index
            # jax on tuple3: 0.8x, slower (0.7-0.9); on dict-10k 1.8x, faster (1.7-1.9).
            result.rows.append(_row(name, op, "fastree", 1.0, 1.0, 1.0))
            result.rows.append(_row(name, op, "jax", jax, jax - 0.1, jax + 0.1))
            # optree: 3x, but the flatten interval on tuple3 includes 1x: "same".
            low = 0.9 if (name, op) == ("tuple3", "flatten") else 2.9
            result.rows.append(_row(name, op, "optree", 3.0, low, 3.1))
    result.rows.append(_row("tuple3", "flatten", "dm-tree", 5.0, 4.8, 5.2))
    result.rows.append(
        Row("tuple3", "treedef_memory", "fastree", "bytes/node", 30.0, 30.0, None, 1.0, None, 3)
    )
    result.rows.append(
        Row("tuple3", "treedef_memory", "jax", "bytes/node", 60.0, 60.0, None, 2.0, None, 3)
    )
    timed = {"rounds": 4, "confidence": 0.875, "loops": {"plain": 1, "installed": 1}}
    result.workloads = [
        WorkloadRow("fast", "a call", "why", plain=2e6, installed=1e6, speedup=2.0,
                    speedup_low=1.9, speedup_high=2.1, verdict="faster", **timed),
        WorkloadRow("even", "a call", "why", plain=1e6, installed=1.01e6, speedup=0.99,
                    speedup_low=0.9, speedup_high=1.1, verdict="same", **timed),
        WorkloadRow("eqx-op", "a call", "why", group="equinox model", plain=1e6, installed=1e5,
                    speedup=10.0, speedup_low=9.0, speedup_high=11.0, verdict="faster", **timed),
        WorkloadRow("missing", "a call", "why", not_run="unavailable: no library"),
    ]  # fmt: skip
    return result


def test_results_json_round_trip_keeps_variants_and_workloads() -> None:
    result = _synthetic_result()
    again = RunResult.from_json(result.to_json())
    assert again.trees == result.trees and again.workloads == result.workloads
    assert again.rows == result.rows
    # A results.json of another schema is refused with a message, not misread.
    old = json.loads(result.to_json())
    old["schema"] = 1
    with pytest.raises(ValueError, match="schema 1"):
        RunResult.from_json(json.dumps(old))


def test_report_tables_for_variants_and_workloads() -> None:
    result = _synthetic_result()
    report = render_markdown(result, "chart.png", "chart_details.png")
    assert "## dict-10k and its variants" in report
    assert "| dict-10k-natural: as built |" in report
    # Variants are left out of the means: jax's tuple3 and dict-10k ratios are 0.8 and 1.8, one
    # tree slower, one faster; optree's flatten on tuple3 reads the same.
    assert "| flatten | 1.20× [1.09–1.31] (1/0/1 of n=2) | 3.00× [1.62–3.10] (1/1/0 of n=2) |" in (
        report
    )
    assert "| tuple3 | flatten | jax | 0.80× [0.70–0.90] |" in report  # listed as slower
    assert "flatten/tuple3 vs optree 3.00× [0.90–3.10]" in report  # listed as the same
    assert "| **fast**: a call | 2 ms | 1 ms | **2.00× [1.90–2.10]** | why |" in report
    assert "**0.99× [0.90–1.10]** = |" in report  # the same, not a slowdown
    assert "### Operations on an equinox model" in report
    assert "unavailable: no library" in report
    assert "## Treedef memory" in report and "60.0 B/node (2.00×)" in report
    assert "87.5% confidence" in report  # the workloads' 4 rounds
    assert report.index("](chart.png)") < report.index("](chart_details.png)")
    table = render_table(result)
    assert "end-to-end workloads" in table and "not run: unavailable: no library" in table
    assert "(0.80x<)" in table and "(3.00x=)" in table


@pytest.mark.skipif(not HAS_MATPLOTLIB, reason="matplotlib is not installed")
def test_charts_draw_every_panel(tmp_path: Path) -> None:
    from benchmarks.report.chart import write_chart
    from benchmarks.report.chart_details import write_detail_chart

    result = _synthetic_result()
    write_chart(result, tmp_path / "chart.png")
    write_detail_chart(result, tmp_path / "details.png")
    from benchmarks.report.chart import caption

    assert "Python 3.x" in caption(result, "") and "test cpu" in caption(result, "")
    assert (tmp_path / "chart.png").stat().st_size > 10_000
    assert (tmp_path / "details.png").stat().st_size > 10_000
    # Nothing to compare: a note, not an empty picture.
    empty = RunResult({}, {"mode": "quick"}, "fastree", {})
    with pytest.raises(Unsupported):
        write_chart(empty, tmp_path / "empty.png")
    with pytest.raises(Unsupported):
        write_detail_chart(empty, tmp_path / "empty.png")


@pytest.mark.skipif(not HAS_MATPLOTLIB, reason="matplotlib is not installed")
def test_publish_from_results_json(tmp_path: Path, quick_run: Path) -> None:
    """A run is published from its results.json, nothing timed again; a filtered one is not."""
    from benchmarks.report.publish import main

    source = tmp_path / "results.json"
    _synthetic_result().write(source)
    assert main([str(source), "--destination", str(tmp_path)]) == 0
    assert "do not edit by hand" in (tmp_path / PUBLISHED_REPORT).read_text()
    assert (tmp_path / PUBLISHED_DETAILS).stat().st_size > 10_000
    assert main([str(quick_run / "results.json"), "--destination", str(tmp_path / "f")]) == 0
    with pytest.raises(SystemExit):
        main([str(quick_run / "results.json"), "--publish"])
