"""report.md (and benchmarks/RESULTS.md): markdown tables grouped by tree, plus the environment."""

from __future__ import annotations

from benchmarks.ops import OPS
from benchmarks.report.format import format_ratio, format_value
from benchmarks.report.grid import (
    library_columns,
    mean_ratios,
    ratio_of,
    tree_blocks,
    variant_groups,
)
from benchmarks.report.notes import grouped_notes
from benchmarks.report.palette import HEADLINE_COMPETITORS
from benchmarks.results import Row, RunResult


def render_markdown(
    result: RunResult, chart_file: str | None, details_file: str | None = None
) -> str:
    baseline = result.baseline
    parts = [
        "# fastree benchmarks",
        "",
        f"{result.settings['mode'].capitalize()} run of `{result.settings['command']}` on "
        f"{result.environment.get('date', '?')}, {result.duration_s:.0f} s. Times are the median "
        f"time per call; in parentheses, each library's time divided by {baseline}'s on the same "
        f"case, so **> 1 means {baseline} is faster** (for treedef_memory: smaller).",
        "",
    ]
    if chart_file:
        parts += [f"![{baseline} speedup per operation, dict order and workload]({chart_file})", ""]
    parts += _summary(result)
    parts += _variants(result)
    parts += _workloads(result)
    if details_file:
        parts += [f"![{baseline} speedup per tree and operation]({details_file})", ""]
    parts += _per_tree(result)
    parts += _notes(result)
    parts += _method(result)
    parts += _environment(result)
    return "\n".join(parts) + "\n"


def _summary(result: RunResult) -> list[str]:
    """Geometric mean over trees of each competitor's ratio, per op: the one-glance view."""
    means = mean_ratios(result)
    if not means:
        return [f"_No ratios: {result.baseline} did not run._", ""]
    competitors = [
        name
        for name in library_columns(result)
        if any(name in by_library for by_library in means.values())
    ]
    variants = [tree.name for tree in result.trees if tree.variant_of]
    left_out = (
        f" The {len(variants)} variant trees ({', '.join(variants)}) are left out of the means"
        " and summarised in their own table below."
        if variants
        else ""
    )
    lines = [
        "## Summary",
        "",
        f"Geometric mean over trees of (library time / {result.baseline} time); n = trees."
        + left_out,
        "",
        "| op | " + " | ".join(competitors) + " |",
        "|---|" + "---:|" * len(competitors),
    ]
    for op in OPS:
        if op not in means:
            continue
        cells = []
        for name in competitors:
            mean = means[op].get(name)
            if mean:
                cells.append(f"{format_ratio(mean.value, '×')} (n={mean.trees})")
            else:
                cells.append("–")
        lines.append(f"| {op} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def _variants(result: RunResult) -> list[str]:
    """Per base tree with variants (dict-10k and its insertion orders): one row per variant, one
    column per op, each cell the baseline's time and the headline competitors' ratios."""
    lines: list[str] = []
    for base, trees in variant_groups(result).items():
        names = {tree.name for tree in trees}
        ops = [op for op in OPS if any(r.op == op and r.tree in names for r in result.rows)]
        ops = [op for op in ops if all(_row(result, t.name, op) for t in trees if t.variant_of)]
        competitors = [
            name
            for name in HEADLINE_COMPETITORS
            if any(r.library == name and r.tree in names for r in result.rows)
        ]
        if not ops or not competitors:
            continue
        lines += [
            f"## {base} and its variants",
            "",
            f"The same kind of tree built {len(trees)} ways; the variants differ from {base} only "
            "in what their descriptions say (for dicts: the order the keys were inserted in, "
            "which decides how much sorting flatten does). Each cell: "
            f"{result.baseline}'s time (" + ", ".join(f"{name} ×" for name in competitors) + ").",
            "",
            "| tree | " + " | ".join(ops) + " |",
            "|---|" + "---:|" * len(ops),
        ]
        for tree in trees:
            cells = []
            for op in ops:
                row = _row(result, tree.name, op)
                if row is None:
                    cells.append("–")
                    continue
                ratios = [ratio_of(result, tree.name, op, name) for name in competitors]
                shown = ", ".join(format_ratio(r, "×") or "–" for r in ratios)
                cells.append(f"{format_value(row.median, row.unit, micro='µs')} ({shown})")
            label = tree.description.split(", ", 1)[-1]
            lines.append(f"| {tree.name}: {label} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines


def _workloads(result: RunResult) -> list[str]:
    if not result.workloads:
        return []
    lines = [
        "## End-to-end workloads: plain vs fastree installed",
        "",
        "Each workload is a real program fragment timed in this process with jax.tree_util as JAX "
        "ships it (plain) and inside `fastree.installed()`, which routes the public "
        "`jax.tree_util` / `jax.tree` functions to fastree for every library. Modes interleaved "
        "per repeat after a warm-up call in each; results of the two modes checked equal first. "
        "**speedup = plain / installed, > 1 means installing fastree made it faster.**",
        "",
        "| workload | plain | installed | speedup | where the time goes |",
        "|---|---:|---:|---:|---|",
    ]
    for row in result.workloads:
        if row.not_run:
            cells = f"– | – | {row.not_run} "
        else:
            cells = (
                f"{format_value(row.plain, 'ns', micro='µs')} | "
                f"{format_value(row.installed, 'ns', micro='µs')} | "
                f"**{format_ratio(row.speedup, '×')}** "
            )
        lines.append(f"| **{row.name}**: {row.description} | {cells}| {row.why} |")
    routes = result.environment.get("fastree_installed_routes")
    if routes:
        lines += ["", f"`fastree.installed()` routed {routes}."]
    return [*lines, ""]


def _row(result: RunResult, tree: str, op: str) -> Row | None:
    """The baseline's row on a case."""
    return next(
        (
            row
            for row in result.rows
            if row.tree == tree and row.op == op and row.library == result.baseline
        ),
        None,
    )


def _per_tree(result: RunResult) -> list[str]:
    lines = ["## Results by tree", ""]
    for block in tree_blocks(result):
        tree, libraries = block.tree, block.libraries
        lines += [
            f"### {tree.name}",
            "",
            f"{tree.description}: {tree.num_leaves:,} leaves, {tree.num_nodes:,} nodes, "
            f"leaves: {tree.leaf_kind}.",
            "",
            "| op | ns/leaf | " + " | ".join(libraries) + " |",
            "|---|---:|" + "---:|" * len(libraries),
        ]
        for line in block.lines:
            cells = []
            for name in libraries:
                row = line.cells.get(name)
                if row is None:
                    cells.append("–")
                    continue
                value = format_value(row.median, row.unit, micro="µs")
                ratio = format_ratio(row.ratio, "×") if name != result.baseline else ""
                cells.append(f"{value} ({ratio})" if ratio else value)
            per_leaf = "" if line.per_leaf_ns is None else f"{line.per_leaf_ns:.2f}"
            if per_leaf and line.per_leaf_of != result.baseline:
                per_leaf += f" ({line.per_leaf_of})"
            lines.append(f"| {line.op} | {per_leaf} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines


def _notes(result: RunResult) -> list[str]:
    lines = []
    if result.excluded:
        lines += [
            "## Excluded by the correctness guard",
            "",
            "These libraries returned leaves that differ from jax.tree_util's on a tree, so "
            "they were not timed there.",
            "",
        ]
        lines += [f"- {line}" for line in grouped_notes(result.excluded)] + [""]
    if result.skipped:
        lines += ["## Not run", ""]
        lines += [f"- {line}" for line in grouped_notes(result.skipped)] + [""]
    return lines


def _method(result: RunResult) -> list[str]:
    settings = result.settings
    memory_method = result.environment.get("memory_method") or "not measured in this run"
    return [
        "## Method",
        "",
        f"- All libraries run in one process. Per case: one warm-up call each, then an inner loop "
        f"calibrated to ~{settings['target_ms_per_repeat']:g} ms per repeat, then "
        f"{settings['repeats']} repeats with the libraries interleaved (round-robin, starting "
        "library rotated each repeat). Reported: median (and, in results.json, min) time per call "
        "from `time.perf_counter_ns`.",
        "- `gc.collect()` before each case, GC disabled while it is timed.",
        "- Before timing, every library's leaves on each tree must be the very objects "
        "jax.tree_util returns, in the same order; a library that differs is excluded there.",
        "- Leaves are tiny arrays (shape (2,) or (2, 2)): the numbers are tree overhead, not math.",
        "- Functions mapped are trivial (`lambda x: x`, `lambda x, y, z: x`, "
        "`lambda path, x: x`). flatten_up_to uses the tree's own full treedef.",
        f"- Workloads: ~{settings.get('workload_target_ms_per_repeat', '?')} ms per repeat, "
        f"{settings.get('workload_repeats', '?')} repeats per mode, interleaved; GC collected "
        "before and disabled during each repeat.",
        f"- treedef_memory: bytes per node held by many live treedefs of the tree, measured as "
        f"{memory_method} growth (tracemalloc alone misses C++ allocations; its Python-only figure "
        "is in results.json).",
        "",
    ]


def _environment(result: RunResult) -> list[str]:
    env = result.environment
    lines = ["## Environment", "", "| | |", "|---|---|"]
    for key in (
        "date",
        "python",
        "implementation",
        "platform",
        "cpu",
        "cpu_count",
        "device",
        "jax_backend",
        "xla_flags",
        "memory_method",
        "source_revision",
        "fastree_location",
        "fastree_install_at_start",
        "workload_libraries",
    ):
        if env.get(key) not in (None, ""):
            lines.append(f"| {key} | {env[key]} |")
    for name, version in result.libraries.items():
        lines.append(f"| {name} | {version} |")
    return [*lines, ""]
