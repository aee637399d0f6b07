"""Why a workload's speedup need not be its plain column over its installed column.

A workload's speedup is the median of its rounds' own ratios, plain / installed, each round
timing the two processes side by side under the same load (``stats.paired``). The plain and
installed columns are each process's median over the rounds, taken one process at a time, so
when the machine's load moves between rounds the two medians can come from different rounds,
and their quotient from no round at all: ``jit-trace-lower`` once read 187 ms and 172 ms beside
0.99×, its rounds split between a quiet ~160 ms and a busy ~265 ms.

Within the speedup's interval the gap is the interval's own imprecision, which the tables'
headings explain; outside it, the row itself says why, with the quotient a reader would work out.
"""

from __future__ import annotations

from benchmarks.measure.results import WorkloadRow
from benchmarks.report.format import format_value

PAIRED = "the median of each round's own ratio, plain and installed timed side by side"
"""What a workload's speedup is, in the words the tables use."""


def medians_quotient(row: WorkloadRow) -> float | None:
    """plain / installed, the quotient of the two columns, where it falls outside the speedup's
    interval; None where it falls inside (or the row has no interval)."""
    if not row.plain or not row.installed or row.speedup_low is None or row.speedup_high is None:
        return None
    quotient = row.plain / row.installed
    return None if row.speedup_low <= quotient <= row.speedup_high else quotient


def why_not_the_quotient(row: WorkloadRow) -> str:
    """report.md's note for the row, or "" where none is needed: ``not 187 ms / 172 ms =
    1.09×, which lies outside the interval: ...``."""
    quotient = _quotient_text(row, "×", "µs")
    if not quotient:
        return ""
    return (
        f"not {quotient}, which lies outside the interval: the speedup is {PAIRED}, and the two "
        "medians come from rounds under different load"
    )


def table_note(row: WorkloadRow) -> str:
    """The stdout table's shorter note (its heading says what the speedup is), or ""."""
    quotient = _quotient_text(row, "x", "us")
    if not quotient:
        return ""
    return f"not {quotient}: the medians come from rounds under different load"


def _quotient_text(row: WorkloadRow, times: str, micro: str) -> str:
    quotient = medians_quotient(row)
    if quotient is None:
        return ""
    plain, installed = (format_value(value, "ns", micro) for value in (row.plain, row.installed))
    return f"{plain} / {installed} = {quotient:.2f}{times}"
