"""``--write-results``: the full run's report and charts become benchmarks/RESULTS.md,
benchmarks/results_chart.png (headline) and benchmarks/results_chart_details.png (per tree), the
numbers the README points to."""

from __future__ import annotations

import shutil
from pathlib import Path

from benchmarks.measure.results import RunResult
from benchmarks.report.markdown import render_markdown

BENCHMARKS_DIR = Path(__file__).resolve().parent.parent
PUBLISHED_REPORT = "RESULTS.md"
PUBLISHED_CHART = "results_chart.png"
PUBLISHED_DETAILS = "results_chart_details.png"

HEADER = (
    "<!-- Generated from a {mode} run's results ({date}) by benchmarks/report/publish.py "
    "(`python -m benchmarks --write-results`); do not edit by hand. -->\n\n"
)


def publish(
    result: RunResult,
    chart: Path | None,
    destination: Path = BENCHMARKS_DIR,
    details: Path | None = None,
) -> Path:
    """Write RESULTS.md (and copy the charts that were drawn) into ``destination``."""
    chart_name = _copy(chart, destination / PUBLISHED_CHART)
    details_name = _copy(details, destination / PUBLISHED_DETAILS)
    report = destination / PUBLISHED_REPORT
    header = HEADER.format(
        mode=result.settings.get("mode", "?"), date=result.environment.get("date", "?")
    )
    report.write_text(header + render_markdown(result, chart_name, details_name))
    return report


def _copy(source: Path | None, target: Path) -> str | None:
    """``target``'s name once ``source`` is copied there; None when there is no source."""
    if source is None or not source.exists():
        return None
    shutil.copyfile(source, target)
    return target.name
