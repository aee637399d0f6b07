"""chart_details.png: every cell of the run, one heat map per peer library.

Rows are trees, columns operations; each cell shows peer time / fastree time (the median over
rounds). Blue cells are cases where fastree is faster (darker: more), grey cells read "same"
(the interval includes 1x), red cells are real slowdowns (the whole interval below 1x). One
colour scale serves every panel, so a shade means the same ratio everywhere. Intervals are in
report.md; this chart is for finding the cells worth reading there.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from benchmarks.data.operations import MEMORY_OP, OPERATIONS
from benchmarks.measure.results import Row, RunResult
from benchmarks.report.chart import caption, own_report
from benchmarks.report.palette import SAME_COLOR, SLOWER_COLOR, label_of
from benchmarks.report.plotting import pyplot, speedup_label
from benchmarks.unsupported import Unsupported

MAX_DECADES = 3.0
"""The colour scale runs from 1x to 1000x; larger ratios take the darkest shade."""
MIN_TREES_FOR_OWN_ROW = 3
ROW_INCHES = 0.34
PANEL_EXTRA_INCHES = 1.3


def write_detail_chart(result: RunResult, path: Path, footer: str | None = None) -> None:
    """Raises Unsupported when there is nothing to draw (no peer ratios). ``footer``: the
    caption's last line, where the run's report is (default: ``chart.own_report``)."""
    plt = pyplot()
    from matplotlib import colormaps

    panels = _panels(result)
    if not panels:
        raise Unsupported(
            f"no ratios to draw: {result.baseline} did not run alongside another library"
        )
    # Peers that ran on a few trees only (nnx split/merge, fastree's own variants) share the last
    # row, side by side, instead of a full-width panel each.
    major = [panel for panel in panels if len(panel[1]) >= MIN_TREES_FOR_OWN_ROW]
    minor = [panel for panel in panels if len(panel[1]) < MIN_TREES_FOR_OWN_ROW]
    heights = [len(trees) * ROW_INCHES + PANEL_EXTRA_INCHES for _name, trees, _ops in major]
    if minor:
        heights.append(max(len(trees) for _n, trees, _o in minor) * ROW_INCHES + PANEL_EXTRA_INCHES)
    figure = plt.figure(figsize=(15, sum(heights) + 2.2), layout="constrained")
    grid = figure.add_gridspec(len(heights), 1, height_ratios=heights)
    blues = colormaps["Blues"]
    for index, (peer, trees, ops) in enumerate(major):
        _panel(figure.add_subplot(grid[index]), result, peer, trees, ops, blues)
    if minor:
        row = grid[len(major)].subgridspec(
            1, len(minor), width_ratios=[len(ops) + 1.5 for _p, _t, ops in minor], wspace=0.15
        )
        for index, (peer, trees, ops) in enumerate(minor):
            _panel(figure.add_subplot(row[index]), result, peer, trees, ops, blues)
    figure.suptitle(
        f"Every cell: peer time / {result.baseline} time (blue: {result.baseline} faster; "
        "grey: same, interval includes 1×; red: slower; hatched: not run)",
        fontsize=14,
        fontweight="bold",
    )
    footer = footer or own_report(result, path.parent)
    figure.supxlabel(caption(result, footer), fontsize=9, ha="left", x=0.01)
    figure.savefig(path, dpi=90)
    plt.close(figure)


def _panels(result: RunResult) -> list[tuple[str, list[str], list[str]]]:
    """(peer, trees it ran on, ops it ran) for every peer with at least one ratio."""
    panels = []
    peers = [name for name in result.libraries if name != result.baseline]
    for peer in peers:
        rows = [
            row for row in result.rows if row.library == peer and row.ratio and row.op != MEMORY_OP
        ]
        if not rows:
            continue
        trees = [tree.name for tree in result.trees if any(r.tree == tree.name for r in rows)]
        ops = [op for op in OPERATIONS if any(r.op == op for r in rows)]
        panels.append((peer, trees, ops))
    return panels


def _cell_color(row: Row, blues: Any) -> str | tuple[float, ...]:
    if row.verdict == "slower":
        return SLOWER_COLOR
    if row.verdict == "same" or row.ratio is None:
        return SAME_COLOR
    shade = min(1.0, math.log10(max(row.ratio, 1.0)) / MAX_DECADES)
    return blues(0.25 + 0.7 * shade)


def _panel(
    ax: Any, result: RunResult, peer: str, trees: list[str], ops: list[str], blues: Any
) -> None:
    cells = {(row.tree, row.op): row for row in result.rows if row.library == peer and row.ratio}
    for y, tree in enumerate(trees):
        for x, op in enumerate(ops):
            row = cells.get((tree, op))
            if row is None:
                ax.add_patch(_rect(x, y, "white", hatch="///"))
                continue
            color = _cell_color(row, blues)
            ax.add_patch(_rect(x, y, color))
            dark = not isinstance(color, str) and row.ratio > 30
            label = speedup_label(row.ratio)
            if row.verdict == "same":
                label = "= " + label
            ax.text(
                x,
                y,
                label,
                ha="center",
                va="center",
                fontsize=8.5,
                color="white" if dark or row.verdict == "slower" else "black",
            )
    ax.set_xlim(-0.5, len(ops) - 0.5)
    ax.set_ylim(len(trees) - 0.5, -0.5)
    ax.set_xticks(range(len(ops)), ops, fontsize=9)
    ax.xaxis.tick_top()
    ax.set_yticks(range(len(trees)), trees, fontsize=9)
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    ax.set_title(f"vs {label_of(peer)}", fontsize=11, loc="left", pad=22)


def _rect(x: int, y: int, color: Any, hatch: str | None = None) -> Any:
    from matplotlib.patches import Rectangle

    return Rectangle(
        (x - 0.5, y - 0.5),
        1,
        1,
        facecolor=color,
        # A hatch is drawn in the edge colour: light grey for an empty cell, white between cells.
        edgecolor="0.8" if hatch else "white",
        linewidth=0.5 if hatch else 1.5,
        hatch=hatch,
    )
