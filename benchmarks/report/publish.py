"""``--write-results``: a run's report and charts become benchmarks/RESULTS.md,
benchmarks/results_chart.png (headline) and benchmarks/results_chart_details.png (every cell), the
numbers the README points to.

A run already made can be published (or its charts redrawn) from its results.json, with nothing
timed again: ``python -m benchmarks.report bench_out/results.json``.
"""

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
    "(`python -m benchmarks --write-results`, or `python -m benchmarks.report "
    "results.json`); do not edit by hand. -->\n\n"
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


def main(argv: list[str] | None = None) -> int:
    import argparse
    import tempfile

    from benchmarks.report.chart import write_chart
    from benchmarks.report.chart_details import write_detail_chart

    parser = argparse.ArgumentParser(prog="python -m benchmarks.report")
    parser.add_argument("results", type=Path, help="a run's results.json")
    parser.add_argument("--destination", type=Path, default=BENCHMARKS_DIR)
    args = parser.parse_args(argv)
    result = RunResult.from_json(args.results.read_text())
    args.destination.mkdir(parents=True, exist_ok=True)
    if result.settings.get("only") or result.settings.get("leaves") not in (None, "default"):
        parser.error("that run was filtered (--only or --leaves): it is not published")
    with tempfile.TemporaryDirectory() as scratch:
        chart, details = Path(scratch) / "chart.png", Path(scratch) / "details.png"
        write_chart(result, chart)
        write_detail_chart(result, details)
        print(publish(result, chart, args.destination, details))
    return 0
