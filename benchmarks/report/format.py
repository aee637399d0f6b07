"""Number formatting shared by the stdout table, the markdown report and the progress lines."""

from __future__ import annotations

from benchmarks.measure.results import MEMORY_UNIT


def format_value(value: float | None, unit: str, micro: str = "us") -> str:
    """``1234.5, "ns"`` -> ``"1.23 us"``; ``56.0, "bytes/node"`` -> ``"56.0 B/node"``."""
    if value is None:
        return "-"
    if unit == MEMORY_UNIT:
        return f"{value:.1f} B/node"
    for scale, suffix in ((1e9, "s"), (1e6, "ms"), (1e3, micro)):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {suffix}"
    return f"{value:.3g} ns"


def format_ratio(ratio: float | None, times: str = "x") -> str:
    return "" if ratio is None else f"{ratio:.2f}{times}"


def format_interval(
    value: float | None, low: float | None, high: float | None, times: str = "x"
) -> str:
    """``1.53x [1.41-1.60]``: a ratio and its interval (stats.py)."""
    if value is None:
        return ""
    if low is None or high is None:
        return format_ratio(value, times)
    return f"{value:.2f}{times} [{low:.2f}–{high:.2f}]"
