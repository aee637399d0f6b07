"""chart.png, the headline figure: how much faster fastree is, and how sure the run is of it.

- Top: per operation, the speedup over each headline peer (jax.tree_util, optree): the bar is the
  geometric mean over trees, its value written at its foot, the whisker its interval, each dot
  one tree (hollow grey: that tree's interval includes 1x, so it reads "same"; red: a real
  slowdown).
- Bottom left: the end-to-end workloads, plain JAX vs fastree installed first, with intervals.
- Bottom right: treedef memory in bytes per node, on its own axis.
- A caption under the panels says what ran (trees, versions, machine, load, rounds, confidence)
  and what an interval covers.

Every axis has a fixed range (OPS_RANGE, WORKLOAD_RANGE, MEMORY_RANGE), so two charts of the
suite can be compared by eye; a value beyond the range is drawn at its edge as a triangle, and
its label still gives the value.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

from benchmarks.data.operations import MEMORY_OP, OPERATIONS
from benchmarks.measure.results import RunResult, WorkloadRow
from benchmarks.report.grid import MeanRatio, mean_ratios, row_of
from benchmarks.report.markdown import load_text
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
from benchmarks.workloads.base import FLOOR

CAPTION_WIDTH = 190
"""Characters per caption line: what a 15-inch figure holds at 9 points."""
OPS_RANGE = (0.2, 3000.0)
"""Peer time / fastree time on the operations panel (log): below 1x for slowdowns, up to the
treedef hash's hundreds."""
WORKLOAD_RANGE = (0.3, 300.0)
"""Plain / installed time on the workloads panel (log), with room right of the bars for labels."""
MEMORY_RANGE = (0.0, 300.0)
"""Bytes per treedef node on the memory panel."""


def write_chart(result: RunResult, path: Path, footer: str | None = None) -> None:
    """Raises Unsupported (matplotlib missing, or nothing to draw) so the caller can note it.
    ``footer``: the caption's last line, where the run's report is (default: ``own_report``)."""
    plt = pyplot()
    means = mean_ratios(result)
    competitors = [
        name for name in HEADLINE_COMPETITORS if any(name in by_lib for by_lib in means.values())
    ]
    # The floor rows' figure is not a speedup (report.md's floor table has them).
    workloads = [row for row in result.workloads if row.group != FLOOR]
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
    figure.supxlabel(
        caption(result, footer or own_report(result, path.parent)),
        fontsize=9,
        ha="left",
        x=0.01,
        wrap=True,
    )
    figure.savefig(path, dpi=100)
    plt.close(figure)


def own_report(result: RunResult, folder: Path) -> str:
    """A chart's footer naming its own run: the report beside it, the run's mode and date. Only
    the published run's charts point at the published run (publish.py gives them their footer)."""
    return (
        f"Every figure with its interval: report.md beside this chart, in {folder}/ (this "
        f"{result.settings.get('mode', '?')} run of {result.environment.get('date', '?')})."
    )


def caption(result: RunResult, footer: str) -> str:
    """What ran, in a few lines: trees, operations, versions, machine, rounds and confidence;
    then ``footer``, where the report with every figure is."""
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
        + f". Machine: {env.get('cpu', '?')}, {env.get('cpu_count', '?')} cores"
        + (f", {load_text(env)}" if load_text(env) else "")
        + f"; {env.get('date', '?')}.",
        f"Intervals: order-statistic intervals of the median over paired rounds; tree cases "
        f"{settings.get('min_rounds', '?')}-{settings.get('max_rounds', '?')} rounds, "
        f"≥{confidence:.0%} confidence"
        + (
            f"; workloads {workload_rounds} rounds (plain and installed processes taking "
            f"turns), {workload_conf:.1%} confidence"
            if workload_rounds
            else ""
        )
        + (
            f". Pooled from {result.pooled_runs} runs made one after another: a figure is the "
            "runs' median, its interval where a new run's figure lands (the spread between runs "
            "and each run's rounds)."
            if result.pooled_runs > 1
            else ". An interval covers the rounds of this one run, under its load: not the spread "
            "between runs, which on a shared machine is wider "
            "(python -m benchmarks.report.compare)."
        ),
        footer,
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
    for index, name in enumerate(competitors):
        offset = (index - (len(competitors) - 1) / 2) * width
        color = color_of(name, competitors)
        for x, op in enumerate(ops):
            mean = means[op].get(name)
            if mean is None:
                continue
            center = x + offset
            same = mean.low <= 1.0 <= mean.high
            value = _clip(mean.value, OPS_RANGE)
            ax.bar(
                center,
                value - 1.0,
                bottom=1.0,
                width=width * 0.9,
                color=SAME_COLOR if same else color,
                alpha=0.85,
                zorder=2,
            )
            ax.errorbar(
                center,
                value,
                yerr=[
                    [value - _clip(mean.low, OPS_RANGE)],
                    [_clip(mean.high, OPS_RANGE) - value],
                ],
                color="black",
                capsize=3,
                linewidth=1.1,
                zorder=4,
            )
            _tree_dots(ax, center, width, mean, color)
            # The value at the bar's foot, on the far side of 1x from the bar: one row of labels
            # that never meets a whisker or a dot above the bar.
            ax.annotate(
                speedup_label(mean.value),
                (center, 1.0),
                xytext=(0, -4 if mean.value >= 1.0 else 4),
                textcoords="offset points",
                ha="center",
                va="top" if mean.value >= 1.0 else "bottom",
                fontsize=8,
                zorder=5,
            )
    ax.axhline(1.0, **ONE_X_LINE)
    ax.set_yscale("log")
    ax.set_ylim(*OPS_RANGE)
    log_speedup_axis(ax.yaxis, *OPS_RANGE)
    ax.set_xticks(range(len(ops)), ops, fontsize=9, rotation=20, ha="right")
    ax.set_xlim(-0.6, len(ops) - 0.4)
    ax.grid(axis="y", which="major", alpha=0.3, zorder=0)
    ax.set_ylabel(f"peer time / {result.baseline} time (log)")
    ax.set_title(
        f"Per operation: geometric mean over trees of (peer time / {result.baseline} time), "
        "written at the bar's foot; whisker: its interval (this run's rounds); dots: single trees",
        fontsize=11,
    )
    handles = [_patch(color_of(name, competitors), f"vs {label_of(name)}") for name in competitors]
    handles += [
        _dot(SAME_COLOR, "a tree whose interval includes 1× (same)", hollow=True),
        _dot(SLOWER_COLOR, f"a tree where {result.baseline} is slower"),
        _dot("black", "a tree beyond the axis (its value: report.md)", marker="^"),
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


def _clip(value: float, limits: tuple[float, float]) -> float:
    """``value`` kept inside an axis's fixed range (a hair inside, so it is still drawn)."""
    low, high = limits
    return min(max(value, low * 1.001 if low > 0 else low), high * 0.999)


def _tree_dots(ax: Any, center: float, width: float, mean: MeanRatio, color: str) -> None:
    count = len(mean.samples)
    for i, (_tree, ratio, verdict) in enumerate(mean.samples):
        x = center + (i - (count - 1) / 2) * (width * 0.7 / max(count, 1))
        if not OPS_RANGE[0] < ratio < OPS_RANGE[1]:
            # A triangle pointing off the axis, just inside its edge.
            above = ratio >= OPS_RANGE[1]
            at = OPS_RANGE[1] / 1.25 if above else OPS_RANGE[0] * 1.25
            ax.scatter(x, at, s=16, marker="^" if above else "v", color="black", zorder=3)
        elif verdict == "same":
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
    for y, row in enumerate(workloads):
        if not row.speedup:
            ax.text(1.0, y, f"  not run: {row.not_run}"[:60], va="center", fontsize=8, color="0.35")
            continue
        same = row.verdict == "same"
        color = SAME_COLOR if same else SLOWER_COLOR if row.verdict == "slower" else INSTALLED_COLOR
        value = _clip(row.speedup, WORKLOAD_RANGE)
        low = _clip(row.speedup_low or row.speedup, WORKLOAD_RANGE)
        high = _clip(row.speedup_high or row.speedup, WORKLOAD_RANGE)
        ax.barh(y, value - 1.0, left=1.0, height=0.62, color=color, zorder=2)
        ax.errorbar(
            value,
            y,
            xerr=[[value - low], [high - value]],
            color="black",
            capsize=2.5,
            linewidth=1,
            zorder=3,
        )
        text = f"{speedup_label(row.speedup)} [{row.speedup_low:.2f}–{row.speedup_high:.2f}]"
        # Beside the bar, right of its whisker (or of 1x for a bar that grows left: the space
        # left of the axis holds the workloads' names).
        ax.annotate(
            text + (" same" if same else ""),
            (max(1.0, high), y),
            xytext=(4, 0),
            textcoords="offset points",
            va="center",
            fontsize=8,
        )
    ax.axvline(1.0, **ONE_X_LINE)
    ax.set_xscale("log")
    ax.set_xlim(*WORKLOAD_RANGE)
    log_speedup_axis(ax.xaxis, *WORKLOAD_RANGE)
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
    for i, name in enumerate(libraries):
        color = "#222222" if name == result.baseline else color_of(name, libraries)
        for y, tree in enumerate(trees):
            row = row_of(result, tree, MEMORY_OP, name)
            if row is None:
                continue
            at = y + (i - (len(libraries) - 1) / 2) * height
            value = _clip(row.median, MEMORY_RANGE)
            ax.barh(at, value, height=height * 0.9, color=color, zorder=2)
            ax.annotate(
                f"{row.median:.0f}" + ("" if value == row.median else " ▸"),
                (value, at),
                xytext=(3, 0),
                textcoords="offset points",
                va="center",
                fontsize=7.5,
            )
    ax.set_xlim(*MEMORY_RANGE)
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


def _dot(color: str, label: str, hollow: bool = False, marker: str = "o") -> Any:
    from matplotlib.lines import Line2D

    return Line2D(
        [],
        [],
        marker=marker,
        linestyle="",
        markersize=5,
        markerfacecolor="none" if hollow else color,
        markeredgecolor=color,
        label=label,
    )
