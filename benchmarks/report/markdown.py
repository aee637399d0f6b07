"""report.md (and benchmarks/RESULTS.md): markdown tables grouped by tree, plus the environment."""

from __future__ import annotations

import math
from collections import defaultdict

from benchmarks.ops import OPS
from benchmarks.report.format import format_ratio, format_value
from benchmarks.report.grid import library_columns, tree_blocks
from benchmarks.report.notes import grouped_notes
from benchmarks.results import RunResult


def render_markdown(result: RunResult, chart_file: str | None) -> str:
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
        parts += [f"![ratios vs {baseline}]({chart_file})", ""]
    parts += _summary(result)
    parts += _per_tree(result)
    parts += _notes(result)
    parts += _method(result)
    parts += _environment(result)
    return "\n".join(parts) + "\n"


def _summary(result: RunResult) -> list[str]:
    """Geometric mean over trees of each competitor's ratio, per op: the one-glance view."""
    ratios: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for row in result.rows:
        if row.ratio and row.library != result.baseline:
            ratios[row.op][row.library].append(row.ratio)
    if not ratios:
        return [f"_No ratios: {result.baseline} did not run._", ""]
    competitors = [
        name
        for name in library_columns(result)
        if any(name in by_library for by_library in ratios.values())
    ]
    lines = [
        "## Summary",
        "",
        f"Geometric mean over trees of (library time / {result.baseline} time); n = trees.",
        "",
        "| op | " + " | ".join(competitors) + " |",
        "|---|" + "---:|" * len(competitors),
    ]
    for op in OPS:
        if op not in ratios:
            continue
        cells = []
        for name in competitors:
            values = ratios[op].get(name)
            if values:
                mean = math.exp(sum(math.log(v) for v in values) / len(values))
                cells.append(f"{format_ratio(mean, '×')} (n={len(values)})")
            else:
                cells.append("–")
        lines.append(f"| {op} | " + " | ".join(cells) + " |")
    return [*lines, ""]


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
    ):
        if env.get(key) not in (None, ""):
            lines.append(f"| {key} | {env[key]} |")
    for name, version in result.libraries.items():
        lines.append(f"| {name} | {version} |")
    return [*lines, ""]
