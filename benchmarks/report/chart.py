"""chart.png: per tree, a horizontal bar per op and competitor of its time / the baseline's time.

Log-scaled x axis with a line at 1.0: bars right of it are cases where the baseline is faster.
"""

from __future__ import annotations

import math
from pathlib import Path

from benchmarks.report.grid import library_columns, tree_blocks
from benchmarks.results import RunResult
from benchmarks.unsupported import Unsupported

COLUMNS = 3
INCHES_PER_OP = 0.32
MIN_PLOT_INCHES = 2.5
"""Room for title, ticks and axis labels even when a tree has a single op."""


def write_chart(result: RunResult, path: Path) -> None:
    """Raises Unsupported (matplotlib missing, or no ratios to draw) so the caller can note it."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only; never open a window
        import matplotlib.pyplot as plt
    except ImportError:
        raise Unsupported("matplotlib is not installed (pip install matplotlib)") from None

    with_ratios = {row.library for row in result.rows if row.ratio}
    competitors = [
        name for name in library_columns(result) if name != result.baseline and name in with_ratios
    ]
    blocks = [
        block
        for block in tree_blocks(result)
        if any(
            row.ratio
            for line in block.lines
            for row in line.cells.values()
            if row.library != result.baseline
        )
    ]
    if not blocks or not competitors:
        raise Unsupported(
            f"no ratios to draw: {result.baseline} did not run alongside another library"
        )

    rows_of_plots = math.ceil(len(blocks) / COLUMNS)
    tallest = max(len(block.lines) for block in blocks)
    figure, axes = plt.subplots(
        rows_of_plots,
        COLUMNS,
        squeeze=False,
        figsize=(
            6 * COLUMNS,
            rows_of_plots * max(MIN_PLOT_INCHES, tallest * INCHES_PER_OP + 1.2) + 0.8,
        ),
    )
    bar_height = 0.8 / len(competitors)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for index, block in enumerate(blocks):
        ax = axes[index // COLUMNS][index % COLUMNS]
        ops = [line.op for line in block.lines]
        for c, name in enumerate(competitors):
            ys, widths = [], []
            for y, line in enumerate(block.lines):
                row = line.cells.get(name)
                if row is not None and row.ratio:
                    ys.append(y + (c - (len(competitors) - 1) / 2) * bar_height)
                    widths.append(row.ratio)
            # Bars start at 1.0 so they point left (baseline slower) or right (baseline faster).
            ax.barh(
                ys,
                [w - 1 for w in widths],
                left=1,
                height=bar_height,
                color=colors[c % len(colors)],
                label=name if index == 0 else None,
            )
        ax.axvline(1.0, color="black", linewidth=1)
        ax.set_xscale("log")
        ax.set_yticks(range(len(ops)), ops, fontsize=8)
        ax.invert_yaxis()
        ax.set_title(f"{block.tree.name} ({block.tree.num_leaves:,} leaves)", fontsize=10)
        ax.grid(axis="x", which="both", alpha=0.3)
    for index in range(len(blocks), rows_of_plots * COLUMNS):
        axes[index // COLUMNS][index % COLUMNS].set_visible(False)
    height = figure.get_figheight()
    figure.suptitle(
        f"time (memory for treedef_memory) / {result.baseline}'s: "
        f"> 1 means {result.baseline} is faster",
        y=1 - 0.15 / height,
    )
    figure.legend(
        loc="upper center",
        bbox_to_anchor=(0.5, 1 - 0.4 / height),
        ncol=len(competitors),
        frameon=False,
    )
    figure.tight_layout(rect=(0, 0, 1, 1 - 0.8 / height))
    figure.savefig(path, dpi=80)
    plt.close(figure)
