"""chart.png, the headline figure: how much faster fastree is, and how sure the run is of it.

- Top: per operation, the speedup over each headline peer (jax.tree_util, optree): the bar is the
  geometric mean over trees, the whisker its interval, each dot one tree (hollow grey: that
  tree's interval includes 1x, so it reads "same"; red: a real slowdown).
- Bottom left: the end-to-end workloads, plain JAX vs fastree installed first, with intervals.
- Bottom right: treedef memory in bytes per node, on its own axis.
- A caption under the panels says what ran: trees, versions, machine, rounds, confidence.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

from benchmarks.data.operations import MEMORY_OP, OPERATIONS
from benchmarks.measure.results import RunResult, WorkloadRow
from benchmarks.report.grid import MeanRatio, mean_ratios, row_of
from benchmarks.report.palette import (
    HEADLINE_COMPETITORS,
    INSTALLED_COLOR,
    SAME_COLOR,
    SLOWER_COLOR,
    color_of,
    label_of,
)
from benchmarks.report.plotting import ONE_X_LINE, log_speedup_axis, pyplot, speedup_label
from benchmarks.unsupported import Unsupported

CAPTION_WIDTH = 190
"""Characters per caption line: what a 15-inch figure holds at 9 points."""


def write_chart(result: RunResult, path: Path) -> None:
    """Raises Unsupported (matplotlib missing, or nothing to draw) so the caller can note it."""
    plt = pyplot()
    means = mean_ratios(result)
    competitors = [
        name for name in HEADLINE_COMPETITORS if any(name in by_lib for by_lib in means.values())
    ]
    workloads = list(result.workloads)
    memory = [row for row in result.rows if row.op == MEMORY_OP]
    if not competitors and not workloads:
        raise Unsupported(
            f"no ratios to draw: {result.baseline} did not run alongside jax or optree, "
            "and no workload ran"
        )
    lower = [kind for kind, present in (("workloads", workloads), ("memory", memory)) if present]
    lower_height = max(3.2, 0.42 * len(workloads) + 1.6) if lower else 0
    top_height = 5.2 if competitors else 0
    figure = plt.figure(figsize=(15, top_height + lower_height + 1.9), layout="constrained")
    rows = (["ops"] if competitors else []) + (["lower"] if lower else [])
    heights = [top_height if kind == "ops" else lower_height for kind in rows]
    grid = figure.add_gridspec(
        len(rows), 2, height_ratios=heights, width_ratios=[1.65, 1] if len(lower) == 2 else [1, 1]
    )
    if competitors:
        _ops_panel(figure.add_subplot(grid[0, :]), result, means, competitors)
    if lower:
        bottom = len(rows) - 1
        if len(lower) == 2:
            _workloads_panel(figure.add_subplot(grid[bottom, 0]), workloads)
            _memory_panel(figure.add_subplot(grid[bottom, 1]), result, memory)
        elif lower == ["workloads"]:
            _workloads_panel(figure.add_subplot(grid[bottom, :]), workloads)
        else:
            _memory_panel(figure.add_subplot(grid[bottom, :]), result, memory)
    figure.suptitle(
        f"{result.baseline} speedup (higher is better), {result.settings.get('mode', '?')} run",
        fontsize=14,
        fontweight="bold",
    )
    figure.supxlabel(caption(result), fontsize=9, ha="left", x=0.01, wrap=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)


def caption(result: RunResult) -> str:
    """What ran, in a few lines: trees, operations, versions, machine, rounds and confidence."""
    env, settings = result.environment, result.settings
    trees = [tree.name for tree in result.trees]
    versions = ", ".join(f"{name} {version}" for name, version in result.libraries.items())
    timed = [
        row
        for row in result.rows
        if row.library != result.baseline and row.confidence and row.op != MEMORY_OP
    ]
    confidence = min((row.confidence or 0 for row in timed), default=0)
    workload_rounds = next((w.rounds for w in result.workloads if w.rounds), 0)
    workload_conf = next((w.confidence for w in result.workloads if w.confidence), 0)
    lines = [
        f"Ran: {len(trees)} trees ({', '.join(trees)}); "
        f"{len({row.op for row in result.rows})} operations; {len(result.workloads)} workloads.",
        f"Versions: Python {env.get('python', '?')}; {versions}"
        + (f"; {env['workload_libraries']}" if env.get("workload_libraries") else "")
        + f". Machine: {env.get('cpu', '?')}, {env.get('cpu_count', '?')} cores; "
        f"{env.get('date', '?')}.",
        f"Intervals: order-statistic intervals of the median over paired rounds; tree cases "
        f"{settings.get('min_rounds', '?')}-{settings.get('max_rounds', '?')} rounds, "
        f"≥{confidence:.0%} confidence"
        + (
            f"; workloads {workload_rounds} rounds (plain and installed processes taking "
            f"turns), {workload_conf:.1%} confidence"
            if workload_rounds
            else ""
        )
        + ". Every figure with its interval: the run's report.md "
        "(published: benchmarks/RESULTS.md).",
    ]
    return "\n".join(textwrap.fill(line, CAPTION_WIDTH) for line in lines)


def _ops_panel(
    ax: Any, result: RunResult, means: dict[str, dict[str, MeanRatio]], competitors: list[str]
) -> None:
    ops = [
        op
        for op in OPERATIONS
        if op != MEMORY_OP and any(n in means.get(op, {}) for n in competitors)
    ]
    width = 0.8 / len(competitors)
    values: list[float] = []
    for index, name in enumerate(competitors):
        offset = (index - (len(competitors) - 1) / 2) * width
        color = color_of(name, competitors)
        for x, op in enumerate(ops):
            mean = means[op].get(name)
            if mean is None:
                continue
            center = x + offset
            values += [mean.low, mean.high, *(ratio for _t, ratio, _v in mean.samples)]
            same = mean.low <= 1.0 <= mean.high
            ax.bar(
                center,
                mean.value - 1.0,
                bottom=1.0,
                width=width * 0.9,
                color=SAME_COLOR if same else color,
                alpha=0.85,
                zorder=2,
            )
            ax.errorbar(
                center,
                mean.value,
                yerr=[[mean.value - mean.low], [mean.high - mean.value]],
                color="black",
                capsize=3,
                linewidth=1.1,
                zorder=4,
            )
            _tree_dots(ax, center, width, mean, color)
            ax.annotate(
                speedup_label(mean.value),
                (center, max(mean.high, max(r for _t, r, _v in mean.samples))),
                xytext=(0, 3),
                textcoords="offset points",
                ha="center",
                fontsize=7.5,
            )
    ax.axhline(1.0, **ONE_X_LINE)
    ax.set_yscale("log")
    low, high = min([1.0, *values]), max([1.0, *values])
    ax.set_ylim(low / 1.5, high * 2.2)
    log_speedup_axis(ax.yaxis, *ax.get_ylim())
    ax.set_xticks(range(len(ops)), ops, fontsize=9, rotation=20, ha="right")
    ax.set_xlim(-0.6, len(ops) - 0.4)
    ax.grid(axis="y", which="major", alpha=0.3, zorder=0)
    ax.set_ylabel(f"peer time / {result.baseline} time (log)")
    ax.set_title(
        f"Per operation: geometric mean over trees of (peer time / {result.baseline} time); "
        "whisker: interval; dots: single trees",
        fontsize=11,
    )
    handles = [_patch(color_of(name, competitors), f"vs {label_of(name)}") for name in competitors]
    handles += [
        _dot(SAME_COLOR, "a tree whose interval includes 1× (same)", hollow=True),
        _dot(SLOWER_COLOR, f"a tree where {result.baseline} is slower"),
    ]
    # Outside the axes, so it can never cover a bar or a label.
    ax.legend(
        handles=handles,
        loc="lower left",
        bbox_to_anchor=(0.0, 1.07),
        ncol=len(handles),
        frameon=False,
        fontsize=9,
    )


def _tree_dots(ax: Any, center: float, width: float, mean: MeanRatio, color: str) -> None:
    count = len(mean.samples)
    for i, (_tree, ratio, verdict) in enumerate(mean.samples):
        x = center + (i - (count - 1) / 2) * (width * 0.7 / max(count, 1))
        if verdict == "same":
            ax.scatter(
                x, ratio, s=9, facecolors="none", edgecolors="0.45", linewidths=0.7, zorder=3
            )
        elif verdict == "slower":
            ax.scatter(x, ratio, s=14, color=SLOWER_COLOR, zorder=3)
        else:
            ax.scatter(x, ratio, s=7, color="black", alpha=0.55, linewidths=0, zorder=3)


def _workloads_panel(ax: Any, workloads: list[WorkloadRow]) -> None:
    """Horizontal bars from 1x with interval whiskers; programs first, then the model groups."""
    labels = [row.name if row.group == "program" else f"{row.name} ({row.group})" for row in workloads]
    values: list[float] = []
    for y, row in enumerate(workloads):
        if not row.speedup:
            ax.text(1.0, y, f"  not run: {row.not_run}"[:60], va="center", fontsize=8, color="0.35")
            continue
        same = row.verdict == "same"
        color = SAME_COLOR if same else SLOWER_COLOR if row.verdict == "slower" else INSTALLED_COLOR
        ax.barh(y, row.speedup - 1.0, left=1.0, height=0.62, color=color, zorder=2)
        ax.errorbar(
            row.speedup,
            y,
            xerr=[[row.speedup - row.speedup_low], [row.speedup_high - row.speedup]],
            color="black",
            capsize=2.5,
            linewidth=1,
            zorder=3,
        )
        values += [row.speedup_low, row.speedup_high]
        text = f"{speedup_label(row.speedup)} [{row.speedup_low:.2f}–{row.speedup_high:.2f}]"
        ax.annotate(
            text + (" same" if same else ""),
            (max(1.0, row.speedup_high), y),
            xytext=(4, 0),
            textcoords="offset points",
            va="center",
            fontsize=8,
        )
    ax.axvline(1.0, **ONE_X_LINE)
    ax.set_xscale("log")
    low, high = min([0.8, *values]), max([1.5, *values])
    ax.set_xlim(low / 1.15, high * 3.5)  # room for the labels
    log_speedup_axis(ax.xaxis, *ax.get_xlim())
    ax.set_yticks(range(len(labels)), labels, fontsize=8.5)
    ax.set_ylim(len(labels) - 0.5, -0.5)
    ax.grid(axis="x", which="major", alpha=0.3, zorder=0)
    ax.set_xlabel("plain time / installed time (log); grey: interval includes 1×")
    ax.set_title(
        "End-to-end: plain JAX vs fastree installed first (python -m fastree.run),\n"
        "two processes taking turns, round by round",
        fontsize=10.5,
    )


def _memory_panel(ax: Any, result: RunResult, rows: list[Any]) -> None:
    """Bytes per treedef node, per library and tree: an axis of its own, not a speedup."""
    trees = list(dict.fromkeys(row.tree for row in rows))
    libraries = list(dict.fromkeys(row.library for row in rows))
    libraries.sort(key=lambda name: name != result.baseline)
    height = 0.8 / len(libraries)
    top = 0.0
    for i, name in enumerate(libraries):
        color = "#222222" if name == result.baseline else color_of(name, libraries)
        for y, tree in enumerate(trees):
            row = row_of(result, tree, MEMORY_OP, name)
            if row is None:
                continue
            at = y + (i - (len(libraries) - 1) / 2) * height
            ax.barh(at, row.median, height=height * 0.9, color=color, zorder=2)
            ax.annotate(
                f"{row.median:.0f}",
                (row.median, at),
                xytext=(3, 0),
                textcoords="offset points",
                va="center",
                fontsize=7.5,
            )
            top = max(top, row.median)
    ax.set_xlim(0, top * 1.2 if top > 0 else 1)
    ax.set_yticks(range(len(trees)), trees, fontsize=9)
    ax.set_ylim(len(trees) - 0.5, -0.5)
    ax.grid(axis="x", alpha=0.3, zorder=0)
    ax.set_xlabel("bytes per treedef node (lower is better)")
    ax.set_title("Treedef memory", fontsize=10.5)
    ax.legend(
        handles=[
            _patch("#222222" if n == result.baseline else color_of(n, libraries), label_of(n))
            for n in libraries
        ],
        # Outside the axes, right of them: the bars can never run under it.
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        fontsize=8,
        frameon=False,
    )


def _patch(color: str, label: str) -> Any:
    from matplotlib.patches import Patch

    return Patch(color=color, label=label)


def _dot(color: str, label: str, hollow: bool = False) -> Any:
    from matplotlib.lines import Line2D

    return Line2D(
        [],
        [],
        marker="o",
        linestyle="",
        markersize=5,
        markerfacecolor="none" if hollow else color,
        markeredgecolor=color,
        label=label,
    )
