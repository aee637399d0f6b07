"""The run: plan the cases, build each tree once, guard, time every op, then write the outputs."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import dataclass

from benchmarks.data.leaves import leaf_factory
from benchmarks.data.operations import MEMORY_OP
from benchmarks.data.trees import RECIPES, Recipe, TreeCase, build_case, case_name
from benchmarks.libraries import LOADERS, load_libraries
from benchmarks.libraries.base import Library, TreeApi
from benchmarks.measure import memory, stats, timing
from benchmarks.measure.calls import CALLS
from benchmarks.measure.environment import describe, missing_device
from benchmarks.measure.guard import leaves_disagreement
from benchmarks.measure.results import (
    MEMORY_UNIT,
    TIME_UNIT,
    Note,
    Row,
    RunResult,
    TreeInfo,
    WorkloadRow,
)
from benchmarks.selection import case_selected, nothing_matched, selected_ops, unmatched
from benchmarks.settings import Settings, settings_for
from benchmarks.unsupported import Unsupported


@dataclass(frozen=True)
class PlannedTree:
    recipe: Recipe
    leaf_kind: str
    name: str
    ops: list[str]


def plan(settings: Settings, leaf_kinds: list[str] | None, only: list[str]) -> list[PlannedTree]:
    """Trees to build, with the ops selected on each; trees with nothing selected are left out."""
    planned = []
    for recipe in RECIPES:
        if recipe.fixed_leaves:
            kinds = ["numpy"]  # the tree brings its own leaves; build it once
        elif leaf_kinds is not None:
            kinds = leaf_kinds
        else:
            kinds = ["numpy", *settings.extra_leaf_kinds.get(recipe.name, ())]
        for kind in kinds:
            # A treedef does not hold its leaves, so its memory is probed once, on numpy leaves.
            probe_memory = recipe.memory_probe and kind == "numpy"
            recipe_ops = [op for op in recipe.ops if op != MEMORY_OP or probe_memory]
            name = case_name(recipe, kind)
            ops = selected_ops(name, recipe_ops, only)
            if ops:
                planned.append(PlannedTree(recipe, kind, name, ops))
    return planned


def run_from_args(args: argparse.Namespace) -> int:
    from benchmarks.report import write_outputs

    result = run(args)
    return write_outputs(result, args.out, publish_run=args.publish)


def run(args: argparse.Namespace) -> RunResult:
    started = time.perf_counter()
    load_at_start = _load_average()
    if args.baseline not in LOADERS:
        raise SystemExit(f"--baseline must be one of {', '.join(LOADERS)}, not {args.baseline!r}")
    settings = settings_for(args.quick)
    if args.only:
        _refuse_unmatched(settings, args)
    no_device = missing_device(args.device)
    if no_device is not None:
        raise SystemExit(f"python -m benchmarks: refused: {no_device}")
    uninstalled = _take_fastree_out_of_jax()
    planned = plan(settings, args.leaves, args.only)
    wanted_ops = {op for tree in planned for op in tree.ops}
    # Import only the libraries some selected op needs (flax alone takes over a second).
    names = [name for name in LOADERS if name != "nnx" or "split_merge" in wanted_ops]
    libraries, missing = load_libraries(names)
    libraries = [lib for lib in libraries if lib.ops & wanted_ops]

    result = RunResult(
        environment={},
        settings={
            "mode": settings.mode,
            "target_ms_per_round": settings.target_ns / 1e6,
            "min_rounds": settings.rounds.minimum,
            "max_rounds": settings.rounds.maximum,
            "tolerance": settings.rounds.tolerance,
            "max_seconds_per_case": settings.rounds.max_seconds,
            "confidence": stats.CONFIDENCE,
            "memory_rounds": settings.memory_rounds,
            "workload_pairs": settings.workload_pairs,
            "workload_rounds": workload_rounds(settings, args),
            "workload_target_ms_per_round": settings.workload_target_ns / 1e6,
            "only": list(args.only),
            "leaves": args.leaves or "default",
            "device": args.device,
            "command": " ".join(["python -m benchmarks", *sys.argv[1:]]),
        },
        baseline=args.baseline,
        libraries={lib.name: lib.version for lib in libraries},
        skipped=[Note(name, None, None, reason) for name, reason in missing.items()],
    )
    _progress(
        f"fastree benchmarks, {settings.mode} mode: {len(planned)} trees, "
        f"libraries: {', '.join(result.libraries) or 'none'}; writing to {args.out}/"
    )
    for name, reason in missing.items():
        _progress(f"  skipping {name}: {reason}")

    total_cases = sum(len(tree.ops) for tree in planned)
    done = 0
    memory_method = None
    for tree in planned:
        case = _build(tree, args.device, result)
        if case is None:
            done += len(tree.ops)
            continue
        result.trees.append(
            TreeInfo(
                case.name,
                tree.recipe.description,
                case.leaf_kind,
                len(case.reference_leaves),
                case.num_nodes,
                variant_of=tree.recipe.variant_of,
            )
        )
        apis = _guarded_apis(libraries, case, tree.ops, result)
        for op in tree.ops:
            done += 1
            case_started = time.perf_counter()
            if op == MEMORY_OP:
                rows = _memory_rows(apis, case, settings, result)
                memory_method = next((r.detail["method"] for r in rows), memory_method)
            else:
                rows = _timed_rows(apis, op, case, settings, result, args.baseline)
            _add_ratios(rows, args.baseline)
            result.rows.extend(rows)
            _progress(
                _progress_line(
                    done, total_cases, op, case.name, rows, time.perf_counter() - case_started
                )
            )
        del case  # large trees (100k floats, 16k leaves) go before the next is built

    result.workloads = _run_workloads(settings, args, result)
    result.environment = describe(args.device, result.libraries, memory_method)
    # The machine's load decides how far a cell can move between runs: the report states it.
    result.environment["load_average_start"] = load_at_start
    result.environment["load_average_end"] = _load_average()
    if uninstalled:
        result.environment["fastree_install_at_start"] = uninstalled
    if result.workloads and any(row.speedup for row in result.workloads):
        result.environment["fastree_installed_routes"] = _routes()
        result.environment["workload_libraries"] = _workload_library_versions()
    result.duration_s = round(time.perf_counter() - started, 1)
    _progress(f"done in {result.duration_s:.1f} s")
    return result


def _refuse_unmatched(settings: Settings, args: argparse.Namespace) -> None:
    """Exit, before anything is timed, when an --only pattern selects nothing this run has."""
    from benchmarks.workloads import WORKLOAD_OP, WORKLOADS

    cases = [(op, tree.name) for tree in plan(settings, args.leaves, []) for op in tree.ops]
    cases += [(WORKLOAD_OP, workload.name) for workload in WORKLOADS]
    patterns = unmatched(args.only, cases)
    if patterns:
        raise SystemExit(
            f"python -m benchmarks: refused: {nothing_matched(patterns, cases, WORKLOAD_OP)}"
        )


def _load_average() -> list[float] | None:
    """The 1-, 5- and 15-minute load averages (None where the system has none)."""
    try:
        return [round(value, 2) for value in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def _take_fastree_out_of_jax() -> str | None:
    """Under ``python -m fastree.run`` or FASTREE_INSTALL=1, jax.tree_util's functions are
    fastree's, so the "jax" column would time fastree and the workloads would have no plain
    baseline: fastree is uninstalled for the run, and the run says so."""
    fastree = sys.modules.get("fastree")
    if fastree is None or not getattr(fastree, "is_installed", lambda: False)():
        return None
    fastree.uninstall()
    if fastree.is_installed():
        raise SystemExit("fastree is installed into jax.tree_util and would not uninstall")
    note = "fastree was installed into jax.tree_util at start; uninstalled for the run"
    _progress(f"note: {note}")
    return note


def workload_rounds(settings: Settings, args: argparse.Namespace) -> int:
    return getattr(args, "workload_rounds", None) or settings.workload_rounds


def _run_workloads(
    settings: Settings, args: argparse.Namespace, result: RunResult
) -> list[WorkloadRow]:
    """The end-to-end workloads --only selects (all of them by default), after the trees."""
    from benchmarks.measure.workloads import installed_mode_unavailable, run_workloads
    from benchmarks.workloads import WORKLOAD_OP, WORKLOADS

    workloads = [w for w in WORKLOADS if case_selected(WORKLOAD_OP, w.name, args.only)]
    if not workloads:
        return []
    rounds = workload_rounds(settings, args)
    _progress(
        f"end-to-end workloads: {len(workloads)}, plain vs fastree installed first: "
        f"{settings.workload_pairs} pairs of processes, {rounds} rounds each"
    )
    why_not = installed_mode_unavailable()
    if why_not is not None:
        _progress(f"  workloads not run: {why_not}")
        return [
            WorkloadRow(w.name, w.description, w.why, w.group, not_run=why_not) for w in workloads
        ]
    # One compilation cache for every child of this run: each process's warm-up would otherwise
    # compile the same programs again (the timed calls run compiled code either way).
    cache_settings = {
        "JAX_COMPILATION_CACHE_DIR": None,
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
    }
    with tempfile.TemporaryDirectory(prefix="fastree-bench-jax-cache-") as cache:
        cache_settings["JAX_COMPILATION_CACHE_DIR"] = cache
        saved = {name: os.environ.get(name) for name in cache_settings}
        os.environ.update({name: value for name, value in cache_settings.items() if value})
        try:
            rows = run_workloads(
                workloads,
                settings.workload_size,
                settings.workload_target_ns,
                settings.workload_pairs,
                rounds,
                progress=_progress,
            )
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
    for row in rows:
        _progress(_workload_line(row))
    return rows


def _workload_line(row: WorkloadRow) -> str:
    from benchmarks.report.format import format_interval, format_value

    if row.not_run:
        return f"  workload {row.name}: not run ({row.not_run})"
    return (
        f"  workload {row.name}: plain {format_value(row.plain, 'ns')}  installed "
        f"{format_value(row.installed, 'ns')}  speedup "
        f"{format_interval(row.speedup, row.speedup_low, row.speedup_high)} ({row.verdict})"
    )


def _workload_library_versions() -> str:
    """Versions of the libraries the workloads use (imported in the child processes only)."""
    from importlib.metadata import PackageNotFoundError, version

    versions = []
    for name in ("equinox", "optax", "flax"):
        try:
            versions.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            pass
    return ", ".join(versions)


def _routes() -> str:
    """How many public jax.tree_util / jax.tree functions fastree.installed() replaced."""
    from benchmarks.measure.install import fastree_installer, public_functions, routed_functions

    try:
        routed = routed_functions(fastree_installer())
    except Unsupported as reason:
        return str(reason)
    total = len(public_functions())
    return f"{len(routed)} of {total} public functions: {', '.join(routed)}"


def _build(tree: PlannedTree, device: str, result: RunResult) -> TreeCase | None:
    try:
        leaf = leaf_factory(tree.leaf_kind, device)
        return build_case(tree.recipe, tree.leaf_kind, leaf)
    except Unsupported as reason:
        result.skipped.append(Note(None, tree.name, None, str(reason)))
        _progress(f"  skipping tree {tree.name}: {reason}")
        return None


def _guarded_apis(
    libraries: list[Library], case: TreeCase, ops: list[str], result: RunResult
) -> dict[str, tuple[Library, TreeApi]]:
    """name -> (library, api) for libraries that can express the tree and agree with JAX on it."""
    apis = {}
    for lib in libraries:
        if not lib.ops & set(ops):
            continue
        try:
            api = lib.api_for(case)
        except Unsupported as reason:
            result.skipped.append(Note(lib.name, case.name, None, str(reason)))
            continue
        disagreement = leaves_disagreement(api, case)
        if disagreement is not None:
            result.excluded.append(Note(lib.name, case.name, None, disagreement))
            _progress(f"  EXCLUDED {lib.name} on {case.name}: {disagreement}")
            continue
        apis[lib.name] = (lib, api)
    return apis


def _timed_rows(
    apis: dict[str, tuple[Library, TreeApi]],
    op: str,
    case: TreeCase,
    settings: Settings,
    result: RunResult,
    baseline: str,
) -> list[Row]:
    candidates = {}
    for name, (lib, api) in apis.items():
        if op not in lib.ops:
            continue
        try:
            candidates[name] = CALLS[op](api, case)
        except Unsupported as reason:
            result.skipped.append(Note(name, case.name, op, str(reason)))
    if not candidates:
        return []
    timings, failures = timing.measure(candidates, settings.target_ns, settings.rounds, baseline)
    for name, error in failures.items():
        result.skipped.append(Note(name, case.name, op, f"raised {type(error).__name__}: {error}"))
    num_leaves = max(len(case.reference_leaves), 1)
    return [
        Row(
            tree=case.name,
            op=op,
            library=name,
            unit=TIME_UNIT,
            median=t.median_ns,
            min=t.min_ns,
            per_leaf_ns=t.median_ns / num_leaves,
            ratio=None,
            loops=t.loops,
            repeats=len(t.samples_ns),
            samples=list(t.samples_ns),
        )
        for name, t in timings.items()
    ]


def _memory_rows(
    apis: dict[str, tuple[Library, TreeApi]],
    case: TreeCase,
    settings: Settings,
    result: RunResult,
) -> list[Row]:
    structures = {}
    for name, (lib, api) in apis.items():
        if MEMORY_OP not in lib.ops:
            continue
        if api.structure is None:
            result.skipped.append(Note(name, case.name, MEMORY_OP, "no treedef object"))
            continue
        structures[name] = api.structure
    copies = max(memory.MIN_COPIES, settings.memory_copies_nodes // case.num_nodes)
    probes: dict[str, list[memory.MemoryProbe]] = {name: [] for name in structures}
    for _round in range(settings.memory_rounds):
        for name, structure in structures.items():
            probes[name].append(memory.probe(structure, case.tree, case.num_nodes, copies))
    rows = []
    for name, samples in probes.items():
        best = memory.median_probe(samples)
        values = [
            p.rss_bytes_per_node if p.rss_bytes_per_node is not None else p.traced_bytes_per_node
            for p in samples
        ]
        median = (
            best.rss_bytes_per_node
            if best.rss_bytes_per_node is not None
            else best.traced_bytes_per_node
        )
        rows.append(
            Row(
                tree=case.name,
                op=MEMORY_OP,
                library=name,
                unit=MEMORY_UNIT,
                median=median,
                min=min(values),
                per_leaf_ns=None,
                ratio=None,
                repeats=len(samples),
                detail={
                    "traced_bytes_per_node": best.traced_bytes_per_node,
                    "copies": copies,
                    "method": best.method,
                },
                samples=values,
            )
        )
    return rows


def _add_ratios(rows: list[Row], baseline: str) -> None:
    """Each row's ratio to the baseline: the median of the per-round ratios, with its interval."""
    base = next((row for row in rows if row.library == baseline), None)
    if base is None or base.median <= 0 or not base.samples:
        return
    for row in rows:
        if row is base:
            row.ratio = 1.0
            continue
        if len(row.samples) != len(base.samples):
            continue  # rounds are paired; a row without its partner's rounds has no ratio
        estimate = stats.paired(row.samples, base.samples)
        row.ratio, row.ratio_low, row.ratio_high = estimate.value, estimate.low, estimate.high
        row.confidence, row.verdict = estimate.confidence, estimate.verdict


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _progress_line(
    done: int, total: int, op: str, tree: str, rows: list[Row], seconds: float
) -> str:
    from benchmarks.report.format import format_value

    width = len(str(total))
    cells = "  ".join(f"{row.library} {format_value(row.median, row.unit)}" for row in rows)
    rounds = max((row.repeats or 0 for row in rows), default=0)
    return (
        f"[{done:>{width}}/{total}] {op}/{tree}  {cells or '(nothing ran)'}  "
        f"({rounds} rounds, {seconds:.1f}s)"
    )
