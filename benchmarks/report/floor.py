"""The floor workloads' figures: how far each library node is from the builtin-shape floor.

A floor workload's row (``WorkloadRow.floor``) holds, per process, call time / floor time: the
library's tree against the same leaves in builtin containers, timed turn by turn in that process
(``benchmarks.workloads.floor``). report.md gives them a table of their own, after the speedup
tables; the README's figures block and the stdout table quote the same cells, formatted here.
"""

from __future__ import annotations

from benchmarks.measure.results import RunResult, WorkloadRow
from benchmarks.report.format import format_interval, format_value
from benchmarks.workloads.base import FLOOR

PLAIN, INSTALLED = "plain", "installed"


def floor_rows(result: RunResult) -> list[WorkloadRow]:
    return [row for row in result.workloads if row.group == FLOOR]


def distance(row: WorkloadRow, mode: str, times: str = "×") -> str:
    """``4.10× [3.90–4.30]``: the mode's call / floor with its interval, or "–"."""
    found = row.floor.get(mode)
    if found is None:
        return "–"
    return format_interval(found.ratio, found.low, found.high, times)


def section(result: RunResult) -> list[str]:
    """report.md's table: per floor workload, the floor's time and each process's distance."""
    rows = floor_rows(result)
    if not rows:
        return []
    lines = [
        "## Distance from the builtin-shape floor",
        "",
        "Each library operation timed against the same operation on its builtin-shape twin: the "
        "very same leaves in tuples and dicts (a Variable -> a 1-tuple of its value, a Module -> "
        "a dict of the attributes its library flattens as children), or for a jit call, a "
        "`jax.jit` call on the arrays in a list (an identity, or for a decode step the same step; "
        "each row says which). The two take turns in one process; **call / "
        "floor, 1.0× = the floor**, lower is nearer. Both processes measure it: plain JAX, and "
        "fastree installed first.",
        "",
        "| workload | floor | plain | plain / floor [interval] | installed | "
        "installed / floor [interval] |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        name = f"**{row.name}**: {row.description}"
        plain = row.floor.get(PLAIN)
        if row.not_run or plain is None:
            lines.append(f"| {name} | – | – | – | – | {row.not_run or 'no floor timed'} |")
            continue
        lines.append(
            f"| {name} | {format_value(plain.floor_ns, 'ns', micro='µs')} | "
            f"{format_value(row.plain, 'ns', micro='µs')} | {distance(row, PLAIN)} | "
            f"{format_value(row.installed, 'ns', micro='µs')} | {distance(row, INSTALLED)} |"
        )
    return [*lines, "", "The floor column is the plain process's; both are in results.json.", ""]


def readme_lines(result: RunResult) -> list[str]:
    """The README's table: the same distances, under the workloads' names."""
    rows = floor_rows(result)
    if not rows:
        return []
    lines = [
        "**Distance from the builtin-shape floor**: each library operation against the same "
        "leaves in builtin containers, in one process (call / floor, 1.0× = the floor).",
        "",
        "| workload | plain / floor | installed / floor |",
        "|---|---:|---:|",
    ]
    for row in rows:
        name = f"`{row.name}`: {row.description}"
        if row.not_run:
            lines.append(f"| {name} | – | not run: {row.not_run} |")
        else:
            lines.append(f"| {name} | {distance(row, PLAIN)} | {distance(row, INSTALLED)} |")
    return [*lines, ""]


def table_suffix(row: WorkloadRow) -> str:
    """The stdout table's addition to a floor row: both distances."""
    if not row.floor:
        return ""
    return (
        f"  plain/floor {distance(row, PLAIN, 'x')}  installed/floor "
        f"{distance(row, INSTALLED, 'x')}"
    )
