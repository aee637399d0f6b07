"""report.md (also the published one, benchmarks/published/report.md): what ran, how precise it
is, the figures, the details."""

from __future__ import annotations

import statistics
from typing import Any

from benchmarks.data.operations import MEMORY_OP, OPERATIONS
from benchmarks.measure.results import MEMORY_UNIT, Row, RunResult, WorkloadRow
from benchmarks.report import floor
from benchmarks.report.format import format_interval, format_ratio, format_value
from benchmarks.report.grid import (
    library_columns,
    mean_ratios,
    row_of,
    slower_cells,
    tree_blocks,
    variant_groups,
)
from benchmarks.report.notes import grouped_notes
from benchmarks.report.paired import PAIRED, why_not_the_quotient
from benchmarks.report.palette import HEADLINE_COMPETITORS
from benchmarks.report.stacks import stack_of
from benchmarks.workloads.base import FLOOR

VERDICT_MARK = {"faster": "", "same": " =", "slower": " **slower**"}
"""Appended to a ratio: "=" when its interval includes 1.0x, "slower" when it lies below."""


_GROUP_TITLES = {
    "program": "Programs",
    "equinox model": "Operations on an equinox model",
    "nnx model": "Operations on a flax.nnx model",
}

def render_markdown(
    result: RunResult, chart_file: str | None, details_file: str | None = None
) -> str:
    baseline = result.baseline
    parts = [
        "# fastree benchmarks",
        "",
        *_what_ran(result),
        f"**How to read a ratio.** Peer time / {baseline} time on the same case, so **> 1 means "
        f"{baseline} is faster** (treedef_memory: smaller). Each ratio is the median over rounds "
        f"in which {baseline} and the peer were timed back to back, followed by its interval "
        "`[low–high]`, which covers the true median with the confidence given in Precision below. "
        "A ratio whose interval includes 1.0× is marked `=` (the same: the rounds cannot tell "
        "the two apart), one whose whole interval is below 1.0× is marked **slower**.",
        "",
        *_precision(result),
    ]
    if chart_file:
        parts += [f"![{baseline} speedup per operation, workloads and memory]({chart_file})", ""]
    parts += _summary(result)
    parts += _slower(result)
    parts += _workloads(result)
    parts += floor.section(result)
    parts += _memory(result)
    parts += _variants(result)
    if details_file:
        parts += [f"![{baseline} speedup per tree and operation]({details_file})", ""]
    parts += _per_tree(result)
    parts += _notes(result)
    parts += _method(result)
    parts += _environment(result)
    return "\n".join(parts) + "\n"


def _what_ran(result: RunResult) -> list[str]:
    env, settings = result.environment, result.settings
    versions = ", ".join(f"{name} {version}" for name, version in result.libraries.items())
    trees = [tree for tree in result.trees]
    return [
        f"{settings['mode'].capitalize()} run of `{settings['command']}`, "
        f"{env.get('date', '?')}, {result.duration_s:.0f} s"
        + (pooled_text(result) if result.pooled_runs > 1 else "")
        + f": {len(trees)} trees, "
        f"{len({row.op for row in result.rows})} operations, {len(result.workloads)} end-to-end "
        f"workloads. Python {env.get('python', '?')}; {versions}. Machine: {env.get('cpu', '?')}, "
        f"{env.get('cpu_count', '?')} cores"
        + (f", {load_text(env)}" if load_text(env) else "")
        + f"{_workload_libraries(result)}.",
        "",
    ]


def pooled_text(result: RunResult) -> str:
    """`` in all, 3 runs pooled (started 2026-01-02T..., ..., ...)``: a pooled run's runs."""
    dates = ", ".join(str(run.get("date", "?")) for run in result.runs)
    return f" in all, {result.pooled_runs} runs pooled (started {dates})"


def load_text(env: dict[str, Any]) -> str:
    """``load average 1.93 at the start, 2.41 at the end`` (1-minute), or "" when not recorded."""
    start, end = env.get("load_average_start"), env.get("load_average_end")
    if not start and not end:
        return ""
    said = [
        f"{load[0]:.2f} at the {when}" for load, when in ((start, "start"), (end, "end")) if load
    ]
    return "load average " + ", ".join(said)


def _workload_libraries(result: RunResult) -> str:
    libraries = result.environment.get("workload_libraries")
    return f"; the workloads used {libraries}" if libraries else ""


def interval_widths(result: RunResult) -> list[float]:
    """Relative half-width, sqrt(high / low) - 1, of every timed peer ratio."""
    return [
        (row.ratio_high / row.ratio_low) ** 0.5 - 1
        for row in result.rows
        if row.library != result.baseline
        and row.unit != MEMORY_UNIT
        and row.ratio_low
        and row.ratio_high
    ]


def _precision(result: RunResult) -> list[str]:
    settings = result.settings
    widths = interval_widths(result)
    rows = [
        r for r in result.rows if r.library != result.baseline and r.ratio and r.unit != MEMORY_UNIT
    ]
    lines = ["## Precision", ""]
    if widths:
        tolerance = settings.get("tolerance", 0)
        within = sum(w <= tolerance for w in widths)
        rounds = [r.repeats or 0 for r in rows]
        confidences = sorted({round(r.confidence or 0, 3) for r in rows})
        lines.append(
            f"Tree cases: {min(rounds)}–{max(rounds)} rounds each (median "
            f"{statistics.median(rounds):g}); rounds are added until every ratio's interval is "
            f"within ±{tolerance:.0%} or a case has had {settings.get('max_rounds')} rounds or "
            f"{settings.get('max_seconds_per_case')} s. {within} of {len(widths)} ratios reached "
            f"±{tolerance:.0%}; the median interval is ±{statistics.median(widths):.1%}, the "
            f"widest ±{max(widths):.0%}. Interval confidence: "
            + ", ".join(f"{c:.1%}" for c in confidences)
            + " (it depends on the number of rounds: stats.py)."
        )
    timed = [w for w in result.workloads if w.speedup]
    if timed:
        lines += [
            "",
            f"Workloads: {timed[0].rounds} rounds ({settings.get('workload_pairs')} pairs of "
            f"processes, {settings.get('workload_rounds')} rounds each); their intervals cover the "
            f"median with {timed[0].confidence:.1%} confidence. Rounds within one pair share that "
            "pair's processes, so a difference between processes (where their memory landed, "
            "say) is sampled only as often as there are pairs.",
        ]
    if result.pooled_runs > 1:
        lines += [
            "",
            f"Pooled from {result.pooled_runs} runs: the rounds and intervals above are every "
            "run's together (each run's own figures and samples are in results.json, under "
            "`runs`); the confidence of a pooled interval is that of its prediction part.",
        ]
    lines += ["", interval_scope(result)]
    if settings.get("mode") == "quick":
        lines += [
            "",
            "A quick run trades precision for time: short rounds (~"
            f"{settings.get('target_ms_per_round')} ms per library) on a machine that may be "
            "busy.",
        ]
    return [*lines, ""]


def interval_scope(result: RunResult) -> str:
    """What an interval covers, said plainly (the report's Precision and the charts' captions)."""
    settings = result.settings
    if result.pooled_runs > 1:
        return (
            f"**What an interval covers**: where a new run's figure lands. The figures are pooled "
            f"from {result.pooled_runs} runs of the same command made one after another, each in "
            "processes of its own: a figure is the median of the runs' figures, and its interval "
            "the hull of every run's own interval and a "
            f"{settings.get('prediction_confidence', 0.9):.0%} prediction interval for one more "
            "run's figure, drawn from the spread between the runs"
            + (
                ", each cell's own moderated towards the spread typical of the suite's cells"
                if settings.get("prediction_confidence")
                else ""
            )
            + " (`stats.across_runs` in "
            "`benchmarks/measure/stats.py`). So it holds the spread between runs on this stack "
            "and machine, not only one run's rounds. `python -m benchmarks.report.compare "
            "PUBLISHED.json NEW.json` counts how many of these intervals hold a new run's figures "
            "(coverage)."
        )
    return (
        "**What an interval covers**: the spread of this run's rounds, under this run's load. A "
        "tree case's rounds run back to back in one process, within "
        f"{settings.get('max_seconds_per_case', '?')} s; a workload's in "
        f"{settings.get('workload_pairs', '?')} pairs of processes started one after the other. "
        "It is not the spread between runs: on a shared machine a cell can move between two runs "
        "by more than its interval, and a cell near 1.0× can change verdict. `python -m "
        "benchmarks.report.compare A.json B.json` counts the cells whose verdicts differ "
        "between two runs."
    )


def _summary(result: RunResult) -> list[str]:
    """Per op: each peer's geometric mean over trees, its interval, and the trees' verdicts."""
    means = mean_ratios(result)
    if not means:
        return [f"_No ratios: {result.baseline} did not run alongside another library._", ""]
    competitors = [
        name
        for name in library_columns(result)
        if any(name in by_library for by_library in means.values())
    ]
    variants = [tree.name for tree in result.trees if tree.variant_of]
    left_out = (
        f" The {len(variants)} dict-order variants are left out of the means (their own table is "
        "below)."
        if variants
        else ""
    )
    lines = [
        "## Summary",
        "",
        f"Geometric mean over trees of (peer time / {result.baseline} time), its interval (the "
        "geometric means of the trees' interval ends), and how many trees read faster / same / "
        "slower (n = trees)." + left_out,
        "",
        "| op | " + " | ".join(competitors) + " |",
        "|---|" + "---:|" * len(competitors),
    ]
    for op in OPERATIONS:
        if op not in means or op == MEMORY_OP:
            continue
        cells = []
        for name in competitors:
            mean = means[op].get(name)
            if mean:
                v = mean.verdicts
                cells.append(
                    f"{format_interval(mean.value, mean.low, mean.high, '×')} "
                    f"({v['faster']}/{v['same']}/{v['slower']} of n={mean.trees})"
                )
            else:
                cells.append("–")
        lines.append(f"| {op} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def _slower(result: RunResult) -> list[str]:
    slower = slower_cells(result)
    same = [
        row
        for row in result.rows
        if row.library != result.baseline and row.ratio and row.verdict == "same"
    ]
    lines = ["## Where fastree is not faster", ""]
    if slower:
        lines += [
            f"{len(slower)} cells where {result.baseline} is slower than a peer (the whole "
            "interval below 1.0×):",
            "",
            "| tree | op | peer | ratio [interval] |",
            "|---|---|---|---:|",
        ]
        for row in slower:
            lines.append(
                f"| {row.tree} | {row.op} | {row.library} | "
                f"{format_interval(row.ratio, row.ratio_low, row.ratio_high, '×')} |"
            )
    else:
        lines.append(f"No cell where {result.baseline} is slower than a peer.")
    if same:
        listed = ", ".join(
            f"{row.op}/{row.tree} vs {row.library} "
            f"{format_interval(row.ratio, row.ratio_low, row.ratio_high, '×')}"
            for row in same
        )
        lines += ["", f"{len(same)} cells read the same (interval includes 1.0×): {listed}."]
    return [*lines, ""]


def _workloads(result: RunResult) -> list[str]:
    # The floor rows' figure is their distance from the floor: a table of their own (floor.py).
    workloads = [row for row in result.workloads if row.group != FLOOR]
    if not workloads:
        return []
    lines = [
        "## End-to-end workloads: plain JAX vs fastree installed first",
        "",
        "Each workload runs in two processes side by side: plain (`python -m "
        "benchmarks.measure.child`) and installed (`python -m fastree.run -m "
        "benchmarks.measure.child`: fastree is installed before any library is imported, as a "
        "user starts a program with it). Both build the workload and warm it up, their results "
        "must fingerprint the same, then they take turns timing it, round after round. "
        "**speedup = plain / installed, > 1 "
        "means installing fastree made it faster**; `=` marks an interval that includes 1.0×. "
        f"The speedup is {PAIRED} (under the same load), while the plain and installed columns "
        "are each process's median over the rounds, taken apart, so their quotient can differ "
        "from it; a row whose quotient lies outside the speedup's interval says so.",
        "",
    ]
    for group in dict.fromkeys(row.group for row in workloads):
        lines += [
            f"### {_GROUP_TITLES.get(group, group)}",
            "",
            "| workload | plain | installed | speedup [interval] | where the time goes |",
            "|---|---:|---:|---:|---|",
        ]
        for row in (r for r in workloads if r.group == group):
            lines.append(_workload_line(row))
        lines.append("")
    routes = result.environment.get("fastree_installed_routes")
    if routes:
        lines += [f"Installing fastree routed {routes}.", ""]
    return lines


def _workload_line(row: WorkloadRow) -> str:
    if row.not_run:
        cells = f"– | – | {row.not_run} "
    else:
        speedup = format_interval(row.speedup, row.speedup_low, row.speedup_high, "×")
        mark = VERDICT_MARK.get(row.verdict or "same", "")
        note = why_not_the_quotient(row)
        cells = (
            f"{format_value(row.plain, 'ns', micro='µs')} | "
            f"{format_value(row.installed, 'ns', micro='µs')} | **{speedup}**{mark} "
            + (f"({note}) " if note else "")
        )
    return f"| **{row.name}**: {row.description} | {cells}| {row.why} |"


def _memory(result: RunResult) -> list[str]:
    rows = [row for row in result.rows if row.op == MEMORY_OP]
    if not rows:
        return []
    trees = list(dict.fromkeys(row.tree for row in rows))
    libraries = [name for name in library_columns(result) if any(r.library == name for r in rows)]
    lines = [
        "## Treedef memory",
        "",
        "Bytes held per treedef node (RSS growth while many treedefs of the tree are alive, "
        f"divided by their nodes); in parentheses, how many times smaller {result.baseline}'s "
        "is.",
        "",
        "| tree | " + " | ".join(libraries) + " |",
        "|---|" + "---:|" * len(libraries),
    ]
    for tree in trees:
        cells = []
        for name in libraries:
            row = row_of(result, tree, MEMORY_OP, name)
            if row is None:
                cells.append("–")
                continue
            value = format_value(row.median, row.unit)
            ratio = "" if name == result.baseline else f" ({format_ratio(row.ratio, '×')})"
            cells.append(value + ratio)
        lines.append(f"| {tree} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def _variants(result: RunResult) -> list[str]:
    """Per base tree with variants (dict-10k and its insertion orders): one row per variant, one
    column per op, each cell the baseline's time and the headline competitors' ratios."""
    lines: list[str] = []
    for base, trees in variant_groups(result).items():
        names = {tree.name for tree in trees}
        ops = [op for op in OPERATIONS if any(r.op == op and r.tree in names for r in result.rows)]
        ops = [
            op
            for op in ops
            if all(row_of(result, t.name, op, result.baseline) for t in trees if t.variant_of)
        ]
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
            f"The same dict built {len(trees)} ways: only the order its keys were inserted in "
            "differs, which decides how much sorting a flatten does. Each cell: "
            f"{result.baseline}'s time (" + ", ".join(f"{name} ×" for name in competitors) + ").",
            "",
            "| tree | " + " | ".join(ops) + " |",
            "|---|" + "---:|" * len(ops),
        ]
        for tree in trees:
            cells = []
            for op in ops:
                row = row_of(result, tree.name, op, result.baseline)
                if row is None:
                    cells.append("–")
                    continue
                shown = ", ".join(
                    _ratio_cell(row_of(result, tree.name, op, name)) for name in competitors
                )
                cells.append(f"{format_value(row.median, row.unit, micro='µs')} ({shown})")
            label = tree.description.split(", ", 1)[-1]
            lines.append(f"| {tree.name}: {label} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines


def _ratio_cell(row: Row | None) -> str:
    if row is None or row.ratio is None:
        return "–"
    return format_ratio(row.ratio, "×") + VERDICT_MARK.get(row.verdict or "", "")


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
            "| op | ns/leaf | rounds | " + " | ".join(libraries) + " |",
            "|---|---:|---:|" + "---:|" * len(libraries),
        ]
        for line in block.lines:
            cells = []
            for name in libraries:
                row = line.cells.get(name)
                if row is None:
                    cells.append("–")
                    continue
                value = format_value(row.median, row.unit, micro="µs")
                if name == result.baseline or row.ratio is None:
                    cells.append(value)
                    continue
                ratio = format_interval(row.ratio, row.ratio_low, row.ratio_high, "×")
                cells.append(f"{value} ({ratio}{VERDICT_MARK.get(row.verdict or '', '')})")
            per_leaf = "" if line.per_leaf_ns is None else f"{line.per_leaf_ns:.2f}"
            if per_leaf and line.per_leaf_of != result.baseline:
                per_leaf += f" ({line.per_leaf_of})"
            rounds = max((row.repeats or 0 for row in line.cells.values()), default=0)
            lines.append(f"| {line.op} | {per_leaf} | {rounds} | " + " | ".join(cells) + " |")
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
        "- Tree cases: all libraries in one process. Per case: a warm-up call each, an inner "
        f"loop calibrated to ~{settings.get('target_ms_per_round')} ms, then rounds in which "
        "every library runs its loop once, in an order rotated each round. Each round gives one "
        "ratio per peer; the figure is their median and its interval the order-statistic "
        "(sign-test) interval of a median (`benchmarks/measure/stats.py` says why this and not "
        f"pyperf or a bootstrap). At least {settings.get('min_rounds')} rounds, then more until "
        f"every interval is within ±{settings.get('tolerance', 0):.0%}, at most "
        f"{settings.get('max_rounds')} rounds or {settings.get('max_seconds_per_case')} s.",
        "- `gc.collect()` before each case, GC disabled while it is timed.",
        "- Before timing, every library's leaves on each tree must be the very objects "
        "jax.tree_util returns, in the same order; a library that differs is excluded there.",
        "- Leaves are tiny arrays (shape (2,) or (2, 2)): the numbers are tree overhead, not math.",
        "- Functions mapped are trivial (`lambda x: x`, `lambda x, y, z: x`, "
        "`lambda path, x: x`). flatten_up_to uses the tree's own full treedef.",
        f"- Workloads: {settings.get('workload_pairs')} pairs of processes (plain, installed "
        f"first), {settings.get('workload_rounds')} rounds each; in a round each process times "
        f"the call (fastest of three loops, ~{settings.get('workload_target_ms_per_round')} ms "
        "in all), the two taking turns, which goes first alternating. A round's ratio is plain "
        "/ installed. JAX's compilation cache is shared by the processes of a run, so warm-ups "
        "load compiled programs instead of compiling them again.",
        f"- treedef_memory: bytes per node held by many live treedefs of the tree, measured as "
        f"{memory_method} growth (tracemalloc alone misses C++ allocations; its Python-only figure "
        f"is in results.json); {settings.get('memory_rounds')} probes per library, interleaved.",
        "",
    ]


def _environment(result: RunResult) -> list[str]:
    env = result.environment
    lines = ["## Environment", "", "| | |", "|---|---|"]
    lines.append(f"| stack | {stack_of(result).describe()} |")
    if result.pooled_runs > 1:
        lines.append(f"| runs pooled | {result.pooled_runs} |")
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
        "load_average_start",
        "load_average_end",
    ):
        if env.get(key) not in (None, ""):
            value = env[key]
            if key.startswith("load_average"):
                value = " / ".join(f"{v:.2f}" for v in value) + " (1, 5, 15 minutes)"
            lines.append(f"| {key} | {value} |")
    for name, version in result.libraries.items():
        lines.append(f"| {name} | {version} |")
    return [*lines, ""]
