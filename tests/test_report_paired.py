"""A workload row whose speedup is not its plain column over its installed column says why
(issue 44: ``jit-trace-lower`` showed 187 ms and 172 ms beside 0.99×, which read like an
arithmetic error). The speedup is the median of the rounds' own ratios; the columns are each
process's median. Made-up rows (tests/bench_results.py), nothing timed.
"""

from __future__ import annotations

from bench_results import synthetic_result

from benchmarks.measure.results import RunResult, WorkloadRow
from benchmarks.report import render_markdown, render_table
from benchmarks.report.paired import medians_quotient


def _with_jit_trace_lower(plain: float, installed: float) -> tuple[RunResult, WorkloadRow]:
    """A run whose jit-trace-lower row reads 0.99× [0.90–1.02] beside these two medians."""
    result = synthetic_result()
    row = next(row for row in result.workloads if row.name == "jit-trace-lower")
    row.plain, row.installed = plain, installed
    row.speedup, row.speedup_low, row.speedup_high, row.verdict = 0.99, 0.90, 1.02, "same"
    return result, row


def test_a_quotient_outside_the_interval_is_explained_in_the_row() -> None:
    result, row = _with_jit_trace_lower(187e6, 172e6)
    quotient = medians_quotient(row)
    assert quotient is not None and round(quotient, 2) == 1.09
    report = render_markdown(result, None, None)
    line = next(line for line in report.splitlines() if "**jit-trace-lower**" in line)
    assert (
        "| 187 ms | 172 ms | **0.99× [0.90–1.02]** = (not 187 ms / 172 ms = 1.09×, which lies "
        "outside the interval: the speedup is the median of each round's own ratio, plain and "
        "installed timed side by side, and the two medians come from rounds under different "
        "load) |"
    ) in line
    assert "their quotient can differ from it" in report  # the section's heading says so too
    table = render_table(result)
    line = next(line for line in table.splitlines() if line.startswith("jit-trace-lower"))
    assert line.endswith(
        "0.99x [0.90–1.02] (same; not 187 ms / 172 ms = 1.09x: the medians come from rounds "
        "under different load)"
    )
    assert "it is the median of each round's own ratio" in table


def test_a_quotient_inside_the_interval_needs_no_note() -> None:
    result, row = _with_jit_trace_lower(178e6, 180e6)  # 0.99×, inside [0.90, 1.02]
    assert medians_quotient(row) is None
    report = render_markdown(result, None, None)
    line = next(line for line in report.splitlines() if "**jit-trace-lower**" in line)
    assert "| 178 ms | 180 ms | **0.99× [0.90–1.02]** = | why jit-trace-lower |" in line
    assert "(same)" in next(
        line for line in render_table(result).splitlines() if line.startswith("jit-trace-lower")
    )
    no_interval = WorkloadRow("w", "d", "y", plain=2.0, installed=1.0, speedup=1.0)
    assert medians_quotient(no_interval) is None
