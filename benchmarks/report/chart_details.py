"""chart_details.png: one panel per tree, a bar per op and competitor, each labelled with its value.

Bars show library time / baseline time (the baseline's speedup; memory for treedef_memory) on a log
axis and grow from the 1x line: right means the baseline is faster. Colours are the palette's, the
same as in the headline chart, and one legend names every library drawn.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from benchmarks.report.grid import TreeBlock, library_columns, tree_blocks
from benchmarks.report.palette import color_of, label_of
from benchmarks.report.plotting import (
    ONE_X_LINE,
    diverging,
    log_limits,
    log_speedup_axis,
    pyplot,
    speedup_label,
)
from benchmarks.results import RunResult
from benchmarks.unsupported import Unsupported

COLUMNS = 3
INCHES_PER_BAR = 0.16
PANEL_PADDING_INCHES = 0.9
"""Per panel row: title, x ticks and spacing."""
TITLE_INCHES = 1.1
"""Above the panels: the figure title and the legend."""


def write_detail_chart(result: RunResult, path: Path) -> None:
    """Raises Unsupported when there is nothing to draw (no competitor ratios)."""
    plt = pyplot()
    blocks = [block for block in tree_blocks(result) if _competitors(block, result.baseline)]
    if not blocks:
        raise Unsupported(
            f"no ratios to draw: {result.baseline} did not run alongside another library"
        )
    everyone = [name for name in library_columns(result) if name != result.baseline]
    rows = math.ceil(len(blocks) / COLUMNS)
    heights = [
        max(_bar_count(block, result.baseline) for block in blocks[r * COLUMNS : (r + 1) * COLUMNS])
        * INCHES_PER_BAR
        + PANEL_PADDING_INCHES
        for r in range(rows)
    ]
    top = TITLE_INCHES / (sum(heights) + TITLE_INCHES)
    figure = plt.figure(figsize=(6.2 * COLUMNS, sum(heights) + TITLE_INCHES), layout="constrained")
    # The title and the legend get the band above the panels that the layout leaves alone.
    figure.get_layout_engine().set(rect=(0, 0, 1, 1 - top))
    grid = figure.add_gridspec(rows, COLUMNS, height_ratios=heights)
    drawn: set[str] = set()
    for index, block in enumerate(blocks):
        ax = figure.add_subplot(grid[index // COLUMNS, index % COLUMNS])
        drawn |= _panel(ax, block, result.baseline, everyone)
    shown = [name for name in everyone if name in drawn]
    figure.suptitle(
        f"Per tree: library time / {result.baseline} time ({result.baseline} speedup; "
        "treedef_memory: bytes), log scale, higher is better",
        y=1 - top * 0.12,
        va="top",
        fontsize=14,
        fontweight="bold",
    )
    figure.legend(
        [plt.Rectangle((0, 0), 1, 1, color=color_of(name, everyone)) for name in shown],
        [f"{label_of(name)} / {result.baseline}" for name in shown],
        loc="upper center",
        bbox_to_anchor=(0.5, 1 - top * 0.45),
        ncol=len(shown),
        frameon=False,
        fontsize=11,
    )
    figure.savefig(path, dpi=72)
    plt.close(figure)


def _competitors(block: TreeBlock, baseline: str) -> list[str]:
    return [
        name
        for name in block.libraries
        if name != baseline
        and any(line.cells.get(name, None) and line.cells[name].ratio for line in block.lines)
    ]


def _bar_count(block: TreeBlock, baseline: str) -> int:
    return max(1, len(block.lines)) * max(1, len(_competitors(block, baseline)))


def _panel(ax: Any, block: TreeBlock, baseline: str, everyone: list[str]) -> set[str]:
    """Draws one tree; returns the libraries it drew."""
    competitors = _competitors(block, baseline)
    height = 0.84 / len(competitors)
    values: list[float] = []
    for c, name in enumerate(competitors):
        ys, ratios = [], []
        for y, line in enumerate(block.lines):
            row = line.cells.get(name)
            if row is not None and row.ratio:
                ys.append(y + (c - (len(competitors) - 1) / 2) * height)
                ratios.append(row.ratio)
        values += ratios
        starts, lengths = diverging(ratios)
        bars = ax.barh(
            ys, lengths, left=starts, height=height * 0.92, color=color_of(name, everyone), zorder=2
        )
        ax.bar_label(bars, labels=[speedup_label(r) for r in ratios], fontsize=6.5, padding=1.5)
    ax.axvline(1.0, **ONE_X_LINE)
    ax.set_xscale("log")
    ax.set_xlim(*log_limits(values, room=4.0))
    log_speedup_axis(ax.xaxis, *ax.get_xlim())
    ax.tick_params(axis="x", labelsize=8)
    ax.set_yticks(range(len(block.lines)), [line.op for line in block.lines], fontsize=8)
    ax.set_ylim(len(block.lines) - 0.5, -0.5)
    ax.grid(axis="x", which="major", alpha=0.3, zorder=0)
    tree = block.tree
    ax.set_title(f"{tree.name} ({tree.num_leaves:,} leaves)", fontsize=10)
    return set(competitors)
