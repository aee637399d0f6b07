"""The files a run's report is made of, and how they are written from a RunResult.

A run writes them into ``--out`` (bench_out/ by default); ``python -m benchmarks.report`` writes
them again from a results.json; publishing (``publish``) writes them into benchmarks/published/.
The names are the same everywhere, so a published report is a run's report under its own names.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from benchmarks.measure.results import Note, RunResult
from benchmarks.report.chart import own_report, write_chart
from benchmarks.report.chart_details import write_detail_chart
from benchmarks.report.markdown import render_markdown
from benchmarks.unsupported import Unsupported

RESULTS_JSON = "results.json"
REPORT_MD = "report.md"
CHART_PNG = "chart.png"
DETAILS_PNG = "chart_details.png"


def write_report_files(
    result: RunResult, out: Path, header: str = "", footer: str | None = None
) -> list[Path]:
    """Draw chart.png and chart_details.png and write report.md (``header`` first) into ``out``;
    the paths written. The charts' footer says where their report is: ``footer``, or by default
    report.md in ``out``, this run's own (``chart.own_report``). A chart that cannot be drawn (no
    matplotlib, nothing to compare) is left out with a note in ``result.skipped``, which
    report.md lists."""
    out.mkdir(parents=True, exist_ok=True)
    footer = footer or own_report(result, out)
    chart = draw(write_chart, result, out / CHART_PNG, footer, "chart")
    details = draw(write_detail_chart, result, out / DETAILS_PNG, footer, "detail chart")
    report = out / REPORT_MD
    report.write_text(
        header
        + render_markdown(result, chart.name if chart else None, details.name if details else None)
    )
    return [report, *(path for path in (chart, details) if path)]


def draw(
    drawer: Callable[[RunResult, Path, str], None],
    result: RunResult,
    path: Path,
    footer: str,
    what: str,
) -> Path | None:
    """``path`` once drawn; None, with a note in the results, when it cannot be drawn."""
    try:
        drawer(result, path, footer)
    except Unsupported as reason:
        result.skipped.append(Note(None, None, what, str(reason)))
        print(f"{what} skipped: {reason}", file=sys.stderr)
        return None
    return path
