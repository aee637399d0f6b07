"""Outputs of a run: stdout table, results.json, report.md, chart.png, chart_details.png, and,
asked for with --publish, the published run (``publish``)."""

from __future__ import annotations

import sys
from pathlib import Path

from benchmarks.measure.results import RunResult
from benchmarks.report.markdown import render_markdown
from benchmarks.report.outputs import (
    CHART_PNG,
    DETAILS_PNG,
    REPORT_MD,
    RESULTS_JSON,
    write_report_files,
)
from benchmarks.report.publish import NotPublishable, publish
from benchmarks.report.table import render_table

__all__ = [
    "CHART_PNG",
    "DETAILS_PNG",
    "REPORT_MD",
    "RESULTS_JSON",
    "render_markdown",
    "render_table",
    "write_outputs",
]


def write_outputs(result: RunResult, out: Path, publish_run: bool = False) -> int:
    """Write the run's files into ``out`` and print its table; with ``publish_run``, also make it
    the published run (benchmarks/published/ and the README's blocks). The exit status."""
    written = write_report_files(result, out)
    # results.json after the charts, so a note that one could not be drawn is in it too.
    result.write(out / RESULTS_JSON)
    sys.stdout.write(render_table(result))
    print(f"\nwrote {', '.join(map(str, [out / RESULTS_JSON, *written]))}", file=sys.stderr)
    if publish_run:
        try:
            published = publish(result)
        except NotPublishable as reason:
            print(f"not published: {reason}", file=sys.stderr)
            return 1
        print(f"published {', '.join(map(str, published))}", file=sys.stderr)
    return 0
