"""What both charts share: matplotlib without a display, speedup labels, the log axis, 1x bars."""

from __future__ import annotations

import math
from typing import Any

from benchmarks.unsupported import Unsupported

ONE_X_LINE = {"color": "black", "linewidth": 1.2, "zorder": 3}
"""The 1x line: left of it (or below) the baseline is slower, right (above) it is faster."""


MAX_DECADES_WITH_2_AND_5 = 3.2


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend (files only, never a window), or Unsupported."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise Unsupported("matplotlib is not installed (pip install matplotlib)") from None
    return plt


def speedup_label(value: float) -> str:
    """``0.96x``, ``1.49x``, ``3.3x``, ``16x``, ``5,519x``: two significant figures at least."""
    if value < 2:
        return f"{value:.2f}×"
    if value < 10:
        return f"{value:.1f}×"
    return f"{value:,.0f}×"


def log_speedup_axis(axis: Any, low: float, high: float) -> None:
    """Label a log-scaled matplotlib Axis (``ax.xaxis`` or ``ax.yaxis``) spanning [low, high]:
    0.5x, 1x, 2x, 5x, 10x... over up to three decades, 1x, 10x, 100x... beyond, where the 2x
    and 5x labels would run into each other."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    decades = math.log10(high / low)
    subs = (1.0, 2.0, 5.0) if decades <= MAX_DECADES_WITH_2_AND_5 else (1.0,)
    axis.set_major_locator(LogLocator(base=10, subs=subs))
    axis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}×"))
    axis.set_minor_formatter(NullFormatter())


def log_limits(values: list[float], room: float = 3.0) -> tuple[float, float]:
    """Axis limits that keep 1x in view and leave ``room`` (a factor) past the largest bar for its
    label."""
    low = min([1.0, *values])
    high = max([1.0, *values])
    return low / 1.6, high * room


def diverging(values: list[float]) -> tuple[list[float], list[float]]:
    """(start, length) of bars that grow from 1x: right/up when > 1, left/down when < 1."""
    return [1.0] * len(values), [value - 1.0 for value in values]
