"""Outputs of a run: stdout table, results.json, report.md, chart.png, and --write-results."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from benchmarks.measure.results import Note, RunResult
from benchmarks.report.chart import write_chart
from benchmarks.report.chart_details import write_detail_chart
from benchmarks.report.markdown import render_markdown
from benchmarks.report.publish import publish
from benchmarks.report.table import render_table
from benchmarks.unsupported import Unsupported

RESULTS_JSON = "results.json"
REPORT_MD = "report.md"
CHART_PNG = "chart.png"
DETAILS_PNG = "chart_details.png"


def write_outputs(result: RunResult, out: Path, write_results: bool = False) -> None:
    out.mkdir(parents=True, exist_ok=True)
    chart = _draw(write_chart, result, out / CHART_PNG, "chart")
    details = _draw(write_detail_chart, result, out / DETAILS_PNG, "detail chart")
    # results.json last among the inputs it records, so a chart note is in it too.
    result.write(out / RESULTS_JSON)
    (out / REPORT_MD).write_text(
        render_markdown(result, chart.name if chart else None, details.name if details else None)
    )
    sys.stdout.write(render_table(result))
    written = [out / RESULTS_JSON, out / REPORT_MD, *(p for p in (chart, details) if p)]
    print(f"\nwrote {', '.join(map(str, written))}", file=sys.stderr)
    if write_results:
        report = publish(result, chart, details=details)
        print(f"published {report}", file=sys.stderr)


def _draw(
    draw: Callable[[RunResult, Path], None], result: RunResult, path: Path, what: str
) -> Path | None:
    """``path`` once drawn; None, with a note in the results, when it cannot be drawn."""
    try:
        draw(result, path)
    except Unsupported as reason:
        result.skipped.append(Note(None, None, what, str(reason)))
        print(f"{what} skipped: {reason}", file=sys.stderr)
        return None
    return path
