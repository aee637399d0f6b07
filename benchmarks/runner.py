"""The run: plan the cases, build each tree once, guard, time every op, then write the outputs."""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass

from benchmarks import memory, timing
from benchmarks.environment import describe
from benchmarks.guard import leaves_disagreement
from benchmarks.leaves import leaf_factory
from benchmarks.libraries import LOADERS, load_libraries
from benchmarks.libraries.base import Library, TreeApi
from benchmarks.ops import OPS
from benchmarks.results import (
    MEMORY_UNIT,
    TIME_UNIT,
    Note,
    Row,
    RunResult,
    TreeInfo,
    WorkloadRow,
)
from benchmarks.selection import case_selected, selected_ops
from benchmarks.settings import Settings, settings_for
from benchmarks.trees import RECIPES, Recipe, TreeCase, build_case, case_name
from benchmarks.unsupported import Unsupported

MEMORY_OP = "treedef_memory"


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
    write_outputs(result, args.out, write_results=args.write_results)
    _run_library_nodes(args)
    return 0


LIBRARY_NODES = "equinox-library-nodes"


def _run_library_nodes(args: argparse.Namespace) -> None:
    """The equinox model plain vs installed first (benchmarks/library_nodes.py): two processes
    per round, so it runs after the in-process suite and writes its own table and chart."""
    from benchmarks import library_nodes
    from benchmarks.workloads import WORKLOAD_OP

    if not case_selected(WORKLOAD_OP, LIBRARY_NODES, args.only):
        return
    try:
        import equinox  # noqa: F401 - only asks whether it is there
        import optax  # noqa: F401
    except ImportError as error:
        _progress(f"library nodes not run: {error}")
        return
    _progress("library nodes: equinox model, plain vs installed first (separate processes)")
    result = library_nodes.run(2 if args.quick else 3, progress=_progress)
    sys.stdout.write("\n" + library_nodes.render(result))
    written = library_nodes.write_outputs(result, args.out)
    print(f"wrote {', '.join(map(str, written))}", file=sys.stderr)


def run(args: argparse.Namespace) -> RunResult:
    started = time.perf_counter()
    if args.baseline not in LOADERS:
        raise SystemExit(f"--baseline must be one of {', '.join(LOADERS)}, not {args.baseline!r}")
    settings = settings_for(args.quick)
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
            "target_ms_per_repeat": settings.target_ns / 1e6,
            "repeats": settings.repeats,
            "workload_target_ms_per_repeat": settings.workload_target_ns / 1e6,
            "workload_repeats": settings.workload_repeats,
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
        f"libraries: {', '.join(result.libraries) or 'none'}"
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
                rows = _timed_rows(apis, op, case, settings, result)
            _add_ratios(rows, args.baseline)
            result.rows.extend(rows)
            _progress(
                _progress_line(
                    done, total_cases, op, case.name, rows, time.perf_counter() - case_started
                )
            )
        del case  # large trees (100k floats, 16k leaves) go before the next is built

    result.workloads = _run_workloads(settings, args.only, result)
    result.environment = describe(args.device, result.libraries, memory_method)
    if uninstalled:
        result.environment["fastree_install_at_start"] = uninstalled
    if result.workloads and any(row.speedup for row in result.workloads):
        result.environment["fastree_installed_routes"] = _routes()
        result.environment["workload_libraries"] = _workload_library_versions()
    result.duration_s = round(time.perf_counter() - started, 1)
    _progress(f"done in {result.duration_s:.1f} s")
    return result


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


def _run_workloads(settings: Settings, only: list[str], result: RunResult) -> list[WorkloadRow]:
    """The end-to-end workloads --only selects (all of them by default), after the trees."""
    from benchmarks.workloads.run import run_workloads, selected_workloads

    workloads = selected_workloads(only)
    if workloads:
        _progress(f"end-to-end workloads, plain vs fastree installed: {len(workloads)}")
    return run_workloads(
        workloads,
        settings.workload_size,
        settings.workload_target_ns,
        settings.workload_repeats,
        progress=_progress,
    )


def _workload_library_versions() -> str:
    """Versions of the libraries the workloads imported (they are not timed as libraries)."""
    versions = []
    for name in ("equinox", "optax", "flax"):
        module = sys.modules.get(name)
        if module is not None:
            versions.append(f"{name} {getattr(module, '__version__', '?')}")
    return ", ".join(versions)


def _routes() -> str:
    """How many public jax.tree_util / jax.tree functions fastree.installed() replaced."""
    from benchmarks.workloads.install import fastree_installer, public_functions, routed_functions

    routed = routed_functions(fastree_installer())
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
) -> list[Row]:
    candidates = {}
    for name, (lib, api) in apis.items():
        if op not in lib.ops:
            continue
        try:
            candidates[name] = OPS[op].prepare(api, case)  # type: ignore[misc]
        except Unsupported as reason:
            result.skipped.append(Note(name, case.name, op, str(reason)))
    if not candidates:
        return []
    timings, failures = timing.measure(candidates, settings.target_ns, settings.repeats)
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
            )
        )
    return rows


def _add_ratios(rows: list[Row], baseline: str) -> None:
    base = next((row for row in rows if row.library == baseline), None)
    if base is None or base.median <= 0:
        return
    for row in rows:
        row.ratio = row.median / base.median


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _progress_line(
    done: int, total: int, op: str, tree: str, rows: list[Row], seconds: float
) -> str:
    from benchmarks.report.format import format_value

    width = len(str(total))
    cells = "  ".join(f"{row.library} {format_value(row.median, row.unit)}" for row in rows)
    return f"[{done:>{width}}/{total}] {op}/{tree}  {cells or '(nothing ran)'}  ({seconds:.1f}s)"
