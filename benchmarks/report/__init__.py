"""Outputs of a run: stdout table, results.json, report.md, chart.png, and --write-results."""

from __future__ import annotations

import sys
from pathlib import Path

from benchmarks.report.chart import write_chart
from benchmarks.report.markdown import render_markdown
from benchmarks.report.publish import publish
from benchmarks.report.table import render_table
from benchmarks.results import Note, RunResult
from benchmarks.unsupported import Unsupported

RESULTS_JSON = "results.json"
REPORT_MD = "report.md"
CHART_PNG = "chart.png"


def write_outputs(result: RunResult, out: Path, write_results: bool = False) -> None:
    out.mkdir(parents=True, exist_ok=True)
    chart: Path | None = out / CHART_PNG
    try:
        write_chart(result, chart)
    except Unsupported as reason:
        chart = None
        result.skipped.append(Note(None, None, "chart", str(reason)))
        print(f"chart skipped: {reason}", file=sys.stderr)
    # results.json last among the inputs it records, so a chart note is in it too.
    result.write(out / RESULTS_JSON)
    (out / REPORT_MD).write_text(render_markdown(result, CHART_PNG if chart else None))
    sys.stdout.write(render_table(result))
    print(
        f"\nwrote {out / RESULTS_JSON}, {out / REPORT_MD}"
        + (f", {out / CHART_PNG}" if chart else ""),
        file=sys.stderr,
    )
    if write_results:
        report = publish(result, chart)
        print(f"published {report}", file=sys.stderr)
