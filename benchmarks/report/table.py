"""The plain-text table printed to stdout at the end of a run."""

from __future__ import annotations

from benchmarks.measure.results import RunResult
from benchmarks.report import floor
from benchmarks.report.format import format_interval, format_ratio, format_value
from benchmarks.report.grid import tree_blocks
from benchmarks.report.paired import PAIRED, table_note


def render_table(result: RunResult) -> str:
    """Per tree: one line per op; each library's median time per call and, in parentheses, its
    time divided by the baseline's (> 1: the baseline is faster). ns/leaf is the baseline's."""
    blocks = tree_blocks(result)
    if not blocks:
        return render_workloads(result) or "no results\n"
    op_width = max(len(line.op) for block in blocks for line in block.lines)
    cell_width = 20
    if any(row.ratio is not None for row in result.rows):
        heading = (
            f"times per call (median over rounds); (x) = time / {result.baseline}'s time, > 1 "
            f"means {result.baseline} is faster; '=' the interval includes 1x (same), "
            "'<' the whole interval is below 1x (slower)"
        )
    else:
        heading = f"times per call (median); no ratios: {result.baseline} did not run"
    out = [heading]
    for block in blocks:
        tree = block.tree
        out.append("")
        out.append(
            f"== {tree.name}: {tree.num_leaves:,} leaves, {tree.num_nodes:,} nodes, "
            f"leaves: {tree.leaf_kind}"
        )
        out.append(
            f"{'op':<{op_width}}  {'ns/leaf':>9}  "
            + "  ".join(f"{name:>{cell_width}}" for name in block.libraries)
        )
        for line in block.lines:
            cells = []
            for name in block.libraries:
                row = line.cells.get(name)
                if row is None:
                    cells.append(f"{'-':>{cell_width}}")
                    continue
                mark = {"same": "=", "slower": "<"}.get(row.verdict or "", "")
                ratio = f" ({format_ratio(row.ratio)}{mark})" if row.ratio is not None else ""
                cells.append(f"{format_value(row.median, row.unit) + ratio:>{cell_width}}")
            per_leaf = "" if line.per_leaf_ns is None else f"{line.per_leaf_ns:.2f}"
            out.append(f"{line.op:<{op_width}}  {per_leaf:>9}  " + "  ".join(cells))
    return "\n".join(out) + "\n" + render_workloads(result)


def render_workloads(result: RunResult) -> str:
    """The workloads' lines: plain and installed time per call, and plain / installed with its
    interval."""
    if not result.workloads:
        return ""
    width = max(len(row.name) for row in result.workloads)
    out = [
        "",
        "== end-to-end workloads, a plain and an installed-first process taking turns; "
        "speedup = plain / installed [interval], > 1 means installing fastree helps; "
        f"it is {PAIRED}, the columns each process's median",
        f"{'workload':<{width}}  {'plain':>10}  {'installed':>10}  speedup",
    ]
    for row in result.workloads:
        if row.not_run:
            out.append(f"{row.name:<{width}}  not run: {row.not_run}")
            continue
        speedup = format_interval(row.speedup, row.speedup_low, row.speedup_high)
        note = table_note(row)
        out.append(
            f"{row.name:<{width}}  {format_value(row.plain, 'ns'):>10}  "
            f"{format_value(row.installed, 'ns'):>10}  {speedup} ({row.verdict}"
            + (f"; {note}" if note else "")
            + ")"
            + floor.table_suffix(row)
        )
    return "\n".join(out) + "\n"
