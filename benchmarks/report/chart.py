"""chart.png, the headline figure: how much faster the baseline (fastree) is, at a glance.

Three panels, each with a 1x line and every bar labelled with its value; higher is better:

- per operation, the geometric mean over trees of the speedup over jax.tree_util and over optree
  (library time / fastree time), one colour per library;
- dict-10k and its insertion-order variants: the flatten speedup per key order;
- the end-to-end workloads: plain time / time with fastree installed into jax.tree_util.

The per-tree detail panels are a second file (chart_details.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.ops import OPS
from benchmarks.report.format import format_value
from benchmarks.report.grid import mean_ratios, ratio_of, variant_groups
from benchmarks.report.palette import HEADLINE_COMPETITORS, INSTALLED_COLOR, color_of, label_of
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

VARIANT_OP = "flatten"
"""The op the variant panel shows: for dict orders, the one whose cost is the key sort."""
OP_LABELS = {"treedef_memory": "treedef_memory\n(bytes: × smaller)"}


def write_chart(result: RunResult, path: Path) -> None:
    """Raises Unsupported (matplotlib missing, or nothing to draw) so the caller can note it."""
    plt = pyplot()
    means = mean_ratios(result)
    competitors = [
        name for name in HEADLINE_COMPETITORS if any(name in by_lib for by_lib in means.values())
    ]
    groups = {
        base: trees
        for base, trees in variant_groups(result).items()
        if any(ratio_of(result, t.name, VARIANT_OP, n) for t in trees for n in competitors)
    }
    workloads = [row for row in result.workloads if row.speedup or row.not_run]
    if not competitors and not workloads:
        raise Unsupported(
            f"no ratios to draw: {result.baseline} did not run alongside jax or optree, "
            "and no workload ran"
        )

    lower = [kind for kind, present in (("variants", groups), ("workloads", workloads)) if present]
    rows = (["ops"] if competitors else []) + (["lower"] if lower else [])
    figure = plt.figure(figsize=(15, 0.4 + 4.8 * len(rows)))
    grid = figure.add_gridspec(len(rows), len(lower) or 1, hspace=0.55, wspace=0.35)
    if competitors:
        _ops_panel(figure.add_subplot(grid[0, :]), result, means, competitors)
    for column, kind in enumerate(lower):
        ax = figure.add_subplot(grid[len(rows) - 1, column])
        if kind == "variants":
            base, trees = next(iter(groups.items()))
            _variants_panel(ax, result, base, trees)
        else:
            _workloads_panel(ax, workloads)
    figure.suptitle(
        f"{result.baseline} speedup (higher is better): {result.settings.get('mode', '?')} run, "
        f"{result.environment.get('cpu', '?')}, {result.environment.get('cpu_count', '?')} cores",
        fontsize=13,
        fontweight="bold",
    )
    figure.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(figure)


def _grouped_bars(
    ax: Any, groups: list[str], series: dict[str, list[float | None]], label_size: float
) -> None:
    """Vertical bars growing from 1x, one colour per library, each labelled with its value."""
    width = 0.8 / max(len(series), 1)
    values: list[float] = []
    for index, (library, ratios) in enumerate(series.items()):
        xs = [
            g + (index - (len(series) - 1) / 2) * width
            for g, r in enumerate(ratios)
            if r is not None
        ]
        shown = [r for r in ratios if r is not None]
        values += shown
        bottoms, heights = diverging(shown)
        bars = ax.bar(
            xs,
            heights,
            bottom=bottoms,
            width=width * 0.92,
            color=color_of(library, list(series)),
            label=f"vs {label_of(library)}",
            zorder=2,
        )
        ax.bar_label(bars, labels=[speedup_label(r) for r in shown], fontsize=label_size, padding=2)
    ax.axhline(1.0, **ONE_X_LINE)
    ax.set_yscale("log")
    ax.set_ylim(*log_limits(values, room=2.2))
    log_speedup_axis(ax.yaxis, *ax.get_ylim())
    ax.set_xticks(range(len(groups)), groups)
    ax.set_xlim(-0.6, len(groups) - 0.4)
    ax.grid(axis="y", which="major", alpha=0.3, zorder=0)
    ax.legend(loc="upper left", frameon=False, fontsize=9)


def _ops_panel(ax: Any, result: RunResult, means: dict[str, Any], competitors: list[str]) -> None:
    ops = [op for op in OPS if any(name in means.get(op, {}) for name in competitors)]
    series = {
        name: [means[op][name].value if name in means[op] else None for op in ops]
        for name in competitors
    }
    _grouped_bars(ax, [OP_LABELS.get(op, op) for op in ops], series, label_size=7.5)
    ax.tick_params(axis="x", labelsize=8.5, labelrotation=25)
    for tick in ax.get_xticklabels():
        tick.set_horizontalalignment("right")
    trees = max(mean.trees for by_lib in means.values() for mean in by_lib.values())
    ax.set_title(
        f"Per operation: geometric mean over up to {trees} trees of "
        f"(library time / {result.baseline} time)",
        fontsize=11,
    )
    ax.set_ylabel(f"{result.baseline} speedup (log)")


def _variants_panel(ax: Any, result: RunResult, base: str, trees: list[Any]) -> None:
    competitors = [
        name
        for name in HEADLINE_COMPETITORS
        if any(ratio_of(result, t.name, VARIANT_OP, name) for t in trees)
    ]
    series = {
        name: [ratio_of(result, tree.name, VARIANT_OP, name) for tree in trees]
        for name in competitors
    }
    labels = [tree.name.removeprefix(f"{base}-") if tree.variant_of else base for tree in trees]
    _grouped_bars(ax, labels, series, label_size=8)
    ax.tick_params(axis="x", labelsize=9)
    ax.set_title(
        f"{VARIANT_OP} of {base} ({trees[0].description.split(', ', 1)[-1]})\n"
        "and of its variants: the same keys or names inserted in other orders",
        fontsize=10.5,
    )
    ax.set_ylabel(f"{result.baseline} speedup (log)")


def _workloads_panel(ax: Any, workloads: list[Any]) -> None:
    """Horizontal bars from 1x on a linear axis: these ratios sit near 1, where a log axis would
    hide the difference between 0.97x and 1.05x."""
    names = [row.name for row in workloads]
    measured = [(i, row.speedup) for i, row in enumerate(workloads) if row.speedup]
    values = [speedup for _, speedup in measured]
    starts, lengths = diverging(values)
    ax.barh(
        [i for i, _ in measured],
        lengths,
        left=starts,
        height=0.6,
        color=INSTALLED_COLOR,
        label="plain time / installed time",
        zorder=2,
    )
    # Labels right of the 1x line even for bars left of it, clear of the workload names.
    for i, row in enumerate(workloads):
        if row.speedup:
            ax.annotate(
                f"{speedup_label(row.speedup)}  ({format_value(row.plain, 'ns', micro='µs')} → "
                f"{format_value(row.installed, 'ns', micro='µs')})",
                (max(1.0, row.speedup), i),
                xytext=(4, 0),
                textcoords="offset points",
                va="center",
                fontsize=8.5,
            )
    low = min([0.8, *values]) - 0.05
    high = max([1.3, *values]) * 1.45  # room for the labels
    for i, row in enumerate(workloads):
        if not row.speedup:
            ax.text(1.0, i, f"  not run: {row.not_run}"[:70], va="center", fontsize=8, color="0.35")
    ax.axvline(1.0, **ONE_X_LINE)
    ax.set_xlim(low, high)
    ax.set_yticks(range(len(names)), names, fontsize=9)
    ax.invert_yaxis()
    ax.xaxis.set_major_formatter(_times_formatter())
    ax.grid(axis="x", alpha=0.3, zorder=0)
    ax.set_title(
        "End-to-end workloads: plain JAX time / time with fastree installed\n"
        "(per call, same process, interleaved; > 1x: installing fastree helps)",
        fontsize=10.5,
    )


def _times_formatter() -> Any:
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda v, _pos: f"{v:g}×")
